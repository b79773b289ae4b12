// The bf16 path's tensor parallelism (tp > 1), with and without sequence parallelism: the
// collectives of gpt_tp.cpp between the ops of gpt_bf16.cpp, which runs the block and its
// backward at any tp on this rank's heads and hidden slice. The helpers here (and the linears of
// tp_overlap_bf16.cpp) are tp 1's ops at tp 1, except where tp 1 fuses what the collectives
// separate: the residual add into the row-parallel GEMM, the loss into the head.
//
// Note [bf16 with tp]
// What a GEMM reads is bf16; what is summed over tp is fp32, summed before its one rounding.
// Forward: with SP the norm's bf16 output is all-gathered in bf16; a row-parallel GEMM writes
// an fp32 partial (bias on tp rank 0), all-reduced (SP: reduce-scattered), then added to the
// residual. Backward: a column-parallel input gradient is an fp32 partial, reduced, then rounded
// for the norm's bf16 backward; with SP the row-parallel GEMMs' bf16 dout is gathered in bf16.
// Head: fp32 logits of this rank's vocabulary in one [N, V/tp] scratch for all slots (4 B a
// logit beyond tp 1's path) feed the fp32 vocab-parallel loss; its gradient is rounded once.
//
// parallel.tp_overlap chunks these collectives as in fp32:
// Note [Tensor-parallel overlap in bf16] in tp_overlap.h.
#include <algorithm>

#include "model/gpt_state.h"
#include "trident/model.h"

namespace trident {

// As gather_rows (Note [Sequence-parallel rows]), on bf16 rows through stage16.
void GPT::gather_rows_bf16(bfloat16* full, const bfloat16* local, int B, int T, int C) {
  bfloat16* stage = scratch_->stage16.data();
  tp_wait(tp_.comm->all_gather(local, stage, size_t(B) * (T / tp_.size) * C));
  place_gathered_rows(full, stage, size_t(C) * sizeof(bfloat16), B, T);
}

// The norm of this rank's rows of inp, out_full on all N rows (gathered with SP).
void GPT::norm_gathered_bf16(bfloat16* out_full, float* mean, float* rstd, const float* inp,
                             const float* w, const float* b, int B, int T) {
  const int C = cfg_.channels, N = B * T;
  if (!tp_.sequence_parallel) {
    norm_forward_bf16(out_full, mean, rstd, inp, w, b, N, C);
    return;
  }
  bfloat16* local = scratch_->ln16_local.data();
  norm_forward_bf16(local, mean, rstd, inp, w, b, N / tp_.size, C);
  gather_rows_bf16(out_full, local, B, T, C);
}

// Backward of norm_gathered_bf16 from dout_partial [N, C], this rank's fp32 partial sum: reduced
// over tp (to this rank's rows with SP), rounded once into d16_c (at tp 1 column_backward_bf16's
// GEMM rounded it there), then the norm's backward adds into dres (and writes dres16 when
// non-null). With SP the norm's weight gradients are partial too
// (Note [Sequence-parallel LayerNorm gradients]): `ln` is its partial buffer, `reduce` the
// step's last micro-batch.
void GPT::norm_gathered_backward_bf16(Work sum, float* dres, bfloat16* dres16, float* dw, float* db,
                                      float* dout_partial, const float* inp, const float* w,
                                      const float* mean, const float* rstd, int B, int T, int ln,
                                      bool reduce) {
  const int C = cfg_.channels, Nr = B * T / rows_divisor_;
  Scratch& a = *scratch_;
  bfloat16* dout16 = a.d16_c.data();
  if (tp_.size > 1) {
    float* dout = tp_.sequence_parallel ? a.ln_out.data() : dout_partial;
    finish_reduce_rows(std::move(sum), dout, dout_partial, B, T, C);
    be_.cast_to_bf16(dout16, dout, size_t(Nr) * C);
  }
  norm_local_backward_bf16(dres, dres16, dw, db, dout16, inp, w, mean, rstd, Nr, ln, reduce);
}

void GPT::norm_local_backward_bf16(float* dres, bfloat16* dres16, float* dw, float* db,
                                   const bfloat16* dout16, const float* inp, const float* w,
                                   const float* mean, const float* rstd, int Nr, int ln,
                                   bool reduce) {
  const int C = cfg_.channels;
  if (!tp_.sequence_parallel) {  // every rank normalised all rows: dw, db are already whole
    norm_backward_add_bf16(dres, dres16, dw, db, dout16, inp, w, mean, rstd, Nr, C);
    return;
  }
  float* partial = scratch_->dln_partials.data() + size_t(ln) * 2 * C;
  norm_backward_add_bf16(dres, dres16, partial, db ? partial + C : nullptr, dout16, inp, w, mean,
                         rstd, Nr, C);
  if (!reduce) return;
  tp_wait(tp_.comm->all_reduce(partial, 2 * size_t(C)));
  be_.add(dw, dw, partial, size_t(C));
  if (db) be_.add(db, db, partial + C, size_t(C));
  be_.fill_zero(partial, 2 * size_t(C) * sizeof(float));
}

// A row-parallel linear's output added to the residual: out = residual + inp [N, K] · wᵀ + bias
// on this rank's rows. tp 1 adds in the GEMM (matmul_forward_add_bf16); tp > 1 sums the fp32
// partial products over tp through `partial` (the bias on tp rank 0), then adds.
void GPT::row_forward_add_bf16(float* out, float* partial, const float* residual,
                               const bfloat16* inp, const bfloat16* w, const float* bias, int B,
                               int T, int K) {
  const int C = cfg_.channels;
  if (tp_.size == 1) {
    be_.matmul_forward_add_bf16(out, residual, inp, w, bias, B * T, K, C);
    return;
  }
  matmul_reduce_bf16(out, partial, inp, w, tp_.rank == 0 ? bias : nullptr, B, T, K);
  be_.add(out, out, residual, size_t(B) * T / rows_divisor_ * C);
}

float GPT::head_forward_bf16_tp(Slot& s, const float* residual, const int32_t* targets, int B,
                                int T) {
  const int C = cfg_.channels, V = cfg_.vocab, tps = tp_.size, Vl = cfg_.padded_vocab / tps;
  const int N = B * T;
  float* P = head_weights();
  Slot& h = head(s);
  cast_weights(table_->layers.size(), table_->head_w, table_->head_w + size_t(Vl) * C);
  norm_gathered_bf16(h.lnf16.data(), h.lnf_mean.data(), h.lnf_rstd.data(), residual,
                     P + table_->lnfw, at(P, table_->lnfb), B, T);
  float* logits = scratch_->logits32.data();
  be_.matmul_forward_add_bf16(logits, nullptr, h.lnf16.data(), head_w16(), nullptr, N, C, Vl);
  s.has_targets = targets != nullptr;
  if (!targets) return 0.0f;
  be_.copy(s.targets.data(), targets, size_t(N) * sizeof(int32_t));
  s.dloss = dloss_scale_ / float(N);  // backward's seed, applied here as on tp 1's path
  // The vocab-parallel loss (gpt_vocab_parallel.cpp), then its logit gradient, rounded once.
  const int v0 = vocab_begin(), live = std::max(0, std::min(Vl, V - v0));
  float* mine = scratch_->ce_stats.data();
  float* all = scratch_->ce_all.data();
  be_.crossentropy_slice_stats(mine, logits, s.targets.data(), v0, live, N, Vl);
  tp_wait(tp_.comm->all_gather(mine, all, size_t(N) * 3));
  be_.crossentropy_slice_combine(h.losses.data(), logits, all, tps, live, N, Vl);
  be_.crossentropy_slice_backward(logits, s.targets.data(), s.dloss, v0, N, Vl);
  be_.cast_to_bf16(h.logits16.data(), logits, size_t(N) * Vl);
  return mean_loss(s, N);
}

}  // namespace trident
