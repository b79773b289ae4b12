// Tensor-parallel overlap (Note [Tensor-parallel overlap] in src/model/tp_overlap.h):
//   - the rings post the receive of chunk s + 1 before the GEMM of chunk s starts, and the
//     check can tell when they do not (the same rings told to post late must fail it);
//   - each chunked collective equals its plain twin (a GEMM then the whole collective);
//   - so do the device's rings in grouped exchanges (Note [Tensor-parallel ring on a device]),
//     run over MPI with a ring communicator, and they too post ahead and fail when told not to;
//   - training with parallel.tp_overlap equals training without it over 20 steps, in every
//     family and layout the issue names: bitwise at tp 2 (a sum of two partials is one
//     addition whichever rank's comes first), losses within 1e-6 at tp 4 (the ring adds in
//     another order than MPI's reduce-scatter); with the grouped rings too.
// Runs under mpirun with 2 ranks (tp 2) and 4 ranks (tp 4, dp 2 × tp 2, tp 2 × pp 2).
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "model/tp_overlap.h"
#include "ring_test_util.h"
#include "train_harness.h"
#include "trident/check.h"

namespace trident {
namespace {

using testing::first_ranks;
using testing::random_values;
using testing::world_size;

// Sizes of one chunked linear: B sequences of T rows, C in, OC out (a qkv-like width). Pieces of
// 12 rows and more: OpenBLAS may round a product of a few rows (3 here) differently.
struct Shape {
  int B = 3, T = 32, C = 16, OC = 24;
};

// All ranks' rows of a sequence-parallel tensor [B, T/tp, width] gathered into [B, T, width].
std::vector<float> gather_plain(MpiComm& comm, const std::vector<float>& local, int B, int T,
                                int width) {
  const int n = comm.size(), Tl = T / n;
  std::vector<float> stage(local.size() * size_t(n)), full(stage.size());
  comm.all_gather(local.data(), stage.data(), local.size()).wait();
  for (int r = 0; r < n; ++r)
    for (int b = 0; b < B; ++b)
      std::copy_n(stage.begin() + (long(r) * B + b) * Tl * width, size_t(Tl) * width,
                  full.begin() + (long(b) * T + r * Tl) * width);
  return full;
}

class TpRing : public ::testing::Test {
 protected:
  void SetUp() override {
    tp = std::min(world_size(), 4);
    comm = first_ranks(tp, "tp (test)");
    if (!comm) return;
    be = make_cpu_backend(1);
    N = s.B * s.T;
    stage.assign(size_t(N) * s.C, 0.0f);
    partial.assign(size_t(N) * s.C, 0.0f);
  }
  // `pieces` per ring chunk (whose B·T/tp rows they split across sequence boundaries); grouped:
  // the device's rings (Note [Tensor-parallel ring on a device]), here over the same MpiComm.
  TpOverlap make(bool sequence_parallel, int pieces, bool grouped = false) {
    TensorParallel t{comm.get(), tp, comm->rank(), sequence_parallel, true, pieces};
    if (grouped) t.ring = comm.get();
    return TpOverlap(*be, t, N, size_t(std::max(s.C, s.OC)), stage.data(), partial.data(), times);
  }
  // Each sequence-parallel ring: plain in 1 and 2 pieces, and grouped; each posting ahead and
  // told to post late. `check` runs it with its events recorded, `what` naming the variant.
  void each_variant(
      const std::function<void(TpOverlap&, const std::string& what, bool late)>& check) {
    for (bool grouped : {false, true})
      for (int pieces : {1, 2})
        for (bool late : {false, true}) {
          TpOverlap ring = make(true, pieces, grouped);
          ring.post_after_compute(late);
          ring.record_events(true);
          check(ring, fmt::format("late {}, pieces {}, grouped {}", late, pieces, grouped), late);
        }
  }
  int tp = 1, N = 0;
  Shape s;
  std::unique_ptr<MpiComm> comm;
  std::unique_ptr<Backend> be;
  std::vector<float> stage, partial;
  TpTimes times;
};

// The column-parallel ring (forward GEMM and backward's input gradient) equals all-gather then
// one GEMM, bit for bit (each row of a GEMM is the same dot products whatever rows it has), and
// posts each receive before the previous chunk's GEMM; told to post late, the check fails.
TEST_F(TpRing, GatherMatmulEqualsGatherThenGemmAndPostsAhead) {
  if (!comm) return;
  const int Tl = s.T / tp, Nr = s.B * Tl;
  const std::vector<float> local = random_values(size_t(Nr) * s.C, 11 + comm->rank());
  const std::vector<float> w = random_values(size_t(s.OC) * s.C, 5);
  const std::vector<float> bias = random_values(size_t(s.OC), 6);
  const std::vector<float> full = gather_plain(*comm, local, s.B, s.T, s.C);
  std::vector<float> want(size_t(N) * s.OC), want_dinp(size_t(N) * s.OC);
  be->matmul_forward(want.data(), full.data(), w.data(), bias.data(), N, s.C, s.OC);
  // Backward's use: dinp [N, OC] = dout [N, C] · w [C, OC] (w read as the layer's [C, OC]).
  be->matmul_backward(want_dinp.data(), nullptr, nullptr, full.data(), nullptr, w.data(), N, s.OC,
                      s.C);
  each_variant([&](TpOverlap& ring, const std::string& what, bool late) {
    std::vector<float> out(size_t(N) * s.OC), gathered(full.size());
    ring.gather_matmul(out.data(), gathered.data(), local.data(),
                       {w.data(), bias.data(), s.OC, false}, s.B, s.T, s.C);
    float worst = 0;
    for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::abs(out[i] - want[i]));
    EXPECT_EQ(worst, 0.0f) << what;
    EXPECT_EQ(gathered, full);
    EXPECT_EQ(RingEvents::receives_posted_ahead(ring.events(), 1, tp - 1), !late)
        << "forward, " << what;
    const size_t forward_events = ring.events().size();
    ring.gather_matmul(out.data(), gathered.data(), local.data(), {w.data(), nullptr, s.OC, true},
                       s.B, s.T, s.C);
    EXPECT_EQ(out, want_dinp);
    const std::vector<TpOverlap::EventRecord> backward(ring.events().begin() + long(forward_events),
                                                       ring.events().end());
    EXPECT_EQ(RingEvents::receives_posted_ahead(backward, 1, tp - 1), !late)
        << "input gradient, " << what;
  });
  EXPECT_GT(times.comm_ms, 0.0);
}

// The row-parallel ring equals one GEMM then MPI's reduce-scatter: bitwise at tp 2, within
// 1e-6 of the largest value at tp 4 (another order of the same additions).
TEST_F(TpRing, MatmulReduceScatterEqualsGemmThenReduceScatterAndPostsAhead) {
  if (!comm) return;
  const int Tl = s.T / tp, Nr = s.B * Tl, K = s.OC;
  const std::vector<float> inp = random_values(size_t(N) * K, 21 + comm->rank());
  const std::vector<float> w = random_values(size_t(s.C) * K, 7 + comm->rank());
  const std::vector<float> bias = random_values(size_t(s.C), 8);
  const float* b = comm->rank() == 0 ? bias.data() : nullptr;
  std::vector<float> partial_full(size_t(N) * s.C), staged(partial_full.size()),
      want(size_t(Nr) * s.C);
  be->matmul_forward(partial_full.data(), inp.data(), w.data(), b, N, K, s.C);
  for (int r = 0; r < tp; ++r)  // into [r][B][Tl][C] (Note [Sequence-parallel rows])
    for (int bb = 0; bb < s.B; ++bb)
      std::copy_n(partial_full.begin() + (long(bb) * s.T + r * Tl) * s.C, size_t(Tl) * s.C,
                  staged.begin() + (long(r) * s.B + bb) * Tl * s.C);
  comm->reduce_scatter(staged.data(), want.data(), want.size()).wait();
  float scale = 0;
  for (float x : want) scale = std::max(scale, std::abs(x));
  each_variant([&](TpOverlap& ring, const std::string& what, bool late) {
    std::vector<float> out(want.size());
    ring.matmul_reduce_scatter(out.data(), inp.data(), w.data(), b, s.B, s.T, K, s.C);
    if (tp == 2) {
      EXPECT_EQ(out, want);
    } else {
      float worst = 0;
      for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::abs(out[i] - want[i]));
      EXPECT_LE(worst, 1e-6f * scale);
    }
    // Grouped: step s's exchange is noted as step s + 1's receive, steps 1 … tp − 1 exchange.
    const int first = ring.grouped() ? 2 : 1;
    EXPECT_EQ(RingEvents::receives_posted_ahead(ring.events(), first, first + tp - 2), !late)
        << what;
  });
}

// Without sequence parallelism: the all-reduce in pieces equals the whole one (tp 2: bitwise).
TEST_F(TpRing, MatmulAllReduceInPiecesEqualsTheWholeOne) {
  if (!comm) return;
  const int K = s.OC;
  const std::vector<float> inp = random_values(size_t(N) * K, 31 + comm->rank());
  const std::vector<float> w = random_values(size_t(s.C) * K, 9 + comm->rank());
  std::vector<float> want(size_t(N) * s.C);
  be->matmul_forward(want.data(), inp.data(), w.data(), nullptr, N, K, s.C);
  comm->all_reduce(want.data(), want.size()).wait();
  float scale = 0;
  for (float x : want) scale = std::max(scale, std::abs(x));
  for (bool grouped : {false, true}) {  // grouped: the device's order, over the same MpiComm
    TensorParallel t{comm.get(), tp, comm->rank(), false, true, 4};  // 4 pieces of 6 rows
    if (grouped) t.ring = comm.get();
    TpOverlap pieces(*be, t, N, 0, nullptr, nullptr, times);
    ASSERT_EQ(pieces.chunks(), 4);
    std::vector<float> out(want.size());
    pieces.matmul_all_reduce(out.data(), inp.data(), w.data(), nullptr, N, K, s.C);
    float worst = 0;
    for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::abs(out[i] - want[i]));
    if (tp == 2) EXPECT_EQ(worst, 0.0f) << "grouped " << grouped;
    EXPECT_LE(worst, 1e-6f * scale) << "grouped " << grouped;
  }
}

// ---- Training: parallel.tp_overlap true against false, 20 steps ---------------------------

// The family's keys for the small layout deck; mixtral: half its MLPs mixtures, so that both
// kinds of block run under tp.
std::vector<std::string> keys(const std::string& family) {
  if (family != "mixtral") return testing::family_keys(family);
  const bool four = world_size() >= 4;
  return {"model.family=mixtral",
          four ? "model.heads=8" : "model.heads=4",
          four ? "model.kv_heads=4" : "model.kv_heads=2",
          "model.mlp_hidden=64",
          "model.moe.experts=4",
          "model.moe.top_k=2",
          "model.moe.ffn_width=32",
          "model.moe.every=2"};
}

Deck overlap_deck(const std::string& family, const std::vector<std::string>& layout, bool overlap) {
  std::vector<std::string> o = keys(family);
  o.insert(o.end(), layout.begin(), layout.end());
  o.push_back("train.steps=20");
  o.push_back(fmt::format("parallel.tp_overlap={}", overlap));
  return testing::small_layout_deck(o);
}

testing::RunResult run(const std::string& family, const std::vector<std::string>& layout,
                       bool overlap, const GridLayout& g) {
  ProcessGrid grid(g);
  // The model runs the chunked collectives exactly when asked (else equality proves nothing).
  return testing::run_steps(overlap_deck(family, layout, overlap), &grid, 20, [&](int, Trainer& t) {
    EXPECT_EQ(t.model().tp_overlap() != nullptr, overlap);
  });
}

// The device's grouped rings (Note [Tensor-parallel ring on a device]) over MPI: the Trainer is
// given a second communicator over the tp ranks as its ring (TrainContext::tp_ring), as a
// device run is given its own-stream NcclComm.
testing::RunResult run_grouped(const std::string& family, const std::vector<std::string>& layout,
                               const GridLayout& g) {
  ProcessGrid grid(g);
  MPI_Comm dup = MPI_COMM_NULL;
  TRIDENT_MPI(MPI_Comm_dup(grid.tp().raw(), &dup));
  MpiComm ring(dup, "tp ring (test)");
  TrainContext context{nullptr, 1e9, &grid, nullptr};
  context.tp_ring = &ring;
  return testing::run_steps_in(overlap_deck(family, layout, true), context, 20,
                               [](int step, Trainer& t) {
                                 if (step == 0) EXPECT_NE(t.model().tp_overlap(), nullptr);
                               });
}

// Bitwise at tp 2 without sequence parallelism. At tp 4 the ring's sums round differently
// (by ~1 ulp). With sequence parallelism the ring's GEMMs take a chunk's rows; on OpenBLAS's
// AVX-512 kernels (Cooperlake, SkylakeX), which trident runs on such CPUs and so do the tests
// (Note [Tests' BLAS core]), this deck's chunks are small enough for the small-matrix path
// (about M·N·K ≤ 100³; 16×64×256 against the whole 64×64×256 changed 3725 of 4096 sums),
// which sums in another order; Prescott's SSE kernel has no such path. 20 AdamW steps carry
// that on: losses within the 1e-6 relative; gradient norms within 1e-4 (1e-3 with
// mixtures, whose router turns a rounding difference at a near-tie into another expert: 8e-5
// seen at step 16); final weights within 1e-5 of the largest (4.1e-6 seen: AdamW moves a
// weight whose gradient is rounding noise by up to lr, whatever the noise's size).
void expect_same(const testing::RunResult& on, const testing::RunResult& off, bool bitwise,
                 bool mixture) {
  if (bitwise) {
    testing::expect_bitwise(on, off);
    return;
  }
  testing::expect_close(on, off, 1e-6, mixture ? 1e-3 : 1e-4);
  EXPECT_LE(testing::max_param_error(on.params, off.params), 1e-5);
}

class TpOverlapTraining : public ::testing::TestWithParam<std::string> {
 protected:
  // grouped: the overlap's rings in the device's order (run_grouped).
  void check(int dp, int tp, int pp, const std::vector<std::string>& layout,
             bool grouped = false) const {
    if (world_size() != dp * tp * pp) GTEST_SKIP() << "needs " << dp * tp * pp << " ranks";
    const bool sp =
        std::find(layout.begin(), layout.end(), "parallel.sequence_parallel=true") != layout.end();
    std::vector<std::string> l = layout;
    l.push_back(fmt::format("parallel.tp={}", tp));
    l.push_back(fmt::format("parallel.pp={}", pp));
    const GridLayout g = make_layout(world_size(), dp, tp, pp);
    expect_same(grouped ? run_grouped(GetParam(), l, g) : run(GetParam(), l, true, g),
                run(GetParam(), l, false, g), tp == 2 && !sp, GetParam() == "mixtral");
  }
};

// Mixtures with tp need sequence parallelism (Note [Mixtures and tp]), so the layouts without
// it run the dense families only.
class TpOverlapDenseTraining : public TpOverlapTraining {};

TEST_P(TpOverlapTraining, Tp2SequenceParallel) {
  check(1, 2, 1, {"parallel.sequence_parallel=true"});
}
TEST_P(TpOverlapTraining, Tp2SequenceParallelInFourPieces) {
  check(1, 2, 1, {"parallel.sequence_parallel=true", "parallel.tp_overlap_chunks=4"});
}
TEST_P(TpOverlapTraining, Tp2SequenceParallelRecompute) {
  check(1, 2, 1, {"parallel.sequence_parallel=true", "train.recompute=full"});
}
TEST_P(TpOverlapTraining, Tp4SequenceParallel) {
  check(1, 4, 1, {"parallel.sequence_parallel=true"});
}
TEST_P(TpOverlapTraining, Tp2SequenceParallelGrouped) {
  check(1, 2, 1, {"parallel.sequence_parallel=true"}, true);
}
TEST_P(TpOverlapTraining, Tp4SequenceParallelGrouped) {
  check(1, 4, 1, {"parallel.sequence_parallel=true"}, true);
}
TEST_P(TpOverlapTraining, Dp2Tp2SequenceParallel) {
  check(2, 2, 1, {"parallel.sequence_parallel=true"});
}
TEST_P(TpOverlapTraining, Tp2Pp2SequenceParallel) {
  check(1, 2, 2, {"parallel.sequence_parallel=true"});
}
// The zero-bubble schedule splits backward (backward_input, then backward_weight; a mixture's
// gradients all in B: Note [Mixtures in B]).
TEST_P(TpOverlapTraining, Tp2Pp2ZeroBubble) {
  check(1, 2, 2, {"parallel.sequence_parallel=true", "parallel.schedule=zb-h1"});
}
TEST_P(TpOverlapDenseTraining, Tp2) { check(1, 2, 1, {}); }
TEST_P(TpOverlapDenseTraining, Tp2InFourPieces) {
  check(1, 2, 1, {"parallel.tp_overlap_chunks=4"});
}
TEST_P(TpOverlapDenseTraining, Tp2RecomputeMlp) { check(1, 2, 1, {"train.recompute=mlp"}); }
TEST_P(TpOverlapDenseTraining, Tp4) { check(1, 4, 1, {}); }
TEST_P(TpOverlapDenseTraining, Tp2Grouped) { check(1, 2, 1, {}, true); }
TEST_P(TpOverlapDenseTraining, Dp2Tp2) { check(2, 2, 1, {}); }

INSTANTIATE_TEST_SUITE_P(Families, TpOverlapTraining,
                         ::testing::Values("gpt2", "neox", "llama", "mixtral"),
                         [](const auto& info) { return std::string(info.param); });
INSTANTIATE_TEST_SUITE_P(Families, TpOverlapDenseTraining,
                         ::testing::Values("gpt2", "neox", "llama"),
                         [](const auto& info) { return std::string(info.param); });

// parallel.tp_overlap auto (Note [Chunks on the host]): off on one node's shared memory, where
// the chunks cannot win, on when the emulated link slows tp.
TEST(TpOverlapSettings, AutoIsOnWhereItWins) {
  const int tp = std::min(world_size(), 2);
  if (tp < 2) GTEST_SKIP();
  auto engaged = [&](std::vector<std::string> o) {
    o.push_back("parallel.tp=2");
    o.push_back("parallel.sequence_parallel=true");
    ProcessGrid grid(make_layout(world_size(), 0, tp, 1));
    bool on = false;
    testing::run_steps(testing::small_layout_deck(o), &grid, 1,
                       [&](int, Trainer& t) { on = t.model().tp_overlap() != nullptr; });
    return on;
  };
  EXPECT_FALSE(engaged({}));  // the default is auto
  EXPECT_TRUE(engaged({"comm.emulate_gbps=100", "comm.emulate_groups=dp,tp"}));
  EXPECT_FALSE(engaged({"comm.emulate_gbps=100", "comm.emulate_groups=dp"}));
  EXPECT_TRUE(engaged({"parallel.tp_overlap=true"}));
}

// Bad settings exit with the numbers: pieces that do not divide a rank's rows of a sequence,
// with and without sequence parallelism.
TEST(TpOverlapSettings, RefusesChunksThatDoNotSplitTheRows) {
  const int tp = std::min(world_size(), 2);
  if (tp < 2) GTEST_SKIP();
  const GridLayout g = make_layout(world_size(), 0, tp, 1);
  auto message = [&](const std::vector<std::string>& layout) -> std::string {
    try {
      run("gpt2", layout, true, g);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::kBadInput) << e.what();
      return e.what();
    }
    return "";
  };
  const std::string pieces = message({"parallel.tp=2", "parallel.tp_overlap_chunks=3"});
  EXPECT_NE(pieces.find("tp_overlap_chunks 3 does not divide the sequence shard: 16 rows"),
            std::string::npos)
      << pieces;
  const std::string ring =
      message({"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.tp_overlap_chunks=3"});
  EXPECT_NE(ring.find("tp_overlap_chunks 3 does not divide the sequence shard: 8 rows"),
            std::string::npos)
      << ring;
}

}  // namespace
}  // namespace trident
