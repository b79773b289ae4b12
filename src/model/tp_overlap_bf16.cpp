// parallel.tp_overlap on the bf16 tp block (Note [Tensor-parallel overlap in bf16] in
// tp_overlap.h): TpOverlap's rings with bf16 GEMMs as their pieces, and the block's linears
// (Note [bf16 with tp] in gpt_bf16_tp.cpp) that take them where the overlap is on and the
// unchunked collectives where it is off.
#include "model/gpt_state.h"
#include "model/tp_overlap.h"
#include "trident/check.h"
#include "trident/model.h"

namespace trident {

// A piece's GEMM writes its rows of `out` in place with one sequence; with more, its rows are
// packed (rows_ read as two bf16 halves: the output, and the GELU's pre-activation) and moved.
void TpOverlap::gather_matmul_bf16(bfloat16* out, bfloat16* in_full, const bfloat16* local,
                                   const Gemm16& g, int B, int T, int C) {
  TRIDENT_CHECK(stage16_ != nullptr, "the bf16 tp ring has no bf16 staging");
  const int Tl = T / tp_.size;
  const size_t in_row = size_t(C) * sizeof(bfloat16), out_row = size_t(g.OC) * sizeof(bfloat16);
  bfloat16* packed = reinterpret_cast<bfloat16*>(rows_.data());
  bfloat16* packed_pre = packed + rows_.size();
  const bool gelu = g.pre_out || g.pre_in;
  auto piece = [&](const bfloat16* in, int src, int r0, int count) {
    if (in_full) move_rows(in_full, in, true, src, r0, count, T, in_row);
    const size_t at = (size_t(src) * Tl + size_t(r0)) * g.OC;  // B == 1: the rows in out
    bfloat16* dst = B == 1 ? out + at : packed;
    bfloat16* pre = B == 1 ? (g.pre_out ? g.pre_out + at : nullptr) : packed_pre;
    const bfloat16* pre_in = g.pre_in && B == 1 ? g.pre_in + at : packed_pre;
    if (g.pre_in && B > 1) move_rows(packed_pre, g.pre_in, false, src, r0, count, T, out_row);
    if (!g.input_gradient && gelu)
      be_.matmul_gelu_forward_bf16(dst, pre, in, g.w, g.bias, count, C, g.OC);
    else if (!g.input_gradient) be_.matmul_forward_bf16(dst, in, g.w, g.bias, count, C, g.OC);
    else if (gelu)  // DGELU_BGRAD: dbias sums piece by piece
      be_.matmul_dgelu_backward_bf16(dst, g.dbias, in, g.w, pre_in, count, g.OC, C);
    else be_.matmul_backward_bf16(dst, nullptr, nullptr, in, nullptr, g.w, count, g.OC, C);
    if (B == 1) return;
    move_rows(out, dst, true, src, r0, count, T, out_row);
    if (g.pre_out) move_rows(g.pre_out, pre, true, src, r0, count, T, out_row);
  };
  if (order_) grouped_gather_ring<bfloat16>(local, stage16_, B, T, C, piece);
  else gather_ring<bfloat16>(local, stage16_, B, T, C, piece);
}

void TpOverlap::matmul_reduce_scatter_bf16(float* out, const bfloat16* inp, const bfloat16* w,
                                           const float* bias, int B, int T, int K, int C) {
  const int Tl = T / tp_.size;
  bfloat16* packed = reinterpret_cast<bfloat16*>(rows_.data());
  auto piece = [&](float* dst, int c, int r0, int count) {
    const bfloat16* in = inp + (size_t(c) * Tl + size_t(r0)) * K;  // one sequence
    if (B > 1) {
      move_rows(packed, inp, false, c, r0, count, T, size_t(K) * sizeof(bfloat16));
      in = packed;
    }
    be_.matmul_forward_add_bf16(dst, nullptr, in, w, bias, count, K, C);
  };
  if (order_) grouped_reduce_scatter_ring(out, B, T, C, piece);
  else reduce_scatter_ring(out, B, T, C, piece);
}

void TpOverlap::matmul_all_reduce_bf16(float* out, const bfloat16* inp, const bfloat16* w,
                                       const float* bias, int N, int K, int C) {
  auto piece = [&](int r0, int count) {
    be_.matmul_forward_add_bf16(out + size_t(r0) * C, nullptr, inp + size_t(r0) * K, w, bias, count,
                                K, C);
  };
  all_reduce_pieces(out, N, C, piece);
}

// out [N, OC] = bf16(norm(inp) · wᵀ + b), the norm's bf16 output gathered to all N rows into
// normed with SP; chunk by chunk beside the GEMM where the rings overlap.
void GPT::norm_matmul_bf16(bfloat16* out, bfloat16* normed, float* mean, float* rstd,
                           const float* inp, const float* nw, const float* nb, const bfloat16* w,
                           const float* b, int B, int T, int OC) {
  const int C = cfg_.channels;
  if (tp_overlap_ && tp_.sequence_parallel) {
    bfloat16* local = scratch_->ln16_local.data();
    norm_forward_bf16(local, mean, rstd, inp, nw, nb, B * T / tp_.size, C);
    tp_overlap_->gather_matmul_bf16(out, normed, local, {.w = w, .bias = b, .OC = OC}, B, T, C);
    return;
  }
  norm_gathered_bf16(normed, mean, rstd, inp, nw, nb, B, T);
  be_.matmul_forward_bf16(out, normed, w, b, B * T, C, OC);
}

// ln2 and the MLP's first linear and activation (mlp_up_forward_bf16 on the gathered rows).
void GPT::norm_mlp_up_forward_bf16(const BlockWeights& w, const BlockWeights16& w16,
                                   const BlockActs16& a, const float* mlp_in, int B, int T) {
  const int C = cfg_.channels, N = B * T, F = cfg_.hidden() / tp_.size;
  const int FC = cfg_.fc_rows() / tp_.size;
  if (!tp_overlap_ || !tp_.sequence_parallel) {
    norm_gathered_bf16(a.ln2, a.ln2_mean, a.ln2_rstd, mlp_in, w.ln2w, w.ln2b, B, T);
    mlp_up_forward_bf16(w, w16, a, N);
    return;
  }
  bfloat16* local = scratch_->ln16_local.data();
  norm_forward_bf16(local, a.ln2_mean, a.ln2_rstd, mlp_in, w.ln2w, w.ln2b, N / tp_.size, C);
  if (cfg_.activation == Activation::kGeluTanh) {  // the GELU in the GEMM, as on tp 1's path
    tp_overlap_->gather_matmul_bf16(a.fch_gelu, a.ln2, local,
                                    {.w = w16.fcw, .bias = w.fcb, .OC = FC, .pre_out = a.fch}, B, T,
                                    C);
    return;
  }
  tp_overlap_->gather_matmul_bf16(a.fch, a.ln2, local, {.w = w16.fcw, .bias = w.fcb, .OC = FC}, B,
                                  T, C);
  if (cfg_.activation == Activation::kSwiGLU) be_.swiglu_forward_bf16(a.fch_gelu, a.fch, N, F);
  else be_.gelu_erf_forward_bf16(a.fch_gelu, a.fch, size_t(N) * F);
}

// out (this rank's rows) = the tp sum of inp [N, K] · wᵀ (+ bias: tp rank 0 passes it) in fp32,
// through `partial` where the rings are off (== out without SP: Note [Reduce in place]).
void GPT::matmul_reduce_bf16(float* out, float* partial, const bfloat16* inp, const bfloat16* w,
                             const float* bias, int B, int T, int K) {
  const int C = cfg_.channels;
  if (tp_overlap_) {
    if (tp_.sequence_parallel)
      tp_overlap_->matmul_reduce_scatter_bf16(out, inp, w, bias, B, T, K, C);
    else tp_overlap_->matmul_all_reduce_bf16(out, inp, w, bias, B * T, K, C);
    return;
  }
  be_.matmul_forward_add_bf16(partial, nullptr, inp, w, bias, B * T, K, C);
  reduce_rows(out, partial, B, T, C);
}

// A row-parallel linear's input gradient dinp [N, K] = bf16(dout · w) from this rank's rows of
// its output gradient (through the GELU of `pre` when non-null, dbias += its column sums);
// returns the output gradient on all N rows (gathered in bf16 into dfull16 with SP).
const bfloat16* GPT::row_backward_bf16(bfloat16* dinp, float* dbias, const bfloat16* dlocal,
                                       const bfloat16* w, const bfloat16* pre, int B, int T,
                                       int K) {
  const int C = cfg_.channels, N = B * T;
  if (tp_overlap_ && tp_.sequence_parallel) {
    bfloat16* full = scratch_->dfull16.data();
    tp_overlap_->gather_matmul_bf16(
        dinp, full, dlocal,
        {.w = w, .dbias = dbias, .OC = K, .input_gradient = true, .pre_in = pre}, B, T, C);
    return full;
  }
  const bfloat16* dout = dlocal;
  if (rows_divisor_ > 1) {
    gather_rows_bf16(scratch_->dfull16.data(), dlocal, B, T, C);
    dout = scratch_->dfull16.data();
  }
  if (pre) be_.matmul_dgelu_backward_bf16(dinp, dbias, dout, w, pre, N, K, C);
  else be_.matmul_backward_bf16(dinp, nullptr, nullptr, dout, nullptr, w, N, K, C);
  return dout;
}

// A column-parallel linear's backward: dinp [N, C] the fp32 partial input gradient, its sum over
// tp started (norm_gathered_backward_bf16 waits); dw and db (+=, null: skipped) before, or while
// the sum travels where the collectives overlap (Megatron's bulk overlap, as column_backward).
// At tp 1 the input gradient is whole: rounded in the GEMM, into d16_c, in one call with dw, db.
Work GPT::column_backward_bf16(float* dinp, float* dw, float* db, const bfloat16* dout,
                               const bfloat16* inp, const bfloat16* w, int B, int T, int OC) {
  const int C = cfg_.channels, N = B * T;
  if (tp_.size == 1) {
    be_.matmul_backward_bf16(scratch_->d16_c.data(), dw, db, dout, inp, w, N, C, OC);
    return Work{};
  }
  const bool weights = dw || db;  // none in zb-h1's B (Note [Split backward in bf16])
  if (!tp_overlap_ && weights)
    be_.matmul_backward_bf16(nullptr, dw, db, dout, inp, nullptr, N, C, OC);
  be_.matmul_backward_input_fp32_bf16(dinp, dout, w, N, C, OC);
  Work sum = start_norm_gathered_backward(dinp, B, T, C);
  if (tp_overlap_ && weights)
    be_.matmul_backward_bf16(nullptr, dw, db, dout, inp, nullptr, N, C, OC);
  return sum;
}

}  // namespace trident
