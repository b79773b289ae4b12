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
GPTOptions stage_options(const Deck& deck, const GPTConfig& cfg, const TrainContext& ctx,
                         PipeSchedule schedule, int pp_size, int pp_rank, int dp_size);

// Refuses (input_error) a model that cannot fit (Note [Memory plan]). `shard_ranks`: the dp
// ranks ZeRO shards the optimizer and gradient shards over (1: none). `stage_gradients`: the
// pipeline stage keeps its boundary gradients in backend memory (device links).
void check_memory_plan(const GPTConfig& cfg, int B, int T, const GPTOptions& options,
                       Backend& backend, int shard_ranks, bool stage_gradients = false);

}  // namespace trident
