// The mixture of experts' ops on the host (include/trident/backend.h): the CPU backend's, and
// the twin that kernels/moe.cu is tested against.
//
// Note [Mixture ops]
// The mixture's routing, permutation, combine and router gradient are Backend ops, so its
// state lives in backend memory and a device runs them where the tokens are. Each loop over
// tokens writes its own rows (parallel over tokens, any thread count gives the same bits);
// the permutation and the per-expert sums run in one order (token, then choice), on one
// thread: they are O(N·k) and O(N·E) integer and double work, a small part of the layer, and
// their order is what a dropped choice depends on (Note [Expert capacity]). The host learns
// the per-expert counts from the summary (counts | sums), one copy per layer and micro-batch.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "backend/moe_token.h"
#include "trident/backend.h"
#include "trident/check.h"

namespace trident {
namespace {

void host_only(const Backend& be, const char* op) {
  if (be.is_device())
    internal_error(__FILE__, __LINE__,
                   std::string(op) + ": the host definition was called on a device backend");
}

}  // namespace

void Backend::moe_route_forward(float* probs, float* lse, int32_t* top, float* topw,
                                const float* logits, const float* bias, int N, int E, int k,
                                bool sigmoid, bool norm_topk) {
  host_only(*this, __func__);
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int t = 0; t < N; ++t)
    moe_token::route(probs + size_t(t) * E, lse + t, top + size_t(t) * k, topw + size_t(t) * k,
                     logits + size_t(t) * E, bias, E, k, sigmoid, norm_topk);
}

void Backend::moe_permute(int32_t* pos, int32_t* send_token, int32_t* counts, double* sums,
                          int32_t* hf_count, const int32_t* top, const float* probs,
                          const float* lse, int N, int E, int k, int cap) {
  host_only(*this, __func__);
  TRIDENT_CHECK(E <= 256, "moe_permute: {} experts, at most 256", E);
  int32_t* count = counts;
  int32_t* kept = counts + E;
  std::fill(counts, counts + 2 * size_t(E), 0);
  const size_t choices = size_t(N) * k;
  for (size_t c = 0; c < choices; ++c) {
    const int e = top[c];
    ++count[e];
    pos[c] = kept[e] < cap ? kept[e]++ : -1;  // the rank within its expert for now
  }
  int32_t start[256], first = 0;  // expert e's first row
  for (int e = 0; e < E; ++e) start[e] = first, first += kept[e];
  for (size_t c = 0; c < choices; ++c) {
    if (pos[c] < 0) continue;
    pos[c] += start[top[c]];
    send_token[pos[c]] = int32_t(c / size_t(k));
  }
  std::fill(sums, sums + E + 1, 0.0);
  for (int t = 0; t < N; ++t)
    for (int i = 0; i < E; ++i) sums[i] += probs[size_t(t) * E + i];
  for (int t = 0; t < N; ++t) sums[E] += double(lse[t]) * lse[t];
  if (hf_count)
    for (int e = 0; e < E; ++e) hf_count[e] += count[e];
}

void Backend::moe_gather_rows(float* rows, const float* x, const int32_t* send_token, int M,
                              int C) {
  host_only(*this, __func__);
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int r = 0; r < M; ++r)
    std::memcpy(rows + size_t(r) * C, x + size_t(send_token[r]) * C, size_t(C) * sizeof(float));
}

void Backend::moe_combine_forward(float* out, const float* ys, const float* shared,
                                  const float* gate, const int32_t* pos, const float* topw, int N,
                                  int C, int k) {
  host_only(*this, __func__);
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int t = 0; t < N; ++t) {
    float* o = out + size_t(t) * C;
    if (shared) {
      const float g = gate ? gate[t] : 1.0f;
      const float* y = shared + size_t(t) * C;
      for (int c = 0; c < C; ++c) o[c] = g * y[c];
    } else {
      std::fill(o, o + C, 0.0f);
    }
    for (int j = 0; j < k; ++j) {
      const int r = pos[size_t(t) * k + j];
      if (r < 0) continue;
      const float w = topw[size_t(t) * k + j];
      const float* y = ys + size_t(r) * C;
      for (int c = 0; c < C; ++c) o[c] += w * y[c];
    }
  }
}

void Backend::moe_combine_backward(float* dys, float* dtopw, const float* dout, const float* ys,
                                   const int32_t* pos, const float* topw, int N, int C, int k) {
  host_only(*this, __func__);
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int t = 0; t < N; ++t) {
    const float* d = dout + size_t(t) * C;
    for (int j = 0; j < k; ++j) {
      const size_t c = size_t(t) * k + j;
      const int r = pos[c];
      if (r < 0) {
        dtopw[c] = 0.0f;
        continue;
      }
      const float* y = ys + size_t(r) * C;
      float* dy = dys + size_t(r) * C;
      double dot = 0;
      for (int q = 0; q < C; ++q) dot += double(d[q]) * y[q], dy[q] = topw[c] * d[q];
      dtopw[c] = float(dot);
    }
  }
}

void Backend::moe_scatter_add(float* dx, const float* dxs, const int32_t* pos, int N, int C,
                              int k) {
  host_only(*this, __func__);
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int t = 0; t < N; ++t) {
    float* d = dx + size_t(t) * C;
    for (int j = 0; j < k; ++j) {
      const int r = pos[size_t(t) * k + j];
      if (r < 0) continue;
      const float* src = dxs + size_t(r) * C;
      for (int q = 0; q < C; ++q) d[q] += src[q];
    }
  }
}

void Backend::moe_route_backward(float* dlogits, const float* dtopw, const float* probs,
                                 const float* lse, const int32_t* top, const float* topw,
                                 const int32_t* aux_count, double aux_num, double aux_den,
                                 double z2, double loss_scale, int N, int E, int k, bool sigmoid,
                                 bool norm_topk) {
  host_only(*this, __func__);
#pragma omp parallel for num_threads(threads()) schedule(static)
  for (int t = 0; t < N; ++t) {
    const double z = z2 > 0 ? z2 * lse[t] / N * loss_scale : 0.0;
    moe_token::route_backward(dlogits + size_t(t) * E, probs + size_t(t) * E, top + size_t(t) * k,
                              topw + size_t(t) * k, dtopw + size_t(t) * k, aux_count, aux_num,
                              aux_den, loss_scale, z, E, k, sigmoid, norm_topk);
  }
}

void Backend::sigmoid_forward(float* out, const float* inp, size_t n) {
  host_only(*this, __func__);
  for (size_t i = 0; i < n; ++i) out[i] = 1.0f / (1.0f + std::exp(-inp[i]));
}

void Backend::moe_gate_backward(float* dgate, float* dy, const float* dout, const float* y,
                                const float* gate, int N, int C) {
  host_only(*this, __func__);
  for (int t = 0; t < N; ++t) {
    const float g = gate[t];
    double dot = 0;
    for (int q = 0; q < C; ++q) {
      dot += double(dout[size_t(t) * C + q]) * y[size_t(t) * C + q];
      dy[size_t(t) * C + q] = g * dout[size_t(t) * C + q];
    }
    dgate[t] = float(dot * g * (1.0 - g));
  }
}

}  // namespace trident
