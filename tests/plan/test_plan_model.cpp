// The plan model's terms against hand calculations (Note [Plan model]), and its memory
// against what GPT allocates.
#include <gtest/gtest.h>

#include <cmath>

#include "plan/plan_parts.h"
#include "plan_test_util.h"
#include "trident/backend.h"
#include "trident/check.h"
#include "trident/comm.h"
#include "trident/model.h"
#include "trident/pipeline.h"

namespace trident {
namespace {

using testing::round_machine;

PlanModel small_model() {
  PlanModel m;
  m.layers = 2;
  m.d_model = 64;
  m.heads = 2;
  m.vocab = 128;
  m.seq_len = 16;
  return m;
}

PlanModel small_model_layers(int layers) {
  PlanModel m = small_model();
  m.layers = layers, m.heads = 4;
  return m;
}

TEST(PlanModel, GemmTermIsSeventyTwoNC2PerLayerPlusTheHead) {
  const PlanModel m = small_model();
  PlanLayout l;
  l.micro_batch = 2;
  const Prediction p = predict(m, l, round_machine());
  ASSERT_TRUE(p.fits) << p.why_not;
  // Per block forward 2·N·(3C² + C² + 4C² + 4C²) = 24·N·C², backward twice that; the head
  // 2·N·V·C forward, twice that backward. N = 2·16 = 32, C = 64, V = 128, L = 2.
  const double N = 32, C = 64, V = 128;
  const double flops = 72 * N * C * C * 2 + 6 * N * V * C;  // 20,447,232
  EXPECT_DOUBLE_EQ(flops, 20447232.0);
  EXPECT_NEAR(p.term("gemm"), flops / 1e12, 1e-15);
}

// Note [Plan cross-entropy traffic]: a description's bytes per logit replace trident's 3 + 2
// elements. bf16 (2 B), N = 32 rows, V = 128 logits (tp 1; 64 on each of tp 2), 100 GB/s.
TEST(PlanModel, CrossEntropyTrafficFromTheDescription) {
  const PlanModel m = small_model();
  PlanLayout l;
  l.micro_batch = 2;
  Hardware hw = round_machine("bf16");
  const Prediction own = predict(m, l, hw);
  hw.cross_entropy_forward_bytes = 38, hw.cross_entropy_backward_bytes = 14;
  const Prediction megatron = predict(m, l, hw);
  ASSERT_TRUE(megatron.fits) << megatron.why_not;
  // (38 + 14 − 5·2) B · 32 · 128 / 100 GB/s = 1.72032 µs more, all of it in memory_bound.
  const double more = (38 + 14 - 5 * 2) * 32.0 * 128 / 100e9;
  EXPECT_DOUBLE_EQ(more, 1.72032e-6);
  EXPECT_NEAR(megatron.term("memory_bound") - own.term("memory_bound"), more, 1e-15);
  EXPECT_NEAR(megatron.step_s - own.step_s, more, 1e-15);
  // Forward's share is 38 − 3·2 of the 42 bytes.
  EXPECT_NEAR(megatron.term("forward_s") - own.term("forward_s"), more * 32 / 42, 1e-15);
  // Vocabulary-parallel: each tp rank moves its own slice of the logits.
  l.tp = 2;
  hw.cross_entropy_forward_bytes = hw.cross_entropy_backward_bytes = 0;
  const Prediction own2 = predict(m, l, hw);
  hw.cross_entropy_forward_bytes = 38, hw.cross_entropy_backward_bytes = 14;
  const Prediction megatron2 = predict(m, l, hw);
  EXPECT_NEAR(megatron2.term("memory_bound") - own2.term("memory_bound"),
              more * padded_vocab(m, l) / 2 / 128, 1e-15);
}

TEST(PlanModel, TensorParallelAllReducesOnTheRing) {
  PlanModel m = small_model();
  m.tp_overlap = false;  // the figure before parallel.tp_overlap, unchanged
  PlanLayout l;
  l.tp = 2;
  l.micro_batch = 2;
  const Prediction p = predict(m, l, round_machine());
  ASSERT_TRUE(p.fits) << p.why_not;
  // Two all-reduces per block forward and two backward of N·C fp32 values; a ring over 2
  // ranks moves 2·(n−1)/n = 1 times the buffer: 32·64·4 B / 10 GB/s each. The head adds two
  // all-reduces of N·3 floats (the vocab-parallel softmax statistics).
  const double one = 32.0 * 64 * 4 / 10e9, ce = 32.0 * 3 * 4 / 10e9;
  EXPECT_NEAR(p.term("tp_comm_exposed"), 2 * 4 * one + 2 * ce, 1e-15);
  EXPECT_DOUBLE_EQ(p.term("tp_comm_s"), p.term("tp_comm_exposed"));
  EXPECT_DOUBLE_EQ(p.term("tp_comm_hidden_s"), 0);
  // Overlapped, the same collectives in all, less of them exposed.
  m.tp_overlap = true;
  const Prediction on = predict(m, l, round_machine());
  EXPECT_NEAR(on.term("tp_comm_s"), 2 * 4 * one + 2 * ce, 1e-15);
  EXPECT_LT(on.term("tp_comm_exposed"), p.term("tp_comm_exposed"));
}

// Note [Plan tensor-parallel overlap] by hand, on a host: N = 32 rows, C = 64, tp = 2 (qkv 96
// rows, fc 128, attproj's input 32, fcproj's 128), every GEMM at 1 TFLOP/s, links at 10 GB/s.
TEST(PlanModel, TensorParallelOverlapByHand) {
  PlanModel m = small_model();
  Hardware hw = round_machine();
  hw.kind = "cpu";  // the host's rings: pieces, and the bulk sums under dW
  hw.overlap_slowdown = 0.1;
  PlanLayout l;
  l.tp = 2, l.micro_batch = 2;
  auto g = [](double M, double N, double K) { return 2 * M * N * K / 1e12; };
  const double one = 32.0 * 64 * 4 / 10e9, ce = 32.0 * 3 * 4 / 10e9;
  // Sequence parallel: a ring of 2 chunks, each one piece, exposes max(0, t − g/2) per
  // collective, t = one/2; backward's reduce-scatters of qkv's and fc's input gradients hide
  // under their dW.
  l.sequence_parallel = true;
  m.tp_overlap_chunks = 1;
  const double t = one / 2;
  auto ring = [&](double gemm) { return std::max(0.0, t - gemm / 2); };
  const double fwd =
      ring(g(32, 96, 64)) + ring(g(32, 64, 32)) + ring(g(32, 128, 64)) + ring(g(32, 64, 128));
  const double bwd = ring(g(32, 128, 64)) + ring(g(32, 32, 64)) +
                     std::max(0.0, t - g(128, 64, 32)) + std::max(0.0, t - g(96, 64, 32));
  EXPECT_NEAR(fwd, 2.13e-7 + 3.44e-7 + 1.47e-7 + 1.47e-7, 1e-9);  // the numbers, written out
  EXPECT_NEAR(bwd, 1.47e-7 + 3.44e-7 + 0 + 0.16e-7, 1e-9);
  Prediction p = predict(m, l, hw);
  ASSERT_TRUE(p.fits) << p.why_not;
  EXPECT_NEAR(p.term("tp_comm_exposed"), 2 * (fwd + bwd) + 2 * ce, 1e-15);
  EXPECT_NEAR(p.term("tp_comm_hidden_s"), 2 * 4 * one - 2 * (fwd + bwd), 1e-15);
  EXPECT_NEAR(p.term("overlap_slowdown"), 0.1 * p.term("tp_comm_hidden_s"), 1e-15);
  // tp_overlap_slowdown, where a description gives one, replaces it under the tp collectives.
  Hardware own_sms = hw;
  own_sms.tp_overlap_slowdown = 0.25;
  const Prediction own_sm = predict(m, l, own_sms);
  EXPECT_NEAR(own_sm.term("overlap_slowdown"), 0.25 * p.term("tp_comm_hidden_s"), 1e-15);
  EXPECT_NEAR(own_sm.step_s - p.step_s, 0.15 * p.term("tp_comm_hidden_s"), 1e-15);
  // Two pieces a chunk (the default): the own chunk's GEMM (g/2) runs while the first piece
  // (t/2) travels, the first arrived piece's (g/4) while the second does: max(0, t − 3g/4,
  // t/2 − g/2).
  m.tp_overlap_chunks = 0;
  auto ring2 = [&](double gemm) { return std::max({0.0, t - 0.75 * gemm, t / 2 - gemm / 2}); };
  const double fwd2 =
      ring2(g(32, 96, 64)) + ring2(g(32, 64, 32)) + ring2(g(32, 128, 64)) + ring2(g(32, 64, 128));
  const double bwd2 = ring2(g(32, 128, 64)) + ring2(g(32, 32, 64)) +
                      std::max(0.0, t - g(128, 64, 32)) + std::max(0.0, t - g(96, 64, 32));
  EXPECT_LT(fwd2 + bwd2, fwd + bwd);
  p = predict(m, l, hw);
  EXPECT_NEAR(p.term("tp_comm_exposed"), 2 * (fwd2 + bwd2) + 2 * ce, 1e-15);
  // Without it, k = tp = 2 pieces of each all-reduce after attproj and fcproj forward:
  // one/2 + max(0, one/2 − g/2); backward's all-reduces of qkv's and fc's input gradients
  // hide under their dW.
  l.sequence_parallel = false;
  auto pieces = [&](double gemm) { return one / 2 + std::max(0.0, one / 2 - gemm / 2); };
  const double fwd_ar = pieces(g(32, 64, 32)) + pieces(g(32, 64, 128));
  const double bwd_ar = std::max(0.0, one - g(128, 64, 32)) + std::max(0.0, one - g(96, 64, 32));
  p = predict(m, l, hw);
  EXPECT_NEAR(p.term("tp_comm_exposed"), 2 * (fwd_ar + bwd_ar) + 2 * ce, 1e-15);
  // tp_overlap_chunks = 4 cuts each into four pieces.
  m.tp_overlap_chunks = 4;
  auto quarters = [&](double gemm) { return one / 4 + 3 * std::max(0.0, one / 4 - gemm / 4); };
  p = predict(m, l, hw);
  EXPECT_NEAR(p.term("tp_comm_exposed"),
              2 * (quarters(g(32, 64, 32)) + quarters(g(32, 64, 128)) + bwd_ar) + 2 * ce, 1e-15);
}

// A device runs what Note [Tensor-parallel ring on a device] builds: auto is off there, and true
// moves whole chunks (tp_overlap_chunks splits nothing) with backward's bulk sums exposed. By
// hand with the numbers above, sequence parallel, tp = 2, one piece: forward as the host's,
// backward's two rings as the host's and its two reduce-scatters whole (t each).
TEST(PlanModel, DeviceTensorParallelOverlapAsTheDeviceRunsIt) {
  PlanModel m = small_model();
  Hardware hw = round_machine();
  ASSERT_EQ(hw.kind, "gpu");
  PlanLayout l;
  l.tp = 2, l.micro_batch = 2, l.sequence_parallel = true;
  auto g = [](double M, double N, double K) { return 2 * M * N * K / 1e12; };
  const double one = 32.0 * 64 * 4 / 10e9, ce = 32.0 * 3 * 4 / 10e9, t = one / 2;
  auto ring = [&](double gemm) { return std::max(0.0, t - gemm / 2); };
  const double fwd =
      ring(g(32, 96, 64)) + ring(g(32, 64, 32)) + ring(g(32, 128, 64)) + ring(g(32, 64, 128));
  const double bwd = ring(g(32, 128, 64)) + ring(g(32, 32, 64)) + 2 * t;
  for (int chunks : {0, 1, 4}) {
    m.tp_overlap_chunks = chunks;
    const Prediction p = predict(m, l, hw);
    ASSERT_TRUE(p.fits) << p.why_not;
    EXPECT_NEAR(p.term("tp_comm_exposed"), 2 * (fwd + bwd) + 2 * ce, 1e-15) << chunks;
  }
  m.tp_overlap = false;
  const double off = predict(m, l, hw).term("tp_comm_exposed");
  EXPECT_NEAR(off, 2 * 4 * one + 2 * ce, 1e-15);
  m.tp_overlap = true, m.tp_overlap_auto = true;  // auto: off on a device
  EXPECT_DOUBLE_EQ(predict(m, l, hw).term("tp_comm_exposed"), off);
}

// Hiding a collective never costs more than waiting for it (the slowdown is a fraction of the
// hidden time), for any tp, with or without sequence parallelism, recompute or a slow link.
TEST(PlanModel, TensorParallelOverlapNeverExceedsNoOverlap) {
  PlanModel m = small_model_layers(4);
  for (double gbps : {1.0, 10.0, 1000.0})
    for (int tp : {2, 4})
      for (bool sp : {false, true})
        for (const char* recompute : {"none", "full"}) {
          Hardware hw = round_machine("bf16");
          hw.overlap_slowdown = 0.3;
          hw.intra_node = hw.inter_node = {gbps, 1};
          PlanLayout l;
          l.tp = tp, l.dp = 2, l.micro_batch = 2, l.accum = 2;
          l.sequence_parallel = sp, l.recompute = recompute;
          m.tp_overlap = false;
          const Prediction off = predict(m, l, hw);
          m.tp_overlap = true;
          const Prediction on = predict(m, l, hw);
          ASSERT_TRUE(on.fits) << on.why_not;
          EXPECT_LE(on.step_s, off.step_s) << format_layout(l) << " at " << gbps << " GB/s";
          EXPECT_LE(on.term("tp_comm_exposed"), off.term("tp_comm_exposed"));
          EXPECT_NEAR(on.term("tp_comm_s"), off.term("tp_comm_s"), 1e-12 * off.step_s);
        }
}

// The search ranks layouts by the overlapped figure (the deck's parallel.tp_overlap).
TEST(PlanModel, SearchUsesTheOverlappedTensorParallelFigure) {
  PlanModel m = small_model_layers(4);
  Hardware hw = round_machine();
  hw.intra_node = hw.inter_node = {1, 0};  // slow: tp's collectives matter
  PlanSearch s;
  s.gpus = 2, s.global_batch = 4, s.tp = {2}, s.zero = {0}, s.recompute = {"none"};
  const std::vector<Prediction> ranked = rank_layouts(m, hw, s);
  ASSERT_FALSE(ranked.empty());
  const Prediction& best = ranked.front();
  EXPECT_DOUBLE_EQ(best.step_s, predict(m, best.layout, hw).step_s);
  m.tp_overlap = false;
  EXPECT_LT(best.step_s, predict(m, best.layout, hw).step_s);
  EXPECT_LT(best.term("tp_comm_exposed"), best.term("tp_comm_s"));
}

// comm.emulate_groups: the emulated link replaces the dp group's, the tp group's, or both.
TEST(PlanModel, EmulatedLinkSlowsTheGroupsItNames) {
  PlanModel m = small_model();
  m.tp_overlap = false;
  m.emulate_gbps = 0.1, m.emulate_latency_us = 5;
  PlanLayout l;
  l.tp = 2, l.dp = 2, l.micro_batch = 2;
  const Hardware hw = round_machine();
  const double act = 32.0 * 64 * 4, grads = stage_params(m, l, 0) * 4;
  auto emulated = [&](double bytes) {
    return emulated_link_seconds(LinkOp::kAllReduce, size_t(bytes), 2, 0.1, 5);
  };
  const double ce = 2 * emulated(32.0 * 3 * 4), ce_ring = 2 * 32.0 * 3 * 4 / 10e9;
  m.emulate_dp = true, m.emulate_tp = false;  // the default, "dp"
  Prediction p = predict(m, l, hw);
  EXPECT_NEAR(p.term("dp_reduce_s"), emulated(grads), 1e-12);
  EXPECT_NEAR(p.term("tp_comm_s"), 2 * 4 * act / 10e9 + ce_ring, 1e-15);
  m.emulate_dp = false, m.emulate_tp = true;  // "tp"
  p = predict(m, l, hw);
  EXPECT_NEAR(p.term("dp_reduce_s"), grads / 10e9, 1e-15);
  EXPECT_NEAR(p.term("tp_comm_s"), 2 * 4 * emulated(act) + ce, 1e-12);
}

// Rank order puts tp's ranks next to each other: on 8-device nodes a group of 2, 4 or 8 stays
// in a node, a group of 6 (ranks 6..11) or 16 does not and runs at the inter-node link; a dp
// group is inside a node when tp·dp divides the node.
TEST(PlanModel, GroupsThatDoNotDivideTheNodeUseTheInterNodeLink) {
  Hardware hw = round_machine();
  hw.intra_node = {300, 0};
  hw.inter_node = {25, 0};
  auto place = [&](int dp, int tp, int pp) {
    PlanLayout l;
    l.dp = dp, l.tp = tp, l.pp = pp;
    return rank_place(l, hw);
  };
  EXPECT_EQ(place(4, 4, 2).tp_link.gbytes_per_s, 300);
  EXPECT_EQ(place(4, 8, 2).tp_link.gbytes_per_s, 300);
  EXPECT_EQ(place(4, 6, 2).tp_link.gbytes_per_s, 25);
  EXPECT_EQ(place(4, 16, 2).tp_link.gbytes_per_s, 25);
  EXPECT_EQ(place(2, 4, 4).dp_link.gbytes_per_s, 300);  // tp·dp = 8: one node
  EXPECT_EQ(place(3, 2, 4).dp_link.gbytes_per_s, 25);   // tp·dp = 6: straddles
  EXPECT_EQ(place(4, 4, 2).dp_link.gbytes_per_s, 25);   // tp·dp = 16
  EXPECT_EQ(place(1, 6, 1).tp_link.gbytes_per_s, 300);  // the whole job in one node
  EXPECT_EQ(place(2, 2, 2).pp_link.gbytes_per_s, 300);
  EXPECT_EQ(place(2, 2, 4).pp_link.gbytes_per_s, 25);
}

TEST(PlanModel, OneFOneBBubbleIsPMinusOneOverM) {
  const PlanModel m = small_model();
  PlanLayout l;
  l.pp = 2;
  l.accum = 4;
  const Hardware hw = round_machine();
  const Prediction p = predict(m, l, hw);
  ASSERT_TRUE(p.fits) << p.why_not;
  // (p−1)/(m+p−1) = 1/5 of equal stages' time is idle. The slower stage (the head's) runs its
  // m = 4 micro-batches back to back; fill and drain pass once through the other stage:
  // bubble = m·t_fast·(1/5)/(4/5) = t_fast, the step's pipeline part t_fast + 4·t_slow.
  const RankPlace place = rank_place(l, hw);
  auto t = [&](int s) {
    const StageCost c = stage_cost(m, l, hw, place, pipeline_stage(m.layers, 2, s, {}));
    return c.forward + c.backward;
  };
  const double fast = std::min(t(0), t(1)), slow = std::max(t(0), t(1));
  EXPECT_GT(slow, fast);  // the LM head outweighs the embedding
  EXPECT_DOUBLE_EQ(p.term("micro_batch_s"), slow);
  EXPECT_NEAR(p.term("bubble"), fast, 1e-15);
  EXPECT_DOUBLE_EQ(p.term("bubble_fraction"), 0.2);
}

TEST(PlanModel, AllReduceWithoutOverlapIsAllExposed) {
  PlanModel m = small_model();
  m.overlap = false;
  PlanLayout l;
  l.dp = 4;
  const Prediction p = predict(m, l, round_machine());
  ASSERT_TRUE(p.fits) << p.why_not;
  // 2·(d−1)/d = 1.5 times the rank's fp32 gradients over 10 GB/s.
  const double params = stage_params(m, l, 0);
  EXPECT_NEAR(p.term("dp_allreduce_exposed"), 1.5 * params * 4 / 10e9, 1e-15);
  EXPECT_DOUBLE_EQ(p.term("overlap_slowdown"), 0);
}

TEST(PlanModel, OverlapHidesTheAllReduceUnderBackwardButNotTheLastBucket) {
  PlanModel m = small_model();
  Hardware hw = round_machine();
  hw.inter_node = hw.intra_node = {1000, 0};  // fast: the backward hides all but a bucket
  PlanLayout l;
  l.dp = 4;
  const Prediction p = predict(m, l, hw);
  const double params = stage_params(m, l, 0);
  const double bucket = std::min(params * 4, m.first_bucket_mb * 1024 * 1024);
  EXPECT_NEAR(p.term("dp_allreduce_exposed"), 1.5 * bucket / 1000e9, 1e-15);
}

TEST(PlanModel, TimeTermsAddUpToTheStep) {
  const PlanModel m = small_model();
  PlanLayout l;
  l.dp = 2, l.pp = 2, l.accum = 4, l.zero = 1, l.recompute = "full";
  const Prediction p = predict(m, l, round_machine());
  ASSERT_TRUE(p.fits) << p.why_not;
  double sum = 0;
  for (const PlanTerm& t : p.time) sum += t.value;
  EXPECT_DOUBLE_EQ(sum, p.step_s);
  EXPECT_GT(p.term("recompute"), 0);
  EXPECT_NEAR(p.tokens_per_s, 2 * 4 * 16 / p.step_s, 1e-9 * p.tokens_per_s);
}

TEST(PlanModel, NoRateAboveThePeakAndMfuAgainstTheSameCores) {
  const PlanModel m = small_model();
  Hardware hw = round_machine();
  hw.peak_tflops = 1;         // the GEMM point is at the peak
  hw.compute_efficiency = 2;  // would make GEMMs run at 2 TFLOP/s: capped at the peak
  PlanLayout l;
  l.micro_batch = 2;
  const Prediction p = predict(m, l, hw);
  EXPECT_NEAR(p.term("gemm"), 20447232.0 / 1e12, 1e-15);  // the hand count above, at 1 TFLOP/s
  EXPECT_LE(p.mfu, 1.0);
  // Four single-thread ranks on two cores in a pipeline: MFU is against the cores the rank
  // gets (rank_cores), the same its compute is timed on.
  hw = round_machine();
  hw.kind = "cpu", hw.devices_per_node = 2;
  l = {};
  l.dp = 2, l.pp = 2, l.accum = 2, l.ranks_per_node = 4;
  const Prediction q = predict(m, l, hw);
  ASSERT_TRUE(q.fits) << q.why_not;
  EXPECT_NEAR(q.mfu, q.tflops_per_gpu / (hw.peak_tflops * q.term("rank_cores")), 1e-12);
}

TEST(PlanModel, ParameterCountIsTheModelsLayout) {
  PlanModel m = small_model();
  m.layers = 5;
  m.vocab = 300;  // padded to 384 (tp 1), 512 (tp 2: 256·2)
  for (int tp : {1, 2})
    for (int pp : {1, 2, 3}) {
      PlanLayout l;
      l.tp = tp, l.pp = pp;
      for (int s = 0; s < pp; ++s) {
        GPTConfig cfg;
        cfg.layers = m.layers, cfg.channels = m.d_model, cfg.heads = m.heads;
        cfg.vocab = m.vocab, cfg.padded_vocab = GPTConfig::pad_vocab(m.vocab, tp);
        cfg.max_seq_len = m.seq_len;
        size_t count = 0;
        for (const ParamInfo& p : gpt_param_layout(cfg, tp, 0, pipeline_stage(5, pp, s, {})))
          count += p.count;
        EXPECT_DOUBLE_EQ(stage_params(m, l, s), double(count))
            << "tp " << tp << " pp " << pp << " stage " << s;
      }
    }
}

// For both precisions: the bf16 path (host definitions on the CPU backend allocate what the
// CUDA backend does) holds some buffers in 2 B and the residual stream and scratch in 4 B.
TEST(PlanModel, ActivationMemoryIsWhatTheModelAllocates) {
  const PlanModel m = small_model();
  auto backend = make_cpu_backend(1);
  for (const char* dtype : {"fp32", "bf16"})
    for (const char* recompute : {"none", "mlp", "full"}) {
      const bool bf16 = std::string(dtype) == "bf16";
      PlanLayout l;
      l.micro_batch = 2;
      l.recompute = recompute;
      const std::vector<PlanTerm> mem = memory_terms(m, l, round_machine(dtype));
      double acts = 0, params = 0;
      for (const PlanTerm& t : mem) {
        if (t.name == "activations" || t.name == "scratch") acts += t.value;
        if (t.name == "params") params = t.value;
      }
      GPTConfig cfg;
      cfg.layers = m.layers, cfg.channels = m.d_model, cfg.heads = m.heads, cfg.vocab = m.vocab;
      cfg.padded_vocab = 128, cfg.max_seq_len = m.seq_len;
      GPTOptions options;
      options.recompute = parse_recompute(recompute);
      if (bf16) options.precision = Precision::kBf16;
      GPT gpt(cfg, *backend, 2, m.seq_len, options);
      EXPECT_DOUBLE_EQ(acts, double(gpt.activation_bytes())) << dtype << " " << recompute;
      EXPECT_DOUBLE_EQ(params, double(gpt.num_params() * (bf16 ? 2 : 4)))
          << dtype << " " << recompute;
    }
}

// The families' parameter counts against published totals (not derived from trident):
// Pythia-2.8B, GPT-NeoX's 2.7B shape with vocabulary 50304, has 2,775,208,960 parameters (its
// model card); Llama-3-8B has 8,030,261,248 (transformers' num_parameters() of
// meta-llama/Meta-Llama-3-8B, "8.03B"). Exact integers: the count is closed-form.
TEST(PlanModel, FamilyParameterCountsMatchPublishedModels) {
  PlanModel neox;
  neox.layers = 32, neox.d_model = 2560, neox.heads = 32, neox.vocab = 50304, neox.seq_len = 2048;
  neox.block.apply_family(Family::kNeoX);
  EXPECT_DOUBLE_EQ(stage_params(neox, PlanLayout{}, 0), 2775208960.0);
  // The seed's deck pads to 50432: 2·128·2560 more rows of wte and of the untied head.
  neox.vocab = 50432;
  EXPECT_DOUBLE_EQ(stage_params(neox, PlanLayout{}, 0), 2775208960.0 + 2 * 128 * 2560.0);

  PlanModel llama;
  llama.layers = 32, llama.d_model = 4096, llama.heads = 32, llama.vocab = 128256;
  llama.seq_len = 8192;
  llama.block.apply_family(Family::kLlama);
  llama.block.kv_heads = 8, llama.block.mlp_hidden = 14336;
  EXPECT_DOUBLE_EQ(stage_params(llama, PlanLayout{}, 0), 8030261248.0);
  // Tied, the same model would hold one V·C matrix less (the head reads wte).
  llama.block.tied_head = true;
  EXPECT_DOUBLE_EQ(stage_params(llama, PlanLayout{}, 0), 8030261248.0 - 128256.0 * 4096);
}

// Small families of every kind against the model's own layout (gpt_param_layout) and its
// allocation (a GPT built on the CPU backend), over tp and pp.
PlanModel family_model(Family f) {
  PlanModel m = small_model();
  m.layers = 4, m.heads = 4;
  m.block.apply_family(f);
  if (f == Family::kLlama) m.block.kv_heads = 2, m.block.mlp_hidden = 96;
  return m;
}

TEST(PlanModel, FamilyParameterCountIsTheModelsLayout) {
  for (Family f : {Family::kGPT2, Family::kNeoX, Family::kLlama})
    for (int tp : {1, 2})
      for (int pp : {1, 2}) {
        const PlanModel m = family_model(f);
        PlanLayout l;
        l.tp = tp, l.pp = pp;
        for (int s = 0; s < pp; ++s) {
          size_t count = 0;
          for (const ParamInfo& p :
               gpt_param_layout(gpt_config(m, l), tp, 0, pipeline_stage(m.layers, pp, s, {})))
            count += p.count;
          EXPECT_DOUBLE_EQ(stage_params(m, l, s), double(count))
              << family_name(f) << " tp " << tp << " pp " << pp << " stage " << s;
        }
      }
}

TEST(PlanModel, FamilyActivationMemoryIsWhatTheModelAllocates) {
  auto backend = make_cpu_backend(1);
  for (Family f : {Family::kNeoX, Family::kLlama})
    for (const char* recompute : {"none", "mlp", "full"}) {
      const PlanModel m = family_model(f);
      PlanLayout l;
      l.micro_batch = 2;
      l.recompute = recompute;
      double acts = 0, params = 0;
      for (const PlanTerm& t : memory_terms(m, l, round_machine())) {
        if (t.name == "activations" || t.name == "scratch") acts += t.value;
        if (t.name == "params") params = t.value;
      }
      GPTOptions options;
      options.recompute = parse_recompute(recompute);
      GPT gpt(gpt_config(m, l), *backend, 2, m.seq_len, options);
      EXPECT_DOUBLE_EQ(acts, double(gpt.activation_bytes())) << family_name(f) << " " << recompute;
      EXPECT_DOUBLE_EQ(params, double(gpt.num_params() * 4)) << family_name(f);
    }
}

// The GEMM term at the family's widths, by hand: a Llama block with 4 query heads of 16 and 2
// kv heads (qkv rows 4·16 + 2·2·16 = 128), SwiGLU hidden 96 (fc rows 192), C 64, N 32; the
// untied head V 128. Forward 2·N·C·(128 + 64 + 192 + 96) per block, backward twice that.
TEST(PlanModel, LlamaGemmTermCountsGqaAndSwiGLU) {
  const PlanModel m = family_model(Family::kLlama);
  PlanLayout l;
  l.micro_batch = 2;
  const Prediction p = predict(m, l, round_machine());
  ASSERT_TRUE(p.fits) << p.why_not;
  const double N = 32, C = 64, V = 128, L = 4;
  const double flops = L * 3 * 2 * N * C * (128 + 64 + 192 + 96) + 6 * N * V * C;
  EXPECT_DOUBLE_EQ(flops, 25165824.0);
  EXPECT_NEAR(p.term("gemm"), flops / 1e12, 1e-15);
  // GPT-2's block of the same shape: 12·C² per layer, so 72·N·C²·L + the head.
  const Prediction g = predict(small_model_layers(4), l, round_machine());
  EXPECT_NEAR(g.term("gemm"), (72 * N * C * C * L + 6 * N * V * C) / 1e12, 1e-15);
}

// A tied head with pp > 1 sums wte's fp32 gradient over the first and last stages: one ring
// all-reduce of two ranks, 2·(1/2)·bytes / 10 GB/s on the round machine; ZeRO sends its dp
// shard; an untied head (NeoX) sends nothing. wte: 128 padded rows × 64 = 8192 floats.
TEST(PlanModel, TiedHeadSumsWteOverStagesAndAnUntiedHeadDoesNot) {
  PlanModel m = small_model();
  PlanLayout l;
  l.pp = 2, l.accum = 2;
  const double bytes = 128 * 64 * 4.0;
  EXPECT_NEAR(predict(m, l, round_machine()).term("tied_embedding_allreduce"), bytes / 10e9, 1e-18);
  l.dp = 2, l.zero = 1;
  EXPECT_NEAR(predict(m, l, round_machine()).term("tied_embedding_allreduce"), bytes / 2 / 10e9,
              1e-18);
  l.dp = 1, l.zero = 0, l.pp = 1;
  EXPECT_EQ(predict(m, l, round_machine()).term("tied_embedding_allreduce"), 0.0);
  l.pp = 2;
  m.block.apply_family(Family::kNeoX);
  const Prediction p = predict(m, l, round_machine());
  ASSERT_TRUE(p.fits) << p.why_not;
  EXPECT_EQ(p.term("tied_embedding_allreduce"), 0.0);
}

// The first bucket is first_bucket_mb MiB of fp32 parameters (trident's bucket layout): the
// reduction moves them at the wire's bytes, ZeRO's gather at the parameters'. GEMMs at 1
// GFLOP/s hide everything but that bucket: 0.01 MiB = 2621.44 parameters, over 2 ranks at
// 10 GB/s, half of the bytes each.
TEST(PlanModel, FirstBucketTravelsAtItsElementsBytes) {
  PlanModel m = small_model();
  m.overlap = true, m.first_bucket_mb = 0.01, m.grad_comm_bytes = 2;  // bf16 sums
  Hardware hw = round_machine("bf16");
  hw.gemm = {{64, 0.001}};
  PlanLayout l;
  l.dp = 2, l.zero = 1, l.micro_batch = 2;
  const Prediction p = predict(m, l, hw);
  ASSERT_TRUE(p.fits) << p.why_not;
  const double params = 0.01 * 1024 * 1024 / 4;
  EXPECT_DOUBLE_EQ(params, 2621.44);
  EXPECT_NEAR(p.term("reduce_scatter_exposed"), params * 2 / 2 / 10e9, 1e-18);
  EXPECT_NEAR(p.term("all_gather_exposed"), params * 2 / 2 / 10e9, 1e-18);
  m.grad_comm_bytes = 4;  // fp32 sums: the reduction's bucket doubles, the gather's does not
  const Prediction fp32 = predict(m, l, hw);
  EXPECT_NEAR(fp32.term("reduce_scatter_exposed"), params * 4 / 2 / 10e9, 1e-18);
  EXPECT_NEAR(fp32.term("all_gather_exposed"), params * 2 / 2 / 10e9, 1e-18);
}

TEST(PlanModel, RefusedLayoutsSayWhy) {
  const PlanModel m = small_model();
  PlanLayout l;
  l.tp = 3;  // heads 2
  EXPECT_NE(layout_problem(m, l).find("parallel.tp"), std::string::npos) << layout_problem(m, l);
  l = {};
  l.pp = 3;  // 2 layers
  EXPECT_NE(layout_problem(m, l).find("more pipeline stages"), std::string::npos);
  l = {};
  l.pp = 2, l.accum = 2, l.schedule = "zb-h1", l.recompute = "full";
  EXPECT_NE(layout_problem(m, l).find("recompute"), std::string::npos);
}

TEST(PlanLayoutText, ParsesAndFormatsAndNamesBadKeys) {
  const PlanLayout l = parse_layout("dp=2,tp=2,pp=2,v=2,micro=4,zero=1,recompute=mlp", 64);
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(l.v, 2);
  EXPECT_EQ(l.schedule, "interleaved");  // v > 1 means the interleaved schedule
  EXPECT_EQ(l.accum, 8);                 // 64 / (dp 2 · micro 4)
  EXPECT_EQ(parse_layout(format_layout(l), 0).accum, 8);
  for (const char* bad : {"dq=2", "dp=0", "zero=4", "recompute=some", "dp=2,micro=3"}) {
    try {
      parse_layout(bad, 64);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::kBadInput) << bad;
    }
  }
}

}  // namespace
}  // namespace trident
