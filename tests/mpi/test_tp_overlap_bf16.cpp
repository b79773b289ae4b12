// parallel.tp_overlap with run.precision bf16 (Note [Tensor-parallel overlap in bf16] in
// src/model/tp_overlap.h): the bf16 rings equal the whole collectives and post ahead; training
// with them equals training without them over several steps, at tp 2 and tp 4, with and
// without sequence parallelism, for GPT-2's, NeoX's and Llama's blocks (GQA, RoPE, SwiGLU,
// RMSNorm), dp 2 × tp 2, tp 2 × pp 2, full recomputation, and the device's grouped rings; the
// strict device backend's run with the rings is the CPU's bit for bit; auto follows fp32's rule;
// tp_comm_ms and tp_exposed_ms are reported. Runs under mpirun with 2 ranks (tp 2) and 4 ranks (tp
// 4, and dp 2 × tp 2).
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "bf16_tp_deck.h"
#include "model/tp_overlap.h"
#include "ring_test_util.h"
#include "strict_zero_run.h"
#include "train_harness.h"
#include "trident/check.h"

namespace trident {
namespace {

using testing::world_size;

// tests/mpi/test_tp_bf16.cpp's model, 6 steps. The deck refuses bf16 on the CPU
// (Note [bf16 activations]): the host definitions of the bf16 ops run it here.
constexpr int kSteps = 6;

Deck bf16_deck(const std::string& family, const std::vector<std::string>& overrides) {
  return testing::bf16_tp_deck(family, overrides, kSteps);
}

// The bf16 rings alone, as tests/mpi/test_tp_overlap.cpp's TpRing checks fp32's: B 3 sequences
// of T 32 rows (pieces of 12+ rows, whose GEMM rows keep the whole GEMM's bits on OpenBLAS),
// C 16 in, OC 24 out. The gather ring equals the bf16 all-gather then one bf16 GEMM (forward,
// with the fused GELU, and the input gradient through DGELU) bit for bit, except DGELU's bias
// gradient, summed piece by piece (within 1e-6 of its largest); the reduce-scatter ring equals
// the fp32 GEMM then reduce-scatter to 1e-6 of the largest (tp 4 adds in ring order); each
// ring posts every receive before the previous step's compute, in 1 and 2 pieces, on the
// host's ring and the grouped one.
std::vector<bfloat16> halves(const std::vector<float>& x) {
  std::vector<bfloat16> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = to_bfloat16(x[i]);
  return h;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

float largest(const std::vector<float>& a) {
  float m = 0;
  for (float x : a) m = std::max(m, std::abs(x));
  return m;
}

TEST(Bf16TpRing, RingsEqualTheWholeCollectivesAndPostAhead) {
  const int tp = std::min(world_size(), 4);
  std::unique_ptr<MpiComm> comm = testing::first_ranks(tp, "tp (test)");
  if (!comm) return;
  const int B = 3, T = 32, C = 16, OC = 24, N = B * T, Tl = T / tp, Nr = B * Tl;
  auto be = make_cpu_backend(1);
  std::vector<float> stage(size_t(N) * std::max(C, OC)), partial(stage.size());
  std::vector<bfloat16> stage16(size_t(N) * C);
  TpTimes times;
  const std::vector<bfloat16> local = halves(testing::random_values(size_t(Nr) * C, 11 + tp));
  const std::vector<bfloat16> w = halves(testing::random_values(size_t(OC) * C, 5));
  const std::vector<float> bias = testing::random_values(size_t(OC), 6);
  // The whole collectives: the bf16 rows gathered into [B, T, C], then one GEMM.
  std::vector<bfloat16> gathered(size_t(N) * C), full(size_t(N) * C);
  comm->all_gather(local.data(), gathered.data(), local.size()).wait();
  for (int r = 0; r < tp; ++r)
    for (int b = 0; b < B; ++b)
      std::copy_n(gathered.begin() + (long(r) * B + b) * Tl * C, size_t(Tl) * C,
                  full.begin() + (long(b) * T + r * Tl) * C);
  std::vector<bfloat16> want(size_t(N) * OC), want_pre(want.size());
  be->matmul_gelu_forward_bf16(want.data(), want_pre.data(), full.data(), w.data(), bias.data(), N,
                               C, OC);
  // Backward's use: dinp [N, OC] = DGELU(dout [N, C] · w) with the forward's pre-activation.
  std::vector<bfloat16> want_dinp(size_t(N) * OC);
  std::vector<float> want_dbias(size_t(OC), 0.0f);
  be->matmul_dgelu_backward_bf16(want_dinp.data(), want_dbias.data(), full.data(), w.data(),
                                 want_pre.data(), N, OC, C);
  // The row-parallel GEMM: inp [N, OC] bf16 · w2 [C, OC]ᵀ in fp32, reduce-scattered.
  const std::vector<bfloat16> w2 = halves(testing::random_values(size_t(C) * OC, 7));
  std::vector<float> sums(size_t(N) * C), want_rows(size_t(Nr) * C), packed(sums.size());
  be->matmul_forward_add_bf16(sums.data(), nullptr, want.data(), w2.data(), nullptr, N, OC, C);
  for (int r = 0; r < tp; ++r)  // [r][b][t] = sums[b][r·Tl + t], as start_reduce_rows packs
    for (int b = 0; b < B; ++b)
      std::copy_n(sums.begin() + (long(b) * T + r * Tl) * C, size_t(Tl) * C,
                  packed.begin() + (long(r) * B + b) * Tl * C);
  comm->reduce_scatter(packed.data(), want_rows.data(), want_rows.size()).wait();
  for (bool grouped : {false, true})
    for (int pieces : {1, 2})
      for (bool late : {false, true}) {
        SCOPED_TRACE(fmt::format("grouped {}, pieces {}, late {}", grouped, pieces, late));
        TensorParallel t{comm.get(), tp, comm->rank(), true, true, pieces};
        if (grouped) t.ring = comm.get();
        TpOverlap ring(*be, t, N, size_t(std::max(C, OC)), stage.data(), partial.data(), times);
        ring.set_stage16(stage16.data());
        ring.post_after_compute(late);
        ring.record_events(true);
        std::vector<bfloat16> out(want.size()), pre(want.size()), in_full(full.size());
        ring.gather_matmul_bf16(
            out.data(), in_full.data(), local.data(),
            {.w = w.data(), .bias = bias.data(), .OC = OC, .pre_out = pre.data()}, B, T, C);
        EXPECT_EQ(0, std::memcmp(out.data(), want.data(), out.size() * 2)) << "forward";
        EXPECT_EQ(0, std::memcmp(pre.data(), want_pre.data(), pre.size() * 2)) << "pre";
        EXPECT_EQ(0, std::memcmp(in_full.data(), full.data(), full.size() * 2)) << "gathered";
        std::vector<bfloat16> dinp(want_dinp.size());
        std::vector<float> dbias(size_t(OC), 0.0f);
        ring.gather_matmul_bf16(dinp.data(), nullptr, local.data(),
                                {.w = w.data(),
                                 .dbias = dbias.data(),
                                 .OC = OC,
                                 .input_gradient = true,
                                 .pre_in = want_pre.data()},
                                B, T, C);
        EXPECT_EQ(0, std::memcmp(dinp.data(), want_dinp.data(), dinp.size() * 2)) << "dinp";
        EXPECT_LE(max_abs_diff(dbias, want_dbias), 1e-6f * largest(want_dbias)) << "dbias";
        std::vector<float> rows(want_rows.size());
        ring.matmul_reduce_scatter_bf16(rows.data(), want.data(), w2.data(), nullptr, B, T, OC, C);
        EXPECT_LE(max_abs_diff(rows, want_rows), 1e-6f * largest(want_rows)) << "reduce-scatter";
        EXPECT_EQ(RingEvents::receives_posted_ahead(ring.events(), 1, tp - 1), !late);
      }
}

// Bounds. Bitwise where the order of every sum is unchanged: without sequence parallelism in
// one piece (parallel.tp_overlap_chunks 1: the same GEMM and all-reduce, and backward's bulk
// sums are the same collectives moved beside the weight-gradient GEMMs), at tp 2 and tp 4.
// Else a piece's GEMM has fewer rows (OpenBLAS's small-matrix kernels then sum in another
// order: in 2 pieces at tp 2 without SP the bits differ), the ring adds partials in ring order
// (tp 4), and GPT-2's fc bias gradient sums piece by piece; an fp32 difference near a bf16
// rounding boundary then moves a value by one bf16 ulp (2^-8 relative), and what follows.
// Measured over these families and layouts (6 steps, tp 2, tp 4, dp 2 × tp 2): losses within
// 3.3e-5 relative, gradient norms within 9.3e-4. Weights: GPT-2's and NeoX's key biases have
// a gradient of rounding noise only (softmax ignores a shift of every key score), which AdamW
// turns into steps of up to lr either way: the largest weight change 8.0e-3 of the largest
// weight, and 1.1e-3 of this rank's weights (about the key biases' share) beyond 1e-4 of it;
// Llama (no biases): within 1.8e-4, 9.7e-5 of its weights beyond 1e-4. Bounds: losses 1e-4,
// norms 5e-3, largest weight change 2e-2 (lr · steps = 1.8e-2), the share moved 2.5e-3.
constexpr double kLossRel = 1e-4, kNormRel = 5e-3, kParamRel = 2e-2, kMovedShare = 2.5e-3;
constexpr float kMovedRel = 1e-4f;

struct Measured {
  double loss = 0, norm = 0, param = 0, moved = 0;  // moved: the share beyond kMovedRel
};

Measured compare(const testing::RunResult& on, const testing::RunResult& off) {
  Measured m;
  EXPECT_EQ(on.losses.size(), off.losses.size());
  for (size_t i = 0; i < on.losses.size() && i < off.losses.size(); ++i) {
    m.loss = std::max(m.loss, std::abs(on.losses[i] - off.losses[i]) / std::abs(off.losses[i]));
    m.norm = std::max(m.norm, std::abs(on.norms[i] - off.norms[i]) / std::abs(off.norms[i]));
  }
  m.param = testing::max_param_error(on.params, off.params);
  float scale = 0;
  for (float x : off.params) scale = std::max(scale, std::abs(x));
  size_t moved = 0;
  for (size_t i = 0; i < on.params.size() && i < off.params.size(); ++i)
    moved += std::abs(on.params[i] - off.params[i]) > kMovedRel * scale;
  m.moved = double(moved) / double(std::max<size_t>(1, off.params.size()));
  return m;
}

void expect_same(const testing::RunResult& on, const testing::RunResult& off, bool bitwise) {
  const Measured m = compare(on, off);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    fmt::print("  measured: loss {:.2e}, norm {:.2e}, weights {:.2e}, moved {:.2e} ({})\n", m.loss,
               m.norm, m.param, m.moved, bitwise ? "bitwise expected" : "bounded");
  if (bitwise) {
    testing::expect_bitwise(on, off);
    return;
  }
  EXPECT_LE(m.loss, kLossRel);
  EXPECT_LE(m.norm, kNormRel);
  EXPECT_LE(m.param, kParamRel);
  EXPECT_LE(m.moved, kMovedShare);
}

// kSteps steps with the model's rings on or off; `ring`: the device's grouped rings over MPI
// (TrainContext::tp_ring, as tests/mpi/test_tp_overlap.cpp's run_grouped).
testing::RunResult run(const std::string& family, std::vector<std::string> keys, bool overlap,
                       const GridLayout& g, bool grouped = false) {
  ProcessGrid grid(g);
  keys.push_back(fmt::format("parallel.tp_overlap={}", overlap));
  TrainContext context{nullptr, 1e9, &grid, nullptr};
  std::unique_ptr<MpiComm> ring;
  if (grouped) {
    ring = MpiComm::duplicate(grid.tp().raw(), "tp ring (test)");
    context.tp_ring = ring.get();
  }
  return testing::run_steps_in(bf16_deck(family, keys), context, kSteps, [&](int s, Trainer& t) {
    if (s == 0) EXPECT_EQ(t.model().tp_overlap() != nullptr, overlap);  // else proves nothing
  });
}

class Bf16TpOverlap : public ::testing::TestWithParam<std::string> {
 protected:
  // bitwise: Note the bounds above (one piece without SP).
  void check(int dp, int tp, bool sp, std::vector<std::string> extra = {}, bool grouped = false,
             bool bitwise = false, int pp = 1) const {
    if (world_size() != dp * tp * pp) GTEST_SKIP() << "needs " << dp * tp * pp << " ranks";
    SCOPED_TRACE(fmt::format("{}: dp {} tp {} pp {} sp {} {}{}", GetParam(), dp, tp, pp, sp,
                             fmt::join(extra, " "), grouped ? " grouped" : ""));
    extra.push_back(fmt::format("parallel.tp={}", tp));
    extra.push_back(fmt::format("parallel.pp={}", pp));
    extra.push_back(fmt::format("parallel.sequence_parallel={}", sp));
    const GridLayout g = make_layout(world_size(), dp, tp, pp);
    expect_same(run(GetParam(), extra, true, g, grouped), run(GetParam(), extra, false, g),
                bitwise);
  }
};

TEST_P(Bf16TpOverlap, AllRanksTp) { check(1, world_size(), false); }
TEST_P(Bf16TpOverlap, AllRanksTpInOnePieceBitwise) {
  check(1, world_size(), false, {"parallel.tp_overlap_chunks=1"}, false, true);
}
TEST_P(Bf16TpOverlap, AllRanksTpSequenceParallel) { check(1, world_size(), true); }
// Full recomputation runs the block's rings again in backward; accumulation and a tied head.
TEST_P(Bf16TpOverlap, AllRanksTpRecomputeAccumulation) {
  check(1, world_size(), true, {"train.recompute=full", "train.accum=2", "model.tied_head=true"});
}
TEST_P(Bf16TpOverlap, AllRanksTpGroupedRings) { check(1, world_size(), true, {}, true); }
// One sequence a micro-batch: a piece's GEMM writes its rows of the output in place.
TEST_P(Bf16TpOverlap, AllRanksTpOneSequence) {
  check(1, world_size(), true, {"train.micro_batch=1", "train.accum=2"});
}
TEST_P(Bf16TpOverlap, Dp2Tp2) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check(2, 2, false, {"parallel.tp_overlap_chunks=1"}, false, true);
  check(2, 2, false);
  check(2, 2, true);
}

// Pipeline stages: a stage's input and output are this rank's fp32 rows of the residual.
TEST_P(Bf16TpOverlap, Tp2Pp2) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check(1, 2, true, {"parallel.schedule=1f1b", "train.accum=2"}, false, false, 2);
  check(1, 2, false, {"parallel.schedule=1f1b", "train.accum=2", "parallel.tp_overlap_chunks=1"},
        false, true, 2);
}

// With context parallelism (tp 2 × cp 2) and a mixture (tp 2 with SP, dp 2): the attention
// half's rings as the dense block's; a mixture layer's MLP half has no tp collective
// (Note [Widening under tp]).
TEST(Bf16TpOverlapWidened, CpAndMixture) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const GridLayout cp = complete_layout({.world = 4, .tp = 2, .cp = 2});
  for (const char* mode : {"ring", "allgather"}) {
    const std::vector<std::string> k = {"parallel.tp=2", "parallel.cp=2",
                                        fmt::format("parallel.cp_comm={}", mode),
                                        "parallel.sequence_parallel=true"};
    SCOPED_TRACE(fmt::format("llama tp 2 cp 2 {}", mode));
    expect_same(run("llama", k, true, cp), run("llama", k, false, cp), false);
  }
  const GridLayout dp = make_layout(4, 2, 2, 1);
  const std::vector<std::string> k = {"model.family=mixtral", "model.moe.experts=4",
                                      "model.moe.top_k=2",    "model.moe.ffn_width=32",
                                      "parallel.tp=2",        "parallel.sequence_parallel=true"};
  SCOPED_TRACE("mixtral dp 2 tp 2");
  expect_same(run("llama", k, true, dp), run("llama", k, false, dp), false);
}

INSTANTIATE_TEST_SUITE_P(Families, Bf16TpOverlap, ::testing::Values("gpt2", "neox", "llama"),
                         [](const auto& info) { return std::string(info.param); });

// The strict device backend (no host access to device memory; tp's device communicator and a
// second one as the rings' own stream, as a device run's NcclComm) with the rings runs the
// same ops in the same order as the CPU's grouped rings: bit for bit, allocating nothing after
// step 1. Untied heads, as tests/mpi/test_tp_bf16.cpp's strict test.
void expect_strict_equals_cpu(const std::string& family, int tp, std::vector<std::string> extra) {
  SCOPED_TRACE(fmt::format("{} tp {} {}", family, tp, fmt::join(extra, " ")));
  ProcessGrid grid(testing::layout_of(tp, 1));
  extra.push_back(fmt::format("parallel.tp={}", tp));
  extra.push_back("parallel.tp_overlap=true");
  extra.push_back("model.tied_head=false");
  const Deck d = bf16_deck(family, extra);
  auto cpu = make_cpu_backend(1);
  std::unique_ptr<MpiComm> cpu_ring = MpiComm::duplicate(grid.tp().raw(), "tp ring (test)");
  TrainContext on_cpu{nullptr, 1e9, &grid};
  on_cpu.tp_ring = cpu_ring.get();
  const testing::StrictOutcome want = testing::train_outcome(*cpu, d, on_cpu);
  testing::StrictDeviceBackend strict;
  testing::StrictComms comms(strict, grid, tp, 1);
  std::unique_ptr<MpiComm> host_ring = MpiComm::duplicate(grid.tp().raw(), "tp ring host (test)");
  testing::StrictDeviceComm ring(strict, *host_ring);
  TrainContext ctx{nullptr, 1e9, &grid};
  comms.attach(ctx);
  ctx.tp_ring = &ring;
  const testing::StrictOutcome got = testing::train_outcome(strict, d, ctx);
  EXPECT_TRUE(want.tp_rings && got.tp_rings) << "the rings are off";
  testing::expect_same_outcome(got, want);
}

TEST(Bf16TpOverlapDevice, StrictDeviceEqualsTheCpuBitForBit) {
  const int tp = world_size() == 4 ? 2 : world_size();  // dp 2 × tp 2 on 4 ranks
  expect_strict_equals_cpu("gpt2", tp, {"parallel.sequence_parallel=true"});
  expect_strict_equals_cpu("llama", tp, {"parallel.sequence_parallel=false"});
  expect_strict_equals_cpu("llama", tp, {"parallel.sequence_parallel=true", "train.accum=2"});
}

// auto by fp32's rule (Note [Chunks on the host]): off on one node's shared memory, on where the
// emulated link slows tp; true runs the rings. With them on, each step reports the tp
// collectives' time (tp_comm_ms, the emulated wire's) and the part the compute waited for.
TEST(Bf16TpOverlapSettings, AutoFollowsFp32AndTimesAreReported) {
  const int tp = world_size() == 4 ? 4 : 2;
  ProcessGrid grid(make_layout(world_size(), 0, tp, 1));
  auto be = make_cpu_backend(1);
  auto deck = [&](std::vector<std::string> o) {
    o.push_back(fmt::format("parallel.tp={}", tp));
    o.push_back("parallel.sequence_parallel=true");
    return bf16_deck("llama", o);
  };
  auto engaged = [&](const std::vector<std::string>& o) {
    Trainer t(deck(o), TrainContext{be.get(), 1e9, &grid, nullptr});
    return t.model().tp_overlap() != nullptr;
  };
  EXPECT_FALSE(engaged({}));  // the default is auto
  EXPECT_FALSE(engaged({"comm.emulate_gbps=100", "comm.emulate_groups=dp"}));
  EXPECT_TRUE(engaged({"parallel.tp_overlap=true"}));
  Trainer t(deck({"comm.emulate_gbps=100", "comm.emulate_groups=tp"}),
            TrainContext{be.get(), 1e9, &grid, nullptr});
  ASSERT_NE(t.model().tp_overlap(), nullptr) << "auto left the rings off on an emulated tp link";
  for (int s = 0; s < 2; ++s) {
    const StepStats st = t.train_step(s);
    EXPECT_GT(st.tp_comm_ms, 0.0) << "step " << s + 1;
    EXPECT_GE(st.tp_exposed_ms, 0.0) << "step " << s + 1;
    EXPECT_TRUE(std::isfinite(st.tp_exposed_ms));
  }
}

}  // namespace
}  // namespace trident
