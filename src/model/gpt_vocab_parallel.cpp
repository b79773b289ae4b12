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

#include "model/gpt_state.h"
#include "trident/check.h"
#include "trident/model.h"

namespace trident {

void GPT::embedding_forward(float* out, const int32_t* tokens, int B, int T) {
  const int C = cfg_.channels;
  const float* wte = wte_weights() + table_->wte;
  const float* wpe = at(wpe_weights(), table_->wpe);  // null with rotary positions
  if (wpe && cp_.size > 1) {  // this rank's rows of wpe (Note [Context parallelism])
    float* local = scratch_->cp_wpe.data();
    for (const CpRun& run : cp_runs(T))
      be_.copy(local + size_t(run.row) * C, wpe + size_t(run.position) * C,
               size_t(run.rows) * C * sizeof(float));
    wpe = local;
  }
  if (tp_.size == 1 && wpe) {
    be_.encoder_forward(out, tokens, wte, wpe, B, T, C);
    return;
  }
  if (tp_.size == 1) {  // the whole vocabulary is this rank's slice
    be_.embedding_slice_forward(out, tokens, wte, nullptr, 0, cfg_.padded_vocab, B, T, C);
    return;
  }
  // Each rank adds its own vocabulary's rows (zeros elsewhere) and rank 0 the positions; the
  // sum over tp (reduced to this rank's rows) is the embedding (Note [Reduce in place]).
  float* partial = tp_.sequence_parallel ? scratch_->full_c.data() : out;
  be_.embedding_slice_forward(partial, tokens, wte, tp_.rank == 0 ? wpe : nullptr, vocab_begin(),
                              vocab_end(), B, T, C);
  reduce_rows(out, partial, B, T, C);
}

void GPT::embedding_backward(const float* dout, const int32_t* tokens, const EmbeddingRowSink* sink,
                             int B, int T) {
  const int C = cfg_.channels;
  float* dwte = wte_grads() + table_->wte;
  float* dwpe = at(wpe_grads(), table_->wpe);
  // cp: the rows' gradients go to scratch first, then onto wpe's at their positions (when this
  // function returns, whichever way).
  float* dwpe_global = nullptr;
  if (dwpe && cp_.size > 1) {
    dwpe_global = dwpe;
    dwpe = scratch_->cp_dwpe.data();
    be_.fill_zero(dwpe, size_t(T) * C * sizeof(float));
  }
  struct AddRows {
    ~AddRows() {
      if (!global) return;
      for (const GPT::CpRun& run : model.cp_runs(T)) {
        float* dst = global + size_t(run.position) * C;
        model.be_.add(dst, dst, rows + size_t(run.row) * C, size_t(run.rows) * C);
      }
    }
    GPT& model;
    float* global;
    const float* rows;
    int T, C;
  } add_rows{*this, dwpe_global, dwpe, T, C};
  if (tp_.size == 1) {
    if (sink) be_.encoder_backward(sink->rows, dwpe, dout, sink->row_of_input, B, T, C);
    else be_.encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
    return;
  }
  // dout holds all N rows on every rank (identical), so the replicated wpe gets identical
  // gradients.
  if (!sink) {
    be_.embedding_slice_backward(dwte, dwpe, dout, tokens, vocab_begin(), vocab_end(), B, T, C);
    return;
  }
  // The sink's compact rows (host backends only: Note [Tied embedding gradient]). Threads own
  // column slices and walk the tokens in order: deterministic.
  const int v0 = vocab_begin(), v1 = vocab_end();
#pragma omp parallel for schedule(static)
  for (int c = 0; c < C; ++c) {
    for (int n = 0; n < B * T; ++n) {
      const float g = dout[size_t(n) * C + c];
      if (dwpe) dwpe[size_t(n % T) * C + c] += g;
      const int tok = tokens[n];
      if (tok < v0 || tok >= v1) continue;
      const int32_t row = sink->row_of_input[n];
      if (row >= 0) sink->rows[size_t(row) * C + c] += g;
    }
  }
}

float GPT::crossentropy_forward(Slot& slot, const int32_t* targets, int N) {
  const int V = cfg_.vocab, Vp = cfg_.padded_vocab;
  float* logits = head(slot).logits.data();
  float* losses = head(slot).losses.data();
  if (tp_.size == 1) {
    be_.crossentropy_forward(losses, logits, targets, N, V, Vp);
  } else {
    const int Vl = Vp / tp_.size, v0 = vocab_begin();
    // Columns of this slice inside the real vocabulary (the padding never takes part).
    const int live = std::max(0, std::min(Vl, V - v0));
    float* mine = scratch_->ce_stats.data();
    float* all = scratch_->ce_all.data();
    be_.crossentropy_slice_stats(mine, logits, targets, v0, live, N, Vl);
    tp_wait(tp_.comm->all_gather(mine, all, size_t(N) * 3));
    be_.crossentropy_slice_combine(losses, logits, all, tp_.size, live, N, Vl);
  }
  return mean_loss(slot, N);
}

float GPT::mean_loss(Slot& slot, int N) {
  const float* losses = head(slot).losses.data();
  if (defer_loss_) {  // forward_accumulate on a device: no wait here
    be_.add_mean(loss_sum_device_.data(), losses, size_t(N));
    return 0.0f;
  }
  // On a device, through a host buffer allocated with the model (Note [Backend memory]); a copy
  // to host memory has completed when copy() returns.
  const float* host = losses;
  if (be_.is_device()) {
    be_.copy(losses_host_.data(), losses, size_t(N) * sizeof(float));
    host = losses_host_.data();
  }
  double sum = 0.0;
  for (int i = 0; i < N; ++i) sum += host[i];
  return float(sum / N);
}

void GPT::crossentropy_backward(Slot& slot, const int32_t* targets, float dloss, int N) {
  const int V = cfg_.vocab, Vp = cfg_.padded_vocab;
  float* probs = head(slot).logits.data();
  if (tp_.size == 1) {
    be_.crossentropy_backward(probs, targets, dloss, N, V, Vp);
    return;
  }
  be_.crossentropy_slice_backward(probs, targets, dloss, vocab_begin(), N, Vp / tp_.size);
}

}  // namespace trident
