// GPT's private state (include/trident/model.h declares the names): one block's activation and
// weight pointers, the slots of micro-batches in flight, the shared scratch and the parameter
// table. Included by the model's own files only.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "trident/model.h"

namespace trident {

// The offset of a tensor this model does not have (a bias with model.bias false, RMSNorm's
// shift, wpe with rotary positions).
inline constexpr size_t kNoTensor = SIZE_MAX;

// One block's activations (pointers into a slot's storage or the shared recompute scratch).
struct GPT::BlockActs {
  float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *residual2, *ln2, *ln2_mean, *ln2_rstd, *fch,
      *fch_gelu, *residual3;
};
// The same buffers on the bf16 path: those the GEMMs, attention and GELU read are bf16.
struct GPT::BlockActs16 {
  bfloat16* ln1;
  float *ln1_mean, *ln1_rstd;
  bfloat16* qkv;
  float* att;
  bfloat16* atty;
  float* residual2;
  bfloat16* ln2;
  float *ln2_mean, *ln2_rstd;
  bfloat16 *fch, *fch_gelu;
  float* residual3;
};

// One micro-batch's activations. Per-block buffers that the recompute mode drops live once,
// in recompute_ (shared by all blocks and slots).
struct GPT::Slot {
  int chunk = 0;  // the model chunk whose blocks it holds (StageSpec)
  int B = 0, T = 0;
  bool has_targets = false;                  // the last forward had targets (backward needs them)
  BackendBuffer<int32_t> inputs, targets;    // copied into backend memory by forward
  BackendBuffer<float> encoded;              // stage input: embedding output or received [Nr,C]
  std::vector<BackendBuffer<float>> blocks;  // [kept buffer][layer * size]
  std::vector<BackendBuffer<bfloat16>> blocks16;  // bf16: the kBf16Buffer ones instead
  BackendBuffer<float> lnf, lnf_mean, lnf_rstd, logits, losses;
  BackendBuffer<bfloat16> lnf16, logits16;  // bf16: instead of lnf and logits
  float dloss = 0.0f;  // bf16: the seed the fused classifier used (Note [bf16 activations])
};

// Shared scratch: full-row partial sums, sequence-parallel staging, backward buffers.
struct GPT::Scratch {
  BackendBuffer<float> full_c, stage, ln_out;
  BackendBuffer<float> dresidual, dfull, dbuf_c, dbuf_c2, dbuf_3c, dbuf_4c, dbuf_4c2, datt,
      dln_partials;  // sequence parallelism: [2·layers + 1][2C] LayerNorm gradient partial sums
  BackendBuffer<float> ce_stats, ce_all;  // vocab-parallel loss: [N,3] and [tp,N,3]
  // Rotary positions: cos and sin [max_seq_len, rot/2], computed once (Note [RoPE tables] in
  // gpt_slots.cpp); the parallel residual's second input gradient [Nr,C].
  BackendBuffer<float> rope_cos, rope_sin, dparallel;
  // Context parallelism with learned positions: wpe's rows at this rank's positions [T,C], and
  // their gradient before it is added to wpe's.
  BackendBuffer<float> cp_wpe, cp_dwpe;
  // bf16: the residual gradient's bf16 copy [N,C] and the input gradients between the ops
  // (instead of dbuf_c, dbuf_3c, dbuf_4c, dbuf_4c2).
  // d16_act: the activation's output gradient [N, hidden] where it is not in fcproj's GEMM
  // (exact GELU, SwiGLU).
  BackendBuffer<bfloat16> dresidual16, d16_c, d16_3c, d16_4c, d16_act;
  // bf16 with cp or a mixture (Note [Widening at the bf16 boundary]): an input widened to fp32
  // (q|k|v, or ln2), the attention's output, its widened output gradient, and the fp32 input
  // gradient (dq|dk|dv, or dln2) before its rounding. Empty otherwise.
  BackendBuffer<float> wide_in, wide_out, wide_dout, wide_dinp;
  // bf16 with tp (Note [bf16 with tp] in gpt_bf16_tp.cpp): with SP, a norm's output on this
  // rank's rows [Nr,C], the bf16 gathers' staging [N,C] and the gathered gradient [N,C]; on the
  // last stage, the head's fp32 logits of this rank's vocabulary [N,V/tp].
  BackendBuffer<bfloat16> ln16_local, stage16, dfull16;
  BackendBuffer<float> logits32;
};

// Null where the block has no such tensor (biases with model.bias false, RMSNorm's shift).
struct GPT::BlockWeights {
  float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw,
      *fcprojb;
};

// Note [Parameter table]
// What forward and backward need of the parameter list is resolved once when the model is
// built (as llm.c's ParameterTensors): offsets into the flat buffer (params_ and grads_ alike),
// the ready indices backward reports through, and the phase names, so a step formats no
// string and searches no name.
struct GPT::BlockOffsets {
  size_t ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
};
struct GPT::LayerTable {
  BlockOffsets offset;
  // Index into infos_ of the last parameter each backward op finalises: backward reports
  // every parameter up to it (in ready order) right after the op.
  int ready_fcproj, ready_fc, ready_ln2, ready_attproj, ready_qkv, ready_ln1;
  // "forward block 3", "backward block 3", "weight block 3" (a split backward's W)
  std::string forward_phase, backward_phase, weight_phase;
  // A mixture MLP (Note [Expert tensors]): its tensors' offsets (kNoTensor where absent) in
  // MoeWeights order, and the last of them in ready order; fc*'s offsets are kNoTensor then.
  bool moe = false;
  std::array<size_t, 7> moe_offset{};
  int router_bias = -1;  // the parameter index of the sigmoid router's choice bias
  int ready_moe = -1;
  std::vector<int> uses;                // the block's parameter indices (for param_use_)
  size_t span_begin = 0, span_end = 0;  // the block's span of the flat buffer (bf16 casts)
};
struct GPT::ParamTable {
  // Offsets of the non-block tensors, valid where this stage holds them; head_w is the head's
  // weight (wte's, or lmw's when untied); lnfb and wpe are kNoTensor when absent.
  size_t wte = 0, wpe = 0, lnfw = 0, lnfb = 0, head_w = 0;
  int wte_index = -1;              // -1: not on this stage
  int tied_wte_index = -1;         // wte_index when the head is tied (reported on its own), else -1
  int head_w_index = -1;           // lmw's index when untied
  int head_last_index = -1;        // last head parameter (the final norm's)
  int embedding_last_index = -1;   // last embedding parameter in ready order
  std::vector<LayerTable> layers;  // per local layer (stage_.first_layer + i)
  std::string forward_embedding = "forward embedding", forward_head = "forward head+loss",
              backward_head = "backward head+loss", backward_embedding = "backward embedding",
              weight_embedding = "weight embedding";
  std::vector<int> embedding_uses, head_uses;  // for param_use_
};

struct GPT::BlockWeights16 {
  const bfloat16 *qkvw, *attprojw, *fcw, *fcprojw;
};

// base + offset, or null for kNoTensor.
inline float* at(float* base, size_t offset) {
  return offset == kNoTensor ? nullptr : base + offset;
}

}  // namespace trident
