// The plan model's parts, shared by its files and its tests (not installed).
#pragma once

#include <string>
#include <vector>

#include "trident/model.h"
#include "trident/plan.h"

namespace trident {

// Where a rank sits and what it gets of its node.
struct RankPlace {
  int ranks_per_node = 1;
  int local_ranks = 1;    // ranks of this layout on one node
  double cores = 1;       // cpu: cores this rank computes on (shared ones count partly)
  double memory_bw = 0;   // B/s this rank gets
  double peak_flops = 0;  // MFU's denominator for this rank
  LinkSpec tp_link, dp_link, pp_link;
  LinkSpec cp_link;  // the cp group: tp-strided, inside dp (trident/grid.h)
  LinkSpec ep_link;  // the ep group: ep consecutive ranks of dp·cp, tp-strided
  // ZeRO-3's shard group (tp·dp_shard consecutive ranks) and HSDP's replica group (strided
  // across the shard groups: the dp group's span); both are dp_link without HSDP.
  LinkSpec shard_link, replicate_link;
};
// busy_fraction: of the step a rank computes (1 − the pipeline's bubble share); oversubscribed
// CPU ranks yield their cores for the rest.
RankPlace rank_place(const PlanLayout& layout, const Hardware& hw, double busy_fraction = 1);

// Whether the layout runs parallel.tp_overlap's rings (tp > 1, and auto resolved as the trainer
// does: Note [Chunks on the host] in src/model/tp_overlap.h): the time hidden and the memory.
bool tp_overlap_runs(const PlanModel& model, const PlanLayout& layout, const Hardware& hw,
                     const RankPlace& place);
// One micro-batch on one pipeline stage, seconds (Note [Plan model]).
struct StageCost {
  double gemm = 0, attention = 0, memory_bound = 0, pp_p2p = 0, recompute = 0;
  // Tensor parallelism's collectives (forward and backward; a full recompute's repeat is in
  // recompute): what the GEMMs leave exposed, all of them, and what the GEMMs hide (the
  // repeat's share included), which slows the compute under it by overlap_slowdown.
  double tp_comm = 0, tp_total = 0, tp_hidden = 0;
  // Context parallelism's K/V exchange: what the attention does not hide, and what it hides
  // (which slows the compute under it by overlap_slowdown).
  double cp_comm = 0, cp_hidden = 0;
  // Expert parallelism's all-to-alls (Note [Plan mixture of experts]), all exposed.
  double a2a = 0;
  double forward = 0, backward = 0;  // the same split by pass (recompute is in backward)
  // Of backward, what zb-h1's W pass runs: the weight GEMMs it defers (not a mixture's, nor the
  // head's: Note [Mixtures in B], Note [Split backward]) and the embedding's scatter.
  double weight_pass = 0;
};
StageCost stage_cost(const PlanModel& model, const PlanLayout& layout, const Hardware& hw,
                     const RankPlace& place, const StageSpec& stage);

// The CPU backend keeps its T×T attention (softmax probabilities saved) below this sequence
// length and runs blockwise from it (Note [Plan attention state] in src/plan/memory.cpp). The
// CPU backend's own threshold is the source of truth and this copy must match it: the lead's
// kTxTAttentionMaxT = 64 (src/backend/kernels.h, T×T up to 64), so blockwise from 65.
inline constexpr int kBlockwiseAttentionFromT = 65;
// Whether attention saves one log-sum-exp per row and head (fused kernels, context
// parallelism, long sequences on the CPU) rather than the B·NH·T² probabilities.
bool blockwise_attention(const PlanModel& model, const PlanLayout& layout, const Hardware& hw);

// The vocabulary as the model pads it for this layout's tp.
int padded_vocab(const PlanModel& model, const PlanLayout& layout);
// The model's GPTConfig for this layout (max_seq_len = seq_len, vocabulary padded for its tp).
GPTConfig gpt_config(const PlanModel& model, const PlanLayout& layout);
// A kernel's bandwidth on this rank: its measured rate (gbytes_per_s; cpu: per core, on the
// rank's cores), never above the rank's share of memory bandwidth; 0: that share.
double kernel_bandwidth(const Hardware& hw, const RankPlace& place, double gbytes_per_s);
// Parameters on pipeline stage `stage` of one tp rank (gpt_param_layout's count, in closed form).
double stage_params(const PlanModel& model, const PlanLayout& layout, int stage);
// Of those, the routed experts' (Note [Expert tensors] in src/model/gpt_layout.cpp): E/ep of
// them per mixture layer, whole over tp; they reduce and shard over the expert-dp ranks.
double stage_expert_params(const PlanModel& model, const PlanLayout& layout, int stage);
// The same parameters as ZeRO-3's units, in forward order: wte (and the tied head), wpe, one per
// block, the head (final norm + untied LM head); they sum to stage_params.
std::vector<double> stage_units(const PlanModel& model, const PlanLayout& layout, int stage);
// ZeRO-3's pool on a stage (Note [Plan ZeRO-3]), in elements: the parameters two neighbouring
// groups gather, and the largest gradient written whole.
struct Zero3Pool {
  double params = 0, whole_grad = 0;
  double device_params = 0;  // a GPU's slots (Note [Plan ZeRO-3 on a device])
  double device_grads = 0;   // a GPU's gradient pool: the own slots and two block slots
  double tied_cast = 0;      // bf16 on a GPU: a tied head's cast of wte, on a stage with the head
};
Zero3Pool zero3_pool(const PlanModel& m, const PlanLayout& l, int s);
// Bytes of parameters, gradients and optimizer state on `stage`, without activations
// (Note [Plan memory], Note [Plan ZeRO-3]): the routed experts' apart (0 for a dense model).
struct ModelStates {
  double params = 0, grads = 0, optimizer = 0;
  double expert_params = 0, expert_grads = 0, expert_optimizer = 0;
  double total() const {
    return params + grads + optimizer + expert_params + expert_grads + expert_optimizer;
  }
};
ModelStates model_state_bytes(const PlanModel& model, const PlanLayout& layout, const Hardware& hw,
                              int stage);
// Bytes an asynchronous save copies on a rank of `stage` (Note [Plan checkpoint snapshot]).
double snapshot_bytes(const PlanModel& model, const PlanLayout& layout, int stage);
// Why trident would refuse the layout (the trainer's own checks); empty if it runs.
std::string layout_problem(const PlanModel& model, const PlanLayout& layout);
// Bytes per rank of pipeline stage `stage` (src/plan/memory.cpp, Note [Plan memory]); empty for a
// layout trident refuses.
std::vector<PlanTerm> stage_memory_terms(const PlanModel& model, const PlanLayout& layout,
                                         const Hardware& hw, int stage);
// Bytes per rank on the stage that holds the most (src/plan/memory.cpp, Note [Plan memory]).
std::vector<PlanTerm> memory_terms(const PlanModel& model, const PlanLayout& layout,
                                   const Hardware& hw);

}  // namespace trident
