// Data-parallel training equals the single-rank run with the same global batch.
// Runs under mpirun with 2 and 4 ranks (dp = world size).
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "train_harness.h"
#include "trident/grad_reducer.h"

namespace trident {
namespace {

using testing::expect_bitwise;
using testing::expect_close;
using testing::world_size;
using Result = testing::RunResult;

Deck deck(std::vector<std::string> overrides) {
  const std::string yaml = R"(
model: {layers: 2, d_model: 32, heads: 4, vocab: 256, seq_len: 16}
train: {micro_batch: 2, accum: 1, steps: 20, lr: 3.0e-3, warmup_steps: 3, seed: 7,
        val_every: 0}
data: {train: inputs/data/tiny-train.bin, shuffle: true}
run: {threads: 1}
)";
  return parse_deck(yaml, TRIDENT_SOURCE_DIR, overrides);
}

Result train(const Deck& d, ProcessGrid* grid, int steps) {
  return testing::run_steps(d, grid, steps);
}

Result train_dp(std::vector<std::string> overrides, int steps = 20) {
  ProcessGrid grid(make_layout(world_size(), 0, 1, 1));
  return train(deck(overrides), &grid, steps);
}

// The single-rank reference with the same global batch: dp micro-batches become accumulation.
Result train_reference(int micro_batch, int accum, int steps = 20) {
  const int dp = world_size();
  return train(deck({fmt::format("train.micro_batch={}", micro_batch),
                     fmt::format("train.accum={}", accum * dp)}),
               nullptr, steps);
}

// Bounds (testing::expect_close): fp32 sums in another order (across ranks instead of within
// one) and the all-reduce's own order differ from the single-rank run by rounding only; over 20
// AdamW steps that stays well under 1e-6 relative on the loss here, so 1e-5 is the stated bound
// (the issue's), 1e-4 on the gradient norm.

TEST(DataParallel, EqualsSingleRankAccumulation1) {
  expect_close(train_dp({"train.accum=1"}), train_reference(2, 1));
}

TEST(DataParallel, EqualsSingleRankAccumulation4) {
  expect_close(train_dp({"train.accum=4"}, 10), train_reference(2, 4, 10));
}

TEST(DataParallel, OverlapOnAndOffAreBitwiseIdenticalForEveryBucketing) {
  const Result ref = train_reference(2, 1, 8);
  const std::vector<std::vector<std::string>> bucketings = {
      {"comm.bucket_mb=1e6", "comm.first_bucket_mb=1e6"},     // one bucket
      {"comm.bucket_mb=1e-9", "comm.first_bucket_mb=1e-9"},   // one bucket per parameter
      {},                                                     // the default (1 MiB, then 25)
      {"comm.bucket_mb=0.01", "comm.first_bucket_mb=0.002"},  // several mixed buckets
  };
  for (const auto& b : bucketings) {
    auto on = b, off = b;
    on.push_back("comm.overlap=true");
    off.push_back("comm.overlap=false");
    const Result r_on = train_dp(on, 8), r_off = train_dp(off, 8);
    expect_bitwise(r_on, r_off);
    expect_close(r_on, ref);
  }
}

TEST(DataParallel, BucketCountsFollowTheLimits) {
  ProcessGrid grid(make_layout(world_size(), 0, 1, 1));
  auto be = make_cpu_backend(1);
  Trainer one(deck({"comm.bucket_mb=1e6", "comm.first_bucket_mb=1e6"}),
              TrainContext{be.get(), 1e9, &grid, nullptr});
  EXPECT_EQ(one.reducer()->buckets().size(), 1u);
  Trainer each(deck({"comm.bucket_mb=1e-9", "comm.first_bucket_mb=1e-9"}),
               TrainContext{be.get(), 1e9, &grid, nullptr});
  EXPECT_EQ(each.reducer()->buckets().size(), each.model().params_info().size());
}

TEST(DataParallel, LossesDoNotDependOnDpForTheSameGlobalBatch) {
  // Global batch 8 per step: dp ranks × micro_batch (8/dp) × accum 1 vs one rank × 8 × 1.
  const int dp = world_size();
  const Result a = train_dp({fmt::format("train.micro_batch={}", 8 / dp)}, 6);
  const Result ref = train(deck({"train.micro_batch=8"}), nullptr, 6);
  expect_close(a, ref);
}

// comm.grad_dtype bf16 (Note [bf16 gradient compression]): the deck key reaches the gradient
// all-reduce (the run differs from fp32's, bitwise, from the first update on; the first loss
// is before any update, so it is the same), and training stays close. Bound: bf16 keeps 8
// significant bits, a relative error up to 2^-9 per summed gradient element; AdamW divides by
// the gradient's own scale, so the updates move by about that fraction of lr, and over 10 steps
// the loss stays within 0.1% and the norm within 1% (measured: both under 1e-4 at 2 ranks).
TEST(DataParallel, Bf16GradientsAreUsedAndStayClose) {
  const Result fp32 = train_dp({"comm.grad_dtype=fp32"}, 10);
  const Result bf16 = train_dp({"comm.grad_dtype=bf16"}, 10);
  EXPECT_EQ(bf16.losses[0], fp32.losses[0]);
  EXPECT_NE(bf16.losses[2], fp32.losses[2]) << "comm.grad_dtype bf16 did not change the reduction";
  EXPECT_NE(0, std::memcmp(bf16.params.data(), fp32.params.data(), fp32.params.size() * 4));
  expect_close(bf16, fp32, /*loss_rel=*/1e-3, /*norm_rel=*/1e-2);
}

}  // namespace
}  // namespace trident
