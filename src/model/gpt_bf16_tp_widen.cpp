// The bf16 tp block's fp32 boundaries (gpt_bf16_tp.cpp runs the block): context-parallel
// attention and a mixture of experts, through the same widening functions as tp 1's block
// (gpt_bf16_widen.cpp), on this tp rank's heads or rows.
//
// Note [Widening under tp]
// tp 1's widening (Note [Widening at the bf16 boundary]) serves tp > 1 on this rank's share:
// cp attention widens q|k|v of its NH/tp heads into the CpAttention fp32 tp builds, so its out
// and dqkv are this rank's alone and no tp sum runs at the boundary. A mixture needs SP
// (Note [Mixtures and tp]): ln2 is normalised on this rank's Nr rows, not gathered; the fp32
// mixture reads them widened and its output is final there. Backward rounds dln2 once for the
// norm's bf16 backward; the norm's partial weight gradients and the experts' sum over tp on the
// step's last micro-batch. Scratch: 2·N·(QKV+Q)/tp floats with cp, 2·Nr·C with a mixture.
#include "model/gpt_state.h"
#include "trident/model.h"

namespace trident {

void GPT::moe_block_forward_bf16_tp(int slot, int local_layer, const BlockWeights& w,
                                    const BlockActs16& a, const float* mlp_in, int Nr) {
  norm_forward_bf16(a.ln2, a.ln2_mean, a.ln2_rstd, mlp_in, w.ln2w, w.ln2b, Nr, cfg_.channels);
  moe_forward_bf16(slot, local_layer, a, Nr);  // residual3 = residual2 + the mixture
}

// dres: the block output's fp32 gradient on this rank's rows, which the mixture reads before
// ln2's backward adds the MLP input's gradient into it (and writes dres16 when non-null).
void GPT::moe_block_backward_bf16_tp(int slot, int local_layer, float* dres, bfloat16* dres16,
                                     const BlockWeights& w, const BlockWeights& dw,
                                     const BlockActs16& a, const float* mlp_in, int Nr,
                                     float dloss_scale, bool last_micro_batch) {
  bfloat16* dln2 = scratch_->d16_c.data();
  moe_backward_bf16(slot, local_layer, dln2, dres, a, Nr, dloss_scale, last_micro_batch);
  norm_local_backward_bf16(dres, dres16, dw.ln2w, dw.ln2b, dln2, mlp_in, w.ln2w, a.ln2_mean,
                           a.ln2_rstd, Nr, 2 * local_layer + 1, last_micro_batch);
}

}  // namespace trident
