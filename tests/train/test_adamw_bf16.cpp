// AdamW's bf16 weight copy (GPT::params16, Backend::adamw_update_bf16): on the bf16 path the
// optimizer's pass writes the copy the GEMMs read, and forward casts no weights until
// something asks for writable weights again (GPT::params()). Checked on the CPU, where the
// Backend's host definitions are the GPU kernels' twins (tests/cuda/kernel_checks_flat.h
// checks the kernel's copy against its own fp32 weights, bit for bit).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "model_inputs.h"
#include "trident/model.h"
#include "trident/train.h"

namespace trident {
namespace {

using testing::bf16_options;
using testing::small_config;
constexpr int kB = testing::kSmallB, kT = testing::kSmallT;
using testing::random_tokens;

float step(GPT& m, const std::vector<int32_t>& in, const std::vector<int32_t>& tg) {
  return testing::forward_backward(m, in, tg, kB, kT);
}

// Model a: AdamW::update writes the bf16 copy and forward casts nothing. Model b: the plain
// fp32 update through params(), so forward casts every block and wte. Both copies are
// bf16(params) of the same fp32 weights, so every loss and gradient agrees bit for bit; a copy
// that were stale, partial or rounded differently would change the next step's loss.
TEST(AdamWBf16, CopyWrittenByTheOptimizerEqualsTheCastForward) {
  const GPTConfig c = small_config();
  auto be = make_cpu_backend(1);
  GPT a(c, *be, kB, kT, bf16_options()), b(c, *be, kB, kT, bf16_options());
  a.init_weights(3);
  b.init_weights(3);
  ASSERT_NE(a.params16(), nullptr);
  TrainConfig tc;
  tc.weight_decay = 0.1;
  AdamW opt_a(*be, a.num_params());
  std::vector<float> m(b.num_params()), v(b.num_params());
  for (int t = 1; t <= 4; ++t) {
    const auto in = random_tokens(kB * kT, c.vocab, 10 + t);
    const auto tg = random_tokens(kB * kT, c.vocab, 20 + t);
    const float la = step(a, in, tg), lb = step(b, in, tg);
    ASSERT_EQ(la, lb) << "step " << t;
    ASSERT_EQ(0, std::memcmp(a.grads(), b.grads(), a.num_params() * sizeof(float))) << t;
    opt_a.update(*be, a, tc, 1e-2f, t, 1.0f);
    // b's update, run by run with the same decay, through params() (no bf16 copy written).
    for (const ParamInfo& p : b.params_info())
      be->adamw_update(b.params() + p.offset, m.data() + p.offset, v.data() + p.offset,
                       b.grads() + p.offset, p.count, 1e-2f, float(tc.beta1), float(tc.beta2),
                       float(tc.eps), p.decay ? float(tc.weight_decay) : 0.0f, t, 1.0f);
  }
}

// Whether forward casts: after AdamW wrote the copy, a poisoned copy (fcw of block 0 zeroed in
// params16 only) is what forward reads, so the loss changes; after a params() call (writable
// weights: the copy counts as stale) forward casts again and the loss is the clean one. The
// CPU backend's buffers are host memory, so the test can write params16 directly.
TEST(AdamWBf16, ForwardCastsOnlyAfterTheWeightsMayHaveChanged) {
  const GPTConfig c = small_config();
  auto be = make_cpu_backend(1);
  GPT g(c, *be, kB, kT, bf16_options());
  g.init_weights(5);
  const auto in = random_tokens(kB * kT, c.vocab, 1), tg = random_tokens(kB * kT, c.vocab, 2);
  TrainConfig tc;
  AdamW opt(*be, g.num_params());
  step(g, in, tg);
  opt.update(*be, g, tc, 1e-2f, 1, 1.0f);  // writes the copy: now current
  const float clean = g.forward(in.data(), tg.data(), kB, kT);
  const ParamInfo& fcw = g.param("h0.fcw");
  std::memset(static_cast<void*>(g.params16() + fcw.offset), 0, fcw.count * sizeof(bfloat16));
  const float poisoned = g.forward(in.data(), tg.data(), kB, kT);
  EXPECT_NE(poisoned, clean) << "forward recast a copy that was current";
  (void)g.params();  // may write: stale
  const float recast = g.forward(in.data(), tg.data(), kB, kT);
  EXPECT_EQ(recast, clean) << "forward read a stale copy";
}

}  // namespace
}  // namespace trident
