// ZeRO-3 on a device backend (Note [Weights in unit slots] in src/train/zero3_pool.h): trained on
// StrictDeviceBackend (memory the host cannot touch) with StrictDeviceComms for dp, the gathers
// and tp, it must equal the CPU backend's ZeRO-3 run of the same layout bit for bit: the same
// ops, the same reduce-scatters and gathers, only the units' weights read from pool slots. A
// host access to a slot, a shard or a gradient on the ZeRO-3 path crashes the test; a unit read
// from a slot it no longer holds reads null or another unit's weights and fails it. Also: the
// gathers per step are the CPU's, each ordered after the compute stream, and no step after the
// first allocates or frees backend memory. Runs under mpirun with 2 and 4 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <tuple>

#include "strict_device_backend.h"
#include "strict_zero_run.h"
#include "train/data_parallel.h"
#include "train_harness.h"

namespace trident {
namespace {

using testing::world_size;

Deck deck(int tp, int pp, std::vector<std::string> extra, int replicas = 1) {
  return testing::zero_deck(3, tp, pp, std::move(extra), replicas);
}

struct Outcome {
  std::vector<double> losses, norms;
  std::vector<int> gathers, late;
  std::vector<float> shard;  // this rank's parameter shard after the last step
  double val = 0;
  size_t step_allocations = 0, step_releases = 0;  // the strict backend's, after step 1
  size_t gather_orders = 0;                        // the strict gather comm's order_after calls
  size_t pool_bytes = 0, model_floats = 0;
  bool full_params = true;  // the model still holds its full parameter buffer
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
        o.gathers.push_back(st.unit_gathers);
        o.late.push_back(st.late_unit_gathers);
      });
  o.step_allocations = m.allocations;
  o.step_releases = m.releases;
  o.val = t.validate();
  DataParallel& dp = *t.data_parallel();
  o.shard.resize(dp.shard_size());
  be.copy(o.shard.data(), dp.shard_params(), o.shard.size() * sizeof(float));
  o.pool_bytes = dp.pool_bytes();
  o.model_floats = t.model().num_params();
  o.full_params = t.model().params() != nullptr;
  if (comms) o.gather_orders = comms->gather->orders();
  return o;
}

// The layout's CPU run and strict run; bit for bit (losses, norms, validation, shards), the
// same gathers, none late, and no allocation in steps 2 on.
void expect_matches_cpu(int tp, int pp, std::vector<std::string> extra = {}, int replicas = 1) {
  const int dp = world_size() / (tp * pp);
  SCOPED_TRACE(fmt::format("dp {} ({} replicas) tp {} pp {} {}", dp, replicas, tp, pp,
                           fmt::join(extra, " ")));
  ProcessGrid grid(testing::layout_of(tp, pp, replicas));
  const Deck d = deck(tp, pp, extra, replicas);
  auto cpu = make_cpu_backend(1);
  const Outcome want = train(*cpu, d, grid, nullptr);
  testing::StrictDeviceBackend strict;
  testing::StrictComms comms(strict, grid, tp, replicas);
  const Outcome got = train(strict, d, grid, &comms);

  if (d.model.tied_head != "false") {
    // A device reduces a tied wte's gradient whole, the CPU as dense part + sparse rows
    // (Note [Tied embedding gradient]): another summation order, 1e-5 as other device layouts;
    // and in other buckets (the CPU's wte in row pieces), so the shards hold other slices.
    for (size_t i = 0; i < want.losses.size(); ++i) {
      EXPECT_NEAR(got.losses[i], want.losses[i], 1e-5 * want.losses[i]) << "step " << i + 1;
      EXPECT_NEAR(got.norms[i], want.norms[i], 1e-5 * want.norms[i]) << "step " << i + 1;
    }
    EXPECT_NEAR(got.val, want.val, 1e-5 * want.val);
  } else {
    ASSERT_EQ(got.shard.size(), want.shard.size());
    EXPECT_EQ(got.losses, want.losses);
    EXPECT_EQ(got.norms, want.norms);
    EXPECT_EQ(got.val, want.val);
    EXPECT_EQ(0, std::memcmp(got.shard.data(), want.shard.data(), got.shard.size() * 4))
        << "the parameter shards differ";
  }
  EXPECT_EQ(got.gathers, want.gathers);
  for (int late : got.late) EXPECT_EQ(late, 0);
  int gathers = 0;
  for (int g : got.gathers) gathers += g;
  EXPECT_GE(got.gather_orders, size_t(gathers)) << "a unit gather not ordered after compute";
  EXPECT_EQ(got.step_allocations, 0u) << "backend allocations during steps 2 on";
  EXPECT_EQ(got.step_releases, 0u) << "backend releases during steps 2 on";
  EXPECT_GT(got.pool_bytes, 0u);
  EXPECT_FALSE(got.full_params) << "the full parameter buffer outlived setup on the device";
  EXPECT_TRUE(want.full_params);   // the host's: address space, pages given back
  EXPECT_EQ(want.pool_bytes, 0u);  // the host keeps its pages
}

TEST(Zero3Device, EqualsTheCpuBitForBitAtDp2) {
  if (world_size() != 2) GTEST_SKIP() << "dp 2 on 2 ranks";
  expect_matches_cpu(1, 1);
  expect_matches_cpu(1, 1, {"model.tied_head=true"});
  expect_matches_cpu(1, 1, {"train.accum=2"});
  expect_matches_cpu(1, 1, {"train.recompute=full"});
  expect_matches_cpu(1, 1, {"parallel.reshard_after_forward=false"});
}

TEST(Zero3Device, EqualsTheCpuBitForBitAtFourRanks) {
  if (world_size() != 4) GTEST_SKIP() << "layouts of 4 ranks";
  expect_matches_cpu(1, 1);
  expect_matches_cpu(2, 1, {"parallel.sequence_parallel=true"});
  expect_matches_cpu(1, 2, {"parallel.schedule=1f1b", "train.accum=2"});
  // Four blocks a stage, forwards in a row: stage 0 holds three blocks (Note [Unit slots]).
  expect_matches_cpu(1, 2, {"parallel.schedule=gpipe", "train.accum=2", "model.layers=8"});
  expect_matches_cpu(
      1, 2, {"parallel.schedule=interleaved", "parallel.virtual_stages=2", "train.accum=2"});
  expect_matches_cpu(1, 1, {}, /*replicas=*/2);  // HSDP 2 x 2
}

// The pool holds three block slots beside wte, wpe and the head (Note [Unit slots]),
// so with 8 blocks it is smaller than the stage's parameters; keeping every unit gathered, it is
// all of them.
TEST(Zero3Device, PoolHoldsThreeBlocksOrEverything) {
  if (world_size() != 2) GTEST_SKIP() << "dp 2 on 2 ranks";
  ProcessGrid grid(make_layout(2, 2, 1, 1));
  testing::StrictDeviceBackend strict;
  auto dp_host = MpiComm::duplicate(grid.gradients().raw(), "dp (test)");
  auto gather_host = MpiComm::duplicate(grid.gradients().raw(), "dp gathers (test)");
  testing::StrictDeviceComm dp(strict, *dp_host), gather(strict, *gather_host);
  dp.set_asynchronous(true);
  gather.set_asynchronous(true);
  auto pool_of = [&](std::vector<std::string> extra) {
    TrainContext ctx{&strict, 1e9, &grid, nullptr, &dp};
    ctx.dp_gather_device = &gather;
    Trainer t(deck(1, 1, std::move(extra)), ctx);
    return std::pair(t.data_parallel()->pool_bytes(), t.model().num_params() * sizeof(float));
  };
  const auto [pool, model] = pool_of({"model.layers=8"});
  EXPECT_LT(pool, model * 3 / 4);
  const auto [kept, model2] = pool_of({"parallel.reshard_after_forward=false"});
  EXPECT_EQ(kept, model2);
}

// Note [No full weights on a device]: building the run never holds the full fp32 parameters
// (a model larger than one device could not start), so the most device memory it held is what
// it holds once built; a full buffer made and given back would have put the peak a whole
// model's 4 B per parameter above it (at dp 4 more than the optimizer's two quarters that
// follow). model.init_from reads whole: there the buffer is held at setup, then given back.
TEST(Zero3Device, SetupNeverHoldsTheFullParameters) {
  if (world_size() != 4) GTEST_SKIP() << "dp 4 on 4 ranks";
  ProcessGrid grid(make_layout(4, 4, 1, 1));
  auto run_setup = [&](std::vector<std::string> extra) {
    testing::StrictDeviceBackend strict;
    auto dp_host = MpiComm::duplicate(grid.gradients().raw(), "dp (test)");
    auto gather_host = MpiComm::duplicate(grid.gradients().raw(), "dp gathers (test)");
    testing::StrictDeviceComm dp(strict, *dp_host), gather(strict, *gather_host);
    dp.set_asynchronous(true);
    gather.set_asynchronous(true);
    TrainContext ctx{&strict, 1e9, &grid, nullptr, &dp};
    ctx.dp_gather_device = &gather;
    Trainer t(deck(1, 1, std::move(extra)), ctx);
    EXPECT_EQ(t.model().params(), nullptr);
    return std::tuple(strict.peak_bytes(), strict.bytes_in_use(),
                      t.model().num_params() * sizeof(float));
  };
  const auto [peak, held, full] = run_setup({"model.layers=8"});
  EXPECT_EQ(peak, held) << "a buffer of " << (peak - held) << " B held at setup and given back";
  // The llm.c file of a GPT-2 of the deck's shape, written by an unsharded run's export.
  int pid = int(getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);  // rank 0's, one name for every rank
  const std::string file = fmt::format("/tmp/trident-zero3-init-{}.bin", pid);
  if (grid.world_rank() == 0) {
    testing::StrictDeviceBackend strict;
    Trainer t(deck(1, 1, {"model.layers=8", "model.tied_head=true"}),
              {&strict, 1e9, nullptr, nullptr});
    save_llmc_weights(t.model(), file);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const auto [peak2, held2, full2] =
      run_setup({"model.layers=8", "model.tied_head=true", "model.init_from=" + file});
  EXPECT_GT(peak2, held2 + full2 / 4) << "model.init_from reads into the full buffer first";
  MPI_Barrier(MPI_COMM_WORLD);
  if (grid.world_rank() == 0) std::remove(file.c_str());
  (void)full;
}

}  // namespace
}  // namespace trident
