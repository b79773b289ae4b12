// ZeRO-3 (parallel.zero 3, Note [ZeRO-3 units] in train/zero3.h): parameters sharded over dp and
// gathered unit by unit, one group ahead. test_zero_training.cpp runs zero 3 beside zero 1 and 2
// in its layouts (dp, dp × tp with and without SP, dp × pp 1F1B and GPipe, accumulation, overlap
// on and off, non-finite steps, checkpoints); this file adds what only ZeRO-3 has: the gathers'
// schedule and count, its two modes, the families, recomputation, the interleaved pipeline, the
// split backward (zb-h1), the memory it holds, and HSDP (every stage, fp32 and bf16 gradients).
// Runs under mpirun with 2 and 4 ranks (dp 2 × pp 2 needs 4).
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

#include "comm/host_pages.h"
#include "train/data_parallel.h"
#include "train/zero3.h"
#include "train_harness.h"
#include "trident/check.h"
#include "trident/grad_reducer.h"

namespace trident {
namespace {

using testing::world_size;

Deck deck(std::vector<std::string> overrides) {
  const std::string yaml = R"(
model: {layers: 4, d_model: 32, heads: 4, vocab: 250, seq_len: 16}
train: {micro_batch: 2, accum: 1, steps: 20, lr: 3.0e-3, warmup_steps: 3, seed: 11,
        val_every: 0}
data: {train: inputs/data/tiny-train.bin, shuffle: true}
comm: {bucket_mb: 0.02, first_bucket_mb: 0.005}
run: {threads: 1}
)";
  return parse_deck(yaml, TRIDENT_SOURCE_DIR, overrides);
}

struct Result {
  std::vector<double> losses, norms;
  std::vector<float> params;  // this rank's tensors back to back, padding left out
  // With replicas (Note [HSDP]): whether every replica ends with these params bit for bit; and
  // testing::shard_grads_not_bf16 after the last step.
  bool same_over_replicas = true;
  size_t shard_grads_not_bf16 = 0;
};

Result train(int tp, int pp, std::vector<std::string> overrides, int steps = 8, int replicas = 1) {
  overrides.push_back(fmt::format("parallel.tp={}", tp));
  overrides.push_back(fmt::format("parallel.pp={}", pp));
  overrides.push_back(fmt::format("parallel.dp_replicate={}", replicas));
  ProcessGrid grid(testing::layout_of(tp, pp, replicas));
  auto be = make_cpu_backend(1);
  Trainer t(deck(overrides), TrainContext{be.get(), 1e9, &grid, nullptr});
  Result r;
  for (int s = 0; s < steps; ++s) {
    const StepStats st = t.train_step(s);
    r.losses.push_back(st.loss);
    r.norms.push_back(st.grad_norm);
  }
  r.shard_grads_not_bf16 = testing::shard_grads_not_bf16(t);
  t.sync_params();  // ZeRO-3: gathers every unit
  for (const ParamInfo& p : t.model().params_info())
    r.params.insert(r.params.end(), t.model().params() + p.offset,
                    t.model().params() + p.offset + p.count);
  if (replicas > 1)
    r.same_over_replicas = testing::same_on_every_rank(grid.dp_replicate().raw(), r.params);
  return r;
}

// Within 1e-6 relative (loss and norm, step by step; the final parameters against max |p|), the
// bound of test_zero_training.cpp for the same reason: ZeRO-3 reduce-scatters the same buckets as
// zero 1 and 2, so it differs from zero 0 only by the order of a bucket's addends at dp 4 (and is
// bitwise equal at dp 2, checked where it applies). A unit gathered stale or into the wrong
// place moves the loss by 1e-3 or more within a step.
void expect_equal(const Result& z, const Result& ref, bool bitwise) {
  ASSERT_EQ(z.losses.size(), ref.losses.size());
  for (size_t i = 0; i < z.losses.size(); ++i) {
    EXPECT_NEAR(z.losses[i], ref.losses[i], 1e-6 * ref.losses[i]) << "step " << i + 1;
    EXPECT_NEAR(z.norms[i], ref.norms[i], 1e-6 * ref.norms[i]) << "step " << i + 1;
  }
  ASSERT_EQ(z.params.size(), ref.params.size());
  EXPECT_LE(testing::max_param_error(z.params, ref.params), 1e-6);
  if (bitwise) {
    EXPECT_EQ(z.losses, ref.losses);
    EXPECT_EQ(0, std::memcmp(z.params.data(), ref.params.data(), z.params.size() * 4));
  }
}

bool dp2() { return world_size() == 2; }

TEST(Zero3, FamiliesAndRecomputationEqualZero0) {
  for (const char* family : {"gpt2", "neox", "llama"})
    for (const char* recompute : {"none", "mlp", "full"}) {
      SCOPED_TRACE(fmt::format("{}, recompute {}", family, recompute));
      std::vector<std::string> keys = testing::family_keys(family);
      keys.push_back(fmt::format("train.recompute={}", recompute));
      auto with = [&](const char* zero) {
        auto o = keys;
        o.push_back(zero);
        return o;
      };
      expect_equal(train(1, 1, with("parallel.zero=3"), 4), train(1, 1, with("parallel.zero=0"), 4),
                   dp2());
    }
}

// The two modes move the same numbers: bitwise equal to the default, and so to zero 0.
TEST(Zero3, ModesEqualZero0) {
  const Result ref = train(1, 1, {"parallel.zero=0", "train.accum=3"}, 5);
  for (const char* mode :
       {"parallel.reshard_after_forward=true", "parallel.reshard_after_forward=false"})
    for (const char* gather : {"parallel.zero3_gather=micro_batch", "parallel.zero3_gather=step"}) {
      SCOPED_TRACE(fmt::format("{}, {}", mode, gather));
      expect_equal(train(1, 1, {"parallel.zero=3", "train.accum=3", mode, gather}, 5), ref, dp2());
    }
  // Each micro-batch's gradients reduced at once, into the shard (Note [ZeRO-2 and accumulation]).
  expect_equal(
      train(1, 1, {"parallel.zero=3", "train.accum=3", "parallel.zero_reduce=micro_batch"}, 5), ref,
      false);
}

// Under pp, both modes with every schedule (zb-h1's W reads no weight: Note [ZeRO-3 and W]).
TEST(Zero3, PipelineSchedulesAndModesEqualZero0) {
  if (world_size() != 4) GTEST_SKIP() << "dp 2 x pp 2 needs 4 ranks";
  for (const char* schedule : {"1f1b", "gpipe", "zb-h1", "interleaved"}) {
    std::vector<std::string> common = {fmt::format("parallel.schedule={}", schedule),
                                       "train.accum=4"};
    if (std::string(schedule) == "interleaved") common.push_back("parallel.virtual_stages=2");
    auto with = [&](std::vector<std::string> extra) {
      auto o = common;
      o.insert(o.end(), extra.begin(), extra.end());
      return o;
    };
    const Result ref = train(1, 2, with({"parallel.zero=0"}), 4);
    for (const char* gather : {"parallel.zero3_gather=micro_batch", "parallel.zero3_gather=step"}) {
      SCOPED_TRACE(fmt::format("{}, {}", schedule, gather));
      expect_equal(train(1, 2, with({"parallel.zero=3", gather}), 4), ref, true);
    }
  }
}

// Note [ZeRO-3 and W]: zb-h1 on one stage, where the tied wte's two contributions come in B
// (the head's) and W (the embedding's), in both modes and with forward's units kept; bitwise
// equal to zero 0 under the same schedule at dp 2, within 1e-6 at dp 4 (expect_equal). A B that
// did not announce its groups would read released weights (zero on the host) and miss by far.
TEST(Zero3, SplitBackwardEqualsZero0) {
  const std::vector<std::string> zb = {"parallel.schedule=zb-h1", "train.accum=3"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), zb.begin(), zb.end());
    return extra;
  };
  const Result ref = train(1, 1, with({"parallel.zero=0"}), 5);
  for (const char* mode :
       {"parallel.reshard_after_forward=true", "parallel.reshard_after_forward=false"})
    for (const char* gather : {"parallel.zero3_gather=micro_batch", "parallel.zero3_gather=step"}) {
      SCOPED_TRACE(fmt::format("{}, {}", mode, gather));
      expect_equal(train(1, 1, with({"parallel.zero=3", mode, gather}), 5), ref, dp2());
    }
}

// The gathers of one step, from the unit log (Note [ZeRO-3 units]). Each wait at a group after a
// pass's first must find its unit asked for at an earlier group (one ahead), never at its own:
// a gather issued late fails here; one issued twice fails the reducer's check and the count.
// The counts, by hand, for 4 tied GPT-2 blocks on one stage (units wte, head, h3..h0, wpe):
//   forward   {wte, wpe}, h0, h1, h2, h3, head (wte kept: the head reads it later)   7
//   backward  {head, wte} still held, h3, h2, h1, h0      4
//   accum 2   the second forward finds h0 held (released only when unused): 6, backward 4
//   reshard_after_forward false: each unit once, 7 (wpe, h*, head, wte); zero3_gather step the same
void expect_ahead(const std::vector<UnitGathers::LogEntry>& log,
                  const std::vector<Zero3Unit>& units) {
  for (size_t i = 0; i < log.size(); ++i) {
    const auto& e = log[i];
    if (e.kind != UnitGathers::LogEntry::kWait || e.position == 0) continue;
    for (size_t j = i; j-- > 0;) {
      if (log[j].unit != e.unit || log[j].kind != UnitGathers::LogEntry::kRequest) continue;
      EXPECT_FALSE(log[j].pass == e.pass && log[j].position == e.position)
          << "unit " << units[size_t(e.unit)].name << " asked for at the group that waits for it ("
          << (e.pass == ParamPass::kForward ? "forward" : "backward") << " group " << e.position
          << ")";
      break;
    }
  }
}

int gathers_in_step(std::vector<std::string> overrides, bool check_ahead = true) {
  overrides.push_back("parallel.zero=3");
  ProcessGrid grid(make_layout(world_size(), 0, 1, 1));
  auto be = make_cpu_backend(1);
  Trainer t(deck(overrides), TrainContext{be.get(), 1e9, &grid, nullptr});
  t.train_step(0);
  UnitGathers& g = t.data_parallel()->unit_gathers();
  g.set_log(true);
  const StepStats s = t.train_step(1);
  if (check_ahead) expect_ahead(g.log(), g.units());
  EXPECT_EQ(s.late_unit_gathers, 0);
  int requests = 0;
  for (const auto& e : g.log()) requests += e.kind == UnitGathers::LogEntry::kRequest;
  EXPECT_EQ(requests, s.unit_gathers);
  return s.unit_gathers;
}

TEST(Zero3, GathersEachUnitOneGroupAheadAndCountsThem) {
  EXPECT_EQ(gathers_in_step({}), 11);
  EXPECT_EQ(gathers_in_step({"train.accum=2"}), 21);
  EXPECT_EQ(gathers_in_step({"parallel.reshard_after_forward=false"}), 7);
  EXPECT_EQ(gathers_in_step({"parallel.zero3_gather=step", "train.accum=2"}), 7);
  // zb-h1: B announces backward's groups, W none (Note [ZeRO-3 and W]): the same counts.
  EXPECT_EQ(gathers_in_step({"parallel.schedule=zb-h1"}), 11);
  EXPECT_EQ(gathers_in_step({"parallel.schedule=zb-h1", "train.accum=2"}), 21);
  EXPECT_EQ(
      gathers_in_step({"parallel.schedule=zb-h1", "parallel.zero3_gather=step", "train.accum=2"}),
      7);
  // An untied Llama: units head (lmw and the final norm), h3..h0, wte; forward wte, h0..h3, head;
  // backward h3..h0 (the head held): 6 + 4.
  EXPECT_EQ(gathers_in_step(testing::family_keys("llama")), 10);
}

// After a step nothing is gathered: the full parameter buffer keeps at most the partial pages at
// its units' ends (and reads zero), and the shards are 1/dp of the padded model. The reported
// peak is about two blocks (the one running, the one gathered ahead: 6.3 MB of the model's
// 50 MB here) plus what transparent huge pages round up (2 MiB at each end); gathering every
// unit, or never releasing one, reaches the whole model.
TEST(Zero3, HoldsOnlyTheShardsBetweenSteps) {
  ProcessGrid grid(make_layout(world_size(), 0, 1, 1));
  auto be = make_cpu_backend(1);
  Trainer t(
      deck({"parallel.zero=3", "model.d_model=256", "model.layers=16", "comm.bucket_mb=0.25"}),
      TrainContext{be.get(), 1e9, &grid, nullptr});
  t.train_step(0);
  t.train_step(1);
  DataParallel& dp = *t.data_parallel();
  const size_t bytes = t.model().num_params() * sizeof(float), page = 4096;
  std::vector<unsigned char> scratch;
  const size_t units = dp.unit_gathers().units().size();
  // Note [Huge pages released]: khugepaged may have filled up to 8 huge pages again.
  const size_t khugepaged = 8 * (size_t(2) << 20);
  EXPECT_LE(resident_bytes(t.model().params(), bytes, scratch), 2 * units * page + khugepaged);
  EXPECT_LE(resident_bytes(t.model().grads(), bytes, scratch),
            (2 * t.reducer()->buckets().size() + 1) * page + khugepaged);
  EXPECT_EQ(dp.shard_size() * size_t(world_size()), t.model().num_params());
  EXPECT_GT(dp.params_resident_peak(), 0u);
  EXPECT_LT(dp.params_resident_peak(), bytes / 2) << "of " << bytes << " bytes";
  const float* p = t.model().params();
  EXPECT_TRUE(std::all_of(p, p + t.model().num_params(), [](float x) { return x == 0.0f; }));
}

// Note [HSDP]: dp 4 as 2 replicas × 2 shards. Every ZeRO stage shards over the pair and sums the
// shard over the replicas; each equals zero 0 within 1e-6 (bitwise where the four addends are
// grouped alike, as here: (a + b) + (c + d) either way, checked only at that). A shard summed
// over dp_shard only, or over the replicas twice, is off by a factor in the first update. A round
// per micro-batch (zero_reduce micro_batch) sums over the replicas in the step's last round only:
// a shard summed there every round counts the earlier micro-batches twice or more.
TEST(Zero3, HsdpEqualsZero0) {
  if (world_size() != 4) GTEST_SKIP() << "2 replicas x 2 shards needs 4 ranks";
  const Result ref = train(1, 1, {"parallel.zero=0", "train.accum=3"}, 6);
  for (const char* zero : {"parallel.zero=1", "parallel.zero=2", "parallel.zero=3"}) {
    SCOPED_TRACE(zero);
    expect_equal(train(1, 1, {zero, "train.accum=3"}, 6, 2), ref, false);
  }
  for (const char* zero : {"parallel.zero=2", "parallel.zero=3"}) {
    SCOPED_TRACE(fmt::format("{}, zero_reduce micro_batch", zero));
    expect_equal(train(1, 1, {zero, "train.accum=3", "parallel.zero_reduce=micro_batch"}, 6, 2),
                 ref, false);
  }
  ProcessGrid grid(complete_layout({.world = 4, .dp_replicate = 2}));
  auto be = make_cpu_backend(1);
  Trainer t(deck({"parallel.zero=3", "parallel.dp_replicate=2"}),
            TrainContext{be.get(), 1e9, &grid, nullptr});
  EXPECT_EQ(t.data_parallel()->shard_ranks(), 2);
  EXPECT_EQ(t.data_parallel()->shard_size() * 2, t.model().num_params());
  EXPECT_EQ(t.optimizer().size() * 2, t.model().num_params());
}

// Note [HSDP with bf16 gradients]: 2 replicas × 2 shards with comm.grad_dtype bf16. Each stage
// (and zero_reduce micro_batch) equals zero 0 with bf16 gradients within Zero.Bf16GradientsEqual-
// Zero0's dp 4 bound (loss 1e-3, norm 1e-2 relative, its reason: four bf16-rounded gradients
// summed perhaps grouped otherwise, each grouping a bf16 rounding, 2^-9, of some elements). That
// bound does not see a hop summed in float32, so: the last step's shard gradients are all bf16
// values (a float32 sum of two bf16 values mostly is not), the run differs from fp32 HSDP, and
// the replicas end with the same weights bit for bit (a hop summed on one replica parts them).
TEST(Zero3, HsdpWithBf16GradientsEqualsZero0) {
  if (world_size() != 4) GTEST_SKIP() << "2 replicas x 2 shards needs 4 ranks";
  const std::vector<std::string> bf16 = {"comm.grad_dtype=bf16", "train.accum=3"};
  auto with = [&](std::vector<std::string> keys) {
    keys.insert(keys.end(), bf16.begin(), bf16.end());
    return keys;
  };
  const Result ref = train(1, 1, with({"parallel.zero=0"}), 6);
  const Result fp32 = train(1, 1, {"parallel.zero=1", "train.accum=3"}, 6, 2);
  const std::vector<std::vector<std::string>> runs = {
      {"parallel.zero=1"},
      {"parallel.zero=2"},
      {"parallel.zero=3"},
      {"parallel.zero=2", "parallel.zero_reduce=micro_batch"},
      {"parallel.zero=3", "parallel.zero_reduce=micro_batch"}};
  for (const auto& keys : runs) {
    SCOPED_TRACE(fmt::format("{}", fmt::join(keys, ", ")));
    const Result z = train(1, 1, with(keys), 6, 2);
    testing::expect_close({z.losses, z.norms}, {ref.losses, ref.norms}, 1e-3, 1e-2);
    EXPECT_TRUE(z.same_over_replicas) << "the replicas' weights differ";
    EXPECT_EQ(z.shard_grads_not_bf16, 0u) << "a hop did not sum in bf16";
    EXPECT_NE(0, std::memcmp(z.params.data(), fp32.params.data(), z.params.size() * 4));
  }
}

// An HSDP ZeRO-3 checkpoint (replica 0 of each shard writes it) resumes on one rank at zero 0:
// the next steps equal the saver's own within 1e-5 (loss), as test_zero_training.cpp's
// cross-loads. With bf16 gradients (Note [HSDP with bf16 gradients]) the checkpoint is the same
// float32 state: HSDP resumed from it continues as the saver did bit for bit, and one rank
// (whose gradients are never sent) matches the first step after the load within 1e-5, the later
// ones within the bf16 bound of Zero3.HsdpWithBf16GradientsEqualsZero0 (1e-3).
TEST(Zero3, HsdpCheckpointsCrossLoad) {
  if (world_size() != 4) GTEST_SKIP() << "2 replicas x 2 shards needs 4 ranks";
  auto be = make_cpu_backend(1);
  std::string dir;
  auto run = [&](std::vector<std::string> o, ProcessGrid* grid, int accum, bool save, bool load,
                 int from, int to) {
    o.push_back(fmt::format("train.accum={}", accum));
    Trainer t(deck(o), TrainContext{be.get(), 1e9, grid, nullptr});
    if (load) EXPECT_EQ(t.load(latest_checkpoint(dir)).step, from);
    std::vector<double> losses;
    for (int i = from; i < to; ++i) {
      losses.push_back(t.train_step(i).loss);
      if (save && i + 1 == 3) t.save(dir, 3, "run-hsdp", 1);
    }
    return losses;
  };
  for (const std::string dtype : {"fp32", "bf16"}) {
    SCOPED_TRACE(dtype);
    dir = testing::scratch_dir("zero3_hsdp_" + dtype);
    const std::vector<std::string> keys = {"parallel.zero=3", "parallel.dp_replicate=2",
                                           "comm.grad_dtype=" + dtype};
    std::vector<double> hsdp, resumed;
    {
      ProcessGrid grid(complete_layout({.world = 4, .dp_replicate = 2}));
      hsdp = run(keys, &grid, 1, true, false, 0, 6);
      if (dtype == "bf16") resumed = run(keys, &grid, 1, false, true, 3, 6);
    }
    if (dtype == "bf16") EXPECT_EQ(resumed, std::vector<double>(hsdp.begin() + 3, hsdp.end()));
    const std::vector<double> one = run({"parallel.zero=0"}, nullptr, 4, false, true, 3, 6);
    for (size_t i = 0; i < one.size(); ++i) {
      const double rel = dtype == "fp32" || i == 0 ? 1e-5 : 1e-3;
      EXPECT_NEAR(one[i], hsdp[3 + i], rel * hsdp[3 + i]) << "step " << i + 4;
    }
  }
}

TEST(Zero3, RefusesWhatIsNotBuilt) {
  ProcessGrid grid(make_layout(world_size(), 0, 1, 1));
  auto be = make_cpu_backend(1);
  auto message_of = [&](std::vector<std::string> o, const char* precision = "fp32") {
    try {
      Deck d = deck(o);
      d.run.precision = precision;  // past the deck's refusal of bf16 on the CPU
      Trainer t(d, TrainContext{be.get(), 1e9, &grid, nullptr});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // Note [bf16 unit gathers]: the bf16 weights are gathered into a device's unit pool.
  EXPECT_NE(message_of({"parallel.zero=3"}, "bf16").find("run.precision bf16 needs a device"),
            std::string::npos);
}

}  // namespace
}  // namespace trident
