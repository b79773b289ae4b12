// ZeRO-3 and HSDP in the plan model (Note [Plan ZeRO-3] in src/plan/memory.cpp, and
// Note [Plan model]): memory per rank and traffic against hand-computed figures for a small
// model, the HSDP terms, and the search proposing ZeRO-3 where ZeRO-2 does not fit.
#include <gtest/gtest.h>

#include <algorithm>

#include "plan/plan_parts.h"
#include "plan_test_util.h"
#include "trident/check.h"

namespace trident {
namespace {

// Round figures (testing::round_machine) with links of 100 GB/s inside a node of `per_node`.
Hardware round_machine(const std::string& dtype, int per_node = 8) {
  return testing::round_machine(dtype, per_node, 100);
}

// GPT-2's block, 8 layers of C = 64, vocabulary 128 (tied head), 16 positions, 64 KiB buckets.
// Per block 12·C² + 9·C (biases) + 4·C (two LayerNorms) = 49,152 + 576 + 256 = 49,984; wte
// 128·64 = 8,192; wpe 16·64 = 1,024; the final LayerNorm 128. Ψ = 8,192 + 1,024 + 8·49,984 + 128
// = 409,216; the largest unit U is a block, 49,984.
PlanModel small_model() {
  PlanModel m;
  m.layers = 8, m.d_model = 64, m.heads = 2, m.vocab = 128, m.seq_len = 16;
  m.bucket_mb = 1.0 / 16;  // 65,536 B: two buckets 131,072 B
  return m;
}
constexpr double kPsi = 409216, kUnit = 49984, kTwoBuckets = 131072;

PlanLayout data_parallel(int dp, int zero) {
  PlanLayout l;
  l.dp = dp, l.zero = zero;
  return l;
}

using testing::term;

TEST(PlanZero3, UnitsAreWteWpeBlocksAndTheHead) {
  const std::vector<double> units = stage_units(small_model(), PlanLayout{}, 0);
  ASSERT_EQ(units.size(), 11u);
  EXPECT_EQ(units.front(), 8192);  // wte (the tied head reads it)
  EXPECT_EQ(units[1], 1024);       // wpe
  EXPECT_EQ(units[2], kUnit);
  EXPECT_EQ(units.back(), 128);  // the final LayerNorm
  EXPECT_DOUBLE_EQ(stage_params(small_model(), PlanLayout{}, 0), kPsi);
}

// bf16 on a GPU, dp = 8 (Ψ/8 = 51,152): per parameter 2 B bf16 weights, 4 B fp32 gradients,
// 12 B master + m + v.
TEST(PlanZero3, MemoryPerRankAgainstZeroZeroOneTwoByHand) {
  const PlanModel m = small_model();
  // The host's figures (its pages come and go); a GPU's pools: DeviceHoldsItsPoolsByHand.
  Hardware hw = round_machine("bf16");
  hw.kind = "cpu";
  struct Row {
    int zero;
    double params, grads, optimizer;
  };
  const double shard = kPsi / 8;  // 51,152
  const Row rows[] = {
      {0, 2 * kPsi, 4 * kPsi, 12 * kPsi},  // 18Ψ = 7,365,888
      {1, 2 * kPsi, 4 * kPsi + 4 * shard, 12 * shard},
      {2, 2 * kPsi, 4 * shard + kTwoBuckets, 12 * shard},
      // ZeRO-3: two blocks gathered and the tied wte kept beside them (2·(2U + 8,192)), the
      // shard's gradient + two buckets + the unit being written (4·U); 16Ψ/8 + 2·(2U + 8,192)
      // + 131,072 + 4U = 818,432 + 216,320 + 331,008 = 1,365,760.
      {3, 2 * (2 * kUnit + 8192), 4 * shard + kTwoBuckets + 4 * kUnit, 12 * shard},
  };
  const double expected_totals[] = {7365888, 818432 + 1841472 + 613824, 818432 + 335680 + 613824,
                                    1365760};
  for (const Row& r : rows) {
    const ModelStates st = model_state_bytes(m, data_parallel(8, r.zero), hw, 0);
    EXPECT_DOUBLE_EQ(st.params, r.params) << "zero " << r.zero;
    EXPECT_DOUBLE_EQ(st.grads, r.grads) << "zero " << r.zero;
    EXPECT_DOUBLE_EQ(st.optimizer, r.optimizer) << "zero " << r.zero;
    EXPECT_DOUBLE_EQ(st.params + st.grads + st.optimizer, expected_totals[r.zero])
        << "zero " << r.zero;
    // The same figures are predict()'s memory terms.
    const Prediction p = predict(m, data_parallel(8, r.zero), hw);
    ASSERT_TRUE(p.fits) << p.why_not;
    EXPECT_DOUBLE_EQ(term(p.memory, "params"), r.params);
    EXPECT_DOUBLE_EQ(term(p.memory, "grads"), r.grads);
  }
  // Units kept from forward to backward: ZeRO-2's parameter memory, the whole stage in bf16.
  PlanLayout kept = data_parallel(8, 3);
  kept.reshard_after_forward = false;
  EXPECT_DOUBLE_EQ(model_state_bytes(m, kept, hw, 0).params, 2 * kPsi);
  // Gathered once per step under accumulation: kept too; per micro-batch: two blocks and wte.
  PlanLayout step = data_parallel(8, 3);
  step.accum = 4, step.zero3_gather = "step";
  EXPECT_DOUBLE_EQ(model_state_bytes(m, step, hw, 0).params, 2 * kPsi);
  step.zero3_gather = "micro_batch";
  EXPECT_DOUBLE_EQ(model_state_bytes(m, step, hw, 0).params, 2 * (2 * kUnit + 8192));
  // fp32: the parameter is its own master, so the shard's 4 B are parameters, 8 B optimizer.
  Hardware f32 = round_machine("fp32");
  f32.kind = "cpu";
  const ModelStates f = model_state_bytes(m, data_parallel(8, 3), f32, 0);
  EXPECT_DOUBLE_EQ(f.params, 4 * shard + 4 * (2 * kUnit + 8192));
  EXPECT_DOUBLE_EQ(f.optimizer, 8 * shard);
  EXPECT_DOUBLE_EQ(f.params + f.grads + f.optimizer,
                   16 * shard + 4 * (2 * kUnit + 8192) + kTwoBuckets + 4 * kUnit);
}

// A GPU's ZeRO-2/3 as the trainer allocates there (Note [Plan ZeRO-3 on a device]), bf16, dp 8
// (Ψ/8 = 51,152). Own slots: wte 8,192 + wpe 1,024 + the head's 128 = 9,344. The gradient pool
// (accum 1, overlap on): the own slots and two blocks, 4 B each: 4·(9,344 + 2U) = 437,248. The
// unit slots: the own and three blocks at 4 B (bf16 lands in their first half): 4·(9,344 + 3U)
// = 637,184, beside the shard's bf16 copy (2·51,152) and the tied head's cast (2·8,192).
TEST(PlanZero3, DeviceHoldsItsPoolsByHand) {
  const PlanModel m = small_model();
  const Hardware hw = round_machine("bf16");
  const double shard = kPsi / 8, own = 8192 + 1024 + 128;
  const ModelStates z2 = model_state_bytes(m, data_parallel(8, 2), hw, 0);
  EXPECT_DOUBLE_EQ(z2.grads, 4 * shard + 4 * (own + 2 * kUnit));  // 641,856
  const ModelStates z3 = model_state_bytes(m, data_parallel(8, 3), hw, 0);
  EXPECT_DOUBLE_EQ(z3.params, 2 * shard + 2 * 8192 + 4 * (own + 3 * kUnit));  // 755,872
  EXPECT_DOUBLE_EQ(z3.grads, 4 * shard + 4 * (own + 2 * kUnit));
  EXPECT_DOUBLE_EQ(z3.optimizer, 12 * shard);
  // Accumulating over micro-batches (zero_reduce step) keeps the gradient buffer whole; a
  // round per micro-batch (Note [Plan reductions per micro-batch]) keeps the pool.
  for (int zero : {2, 3}) {
    PlanLayout accum = data_parallel(8, zero);
    accum.accum = 4;
    EXPECT_DOUBLE_EQ(model_state_bytes(m, accum, hw, 0).grads, 4 * shard + 4 * kPsi) << zero;
    accum.zero_reduce = "micro_batch";
    EXPECT_DOUBLE_EQ(model_state_bytes(m, accum, hw, 0).grads, 4 * shard + 4 * (own + 2 * kUnit))
        << zero;
  }
  // fp32: the shard is the parameter itself; no bf16 copy, no cast.
  const ModelStates f = model_state_bytes(m, data_parallel(8, 3), round_machine("fp32"), 0);
  EXPECT_DOUBLE_EQ(f.params, 4 * shard + 4 * (own + 3 * kUnit));
}

// Note [Plan reductions per micro-batch]: without overlap a round per micro-batch sends the
// reduce-scatter accum times (fp32, dp 4 at 100 GB/s: (3/4)·4Ψ / 100e9 s a pass), and the
// trainer's refusals are the plan's: not with zero 1, interleaving or zb-h1, and not without
// overlap on a GPU; HSDP's replicas all-reduce the shard once, in the last round. On a host, step
// holds the whole gradient buffer over the micro-batches, micro_batch two buckets and the unit
// being written (ZeRO-2: two buckets).
TEST(PlanZero3, RoundsPerMicroBatchSendAccumTimes) {
  PlanModel m = small_model();
  m.overlap = false;
  Hardware hw = round_machine("fp32");
  hw.kind = "cpu";
  const double pass = 0.75 * 4 * kPsi / 100e9;
  for (int zero : {2, 3}) {
    PlanLayout l = data_parallel(4, zero);
    l.accum = 3;
    const Prediction step = predict(m, l, hw);
    ASSERT_TRUE(step.fits) << step.why_not;
    EXPECT_NEAR(step.term("reduce_scatter_exposed"), pass, 1e-15) << zero;
    EXPECT_DOUBLE_EQ(model_state_bytes(m, l, hw, 0).grads, 4 * kPsi / 4 + 4 * kPsi) << zero;
    l.zero_reduce = "micro_batch";
    const Prediction rounds = predict(m, l, hw);
    ASSERT_TRUE(rounds.fits) << rounds.why_not;
    EXPECT_NEAR(rounds.term("reduce_scatter_exposed"), 3 * pass, 1e-15) << zero;
    EXPECT_LE(model_state_bytes(m, l, hw, 0).grads, 4 * kPsi / 4 + kTwoBuckets + 4 * kUnit) << zero;
  }
  PlanLayout bad = data_parallel(4, 1);
  bad.accum = 3, bad.zero_reduce = "micro_batch";
  EXPECT_NE(predict(m, bad, hw).why_not.find("zero_reduce=micro_batch needs zero 2 or 3"),
            std::string::npos);
  // HSDP: the replicas' all-reduce of the shard once a step, in the last round.
  PlanLayout hsdp = data_parallel(4, 3);
  hsdp.accum = 3, hsdp.zero_reduce = "micro_batch", hsdp.dp_shard = 2;
  const Prediction h = predict(m, hsdp, hw);
  ASSERT_TRUE(h.fits) << h.why_not;
  EXPECT_NEAR(h.term("reduce_scatter_exposed"), 3 * 0.5 * 4 * kPsi / 100e9, 1e-15);
  EXPECT_GT(h.term("hsdp_allreduce_exposed"), 0);
  hsdp.zero_reduce = "step";
  EXPECT_NEAR(predict(m, hsdp, hw).term("hsdp_allreduce_exposed"), h.term("hsdp_allreduce_exposed"),
              1e-15);
  hw.kind = "gpu";
  bad = data_parallel(4, 2);
  bad.accum = 3, bad.zero_reduce = "micro_batch";
  EXPECT_NE(predict(m, bad, hw).why_not.find("needs comm.overlap"), std::string::npos);
}

// Note [Plan ZeRO-3 on a device]: fewer than three blocks on a stage take a slot each; wte, wpe
// and the head keep theirs. Two stages of 4 blocks and one of 2 (pp 4 over 8 layers: 2 each).
TEST(PlanZero3, DeviceSlotsAreTheEndsAndThreeBlocks) {
  const PlanModel m = small_model();
  EXPECT_DOUBLE_EQ(zero3_pool(m, data_parallel(4, 3), 0).device_params,
                   8192 + 1024 + 128 + 3 * kUnit);
  PlanLayout pp = data_parallel(2, 3);
  pp.pp = 4;
  EXPECT_DOUBLE_EQ(zero3_pool(m, pp, 0).device_params, 8192 + 1024 + 2 * kUnit);
  EXPECT_DOUBLE_EQ(zero3_pool(m, pp, 1).device_params, 2 * kUnit);
  // The last stage's head reads the tied wte through a copy of its own.
  EXPECT_DOUBLE_EQ(zero3_pool(m, pp, 3).device_params, 2 * kUnit + 128 + 8192);
}

// Without overlap every collective is exposed. fp32 (4 B gathers and gradients), dp = 4 in a
// node at 100 GB/s: one pass over Ψ on a ring of 4 costs (3/4)·4Ψ / 100e9 s.
TEST(PlanZero3, TrafficIsThreePsiAgainstTwoPsi) {
  PlanModel m = small_model();
  m.overlap = false;
  const Hardware hw = round_machine("fp32");
  const double pass = 0.75 * 4 * kPsi / 100e9;
  const Prediction ddp = predict(m, data_parallel(4, 0), hw);
  ASSERT_TRUE(ddp.fits) << ddp.why_not;
  EXPECT_NEAR(ddp.term("dp_allreduce_exposed"), 2 * pass, 1e-15);  // all-reduce: 2Ψ
  const Prediction z3 = predict(m, data_parallel(4, 3), hw);
  ASSERT_TRUE(z3.fits) << z3.why_not;
  EXPECT_NEAR(z3.term("all_gather_exposed"), 2 * pass, 1e-15);  // forward + backward
  EXPECT_NEAR(z3.term("reduce_scatter_exposed"), pass, 1e-15);
  EXPECT_EQ(z3.term("all_gathers_per_step"), 2);
  EXPECT_NEAR(z3.term("dp_all_gather_s") + z3.term("dp_reduce_s"), 3 * pass, 1e-15);
  EXPECT_EQ(z3.term("hsdp_allreduce_exposed"), 0);
  // reshard_after_forward false: no backward gathers, 2Ψ.
  PlanLayout kept = data_parallel(4, 3);
  kept.reshard_after_forward = false;
  EXPECT_NEAR(predict(m, kept, hw).term("all_gather_exposed"), pass, 1e-15);
  // Four micro-batches: per micro-batch 2·m·Ψ + Ψ; once per step Ψ + Ψ.
  PlanLayout accum = data_parallel(4, 3);
  accum.accum = 4;
  const Prediction per_micro = predict(m, accum, hw);
  EXPECT_NEAR(per_micro.term("all_gather_exposed"), 8 * pass, 1e-15);
  EXPECT_NEAR(per_micro.term("reduce_scatter_exposed"), pass, 1e-15);
  accum.zero3_gather = "step";
  EXPECT_NEAR(predict(m, accum, hw).term("all_gather_exposed"), pass, 1e-15);
  // The optimizer runs over the shard, as ZeRO-1/2's does.
  EXPECT_NEAR(z3.term("optimizer"), predict(m, data_parallel(4, 2), hw).term("optimizer"), 1e-15);
}

// Note [ZeRO-3 and W] (src/train/zero3.h): zb-h1's W gathers nothing, so its gathers are 1F1B's
// in both modes (per micro-batch 2·m, once per step 1: the figures above); and a split
// backward pools no gradient on a GPU (Note [When gradients are pooled]), so they are whole
// there, 4Ψ beside the shard, where 1F1B's pool holds the own slots and two blocks.
TEST(PlanZero3, ZeroBubbleGathersAsOneFOneBAndKeepsGradientsWhole) {
  PlanModel m = small_model();
  m.overlap = false;
  const Hardware hw = round_machine("fp32");
  for (const char* gather : {"micro_batch", "step"}) {
    PlanLayout one = data_parallel(4, 3);
    one.accum = 4, one.zero3_gather = gather;
    PlanLayout zb = one;
    zb.schedule = "zb-h1";
    const Prediction a = predict(m, one, hw), b = predict(m, zb, hw);
    ASSERT_TRUE(b.fits) << b.why_not;
    EXPECT_EQ(b.term("all_gathers_per_step"), a.term("all_gathers_per_step")) << gather;
    EXPECT_EQ(b.term("all_gathers_per_step"), std::string(gather) == "step" ? 1 : 8) << gather;
    EXPECT_DOUBLE_EQ(b.term("all_gather_exposed"), a.term("all_gather_exposed")) << gather;
  }
  m.overlap = true;
  const double shard = kPsi / 8, own = 8192 + 1024 + 128;
  PlanLayout zb = data_parallel(8, 3);
  zb.schedule = "zb-h1";
  EXPECT_DOUBLE_EQ(model_state_bytes(m, zb, hw, 0).grads, 4 * shard + 4 * kPsi);
  EXPECT_DOUBLE_EQ(model_state_bytes(m, data_parallel(8, 3), hw, 0).grads,
                   4 * shard + 4 * (own + 2 * kUnit));
}

// With overlap a pass hides its gathers under compute except the first unit's (wte forward,
// the final LayerNorm backward) when the link is fast, and everything beyond the compute when
// it is slow.
TEST(PlanZero3, GathersHideBehindComputeOneUnitAhead) {
  const PlanModel m = small_model();
  Hardware hw = round_machine("fp32");
  PlanLayout l = data_parallel(4, 3);
  l.micro_batch = 8;  // compute well above the gathers at 100 GB/s
  const Prediction fast = predict(m, l, hw);
  const double wte = 0.75 * 4 * 8192 / 100e9, norm = 0.75 * 4 * 128 / 100e9;
  EXPECT_NEAR(fast.term("all_gather_exposed"), wte + norm, 1e-15);
  hw.intra_node = hw.inter_node = {0.001, 0};  // 1 MB/s: the gathers outlast the compute
  const Prediction slow = predict(m, l, hw);
  const double gather = 0.75 * 4 * kPsi / 1e6;
  const double f = slow.term("forward_s"), b = slow.term("backward_s");
  EXPECT_NEAR(slow.term("all_gather_exposed"), 2 * gather - f - b, 1e-9);
  // The last backward's thread is busy gathering: the reduce-scatter finds no window left.
  EXPECT_NEAR(slow.term("reduce_scatter_exposed"), gather, 1e-9);
}

// HSDP, dp 8 = 2 replicas × 4 shards on nodes of 4: the shard group stays inside a node (100
// GB/s), the replicas cross nodes (10 GB/s). fp32, no overlap.
TEST(PlanZero3, HsdpShardsInTheNodeAndAllReducesTheShardAcrossReplicas) {
  PlanModel m = small_model();
  m.overlap = false;
  const Hardware hw = round_machine("fp32", 4);
  PlanLayout l = data_parallel(8, 3);
  l.dp_shard = 4;
  EXPECT_EQ(l.replicas(), 2);
  const RankPlace place = rank_place(l, hw);
  EXPECT_EQ(place.shard_link.gbytes_per_s, 100);
  EXPECT_EQ(place.replicate_link.gbytes_per_s, 10);
  const Prediction p = predict(m, l, hw);
  ASSERT_TRUE(p.fits) << p.why_not;
  const double pass = 0.75 * 4 * kPsi / 100e9;  // a ring of 4 over the stage, in the node
  EXPECT_NEAR(p.term("all_gather_exposed"), 2 * pass, 1e-15);
  EXPECT_NEAR(p.term("reduce_scatter_exposed"), pass, 1e-15);
  // 2·(Ψ/S)·(R−1)/R fp32 gradients per rank over 10 GB/s: 2·(4Ψ/4)·(1/2) / 10e9.
  EXPECT_NEAR(p.term("hsdp_allreduce_exposed"), 2 * (4 * kPsi / 4) * 0.5 / 10e9, 1e-15);
  EXPECT_NEAR(p.term("hsdp_allreduce_s"), p.term("hsdp_allreduce_exposed"), 1e-15);
  // comm.grad_dtype bf16 (Note [HSDP with bf16 gradients]): both hops carry half the bytes.
  PlanModel m16 = m;
  m16.grad_comm_bytes = 2;
  const Prediction p16 = predict(m16, l, hw);
  EXPECT_NEAR(p16.term("reduce_scatter_exposed"), pass / 2, 1e-15);
  EXPECT_NEAR(p16.term("hsdp_allreduce_s"), p.term("hsdp_allreduce_s") / 2, 1e-15);
  // Sharded over dp_shard only: 16·Ψ/4 of states, not 16·Ψ/8.
  const ModelStates st = model_state_bytes(m, l, hw, 0);
  EXPECT_DOUBLE_EQ(st.optimizer, 8 * kPsi / 4);
  // Without overlap a device keeps its gradient buffer whole (Note [When gradients are pooled]).
  EXPECT_DOUBLE_EQ(st.grads, 4 * kPsi / 4 + 4 * kPsi);
  // Plain ZeRO-3 over all 8 spans two nodes: its gathers run at the inter-node link.
  EXPECT_EQ(rank_place(data_parallel(8, 3), hw).shard_link.gbytes_per_s, 10);
}

// The search: with memory between ZeRO-3's need and ZeRO-2's, no ZeRO-2 layout fits and the
// best is ZeRO-3; HSDP splits whose shard group fills part of a node are among the candidates.
TEST(PlanZero3, SearchProposesZeroThreeWhereZeroTwoDoesNotFit) {
  const PlanModel m = small_model();
  Hardware hw = round_machine("bf16", 4);
  const double need2 = predict(m, data_parallel(8, 2), hw).memory_bytes;
  const double need3 = predict(m, data_parallel(8, 3), hw).memory_bytes;
  ASSERT_LT(need3, need2);
  hw.memory_gb = (need3 + need2) / 2 / 1e9;
  PlanSearch search;
  search.gpus = 8, search.global_batch = 8;
  search.tp = {1}, search.pp = {1}, search.micro_batches = {1}, search.recompute = {"none"};
  const std::vector<Prediction> ranked = rank_layouts(m, hw, search);
  ASSERT_FALSE(ranked.empty());
  ASSERT_TRUE(ranked[0].fits) << ranked[0].why_not;
  EXPECT_EQ(ranked[0].layout.zero, 3) << format_layout(ranked[0].layout);
  std::vector<int> shards;
  for (const Prediction& p : ranked) {
    EXPECT_FALSE(p.fits && p.layout.zero == 2) << format_layout(p.layout);
    if (p.layout.zero == 3) shards.push_back(p.layout.shard());
  }
  for (int s : {2, 4, 8})  // 2 and 4 divide the node of 4; 8 is all of dp
    EXPECT_NE(std::find(shards.begin(), shards.end(), s), shards.end()) << "dp_shard " << s;
  EXPECT_EQ(std::find(shards.begin(), shards.end(), 1), shards.end());
  // Restricted to ZeRO 0-2 the search has nothing that fits.
  search.zero = {0, 1, 2};
  EXPECT_FALSE(rank_layouts(m, hw, search)[0].fits);
}

TEST(PlanZero3, LayoutTextNamesZeroThreeAndTheHsdpSplit) {
  const PlanLayout l = parse_layout("tp=1,zero=3,dp_replicate=2,dp_shard=4,micro=1", 16);
  EXPECT_EQ(l.dp, 8);
  EXPECT_EQ(l.shard(), 4);
  EXPECT_EQ(l.accum, 2);
  const std::string text = format_layout(l);
  EXPECT_NE(text.find("zero=3,dp_replicate=2,dp_shard=4"), std::string::npos) << text;
  const PlanLayout back = parse_layout(text, 0);
  EXPECT_EQ(back.dp, 8);
  EXPECT_EQ(back.dp_shard, 4);
  PlanLayout kept = parse_layout("dp=4,zero=3,reshard_after_forward=false,zero3_gather=step", 16);
  EXPECT_EQ(format_layout(kept),
            "dp=4,tp=1,pp=1,v=1,micro=1,accum=4,zero=3,dp_shard=4,reshard_after_forward=false,"
            "zero3_gather=step,recompute=none");
  for (const char* bad :
       {"dp=8,zero=2,dp_shard=4", "dp=8,zero=3,dp_shard=3", "zero=4", "dp=8,zero=3,dp_replicate=3",
        "dp=8,zero=3,dp_replicate=2,dp_shard=2", "dp=4,zero=3,zero3_gather=often",
        "dp=4,zero=3,reshard_after_forward=2"}) {
    try {
      parse_layout(bad, 0);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::kBadInput) << bad;
    }
  }
}

// The largest model that fits: the most layers whose model states fit (one more does not),
// growing with the ZeRO stage and, for ZeRO 1-3, with the devices; ZeRO-0 stays flat.
TEST(PlanZero3, CapacityIsTheMostLayersThatFit) {
  const PlanModel m = small_model();
  Hardware hw = round_machine("bf16");
  hw.memory_gb = 0.01;  // 10 MB: tens of blocks of this small model
  double previous = 0;
  for (int zero : {0, 1, 2, 3}) {
    const ZeroCapacity c = zero_capacity(m, hw, zero, 64);
    ASSERT_GT(c.layers, 0) << zero;
    EXPECT_LE(c.state_bytes, 1e7);
    PlanModel more = m;
    more.layers = c.layers + 1;
    const ModelStates st = model_state_bytes(more, data_parallel(64, zero), hw, 0);
    EXPECT_GT(st.params + st.grads + st.optimizer, 1e7) << zero;
    EXPECT_GT(c.params, previous) << zero;
    previous = c.params;
  }
  // ZeRO-0 holds 18 B per parameter whatever the devices: about 1e7 / 18 parameters.
  const ZeroCapacity flat = zero_capacity(m, hw, 0, 1024);
  EXPECT_EQ(flat.layers, zero_capacity(m, hw, 0, 1).layers);
  EXPECT_NEAR(flat.params, 1e7 / 18, kUnit);
  EXPECT_GT(zero_capacity(m, hw, 3, 1024).params, 10 * zero_capacity(m, hw, 3, 8).params);
}

}  // namespace
}  // namespace trident

namespace trident {
namespace {

// The pool as the trainer holds it (docs/perf.md, "ZeRO-3 and HSDP"): where wte is the largest
// unit, it is gathered once per forward and kept from the embedding to the head, so the most
// held is wte beside two blocks (not two wte, and more than the embedding's group, wte and wpe,
// with the first block); and the tied wte's gradient goes out in bucket-sized pieces, so the
// largest gradient written whole is a block's. A vocabulary of 4,096: wte 262,144 > a block's
// 49,984 > wpe's 1,024.
TEST(PlanZero3, PoolIsTwoNeighbouringGroupsAndTheLargestWholeGradient) {
  PlanModel m = small_model();
  m.vocab = 4096;
  const double wte = 4096.0 * 64, wpe = 16 * 64, head = 128, block = kUnit;
  const Zero3Pool pool = zero3_pool(m, data_parallel(4, 3), 0);
  EXPECT_DOUBLE_EQ(pool.params, wte + 2 * block);  // wte kept from the embedding to the head
  (void)wpe;
  EXPECT_DOUBLE_EQ(pool.whole_grad, block);
  // Untied, the head's own LM head weight is written whole.
  m.block.tied_head = false;
  EXPECT_DOUBLE_EQ(zero3_pool(m, data_parallel(4, 3), 0).whole_grad, wte + head);
}

}  // namespace
}  // namespace trident
