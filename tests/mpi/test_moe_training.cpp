// Mixtures of experts (Note [Mixture of experts] in trident/model_config.h) in the layouts they
// run in (Note [Mixtures in the layouts] in src/model/gpt_moe.cpp) equal one rank within the
// dense families' bounds: ep 2 and 4, experts replicated over dp, ZeRO-1, 2 and 3, ep with
// HSDP (and bf16 gradients, within bf16's bounds), ep beside pp (gpipe, 1f1b, interleaved; zb-h1
// equals 1f1b bit for bit) and cp,
// recomputation, capacity, and checkpoints that resume at another ep or layout. And a rank whose
// experts receive no token still takes part in every exchange. Runs under mpirun with 2 and 4
// ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "model/moe.h"
#include "train_harness.h"

namespace trident {
namespace {

using testing::RunResult;
using testing::world_size;

// A small Mixtral: llama's block (4 query heads on 2 kv heads), 4 experts of SwiGLU width 32,
// top 2. 4 layers for pp 2 (4 chunks interleaved); 16 tokens a sequence for cp 2 (4 chunks).
Deck moe_deck(std::vector<std::string> extra) {
  std::vector<std::string> o = {"model.family=mixtral", "model.kv_heads=2",
                                "model.mlp_hidden=64",  "model.moe.experts=4",
                                "model.moe.top_k=2",    "model.moe.ffn_width=32"};
  o.insert(o.end(), extra.begin(), extra.end());
  return testing::small_layout_deck(o);
}

// Each tensor of this rank at its global indices (ParamInfo::global_index: experts split over
// ep, layers over pp), NaN where another rank holds it.
using Tensors = std::map<std::string, std::vector<float>>;

struct MoeRun {
  RunResult steps;  // losses and gradient norms
  std::vector<MoeStats> moe;
  Tensors tensors;  // after the last step
};

Tensors global_tensors(GPT& m) {
  Tensors out;
  for (const ParamInfo& p : m.params_info()) {
    size_t n = 1;
    for (int d : p.global_shape) n *= size_t(d);
    std::vector<float>& v = out[p.name];
    v.assign(n, NAN);
    for (size_t i = 0; i < p.count; ++i) v[p.global_index(i)] = m.params()[p.offset + i];
  }
  return out;
}

void run_into(Trainer& t, int from, int to, MoeRun& r) {
  for (int s = from; s < to; ++s) {
    const StepStats st = t.train_step(s);
    r.steps.losses.push_back(st.loss);
    r.steps.norms.push_back(st.grad_norm);
    r.moe.push_back(st.moe);
  }
  t.sync_params();  // ZeRO: the last update's all-gather
  r.tensors = global_tensors(t.model());
}

// `steps` steps on one rank (grid null) or on the grid of the deck's pp, cp and dp_replicate
// over the world.
MoeRun run(const Deck& d, bool on_grid, int steps = 5) {
  std::unique_ptr<ProcessGrid> grid;
  if (on_grid)
    grid =
        std::make_unique<ProcessGrid>(complete_layout({.world = world_size(),
                                                       .tp = d.parallel.tp,
                                                       .pp = d.parallel.pp,
                                                       .cp = d.parallel.cp,
                                                       .dp_replicate = d.parallel.dp_replicate}));
  auto be = make_cpu_backend(d.run.threads);
  Trainer t(d, TrainContext{be.get(), 1e9, grid.get(), nullptr});
  MoeRun r;
  run_into(t, 0, steps, r);
  return r;
}

// The dense families' bounds (testing::expect_close): losses within 1e-5 relative step by step,
// gradient norms within 1e-4 (the layouts sum the same terms in another order: the experts'
// weight gradients over peers' rows in one GEMM, over micro-batches on one rank); every
// parameter this rank holds within 1e-5 of the largest after the last step. A token at the
// wrong expert, a weight gradient reduced over the wrong group or an auxiliary gradient scaled
// by the wrong count moves the loss by 1e-3 or more within the 5 steps. The mixtures' figures
// too: auxiliary and z-losses within 1e-5 relative, the choices and drops exactly (integers).
void expect_equal_one_rank(const MoeRun& a, const MoeRun& ref) {
  testing::expect_close(a.steps, ref.steps);
  ASSERT_EQ(a.moe.size(), ref.moe.size());
  for (size_t i = 0; i < a.moe.size(); ++i) {
    EXPECT_NEAR(a.moe[i].aux_loss, ref.moe[i].aux_loss, 1e-5 * ref.moe[i].aux_loss)
        << "step " << i + 1;
    EXPECT_NEAR(a.moe[i].z_loss, ref.moe[i].z_loss, 1e-5 * ref.moe[i].z_loss) << "step " << i + 1;
    EXPECT_EQ(a.moe[i].choices, ref.moe[i].choices) << "step " << i + 1;
    EXPECT_EQ(a.moe[i].dropped, ref.moe[i].dropped) << "step " << i + 1;
  }
  float scale = 0;
  for (const auto& [name, v] : ref.tensors)
    for (float x : v) scale = std::max(scale, std::abs(x));
  double worst = 0;
  size_t compared = 0;
  for (const auto& [name, v] : a.tensors) {
    const auto it = ref.tensors.find(name);
    ASSERT_NE(it, ref.tensors.end()) << name;
    ASSERT_EQ(v.size(), it->second.size()) << name;
    for (size_t i = 0; i < v.size(); ++i) {
      if (std::isnan(v[i])) continue;
      worst = std::max(worst, double(std::abs(v[i] - it->second[i])) / scale);
      ++compared;
    }
  }
  EXPECT_GT(compared, 0u);
  EXPECT_LE(worst, 1e-5) << "the largest parameter difference, relative to the largest";
}

// Bit for bit: the same losses, norms, mixture figures and parameters (NaN where another rank
// holds them, at the same places).
void expect_bitwise(const MoeRun& a, const MoeRun& ref) {
  EXPECT_EQ(a.steps.losses, ref.steps.losses);
  EXPECT_EQ(a.steps.norms, ref.steps.norms);
  ASSERT_EQ(a.moe.size(), ref.moe.size());
  for (size_t i = 0; i < a.moe.size(); ++i) {
    EXPECT_EQ(a.moe[i].aux_loss, ref.moe[i].aux_loss) << "step " << i + 1;
    EXPECT_EQ(a.moe[i].z_loss, ref.moe[i].z_loss) << "step " << i + 1;
    EXPECT_EQ(a.moe[i].choices, ref.moe[i].choices) << "step " << i + 1;
  }
  ASSERT_EQ(a.tensors.size(), ref.tensors.size());
  for (const auto& [name, v] : a.tensors) {
    const std::vector<float>& r = ref.tensors.at(name);
    ASSERT_EQ(v.size(), r.size()) << name;
    EXPECT_EQ(0, std::memcmp(v.data(), r.data(), v.size() * sizeof(float))) << name;
  }
}

// The mixtures the layouts run, each exercising what crosses ranks: the switch auxiliary loss
// and the z-loss (their gradients enter the router logits scaled by the seed), dense and
// mixture layers mixed with a gated shared expert, the sigmoid router's choice bias (its step
// reads the loads summed over dp × cp; a rate of 0.01 so that a wrong sum shows in the loss).
struct Case {
  std::string name;
  std::vector<std::string> keys;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

const std::vector<Case> kCases = {
    {"switch_z",
     {"model.moe.aux_loss=switch", "model.moe.aux_loss_coeff=0.1", "model.moe.z_loss=0.01"}},
    {"every2_shared",
     {"model.moe.every=2", "model.moe.shared_experts=1", "model.moe.shared_gate=true",
      "model.moe.z_loss=0.01"}},
    {"sigmoid", {"model.moe.router=sigmoid", "model.moe.bias_update_rate=0.01"}},
};

class MoeEqualsOneRank : public ::testing::TestWithParam<Case> {
 protected:
  Deck deck(std::vector<std::string> extra) const {
    std::vector<std::string> keys = GetParam().keys;
    keys.insert(keys.end(), extra.begin(), extra.end());
    return moe_deck(keys);
  }
  // One rank running the micro-batches of `dp` ranks of accum 2 as its accumulation: the
  // same samples (Note [Sample order]).
  MoeRun one_rank(int dp, std::vector<std::string> extra = {}) const {
    extra.push_back(fmt::format("train.accum={}", 2 * dp));
    return run(deck(extra), false);
  }
};

// ep 2 and ep = world over dp = world: each rank routes its own micro-batch; the experts'
// gradients reduce over expert-dp (world / ep ranks).
TEST_P(MoeEqualsOneRank, ExpertParallel) {
  const int world = world_size();
  const MoeRun ref = one_rank(world);
  for (int ep : {2, 4}) {
    if (ep > world) continue;
    SCOPED_TRACE(fmt::format("ep {}", ep));
    expect_equal_one_rank(run(deck({fmt::format("parallel.ep={}", ep)}), true), ref);
  }
}

// ZeRO-1, 2 and 3 beside ep: dense buckets shard over dp, each expert tensor's over its
// replicas (world / ep: 1 at ep = world, 2 at ep 2 of 4 ranks); ZeRO-3 gathers each over them.
TEST_P(MoeEqualsOneRank, ExpertParallelWithZero) {
  const int world = world_size();
  const MoeRun ref = one_rank(world);
  for (int zero : {1, 2, 3})
    for (int ep : {2, 4}) {
      if (ep > world) continue;
      SCOPED_TRACE(fmt::format("ep {}, zero {}", ep, zero));
      expect_equal_one_rank(
          run(deck({fmt::format("parallel.ep={}", ep), fmt::format("parallel.zero={}", zero)}),
              true),
          ref);
    }
}

// HSDP (Note [Experts with HSDP] in src/train/zero3.h) at 4 ranks: dp_replicate 2 × dp_shard 2,
// ep 2 within each replica, so each expert tensor's shard group is 1 rank of its replica and
// the shard is summed over the 2 replicas by the dense buckets' second hop; ZeRO-3 gathering
// per micro-batch (accum 2), ZeRO-1, and ZeRO-2 reducing per micro-batch (the second hop in the
// last round only). Measured: losses within 1.2e-8, norms 2.9e-8, parameters 1.4e-6. Skipping
// the experts' second hop (each replica's experts then learn from its own tokens) fails every
// case: losses up to 1.4e-4 off, norms 3.3e-3, parameters 1.7e-2 to 2.0e-2.
// (At 8 ranks, dp_shard 4: each expert's shard group has 2 ranks.)
TEST_P(MoeEqualsOneRank, ExpertParallelWithHsdp) {
  if (world_size() < 4) GTEST_SKIP() << "dp_replicate 2 x dp_shard 2 on 4 ranks";
  const MoeRun ref = one_rank(world_size());
  const std::vector<std::string> zeros[] = {
      {"parallel.zero=3", "parallel.zero3_gather=micro_batch"},
      {"parallel.zero=1"},
      {"parallel.zero=2", "parallel.zero_reduce=micro_batch"}};
  for (std::vector<std::string> keys : zeros) {
    SCOPED_TRACE(fmt::format("dp_replicate 2, ep 2, {}", fmt::join(keys, ", ")));
    keys.insert(keys.end(), {"parallel.ep=2", "parallel.dp_replicate=2"});
    expect_equal_one_rank(run(deck(keys), true), ref);
  }
}

// Note [HSDP with bf16 gradients] with experts: dp_replicate 2 × dp_shard 2, ep 2 and
// comm.grad_dtype bf16, the experts' shards taking the dense buckets' bf16 second hop. Against
// one rank (no sums: float32) within Zero.Bf16GradientsEqualZero0's bf16 bound (loss 1e-3, norm
// 1e-2 relative: each sum a bf16 rounding, 2^-9, of some elements); the last step's reduced
// shards all bf16 values (wte's rows join after, TiedEmbedding), and the replicas' tensors,
// experts' included, the same bit for bit: an expert shard left out of the replicas' hop parts
// them.
TEST(MoeLayouts, ExpertParallelWithHsdpAndBf16Gradients) {
  if (world_size() != 4) GTEST_SKIP() << "dp_replicate 2 x dp_shard 2 on 4 ranks";
  std::vector<std::string> keys = kCases[0].keys;
  keys.push_back("train.accum=8");
  const MoeRun ref = run(moe_deck(keys), false);
  keys.back() = "train.accum=2";
  keys.insert(keys.end(), {"parallel.ep=2", "parallel.dp_replicate=2", "comm.grad_dtype=bf16"});
  for (const char* zero : {"parallel.zero=1", "parallel.zero=3"}) {
    SCOPED_TRACE(zero);
    std::vector<std::string> k = keys;
    k.push_back(zero);
    ProcessGrid grid(complete_layout({.world = 4, .dp_replicate = 2}));
    auto be = make_cpu_backend(1);
    Trainer t(moe_deck(k), TrainContext{be.get(), 1e9, &grid, nullptr});
    MoeRun r;
    run_into(t, 0, 5, r);
    testing::expect_close(r.steps, ref.steps, 1e-3, 1e-2);
    EXPECT_EQ(testing::shard_grads_not_bf16(t), 0u) << "a hop did not sum in bf16";
    std::vector<float> flat;
    for (const auto& [name, v] : r.tensors) flat.insert(flat.end(), v.begin(), v.end());
    EXPECT_TRUE(testing::same_on_every_rank(grid.dp_replicate().raw(), flat))
        << "the replicas' tensors differ";
  }
}

// ep 1: every rank holds every expert; their gradients reduce with the rest, plain and with
// ZeRO-1, 2 and 3 sharding over dp (the sigmoid router's bias step goes into ZeRO-3's shards).
TEST_P(MoeEqualsOneRank, ExpertsReplicatedOverDp) {
  const MoeRun ref = one_rank(world_size());
  for (int zero : {0, 1, 2, 3}) {
    SCOPED_TRACE(fmt::format("zero {}", zero));
    expect_equal_one_rank(run(deck({fmt::format("parallel.zero={}", zero)}), true), ref);
  }
}

// ep beside pp (dp = world / 2: ep 1 at 2 ranks, ep 2 at 4) under gpipe, 1f1b and interleaved.
TEST_P(MoeEqualsOneRank, BesidePipeline) {
  const int dp = world_size() / 2;
  const MoeRun ref = one_rank(dp);
  for (const char* schedule : {"gpipe", "1f1b", "interleaved"}) {
    SCOPED_TRACE(fmt::format("pp 2, {}, ep {}", schedule, dp));
    std::vector<std::string> keys = {"parallel.pp=2", fmt::format("parallel.ep={}", dp),
                                     fmt::format("parallel.schedule={}", schedule)};
    if (std::string(schedule) == "interleaved") keys.push_back("parallel.virtual_stages=2");
    expect_equal_one_rank(run(deck(keys), true), ref);
  }
  // ZeRO-3 beside pp, in both pp modes (Note [ZeRO-3 units]): the experts' units gathered
  // over their replicas per micro-batch, or once per step.
  for (const char* gather : {"micro_batch", "step"}) {
    SCOPED_TRACE(fmt::format("pp 2, 1f1b, ep {}, zero 3, zero3_gather {}", dp, gather));
    expect_equal_one_rank(
        run(deck({"parallel.pp=2", fmt::format("parallel.ep={}", dp), "parallel.zero=3",
                  fmt::format("parallel.zero3_gather={}", gather)}),
            true),
        ref);
  }
}

// zb-h1 (Note [Mixtures in B]): a mixture's gradients all in B, W only reporting them ready,
// the same calls in the same micro-batch order, so it equals 1f1b bit for bit (losses, norms,
// the mixtures' figures, every parameter): pp 2 beside ep = dp (ep 1 at 2 ranks, dp 2 × ep 2 at
// 4, there with ZeRO-1 and ZeRO-3 too: Note [ZeRO-3 and W]), and at 4 ranks tp 2 with sequence
// parallelism (the span's sum over tp in B's last micro-batch, before W reports it). accum 4:
// W's trail later micro-batches' B's.
TEST_P(MoeEqualsOneRank, ZeroBubbleIsBitwise1F1B) {
  const int dp = world_size() / 2;
  std::vector<std::vector<std::string>> layouts = {{fmt::format("parallel.ep={}", dp)}};
  if (dp == 2)
    layouts.insert(layouts.end(),
                   {{"parallel.ep=2", "parallel.zero=1"},
                    {"parallel.ep=2", "parallel.zero=3", "parallel.zero3_gather=micro_batch"},
                    {"parallel.tp=2", "parallel.sequence_parallel=true"}});
  for (std::vector<std::string> keys : layouts) {
    SCOPED_TRACE(fmt::format("pp 2, {}", fmt::join(keys, ", ")));
    keys.insert(keys.end(), {"parallel.pp=2", "train.accum=4"});
    auto with = [&](const char* schedule) {
      std::vector<std::string> k = keys;
      k.push_back(fmt::format("parallel.schedule={}", schedule));
      return run(deck(k), true);
    };
    expect_bitwise(with("zb-h1"), with("1f1b"));
  }
}

// transformers' balance form beside pp (Note [Transformers' totals across stages]): each
// layer's router gradient needs the counts over every stage's layers, and the loss is counted
// once, on the last stage. gpipe, 1f1b, zb-h1 and interleaved (4 chunks of one layer; with
// every 2, chunks without a mixture pass the totals on), ep beside at 4 ranks (dp 2).
// Coefficient 0.1: a stage using its own counts in backward moves the loss by more than the
// bounds allow.
TEST(MoeLayouts, HfBalanceLossBesidePipeline) {
  const int dp = world_size() / 2;
  for (const char* every : {"1", "2"}) {
    std::vector<std::string> keys = {"model.moe.aux_loss=hf", "model.moe.aux_loss_coeff=0.1",
                                     fmt::format("model.moe.every={}", every)};
    auto with = [&](std::vector<std::string> more) {
      more.insert(more.begin(), keys.begin(), keys.end());
      return moe_deck(more);
    };
    const MoeRun ref = run(with({fmt::format("train.accum={}", 2 * dp)}), false);
    EXPECT_GT(ref.moe[0].aux_loss, 0.0);
    for (const char* schedule : {"gpipe", "1f1b", "interleaved", "zb-h1"}) {
      SCOPED_TRACE(fmt::format("every {}, pp 2, {}, ep {}", every, schedule, dp));
      std::vector<std::string> more = {"parallel.pp=2", fmt::format("parallel.ep={}", dp),
                                       fmt::format("parallel.schedule={}", schedule)};
      if (std::string(schedule) == "interleaved") more.push_back("parallel.virtual_stages=2");
      expect_equal_one_rank(run(with(more), true), ref);
    }
  }
}

// transformers' form under tp with SP (Note [Mixtures and tp]): each tp rank routes its B·T/tp
// rows, and its loss is the form over those rows, reported as the tp ranks' mean, as the switch
// loss is. Per-rank losses differ from one rank's over all rows only by the rows' sample (at
// step 1, the same weights: measured 3e-4 apart at 2 and 4 ranks), while a value over B·T rows
// with counts over B·T/tp is tp² = 4 times too small (measured 0.050 against 0.200). Bound 5%.
TEST(MoeLayouts, HfBalanceLossWithTensorParallel) {
  const int dp = world_size() / 2;
  const std::vector<std::string> keys = {"model.moe.aux_loss=hf", "model.moe.aux_loss_coeff=0.1"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), keys.begin(), keys.end());
    return moe_deck(more);
  };
  const MoeRun ref = run(with({fmt::format("train.accum={}", 2 * dp)}), false);
  std::vector<std::string> tp = {"parallel.tp=2", "parallel.sequence_parallel=true",
                                 fmt::format("parallel.ep={}", dp)};
  const MoeRun got = run(with(tp), true);
  ASSERT_GT(ref.moe[0].aux_loss, 0.0);
  EXPECT_NEAR(got.moe[0].aux_loss / ref.moe[0].aux_loss, 1.0, 0.05)
      << got.moe[0].aux_loss << " at tp 2 against " << ref.moe[0].aux_loss << " on one rank";
}

// Recomputation on one rank (full: the mixture's forward again, the same routing, its figures
// not counted twice; mlp), and full at ep = world, where it runs the all-to-alls again.
TEST_P(MoeEqualsOneRank, WithRecomputation) {
  const MoeRun none = run(deck({}), false);
  for (const char* mode : {"full", "mlp"}) {
    SCOPED_TRACE(mode);
    expect_equal_one_rank(run(deck({fmt::format("train.recompute={}", mode)}), false), none);
  }
  SCOPED_TRACE("full at ep world");
  expect_equal_one_rank(
      run(deck({"train.recompute=full", fmt::format("parallel.ep={}", world_size())}), true),
      one_rank(world_size()));
}

// tp 2 with sequence parallelism (Note [Mixtures and tp]): each tp rank routes its own rows
// with whole experts, the layer's gradients summed over tp; beside ep at 4 ranks (dp 2, ep 2).
// The switch loss is per tp rank's rows, another objective (as at cp 2), so its case is left.
TEST_P(MoeEqualsOneRank, WithTensorParallel) {
  if (GetParam().name == "switch_z") GTEST_SKIP() << "a per-rank balance loss";
  const int dp = world_size() / 2;
  const MoeRun ref = one_rank(dp);
  std::vector<std::string> keys = {"parallel.tp=2", "parallel.sequence_parallel=true"};
  if (dp > 1) keys.push_back(fmt::format("parallel.ep={}", dp));
  expect_equal_one_rank(run(deck(keys), true), ref);
}

INSTANTIATE_TEST_SUITE_P(Mixtures, MoeEqualsOneRank, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name; });

// Capacity (Note [Expert capacity]) is decided by the sending rank over its own micro-batch's
// N·k choices: at dp = ep = world each rank's micro-batch is one of the one-rank run's
// accumulated micro-batches (the same B·T tokens, the same weights), so the same choices drop,
// wherever their expert lives. The reference must drop some, or the test shows nothing.
TEST(MoeLayouts, CapacityAtExpertParallel) {
  const int world = world_size();
  const std::vector<std::string> keys = {"model.moe.capacity_factor=1.0",
                                         "model.moe.aux_loss=switch", "model.moe.z_loss=0.01"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), keys.begin(), keys.end());
    return moe_deck(more);
  };
  const MoeRun ref = run(with({fmt::format("train.accum={}", 2 * world)}), false);
  int64_t dropped = 0;
  for (const MoeStats& m : ref.moe) dropped += m.dropped;
  EXPECT_GT(dropped, 0) << "capacity 1.0 dropped nothing: the case does not test drops";
  for (int ep : {2, 4}) {
    if (ep > world) continue;
    SCOPED_TRACE(fmt::format("ep {}", ep));
    expect_equal_one_rank(run(with({fmt::format("parallel.ep={}", ep)}), true), ref);
  }
}

// ep over dp × cp with cp 2 (ep = world: at 2 ranks the two cp ranks of one sequence, at 4 all
// of dp 2 × cp 2). Each cp rank routes its own chunks' tokens; the z-loss (a mean over tokens)
// and the sigmoid router's loads (sums) do not depend on how tokens are split, so they are
// what this checks. The switch loss and capacity do: both count this rank's N (Notes
// [Auxiliary losses], [Expert capacity]), which cp halves, so at cp 2 they are another
// objective (measured: switch, parameters 1.5e-2 apart after 5 steps; capacity 1.0, other drops).
TEST(MoeLayouts, BesideContextParallel) {
  const int world = world_size();
  const int dp = world / 2;
  for (const Case& c : {kCases[1], kCases[2]}) {
    SCOPED_TRACE(c.name);
    std::vector<std::string> keys = c.keys;
    keys.push_back(fmt::format("train.accum={}", 2 * dp));
    const MoeRun ref = run(moe_deck(keys), false);
    keys = c.keys;
    keys.insert(keys.end(), {"parallel.cp=2", fmt::format("parallel.ep={}", world)});
    expect_equal_one_rank(run(moe_deck(keys), true), ref);
  }
}

// A checkpoint does not depend on ep: saved after 3 steps at one ep, loaded at another over the
// same dp = world (and on one rank, accum 2·world), the last 2 steps are the saving layout's
// own continuation within the bounds above; at the same ep, losses and norms bit for bit. The
// sigmoid case checks that the choice bias (not trained by AdamW) travels with the checkpoint.
// `save_replicas`, `load_replicas`: parallel.dp_replicate of the two layouts (HSDP with ZeRO).
void resume(const std::vector<std::string>& keys, int save_ep, std::vector<int> load_eps,
            int save_zero = 0, int load_zero = 0, int save_replicas = 1, int load_replicas = 1) {
  const int world = world_size();
  const std::string dir = testing::scratch_dir(fmt::format("moe_ckpt_ep{}", save_ep));
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), keys.begin(), keys.end());
    return moe_deck(more);
  };
  auto replicas = [](int r) { return fmt::format("parallel.dp_replicate={}", r); };
  auto be = make_cpu_backend(1);
  MoeRun reference;
  std::string path;
  {
    ProcessGrid grid(complete_layout({.world = world, .dp_replicate = save_replicas}));
    Trainer t(with({fmt::format("parallel.ep={}", save_ep),
                    fmt::format("parallel.zero={}", save_zero), replicas(save_replicas)}),
              TrainContext{be.get(), 1e9, &grid, nullptr});
    MoeRun first;
    run_into(t, 0, 3, first);
    path = t.save(dir, 3, "moe-test", 0);
    run_into(t, 3, 5, reference);
  }
  for (int ep : load_eps) {
    if (ep > world) continue;
    SCOPED_TRACE(fmt::format("saved at ep {}, loaded at ep {}", save_ep, ep));
    ProcessGrid grid(complete_layout({.world = world, .dp_replicate = load_replicas}));
    Trainer t(with({fmt::format("parallel.ep={}", ep), fmt::format("parallel.zero={}", load_zero),
                    replicas(load_replicas)}),
              TrainContext{be.get(), 1e9, &grid, nullptr});
    ASSERT_EQ(t.load(path).step, 3);
    MoeRun after;
    run_into(t, 3, 5, after);
    if (ep == save_ep && save_zero == 0 && load_zero == 0) {
      EXPECT_EQ(after.steps.losses, reference.steps.losses);
      EXPECT_EQ(after.steps.norms, reference.steps.norms);
    }
    expect_equal_one_rank(after, reference);
  }
  SCOPED_TRACE(fmt::format("saved at ep {}, loaded on one rank", save_ep));
  Trainer t(with({fmt::format("train.accum={}", 2 * world)}),
            TrainContext{be.get(), 1e9, nullptr, nullptr});
  t.load(path);
  MoeRun after;
  run_into(t, 3, 5, after);
  expect_equal_one_rank(after, reference);
}

TEST(MoeLayouts, CheckpointSavedAtEp2Resumes) {
  for (const Case& c : {kCases[0], kCases[2]}) {
    SCOPED_TRACE(c.name);
    resume(c.keys, 2, {1, 2, 4});
  }
}

TEST(MoeLayouts, CheckpointSavedAtEp1ResumesAtEp2And4) {
  for (const Case& c : {kCases[0], kCases[2]}) {
    SCOPED_TRACE(c.name);
    resume(c.keys, 1, {2, 4});
  }
}

// ZeRO's checkpoint holds each rank's pieces, the experts' from their own replicas: saved at
// ep 2 with ZeRO-1, it loads at ep 1, 2 and 4 without ZeRO.
TEST(MoeLayouts, CheckpointSavedAtEp2WithZeroResumes) { resume(kCases[2].keys, 2, {1, 2, 4}, 1); }

// ZeRO-3 holds every tensor in shards, the experts' over their replicas (and the sigmoid
// router's bias, which the bias step writes into them): saved at ep 2 with ZeRO-3, it loads at
// ep 1, 2 and 4 without ZeRO; saved without, it loads into ZeRO-3's shards at ep 1, 2 and 4.
TEST(MoeLayouts, CheckpointsCrossLoadWithZero3) {
  resume(kCases[2].keys, 2, {1, 2, 4}, 3, 0);
  resume(kCases[2].keys, 2, {1, 2, 4}, 0, 3);
}

// HSDP (Note [Experts with HSDP]): replica 0 writes the experts' ZeRO-3 shards (each rank of
// the other replica holds the same ones); saved at dp_replicate 2 × dp_shard 2, ep 2, it loads
// at ep 2 over dp 4 without ZeRO (and on one rank); saved there, it loads into HSDP's shards.
TEST(MoeLayouts, CheckpointsCrossLoadWithHsdp) {
  if (world_size() != 4) GTEST_SKIP() << "dp_replicate 2 x dp_shard 2 on 4 ranks";
  resume(kCases[2].keys, 2, {2}, 3, 0, 2, 1);
  resume(kCases[2].keys, 2, {2}, 0, 3, 1, 2);
}

TEST(MoeLayouts, CheckpointSavedAtEp4ResumesAtEp2And1) {
  if (world_size() < 4) GTEST_SKIP() << "needs 4 ranks";
  resume(kCases[0].keys, 4, {1, 2});
}

// Note [Expert parallelism]: a rank that receives no rows still takes part in every exchange.
// One MoeLayer at ep = world with 2 experts a rank, top 2, the router's rows chosen so that
// every token of every rank picks the two experts of one rank (`target`): the others receive
// nothing, and, when target is not 0, rank 0 too. Forward and backward (switch aux and z-loss
// on, so the router's backward has every term) equal one ep-1 layer on each rank's tokens: the
// output, dx and the router's gradient within 1e-5 of their largest (another GEMM blocking of
// the same rows), the experts' gradients summed over every rank's tokens within 1e-5 (one GEMM
// over all peers' rows against one a rank). A hang is the communicator's timeout, 60 s.
TEST(MoeLayer, TokensAllToOneRanksExperts) {
  const int P = world_size();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  GPTConfig cfg;
  cfg.layers = 1;
  cfg.heads = 1;
  cfg.bias = false;
  cfg.channels = 16;
  cfg.activation = Activation::kSwiGLU;
  cfg.mlp_hidden = 24;
  cfg.moe.experts = 2 * P;
  cfg.moe.top_k = 2;
  cfg.moe.ffn_width = 24;
  cfg.moe.aux_loss = MoeAux::kSwitch;
  cfg.moe.aux_coeff = 0.1f;
  cfg.moe.z_coeff = 0.01f;
  const int C = 16, E = 2 * P, El = 2, Fe = 24, fcr = 2 * Fe, N = 12;
  auto be = make_cpu_backend(1);
  auto comm = MpiComm::duplicate(MPI_COMM_WORLD, "ep");
  comm->set_timeout(60);
  auto random = [](size_t n, unsigned seed, float lo, float hi) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = u(gen);
    return v;
  };
  const std::vector<float> fc = random(size_t(E) * fcr * C, 1, -0.3f, 0.3f);
  const std::vector<float> proj = random(size_t(E) * C * Fe, 2, -0.3f, 0.3f);
  for (int target : {0, P - 1}) {
    SCOPED_TRACE(fmt::format("every token to rank {}'s experts", target));
    // x > 0: a row of +0.3 (+noise) scores 16·0.3·x ≈ +5, a row of -0.3 ≈ -5.
    std::vector<float> router = random(size_t(E) * C, 3, -0.05f, 0.05f);
    for (int e = 0; e < E; ++e)
      for (int c = 0; c < C; ++c) router[size_t(e) * C + c] += e / El == target ? 0.3f : -0.3f;
    const MoeWeights full{fc.data(), proj.data(), router.data(), nullptr,
                          nullptr,   nullptr,     nullptr};
    const MoeWeights mine{fc.data() + size_t(rank) * El * fcr * C,
                          proj.data() + size_t(rank) * El * C * Fe,
                          router.data(),
                          nullptr,
                          nullptr,
                          nullptr,
                          nullptr};
    auto x_of = [&](int r) { return random(size_t(N) * C, 10 + unsigned(r), 0.5f, 1.5f); };
    auto dout_of = [&](int r) { return random(size_t(N) * C, 20 + unsigned(r), -1.0f, 1.0f); };
    const float seed = 0.25f;

    MoeLayer ep_layer(cfg, *be, 0, 1, N, ExpertParallel{comm.get(), P, rank}, nullptr);
    std::vector<float> out(size_t(N) * C), dx(size_t(N) * C);
    std::vector<float> dfc(size_t(El) * fcr * C, 0.0f), dproj(size_t(El) * C * Fe, 0.0f),
        drouter(size_t(E) * C, 0.0f);
    const std::vector<float> x = x_of(rank), dout = dout_of(rank);
    ep_layer.forward(0, out.data(), x.data(), mine, N, true);
    ep_layer.backward(0, dx.data(), dout.data(), x.data(), mine,
                      MoeGrads{dfc.data(), dproj.data(), drouter.data(), nullptr, nullptr, nullptr},
                      N, seed);
    // Every choice at the target's experts: N tokens each.
    for (int e = 0; e < E; ++e)
      EXPECT_EQ(ep_layer.step_load()[size_t(e)], e / El == target ? N : 0) << "expert " << e;

    // ep 1 on each rank's tokens in turn; this rank's output, dx and router gradient, the sum of
    // the experts' gradients.
    MoeLayer one(cfg, *be, 0, 1, N, ExpertParallel{}, nullptr);
    std::vector<float> ref_out, ref_dx, ref_drouter;
    std::vector<float> ref_dfc(size_t(E) * fcr * C, 0.0f), ref_dproj(size_t(E) * C * Fe, 0.0f);
    for (int r = 0; r < P; ++r) {
      const std::vector<float> xr = x_of(r), doutr = dout_of(r);
      std::vector<float> o(size_t(N) * C), d(size_t(N) * C), dr(size_t(E) * C, 0.0f);
      one.forward(0, o.data(), xr.data(), full, N, true);
      one.backward(0, d.data(), doutr.data(), xr.data(), full,
                   MoeGrads{ref_dfc.data(), ref_dproj.data(), dr.data(), nullptr, nullptr, nullptr},
                   N, seed);
      if (r == rank) ref_out = o, ref_dx = d, ref_drouter = dr;
    }
    auto expect_near_all = [](const float* a, const float* ref, size_t n, const char* what) {
      float scale = 0;
      double worst = 0;
      for (size_t i = 0; i < n; ++i) scale = std::max(scale, std::abs(ref[i]));
      ASSERT_GT(scale, 0.0f) << what;
      for (size_t i = 0; i < n; ++i) worst = std::max(worst, double(std::abs(a[i] - ref[i])));
      EXPECT_LE(worst / scale, 1e-5) << what;
    };
    expect_near_all(out.data(), ref_out.data(), out.size(), "output");
    expect_near_all(dx.data(), ref_dx.data(), dx.size(), "dx");
    expect_near_all(drouter.data(), ref_drouter.data(), drouter.size(), "router gradient");
    // Only the target's experts received rows: elsewhere both gradients stay exactly 0.
    if (rank == target) {
      expect_near_all(dfc.data(), ref_dfc.data() + size_t(rank) * El * fcr * C, dfc.size(),
                      "experts' fc gradient");
      expect_near_all(dproj.data(), ref_dproj.data() + size_t(rank) * El * C * Fe, dproj.size(),
                      "experts' proj gradient");
    } else {
      EXPECT_TRUE(std::all_of(dfc.begin(), dfc.end(), [](float g) { return g == 0.0f; }));
      EXPECT_TRUE(std::all_of(dproj.begin(), dproj.end(), [](float g) { return g == 0.0f; }));
    }
  }
}

}  // namespace
}  // namespace trident
