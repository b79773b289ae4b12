// ZeRO-2 and ZeRO-3 gradients on a device (Note [Gradients in unit slots] in
// src/train/grad_pool.h): trained on StrictDeviceBackend with StrictDeviceComms, backward writes
// into a pool of slots (wte, wpe and the head their own, two for the blocks) and each unit's
// buckets are reduce-scattered from there; the run must equal the CPU backend's run of the same
// deck bit for bit (the same buckets: they break at units on both), hold the pool and not the
// flat gradient buffer, and allocate nothing after the first step. A slot reused without being
// zeroed, or written before its last block's reduce-scatter took it, changes the gradients and
// fails the equality. Runs under mpirun with 2 and 4 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <string>

#include "strict_device_backend.h"
#include "strict_zero_run.h"
#include "train/data_parallel.h"
#include "train_harness.h"

namespace trident {
namespace {

using testing::world_size;

Deck deck(int zero, int tp, int pp, std::vector<std::string> extra, int replicas = 1) {
  return testing::zero_deck(zero, tp, pp, std::move(extra), replicas);
}

struct Outcome {
  std::vector<double> losses, norms, held_wait_ms;
  std::vector<float> weights;  // ZeRO-3: this rank's parameter shard; else the full parameters
  double val = 0;
  size_t step_allocations = 0, step_releases = 0;  // the strict backend's, after step 1
  bool pooled = false, grad_buffer = true;         // the model still has its gradient buffer
  size_t grad_bytes = 0, grad_pool_bytes = 0, model_floats = 0, shard_floats = 0;
};

Outcome train(Backend& be, const Deck& d, ProcessGrid& grid, testing::StrictComms* comms) {
  TrainContext ctx{&be, 1e9, &grid, nullptr};
  if (comms) comms->attach(ctx);
  Trainer t(d, ctx);
  Outcome o;
  const testing::StepMemory m =
      testing::run_steps_counted(t, be, d.train.steps, [&](const StepStats& st) {
        o.losses.push_back(st.loss);
        o.norms.push_back(st.grad_norm);
        o.held_wait_ms.push_back(st.held_wait_ms);
      });
  o.step_allocations = m.allocations;
  o.step_releases = m.releases;
  o.val = t.validate();
  DataParallel& dp = *t.data_parallel();
  const bool zero3 = dp.zero3();
  if (!zero3) t.sync_params();  // the last update's gathers
  o.weights.resize(zero3 ? dp.shard_size() : t.model().num_params());
  be.copy(o.weights.data(), zero3 ? dp.shard_params() : t.model().params(),
          o.weights.size() * sizeof(float));
  o.pooled = dp.pools_grads();
  o.grad_buffer = t.model().grads() != nullptr;
  o.grad_bytes = t.memory_bytes().grads;
  o.grad_pool_bytes = dp.grad_pool_bytes();
  o.model_floats = t.model().num_params();
  o.shard_floats = dp.shard_size();
  return o;
}

// `gbps` > 0: the reduce-scatters' link is emulated at that speed.
Outcome train_strict(const Deck& d, ProcessGrid& grid, int tp, int replicas,
                     testing::StrictDeviceBackend& strict, double gbps = 0) {
  testing::StrictComms comms(strict, grid, tp, replicas, gbps, d.comm.grad_dtype == "bf16");
  return train(strict, d, grid, &comms);
}

// The layout's CPU run and strict run: bit for bit (losses, norms, validation, weights); the
// device holds the pool (`pooled`) or the whole buffer, and allocates nothing in steps 2 on.
void expect_matches_cpu(int zero, int tp, int pp, std::vector<std::string> extra = {},
                        int replicas = 1, bool pooled = true) {
  const int dp = world_size() / (tp * pp);
  SCOPED_TRACE(fmt::format("zero {} dp {} ({} replicas) tp {} pp {} {}", zero, dp, replicas, tp, pp,
                           fmt::join(extra, " ")));
  ProcessGrid grid(testing::layout_of(tp, pp, replicas));
  const Deck d = deck(zero, tp, pp, extra, replicas);
  auto cpu = make_cpu_backend(1);
  const Outcome want = train(*cpu, d, grid, nullptr);
  testing::StrictDeviceBackend strict;
  const Outcome got = train_strict(d, grid, tp, replicas, strict);

  ASSERT_EQ(got.weights.size(), want.weights.size());
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(got.norms, want.norms);
  EXPECT_EQ(got.val, want.val);
  EXPECT_EQ(0, std::memcmp(got.weights.data(), want.weights.data(), got.weights.size() * 4))
      << "the weights differ";
  EXPECT_EQ(got.step_allocations, 0u) << "backend allocations during steps 2 on";
  EXPECT_EQ(got.step_releases, 0u) << "backend releases during steps 2 on";
  EXPECT_FALSE(want.pooled);  // the host keeps its buffer (and gives its pages back)
  EXPECT_EQ(got.pooled, pooled);
  EXPECT_EQ(got.grad_buffer, !pooled);
  if (!pooled) return;
  EXPECT_GT(got.grad_pool_bytes, 0u);
  EXPECT_EQ(got.grad_bytes, got.grad_pool_bytes + got.shard_floats * sizeof(float));
}

TEST(ZeroDeviceGradPool, Zero2EqualsTheCpuBitForBitAtDp2) {
  if (world_size() != 2) GTEST_SKIP() << "dp 2 on 2 ranks";
  expect_matches_cpu(2, 1, 1);
  expect_matches_cpu(2, 1, 1, {"train.recompute=full"});
  expect_matches_cpu(2, 1, 1, {"model.layers=8", "comm.bucket_mb=0.005"});
  // Accumulated over micro-batches (zero_reduce step) the buffer stays whole
  // (Note [When gradients are pooled]), and without overlap too.
  expect_matches_cpu(2, 1, 1, {"train.accum=2"}, 1, /*pooled=*/false);
  expect_matches_cpu(2, 1, 1, {"comm.overlap=false"}, 1, /*pooled=*/false);
}

// run.precision bf16 (the strict backend runs it; the CPU refuses it): the pool (overlap on)
// trains bit for bit as the whole buffer does (overlap off: the same buckets, the same sums), at
// ZeRO-2 and ZeRO-3, tied and untied. The bf16 backward writes every gradient at its home's base,
// as the fp32 one does, so a gradient written to the flat buffer fails it (null there).
void expect_bf16_pool_matches_buffer(int zero, std::vector<std::string> extra) {
  SCOPED_TRACE(fmt::format("bf16 zero {} {}", zero, fmt::join(extra, " ")));
  ProcessGrid grid(testing::layout_of(1, 1, 1));
  auto run = [&](bool overlap) {
    std::vector<std::string> e = extra;
    e.push_back(fmt::format("comm.overlap={}", overlap));
    Deck d = deck(zero, 1, 1, e);
    d.run.precision = "bf16";  // past the deck's refusal of the CPU backend
    testing::StrictDeviceBackend strict;
    return train_strict(d, grid, 1, 1, strict);
  };
  const Outcome pooled = run(true), whole = run(false);
  EXPECT_TRUE(pooled.pooled);
  EXPECT_FALSE(pooled.grad_buffer);
  EXPECT_FALSE(whole.pooled);
  ASSERT_EQ(pooled.weights.size(), whole.weights.size());
  EXPECT_EQ(pooled.losses, whole.losses);
  EXPECT_EQ(pooled.norms, whole.norms);
  EXPECT_EQ(pooled.val, whole.val);
  EXPECT_EQ(0, std::memcmp(pooled.weights.data(), whole.weights.data(), pooled.weights.size() * 4))
      << "the weights differ";
  EXPECT_EQ(pooled.step_allocations, 0u);
}

TEST(ZeroDeviceGradPool, Bf16PoolEqualsTheWholeBuffer) {
  if (world_size() != 2) GTEST_SKIP() << "dp 2 on 2 ranks";
  expect_bf16_pool_matches_buffer(2, {});
  expect_bf16_pool_matches_buffer(2, {"model.tied_head=true"});
  expect_bf16_pool_matches_buffer(3, {});
  expect_bf16_pool_matches_buffer(3, {"model.tied_head=true", "model.layers=8"});
}

TEST(ZeroDeviceGradPool, Zero3EqualsTheCpuBitForBitAtDp2) {
  if (world_size() != 2) GTEST_SKIP() << "dp 2 on 2 ranks";
  expect_matches_cpu(3, 1, 1);
  expect_matches_cpu(3, 1, 1, {"model.layers=8", "parallel.reshard_after_forward=false"});
}

TEST(ZeroDeviceGradPool, EqualsTheCpuBitForBitAtFourRanks) {
  if (world_size() != 4) GTEST_SKIP() << "layouts of 4 ranks";
  expect_matches_cpu(2, 1, 1);
  expect_matches_cpu(2, 2, 1, {"parallel.sequence_parallel=true"});
  expect_matches_cpu(2, 2, 1, {"parallel.sequence_parallel=false"});
  expect_matches_cpu(2, 1, 2, {"parallel.schedule=1f1b"});
  expect_matches_cpu(2, 1, 1, {}, /*replicas=*/2);  // HSDP 2 x 2: the first hop frees a slot
  expect_matches_cpu(3, 1, 1);
  expect_matches_cpu(3, 2, 1, {"parallel.sequence_parallel=true"});
  expect_matches_cpu(3, 1, 2, {"parallel.schedule=1f1b"});
  expect_matches_cpu(3, 1, 1, {}, /*replicas=*/2);
}

// Note [Shard sums on a device]: with zero_reduce micro_batch every micro-batch's backward is a
// round that writes into the pool, and a later round's buckets get the shard's sum so far added
// on the compute stream before their reduce-scatter: the host's adds, so the CPU's bits, with
// the pool (not the whole buffer) whatever accum is. An add skipped loses the earlier
// micro-batches' gradients; own slots not zeroed between rounds count them twice.
TEST(ZeroDeviceGradPool, MicroBatchRoundsEqualTheCpuBitForBit) {
  const std::vector<std::string> rounds = {"train.accum=3", "parallel.zero_reduce=micro_batch"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), rounds.begin(), rounds.end());
    return extra;
  };
  if (world_size() == 2) {
    expect_matches_cpu(2, 1, 1, with({}));
    expect_matches_cpu(2, 1, 1, with({"train.recompute=full", "model.layers=8"}));
    expect_matches_cpu(3, 1, 1, with({}));
    expect_matches_cpu(3, 1, 1, with({"parallel.reshard_after_forward=false"}));
    return;
  }
  if (world_size() != 4) GTEST_SKIP() << "dp 2 on 2 ranks, or layouts of 4";
  expect_matches_cpu(2, 1, 1, with({}));
  expect_matches_cpu(2, 2, 1, with({"parallel.sequence_parallel=true"}));
  expect_matches_cpu(3, 1, 2, with({"parallel.schedule=1f1b"}));
  expect_matches_cpu(2, 1, 1, with({}), /*replicas=*/2);  // HSDP: the replicas in the last round
  expect_matches_cpu(3, 1, 1, with({}), /*replicas=*/2);
}

// Note [HSDP with bf16 gradients] on a device: comm.grad_dtype bf16 at 2 replicas × 2 shards,
// both hops' device communicators summing in bf16 (as NcclComm's grad_bf16): the CPU's bits at
// ZeRO-1 (no pool), 2 and 3, a round a step and a round a micro-batch (the replicas' sum in the
// last). A hop left in float32 on the device differs from the CPU's bf16 one.
TEST(ZeroDeviceGradPool, HsdpBf16GradientsEqualTheCpuBitForBit) {
  if (world_size() != 4) GTEST_SKIP() << "dp_replicate 2 x dp_shard 2 on 4 ranks";
  const std::string bf16 = "comm.grad_dtype=bf16";
  const std::vector<std::string> rounds = {bf16, "train.accum=3",
                                           "parallel.zero_reduce=micro_batch"};
  expect_matches_cpu(1, 1, 1, {bf16}, /*replicas=*/2, /*pooled=*/false);
  expect_matches_cpu(2, 1, 1, {bf16}, 2);
  expect_matches_cpu(3, 1, 1, {bf16}, 2);
  expect_matches_cpu(2, 1, 1, rounds, 2);
  expect_matches_cpu(3, 1, 1, rounds, 2);
}

// A tied wte: the CPU reduces it as a dense part and sparse rows in row pieces, the device whole
// (Note [Tied embedding gradient]): another summation order, so close, not equal.
TEST(ZeroDeviceGradPool, TiedEmbeddingIsClose) {
  if (world_size() != 2) GTEST_SKIP() << "dp 2 on 2 ranks";
  ProcessGrid grid(testing::layout_of(1, 1));
  for (int zero : {2, 3}) {
    SCOPED_TRACE(fmt::format("zero {}", zero));
    const Deck d = deck(zero, 1, 1, {"model.tied_head=true"});
    auto cpu = make_cpu_backend(1);
    const Outcome want = train(*cpu, d, grid, nullptr);
    testing::StrictDeviceBackend strict;
    const Outcome got = train_strict(d, grid, 1, 1, strict);
    EXPECT_TRUE(got.pooled);
    for (size_t i = 0; i < want.losses.size(); ++i) {
      EXPECT_NEAR(got.losses[i], want.losses[i], 1e-5 * want.losses[i]) << "step " << i + 1;
      EXPECT_NEAR(got.norms[i], want.norms[i], 1e-5 * want.norms[i]) << "step " << i + 1;
    }
  }
}

// The pool is what a device holds: wte, wpe, the head and two blocks of 8, well below the flat
// buffer, which the model never allocated (and the memory report says so).
TEST(ZeroDeviceGradPool, HoldsThePoolNotTheBuffer) {
  if (world_size() != 2) GTEST_SKIP() << "dp 2 on 2 ranks";
  ProcessGrid grid(testing::layout_of(1, 1));
  for (int zero : {2, 3}) {
    SCOPED_TRACE(fmt::format("zero {}", zero));
    testing::StrictDeviceBackend strict;
    const Outcome o =
        train_strict(deck(zero, 1, 1, {"model.layers=8", "train.steps=1"}), grid, 1, 1, strict);
    EXPECT_TRUE(o.pooled);
    EXPECT_FALSE(o.grad_buffer);
    EXPECT_LT(o.grad_pool_bytes, o.model_floats * sizeof(float) * 2 / 3);
    EXPECT_LT(o.grad_bytes, (o.model_floats + o.shard_floats) * sizeof(float));
  }
}

// The memory plan counts the pool, not the buffer (Note [Memory plan]): told that one byte is
// free, the device refuses each run before allocating, and its message's gradient figure is the
// pool and the shard with accum 1, the whole buffer and the shard with accum 2 (which keeps it).
// 8 blocks of 3.1 M floats at d_model 512: the buffer 0.10 GiB, two blocks 0.02.
TEST(ZeroDeviceGradPool, MemoryPlanCountsThePool) {
  if (world_size() != 2) GTEST_SKIP() << "dp 2 on 2 ranks";
  ProcessGrid grid(testing::layout_of(1, 1));
  auto planned_grad_gib = [&](int zero, int accum) {
    testing::StrictDeviceBackend strict;
    strict.set_free_memory_bytes(1);
    testing::StrictComms comms(strict, grid, 1, 1);
    TrainContext ctx{&strict, 1e9, &grid, nullptr};
    comms.attach(ctx);
    const Deck d = deck(zero, 1, 1,
                        {"model.layers=8", "model.d_model=512", "model.heads=8",
                         fmt::format("train.accum={}", accum), "train.micro_batch=1"});
    try {
      Trainer t(d, ctx);
    } catch (const Error& e) {
      const std::string what = e.what();
      const size_t at = what.find("gradients ");
      EXPECT_NE(at, std::string::npos) << what;
      return at == std::string::npos ? -1.0 : std::stod(what.substr(at + 10));
    }
    ADD_FAILURE() << "one free byte was enough";
    return -1.0;
  };
  for (int zero : {2, 3}) {
    SCOPED_TRACE(fmt::format("zero {}", zero));
    const double pooled = planned_grad_gib(zero, 1), whole = planned_grad_gib(zero, 2);
    EXPECT_NEAR(pooled, 0.07, 0.011);  // two blocks and the shard (half the model)
    EXPECT_NEAR(whole, 0.15, 0.011);   // the buffer and the shard
  }
}

// The pool is the bound (Note [Bounded gradient memory] on the host): on a link far slower than
// backward (8 blocks of 51 KB at 0.02 Gbit/s, 20 ms each, against well under 1 ms of backward
// each), taking a block slot waits for the reduce-scatter two blocks back, and the step says so;
// the bits are the CPU's all the same.
TEST(ZeroDeviceGradPool, SlowLinkMakesBackwardWaitForASlot) {
  if (world_size() != 2) GTEST_SKIP() << "dp 2 on 2 ranks";
  ProcessGrid grid(testing::layout_of(1, 1));
  const Deck d = deck(2, 1, 1, {"model.layers=8", "train.steps=2"});
  auto cpu = make_cpu_backend(1);
  const Outcome want = train(*cpu, d, grid, nullptr);
  testing::StrictDeviceBackend strict;
  const Outcome got = train_strict(d, grid, 1, 1, strict, /*gbps=*/0.02);
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(got.norms, want.norms);
  EXPECT_EQ(0, std::memcmp(got.weights.data(), want.weights.data(), got.weights.size() * 4));
  for (size_t i = 0; i < got.held_wait_ms.size(); ++i)
    EXPECT_GT(got.held_wait_ms[i], 20.0) << "step " << i + 1;
}

}  // namespace
}  // namespace trident
