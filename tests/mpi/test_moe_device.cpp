// Expert parallelism on a device backend (Note [Mixtures on a device] in
// src/train/model_options.cpp): on StrictDeviceBackend, with "device" communicators for the
// gradients, the ep group and the expert-data-parallel group (StrictDeviceComm, as a GPU run
// gets NcclComms through TrainContext::device_group), the tokens' all-to-all, the counts'
// exchange and the experts' gradient reduction reach backend memory only through the ops, the
// copies and the device communicators — a host touch crashes — and the run equals the CPU
// backend's run of the same layout bit for bit. Runs under mpirun with 2 and 4 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "moe_run.h"
#include "strict_device_backend.h"
#include "train_harness.h"

namespace trident {
namespace {

using testing::world_size;

// A small Mixtral (Llama's block, 4 experts of SwiGLU width 32, top 2) at ep over dp = world.
Deck moe_deck(int ep, std::vector<std::string> keys) {
  std::vector<std::string> o = {
      "model.family=mixtral", "model.kv_heads=2",  "model.mlp_hidden=64",
      "model.moe.experts=4",  "model.moe.top_k=2", "model.moe.ffn_width=32",
      "model.layers=2",       "train.steps=4",     fmt::format("parallel.ep={}", ep)};
  o.insert(o.end(), keys.begin(), keys.end());
  return testing::small_layout_deck(o);
}

// The run on the strict backend with its device communicators (the ep and expert-dp groups'
// through TrainContext::device_group; their number into *made).
testing::MoeRun train_strict(const Deck& d, ProcessGrid& grid, size_t* made) {
  testing::StrictDeviceBackend strict;
  testing::StrictDeviceComm dp_comm(strict, grid.gradients());
  std::unique_ptr<testing::StrictDeviceComm> tp_comm;
  TrainContext ctx;
  ctx.dp_device = &dp_comm;
  if (grid.layout().tp > 1) {
    tp_comm = std::make_unique<testing::StrictDeviceComm>(strict, grid.tp());
    ctx.tp_device = tp_comm.get();
  }
  ctx.device_group = [&](MpiComm& group, const char*, bool) {
    ++*made;
    return std::unique_ptr<Communicator>(
        std::make_unique<testing::StrictDeviceComm>(strict, group));
  };
  ctx.grid = &grid;
  return testing::run_moe(strict, d, ctx);
}

void expect_device_matches_cpu(int ep, std::vector<std::string> keys, int tp = 1) {
  SCOPED_TRACE(fmt::format("ep {} tp {} of {} ranks", ep, tp, world_size()));
  ProcessGrid grid(complete_layout({.world = world_size(), .tp = tp}));
  if (tp > 1)
    keys.insert(keys.end(), {fmt::format("parallel.tp={}", tp), "parallel.sequence_parallel=true"});
  const Deck d = moe_deck(ep, keys);
  auto cpu = make_cpu_backend(1);
  TrainContext on_grid;
  on_grid.grid = &grid;
  const testing::MoeRun want = testing::run_moe(*cpu, d, on_grid);
  size_t made = 0;
  const testing::MoeRun got = train_strict(d, grid, &made);
  EXPECT_EQ(made, 2u);  // the ep group and the expert-data-parallel group
  testing::expect_same_moe_run(got, want);
  // Note [Expert counts on the host]: ep's counts are exchanged between the hosts, so a step
  // reads backend memory as often as at ep 1 (one routing summary a layer and micro-batch).
  if (tp > 1) return;  // the copies below are compared at tp 1
  size_t made_at_one = 0;
  const testing::MoeRun one = train_strict(moe_deck(1, keys), grid, &made_at_one);
  EXPECT_EQ(made_at_one, 0u);
  EXPECT_EQ(got.copies_in_last_step, one.copies_in_last_step);
}

// Mixtral's router with Megatron-Core's switch loss, the z-loss and capacity 1.0 (drops cross
// ranks: a peer's rows for an expert may be none), at ep 2 and ep = world.
TEST(MoeDevice, ExpertParallelEqualsTheCpuBitForBit) {
  for (int ep : {2, 4}) {
    if (ep > world_size()) continue;
    expect_device_matches_cpu(ep, {"model.moe.aux_loss=switch", "model.moe.aux_loss_coeff=0.01",
                                   "model.moe.z_loss=0.001", "model.moe.capacity_factor=1.0"});
  }
}

// The sigmoid router (its bias step from the loads summed over dp) with a gated shared expert
// and a dense layer beside the mixture, at ep 2.
TEST(MoeDevice, SigmoidRouterWithSharedExpertAtEpTwo) {
  expect_device_matches_cpu(
      2, {"model.moe.router=sigmoid", "model.moe.bias_update_rate=0.01", "model.moe.every=2",
          "model.moe.shared_experts=1", "model.moe.shared_gate=true"});
}

// The sigmoid router with tp 2 (sequence parallelism): each tp rank routes its own rows, so the
// bias step sums the loads over tp too, on the host's tp group (a device's cannot sum host
// numbers: Note [Mixtures on a device]). 4 ranks: dp 2 × tp 2, ep 2.
TEST(MoeDevice, SigmoidRouterWithTensorParallelism) {
  if (world_size() != 4) GTEST_SKIP() << "dp 2 x tp 2 on 4 ranks";
  expect_device_matches_cpu(
      2, {"model.moe.router=sigmoid", "model.moe.bias_update_rate=0.01", "model.moe.every=2"}, 2);
}

}  // namespace
}  // namespace trident
