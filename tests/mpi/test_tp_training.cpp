// Tensor parallelism (with and without sequence parallelism, alone and with dp) equals the
// single-rank run: losses over 20 steps and the gathered full gradients after step 1, for each
// block family (testing::family_keys: GPT-2's, and NeoX's and Llama's, whose kv heads split
// over tp as Megatron splits query groups, SwiGLU's gate | up column-parallel, the untied head
// vocab-parallel).
// Runs under mpirun with 2 ranks (tp 2) and 4 ranks (tp 4, and dp 2 × tp 2).
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>

#include <cmath>
#include <map>

#include "train_harness.h"
#include "trident/check.h"

namespace trident {
namespace {

using testing::world_size;

// heads 4 and d_model 32 split 4 ways; vocab 250 is not a multiple of tp (nor of 128), so
// the padded vocabulary differs between layouts (256 for tp 1 and 2, 512 for tp 4). `family`'s
// keys come first.
Deck deck(const std::string& family, std::vector<std::string> overrides) {
  const std::string yaml = R"(
model: {layers: 2, d_model: 32, heads: 4, vocab: 250, seq_len: 16}
train: {micro_batch: 2, accum: 1, steps: 20, lr: 3.0e-3, warmup_steps: 3, seed: 7,
        val_every: 0}
data: {train: inputs/data/tiny-train.bin, shuffle: true}
run: {threads: 1}
)";
  std::vector<std::string> keys = testing::family_keys(family);
  keys.insert(keys.end(), overrides.begin(), overrides.end());
  return parse_deck(yaml, TRIDENT_SOURCE_DIR, keys);
}

struct Result {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> step1_grads;  // global tensors, wte/lmw's live rows
};

// The gradient of every parameter as one global tensor, gathered over tp.
std::map<std::string, std::vector<float>> gather_grads(GPT& m, ProcessGrid* grid) {
  std::map<std::string, std::vector<float>> out;
  const int tp = m.tensor_parallel().size;
  const size_t live_wte = size_t(m.config().vocab) * m.config().channels;
  for (const ParamInfo& p : m.params_info()) {
    size_t global = 1;
    for (int d : p.global_shape) global *= size_t(d);
    std::vector<float> shards(p.count * tp);
    if (tp > 1) grid->tp().all_gather(m.grads() + p.offset, shards.data(), p.count).wait();
    else std::copy(m.grads() + p.offset, m.grads() + p.offset + p.count, shards.begin());
    std::vector<float> g(global, 0.0f);
    for (int r = 0; r < tp; ++r) {
      ParamInfo q = p;
      q.tp_rank = r;
      for (size_t i = 0; i < p.count; ++i) {
        const size_t gi = q.global_index(i);
        if (p.shard == Shard::kReplicated && r > 0) {
          // A replicated gradient must be the same on every tp rank.
          EXPECT_EQ(shards[size_t(r) * p.count + i], g[gi])
              << p.name << " differs on tp rank " << r;
          continue;
        }
        g[gi] = shards[size_t(r) * p.count + i];
      }
    }
    // The vocabulary padding differs between layouts (wte, and an untied head's lmw).
    if (p.name == "wte" || p.name == "lmw") g.resize(live_wte);
    out[p.name] = std::move(g);
  }
  return out;
}

Result train(const Deck& d, ProcessGrid* grid, int steps) {
  Result r;
  const testing::RunResult run = testing::run_steps(d, grid, steps, [&](int s, Trainer& t) {
    if (s == 0) r.step1_grads = gather_grads(t.model(), grid);
  });
  r.losses = run.losses;
  return r;
}

// Single-rank reference with the same global batch (dp micro-batches become accumulation).
Result reference(const std::string& family, int dp, int steps) {
  return train(deck(family, {fmt::format("train.accum={}", dp)}), nullptr, steps);
}

// Bounds: the tp sums (partial products over heads / hidden slices / vocab slices) add the
// same fp32 terms in another order than one rank does; after 20 AdamW steps the loss stays
// within ~1e-6 relative here, so 1e-5 (the issue's bound). Gradients after step 1: each
// element within 1e-5 of the tensor's largest |g| (relative per element would be meaningless
// for elements that are zero up to rounding).
void expect_equal_to_reference(const Result& a, const Result& ref) {
  ASSERT_EQ(a.losses.size(), ref.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_NEAR(a.losses[i], ref.losses[i], 1e-5 * std::abs(ref.losses[i])) << "step " << i + 1;
  ASSERT_EQ(a.step1_grads.size(), ref.step1_grads.size());
  for (const auto& [name, g] : ref.step1_grads) {
    const auto& mine = a.step1_grads.at(name);
    ASSERT_EQ(mine.size(), g.size()) << name;
    float scale = 0;
    for (float x : g) scale = std::max(scale, std::abs(x));
    float worst = 0;
    for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(mine[i] - g[i]));
    EXPECT_LE(worst, 1e-5f * scale) << name << ": max |Δg| " << worst << " of max |g| " << scale;
  }
}

class TensorParallel : public ::testing::TestWithParam<std::string> {
 protected:
  void run_layout(int tp, bool sequence_parallel) const {
    const int world = world_size();
    ProcessGrid grid(make_layout(world, 0, tp, 1));
    const int dp = grid.layout().dp;
    const Result ref = reference(GetParam(), dp, 20);
    const Result r =
        train(deck(GetParam(), {fmt::format("parallel.tp={}", tp),
                                fmt::format("parallel.sequence_parallel={}", sequence_parallel)}),
              &grid, 20);
    expect_equal_to_reference(r, ref);
  }
};

// Note [Sequence-parallel LayerNorm gradients]: with accum 4 the LayerNorm gradients stay in
// per-rank partial sums over micro-batches 1-3 and are summed over tp once, on the 4th; the
// result must still be one rank's (same bound: the sums are only taken in another order).
TEST_P(TensorParallel, SequenceParallelWithAccumulationEqualsOneRank) {
  const int world = world_size();
  ProcessGrid grid(make_layout(world, 0, world, 1));
  const Result ref = train(deck(GetParam(), {"train.accum=4"}), nullptr, 20);
  const Result r = train(deck(GetParam(), {"train.accum=4", fmt::format("parallel.tp={}", world),
                                           "parallel.sequence_parallel=true"}),
                         &grid, 20);
  expect_equal_to_reference(r, ref);
}

TEST_P(TensorParallel, AllRanksTpEqualsOneRank) { run_layout(world_size(), false); }
TEST_P(TensorParallel, AllRanksTpWithSequenceParallelEqualsOneRank) {
  run_layout(world_size(), true);
}

TEST_P(TensorParallel, Dp2Tp2EqualsOneRank) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  run_layout(2, false);
}

TEST_P(TensorParallel, Dp2Tp2WithSequenceParallelEqualsOneRank) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  run_layout(2, true);
}

INSTANTIATE_TEST_SUITE_P(Families, TensorParallel, ::testing::Values("gpt2", "neox", "llama"),
                         [](const auto& info) { return std::string(info.param); });

TEST(TensorParallelShapes, RefusesShapesThatDoNotSplit) {
  const int world = world_size();
  ProcessGrid grid(make_layout(world, 0, world, 1));
  auto be = make_cpu_backend(1);
  // heads 3 is not divisible by tp (d_model 48 is a multiple of 3).
  try {
    Trainer t(
        deck("gpt2", {"model.heads=3", "model.d_model=48", fmt::format("parallel.tp={}", world)}),
        TrainContext{be.get(), 1e9, &grid, nullptr});
    FAIL() << "accepted heads 3 with tp " << world;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find("heads"), std::string::npos) << e.what();
  }
  // One kv head (multi-query) does not split over tp.
  try {
    Trainer t(deck("llama", {"model.kv_heads=1", fmt::format("parallel.tp={}", world)}),
              TrainContext{be.get(), 1e9, &grid, nullptr});
    FAIL() << "accepted kv_heads 1 with tp " << world;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find("model.kv_heads 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trident
