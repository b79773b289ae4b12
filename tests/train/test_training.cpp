// Training on the bundled data: the loss falls, runs are reproducible, thread count and
// accumulation change only float rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "train/trainer_parts.h"
#include "train_harness.h"
#include "trident/train.h"

namespace trident {
namespace {

Deck tiny_deck(const std::vector<std::string>& overrides = {}) {
  const std::string yaml = R"(
model: {layers: 2, d_model: 64, heads: 4, vocab: 256, seq_len: 32}
train: {micro_batch: 8, accum: 1, steps: 40, lr: 3.0e-3, warmup_steps: 5, seed: 42,
        val_every: 0, val_batches: 4}
data: {train: inputs/data/tiny-train.bin, valid: inputs/data/tiny-valid.bin, shuffle: true}
run: {threads: 1}
)";
  return parse_deck(yaml, TRIDENT_SOURCE_DIR, overrides);
}

using TrainedRun = testing::RunResult;

TrainedRun train(const Deck& deck, int steps) { return testing::run_steps(deck, nullptr, steps); }

// cp runs on either backend (the CUDA one has attention by blocks since issue 43, part 5), in
// fp32 and in bf16 (widened at the boundary: Note [Widening at the bf16 boundary] in
// src/model/gpt_bf16_widen.cpp); a sequence that does not split into 2·cp chunks is refused
// by its key (exit 2), whatever the precision.
TEST(ContextParallelChecks, Bf16IsAcceptedAndAnUnevenSplitRefused) {
  Deck d = tiny_deck();  // seq_len 32
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    d.run.precision = precision;
    EXPECT_NO_THROW(check_context_parallel(d, 2));
    try {
      check_context_parallel(d, 3);
      FAIL() << "seq_len 32 with parallel.cp 3 was not refused";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::kBadInput);
      EXPECT_NE(std::string(e.what()).find("model.seq_len"), std::string::npos) << e.what();
    }
  }
}

TEST(Schedule, WarmupThenCosineOrConstant) {
  TrainConfig t;
  t.lr = 1.0;
  t.warmup_steps = 4;
  t.steps = 14;
  t.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(lr_at(t, 0), 0.25);
  EXPECT_DOUBLE_EQ(lr_at(t, 3), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(t, 4), 1.0);                  // start of the decay
  EXPECT_NEAR(lr_at(t, 13), 0.1, 1e-12);               // last step reaches lr·min_lr_ratio
  EXPECT_NEAR(lr_at(t, 8) + lr_at(t, 9), 1.1, 1e-12);  // cosine is symmetric about the middle
  t.lr_schedule = "constant";
  EXPECT_DOUBLE_EQ(lr_at(t, 13), 1.0);
}

// 250 steps of a 0.1 M-parameter model on the generated corpus. A model that learned nothing
// stays near ln(256) = 5.5 nats; the corpus's templates and fixed word list are learnable well
// below 2.5 at this size (observed about 1.9, see docs/perf.md), so 2.5 is a clear margin that
// still fails if training is broken.
TEST(Training, LossFallsOnBundledData) {
  Deck d = tiny_deck({"train.steps=250"});
  auto be = make_cpu_backend(2);
  Trainer t(d, TrainContext{be.get(), 1e9});
  double first = 0, last = 0;
  for (int s = 0; s < d.train.steps; ++s) {
    StepStats st = t.train_step(s);
    if (s == 0) first = st.loss;
    last = st.loss;
  }
  EXPECT_GT(first, 5.0);
  EXPECT_LT(last, 2.5);
  const double val = t.validate();
  EXPECT_LT(val, 2.6);
}

TEST(Training, SameSeedTwiceIsBitwiseIdentical) {
  Deck d = tiny_deck();
  TrainedRun a = train(d, 6), b = train(d, 6);
  ASSERT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.norms, b.norms);
  ASSERT_EQ(0, std::memcmp(a.params.data(), b.params.data(), a.params.size() * 4));
  TrainedRun c = train(tiny_deck({"train.seed=43"}), 6);
  EXPECT_NE(a.losses, c.losses);
}

// Thread count changes the order of float sums only: losses agree to ~1e-6 relative after
// a few steps (fp32 rounding, amplified slightly by AdamW's division by √v); 1e-4 is the bound.
TEST(Training, OneAndTwoThreadsAgree) {
  TrainedRun a = train(tiny_deck({"run.threads=1"}), 6);
  TrainedRun b = train(tiny_deck({"run.threads=2"}), 6);
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_NEAR(a.losses[i], b.losses[i], 1e-4 * std::abs(a.losses[i])) << "step " << i;
}

// micro_batch 8 × accum 1 and micro_batch 4 × accum 2 read the same 8 samples per step; the
// gradients differ only in summation order (fp32), so losses agree within 1e-5 relative.
TEST(Training, AccumulationEqualsLargerMicroBatch) {
  TrainedRun a = train(tiny_deck({"train.micro_batch=8", "train.accum=1"}), 6);
  TrainedRun b = train(tiny_deck({"train.micro_batch=4", "train.accum=2"}), 6);
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_NEAR(a.losses[i], b.losses[i], 1e-5 * std::abs(a.losses[i])) << "step " << i;
}

TEST(Training, GradClipScalesTheGradientAndZeroTurnsItOff) {
  // After one step AdamW's first moment is (1 − β1)·g, so it shows the gradient the optimizer
  // saw: scaled by clip/norm with clipping, unscaled with grad_clip 0.
  auto first_moment = [](const Deck& d, double* norm) {
    auto be = make_cpu_backend(1);
    Trainer t(d, TrainContext{be.get(), 1e9});
    *norm = t.train_step(0).grad_norm;
    return std::vector<float>(t.optimizer().m(), t.optimizer().m() + t.model().num_params());
  };
  double norm_clipped = 0, norm_free = 0;
  auto m_clipped = first_moment(tiny_deck({"train.grad_clip=1e-3"}), &norm_clipped);
  auto m_free = first_moment(tiny_deck({"train.grad_clip=0"}), &norm_free);
  ASSERT_EQ(norm_clipped, norm_free);  // the reported norm is the one before clipping
  ASSERT_GT(norm_free, 1e-3);
  const double ratio = 1e-3 / norm_free;
  for (size_t i = 0; i < m_free.size(); i += 997)
    ASSERT_NEAR(m_clipped[i], m_free[i] * ratio, 1e-6 * std::abs(m_free[i] * ratio) + 1e-12) << i;
}

}  // namespace
}  // namespace trident
