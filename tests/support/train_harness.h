// Shared by the training tests: run a few steps of a deck (on a grid or on one rank) and
// compare the results.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "train/data_parallel.h"
#include "trident/grid.h"
#include "trident/train.h"

namespace trident::testing {

// One directory for all ranks (rank 0 empties it), fresh for each test: the temp directory's
// "trident_<name>".
inline std::string scratch_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("trident_" + name);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return dir.string();
}

// The small model the layout tests share (test_cp_training, test_moe_training): 4 layers for
// pp 2 (4 chunks interleaved), 16 tokens a sequence (2·cp chunks at cp 2 and 4), vocab 250,
// small buckets so that several fill; `overrides` as --set's.
inline Deck small_layout_deck(const std::vector<std::string>& overrides) {
  const std::string yaml = R"(
model: {layers: 4, d_model: 32, heads: 4, vocab: 250, seq_len: 16}
train: {micro_batch: 2, accum: 2, steps: 5, lr: 3.0e-3, warmup_steps: 2, seed: 5, val_every: 0}
data: {train: inputs/data/tiny-train.bin, shuffle: true}
comm: {bucket_mb: 0.02, first_bucket_mb: 0.005}
run: {threads: 1}
)";
  return parse_deck(yaml, TRIDENT_SOURCE_DIR, overrides);
}

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// The deck keys of a block family (model.family, model_config.h's table) for the layout tests:
// none for gpt2. neox: rotary on 25% of each head, parallel residual, exact GELU, untied head,
// biases. llama: RMSNorm, SwiGLU of width 64, grouped-query attention, no biases, untied head;
// its kv heads must split over every tp the world allows, so 2 kv heads of 4 on up to 2 ranks,
// 4 of 8 on 4 or more (two query heads per kv head either way). The decks' d_model is 32.
// The grid of world_size() ranks with these tp, pp and dp_replicate sizes (dp: the rest).
inline auto layout_of(int tp, int pp, int replicas = 1) {
  GridSizes sizes;
  sizes.world = world_size();
  sizes.tp = tp;
  sizes.pp = pp;
  sizes.dp_replicate = replicas;
  return complete_layout(sizes);
}

inline std::vector<std::string> family_keys(const std::string& family) {
  if (family == "gpt2") return {};
  if (family == "neox") return {"model.family=neox"};
  if (world_size() >= 4)
    return {"model.family=llama", "model.heads=8", "model.kv_heads=4", "model.mlp_hidden=64"};
  return {"model.family=llama", "model.heads=4", "model.kv_heads=2", "model.mlp_hidden=64"};
}

struct RunResult {
  std::vector<double> losses, norms;
  std::vector<float> params;  // this rank's, after the last step
};

// Trains `steps` steps (grid may be null: one rank, no MPI). after_step(s, trainer) runs after
// each step, e.g. to gather gradients.
// The same in a given context (its backend: a CPU one made here).
inline RunResult run_steps_in(const Deck& d, TrainContext context, int steps,
                              const std::function<void(int, Trainer&)>& after_step = {}) {
  auto be = make_cpu_backend(d.run.threads);
  context.backend = be.get();
  Trainer t(d, context);
  RunResult r;
  for (int s = 0; s < steps; ++s) {
    const StepStats st = t.train_step(s);
    r.losses.push_back(st.loss);
    r.norms.push_back(st.grad_norm);
    if (after_step) after_step(s, t);
  }
  t.sync_params();  // ZeRO: the last update's all-gather
  r.params.assign(t.model().params(), t.model().params() + t.model().num_params());
  return r;
}

inline RunResult run_steps(const Deck& d, ProcessGrid* grid, int steps,
                           const std::function<void(int, Trainer&)>& after_step = {}) {
  return run_steps_in(d, TrainContext{nullptr, 1e9, grid, nullptr}, steps, after_step);
}

// Losses within loss_rel and gradient norms within norm_rel, relative, step by step.
inline void expect_close(const RunResult& a, const RunResult& ref, double loss_rel = 1e-5,
                         double norm_rel = 1e-4) {
  ASSERT_EQ(a.losses.size(), ref.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_NEAR(a.losses[i], ref.losses[i], loss_rel * std::abs(ref.losses[i])) << "step " << i + 1;
    EXPECT_NEAR(a.norms[i], ref.norms[i], norm_rel * std::abs(ref.norms[i])) << "step " << i + 1;
  }
}

// The largest |a - ref| over final parameters, relative to the largest |ref| (the layout and
// ZeRO tests' measure of "the same weights"); the sizes must agree.
inline double max_param_error(const std::vector<float>& a, const std::vector<float>& ref) {
  EXPECT_EQ(a.size(), ref.size());
  float scale = 0;
  for (float x : ref) scale = std::max(scale, std::abs(x));
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i)
    worst = std::max(worst, double(std::abs(a[i] - ref[i])) / scale);
  return worst;
}

// Whether every rank of `group` holds rank 0's `v`, bit for bit (HSDP's replicas end with the
// same weights); the same answer on every rank of the group.
inline bool same_on_every_rank(MPI_Comm group, const std::vector<float>& v) {
  auto n = static_cast<unsigned long long>(v.size());
  MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, 0, group);
  std::vector<float> first = v;
  first.resize(n);
  MPI_Bcast(first.data(), static_cast<int>(n), MPI_FLOAT, 0, group);
  int same = n == v.size() && std::memcmp(first.data(), v.data(), v.size() * sizeof(float)) == 0;
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_LAND, group);
  return same != 0;
}

// How many of the n floats are not bf16 values (a low half not zero): a sum made in bf16 and
// widened has none, while a float32 sum of two bf16 values mostly needs more bits.
inline size_t not_bf16(const float* v, size_t n) {
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, v + i, sizeof(bits));
    count += (bits & 0xffffu) != 0;
  }
  return count;
}

// With ZeRO, how many of the last step's reduced shard gradients are not bf16 values; wte's
// left out: its sparse rows' sum is added to the shard after the reduction
// (TiedEmbedding::finish_step). 0 without ZeRO.
inline size_t shard_grads_not_bf16(Trainer& t) {
  DataParallel* dp = t.data_parallel();
  size_t count = 0;
  if (dp && dp->sharded())
    for (const OwnedPiece& o : dp->owned())
      if (t.model().params_info()[o.param].name != "wte")
        count += not_bf16(dp->shard_grads() + o.shard, o.count);
  return count;
}

inline void expect_bitwise(const RunResult& a, const RunResult& b) {
  ASSERT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.norms, b.norms);
  ASSERT_EQ(a.params.size(), b.params.size());
  ASSERT_EQ(0, std::memcmp(a.params.data(), b.params.data(), a.params.size() * 4));
}

}  // namespace trident::testing
