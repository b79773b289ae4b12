// Note [Non-finite steps] (train/trainer.cpp): train.nonfinite stop | skip, with the NaN put in
// by TRIDENT_FAULT_NAN_STEPS (every rank poisons one element of its reduced gradient).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "trident/check.h"
#include "trident/train.h"

namespace trident {
namespace {

Deck tiny_deck(const std::vector<std::string>& overrides) {
  const std::string yaml = R"(
model: {layers: 2, d_model: 32, heads: 4, vocab: 256, seq_len: 16}
train: {micro_batch: 4, accum: 1, steps: 10, lr: 3.0e-3, warmup_steps: 2, seed: 3,
        val_every: 0}
data: {train: inputs/data/tiny-train.bin, shuffle: true}
run: {threads: 1}
)";
  return parse_deck(yaml, TRIDENT_SOURCE_DIR, overrides);
}

std::vector<float> params_of(Trainer& t) {
  return {t.model().params(), t.model().params() + t.model().num_params()};
}

// Skip: the poisoned step changes nothing (parameters and moments bitwise as before it), is
// marked, and training goes on with finite losses; the step after it is the same as the
// unpoisoned run's next step would be from the same state, so the runs differ only by the one
// dropped update.
TEST(NonFinite, SkipDropsTheUpdateAndGoesOn) {
  setenv("TRIDENT_FAULT_NAN_STEPS", "3", 1);
  auto be = make_cpu_backend(1);
  Trainer t(tiny_deck({"train.nonfinite=skip"}), TrainContext{be.get(), 1e9});
  unsetenv("TRIDENT_FAULT_NAN_STEPS");
  t.train_step(0);
  t.train_step(1);
  const std::vector<float> before = params_of(t);
  const std::vector<float> m_before(t.optimizer().m(), t.optimizer().m() + t.optimizer().size());
  const StepStats bad = t.train_step(2);
  EXPECT_TRUE(bad.skipped);
  EXPECT_EQ(bad.skips_in_a_row, 1);
  EXPECT_TRUE(std::isnan(bad.grad_norm));
  EXPECT_EQ(params_of(t), before);
  EXPECT_EQ(0, std::memcmp(m_before.data(), t.optimizer().m(), m_before.size() * 4));
  for (int s = 3; s < 6; ++s) {
    const StepStats st = t.train_step(s);
    EXPECT_FALSE(st.skipped) << "step " << s + 1;
    EXPECT_TRUE(std::isfinite(st.loss) && std::isfinite(st.grad_norm)) << "step " << s + 1;
  }
  EXPECT_NE(params_of(t), before);
}

TEST(NonFinite, StopEndsWithAMessageAndAppliesNothing) {
  setenv("TRIDENT_FAULT_NAN_STEPS", "2", 1);
  auto be = make_cpu_backend(1);
  Trainer t(tiny_deck({}), TrainContext{be.get(), 1e9});  // stop is the default
  unsetenv("TRIDENT_FAULT_NAN_STEPS");
  t.train_step(0);
  const std::vector<float> before = params_of(t);
  try {
    t.train_step(1);
    FAIL() << "a non-finite step did not stop the run";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("step 2: the loss is"), std::string::npos) << m;
    EXPECT_NE(m.find("train.nonfinite: skip"), std::string::npos) << m;
    EXPECT_EQ(m.find(".cpp"), std::string::npos) << "an internal-looking message: " << m;
  }
  EXPECT_EQ(params_of(t), before);
}

TEST(NonFinite, TooManySkipsInARowStop) {
  setenv("TRIDENT_FAULT_NAN_STEPS", "2,4,5,6", 1);
  auto be = make_cpu_backend(1);
  Trainer t(tiny_deck({"train.nonfinite=skip", "train.max_skips=2"}), TrainContext{be.get(), 1e9});
  unsetenv("TRIDENT_FAULT_NAN_STEPS");
  EXPECT_FALSE(t.train_step(0).skipped);
  EXPECT_TRUE(t.train_step(1).skipped);
  EXPECT_FALSE(t.train_step(2).skipped);  // a good step resets the count
  EXPECT_EQ(t.train_step(3).skips_in_a_row, 1);
  EXPECT_EQ(t.train_step(4).skips_in_a_row, 2);
  try {
    t.train_step(5);
    FAIL() << "a third skip in a row was accepted with train.max_skips 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.max_skips 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trident
