// ZeRO (parallel.zero, Note [ZeRO-1] and Note [ZeRO-2 on the host] in train/zero.h): AdamW's
// state sharded over dp, each bucket reduce-scattered and the parameters all-gathered before
// the next forward; with stage 2 each reduced bucket's gradient pages are released too; with 3
// the parameters are sharded and gathered unit by unit (Note [ZeRO-3 units] in train/zero3.h;
// its own tests: test_zero3_training.cpp). All stages must train as the replicated optimizer does,
// in every layout, with overlap on or off, and their checkpoints must load in any layout at any
// stage. Runs under mpirun with 2 and 4 ranks; the layouts that need 4 (dp 2 × tp 2, dp 2 × pp 2)
// are skipped on 2.
#include <gtest/gtest.h>
#include <mpi.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "comm/host_pages.h"
#include "train_harness.h"
#include "trident/check.h"
#include "trident/grad_reducer.h"

namespace trident {
namespace {

using testing::world_size;

Deck deck(std::vector<std::string> overrides) {
  const std::string yaml = R"(
model: {layers: 4, d_model: 32, heads: 4, vocab: 250, seq_len: 16}
train: {micro_batch: 2, accum: 2, steps: 20, lr: 3.0e-3, warmup_steps: 3, seed: 11,
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
  size_t optimizer_floats = 0, model_floats = 0;
};

std::vector<float> unpadded_params(Trainer& t) {
  t.sync_params();
  std::vector<float> out;
  for (const ParamInfo& p : t.model().params_info())
    out.insert(out.end(), t.model().params() + p.offset, t.model().params() + p.offset + p.count);
  return out;
}

Result train(int tp, int pp, std::vector<std::string> overrides, int steps = 20) {
  overrides.push_back(fmt::format("parallel.tp={}", tp));
  overrides.push_back(fmt::format("parallel.pp={}", pp));
  ProcessGrid grid(make_layout(world_size(), 0, tp, pp));
  auto be = make_cpu_backend(1);
  Trainer t(deck(overrides), TrainContext{be.get(), 1e9, &grid, nullptr});
  Result r;
  for (int s = 0; s < steps; ++s) {
    const StepStats st = t.train_step(s);
    r.losses.push_back(st.loss);
    r.norms.push_back(st.grad_norm);
  }
  r.params = unpadded_params(t);
  r.optimizer_floats = t.optimizer().size();
  r.model_floats = t.model().num_params();
  return r;
}

// The issue's bound: 1e-6 relative, step by step, on the loss and the gradient norm, and on
// every final parameter relative to the largest |parameter|. zero 1 sums each bucket with a
// reduce-scatter instead of an all-reduce (at dp 4 another order of four addends) and the norm
// in other groups (per piece, then over dp); those are rounding differences of ~1e-7 of a
// float, which 20 AdamW steps keep well under 1e-6 here. A wrong shard (an update applied to
// the wrong slice, a missed piece, a bucket gathered from the wrong rank) moves the loss by
// 1e-3 or more within a step or two.
void expect_equal_within_1e6(const Result& z, const Result& ref, double param_bound = 1e-6) {
  ASSERT_EQ(z.losses.size(), ref.losses.size());
  double worst_loss = 0, worst_norm = 0, worst_param = 0;
  for (size_t i = 0; i < z.losses.size(); ++i) {
    worst_loss = std::max(worst_loss, std::abs(z.losses[i] - ref.losses[i]) / ref.losses[i]);
    worst_norm = std::max(worst_norm, std::abs(z.norms[i] - ref.norms[i]) / ref.norms[i]);
    EXPECT_NEAR(z.losses[i], ref.losses[i], 1e-6 * ref.losses[i]) << "step " << i + 1;
    EXPECT_NEAR(z.norms[i], ref.norms[i], 1e-6 * ref.norms[i]) << "step " << i + 1;
  }
  ASSERT_EQ(z.params.size(), ref.params.size());
  worst_param = std::max(worst_param, testing::max_param_error(z.params, ref.params));
  EXPECT_LE(worst_param, param_bound);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    fmt::print("  worst relative difference over {} steps: loss {:.2g}, grad norm {:.2g}, "
               "parameters {:.2g} of max |p|\n",
               z.losses.size(), worst_loss, worst_norm, worst_param);
}

void expect_bitwise(const Result& a, const Result& b) {
  ASSERT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.norms, b.norms);
  ASSERT_EQ(a.params.size(), b.params.size());
  ASSERT_EQ(0, std::memcmp(a.params.data(), b.params.data(), a.params.size() * 4));
}

const char* const kStages[] = {"parallel.zero=1", "parallel.zero=2", "parallel.zero=3"};

TEST(Zero, DataParallelEqualsZero0) {
  const Result ref = train(1, 1, {"parallel.zero=0"});
  for (const char* stage : kStages) {
    SCOPED_TRACE(stage);
    const Result z = train(1, 1, {stage});
    expect_equal_within_1e6(z, ref);
    // The moments are 1/dp of the (padded) model on each rank.
    EXPECT_EQ(z.optimizer_floats * size_t(world_size()), z.model_floats);
  }
}

TEST(Zero, WithTensorParallelEqualsZero0) {
  if (world_size() != 4) GTEST_SKIP() << "dp 2 x tp 2 needs 4 ranks";
  const Result ref = train(2, 1, {"parallel.zero=0"});
  for (const char* stage : kStages) {
    SCOPED_TRACE(stage);
    expect_equal_within_1e6(train(2, 1, {stage}), ref);
  }
}

TEST(Zero, WithSequenceParallelEqualsZero0) {
  if (world_size() != 4) GTEST_SKIP() << "dp 2 x tp 2 needs 4 ranks";
  const Result ref = train(2, 1, {"parallel.zero=0", "parallel.sequence_parallel=true"});
  for (const char* stage : kStages) {
    SCOPED_TRACE(stage);
    expect_equal_within_1e6(train(2, 1, {stage, "parallel.sequence_parallel=true"}), ref);
  }
}

// The tied wte is on both stages, in a bucket of its own, and its shard is summed over the
// embedding group.
TEST(Zero, WithPipelineEqualsZero0) {
  if (world_size() != 4) GTEST_SKIP() << "dp 2 x pp 2 needs 4 ranks";
  const Result ref = train(1, 2, {"parallel.zero=0"});
  const Result ref_gpipe = train(1, 2, {"parallel.zero=0", "parallel.schedule=gpipe"}, 6);
  for (const char* stage : kStages) {
    SCOPED_TRACE(stage);
    expect_equal_within_1e6(train(1, 2, {stage}), ref);
    expect_equal_within_1e6(train(1, 2, {stage, "parallel.schedule=gpipe"}, 6), ref_gpipe);
  }
}

// Gradient accumulation over 4 micro-batches (the deck's 2 elsewhere): the full buffer
// accumulates, and is reduce-scattered (and with stage 2 released) on the last one only.
TEST(Zero, WithLongerAccumulationEqualsZero0) {
  const Result ref = train(1, 1, {"parallel.zero=0", "train.accum=4"}, 8);
  for (const char* stage : kStages) {
    SCOPED_TRACE(stage);
    expect_equal_within_1e6(train(1, 1, {stage, "train.accum=4"}, 8), ref);
  }
}

// Note [ZeRO-2 and accumulation]: reduce-scattering every micro-batch into the shard sums the
// same numbers in another grouping ((a1 + b1) + (a2 + b2) instead of (a1 + a2) + (b1 + b2)), so
// the bound is the 1e-6 of the other ZeRO tests; in every layout it supports, with accum 2 and
// 4, and with the LayerNorms' tp partial sums reduced every micro-batch (sequence parallel).
// A round that replaced the shard instead of adding to it, or a backward that wrote a bucket
// still being reduced, moves the loss by far more within a step.
TEST(Zero, ReducingEveryMicroBatchEqualsZero0) {
  // Loss and norm within the issue's 1e-6 (measured ≤ 3e-8). The final parameters within 2e-6
  // of max |p|, not 1e-6: the sums are grouped by micro-batch, one more rounding each, and
  // AdamW's m / √v scales a gradient's rounding up where the gradient is near zero; measured
  // 1.05e-6 at dp 2 after 20 steps, 3.5–7.5e-7 in the other cases.
  constexpr double kParams = 2e-6;
  auto each = [](std::vector<std::string> o) {
    o.push_back("parallel.zero=2");
    o.push_back("parallel.zero_reduce=micro_batch");
    return o;
  };
  expect_equal_within_1e6(train(1, 1, each({})), train(1, 1, {"parallel.zero=0"}), kParams);
  expect_equal_within_1e6(train(1, 1, each({"train.accum=4"}), 8),
                          train(1, 1, {"parallel.zero=0", "train.accum=4"}, 8), kParams);
  expect_equal_within_1e6(train(1, 1, each({"comm.overlap=false"}), 6),
                          train(1, 1, {"parallel.zero=0"}, 6), kParams);
  if (world_size() != 4) return;  // dp 2 x tp 2 and dp 2 x pp 2 need 4 ranks
  const std::vector<std::string> sp = {"parallel.sequence_parallel=true"};
  expect_equal_within_1e6(train(2, 1, each(sp)), train(2, 1, {"parallel.zero=0", sp[0]}), kParams);
  expect_equal_within_1e6(train(1, 2, each({})), train(1, 2, {"parallel.zero=0"}), kParams);
  expect_equal_within_1e6(train(1, 2, each({"parallel.schedule=gpipe"}), 6),
                          train(1, 2, {"parallel.zero=0", "parallel.schedule=gpipe"}, 6), kParams);
}

// Where the sums agree (dp 2: a + b either way), zero 1 and zero 0 give the same bits: the
// losses and every parameter. The reported norm is summed in double in other groups (per piece,
// then over dp): it differs by ~1e-15 relative (measured 1.8e-15), far too little to change
// the float clipping factor here.
TEST(Zero, BitwiseEqualToZero0WhereTheSumsAgree) {
  if (world_size() != 2) GTEST_SKIP() << "dp 2 only: four addends may be summed in other orders";
  const Result ref = train(1, 1, {"parallel.zero=0"});
  for (const char* stage : kStages) {
    SCOPED_TRACE(stage);
    const Result z = train(1, 1, {stage});
    ASSERT_EQ(z.losses, ref.losses);
    for (size_t i = 0; i < z.norms.size(); ++i)
      EXPECT_NEAR(z.norms[i], ref.norms[i], 1e-12 * ref.norms[i]) << "step " << i + 1;
    ASSERT_EQ(z.params.size(), ref.params.size());
    ASSERT_EQ(0, std::memcmp(z.params.data(), ref.params.data(), z.params.size() * 4));
  }
}

// comm.grad_dtype bf16 (Note [bf16 gradient compression]): ZeRO's reduce-scatters travel as
// bf16 as the all-reduce does. At dp 2 each sum is bf16(a) + bf16(b) rounded either way, so
// every stage equals zero 0 with bf16 gradients bit for bit (the norm as above), and differs
// from fp32 gradients (so the bf16 path is used). At dp 4 four bf16 addends may be summed in
// another order: a bf16 rounding (2^-9 relative) of some elements, bounded as
// DataParallel.Bf16GradientsAreUsedAndStayClose bounds bf16 against fp32 (loss 1e-3, norm 1e-2);
// there the bits at dp 2 (and MpiCommBf16.ReduceScatterSumsInBf16) catch an fp32 reduce-scatter.
// (Planted: an fp32 reduce-scatter fails dp 2's bits; dp 4's bound alone does not see it.)
TEST(Zero, Bf16GradientsEqualZero0) {
  const Result ref = train(1, 1, {"parallel.zero=0", "comm.grad_dtype=bf16"}, 10);
  const Result fp32 = train(1, 1, {"parallel.zero=1"}, 10);
  for (const char* stage : kStages) {
    SCOPED_TRACE(stage);
    const Result z = train(1, 1, {stage, "comm.grad_dtype=bf16"}, 10);
    EXPECT_NE(0, std::memcmp(z.params.data(), fp32.params.data(), z.params.size() * 4))
        << "the reduce-scatters did not travel as bf16";
    if (world_size() == 2) {
      ASSERT_EQ(z.losses, ref.losses);
      for (size_t i = 0; i < z.norms.size(); ++i)
        EXPECT_NEAR(z.norms[i], ref.norms[i], 1e-12 * ref.norms[i]) << "step " << i + 1;
      ASSERT_EQ(0, std::memcmp(z.params.data(), ref.params.data(), z.params.size() * 4));
    } else {
      testing::expect_close(testing::RunResult{z.losses, z.norms},
                            testing::RunResult{ref.losses, ref.norms}, 1e-3, 1e-2);
    }
  }
}

TEST(Zero, OverlapOnAndOffAreBitwiseIdentical) {
  const std::vector<std::vector<std::string>> bucketings = {
      {"comm.bucket_mb=1e6", "comm.first_bucket_mb=1e6"},    // one bucket (wte alone with pp)
      {"comm.bucket_mb=1e-9", "comm.first_bucket_mb=1e-9"},  // one bucket per parameter
      {},                                                    // the deck's mixed buckets
      // A slow emulated link: the gathers are still on the wire when the next forward starts,
      // so a forward that did not wait for its buckets would read the old parameters.
      {"comm.emulate_gbps=0.2"},
  };
  for (const char* stage : kStages)
    for (const auto& b : bucketings) {
      SCOPED_TRACE(stage);
      auto on = b, off = b;
      on.insert(on.end(), {stage, "comm.overlap=true"});
      off.insert(off.end(), {stage, "comm.overlap=false"});
      expect_bitwise(train(1, 1, on, 8), train(1, 1, off, 8));
    }
}

TEST(Zero, ReportsTheAllGatherApartFromTheReduceScatter) {
  ProcessGrid grid(make_layout(world_size(), 0, 1, 1));
  auto be = make_cpu_backend(1);
  Trainer t(deck({"parallel.zero=1"}), TrainContext{be.get(), 1e9, &grid, nullptr});
  const StepStats first = t.train_step(0), second = t.train_step(1);
  EXPECT_GT(first.comm_ms, 0.0);          // the reduce-scatters
  EXPECT_EQ(first.gather_comm_ms, 0.0);   // no round was waited for before the first update
  EXPECT_GT(second.gather_comm_ms, 0.0);  // the first update's round, read by step 2's forward
  EXPECT_GE(second.gather_exposed_ms, 0.0);
  const std::vector<Bucket>& buckets = t.reducer()->buckets();
  ASSERT_TRUE(t.reducer()->sharded());
  for (size_t b = 0; b < buckets.size(); ++b)
    EXPECT_EQ(buckets[b].count % (16 * size_t(world_size())), 0u) << "bucket " << b;
}

std::string scratch_dir(const std::string& name) { return testing::scratch_dir("zero_" + name); }

struct Layout {
  int tp = 1, pp = 1, zero = 0;
  bool on_one_rank = false;
};

Result steps(Trainer& t, int from, int to) {
  Result r;
  for (int i = from; i < to; ++i) {
    const StepStats st = t.train_step(i);
    r.losses.push_back(st.loss);
    r.norms.push_back(st.grad_norm);
  }
  return r;
}

// Saves after 4 steps in `save`, loads in `load`; the next 4 steps match the saver's own
// continuation within 1e-5 (loss) and 1e-4 (norm) relative, testing::expect_close's bounds as
// in test_ckpt_training.cpp: layouts differ by summation order only, while a moment left at
// zero or loaded into the wrong slice changes the first update after the load by far more.
void cross_load(Layout save, Layout load) {
  const int world = world_size();
  auto dp_of = [&](const Layout& l) { return l.on_one_rank ? 1 : world / (l.tp * l.pp); };
  const std::string dir =
      scratch_dir(fmt::format("z{}tp{}pp{}_to_z{}tp{}pp{}{}", save.zero, save.tp, save.pp,
                              load.zero, load.tp, load.pp, load.on_one_rank ? "_one" : ""));
  auto layout_deck = [&](const Layout& l, int accum) {
    return deck({fmt::format("parallel.tp={}", l.tp), fmt::format("parallel.pp={}", l.pp),
                 fmt::format("parallel.zero={}", l.zero), fmt::format("train.accum={}", accum)});
  };
  auto be = make_cpu_backend(1);
  const int saved_accum = 4 / dp_of(save);  // the same global batch: 2 × 4 samples
  Result reference;
  {
    ProcessGrid grid(make_layout(world, 0, save.tp, save.pp));
    Trainer t(layout_deck(save, saved_accum), TrainContext{be.get(), 1e9, &grid, nullptr});
    steps(t, 0, 4);
    t.save(dir, 4, "run-zero", 1);
    reference = steps(t, 4, 8);
  }
  std::unique_ptr<ProcessGrid> grid;
  if (!load.on_one_rank)
    grid = std::make_unique<ProcessGrid>(make_layout(world, 0, load.tp, load.pp));
  Trainer t(layout_deck(load, 4 / dp_of(load)), TrainContext{be.get(), 1e9, grid.get(), nullptr});
  ASSERT_EQ(t.load(latest_checkpoint(dir)).step, 4);
  const Result after = steps(t, 4, 8);
  ASSERT_EQ(after.losses.size(), reference.losses.size());
  for (size_t i = 0; i < after.losses.size(); ++i) {
    EXPECT_NEAR(after.losses[i], reference.losses[i], 1e-5 * reference.losses[i])
        << "step " << i + 5;
    EXPECT_NEAR(after.norms[i], reference.norms[i], 1e-4 * reference.norms[i]) << "step " << i + 5;
  }
}

TEST(Zero, CheckpointLoadsAtZero0OnOneRank) {
  cross_load({.zero = 1}, {.zero = 0, .on_one_rank = true});
  cross_load({.zero = 2}, {.zero = 0, .on_one_rank = true});  // the issue's: zero 2 → one rank
  cross_load({.zero = 3}, {.zero = 0, .on_one_rank = true});  // ZeRO-3's parameter pieces
}

TEST(Zero, CheckpointsCrossLoadBetweenStagesAndLayouts) {
  if (world_size() == 4) {
    cross_load({.zero = 0}, {.tp = 2, .zero = 2});           // dp 4 → dp 2 × tp 2 at zero 2
    cross_load({.tp = 2, .zero = 1}, {.pp = 2, .zero = 2});  // dp 2 × tp 2 → dp 2 × pp 2
    cross_load({.pp = 2, .zero = 2}, {.zero = 0});           // dp 2 × pp 2 → dp 4, zero 0
    cross_load({.zero = 2}, {.zero = 1});                    // dp 4, stage 2 → stage 1
    cross_load({.zero = 3}, {.tp = 2, .zero = 1});           // ZeRO-3 dp 4 → dp 2 × tp 2
    cross_load({.tp = 2, .zero = 1}, {.zero = 3});           // and back
    cross_load({.pp = 2, .zero = 3}, {.tp = 2, .zero = 3});  // dp 2 × pp 2 → dp 2 × tp 2
  } else {
    cross_load({.zero = 0}, {.zero = 2});
    cross_load({.zero = 2}, {.zero = 1});
    cross_load({.zero = 3}, {.zero = 1});
    cross_load({.zero = 0}, {.zero = 3});
  }
}

// Note [ZeRO-2 on the host]: after a step, stage 2 holds the full gradient buffer's memory only
// in the partial pages at the buckets' ends (at most 2 per bucket), and the buffer reads zero;
// stage 1 keeps every page. The peak it reports is at most the buffer.
TEST(Zero, Stage2GivesTheGradientPagesBack) {
  ProcessGrid grid(make_layout(world_size(), 0, 1, 1));
  auto be = make_cpu_backend(1);
  std::vector<unsigned char> scratch;
  for (int zero : {1, 2}) {
    Trainer t(deck({fmt::format("parallel.zero={}", zero), "model.d_model=64"}),
              TrainContext{be.get(), 1e9, &grid, nullptr});
    const size_t bytes = t.model().num_params() * sizeof(float);
    const StepStats st = t.train_step(0);
    t.train_step(1);
    const size_t resident = resident_bytes(t.model().grads(), bytes, scratch);
    const size_t page = 4096, buckets = t.reducer()->buckets().size();
    if (zero == 1) {
      EXPECT_GE(resident + page, bytes);  // all of it (the first page may start mid-page)
      EXPECT_EQ(st.grad_resident_bytes, 0u);
      EXPECT_EQ(t.memory_bytes().grads_resident, t.memory_bytes().grads);
      continue;
    }
    EXPECT_LE(resident, (2 * buckets + 1) * page) << "of " << bytes << " bytes";
    const float* g = t.model().grads();
    EXPECT_TRUE(std::all_of(g, g + t.model().num_params(), [](float x) { return x == 0.0f; }));
    EXPECT_GT(st.grad_resident_bytes, 0u);
    EXPECT_LE(st.grad_resident_bytes, bytes + 2 * page);  // whole pages: both ends may be partial
    // On a model this small backward writes every bucket before the first reduce-scatter ends,
    // so the peak is about the whole buffer; the saving at GPT-2 size is a bench figure.
    EXPECT_LE(t.memory_bytes().grads_resident, t.memory_bytes().grads + 2 * page);
  }
}

// Note [Bounded gradient memory]: behind a link much slower than backward, ZeRO-2 without a
// bound would hold every bucket (the test above: the whole buffer on a small model); with it,
// backward waits, and the full buffer never holds more than the bound (one bucket) plus the
// bucket that tipped it and the one being written, plus the partial pages each released bucket
// keeps (2 per bucket). The figures: d_model 128, 4 layers (3.3 MB of gradient), 0.25 MiB
// buckets (13), a 0.1 Gbit/s emulated link (21 ms per bucket, against ~1 ms of backward each).
TEST(Zero, Stage2BoundsTheGradientsItHolds) {
  ProcessGrid grid(make_layout(world_size(), 0, 1, 1));
  auto be = make_cpu_backend(1);
  Trainer t(deck({"parallel.zero=2", "model.d_model=128", "comm.bucket_mb=0.25",
                  "comm.first_bucket_mb=0.25", "comm.emulate_gbps=0.1", "train.accum=1"}),
            TrainContext{be.get(), 1e9, &grid, nullptr});
  const size_t bytes = t.model().num_params() * sizeof(float), page = 4096;
  size_t largest = 0;
  for (const Bucket& b : t.reducer()->buckets())
    largest = std::max(largest, b.count * sizeof(float));
  const size_t buckets = t.reducer()->buckets().size();
  ASSERT_GE(buckets, 8u);
  StepStats st;
  for (int step = 0; step < 2; ++step) st = t.train_step(step);
  const size_t bound = size_t(0.25 * 1024 * 1024);
  EXPECT_GT(st.held_wait_ms, 0.0) << "backward never waited: the bound was not in force";
  EXPECT_LE(st.grad_resident_bytes, bound + 2 * largest + 2 * buckets * page)
      << "of " << bytes << " bytes";
  EXPECT_LT(st.grad_resident_bytes, bytes / 2);
}

// Note [Non-finite steps] over dp, with and without ZeRO: every rank takes the skip (no rank
// waits in a collective the others skipped), and the sharded runs still equal the replicated
// one — the dropped update leaves the shards and the gathered parameters as they were.
TEST(Zero, NonFiniteStepsAreSkippedOnEveryRank) {
  setenv("TRIDENT_FAULT_NAN_STEPS", "3", 1);
  const Result ref = train(1, 1, {"parallel.zero=0", "train.nonfinite=skip"}, 6);
  std::vector<Result> sharded;
  for (const char* stage : kStages)
    sharded.push_back(train(1, 1, {stage, "train.nonfinite=skip"}, 6));
  unsetenv("TRIDENT_FAULT_NAN_STEPS");
  ASSERT_TRUE(std::isnan(ref.norms[2]));
  for (const Result& z : sharded) {
    ASSERT_TRUE(std::isnan(z.norms[2]));
    for (size_t i = 0; i < z.losses.size(); ++i) {
      EXPECT_NEAR(z.losses[i], ref.losses[i], 1e-6 * ref.losses[i]) << "step " << i + 1;
      if (i != 2) EXPECT_NEAR(z.norms[i], ref.norms[i], 1e-6 * ref.norms[i]) << "step " << i + 1;
    }
    ASSERT_EQ(0, std::memcmp(z.params.data(), ref.params.data(), z.params.size() * 4));
  }
}

// Bad combinations are refused before anything is allocated, naming the key.
TEST(Zero, RefusesWhatIsNotBuilt) {
  ProcessGrid grid(make_layout(world_size(), 0, 1, 1));
  auto be = make_cpu_backend(1);
  auto message_of = [&](std::vector<std::string> o) -> std::string {
    try {
      Trainer t(deck(o), TrainContext{be.get(), 1e9, &grid, nullptr});
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message_of({"parallel.zero=1", "parallel.zero_reduce=micro_batch"})
                .find("parallel.zero_reduce: micro_batch needs parallel.zero 2 or 3 (got 1)"),
            std::string::npos);
}

}  // namespace
}  // namespace trident
