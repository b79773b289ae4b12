// A mixture-of-experts MLP (Note [Mixture of experts] in trident/model_config.h): the router,
// top-k, the tokens' permutation to their experts and back, the experts' GEMMs, the shared
// experts and the auxiliary losses, each with its forward and backward; with ep > 1 the
// tokens travel to the rank holding their expert and back by all-to-all.
//
// Note [Expert capacity]
// capacity_factor 0 is dropless: every (token, expert) choice runs. Above 0 an expert takes at
// most ceil(f · N · k / E) of the N·k choices of this rank's micro-batch (Switch's and GShard's
// count), in token order, then choice order: a later token's choice beyond it is dropped and
// adds nothing (its weight is not renormalised over the kept ones), as Megatron-Core drops
// with drop_policy "position". The residual carries the token on; the router still learns
// from the dropped choice's probability through the auxiliary losses only.
//
// Note [Auxiliary losses]
// switch (per layer, Megatron-Core): coeff · E/(N²k) · Σᵢ (Σₜ pₜᵢ) · countᵢ; hf (transformers'
// Mixtral form): coeff · E/(LN)² · Σᵢ (Σₗ countₗᵢ)(Σₗ Σₜ pₗₜᵢ) over the L mixture layers'
// logits concatenated; z: coeff · mean over tokens of logsumexp(logits)². countᵢ are the top-k
// choices before any drop. Their gradients enter the router logits directly, scaled as the
// cross-entropy's seed (1/(accum·dp·cp)), as Megatron-Core's MoEAuxLossAutoScaler injects
// them; the loss the run reports is the cross-entropy alone, the auxiliary ones beside it.
//
// Note [Expert parallelism]
// ep ranks are consecutive within dp × cp (the grid's gradients group), so an ep group sits
// within a node; expert-data-parallel replicas are the rest, ep apart (with HSDP, those of its
// own replica: Note [Experts with HSDP] in src/train/zero3.h). Each rank routes its own
// tokens; the rows for rank d's experts are contiguous in expert order, so the counts go first
// (an all-to-all of E/ep integers a peer), then the rows, then the outputs come back the same
// way; backward sends the output gradients out and the input gradients back. A rank that
// receives no rows still takes part in every exchange. Buffers are sized once for the worst
// case, every token of the group on one rank's experts (ep · N · k rows).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "trident/backend.h"
#include "trident/comm.h"
#include "trident/model.h"

namespace trident {

// A mixture layer's tensors (Note [Expert tensors] in src/model/gpt_layout.cpp): this rank's
// experts, the router, the choice bias (sigmoid; else null), the shared experts (null without).
struct MoeWeights {
  const float *expfcw, *expfcprojw, *router, *routerbias, *shfcw, *shfcprojw, *shgate;
};
struct MoeGrads {
  float *expfcw, *expfcprojw, *router, *shfcw, *shfcprojw, *shgate;
};

// transformers' load-balancing form reads every mixture layer's routing of a micro-batch:
// the layers' counts and probability sums, per slot, filled by forward, read by backward.
// The counts also in backend memory (count_device, [slots][E]): the router's backward reads
// them there (Note [Mixture ops] in src/backend/moe_ops.cpp).
struct MoeHfTotals {
  std::vector<double> count, psum;  // [slots][E]
  std::vector<int> layers;          // [slots] mixture layers that added theirs
  // This chunk's own counts after its forward; the micro-batch's when its backward runs.
  BackendBuffer<int32_t> count_device;
  // Note [Transformers' totals across stages] (gpt_moe.cpp): per slot, whether the totals came
  // from other chunks; a message's host copy [slots][2E + 1]; the counts for count_device.
  std::vector<char> carried;
  std::vector<double> message;
  std::vector<int32_t> count_host;
};

class MoeLayer {
 public:
  // `max_tokens`: the most rows of a micro-batch this rank feeds the layer (B·T / SP's tp).
  // `share`: a layer of the same model whose backward scratch this one uses too (null: its
  // own; Note [Mixture memory]).
  // `recompute`: the run's mode; with mlp or full the experts' h and act are not kept per slot,
  // with full no layer keeps slots of its own (Note [Mixture memory]).
  MoeLayer(const GPTConfig& cfg, Backend& be, int layer, int slots, int max_tokens,
           ExpertParallel ep, MoeHfTotals* hf, Recompute recompute = Recompute::kNone,
           const MoeLayer* share = nullptr);
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  // out[N, C] = the mixture of x[N, C] (assigned). `counted`: false when recomputing (the same
  // routing again, its statistics already taken).
  void forward(int slot, float* out, const float* x, const MoeWeights& w, int N, bool counted);
  // dx[N, C] assigned; the weights' gradients accumulated; `loss_scale`: the cross-entropy's
  // seed per micro-batch (Note [Auxiliary losses]).
  void backward(int slot, float* dx, const float* dout, const float* x, const MoeWeights& w,
                const MoeGrads& g, int N, float loss_scale);

  // The tokens each of the E experts received since the last take (every micro-batch, this
  // rank's tokens, before any drop): the sigmoid router's bias update reads them.
  std::vector<double>& step_load() { return step_load_; }
  void take_stats(MoeStats& into);
  size_t bytes() const;  // its buffers (activations, and the scratch if it is its own)
  int layer() const { return layer_; }

 private:
  struct SlotState;
  struct Scratch;
  void route(SlotState& s, const float* x, const MoeWeights& w, int N, bool counted);
  void exchange_counts(SlotState& s);
  void dispatch(SlotState& s, const float* rows, float* out, int width, bool back);
  void experts_forward(SlotState& s, const MoeWeights& w);
  void experts_up(SlotState& s, const MoeWeights& w);  // h and act from the rows received
  float* h_of(SlotState& s);
  float* act_of(SlotState& s);
  void experts_backward(SlotState& s, const MoeWeights& w, const MoeGrads& g);
  void router_backward(SlotState& s, float* dx, const float* x, const MoeWeights& w,
                       const MoeGrads& g, int N, float loss_scale);

  const GPTConfig& cfg_;
  Backend& be_;
  int layer_;
  int max_tokens_;
  ExpertParallel ep_;
  MoeHfTotals* hf_;
  std::shared_ptr<std::vector<SlotState>> slots_;  // with recompute full, the model's one set
  bool owns_slots_ = true;
  std::shared_ptr<Scratch> scratch_;
  bool owns_scratch_ = true;
  Recompute recompute_;
  std::vector<double> step_load_;
  MoeStats stats_;
};

}  // namespace trident
