// The bf16 path's fp32 boundaries (gpt_bf16.cpp runs the block, at any tp): attention by
// blocks over the cp ranks and a mixture-of-experts MLP have fp32 ops only, so their bf16 inputs
// are widened into fp32 scratch, the fp32 op runs as the fp32 path calls it, and what a bf16
// GEMM reads next is rounded once. With tp, on this tp rank's heads or rows.
//
// Note [Widening at the bf16 boundary]
// Widening is exact, so an fp32 op on widened inputs, its outputs rounded once, is the bf16
// op by the definition of Note [bf16 activations]: cp attention is the bf16 attention up to
// fp32 summation order. In fp32: cp attention (q|k|v in, its log-sum-exp kept per layer as on
// the fp32 path, out rounded for attproj) and the whole mixture (router, experts, shared
// experts, on the widened bf16 ln2 the dense MLP would read; output added to the fp32 residual).
// Backward reads the block output's fp32 gradient and rounds dln2 for the bf16 norm backward,
// as fc's GEMM would. Costs: a widen and a round per boundary, and the fp32 scratch (2·N·(QKV+Q)
// floats with cp, 2·N·C with a mixture), one set for all layers and slots.
//
// Note [Widening under tp]
// tp 1's widening (Note [Widening at the bf16 boundary]) serves tp > 1 on this rank's share:
// cp attention widens q|k|v of its NH/tp heads into the CpAttention fp32 tp builds, so its out
// and dqkv are this rank's alone and no tp sum runs at the boundary. A mixture needs SP
// (Note [Mixtures and tp]): ln2 is normalised on this rank's Nr rows, not gathered; the fp32
// mixture reads them widened and its output is final there. Backward rounds dln2 once for the
// norm's bf16 backward; the norm's partial weight gradients and the experts' sum over tp on the
// step's last micro-batch. Scratch: 2·N·(QKV+Q)/tp floats with cp, 2·Nr·C with a mixture.
#include <algorithm>

#include "model/cp_attention.h"
#include "model/gpt_state.h"
#include "trident/model.h"

namespace trident {

void GPT::make_widen_buffers(int B, int T) {
  if (precision_ != Precision::kBf16) return;
  // This tp rank's heads, and a mixture's rows (Note [Widening under tp]).
  const size_t N = size_t(B) * T, C = cfg_.channels, tps = tp_.size;
  const size_t QKV = cfg_.qkv_rows() / tps, Q = cfg_.heads / tps * size_t(cfg_.head_size());
  size_t in = 0, out = 0;
  if (cp_attention_) in = N * QKV, out = N * Q;
  if (moe_count_ > 0) in = std::max(in, N / rows_divisor_ * C);
  if (in == 0) return;
  Scratch& a = *scratch_;
  a.wide_in = BackendBuffer<float>(be_, in);
  a.wide_dinp = BackendBuffer<float>(be_, in);
  if (out == 0) return;
  a.wide_out = BackendBuffer<float>(be_, out);
  a.wide_dout = BackendBuffer<float>(be_, out);
}

void GPT::block_attention_forward_bf16(const BlockActs16& a, int B, int T) {
  const int NH = cfg_.heads / tp_.size, KVH = cfg_.kv_head_count() / tp_.size;
  const int hs = cfg_.head_size();
  if (!cp_attention_) {
    be_.attention_forward_gqa_bf16(a.atty, a.att, a.qkv, B, T, NH, KVH, hs);
    return;
  }
  const size_t N = size_t(B) * T;
  Scratch& s = *scratch_;
  be_.cast_to_fp32(s.wide_in.data(), a.qkv, N * (cfg_.qkv_rows() / tp_.size));
  cp_attention_->forward(s.wide_out.data(), a.att, s.wide_in.data(), B, T);
  be_.cast_to_bf16(a.atty, s.wide_out.data(), N * size_t(NH) * hs);
}

void GPT::block_attention_backward_bf16(bfloat16* dqkv, const bfloat16* dout, const BlockActs16& a,
                                        int B, int T) {
  const int NH = cfg_.heads / tp_.size, KVH = cfg_.kv_head_count() / tp_.size;
  const int hs = cfg_.head_size();
  Scratch& s = *scratch_;
  if (!cp_attention_) {
    be_.attention_backward_gqa_bf16(dqkv, s.datt.data(), dout, a.qkv, a.atty, a.att, B, T, NH, KVH,
                                    hs);
    return;
  }
  const size_t N = size_t(B) * T, QKV = N * (cfg_.qkv_rows() / tp_.size), Q = N * size_t(NH) * hs;
  // Forward's inputs again (recomputation or the kept bf16 ones: the same bits either way).
  be_.cast_to_fp32(s.wide_in.data(), a.qkv, QKV);
  be_.cast_to_fp32(s.wide_out.data(), a.atty, Q);
  be_.cast_to_fp32(s.wide_dout.data(), dout, Q);
  cp_attention_->backward(s.wide_dinp.data(), s.datt.data(), s.wide_dout.data(), s.wide_in.data(),
                          s.wide_out.data(), a.att, B, T);
  be_.cast_to_bf16(dqkv, s.wide_dinp.data(), QKV);
}

void GPT::moe_forward_bf16(int slot, int local_layer, const BlockActs16& a, int N) {
  const size_t n = size_t(N) * cfg_.channels;
  float* x = scratch_->wide_in.data();
  be_.cast_to_fp32(x, a.ln2, n);
  moe_forward(slot, local_layer, a.residual3, x, N);
  be_.add(a.residual3, a.residual3, a.residual2, n);
}

void GPT::moe_backward_bf16(int slot, int local_layer, bfloat16* dln2, const float* dout,
                            const BlockActs16& a, int N, float dloss_scale, bool last_micro_batch) {
  const size_t n = size_t(N) * cfg_.channels;
  Scratch& s = *scratch_;
  be_.cast_to_fp32(s.wide_in.data(), a.ln2, n);
  // With tp its weight gradients sum over tp on the last micro-batch (Note [Mixtures and tp]).
  moe_backward(slot, local_layer, s.wide_dinp.data(), dout, s.wide_in.data(), N, dloss_scale,
               last_micro_batch);
  be_.cast_to_bf16(dln2, s.wide_dinp.data(), n);
}

// A mixture layer's ln2 and mixture, on this rank's rows (all N at tp 1).
void GPT::moe_block_forward_bf16(int slot, int local_layer, const BlockWeights& w,
                                 const BlockActs16& a, const float* mlp_in, int Nr) {
  norm_forward_bf16(a.ln2, a.ln2_mean, a.ln2_rstd, mlp_in, w.ln2w, w.ln2b, Nr, cfg_.channels);
  moe_forward_bf16(slot, local_layer, a, Nr);  // residual3 = residual2 + the mixture
}

// dres: the block output's fp32 gradient on this rank's rows, which the mixture reads before
// ln2's backward adds the MLP input's gradient into it (and writes dres16 when non-null).
void GPT::moe_block_backward_bf16(int slot, int local_layer, float* dres, bfloat16* dres16,
                                  const BlockWeights& w, const BlockWeights& dw,
                                  const BlockActs16& a, const float* mlp_in, int Nr,
                                  float dloss_scale, bool last_micro_batch) {
  bfloat16* dln2 = scratch_->d16_c.data();
  moe_backward_bf16(slot, local_layer, dln2, dres, a, Nr, dloss_scale, last_micro_batch);
  norm_local_backward_bf16(dres, dres16, dw.ln2w, dw.ln2b, dln2, mlp_in, w.ln2w, a.ln2_mean,
                           a.ln2_rstd, Nr, 2 * local_layer + 1, last_micro_batch);
}

}  // namespace trident
