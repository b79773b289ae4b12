// Tensor-parallel plumbing of the GPT model: the tp collectives and the sequence-parallel
// row layout.
//
// Note [Sequence-parallel rows]
// With sequence parallelism tp rank r holds, of every sequence b, the positions
// [r·T/tp, (r+1)·T/tp): local row (b, t) is global row (b, r·T/tp + t). The collectives work on
// contiguous per-rank blocks, so gathering permutes [tp][B][T/tp][C] into [B][T][C] and
// reduce-scattering permutes the other way, through scratch_->stage.
#include <cstring>
#include <utility>

#include "model/gpt_state.h"
#include "model/tp_overlap.h"
#include "trident/check.h"
#include "trident/model.h"

namespace trident {

double GPT::take_tp_comm_ms() {
  const double ms = tp_times_.comm_ms;
  tp_times_.comm_ms = 0.0;
  return ms;
}

double GPT::take_tp_exposed_ms() {
  const double ms = tp_times_.exposed_ms;
  tp_times_.exposed_ms = 0.0;
  return ms;
}

// Note [Waiting for a tp collective]
// On a host backend the compute thread has nothing else to do while it waits, and Open MPI
// advances the collective only inside an MPI call, so it tests and yields until done (test()
// still enforces the timeout). Work::wait's backoff sleeps, meant for threads that share cores
// with compute, would overshoot every small collective (docs/perf.md). A device backend keeps
// wait(): its Work is an event query. (wait_tp in tp_overlap.cpp.)
void GPT::tp_wait(Work w) { wait_tp(be_, w, tp_times_); }

// Note [Reduce in place]
// Without sequence parallelism the sum over tp is an all-reduce of every row, so callers pass
// out == partial (the partial products are written where the sum is wanted) and nothing is
// copied back; a copy of N·C floats four times per block is what a separate buffer would cost.
// With sequence parallelism the sum is a reduce-scatter into this rank's rows, out != partial.
void GPT::reduce_rows(float* out, float* partial, int B, int T, int C) {
  finish_reduce_rows(start_reduce_rows(out, partial, B, T, C), out, partial, B, T, C);
}

Work GPT::start_reduce_rows(float* out, float* partial, int B, int T, int C) {
  const size_t N = size_t(B) * T;
  if (!tp_.sequence_parallel) return tp_.size > 1 ? tp_.comm->all_reduce(partial, N * C) : Work{};
  const int tps = tp_.size, Tl = T / tps;
  const size_t row = size_t(C) * sizeof(float);
  float* stage = scratch_->stage.data();
  // stage[r][b][t] = partial[b][r·Tl + t]  (Note [Sequence-parallel rows])
  for (int r = 0; r < tps; ++r)
    be_.copy_rows(stage + size_t(r) * B * Tl * C, Tl * row, partial + size_t(r) * Tl * C, T * row,
                  Tl * row, size_t(B));
  return tp_.comm->reduce_scatter(stage, out, size_t(B) * Tl * C);
}

void GPT::finish_reduce_rows(Work w, float* out, float* partial, int B, int T, int C) {
  if (tp_.size > 1) tp_wait(std::move(w));
  if (!tp_.sequence_parallel && out != partial)
    be_.copy(out, partial, size_t(B) * T * C * sizeof(float));
}

void GPT::gather_rows(float* full, const float* local, int B, int T, int C) {
  const size_t N = size_t(B) * T;
  if (!tp_.sequence_parallel) {
    if (full != local) be_.copy(full, local, N * C * sizeof(float));
    return;
  }
  float* stage = scratch_->stage.data();
  tp_wait(tp_.comm->all_gather(local, stage, size_t(B) * (T / tp_.size) * C));
  place_gathered_rows(full, stage, size_t(C) * sizeof(float), B, T);
}

// full[b][r·Tl + t] = stage[r][b][t]: each tp rank's block of Tl rows of every sequence, in
// sequence order (rows of `row` bytes; fp32 and bf16 alike).
void GPT::place_gathered_rows(void* full, const void* stage, size_t row, int B, int T) {
  const int tps = tp_.size, Tl = T / tps;
  auto* dst = static_cast<char*>(full);
  const auto* src = static_cast<const char*>(stage);
  for (int r = 0; r < tps; ++r)
    be_.copy_rows(dst + size_t(r) * Tl * row, T * row, src + size_t(r) * B * Tl * row, Tl * row,
                  Tl * row, size_t(B));
}

void GPT::norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C) {
  if (cfg_.norm == Norm::kRMSNorm) be_.rmsnorm_forward(out, rstd, inp, w, N, C, cfg_.norm_eps);
  else be_.layernorm_forward(out, mean, rstd, inp, w, b, N, C);
}

void GPT::norm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C) {
  if (cfg_.norm == Norm::kRMSNorm) be_.rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  else be_.layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

void GPT::norm_gathered(float* out_full, float* mean, float* rstd, const float* inp, const float* w,
                        const float* b, int B, int T, int C) {
  const int N = B * T;
  if (!tp_.sequence_parallel) {
    norm_forward(out_full, mean, rstd, inp, w, b, N, C);
    return;
  }
  const int Nr = N / tp_.size;
  norm_forward(scratch_->ln_out.data(), mean, rstd, inp, w, b, Nr, C);
  gather_rows(out_full, scratch_->ln_out.data(), B, T, C);
}

void GPT::norm_gathered_backward(float* dinp, float* dw, float* db, float* dout_full_partial,
                                 const float* inp, const float* w, const float* mean,
                                 const float* rstd, int B, int T, int C, int ln, bool reduce) {
  finish_norm_gathered_backward(start_norm_gathered_backward(dout_full_partial, B, T, C), dinp, dw,
                                db, dout_full_partial, inp, w, mean, rstd, B, T, C, ln, reduce);
}

// The backward of "identity forward": the column-parallel linears each produced a partial input
// gradient; sum them over tp (reduce-scatter to this rank's rows with sequence parallelism;
// Note [Reduce in place] without).
Work GPT::start_norm_gathered_backward(float* dout_full_partial, int B, int T, int C) {
  if (tp_.size == 1) return Work{};
  float* dout = tp_.sequence_parallel ? scratch_->ln_out.data() : dout_full_partial;
  return start_reduce_rows(dout, dout_full_partial, B, T, C);
}

void GPT::finish_norm_gathered_backward(Work sum, float* dinp, float* dw, float* db,
                                        float* dout_full_partial, const float* inp, const float* w,
                                        const float* mean, const float* rstd, int B, int T, int C,
                                        int ln, bool reduce) {
  const int N = B * T;
  if (tp_.size == 1) {
    norm_backward(dinp, dw, db, dout_full_partial, inp, w, mean, rstd, N, C);
    return;
  }
  float* dout = tp_.sequence_parallel ? scratch_->ln_out.data() : dout_full_partial;
  finish_reduce_rows(std::move(sum), dout, dout_full_partial, B, T, C);
  if (!tp_.sequence_parallel) {
    // Every rank normalised the same rows: the weight gradients are already identical.
    norm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    return;
  }
  norm_local_backward(dinp, dw, db, dout, inp, w, mean, rstd, N / tp_.size, C, ln, reduce);
}

void GPT::norm_local_backward(float* dinp, float* dw, float* db, const float* dout,
                              const float* inp, const float* w, const float* mean,
                              const float* rstd, int Nr, int C, int ln, bool reduce) {
  if (!tp_.sequence_parallel) {
    norm_backward(dinp, dw, db, dout, inp, w, mean, rstd, Nr, C);
    return;
  }
  // Note [Sequence-parallel LayerNorm gradients]
  // Each rank saw only its rows, so its LayerNorm weight gradients are partial sums over tp.
  // They accumulate over micro-batches in this LayerNorm's own [2C] buffer (grads() may already
  // hold summed values), and only the step's last micro-batch sums it over tp, adds it to dw and
  // db and zeroes it: one latency-bound all-reduce per LayerNorm per step, not per micro-batch.
  // With accum > 1 the sums run over micro-batches first, then ranks: equal within rounding.
  float* partial = scratch_->dln_partials.data() + size_t(ln) * 2 * C;
  norm_backward(dinp, partial, db ? partial + C : nullptr, dout, inp, w, mean, rstd, Nr, C);
  if (!reduce) return;
  tp_wait(tp_.comm->all_reduce(partial, 2 * size_t(C)));
  be_.add(dw, dw, partial, size_t(C));
  if (db) be_.add(db, db, partial + C, size_t(C));
  be_.fill_zero(partial, 2 * size_t(C) * sizeof(float));
}

}  // namespace trident
