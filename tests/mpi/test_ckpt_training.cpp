// Checkpoints of the trainer: resume in the same layout continues bitwise; a checkpoint saved
// in one layout loads in another and training goes on with the same losses.
// Runs under mpirun with 2 and 4 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>

#include <filesystem>

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

std::string scratch_dir(const std::string& name) {
  // One directory for all ranks (rank 0 picks it), fresh for each test.
  const auto dir = std::filesystem::temp_directory_path() / ("trident_ckpt_" + name);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return dir.string();
}

struct Steps {
  std::vector<double> losses, norms;
  std::vector<float> params;
};

// Runs steps [from, to) of an existing trainer.
Steps run(Trainer& t, int from, int to) {
  Steps s;
  for (int i = from; i < to; ++i) {
    const StepStats st = t.train_step(i);
    s.losses.push_back(st.loss);
    s.norms.push_back(st.grad_norm);
  }
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
  const Steps all = run(whole, 0, 12);
  Steps tail;
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

// Save in one layout; load in another; the next steps' losses match the saving layout's
// continuation within 1e-5 relative (the layouts differ only in fp32 summation order).
void reshard(int save_tp, int load_dp, int load_tp, int load_pp, bool load_on_one_rank) {
  const std::string dir = scratch_dir(fmt::format("reshard_{}_{}{}{}_{}", save_tp, load_dp,
                                                  load_tp, load_pp, load_on_one_rank));
  auto be = make_cpu_backend(1);
  Steps reference;
  {
    ProcessGrid grid(make_layout(world_size(), 0, save_tp, 1));
    Trainer t(deck({fmt::format("parallel.tp={}", save_tp)}),
              TrainContext{be.get(), 1e9, &grid, nullptr});
    run(t, 0, 4);
    t.save(dir, 4, "run-b", 2);
    reference = run(t, 4, 8);
  }
  const int dp = load_on_one_rank ? 1 : load_dp;
  const int saved_dp = world_size() / save_tp;
  // The same global batch: dp ranks × micro-batch 2 × accum; accumulation makes up the rest.
  const int accum = 2 * saved_dp / dp;
  Deck d = deck({fmt::format("parallel.tp={}", load_tp), fmt::format("parallel.pp={}", load_pp),
                 fmt::format("train.accum={}", accum)});
  std::unique_ptr<ProcessGrid> grid;
  if (!load_on_one_rank) grid = std::make_unique<ProcessGrid>(make_layout(world_size(), load_dp, load_tp, load_pp));
  Trainer t(d, TrainContext{be.get(), 1e9, grid.get(), nullptr});
  ASSERT_EQ(t.load(latest_checkpoint(dir)).step, 4);
  const Steps after = run(t, 4, 8);
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(after.losses[i], reference.losses[i], 1e-5 * reference.losses[i]) << "step " << 5 + i;
}

TEST(Checkpoint, SavedWithTpLoadsWithPipeline) {
  if (world_size() == 4) reshard(2, 2, 1, 2, false);  // dp2×tp2 → dp2×pp2
  else reshard(2, 1, 1, 2, false);                    // tp2 → pp2
}

TEST(Checkpoint, SavedWithTpLoadsOnOneRank) { reshard(2, 1, 1, 1, true); }

TEST(Checkpoint, SavedWithPipelineLoadsWithTp) {
  const std::string dir = scratch_dir("pp_to_tp");
  auto be = make_cpu_backend(1);
  Steps reference;
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
  const Steps after = run(t, 3, 6);
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(after.losses[i], reference.losses[i], 1e-5 * reference.losses[i]) << "step " << 4 + i;
}

}  // namespace
}  // namespace trident
