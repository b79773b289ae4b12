// Pipeline parallelism, alone and in 3D layouts, equals the single-rank run; GPipe, 1F1B and
// ZB-H1 are bitwise identical, and so are recomputation on and off.
// Runs under mpirun with 2, 4 and 8 ranks (the 8-rank run is dp 2 × tp 2 × pp 2).
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstring>

#include "train_harness.h"
#include "trident/check.h"

namespace trident {
namespace {

using testing::expect_bitwise;
using testing::expect_close;
using testing::world_size;
using Result = testing::RunResult;

Deck deck(std::vector<std::string> overrides) {
  const std::string yaml = R"(
model: {layers: 4, d_model: 32, heads: 4, vocab: 250, seq_len: 16}
train: {micro_batch: 2, accum: 4, steps: 10, lr: 3.0e-3, warmup_steps: 3, seed: 11,
        val_every: 0}
data: {train: inputs/data/tiny-train.bin, shuffle: true}
run: {threads: 1}
)";
  return parse_deck(yaml, TRIDENT_SOURCE_DIR, overrides);
}

Result train(const Deck& d, ProcessGrid* grid, int steps) {
  return testing::run_steps(d, grid, steps);
}

Result train_layout(int dp, int tp, int pp, std::vector<std::string> extra = {}) {
  ProcessGrid grid(make_layout(world_size(), dp, tp, pp));
  extra.push_back(fmt::format("parallel.tp={}", tp));
  extra.push_back(fmt::format("parallel.pp={}", pp));
  return train(deck(extra), &grid, 10);
}

// Single-rank reference with the same global batch (dp micro-batches become accumulation).
Result reference(int dp) {
  return train(deck({fmt::format("train.accum={}", 4 * dp)}), nullptr, 10);
}

// Same bounds as the dp and tp tests (testing::expect_close): fp32 sums in another order (the
// tied embedding's two halves summed across stages, tp partial sums), 1e-5 relative on the loss
// over 10 steps.

TEST(Pipeline, AllRanksPpEqualsOneRank) {
  const int world = world_size();
  if (world > 4) GTEST_SKIP() << "4 layers: at most 4 stages";
  expect_close(train_layout(1, 1, world), reference(1));
}

TEST(Pipeline, Tp2Pp2EqualsOneRank) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  expect_close(train_layout(1, 2, 2), reference(1));
  expect_close(train_layout(1, 2, 2, {"parallel.sequence_parallel=true"}), reference(1));
}

TEST(Pipeline, Dp2Pp2EqualsOneRank) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  expect_close(train_layout(2, 1, 2), reference(2));
}

TEST(Pipeline, Dp2Tp2Pp2EqualsOneRank) {
  if (world_size() != 8) GTEST_SKIP() << "needs 8 ranks";
  expect_close(train_layout(2, 2, 2), reference(2));
}

TEST(Pipeline, GPipeAnd1F1BAreBitwiseIdentical) {
  const int world = world_size();
  const int pp = world >= 4 ? 4 : world, dp = world / pp;
  const Result one_f = train_layout(dp, 1, pp, {"parallel.schedule=1f1b"});
  const Result gpipe = train_layout(dp, 1, pp, {"parallel.schedule=gpipe"});
  expect_bitwise(one_f, gpipe);
}

// Trains the layout with `extra` plus `schedule`, and with `extra` under 1f1b; checks that
// they agree (bitwise, or within expect_close's bounds) and returns the first.
Result against_1f1b(int dp, int tp, int pp, const std::vector<std::string>& extra,
                    const std::vector<std::string>& schedule, bool bitwise) {
  SCOPED_TRACE(fmt::format("dp {} tp {} pp {} {} {}", dp, tp, pp, fmt::join(schedule, " "),
                           fmt::join(extra, " ")));
  std::vector<std::string> with = extra, one_f = extra;
  with.insert(with.end(), schedule.begin(), schedule.end());
  one_f.push_back("parallel.schedule=1f1b");
  const Result r = train_layout(dp, tp, pp, with);
  if (bitwise) expect_bitwise(r, train_layout(dp, tp, pp, one_f));
  else expect_close(r, train_layout(dp, tp, pp, one_f));
  return r;
}

// Note [Split backward] (model/gpt_backward.cpp): B then W is backward's bits, W's run in
// micro-batch order, so zb-h1 equals 1f1b bitwise — with tp and sequence parallelism (W
// gathers the kept rows again), with dp (the reducer's events come from W), on one stage
// (embedding and head together: wte's two contributions in 1f1b's order, the sparse one
// through the row sink with dp).
TEST(Pipeline, ZeroBubbleH1IsBitwise1F1BAndEqualsOneRank) {
  const int world = world_size();
  auto both = [&](int dp, int tp, int pp, std::vector<std::string> extra) {
    return against_1f1b(dp, tp, pp, extra, {"parallel.schedule=zb-h1"}, /*bitwise=*/true);
  };
  {
    SCOPED_TRACE("one rank");
    const Result z = train(deck({"parallel.schedule=zb-h1"}), nullptr, 10);
    expect_bitwise(z, reference(1));
  }
  if (world <= 4) expect_close(both(1, 1, world, {}), reference(1));
  if (world == 2) expect_close(both(2, 1, 1, {}), reference(2));
  if (world == 4) {
    expect_close(both(1, 2, 2, {"parallel.sequence_parallel=true"}), reference(1));
    expect_close(both(2, 1, 2, {}), reference(2));
  }
  if (world == 8) {
    expect_close(both(2, 2, 2, {}), reference(2));
    expect_close(both(2, 2, 2, {"parallel.sequence_parallel=true"}), reference(2));
  }
}

// Note [Interleaved 1F1B] (train/pipeline_schedule.cpp): each chunk's passes run in
// micro-batch order, so every gradient accumulates in 1F1B's order — but the stages hold other
// layers (stage 0 of 2: blocks 0 and 2, not 0 and 1), so the gradient norm's per-stage partial
// sums differ and the comparison is within the usual bounds, not bitwise: against 1f1b and
// against one rank, at pp 2 and 4, with tp and sequence parallelism, with dp, with uneven
// chunks.
TEST(Pipeline, InterleavedEqualsOneFOneBAndOneRank) {
  const int world = world_size();
  auto both = [&](int dp, int tp, int pp, std::vector<std::string> extra) {
    return against_1f1b(dp, tp, pp, extra,
                        {"parallel.schedule=interleaved", "parallel.virtual_stages=2"},
                        /*bitwise=*/false);
  };
  const std::vector<std::string> eight = {"model.layers=8", "train.accum=8"};
  if (world == 2) {
    expect_close(both(1, 1, 2, {}), reference(1));
    const std::vector<std::string> six = {"model.layers=6"};
    std::vector<std::string> uneven = six;
    for (const char* k : {"parallel.schedule=interleaved", "parallel.virtual_stages=2",
                          "parallel.stage_layers=2,1,1,2"})
      uneven.push_back(k);
    expect_close(train_layout(1, 1, 2, uneven), train(deck(six), nullptr, 10));
  }
  if (world == 4) {
    expect_close(both(1, 1, 4, eight), train(deck(eight), nullptr, 10));
    expect_close(both(1, 2, 2, {"parallel.sequence_parallel=true"}), reference(1));
    expect_close(both(2, 1, 2, {}), reference(2));
  }
  if (world == 8) expect_close(both(2, 2, 2, {}), reference(2));
}

TEST(Pipeline, ZeroBubbleH1RefusesRecompute) {
  try {
    train(deck({"parallel.schedule=zb-h1", "train.recompute=mlp"}), nullptr, 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("parallel.schedule: zb-h1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("train.recompute: mlp"), std::string::npos) << msg;
  }
}

TEST(Pipeline, RecomputeOnAndOffAreBitwiseIdentical) {
  const int world = world_size();
  const int pp = 2, tp = world >= 4 ? 2 : 1, dp = world / (pp * tp);
  const Result none = train_layout(dp, tp, pp, {"train.recompute=none"});
  expect_bitwise(none, train_layout(dp, tp, pp, {"train.recompute=mlp"}));
  expect_bitwise(none, train_layout(dp, tp, pp, {"train.recompute=full"}));
}

TEST(Pipeline, UnevenStageLayers) {
  if (world_size() != 2) GTEST_SKIP() << "needs 2 ranks";
  expect_close(train_layout(1, 1, 2, {"parallel.stage_layers=3,1"}), reference(1));
}

TEST(Pipeline, ValidationEqualsOneRank) {
  // Forward-only through the stages (run_pipeline_forward), dealt over dp.
  const int world = world_size();
  const int pp = 2, dp = world / pp;
  auto be = make_cpu_backend(1);
  const std::vector<std::string> valid = {
      std::string("data.valid=") + TRIDENT_SOURCE_DIR + "/inputs/data/tiny-valid.bin",
      "train.val_batches=4"};
  auto with = [&](std::vector<std::string> extra) {
    for (const auto& v : valid) extra.push_back(v);
    return deck(extra);
  };
  Trainer one(with({fmt::format("train.accum={}", 4 * dp)}),
              TrainContext{be.get(), 1e9, nullptr, nullptr});
  one.train_step(0);
  ProcessGrid grid(make_layout(world, dp, 1, pp));
  Trainer piped(with({"parallel.pp=2"}), TrainContext{be.get(), 1e9, &grid, nullptr});
  piped.train_step(0);
  const double ref = one.validate(), got = piped.validate();
  EXPECT_NEAR(got, ref, 1e-5 * ref);
}

}  // namespace
}  // namespace trident
