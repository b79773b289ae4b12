// Context parallelism (parallel.cp, Note [Context parallelism] in src/model/cp_attention.h)
// equals one rank: cp 2 and cp 4 with ring and allgather, in every family, with kv heads fewer
// than cp ranks, and beside tp with sequence parallelism, pp, dp with ZeRO-1 and ZeRO-3, and
// recomputation; and a checkpoint saved at cp 2 resumes at cp 1 as if nothing had changed.
// Runs under mpirun with 2 and 4 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>

#include <memory>
#include <ostream>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "train_harness.h"

namespace trident {
namespace {

using testing::RunResult;
using testing::world_size;

// Each sequence's 16 tokens make 2·cp chunks at cp 2 and 4; 4 layers for pp 2; vocab 250.
Deck cp_deck(const std::string& family, std::vector<std::string> extra) {
  std::vector<std::string> o = testing::family_keys(family);
  o.insert(o.end(), extra.begin(), extra.end());
  return testing::small_layout_deck(o);
}

// The run on a grid of the deck's parallel keys over the whole world.
RunResult on_grid(const Deck& d, int steps = 5) {
  GridSizes sizes;
  sizes.world = world_size();
  sizes.tp = d.parallel.tp;
  sizes.pp = d.parallel.pp;
  sizes.cp = d.parallel.cp;
  ProcessGrid grid(complete_layout(sizes));
  return testing::run_steps(d, &grid, steps);
}

// The bound: losses within 1e-5 relative step by step (gradient norms within 1e-4, as
// every layout test's: they sum the same terms in another order). A chunk at the wrong position,
// a key block seen twice or a dK/dV partial sum left behind moves the loss by 1e-3 or more at
// the first step.
void expect_equal_cp1(const RunResult& a, const RunResult& ref) { testing::expect_close(a, ref); }

// And, where every rank holds the whole model (no tp, no pp), every parameter after the last
// step within 1e-5 of the largest.
void expect_same_params(const RunResult& a, const RunResult& ref) {
  ASSERT_EQ(a.params.size(), ref.params.size());
  EXPECT_LE(testing::max_param_error(a.params, ref.params), 1e-5);
}

struct Case {
  std::string family, cp_comm;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.family << ", cp_comm " << c.cp_comm; }

class CpEqualsOneRank : public ::testing::TestWithParam<Case> {
 protected:
  Deck deck(std::vector<std::string> extra) const {
    extra.push_back("parallel.cp_comm=" + GetParam().cp_comm);
    return cp_deck(GetParam().family, extra);
  }
  RunResult one_rank(std::vector<std::string> extra = {}) const {
    return testing::run_steps(deck(extra), nullptr, 5);
  }
};

// cp over the whole world (2 or 4), dp 1.
TEST_P(CpEqualsOneRank, CpOverTheWorld) {
  const int cp = world_size();
  const RunResult ref = one_rank();
  const RunResult r = on_grid(deck({fmt::format("parallel.cp={}", cp)}));
  expect_equal_cp1(r, ref);
  expect_same_params(r, ref);
}

// cp 2 beside dp (2 at 4 ranks) with ZeRO-1 and ZeRO-3: the gradients reduce over dp × cp.
TEST_P(CpEqualsOneRank, CpBesideDataParallelWithZero) {
  const int dp = world_size() / 2;
  // dp ranks read other samples: one rank runs their micro-batches as accumulation.
  const RunResult ref = one_rank({fmt::format("train.accum={}", 2 * dp)});
  for (int zero : {1, 3}) {
    SCOPED_TRACE(fmt::format("zero {}", zero));
    const RunResult r = on_grid(deck({"parallel.cp=2", fmt::format("parallel.zero={}", zero)}));
    expect_equal_cp1(r, ref);
  }
}

// Recomputing the blocks in backward runs the ring again.
TEST_P(CpEqualsOneRank, WithRecomputation) {
  const std::string cp = fmt::format("parallel.cp={}", world_size());
  expect_equal_cp1(on_grid(deck({cp, "train.recompute=full"})), one_rank());
}

INSTANTIATE_TEST_SUITE_P(Families, CpEqualsOneRank,
                         ::testing::Values(Case{"gpt2", "ring"}, Case{"gpt2", "allgather"},
                                           Case{"neox", "ring"}, Case{"neox", "allgather"},
                                           Case{"llama", "ring"}, Case{"llama", "allgather"}),
                         [](const auto& info) {
                           return info.param.family + "_" + info.param.cp_comm;
                         });

// Llama with one kv head for four query heads at cp 2 (and 4): fewer kv heads than cp ranks.
TEST(CpLayouts, FewerKvHeadsThanCpRanks) {
  const int cp = world_size();
  for (const char* mode : {"ring", "allgather"}) {
    SCOPED_TRACE(mode);
    const std::vector<std::string> keys = {"model.family=llama", "model.heads=4",
                                           "model.kv_heads=1", "model.mlp_hidden=64",
                                           fmt::format("parallel.cp_comm={}", mode)};
    auto with = [&](std::vector<std::string> more) {
      more.insert(more.begin(), keys.begin(), keys.end());
      return cp_deck("gpt2", more);
    };
    expect_equal_cp1(on_grid(with({fmt::format("parallel.cp={}", cp)})),
                     testing::run_steps(with({}), nullptr, 5));
  }
}

// cp 2 × tp 2 with sequence parallelism, and cp 2 × pp 2 under each schedule (4 ranks).
TEST(CpLayouts, BesideTensorAndPipelineParallelism) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  for (const char* family : {"gpt2", "llama"}) {
    SCOPED_TRACE(family);
    const RunResult ref = testing::run_steps(cp_deck(family, {}), nullptr, 5);
    {
      SCOPED_TRACE("cp 2 x tp 2, sequence parallel");
      expect_equal_cp1(on_grid(cp_deck(family, {"parallel.cp=2", "parallel.tp=2",
                                                "parallel.sequence_parallel=true"})),
                       ref);
    }
    for (const char* schedule : {"gpipe", "1f1b", "zb-h1", "interleaved"}) {
      SCOPED_TRACE(fmt::format("cp 2 x pp 2, {}", schedule));
      std::vector<std::string> keys = {"parallel.cp=2", "parallel.pp=2",
                                       fmt::format("parallel.schedule={}", schedule)};
      if (std::string(schedule) == "interleaved") keys.push_back("parallel.virtual_stages=2");
      expect_equal_cp1(on_grid(cp_deck(family, keys)), ref);
    }
  }
}

// A checkpoint does not depend on cp: saved after 3 steps at cp = world (accum 2), resumed at
// dp 2 × cp world/2 (accum 1, the same samples: Note [Sample order]), the last 2 steps are
// those of the uninterrupted one-rank run.
TEST(CpLayouts, CheckpointResumesAtAnotherCp) {
  const std::string dir = testing::scratch_dir("cp_checkpoint");
  const int world = world_size();
  const RunResult ref = testing::run_steps(cp_deck("llama", {}), nullptr, 5);
  auto trainer = [&](const Deck& d, ProcessGrid& grid, Backend& be) {
    return std::make_unique<Trainer>(d, TrainContext{&be, 1e9, &grid, nullptr});
  };
  auto be = make_cpu_backend(1);
  std::string path;
  {
    const Deck d = cp_deck("llama", {fmt::format("parallel.cp={}", world)});
    ProcessGrid grid(complete_layout({.world = world, .cp = world}));
    auto t = trainer(d, grid, *be);
    for (int s = 0; s < 3; ++s) t->train_step(s);
    path = t->save(dir, 3, "cp-test", 0);
  }
  const Deck d = cp_deck("llama", {fmt::format("parallel.cp={}", world / 2), "train.accum=1"});
  ProcessGrid grid(complete_layout({.world = world, .dp = 2, .cp = world / 2}));
  auto t = trainer(d, grid, *be);
  t->load(path);
  for (int s = 3; s < 5; ++s) {
    const StepStats st = t->train_step(s);
    EXPECT_NEAR(st.loss, ref.losses[size_t(s)], 1e-5 * ref.losses[size_t(s)]) << "step " << s + 1;
    EXPECT_NEAR(st.grad_norm, ref.norms[size_t(s)], 1e-4 * ref.norms[size_t(s)])
        << "step " << s + 1;
  }
}

}  // namespace
}  // namespace trident
