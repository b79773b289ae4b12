// The embedding and the loss, vocab-parallel over tp (Megatron's VocabParallelEmbedding and
// vocab-parallel cross-entropy): tp rank r holds wte rows [vocab_begin, vocab_end) and the
// logits of those columns. The full logits are never gathered: each rank sends, per token,
// three numbers (its columns' max, its sum of exponentials relative to that max, and the
// target's logit if it owns the target) and every rank combines them into the same loss.
// With tp = 1 these call the Backend's own encoder and cross-entropy ops.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "trident/check.h"
#include "trident/model.h"

namespace trident {

void GPT::embedding_forward(float* out, const int32_t* tokens, int B, int T) {
  const int C = cfg_.channels;
  const float* wte = at(params_.data(), "wte");
  const float* wpe = at(params_.data(), "wpe");
  if (tp_.size == 1) {
    be_.encoder_forward(out, tokens, wte, wpe, B, T, C);
    return;
  }
  // Each rank adds its own vocabulary's rows (zeros elsewhere) and rank 0 the positions; the
  // sum over tp (reduced to this rank's rows) is the embedding.
  const int v0 = vocab_begin(), v1 = vocab_end();
  const bool add_positions = tp_.rank == 0;
  float* partial = scratch_.full_c.data();
#pragma omp parallel for schedule(static)
  for (int n = 0; n < B * T; ++n) {
    float* o = partial + size_t(n) * C;
    const int tok = tokens[n], t = n % T;
    const float* e = (tok >= v0 && tok < v1) ? wte + size_t(tok - v0) * C : nullptr;
    const float* p = add_positions ? wpe + size_t(t) * C : nullptr;
    for (int c = 0; c < C; ++c) o[c] = (e ? e[c] : 0.0f) + (p ? p[c] : 0.0f);
  }
  reduce_rows(out, partial, B, T, C);
}

void GPT::embedding_backward(const float* dout, const int32_t* tokens,
                             const EmbeddingRowSink* sink, int B, int T) {
  const int C = cfg_.channels;
  float* dwte = at(grads_.data(), "wte");
  float* dwpe = at(grads_.data(), "wpe");
  if (tp_.size == 1) {
    if (sink)
      be_.encoder_backward(sink->rows, dwpe, dout, sink->row_of_input, B, T, C);
    else
      be_.encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
    return;
  }
  // dout holds all N rows on every rank (identical), so the replicated wpe gets identical
  // gradients. Threads own column slices and walk the tokens in order: deterministic.
  const int v0 = vocab_begin(), v1 = vocab_end();
#pragma omp parallel for schedule(static)
  for (int c = 0; c < C; ++c) {
    for (int n = 0; n < B * T; ++n) {
      const float g = dout[size_t(n) * C + c];
      dwpe[size_t(n % T) * C + c] += g;
      const int tok = tokens[n];
      if (tok < v0 || tok >= v1) continue;
      if (sink) {
        const int32_t row = sink->row_of_input[n];
        if (row >= 0) sink->rows[size_t(row) * C + c] += g;
      } else {
        dwte[size_t(tok - v0) * C + c] += g;
      }
    }
  }
}

float GPT::crossentropy_forward(Slot& slot, const int32_t* targets, int N) {
  const int V = cfg_.vocab, Vp = cfg_.padded_vocab;
  float* logits = slot.logits.data();
  float* losses = slot.losses.data();
  if (tp_.size == 1) {
    be_.crossentropy_forward(losses, logits, targets, N, V, Vp);
  } else {
    const int Vl = Vp / tp_.size, v0 = vocab_begin();
    // Columns of this slice inside the real vocabulary (the padding never takes part).
    const int live = std::max(0, std::min(Vl, V - v0));
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    // Per token: (max, Σ exp(x − max), target logit or 0) of this rank's columns.
    std::vector<float> mine(size_t(N) * 3), all(size_t(N) * 3 * tp_.size);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      const float* x = logits + size_t(n) * Vl;
      float m = kNegInf;
      for (int j = 0; j < live; ++j) m = std::max(m, x[j]);
      double s = 0.0;
      for (int j = 0; j < live; ++j) s += std::exp(double(x[j]) - m);
      const int tj = targets[n] - v0;
      mine[3 * n] = m;
      mine[3 * n + 1] = float(s);
      mine[3 * n + 2] = (tj >= 0 && tj < live) ? x[tj] : 0.0f;
    }
    tp_wait(tp_.comm->all_gather(mine.data(), all.data(), mine.size()));
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      float M = kNegInf;
      for (int r = 0; r < tp_.size; ++r) M = std::max(M, all[(size_t(r) * N + n) * 3]);
      double S = 0.0, target_logit = 0.0;
      for (int r = 0; r < tp_.size; ++r) {
        const float* q = &all[(size_t(r) * N + n) * 3];
        if (q[0] != kNegInf) S += double(q[1]) * std::exp(double(q[0]) - M);
        target_logit += q[2];
      }
      losses[n] = float(std::log(S) + M - target_logit);
      // Keep the probabilities of this rank's columns for backward (padding: 0).
      float* x = logits + size_t(n) * Vl;
      for (int j = 0; j < live; ++j) x[j] = float(std::exp(double(x[j]) - M) / S);
      for (int j = live; j < Vl; ++j) x[j] = 0.0f;
    }
  }
  HostView<float> host(be_, losses, size_t(N), /*load=*/true);  // Note [Backend memory]
  double sum = 0.0;
  for (int i = 0; i < N; ++i) sum += host.data()[i];
  return float(sum / N);
}

void GPT::crossentropy_backward(Slot& slot, const int32_t* targets, float dloss, int N) {
  const int V = cfg_.vocab, Vp = cfg_.padded_vocab;
  float* probs = slot.logits.data();
  if (tp_.size == 1) {
    be_.crossentropy_backward(probs, targets, dloss, N, V, Vp);
    return;
  }
  const int Vl = Vp / tp_.size, v0 = vocab_begin();
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    float* p = probs + size_t(n) * Vl;
    for (int j = 0; j < Vl; ++j) p[j] *= dloss;  // padded columns are 0 already
    const int tj = targets[n] - v0;
    if (tj >= 0 && tj < Vl) p[tj] -= dloss;
  }
}

}  // namespace trident
