// Checkpoints of the trainer: resume in the same layout continues bitwise; a checkpoint saved
// in one layout loads in another and training goes on with the same losses: tp ↔ pp, onto one
// rank, into a larger dp, with sequence parallelism, with uneven stages (parallel.stage_layers).
// Runs under mpirun with 2 and 4 ranks; the full 3D layout (8 ranks) is
// tests/cli/test_ckpt_layouts.sh.
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "train_harness.h"

namespace trident {
namespace {

using testing::world_size;

Deck deck(std::vector<std::string> overrides) {
  const std::string yaml = R"(
model: {layers: 4, d_model: 32, heads: 4, vocab: 250, seq_len: 16}
train: {micro_batch: 2, accum: 2, steps: 12, lr: 3.0e-3, warmup_steps: 3, seed: 5,
        val_every: 0}
data: {train: inputs/data/tiny-train.bin, shuffle: true}
run: {threads: 1}
)";
  return parse_deck(yaml, TRIDENT_SOURCE_DIR, overrides);
}

std::string scratch_dir(const std::string& name) { return testing::scratch_dir("ckpt_" + name); }

using testing::RunResult;

// Runs steps [from, to) of an existing trainer.
RunResult run(Trainer& t, int from, int to) {
  RunResult s;
  for (int i = from; i < to; ++i) {
    const StepStats st = t.train_step(i);
    s.losses.push_back(st.loss);
    s.norms.push_back(st.grad_norm);
  }
  t.sync_params();
  s.params.assign(t.model().params(), t.model().params() + t.model().num_params());
  return s;
}

TEST(Checkpoint, ResumeInTheSameLayoutIsBitwise) {
  const std::string dir = scratch_dir("resume");
  auto be = make_cpu_backend(1);
  ProcessGrid grid(make_layout(world_size(), 0, 1, 1));
  const Deck d = deck({});
  // Uninterrupted: 12 steps. Interrupted: 7 steps (accum 2, mid-epoch), save, a fresh
  // trainer loads and runs the other 5.
  Trainer whole(d, TrainContext{be.get(), 1e9, &grid, nullptr});
  const RunResult all = run(whole, 0, 12);
  RunResult tail;
  {
    Trainer first(d, TrainContext{be.get(), 1e9, &grid, nullptr});
    run(first, 0, 7);
    first.save(dir, 7, "run-a", 2);
  }
  {
    Trainer second(d, TrainContext{be.get(), 1e9, &grid, nullptr});
    const CheckpointMeta meta = second.load(latest_checkpoint(dir));
    ASSERT_EQ(meta.step, 7);
    tail = run(second, 7, 12);
  }
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(tail.losses[i], all.losses[7 + i]) << "step " << 8 + i;
    EXPECT_EQ(tail.norms[i], all.norms[7 + i]) << "step " << 8 + i;
  }
  ASSERT_EQ(0, std::memcmp(tail.params.data(), all.params.data(), all.params.size() * 4));
}

// A layout on the test's world: dp 0 derives dp = world / (tp·pp); `on_one_rank` loads with no
// grid at all (one rank, no MPI).
struct Layout {
  int dp = 0, tp = 1, pp = 1;
  std::string stage_layers;        // parallel.stage_layers; empty: balanced
  bool sequence_parallel = false;  // parallel.sequence_parallel
  bool on_one_rank = false;
};

std::string describe(const Layout& l) {
  if (l.on_one_rank) return "one_rank";
  std::string s = fmt::format("dp{}tp{}pp{}", l.dp, l.tp, l.pp);
  if (!l.stage_layers.empty()) s += "_" + l.stage_layers;
  if (l.sequence_parallel) s += "_sp";
  for (char& c : s)
    if (c == ',') c = '-';
  return s;
}

// The deck in that layout, with train.accum set so that the global batch (micro-batch 2 ×
// accum × dp) is the same in every layout: the same samples, so the same losses.
Deck layout_deck(const Layout& l, int accum) {
  std::vector<std::string> o = {fmt::format("parallel.tp={}", l.tp),
                                fmt::format("parallel.pp={}", l.pp),
                                fmt::format("train.accum={}", accum)};
  if (!l.stage_layers.empty()) o.push_back("parallel.stage_layers=" + l.stage_layers);
  if (l.sequence_parallel) o.push_back("parallel.sequence_parallel=true");
  return deck(o);
}

// Resolves dp = 0 against the world (one rank: dp 1).
Layout resolved(Layout l) {
  if (l.on_one_rank) l.dp = l.tp = l.pp = 1;
  else if (l.dp == 0) l.dp = world_size() / (l.tp * l.pp);
  return l;
}

// Save in one layout after 4 steps; load in another; the next 4 steps' losses match the saving
// layout's own continuation within 1e-5 relative and the gradient norms within 1e-4 (the
// bounds of testing::expect_close: the layouts differ only in fp32 summation order, which
// moves the loss by ~1e-6 relative; a tensor loaded wrongly or not at all moves it by far more,
// since after 4 steps every tensor has moved away from its initial value).
void reshard(Layout save, Layout load) {
  save = resolved(save);
  load = resolved(load);
  const std::string dir =
      scratch_dir(fmt::format("reshard_{}_to_{}", describe(save), describe(load)));
  auto be = make_cpu_backend(1);
  constexpr int kSavedAccum = 2;
  ASSERT_EQ(kSavedAccum * save.dp % load.dp, 0) << "no accum gives the same global batch";
  RunResult reference;
  {
    ProcessGrid grid(make_layout(world_size(), save.dp, save.tp, save.pp));
    Trainer t(layout_deck(save, kSavedAccum), TrainContext{be.get(), 1e9, &grid, nullptr});
    run(t, 0, 4);
    t.save(dir, 4, "run-b", 2);
    reference = run(t, 4, 8);
  }
  std::unique_ptr<ProcessGrid> grid;
  if (!load.on_one_rank)
    grid = std::make_unique<ProcessGrid>(make_layout(world_size(), load.dp, load.tp, load.pp));
  Trainer t(layout_deck(load, kSavedAccum * save.dp / load.dp),
            TrainContext{be.get(), 1e9, grid.get(), nullptr});
  ASSERT_EQ(t.load(latest_checkpoint(dir)).step, 4);
  const RunResult after = run(t, 4, 8);
  SCOPED_TRACE(describe(save) + " -> " + describe(load));
  testing::expect_close(after, reference);
}

TEST(Checkpoint, SavedWithTpLoadsWithPipeline) {
  reshard({.tp = 2}, {.pp = 2});  // np 4: dp2×tp2 → dp2×pp2; np 2: tp2 → pp2
}

TEST(Checkpoint, SavedWithTpLoadsOnOneRank) { reshard({.tp = 2}, {.on_one_rank = true}); }

// Every rank becomes a data-parallel replica: np 2: tp2 → dp2, np 4: dp2×tp2 → dp4 (accum 2 → 1).
TEST(Checkpoint, LoadsIntoALargerDp) { reshard({.tp = 2}, {.dp = world_size()}); }

// Sequence parallelism on the loading side and on the saving side (the LayerNorm/residual
// regions split along the sequence; the parameters themselves are sharded as with plain tp).
TEST(Checkpoint, LoadsWithSequenceParallelism) {
  reshard({.dp = world_size()}, {.tp = 2, .sequence_parallel = true});
}

TEST(Checkpoint, SavedWithSequenceParallelismLoadsWithPipeline) {
  reshard({.tp = 2, .sequence_parallel = true}, {.pp = 2});
}

// Uneven stages: blocks h0..h2 on stage 0 and h3 with the head on stage 1 when saving, h0 alone
// and h1..h3 when loading (np 4: with dp 2 on both sides).
TEST(Checkpoint, UnevenStagesLoadWithOtherUnevenStages) {
  reshard({.pp = 2, .stage_layers = "3,1"}, {.pp = 2, .stage_layers = "1,3"});
}

// And uneven stages into tensor parallelism.
TEST(Checkpoint, UnevenStagesLoadWithTp) { reshard({.pp = 2, .stage_layers = "3,1"}, {.tp = 2}); }

TEST(Checkpoint, SavedWithPipelineLoadsWithTp) {
  const std::string dir = scratch_dir("pp_to_tp");
  auto be = make_cpu_backend(1);
  RunResult reference;
  {
    ProcessGrid grid(make_layout(world_size(), 0, 1, 2));
    Trainer t(deck({"parallel.pp=2"}), TrainContext{be.get(), 1e9, &grid, nullptr});
    run(t, 0, 3);
    t.save(dir, 3, "run-c", 1);
    reference = run(t, 3, 6);
  }
  ProcessGrid grid(make_layout(world_size(), 0, 2, 1));
  Trainer t(deck({"parallel.tp=2"}), TrainContext{be.get(), 1e9, &grid, nullptr});
  t.load(latest_checkpoint(dir));
  const RunResult after = run(t, 3, 6);
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(after.losses[i], reference.losses[i], 1e-5 * reference.losses[i])
        << "step " << 4 + i;
}

}  // namespace
}  // namespace trident
