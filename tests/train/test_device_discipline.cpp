// Note [Backend memory] holds for the whole training path: trained on a backend whose memory
// the host cannot touch (StrictDeviceBackend), the trainer, the model and the optimizer reach
// it only through Backend::copy and HostView — any direct access would crash this test — and
// the results are bitwise those of the CPU backend it computes with.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "strict_device_backend.h"
#include "trident/check.h"
#include "trident/deck.h"
#include "trident/train.h"

namespace trident {
namespace {

// `family`: the model block (model.family; llama with 2 kv heads for the 4 query heads).
Deck small_deck(const std::string& family = "gpt2") {
  const std::string yaml = R"(
model: {layers: 2, d_model: 64, heads: 4, vocab: 256, seq_len: 32, family: )" +
                           family + (family == "llama" ? ", kv_heads: 2" : "") + R"(}
train: {micro_batch: 4, accum: 2, steps: 6, lr: 3.0e-3, warmup_steps: 2, seed: 7,
        val_every: 3, val_batches: 2, grad_clip: 0.5}
data: {train: inputs/data/tiny-train.bin, valid: inputs/data/tiny-valid.bin, shuffle: true}
run: {threads: 1}
)";
  return parse_deck(yaml, TRIDENT_SOURCE_DIR, {});
}

struct Outcome {
  std::vector<double> losses, norms;
  double val = 0;
  std::vector<float> params, logits;
};

Outcome train(Backend& be, const std::string& precision = "fp32",
              const std::string& family = "gpt2") {
  Deck d = small_deck(family);
  d.run.precision = precision;  // bf16: past the deck's refusal of a CPU run, for the test
  Trainer t(d, TrainContext{&be, 1e9});
  Outcome o;
  for (int s = 0; s < d.train.steps; ++s) {
    const StepStats st = t.train_step(s);
    o.losses.push_back(st.loss);
    o.norms.push_back(st.grad_norm);
  }
  o.val = t.validate();
  HostView<float> p(be, t.model().params(), t.model().num_params(), /*load=*/true);
  o.params.assign(p.data(), p.data() + p.size());
  if (precision != "fp32") return o;  // bf16 keeps no fp32 logits (generate refuses it)
  // Inference as `generate` does it: a forward without targets, then the logits on the host.
  std::vector<int32_t> prompt = {'t', 'r', 'i', 'd', 'e', 'n', 't'};
  t.model().forward(0, prompt.data(), nullptr, 1, int(prompt.size()));
  const size_t Vp = size_t(t.model().config().padded_vocab);
  HostView<const float> logits(be, t.model().logits(), prompt.size() * Vp, /*load=*/true);
  o.logits.assign(logits.data(), logits.data() + logits.size());
  return o;
}

// The same run bit for bit: every loss and gradient norm, the validation loss, the weights and
// (fp32 runs; bf16 ones keep no logits) the logits.
void expect_same_run(const Outcome& got, const Outcome& want) {
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(got.norms, want.norms);
  EXPECT_EQ(got.val, want.val);
  EXPECT_EQ(got.params, want.params);
  EXPECT_EQ(got.logits, want.logits);
}

TEST(DeviceDiscipline, TrainingTouchesBackendMemoryOnlyThroughCopies) {
  auto cpu = make_cpu_backend(1);
  testing::StrictDeviceBackend strict;
  const Outcome want = train(*cpu);
  const Outcome got = train(strict);
  expect_same_run(got, want);
}

// The Llama and GPT-NeoX blocks on a device backend (Note [Families on the GPT-2 paths]): the
// RoPE tables, the untied head, the parallel residual and the grouped kv heads' buffers are
// reached only through the ops and copies, with the CPU's bits.
TEST(DeviceDiscipline, FamilyTrainingTouchesBackendMemoryOnlyThroughCopies) {
  for (const char* family : {"llama", "neox"}) {
    SCOPED_TRACE(family);
    auto cpu = make_cpu_backend(1);
    testing::StrictDeviceBackend strict;
    const Outcome want = train(*cpu, "fp32", family);
    const Outcome got = train(strict, "fp32", family);
    expect_same_run(got, want);
  }
}

// The bf16 path (Note [bf16 activations]) on the strict backend: its buffers, the bf16 weight
// copy and the scratch are reached only through the ops and copies, with the CPU's bits.
TEST(DeviceDiscipline, Bf16TrainingTouchesBackendMemoryOnlyThroughCopies) {
  auto cpu = make_cpu_backend(1);
  testing::StrictDeviceBackend strict;
  const Outcome want = train(*cpu, "bf16");
  const Outcome got = train(strict, "bf16");
  expect_same_run(got, want);
  const Outcome fp32 = train(*cpu);
  EXPECT_NE(got.losses, fp32.losses);  // it did run the bf16 path
}

// The families' bf16 path on the strict backend: the RoPE tables, the activation's gradient
// buffer, the untied head's bf16 weights are reached only through the ops and copies, with the
// CPU's bits.
TEST(DeviceDiscipline, FamilyBf16TrainingTouchesBackendMemoryOnlyThroughCopies) {
  for (const char* family : {"llama", "neox"}) {
    SCOPED_TRACE(family);
    auto cpu = make_cpu_backend(1);
    testing::StrictDeviceBackend strict;
    const Outcome want = train(*cpu, "bf16", family);
    const Outcome got = train(strict, "bf16", family);
    expect_same_run(got, want);
    EXPECT_NE(got.losses, train(*cpu, "fp32", family).losses);  // it did run the bf16 path
  }
}

// The loss stays on the device until the step ends (GPT::forward_accumulate): a step reads
// backend memory on the host as often with 4 micro-batches as with 1. Before, each
// micro-batch's forward copied its losses to the host (a device wait per micro-batch).
TEST(DeviceDiscipline, TheLossIsReadOncePerStepNotPerMicroBatch) {
  auto reads_in_a_step = [](int accum) {
    testing::StrictDeviceBackend strict;
    Deck d = small_deck();
    d.train.accum = accum;
    d.train.val_every = 0;
    Trainer t(d, TrainContext{&strict, 1e9});
    t.train_step(0);  // the first step may read more (start-up)
    const size_t before = strict.copies_to_host();
    t.train_step(1);
    return strict.copies_to_host() - before;
  };
  const size_t one = reads_in_a_step(1), four = reads_in_a_step(4);
  EXPECT_EQ(one, four);
  EXPECT_GE(one, 1u);  // the loss is read at all
}

// ZeRO-2 on a device writes its gradients into a pool (Note [Gradients in unit slots] in
// train/grad_pool.h; over dp, test_zero_device_grad_pool), whose slots only the reduce-scatters
// free: a round per micro-batch (zero_reduce micro_batch) without comm.overlap is refused before
// anything is allocated, naming the keys; with overlap it is accepted.
TEST(DeviceDiscipline, ZeroTwoByMicroBatchNeedsOverlapOnADeviceBackend) {
  testing::StrictDeviceBackend strict;
  Deck d = small_deck();
  d.parallel.zero = 2;
  d.parallel.zero_reduce = "micro_batch";
  d.comm.overlap = false;
  try {
    Trainer t(d, TrainContext{&strict, 1e9});
    FAIL() << "parallel.zero_reduce micro_batch without comm.overlap was accepted on a device";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.zero: 2 with parallel.zero_reduce micro_batch "
                                         "on a device needs comm.overlap true"),
              std::string::npos)
        << e.what();
  }
  d.comm.overlap = true;
  EXPECT_NO_THROW(Trainer(d, TrainContext{&strict, 1e9}));
  d.comm.overlap = false;
  d.parallel.zero_reduce = "step";
  EXPECT_NO_THROW(Trainer(d, TrainContext{&strict, 1e9}));
}

// The strict backend does catch a direct access (the test above would pass vacuously if it
// did not): reading one of its floats on the host dies with SIGSEGV.
TEST(DeviceDisciplineDeathTest, DirectHostAccessCrashes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenMP's threads exist by now
  testing::StrictDeviceBackend strict;
  BackendBuffer<float> buf(strict, 16);
  EXPECT_DEATH(
      {
        volatile float x = buf.data()[3];
        (void)x;
      },
      "");
}

}  // namespace
}  // namespace trident
