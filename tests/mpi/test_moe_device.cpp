// Expert parallelism on a device backend (Note [Mixtures on a device] in
// src/train/model_options.cpp): on StrictDeviceBackend, with "device" communicators for the
// gradients, the ep group and the expert-data-parallel group (StrictDeviceComm, as a GPU run
// gets NcclComms through TrainContext::device_group), the tokens' all-to-all, the counts'
// exchange and the experts' gradient reduction reach backend memory only through the ops, the
// copies and the device communicators — a host touch crashes — and the run equals the CPU
// backend's run of the same layout bit for bit, with ZeRO-3, HSDP and zb-h1 too. Runs under
// mpirun with 2 and 4 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "moe_run.h"
#include "strict_device_backend.h"
#include "strict_zero_run.h"
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

// `replicas`: parallel.dp_replicate (HSDP with ZeRO: the shard group's and the replicas' device
// communicators, StrictComms's).
void expect_device_matches_cpu(int ep, std::vector<std::string> keys, int tp = 1,
                               int replicas = 1) {
  SCOPED_TRACE(
      fmt::format("ep {} tp {} dp_replicate {} of {} ranks", ep, tp, replicas, world_size()));
  ProcessGrid grid(complete_layout({.world = world_size(), .tp = tp, .dp_replicate = replicas}));
  if (tp > 1)
    keys.insert(keys.end(), {fmt::format("parallel.tp={}", tp), "parallel.sequence_parallel=true"});
  if (replicas > 1) keys.push_back(fmt::format("parallel.dp_replicate={}", replicas));
  const Deck d = moe_deck(ep, keys);
  auto cpu = make_cpu_backend(1);
  TrainContext on_grid;
  on_grid.grid = &grid;
  const testing::MoeRun want = testing::run_moe(*cpu, d, on_grid);
  size_t made = 0;
  const testing::MoeRun got = testing::run_moe_strict(d, grid, &made);
  // The ep group and the expert-data-parallel group; with ZeRO-3 the experts' gathers' own.
  EXPECT_EQ(made, d.parallel.zero == 3 ? 3u : 2u);
  testing::expect_same_moe_run(got, want);
  if (d.parallel.zero == 3) return;  // the copies below are compared without ZeRO
  // Note [Expert counts on the host]: ep's counts are exchanged between the hosts, so a step
  // reads backend memory as often as at ep 1 (one routing summary a layer and micro-batch).
  if (tp > 1) return;  // the copies below are compared at tp 1
  size_t made_at_one = 0;
  const testing::MoeRun one = testing::run_moe_strict(moe_deck(1, keys), grid, &made_at_one);
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

// ZeRO-3 (Note [ZeRO-3 units]): each expert's unit gathered over its replicas on their own
// device communicator (TrainContext::expert_gather), into the unit slots, and the sigmoid
// router's bias step added into the shards (DataParallel::shard_adder); at ep 2 and ep = world.
TEST(MoeDevice, ZeroThreeEqualsTheCpuBitForBit) {
  for (int ep : {2, 4}) {
    if (ep > world_size()) continue;
    expect_device_matches_cpu(
        ep, {"parallel.zero=3", "model.moe.router=sigmoid", "model.moe.bias_update_rate=0.01",
             "model.moe.shared_experts=1"});
  }
}

// HSDP (Note [Experts with HSDP] in src/train/zero3.h): dp_replicate 2 × dp_shard 2, ep 2 with
// ZeRO-3. Each expert's reduce-scatter runs on its replica's expert group's device communicator
// (TrainContext::device_group), the shard's sum over the replicas on dp_replicate's, the gathers
// on the experts' own; the sigmoid router's loads still sum over dp.
TEST(MoeDevice, HsdpWithExpertsEqualsTheCpuBitForBit) {
  if (world_size() != 4) GTEST_SKIP() << "dp_replicate 2 x dp_shard 2 on 4 ranks";
  expect_device_matches_cpu(2,
                            {"parallel.zero=3", "model.moe.router=sigmoid",
                             "model.moe.bias_update_rate=0.01", "model.moe.shared_experts=1"},
                            1, 2);
}

// zb-h1 (Note [Mixtures in B]) at pp 2 beside ep = dp (1 at 2 ranks, 2 at 4): the mixtures'
// gradients in B through the device's ops and communicators, W only reporting them ready. The
// strict run equals the CPU backend's 1f1b run bit for bit, with the sigmoid router's bias step
// and with the switch loss and the z-loss.
TEST(MoeDevice, ZeroBubbleEqualsTheCpusOneFOneBBitForBit) {
  const int dp = world_size() / 2;
  ProcessGrid grid(complete_layout({.world = world_size(), .pp = 2}));
  const std::vector<std::string> routers[] = {
      {"model.moe.router=sigmoid", "model.moe.bias_update_rate=0.01", "model.moe.shared_experts=1"},
      {"model.moe.aux_loss=switch", "model.moe.aux_loss_coeff=0.01", "model.moe.z_loss=0.001"}};
  for (const std::vector<std::string>& router : routers) {
    SCOPED_TRACE(fmt::format("pp 2, ep {}, {}", dp, router[0]));
    auto with = [&](const char* schedule) {
      std::vector<std::string> keys = router;
      keys.insert(keys.end(), {"parallel.pp=2", "train.accum=4",
                               fmt::format("parallel.schedule={}", schedule)});
      return moe_deck(dp, keys);
    };
    auto cpu = make_cpu_backend(1);
    TrainContext on_grid;
    on_grid.grid = &grid;
    const testing::MoeRun want = testing::run_moe(*cpu, with("1f1b"), on_grid);
    testing::expect_same_moe_run(testing::run_moe_strict(with("zb-h1"), grid), want);
  }
}

// transformers' balance form beside pp (Note [Transformers' totals across stages]): the totals
// travel with the stages' tensors, staged through host copies or over the strict device links
// (read before the receive was waited for, a link's buffer fails the run), and the micro-batch's
// counts go into device memory before each backward. Each equals the CPU's run of the layout
// bit for bit (the same ops in the same order). 4 layers, 1f1b and interleaved, ep = world / 2.
TEST(MoeDevice, HfBalanceLossAcrossStages) {
  const int dp = world_size() / 2;
  ProcessGrid grid(complete_layout({.world = world_size(), .pp = 2}));
  for (const char* schedule : {"1f1b", "interleaved"}) {
    std::vector<std::string> keys = {"model.moe.aux_loss=hf", "model.moe.aux_loss_coeff=0.1",
                                     "model.layers=4", "parallel.pp=2",
                                     fmt::format("parallel.schedule={}", schedule)};
    if (std::string(schedule) == "interleaved") keys.push_back("parallel.virtual_stages=2");
    const Deck d = moe_deck(dp, keys);
    auto cpu = make_cpu_backend(1);
    TrainContext on_grid;
    on_grid.grid = &grid;
    const testing::MoeRun want = testing::run_moe(*cpu, d, on_grid);
    for (bool links : {false, true}) {
      SCOPED_TRACE(fmt::format("pp 2, {}, ep {}, {}", schedule, dp, links ? "links" : "staged"));
      testing::expect_same_moe_run(testing::run_moe_strict(d, grid, nullptr, links), want);
    }
  }
}

// bf16 (Note [Widening at the bf16 boundary]: the mixture runs in fp32 on the fp32 weights the
// units gather) with ZeRO-3 equals bf16 with ZeRO-1 bit for bit: the same reduce-scatters and
// AdamW on the same shards, only where the weights live between steps differs. (The host has no
// bf16 ZeRO-3, so the reference is the device's own ZeRO-1.) As in test_zero3_device_discipline:
// the gradient norm sums other bucket layouts' shards in another order, so norms within 1e-6
// and no clipping (a clip factor an ulp off would move every weight); the losses bit for bit,
// and through them the parameters.
TEST(MoeDevice, Bf16ZeroThreeEqualsZeroOne) {
  for (int ep : {2, 4}) {
    if (ep > world_size()) continue;
    SCOPED_TRACE(fmt::format("ep {} of {} ranks", ep, world_size()));
    ProcessGrid grid(complete_layout({.world = world_size()}));
    auto with_zero = [&](int zero) {
      Deck d = moe_deck(ep, {"model.moe.router=sigmoid", "model.moe.bias_update_rate=0.01",
                             "train.grad_clip=0", fmt::format("parallel.zero={}", zero)});
      d.run.precision = "bf16";  // a deck refuses it on the CPU; the strict device runs it
      return d;
    };
    size_t made = 0;
    testing::MoeRun one = testing::run_moe_strict(with_zero(1), grid, &made);
    testing::MoeRun three = testing::run_moe_strict(with_zero(3), grid, &made);
    ASSERT_EQ(three.norms.size(), one.norms.size());
    for (size_t i = 0; i < one.norms.size(); ++i)
      EXPECT_NEAR(three.norms[i], one.norms[i], 1e-6 * one.norms[i]) << "step " << i + 1;
    one.params.clear(), three.params.clear();  // the whole model against the shard
    three.norms = one.norms;
    testing::expect_same_moe_run(three, one);
  }
}

}  // namespace
}  // namespace trident
