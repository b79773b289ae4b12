// The bf16 path (Note [bf16 activations]) for the block families (Note [Block shapes]) on the
// CPU, as test_gpt_bf16.cpp checks GPT-2's: each family's bf16 model against its fp32 model,
// with the same bounds (loss, every gradient after a step, then AdamW steps), its ready events,
// recomputation and two pipeline stages. Families: GPT-NeoX (LayerNorm, 25% rotary, exact GELU,
// parallel residual, untied head), Llama (RMSNorm, full rotary, SwiGLU with its own width, two
// kv heads for four query heads, no biases, untied head), and a mixture of the rest (learned
// positions with one kv head, SwiGLU, LayerNorm without a shift, parallel residual, tied head).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "model_inputs.h"
#include "strict_device_backend.h"
#include "trident/check.h"
#include "trident/model.h"

namespace trident {
namespace {

using testing::bf16_options;
using testing::random_tokens;
constexpr int kB = testing::kSmallB, kT = testing::kSmallT;

struct FamilyCase {
  const char* name;
  GPTConfig config;
};

std::vector<FamilyCase> families() {
  std::vector<FamilyCase> out;
  GPTConfig neox = testing::small_config();
  neox.apply_family(Family::kNeoX);
  out.push_back({"neox", neox});
  GPTConfig llama = testing::small_config();
  llama.apply_family(Family::kLlama);
  llama.kv_heads = 2;
  llama.mlp_hidden = 96;
  out.push_back({"llama", llama});
  GPTConfig mix = testing::small_config();
  mix.kv_heads = 1;
  mix.activation = Activation::kSwiGLU;
  mix.mlp_hidden = 80;
  mix.bias = false;
  mix.parallel_residual = true;
  out.push_back({"mixture", mix});
  return out;
}

double norm(const float* x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
  return std::sqrt(s);
}

double distance(const float* x, const float* y, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
  return std::sqrt(s);
}

// Every parameter perturbed (norm weights start at 1, biases at 0: a dropped bias or a swapped
// norm weight must show), except the padded vocabulary rows of wte and lmw, which no token uses.
void perturb(GPT& m, const GPTConfig& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.02f);
  for (const ParamInfo& p : m.params_info()) {
    const bool vocab_rows = p.name == "wte" || p.name == "lmw";
    const size_t live = vocab_rows ? size_t(c.vocab) * c.channels : p.count;
    for (size_t i = 0; i < live; ++i) m.params()[p.offset + i] += noise(rng);
  }
}

// The bounds and their reasons are test_gpt_bf16.cpp's (LossAndGradientsAgreeWithFp32Within
// Bf16Rounding): the loss within 0.5%, every parameter's gradient within 2% of its norm. The
// families add roundings of their own (RoPE rounds q|k and their gradient once more, SwiGLU
// and exact GELU their input gradient once more than the fused tanh GELU), a few more per block,
// within the margin of that bound.
TEST(GptBf16Families, LossAndGradientsAgreeWithFp32WithinBf16Rounding) {
  for (const FamilyCase& f : families()) {
    SCOPED_TRACE(f.name);
    const GPTConfig& c = f.config;
    auto be = make_cpu_backend(1);
    const auto in = random_tokens(kB * kT, c.vocab, 3), tg = random_tokens(kB * kT, c.vocab, 4);
    GPT m32(c, *be, kB, kT), m16(c, *be, kB, kT, bf16_options());
    m32.init_weights(7);
    perturb(m32, c, 9);
    std::copy(m32.params(), m32.params() + m32.num_params(), m16.params());
    const float l32 = testing::forward_backward(m32, in, tg, kB, kT);
    const float l16 = testing::forward_backward(m16, in, tg, kB, kT);
    EXPECT_NEAR(l16, l32, 5e-3 * l32);
    double worst = 0;
    std::string worst_name;
    for (const ParamInfo& p : m32.params_info()) {
      const ParamInfo& q = m16.param(p.name);
      ASSERT_EQ(p.offset, q.offset) << p.name;
      const double g = norm(m32.grads() + p.offset, p.count);
      ASSERT_GT(g, 0.0) << p.name;
      const double rel = distance(m16.grads() + p.offset, m32.grads() + p.offset, p.count) / g;
      EXPECT_LT(rel, 0.02) << p.name;
      if (rel > worst) worst = rel, worst_name = p.name;
    }
    std::printf("%s: loss fp32 %.6f bf16 %.6f; worst gradient error %.4f of its norm (%s)\n",
                f.name, l32, l16, worst, worst_name.c_str());
    // The padded vocabulary rows of the head's weight get no gradient.
    const ParamInfo& head = m16.param(c.tied_head ? "wte" : "lmw");
    for (size_t i = size_t(c.vocab) * c.channels; i < head.count; ++i)
      ASSERT_EQ(m16.grads()[head.offset + i], 0.0f) << i;
  }
}

// Five AdamW steps from the same weights on a learnable stream (test_gpt_bf16.cpp's data:
// each token a fixed map of the last, one in four random), with the GPT-2 test's bounds: every
// step's loss within 5% of fp32's, their mean gap under 1%. Both update fp32 master weights.
TEST(GptBf16Families, FiveAdamWStepsStayWithinTheGpt2Bounds) {
  for (const FamilyCase& f : families()) {
    SCOPED_TRACE(f.name);
    const GPTConfig& c = f.config;
    const int N = kB * kT, batches = 5;
    auto be = make_cpu_backend(1);
    std::mt19937 rng(5);
    std::vector<int32_t> stream(size_t(N) * batches + 1);
    stream[0] = 1;
    for (size_t i = 1; i < stream.size(); ++i)
      stream[i] = rng() % 4 == 0 ? int32_t(rng() % c.vocab) : (stream[i - 1] * 7 + 3) % c.vocab;
    GPT m32(c, *be, kB, kT), m16(c, *be, kB, kT, bf16_options());
    m32.init_weights(11);
    m16.init_weights(11);
    const size_t n = m32.num_params();
    std::vector<float> m1(n), v1(n), m2(n), v2(n);
    double mean = 0, first32 = 0, last32 = 0;
    for (int t = 1; t <= 5; ++t) {
      const size_t at = size_t(t - 1) * N;
      const std::vector<int32_t> in(stream.begin() + at, stream.begin() + at + N);
      const std::vector<int32_t> tg(stream.begin() + at + 1, stream.begin() + at + 1 + N);
      const float l32 = testing::forward_backward(m32, in, tg, kB, kT);
      const float l16 = testing::forward_backward(m16, in, tg, kB, kT);
      const double rel = std::abs(double(l16) - l32) / l32;
      EXPECT_LT(rel, 0.05) << "step " << t << ": fp32 " << l32 << ", bf16 " << l16;
      mean += rel / 5;
      if (t == 1) first32 = l32;
      last32 = l32;
      be->adamw_update(m32.params(), m1.data(), v1.data(), m32.grads(), n, 3e-3f, 0.9f, 0.95f,
                       1e-8f, 0.0f, t, 1.0f);
      be->adamw_update(m16.params(), m2.data(), v2.data(), m16.grads(), n, 3e-3f, 0.9f, 0.95f,
                       1e-8f, 0.0f, t, 1.0f);
    }
    EXPECT_LT(last32, first32) << "the run must learn for the comparison to mean something";
    EXPECT_LT(mean, 0.01);
    std::printf("%s: loss %.4f -> %.4f (fp32); mean |bf16 - fp32| / fp32 %.4f\n", f.name, first32,
                last32, mean);
  }
}

// The same parameters become ready in the same order at the same points as on the fp32 path.
TEST(GptBf16Families, ReadyEventsAreTheFp32Paths) {
  for (const FamilyCase& f : families()) {
    SCOPED_TRACE(f.name);
    const GPTConfig& c = f.config;
    auto be = make_cpu_backend(1);
    const auto in = random_tokens(kB * kT, c.vocab, 3), tg = random_tokens(kB * kT, c.vocab, 4);
    std::vector<std::vector<std::pair<int, int>>> orders;
    for (Precision p : {Precision::kFp32, Precision::kBf16}) {
      GPTOptions o;
      o.precision = p;
      GPT m(c, *be, kB, kT, o);
      m.init_weights(7);
      m.zero_grads();
      m.forward(in.data(), tg.data(), kB, kT);
      std::vector<std::pair<int, int>> order;
      m.backward(1.0f, [&](int i, int piece) { order.emplace_back(i, piece); });
      orders.push_back(order);
      EXPECT_EQ(order.size(), m.params_info().size());  // each parameter once
    }
    EXPECT_EQ(orders[0], orders[1]);
  }
}

// Recomputation (mlp, full) re-runs the same bf16 ops on the same inputs: the same bits.
TEST(GptBf16Families, RecomputationGivesBitwiseTheSameGradients) {
  for (const FamilyCase& f : families()) {
    SCOPED_TRACE(f.name);
    const GPTConfig& c = f.config;
    auto be = make_cpu_backend(1);
    const auto in = random_tokens(kB * kT, c.vocab, 3), tg = random_tokens(kB * kT, c.vocab, 4);
    std::vector<std::vector<float>> grads;
    for (Recompute mode : {Recompute::kNone, Recompute::kMlp, Recompute::kFull}) {
      GPTOptions o = bf16_options();
      o.recompute = mode;
      GPT m(c, *be, kB, kT, o);
      m.init_weights(7);
      testing::forward_backward(m, in, tg, kB, kT);
      grads.emplace_back(m.grads(), m.grads() + m.num_params());
    }
    ASSERT_EQ(0, std::memcmp(grads[0].data(), grads[1].data(), grads[0].size() * 4)) << "mlp";
    ASSERT_EQ(0, std::memcmp(grads[0].data(), grads[2].data(), grads[0].size() * 4)) << "full";
  }
}

// Two pipeline stages: the boundary is the fp32 residual stream, so the split model computes
// the whole model's bits (a tied wte: the sum of its two stages' contributions).
TEST(GptBf16Families, TwoStagesEqualOneStage) {
  for (const FamilyCase& f : families()) {
    SCOPED_TRACE(f.name);
    const GPTConfig& c = f.config;
    auto be = make_cpu_backend(1);
    const auto in = random_tokens(kB * kT, c.vocab, 3), tg = random_tokens(kB * kT, c.vocab, 4);
    GPT whole(c, *be, kB, kT, bf16_options());
    whole.init_weights(5);
    const float loss = testing::forward_backward(whole, in, tg, kB, kT);
    GPTOptions o0 = bf16_options(), o1 = bf16_options();
    o0.stage = pipeline_stage(c.layers, 2, 0, {});
    o1.stage = pipeline_stage(c.layers, 2, 1, {});
    GPT s0(c, *be, kB, kT, o0), s1(c, *be, kB, kT, o1);
    s0.init_weights(5);
    s1.init_weights(5);
    s0.zero_grads();
    s1.zero_grads();
    s0.forward(0, in.data(), nullptr, kB, kT);
    const size_t n = s0.boundary_rows(kB, kT) * c.channels;
    std::copy(s0.stage_output(0), s0.stage_output(0) + n, s1.stage_input(0));
    EXPECT_EQ(loss, s1.forward(0, nullptr, tg.data(), kB, kT));
    std::vector<float> dboundary(n);
    s1.backward(0, 1.0f, nullptr, dboundary.data());
    s0.backward(0, 1.0f, dboundary.data(), nullptr);
    for (GPT* st : {&s0, &s1})
      for (const ParamInfo& p : st->params_info()) {
        if (p.name == "wte" && c.tied_head) continue;
        const ParamInfo& q = whole.param(p.name);
        ASSERT_EQ(0, std::memcmp(st->grads() + p.offset, whole.grads() + q.offset, p.count * 4))
            << p.name;
      }
    if (!c.tied_head) continue;
    const ParamInfo &w0 = s0.param("wte"), &w1 = s1.param("wte"), &ww = whole.param("wte");
    for (size_t i = 0; i < ww.count; ++i)
      ASSERT_NEAR(s0.grads()[w0.offset + i] + s1.grads()[w1.offset + i],
                  whole.grads()[ww.offset + i], 1e-6f)
          << i;
  }
}

// A device backend without the families' bf16 kernels refuses them as bad input, before it
// allocates (Note [Families on the GPT-2 paths]); GPT-2's block still builds there.
TEST(GptBf16Families, ADeviceWithoutTheirKernelsRefusesThem) {
  testing::StrictDeviceBackend device(/*bf16_family_ops=*/false);
  for (const FamilyCase& f : families()) {
    try {
      GPT m(f.config, device, kB, kT, bf16_options());
      ADD_FAILURE() << f.name << " was not refused";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::kBadInput);
      EXPECT_NE(std::string(e.what()).find("run.precision bf16"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(GPT(testing::small_config(), device, kB, kT, bf16_options()));
}

}  // namespace
}  // namespace trident
