// The GPT-NeoX and Llama blocks (model.family, testing::family_keys) in every layout GPT-2 is
// tested in equal the single-rank run of the same family, within the bounds of GPT-2's own
// tests: pp under its four schedules, dp with overlap and bf16 gradients, ZeRO-1 and ZeRO-2,
// recomputation, and checkpoints that load in another layout (tp: test_tp_training.cpp, over
// the same families). Their untied head builds nothing of the tied embedding
// (train/tied_embedding.h). Runs under mpirun with 2 and 4 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "train_harness.h"

namespace trident {
namespace {

using testing::expect_bitwise;
using testing::expect_close;
using testing::RunResult;
using testing::world_size;

// Runs `steps` steps; params are this rank's tensors back to back without the buffer's padding
// (ZeRO pads the buffer, the replicated optimizer does not).
RunResult run(const Deck& d, ProcessGrid* grid, int steps) {
  auto be = make_cpu_backend(d.run.threads);
  Trainer t(d, TrainContext{be.get(), 1e9, grid, nullptr});
  RunResult r;
  for (int s = 0; s < steps; ++s) {
    const StepStats st = t.train_step(s);
    r.losses.push_back(st.loss);
    r.norms.push_back(st.grad_norm);
  }
  t.sync_params();
  for (const ParamInfo& p : t.model().params_info())
    r.params.insert(r.params.end(), t.model().params() + p.offset,
                    t.model().params() + p.offset + p.count);
  return r;
}

class FamilyLayouts : public ::testing::TestWithParam<std::string> {
 protected:
  // The family's deck with `extra` after its keys. 4 layers (2 stages of 2, or 4 chunks of 1
  // interleaved), vocab 250 (padded differently at tp 1, 2 and 4), several dp buckets.
  Deck deck(std::vector<std::string> extra) const {
    const std::string yaml = R"(
model: {layers: 4, d_model: 32, heads: 4, vocab: 250, seq_len: 16}
train: {micro_batch: 2, accum: 2, steps: 8, lr: 3.0e-3, warmup_steps: 3, seed: 11,
        val_every: 0}
data: {train: inputs/data/tiny-train.bin, shuffle: true}
comm: {bucket_mb: 0.02, first_bucket_mb: 0.005}
run: {threads: 1}
)";
    std::vector<std::string> o = testing::family_keys(GetParam());
    o.insert(o.end(), extra.begin(), extra.end());
    return parse_deck(yaml, TRIDENT_SOURCE_DIR, o);
  }

  // dp × tp × pp over the world (dp 0: world / (tp·pp)), `accum` micro-batches per rank.
  RunResult layout(int dp, int tp, int pp, int accum, std::vector<std::string> extra,
                   int steps = 8) const {
    ProcessGrid grid(make_layout(world_size(), dp, tp, pp));
    extra.push_back(fmt::format("parallel.tp={}", tp));
    extra.push_back(fmt::format("parallel.pp={}", pp));
    extra.push_back(fmt::format("train.accum={}", accum));
    return run(deck(extra), &grid, steps);
  }

  // One rank, no MPI, with the same global batch as dp ranks of `accum` micro-batches each.
  RunResult one_rank(int dp, int accum, std::vector<std::string> extra = {}, int steps = 8) const {
    extra.push_back(fmt::format("train.accum={}", accum * dp));
    return run(deck(extra), nullptr, steps);
  }
};

// Bounds are GPT-2's (testing::expect_close, from test_dp/tp/pp_training.cpp): the layouts sum
// the same fp32 terms in another order, 1e-5 relative on the loss and 1e-4 on the gradient norm
// step by step. A kv head given to the wrong tp rank, a gate split apart from its up row or a
// head summed over stages moves the loss by far more within a step or two.

// pp 2 (dp 2 at 4 ranks) under each schedule equals one rank; gpipe and zb-h1 also equal 1f1b
// bitwise, as GPT-2's do (Note [Split backward]); interleaved holds other layers per stage, so
// it is within the bounds only (Note [Interleaved 1F1B]).
TEST_P(FamilyLayouts, PipelineSchedulesEqualOneRank) {
  const int world = world_size(), dp = world / 2;
  const RunResult ref = one_rank(dp, 4);
  const RunResult one_f = layout(dp, 1, 2, 4, {"parallel.schedule=1f1b"});
  expect_close(one_f, ref);
  {
    SCOPED_TRACE("gpipe");
    expect_bitwise(layout(dp, 1, 2, 4, {"parallel.schedule=gpipe"}), one_f);
  }
  {
    SCOPED_TRACE("zb-h1");
    expect_bitwise(layout(dp, 1, 2, 4, {"parallel.schedule=zb-h1"}), one_f);
  }
  {
    SCOPED_TRACE("interleaved");
    expect_close(
        layout(dp, 1, 2, 4, {"parallel.schedule=interleaved", "parallel.virtual_stages=2"}), ref);
  }
  if (world == 4) {
    SCOPED_TRACE("tp 2 × pp 2, sequence parallel, zb-h1");
    expect_close(layout(1, 2, 2, 4, {"parallel.schedule=zb-h1", "parallel.sequence_parallel=true"}),
                 one_rank(1, 4));
  }
}

// Overlap on and off are bitwise identical and equal one rank. comm.grad_dtype bf16 reaches
// the reduction (the runs differ after the first update) and stays within test_dp_training's
// bf16 bounds: 0.1% on the loss, 1% on the norm over 8 steps (bf16's 2^-9 relative rounding
// per summed element moves AdamW's updates by about that fraction of lr).
TEST_P(FamilyLayouts, DataParallelWithOverlapAndBf16Gradients) {
  const int dp = world_size();
  const RunResult on = layout(dp, 1, 1, 2, {"comm.overlap=true"});
  expect_bitwise(on, layout(dp, 1, 1, 2, {"comm.overlap=false"}));
  expect_close(on, one_rank(dp, 2));
  const RunResult bf16 = layout(dp, 1, 1, 2, {"comm.overlap=true", "comm.grad_dtype=bf16"});
  EXPECT_EQ(bf16.losses[0], on.losses[0]);
  EXPECT_NE(bf16.losses[2], on.losses[2]) << "comm.grad_dtype bf16 did not change the reduction";
  expect_close(bf16, on, /*loss_rel=*/1e-3, /*norm_rel=*/1e-2);
}

// ZeRO-1 and ZeRO-2 against the replicated optimizer in the same layout, within
// test_zero_training's bound: 1e-6 relative on loss and norm step by step, and on every final
// parameter relative to the largest |parameter| (another reduction order only).
void expect_within_1e6(const RunResult& z, const RunResult& ref) {
  ASSERT_EQ(z.losses.size(), ref.losses.size());
  for (size_t i = 0; i < z.losses.size(); ++i) {
    EXPECT_NEAR(z.losses[i], ref.losses[i], 1e-6 * ref.losses[i]) << "step " << i + 1;
    EXPECT_NEAR(z.norms[i], ref.norms[i], 1e-6 * ref.norms[i]) << "step " << i + 1;
  }
  ASSERT_EQ(z.params.size(), ref.params.size());
  EXPECT_LE(testing::max_param_error(z.params, ref.params), 1e-6);
}

TEST_P(FamilyLayouts, ZeroStagesEqualTheReplicatedOptimizer) {
  const int world = world_size();
  struct Case {
    int tp, pp;
    std::vector<std::string> extra;
  };
  std::vector<Case> cases = {{1, 1, {}}};
  if (world == 4) {
    cases.push_back({2, 1, {"parallel.sequence_parallel=true"}});
    cases.push_back({1, 2, {}});
  }
  for (const Case& c : cases) {
    auto with = [&](const char* stage) {
      std::vector<std::string> o = c.extra;
      o.push_back(stage);
      return layout(0, c.tp, c.pp, 2, o);
    };
    const RunResult ref = with("parallel.zero=0");
    for (const char* stage : {"parallel.zero=1", "parallel.zero=2"}) {
      SCOPED_TRACE(fmt::format("{} tp {} pp {}", stage, c.tp, c.pp));
      expect_within_1e6(with(stage), ref);
    }
  }
}

// Recomputation repeats forward's arithmetic exactly, so on and off are bitwise identical: on
// one rank and on pp 2 (with tp 2 at 4 ranks).
TEST_P(FamilyLayouts, RecomputeIsBitwiseIdentical) {
  const int world = world_size();
  const int tp = world >= 4 ? 2 : 1, dp = world / (2 * tp);
  const RunResult one = one_rank(1, 2, {"train.recompute=none"}, 4);
  const RunResult piped = layout(dp, tp, 2, 2, {"train.recompute=none"}, 4);
  for (const char* r : {"train.recompute=mlp", "train.recompute=full"}) {
    SCOPED_TRACE(r);
    expect_bitwise(one_rank(1, 2, {r}, 4), one);
    expect_bitwise(layout(dp, tp, 2, 2, {r}, 4), piped);
  }
}

// Saved after 4 steps in one layout, loaded in another (or on one rank, no MPI), the next 4
// steps equal the saving run's own continuation within testing::expect_close's bounds (as
// test_ckpt_training.cpp checks GPT-2: a tensor loaded wrongly, or the untied head not loaded,
// moves the loss far more, since every tensor has moved from its initial value by step 4).
struct Placement {
  int tp = 1, pp = 1;
  bool on_one_rank = false;
};

TEST_P(FamilyLayouts, CheckpointsLoadInAnotherLayout) {
  auto be = make_cpu_backend(1);
  auto trained = [&](const Placement& p, int accum, std::unique_ptr<ProcessGrid>& grid) {
    if (!p.on_one_rank)
      grid = std::make_unique<ProcessGrid>(make_layout(world_size(), 0, p.tp, p.pp));
    return std::make_unique<Trainer>(
        deck({fmt::format("parallel.tp={}", p.tp), fmt::format("parallel.pp={}", p.pp),
              fmt::format("train.accum={}", accum)}),
        TrainContext{be.get(), 1e9, grid.get(), nullptr});
  };
  auto steps = [](Trainer& t, int from, int to) {
    RunResult r;
    for (int s = from; s < to; ++s) {
      const StepStats st = t.train_step(s);
      r.losses.push_back(st.loss);
      r.norms.push_back(st.grad_norm);
    }
    return r;
  };
  const int world = world_size();
  const std::pair<Placement, Placement> moves[] = {
      {{.tp = 2}, {.pp = 2}}, {{.pp = 2}, {.tp = 2}}, {{.tp = 2}, {.on_one_rank = true}}};
  int n = 0;
  for (const auto& [save, load] : moves) {
    SCOPED_TRACE(fmt::format(
        "saved tp {} pp {}, loaded {}", save.tp, save.pp,
        load.on_one_rank ? "on one rank" : fmt::format("tp {} pp {}", load.tp, load.pp)));
    const std::string dir = testing::scratch_dir(fmt::format("family_{}_{}", GetParam(), n++));
    const int save_dp = world / (save.tp * save.pp);
    const int load_dp = load.on_one_rank ? 1 : world / (load.tp * load.pp);
    RunResult reference;
    {
      std::unique_ptr<ProcessGrid> grid;
      auto t = trained(save, 2, grid);
      steps(*t, 0, 4);
      t->save(dir, 4, "family", 2);
      reference = steps(*t, 4, 8);
    }
    std::unique_ptr<ProcessGrid> grid;
    auto t = trained(load, 2 * save_dp / load_dp, grid);
    ASSERT_EQ(t->load(latest_checkpoint(dir)).step, 4);
    expect_close(steps(*t, 4, 8), reference);
  }
}

// An untied head has no TiedEmbedding on any stage (so nothing of the tie runs: no row sink,
// no sum of wte over stages, no head pieces). The same family with model.tied_head true has one
// on every stage that holds wte (at pp 2 with 4 layers: both), so the check can fail.
TEST_P(FamilyLayouts, UntiedHeadBuildsNothingOfTheTie) {
  auto be = make_cpu_backend(1);
  ProcessGrid grid(make_layout(world_size(), world_size() / 2, 1, 2));
  auto tied = [&](std::vector<std::string> extra, ProcessGrid* g) {
    extra.push_back(fmt::format("parallel.pp={}", g ? 2 : 1));
    Trainer t(deck(extra), TrainContext{be.get(), 1e9, g, nullptr});
    EXPECT_FALSE(t.model_config().is_gpt2_block());
    return t.has_tied_embedding();
  };
  EXPECT_FALSE(tied({}, &grid)) << "pipeline stage " << grid.coord().pp;
  EXPECT_FALSE(tied({}, nullptr)) << "one rank";
  EXPECT_TRUE(tied({"model.tied_head=true"}, &grid)) << "pipeline stage " << grid.coord().pp;
  EXPECT_TRUE(tied({"model.tied_head=true"}, nullptr)) << "one rank";
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyLayouts, ::testing::Values("neox", "llama"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace trident
