// The model families' bf16 ops (src/backend/bf16_family_ops.cpp) and the bf16 ops the families
// call with null biases, on the CPU backend, against Note [bf16 activations]'s rule computed
// here: the fp32 op (checked against double references in test_family_ops.cpp) on the widened
// bf16 inputs, each bf16 output rounded once. Widening is exact and rounding is a function, so
// the comparison is bitwise: any second rounding, a dropped rounding or an operand read as the
// wrong tensor changes bits. The device kernels are tested against these ops in tests/cuda.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "trident/backend.h"

namespace trident {
namespace {

using Halves = std::vector<bfloat16>;
using Floats = std::vector<float>;

Floats random_floats(size_t n, std::mt19937& rng, float lo = -2.0f, float hi = 2.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Floats v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

Halves round_all(const Floats& x) {
  Halves h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = to_bfloat16(x[i]);
  return h;
}

Floats widen_all(const Halves& h) {
  Floats x(h.size());
  for (size_t i = 0; i < h.size(); ++i) x[i] = to_float(h[i]);
  return x;
}

// Random bf16 values (the op's input) and their exact fp32 widening (the rule's input).
struct Input {
  Halves h;
  Floats f;
};
Input random_input(size_t n, std::mt19937& rng, float lo = -2.0f, float hi = 2.0f) {
  Input in;
  in.h = round_all(random_floats(n, rng, lo, hi));
  in.f = widen_all(in.h);
  return in;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// At least one bf16 output differs from its input's bits: the op did something.
bool changed(const Halves& a, const Halves& b) { return !same_bits(a, b); }

class Bf16FamilyOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend(2);
  std::mt19937 rng{17};
};

TEST_F(Bf16FamilyOps, RmsNormForwardIsTheFp32OpRoundedOnce) {
  const int N = 6, C = 40;
  const Floats x = random_floats(size_t(N) * C, rng), w = random_floats(C, rng);
  Floats want(x.size()), want_rstd(N), rstd(N);
  be->rmsnorm_forward(want.data(), want_rstd.data(), x.data(), w.data(), N, C, 1e-6f);
  Halves got(x.size());
  be->rmsnorm_forward_bf16(got.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
  EXPECT_TRUE(same_bits(got, round_all(want)));
  EXPECT_TRUE(same_bits(rstd, want_rstd));
}

TEST_F(Bf16FamilyOps, RmsNormBackwardAddsIntoTheResidualGradientAndRoundsItsCopy) {
  const int N = 6, C = 40;
  const Floats x = random_floats(size_t(N) * C, rng), w = random_floats(C, rng);
  Floats y(x.size()), rstd(N);
  be->rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  const Input dout = random_input(x.size(), rng);
  const Floats dres0 = random_floats(x.size(), rng), dw0 = random_floats(C, rng);
  Floats dinp(x.size()), want_dres(x.size()), want_dw = dw0;
  be->rmsnorm_backward(dinp.data(), want_dw.data(), dout.f.data(), x.data(), w.data(), rstd.data(),
                       N, C);
  for (size_t i = 0; i < x.size(); ++i) want_dres[i] = dres0[i] + dinp[i];
  Floats dres = dres0, dw = dw0;
  Halves dres16(x.size());
  be->rmsnorm_backward_add_bf16(dres.data(), dres16.data(), dw.data(), dout.h.data(), x.data(),
                                w.data(), rstd.data(), N, C);
  EXPECT_TRUE(same_bits(dres, want_dres));
  EXPECT_TRUE(same_bits(dres16, round_all(want_dres)));
  EXPECT_TRUE(same_bits(dw, want_dw));  // accumulated onto dw0
  // Without the copy: the same fp32 gradient.
  Floats dres_b = dres0, dw_b = dw0;
  be->rmsnorm_backward_add_bf16(dres_b.data(), nullptr, dw_b.data(), dout.h.data(), x.data(),
                                w.data(), rstd.data(), N, C);
  EXPECT_TRUE(same_bits(dres_b, want_dres));
}

// Partial rotary (rot < hs) with grouped kv heads: the rotated dimensions follow the rule, v and
// the unrotated dimensions keep their bits.
TEST_F(Bf16FamilyOps, RopeForwardAndBackwardAreTheFp32OpsRoundedOnce) {
  const int T = 3, N = 6, NH = 4, KVH = 2, hs = 8, rot = 4, half = rot / 2;
  const size_t n = size_t(N) * (NH + 2 * KVH) * hs;
  Floats cos(size_t(T) * half), sin(cos.size());
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < half; ++i) {
      const float angle = float(t) / float(1 + 3 * i);
      cos[size_t(t) * half + i] = std::cos(angle);
      sin[size_t(t) * half + i] = std::sin(angle);
    }
  for (const bool backward : {false, true}) {
    SCOPED_TRACE(backward ? "backward" : "forward");
    const Input x = random_input(n, rng);
    Floats want = x.f;
    Halves got = x.h;
    if (backward) {
      be->rope_backward(want.data(), cos.data(), sin.data(), N, T, NH, KVH, hs, rot);
      be->rope_backward_bf16(got.data(), cos.data(), sin.data(), N, T, NH, KVH, hs, rot);
    } else {
      be->rope_forward(want.data(), cos.data(), sin.data(), N, T, NH, KVH, hs, rot);
      be->rope_forward_bf16(got.data(), cos.data(), sin.data(), N, T, NH, KVH, hs, rot);
    }
    EXPECT_TRUE(same_bits(got, round_all(want)));
    EXPECT_TRUE(changed(got, x.h));
    const size_t row = size_t(NH + 2 * KVH) * hs;
    for (int r = 0; r < N; ++r) {
      for (size_t j = size_t(NH + KVH) * hs; j < row; ++j)  // v
        ASSERT_EQ(got[r * row + j].bits, x.h[r * row + j].bits) << r << " " << j;
      for (int head = 0; head < NH + KVH; ++head)  // q and k beyond rot
        for (int d = rot; d < hs; ++d) {
          const size_t j = r * row + size_t(head) * hs + d;
          ASSERT_EQ(got[j].bits, x.h[j].bits) << r << " " << head << " " << d;
        }
    }
  }
}

TEST_F(Bf16FamilyOps, SwigluForwardAndBackwardAreTheFp32OpsRoundedOnce) {
  const int N = 5, F = 12;
  const Input x = random_input(size_t(N) * 2 * F, rng, -4.0f, 4.0f);
  Floats want(size_t(N) * F);
  be->swiglu_forward(want.data(), x.f.data(), N, F);
  Halves got(want.size());
  be->swiglu_forward_bf16(got.data(), x.h.data(), N, F);
  EXPECT_TRUE(same_bits(got, round_all(want)));

  const Input dout = random_input(want.size(), rng);
  Floats want_d(x.f.size());
  be->swiglu_backward(want_d.data(), x.f.data(), dout.f.data(), N, F);
  Halves got_d(want_d.size());
  be->swiglu_backward_bf16(got_d.data(), x.h.data(), dout.h.data(), N, F);
  EXPECT_TRUE(same_bits(got_d, round_all(want_d)));
}

TEST_F(Bf16FamilyOps, ExactGeluForwardAndBackwardAreTheFp32OpsRoundedOnce) {
  const size_t n = 300;
  const Input x = random_input(n, rng, -5.0f, 5.0f);
  Floats want(n);
  be->gelu_erf_forward(want.data(), x.f.data(), n);
  Halves got(n);
  be->gelu_erf_forward_bf16(got.data(), x.h.data(), n);
  EXPECT_TRUE(same_bits(got, round_all(want)));
  // Not the tanh form: the two differ by up to ~1e-3, many bf16 ulps near |x| ~ 2.
  Halves tanh_form(n);
  be->gelu_forward_bf16(tanh_form.data(), x.h.data(), n);
  EXPECT_TRUE(changed(got, tanh_form));

  const Input dout = random_input(n, rng);
  Floats want_d(n);
  be->gelu_erf_backward(want_d.data(), x.f.data(), dout.f.data(), n);
  Halves got_d(n);
  be->gelu_erf_backward_bf16(got_d.data(), x.h.data(), dout.h.data(), n);
  EXPECT_TRUE(same_bits(got_d, round_all(want_d)));
}

// Grouped-query attention: forward's output and saved values, backward's dqkv (the shared kv
// heads' gradients summed by the fp32 op), against the rule; with KVH == NH the op is the
// multi-head attention_forward_bf16/backward_bf16, bit for bit.
TEST_F(Bf16FamilyOps, GroupedQueryAttentionIsTheFp32OpRoundedOnce) {
  const int B = 2, T = 5, hs = 8, NH = 4;
  for (const int KVH : {1, 2, 4}) {
    SCOPED_TRACE(KVH);
    const size_t rows = size_t(B) * T, q = size_t(NH) * hs, qkv_n = rows * (NH + 2 * KVH) * hs;
    const size_t saved = be->attention_saved_floats(B, T, int(q), NH);
    const size_t scratch_n = be->attention_scratch_floats(B, T, int(q), NH);
    const Input qkv = random_input(qkv_n, rng);
    Floats want(rows * q), want_att(saved), att(saved);
    be->attention_forward_gqa(want.data(), want_att.data(), qkv.f.data(), B, T, NH, KVH, hs);
    Halves out(rows * q);
    be->attention_forward_gqa_bf16(out.data(), att.data(), qkv.h.data(), B, T, NH, KVH, hs);
    EXPECT_TRUE(same_bits(out, round_all(want)));
    EXPECT_TRUE(same_bits(att, want_att));

    const Input dout = random_input(rows * q, rng);
    const Floats out_f = widen_all(out);
    Floats want_d(qkv_n), scratch(scratch_n);
    be->attention_backward_gqa(want_d.data(), scratch.data(), dout.f.data(), qkv.f.data(),
                               out_f.data(), att.data(), B, T, NH, KVH, hs);
    Halves got_d(qkv_n);
    be->attention_backward_gqa_bf16(got_d.data(), scratch.data(), dout.h.data(), qkv.h.data(),
                                    out.data(), att.data(), B, T, NH, KVH, hs);
    EXPECT_TRUE(same_bits(got_d, round_all(want_d)));

    if (KVH != NH) continue;
    Halves mha(rows * q), mha_d(qkv_n);
    Floats mha_att(saved);
    be->attention_forward_bf16(mha.data(), mha_att.data(), qkv.h.data(), B, T, int(q), NH);
    be->attention_backward_bf16(mha_d.data(), scratch.data(), dout.h.data(), qkv.h.data(),
                                mha.data(), mha_att.data(), B, T, int(q), NH);
    EXPECT_TRUE(same_bits(mha, out));
    EXPECT_TRUE(same_bits(mha_d, got_d));
  }
}

// model.bias false: LayerNorm without a shift and the linears without biases, on the bf16 path.
TEST_F(Bf16FamilyOps, LayerNormAndMatmulsWithoutBiasAreTheFp32OpsRoundedOnce) {
  const int N = 6, C = 32, OC = 24;
  const Floats x = random_floats(size_t(N) * C, rng), w = random_floats(C, rng);
  Floats want(x.size()), mean(N), rstd(N), mean16(N), rstd16(N);
  be->layernorm_forward(want.data(), mean.data(), rstd.data(), x.data(), w.data(), nullptr, N, C);
  Halves ln(x.size());
  be->layernorm_forward_bf16(ln.data(), mean16.data(), rstd16.data(), x.data(), w.data(), nullptr,
                             N, C);
  EXPECT_TRUE(same_bits(ln, round_all(want)));
  EXPECT_TRUE(same_bits(mean16, mean) && same_bits(rstd16, rstd));

  const Input dout = random_input(x.size(), rng);
  const Floats dres0 = random_floats(x.size(), rng);
  Floats dinp(x.size()), want_dres(x.size()), want_dw(C, 0.5f), dw(C, 0.5f), dres = dres0;
  be->layernorm_backward(dinp.data(), want_dw.data(), nullptr, dout.f.data(), x.data(), w.data(),
                         mean.data(), rstd.data(), N, C);
  for (size_t i = 0; i < x.size(); ++i) want_dres[i] = dres0[i] + dinp[i];
  Halves dres16(x.size());
  be->layernorm_backward_add_bf16(dres.data(), dres16.data(), dw.data(), nullptr, dout.h.data(),
                                  x.data(), w.data(), mean.data(), rstd.data(), N, C);
  EXPECT_TRUE(same_bits(dres, want_dres) && same_bits(dw, want_dw));
  EXPECT_TRUE(same_bits(dres16, round_all(want_dres)));

  const Input inp = random_input(size_t(N) * C, rng), wt = random_input(size_t(OC) * C, rng);
  Floats y(size_t(N) * OC);
  be->matmul_forward(y.data(), inp.f.data(), wt.f.data(), nullptr, N, C, OC);
  Halves y16(y.size());
  be->matmul_forward_bf16(y16.data(), inp.h.data(), wt.h.data(), nullptr, N, C, OC);
  EXPECT_TRUE(same_bits(y16, round_all(y)));
  const Floats res = random_floats(y.size(), rng);
  Floats want_add(y.size()), got_add(y.size());
  for (size_t i = 0; i < y.size(); ++i) want_add[i] = res[i] + y[i];
  be->matmul_forward_add_bf16(got_add.data(), res.data(), inp.h.data(), wt.h.data(), nullptr, N, C,
                              OC);
  EXPECT_TRUE(same_bits(got_add, want_add));

  const Input dy = random_input(y.size(), rng);
  Floats dx(size_t(N) * C), dwt(size_t(OC) * C, 0.25f), dwt16(dwt);
  be->matmul_backward(dx.data(), dwt.data(), nullptr, dy.f.data(), inp.f.data(), wt.f.data(), N, C,
                      OC);
  Halves dx16(dx.size());
  be->matmul_backward_bf16(dx16.data(), dwt16.data(), nullptr, dy.h.data(), inp.h.data(),
                           wt.h.data(), N, C, OC);
  EXPECT_TRUE(same_bits(dx16, round_all(dx)));
  EXPECT_TRUE(same_bits(dwt16, dwt));
}

// The CPU backend has the families' bf16 ops (the model refuses a family's bf16 path on a
// backend that says it has not: Note [Families on the GPT-2 paths]).
TEST_F(Bf16FamilyOps, TheCpuBackendHasThem) { EXPECT_TRUE(be->has_bf16_family_ops()); }

}  // namespace
}  // namespace trident
