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
#include <filesystem>
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
  size_t gathered_f32 = 0, gathered_bf16 = 0;  // the strict gather comm's all-gather bytes
  bool full_params = true;                     // the model still holds its full parameter buffer
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
  if (dp.zero3()) {  // (the bf16 tests' reference runs are ZeRO-1's)
    o.shard.resize(dp.shard_size());
    be.copy(o.shard.data(), dp.shard_params(), o.shard.size() * sizeof(float));
  }
  o.pool_bytes = dp.pool_bytes();
  o.model_floats = t.model().num_params();
  o.full_params = t.model().params() != nullptr;
  if (comms) {
    o.gather_orders = comms->gather->orders();
    o.gathered_f32 = comms->gather->all_gather_bytes(ElemType::kFloat32);
    o.gathered_bf16 = comms->gather->all_gather_bytes(ElemType::kBfloat16);
  }
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
  // Note [ZeRO-3 and W]: W reads no slot (a weight it read would be null or another unit's).
  expect_matches_cpu(1, 1, {"parallel.schedule=zb-h1", "train.accum=2"});
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
  // zb-h1: B reads the slots as 1F1B's backward does, W none (Note [ZeRO-3 and W]); with SP
  // W gathers its kept rows over tp again.
  expect_matches_cpu(1, 2, {"parallel.schedule=zb-h1", "train.accum=2"});
  expect_matches_cpu(2, 1, {"parallel.sequence_parallel=true", "parallel.schedule=zb-h1"});
  expect_matches_cpu(1, 1, {}, /*replicas=*/2);  // HSDP 2 x 2
}

// The pool holds three block slots beside wte, wpe and the head (Note [Unit slots]),
// so with 8 blocks it is smaller than the stage's parameters; keeping every unit gathered, it is
// all of them.
TEST(Zero3Device, PoolHoldsThreeBlocksOrEverything) {
  if (world_size() != 2) GTEST_SKIP() << "dp 2 on 2 ranks";
  ProcessGrid grid(make_layout(2, 2, 1, 1));
  testing::StrictDeviceBackend strict;
  testing::StrictComms comms(strict, grid, 1, 1);
  auto pool_of = [&](std::vector<std::string> extra) {
    TrainContext ctx{&strict, 1e9, &grid, nullptr};
    comms.attach(ctx);
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
// follow). model.init_from too: its reader gives each tensor to the shards.
TEST(Zero3Device, SetupNeverHoldsTheFullParameters) {
  if (world_size() != 4) GTEST_SKIP() << "dp 4 on 4 ranks";
  ProcessGrid grid(make_layout(4, 4, 1, 1));
  auto run_setup = [&](std::vector<std::string> extra, bool bf16 = false) {
    testing::StrictDeviceBackend strict;
    testing::StrictComms comms(strict, grid, 1, 1);
    TrainContext ctx{&strict, 1e9, &grid, nullptr};
    comms.attach(ctx);
    Deck d = deck(1, 1, std::move(extra));
    if (bf16) d.run.precision = "bf16";  // past the deck's refusal of the CPU, as train_bf16
    Trainer t(d, ctx);
    EXPECT_EQ(t.model().params(), nullptr);
    return std::tuple(strict.peak_bytes(), strict.bytes_in_use(),
                      t.model().num_params() * sizeof(float));
  };
  const auto [peak, held, _] = run_setup({"model.layers=8"});
  EXPECT_EQ(peak, held) << "a buffer of " << (peak - held) << " B held at setup and given back";
  // bf16: nor with its whole bf16 copy beside it (Note [bf16 unit gathers]). (That copy alone,
  // 2 B a parameter, would not show: at dp 4 the optimizer's state that follows is as large.)
  const auto [peak16, held16, _16] = run_setup({"model.layers=8", "model.tied_head=true"}, true);
  EXPECT_EQ(peak16, held16) << "bf16: " << (peak16 - held16) << " B held at setup and given back";
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
  EXPECT_EQ(peak2, held2) << "model.init_from: a buffer of " << (peak2 - held2) << " B (" << full2
                          << " B a full model) held at setup and given back";
  MPI_Barrier(MPI_COMM_WORLD);
  if (grid.world_rank() == 0) std::remove(file.c_str());
}

// Note [No full weights on a device]: model.init_from's readers write each tensor's parts into
// the device's shards (DataParallel::shard_writer), where the host reads the file into its full
// buffer and takes the shards from it: the strict run must train as the CPU's does. An llm.c
// file (GPT-2, tied: 1e-5, Note [Tied embedding gradient]) and Hugging Face safetensors of a
// Llama (GQA, untied: bit for bit). A piece written at the wrong offset, or a bucket's shard
// taken from another rank's slice, changes the first loss.
TEST(Zero3Device, InitFromWritesTheShards) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int pid = int(getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);  // rank 0's, one name for every rank
  const std::string llmc = fmt::format("/tmp/trident-zero3-init-{}.bin", pid);
  const std::string hf = fmt::format("/tmp/trident-zero3-init-{}-hf/", pid);
  const std::vector<std::string> gpt2 = {"model.tied_head=true"};
  const std::vector<std::string> llama = {"model.family=llama", "model.kv_heads=2",
                                          "model.tied_head=false"};
  int written = 1;
  if (rank == 0) {  // an unsharded run's weights, on one rank
    try {
      testing::StrictDeviceBackend strict;
      Trainer g(deck(1, 1, gpt2), {&strict, 1e9, nullptr, nullptr});
      save_llmc_weights(g.model(), llmc);
      Trainer l(deck(1, 1, llama), {&strict, 1e9, nullptr, nullptr});
      std::filesystem::create_directories(hf);
      save_safetensors_weights(l.model(), hf + "model.safetensors", /*with_config=*/true);
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
      written = 0;
    }
  }
  MPI_Bcast(&written, 1, MPI_INT, 0, MPI_COMM_WORLD);  // every rank stops, none waits
  ASSERT_TRUE(written);
  auto with = [](std::vector<std::string> extra, const std::string& file) {
    extra.push_back("model.init_from=" + file);
    extra.push_back("train.seed=99");  // not the writer's: the weights must come from the file
    return extra;
  };
  if (world_size() == 4) {
    expect_matches_cpu(1, 1, with(llama, hf));
    expect_matches_cpu(1, 2, with(llama, hf), 1);
    expect_matches_cpu(1, 1, with(gpt2, llmc), /*replicas=*/2);
  } else {
    expect_matches_cpu(1, 1, with(llama, hf));
    expect_matches_cpu(1, 1, with(gpt2, llmc));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    std::remove(llmc.c_str());
    std::filesystem::remove_all(hf);
  }
}

// Note [bf16 unit gathers] (src/train/zero3_pool.h): bf16 ZeRO-3 on the strict device backend
// trains as bf16 ZeRO-1 does there, bit for bit: the GEMMs read bf16(master) either way (cast
// by each rank before its bf16 gather, or after ZeRO-1's fp32 gather), everything else reads
// the fp32 masters, and the gradients are reduced in fp32. No clipping (train.grad_clip 0): the
// gradient norm sums the shards of other bucket layouts in another order, 1e-6 apart, and a
// clip factor an ulp off would move every weight. A gather of unconverted or stale bf16
// weights fails at once (step 1, or 2).
Outcome train_bf16(int tp, int pp, std::vector<std::string> extra, int replicas, int zero) {
  extra.push_back("train.grad_clip=0");
  ProcessGrid grid(testing::layout_of(tp, pp, replicas));
  Deck d = deck(tp, pp, extra, replicas);
  d.run.precision = "bf16";  // past the deck's refusal of the CPU backend: the strict one runs
  d.parallel.zero = zero;
  testing::StrictDeviceBackend strict;
  testing::StrictComms comms(strict, grid, tp, replicas);
  return train(strict, d, grid, &comms);
}

void expect_bf16_matches_zero1(int tp, int pp, std::vector<std::string> extra = {},
                               int replicas = 1) {
  SCOPED_TRACE(fmt::format("bf16: dp {} ({} replicas) tp {} pp {} {}", world_size() / (tp * pp),
                           replicas, tp, pp, fmt::join(extra, " ")));
  const Outcome want = train_bf16(tp, pp, extra, replicas, 1);
  const Outcome got = train_bf16(tp, pp, extra, replicas, 3);
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(got.val, want.val);
  ASSERT_EQ(got.norms.size(), want.norms.size());
  for (size_t i = 0; i < want.norms.size(); ++i)
    EXPECT_NEAR(got.norms[i], want.norms[i], 1e-6 * want.norms[i]) << "step " << i + 1;
  for (int late : got.late) EXPECT_EQ(late, 0);
  EXPECT_GT(got.gathered_bf16, 0u) << "no unit was gathered in bf16";
  EXPECT_EQ(got.step_allocations, 0u) << "backend allocations during steps 2 on";
  EXPECT_EQ(got.step_releases, 0u) << "backend releases during steps 2 on";
  EXPECT_FALSE(got.full_params);
}

TEST(Zero3Device, Bf16EqualsZeroOneAtDp2) {
  if (world_size() != 2) GTEST_SKIP() << "dp 2 on 2 ranks";
  expect_bf16_matches_zero1(1, 1);
  expect_bf16_matches_zero1(1, 1, {"model.tied_head=true"});
  expect_bf16_matches_zero1(1, 1, {"train.accum=2", "train.recompute=full"});
  expect_bf16_matches_zero1(1, 1, {"parallel.reshard_after_forward=false"});
}

// dp 4, dp 2 x pp 2, HSDP 2 x 2, and dp 2 x tp 2 (Note [bf16 with tp] in
// src/model/gpt_bf16_tp.cpp: the units' bf16 GEMM weights are tp's shards of them).
TEST(Zero3Device, Bf16EqualsZeroOneAtFourRanks) {
  if (world_size() != 4) GTEST_SKIP() << "layouts of 4 ranks";
  expect_bf16_matches_zero1(1, 1);
  expect_bf16_matches_zero1(2, 1, {"parallel.sequence_parallel=true"});
  expect_bf16_matches_zero1(2, 1, testing::family_keys("llama"));
  expect_bf16_matches_zero1(2, 1, {"model.tied_head=true"});  // the head's cast: V/tp rows
  expect_bf16_matches_zero1(1, 2, {"parallel.schedule=1f1b", "train.accum=2"});
  expect_bf16_matches_zero1(1, 2,
                            {"parallel.schedule=1f1b", "train.accum=2", "model.tied_head=true"});
  expect_bf16_matches_zero1(1, 2, {"parallel.schedule=gpipe", "train.accum=2", "model.layers=8"});
  expect_bf16_matches_zero1(
      1, 2, {"parallel.schedule=interleaved", "parallel.virtual_stages=2", "train.accum=2"});
  expect_bf16_matches_zero1(1, 1, {}, /*replicas=*/2);  // HSDP 2 x 2
}

// The gathers' bytes, counted by the gather communicator per element type: with a bucket per
// parameter (a byte limit below every parameter: one layout at either precision), the bf16 run
// moves the GEMM weights (and the untied head) at 2 bytes and the rest as the fp32 run does, so
// its fp32 bytes plus twice its bf16 bytes are the fp32 run's, and the GEMM weights are most of
// the model. The pool is the fp32 pool's size (Note [bf16 unit gathers]).
TEST(Zero3Device, Bf16GathersHalveTheWeightBytes) {
  if (world_size() != 2) GTEST_SKIP() << "dp 2 on 2 ranks";
  const std::vector<std::string> per_param = {"comm.bucket_mb=1e-6", "comm.first_bucket_mb=1e-6"};
  ProcessGrid grid(make_layout(2, 2, 1, 1));
  testing::StrictDeviceBackend strict;
  testing::StrictComms comms(strict, grid, 1, 1);
  const Outcome fp32 = train(strict, deck(1, 1, per_param), grid, &comms);
  const Outcome bf16 = train_bf16(1, 1, per_param, 1, 3);
  EXPECT_EQ(fp32.gathered_bf16, 0u);
  EXPECT_GT(bf16.gathered_bf16, 0u);
  EXPECT_EQ(bf16.gathered_f32 + 2 * bf16.gathered_bf16, fp32.gathered_f32);
  EXPECT_LT(bf16.gathered_f32 + bf16.gathered_bf16, fp32.gathered_f32 * 6 / 10);
  EXPECT_EQ(bf16.gathers, fp32.gathers);
  EXPECT_EQ(bf16.pool_bytes, fp32.pool_bytes);
}

// Note [bf16 unit gathers]: a checkpoint holds the fp32 masters. A bf16 ZeRO-3 run saved after
// step 2 and resumed (the loaded shards' bf16 copy stale until cast) goes on bit for bit, at
// ZeRO-3 and at ZeRO-1 (which loads the masters whole). A resume that gathered the bf16 copy
// without casting the loaded shards would gather zeros.
TEST(Zero3Device, Bf16CheckpointResumesBitForBit) {
  if (world_size() != 2) GTEST_SKIP() << "dp 2 on 2 ranks";
  const std::string dir = testing::scratch_dir("zero3_bf16_device");
  ProcessGrid grid(make_layout(2, 2, 1, 1));
  auto run = [&](int zero, bool save, bool load) {
    Deck d = deck(1, 1, {"train.grad_clip=0"});
    d.run.precision = "bf16";  // as train_bf16
    d.parallel.zero = zero;
    testing::StrictDeviceBackend strict;
    testing::StrictComms comms(strict, grid, 1, 1);
    TrainContext ctx{&strict, 1e9, &grid, nullptr};
    ctx.dp_device = comms.dp.get();
    ctx.dp_gather_device = comms.gather.get();
    Trainer t(d, ctx);
    if (load) EXPECT_EQ(t.load(latest_checkpoint(dir)).step, 2);
    std::vector<double> losses;
    for (int step = load ? 2 : 0; step < d.train.steps; ++step) {
      losses.push_back(t.train_step(step).loss);
      if (save && step + 1 == 2) t.save(dir, 2, "run-bf16-zero3", 1);
    }
    return losses;
  };
  const std::vector<double> whole = run(3, true, false);
  ASSERT_EQ(whole.size(), 4u);
  const std::vector<double> tail(whole.begin() + 2, whole.end());
  EXPECT_EQ(run(3, false, true), tail);
  EXPECT_EQ(run(1, false, true), tail);
}

}  // namespace
}  // namespace trident
