// Note [Vocab-parallel ops]
// With tensor parallelism tp rank r holds wte rows [v0, v1) and the logits of those columns
// (Megatron's vocab-parallel embedding and cross-entropy). The full logits are never gathered:
// each rank computes three numbers per token (crossentropy_slice_stats), the model all-gathers
// them over tp, and every rank combines them into the same loss (crossentropy_slice_combine).
//
// These are the host implementations, in the Backend base class; a device backend overrides
// them with kernels.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "trident/backend.h"

namespace trident {

void Backend::embedding_slice_forward(float* out, const int32_t* tokens, const float* wte_slice,
                                      const float* wpe, int v0, int v1, int B, int T, int C) {
#pragma omp parallel for schedule(static) num_threads(threads())
  for (int n = 0; n < B * T; ++n) {
    float* o = out + size_t(n) * C;
    const int tok = tokens[n], t = n % T;
    const float* e = (tok >= v0 && tok < v1) ? wte_slice + size_t(tok - v0) * C : nullptr;
    const float* p = wpe ? wpe + size_t(t) * C : nullptr;
    for (int c = 0; c < C; ++c) o[c] = (e ? e[c] : 0.0f) + (p ? p[c] : 0.0f);
  }
}

void Backend::embedding_slice_backward(float* dwte_slice, float* dwpe, const float* dout,
                                       const int32_t* tokens, int v0, int v1, int B, int T, int C) {
  // Threads own column slices and walk the tokens in order: deterministic.
#pragma omp parallel for schedule(static) num_threads(threads())
  for (int c = 0; c < C; ++c) {
    for (int n = 0; n < B * T; ++n) {
      const float g = dout[size_t(n) * C + c];
      if (dwpe) dwpe[size_t(n % T) * C + c] += g;
      const int tok = tokens[n];
      if (tok >= v0 && tok < v1) dwte_slice[size_t(tok - v0) * C + c] += g;
    }
  }
}

void Backend::crossentropy_slice_stats(float* stats, const float* logits, const int32_t* targets,
                                       int v0, int live, int N, int Vl) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for schedule(static) num_threads(threads())
  for (int n = 0; n < N; ++n) {
    const float* x = logits + size_t(n) * Vl;
    float m = kNegInf;
    for (int j = 0; j < live; ++j) m = std::max(m, x[j]);
    double s = 0.0;
    for (int j = 0; j < live; ++j) s += std::exp(double(x[j]) - m);
    const int tj = targets[n] - v0;
    stats[3 * size_t(n)] = m;
    stats[3 * size_t(n) + 1] = float(s);
    stats[3 * size_t(n) + 2] = (tj >= 0 && tj < live) ? x[tj] : 0.0f;
  }
}

void Backend::crossentropy_slice_combine(float* losses, float* logits_to_probs,
                                         const float* all_stats, int tp, int live, int N, int Vl) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for schedule(static) num_threads(threads())
  for (int n = 0; n < N; ++n) {
    float M = kNegInf;
    for (int r = 0; r < tp; ++r) M = std::max(M, all_stats[(size_t(r) * N + n) * 3]);
    double S = 0.0, target_logit = 0.0;
    for (int r = 0; r < tp; ++r) {
      const float* q = &all_stats[(size_t(r) * N + n) * 3];
      if (q[0] != kNegInf) S += double(q[1]) * std::exp(double(q[0]) - M);
      target_logit += q[2];
    }
    losses[n] = float(std::log(S) + M - target_logit);
    float* x = logits_to_probs + size_t(n) * Vl;
    for (int j = 0; j < live; ++j) x[j] = float(std::exp(double(x[j]) - M) / S);
    for (int j = live; j < Vl; ++j) x[j] = 0.0f;
  }
}

void Backend::crossentropy_slice_backward(float* probs, const int32_t* targets, float dloss, int v0,
                                          int N, int Vl) {
#pragma omp parallel for schedule(static) num_threads(threads())
  for (int n = 0; n < N; ++n) {
    float* p = probs + size_t(n) * Vl;
    for (int j = 0; j < Vl; ++j) p[j] *= dloss;  // columns past the vocabulary are 0 already
    const int tj = targets[n] - v0;
    if (tj >= 0 && tj < Vl) p[tj] -= dloss;
  }
}

void Backend::copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                        size_t row_bytes, size_t rows) {
#pragma omp parallel for schedule(static) num_threads(threads())
  for (size_t i = 0; i < rows; ++i)
    std::memcpy(static_cast<char*>(dst) + i * dst_pitch,
                static_cast<const char*>(src) + i * src_pitch, row_bytes);
}

}  // namespace trident
