// What the Trainer decides before it allocates the model: the stage's model options from the
// deck and the grid, and whether this rank's share of the run fits in memory.
#pragma once

#include "trident/deck.h"
#include "trident/model.h"
#include "trident/pipeline.h"
#include "trident/train.h"

namespace trident {

// This rank's GPTOptions: tensor parallelism, its pipeline stage and slots, recompute,
// precision and the loss seed. Refuses (input_error, identically on every rank) what the
// layout cannot run, before anything is allocated.
// Refuses (input_error) a context-parallel size the deck cannot run: seq_len not a multiple of
// 2·cp.
void check_context_parallel(const Deck& deck, int cp);
// Mixtures and expert parallelism against the run (Note [Mixtures in the layouts] in
// src/model/gpt_moe.cpp): input_error naming the keys of what is not built or cannot be.
void check_moe_deck(const Deck& deck, const GPTConfig& cfg, int dp_cp);
GPTOptions stage_options(const Deck& deck, const GPTConfig& cfg, const TrainContext& ctx,
                         PipeSchedule schedule, int pp_size, int pp_rank, int dp_size);

// Refuses (input_error) a model that cannot fit (Note [Memory plan]). `shard_ranks`: the dp
// ranks ZeRO shards the optimizer and gradient shards over (1: none). `stage_gradients`: the
// pipeline stage keeps its boundary gradients in backend memory (device links).
// `zero3`: with ZeRO-3 (Note [ZeRO-3 units]) the full parameter and gradient buffers count only
// as what they hold at most (zero3_pool_bytes). `snapshot`: checkpoint.async's host copy of
// what the rank saves (Note [Asynchronous checkpoints]).
struct Zero3Memory {
  bool on = false;
  size_t bucket_bytes = 0;
  bool keeps_params = false;  // reshard_after_forward false, or zero3_gather step
  bool keeps_grads = false;   // accumulation reduced once per step: the full gradient all step
};
void check_memory_plan(const GPTConfig& cfg, int B, int T, const GPTOptions& options,
                       Backend& backend, int shard_ranks, bool stage_gradients = false,
                       const Zero3Memory& zero3 = {}, bool snapshot = false);
// ZeRO-3's most resident bytes of the full parameter and gradient buffers: two neighbouring
// groups of units (the one running and the one gathered ahead); the gradient of the largest
// unit being written and two buckets waiting or on the wire (Note [Bounded gradient memory]);
// the whole buffer for what `zero3` keeps.
size_t zero3_pool_bytes(const std::vector<ParamInfo>& layout, const StageSpec& stage, bool tied,
                        const Zero3Memory& zero3);
// On a device: the unit pool's bytes (Note [Unit slots] in train/zero3_pool.h).
size_t zero3_device_pool_bytes(const std::vector<ParamInfo>& layout, const Zero3Memory& zero3);

}  // namespace trident
