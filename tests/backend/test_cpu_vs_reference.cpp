// The float CpuBackend against the double kernels on the same (float-rounded) inputs.
//
// Tolerance 1e-4, relative to each tensor's largest entry: float rounding is 6e-8 per operation,
// and the longest accumulations here (dot products and sums over ≤ 1000 terms) grow it to at most
// ~1000·6e-8 = 6e-5 in the worst case (~2e-6 typically), plus ~2e-7 from exp_fast. A wrong term,
// a missing accumulation or a stale value is O(1) and fails by orders of magnitude.
//
// Weight gradients of the float backend start from random values and must end at those values
// plus the reference gradient (computed from zero): they accumulate (+=). Activation gradients
// start as NaN, which any read would spread: they are assigned (=).
#include <gtest/gtest.h>

#include <limits>
#include <memory>

#include "backend/kernels.h"
#include "backend_test_util.h"
#include "trident/backend.h"

namespace trident {
namespace {

using namespace trident::testing;
constexpr double kTolerance = 1e-4;

class CpuVsReference : public ::testing::Test {
 protected:
  // Random starting values for a weight gradient (exactly representable in float).
  std::vector<double> prefill(size_t n) { return to_double(to_float(uniform(n, rng))); }
  static std::vector<double> plus(const std::vector<double>& a, const std::vector<double>& b) {
    std::vector<double> sum(a.size());
    for (size_t i = 0; i < a.size(); ++i) sum[i] = a[i] + b[i];
    return sum;
  }

  std::unique_ptr<Backend> backend = make_cpu_backend(2);
  std::mt19937 rng{42};
};

TEST_F(CpuVsReference, Encoder) {
  const int B = 3, T = 7, C = 40, vocab = 11;
  const auto tok = tokens(B * T, vocab, rng);
  const auto wte = to_double(to_float(uniform(vocab * C, rng)));
  const auto wpe = to_double(to_float(uniform(T * C, rng)));
  std::vector<double> out(B * T * C);
  cpu::encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C, 1);
  std::vector<float> out_f = nans(out.size());
  backend->encoder_forward(out_f.data(), tok.data(), to_float(wte).data(), to_float(wpe).data(), B,
                           T, C);
  EXPECT_LT(rel_err(out_f, out), kTolerance);

  const auto dout = to_double(to_float(uniform(out.size(), rng)));
  const auto dwte0 = prefill(wte.size()), dwpe0 = prefill(wpe.size());
  std::vector<double> dwte(wte.size(), 0.0), dwpe(wpe.size(), 0.0);
  cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C, 1);
  auto dwte_f = to_float(dwte0), dwpe_f = to_float(dwpe0);
  backend->encoder_backward(dwte_f.data(), dwpe_f.data(), to_float(dout).data(), tok.data(), B, T,
                            C);
  EXPECT_LT(rel_err(dwte_f, plus(dwte0, dwte)), kTolerance);
  EXPECT_LT(rel_err(dwpe_f, plus(dwpe0, dwpe)), kTolerance);
}

// Either gradient of encoder_backward may be null; the other is still accumulated.
TEST_F(CpuVsReference, EncoderBackwardSkipsNullGradient) {
  const int B = 2, T = 3, C = 20, vocab = 4;
  const auto tok = tokens(B * T, vocab, rng);
  const auto dout = to_float(uniform(B * T * C, rng));
  std::vector<float> both_wte(vocab * C, 0.0f), both_wpe(T * C, 0.0f);
  backend->encoder_backward(both_wte.data(), both_wpe.data(), dout.data(), tok.data(), B, T, C);
  std::vector<float> only_wte(vocab * C, 0.0f), only_wpe(T * C, 0.0f);
  backend->encoder_backward(only_wte.data(), nullptr, dout.data(), tok.data(), B, T, C);
  backend->encoder_backward(nullptr, only_wpe.data(), dout.data(), tok.data(), B, T, C);
  EXPECT_EQ(only_wte, both_wte);
  EXPECT_EQ(only_wpe, both_wpe);
}

TEST_F(CpuVsReference, LayerNorm) {
  const int N = 37, C = 100;
  const auto inp = to_double(to_float(uniform(N * C, rng, -3.0, 5.0)));
  const auto w = to_double(to_float(uniform(C, rng))), b = to_double(to_float(uniform(C, rng)));
  std::vector<double> out(N * C), mean(N), rstd(N);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C,
                         1);
  std::vector<float> out_f = nans(out.size()), mean_f = nans(N), rstd_f = nans(N);
  backend->layernorm_forward(out_f.data(), mean_f.data(), rstd_f.data(), to_float(inp).data(),
                             to_float(w).data(), to_float(b).data(), N, C);
  EXPECT_LT(rel_err(out_f, out), kTolerance);
  EXPECT_LT(rel_err(mean_f, mean), kTolerance);
  EXPECT_LT(rel_err(rstd_f, rstd), kTolerance);

  const auto dout = to_double(to_float(uniform(out.size(), rng)));
  const auto dw0 = prefill(C), db0 = prefill(C);
  std::vector<double> dw(C, 0.0), db(C, 0.0), dinp(N * C);
  auto dw_f = to_float(dw0), db_f = to_float(db0);
  std::vector<float> dinp_f = nans(dinp.size());
  cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                          mean.data(), rstd.data(), N, C, 1);
  backend->layernorm_backward(dinp_f.data(), dw_f.data(), db_f.data(), to_float(dout).data(),
                              to_float(inp).data(), to_float(w).data(), mean_f.data(),
                              rstd_f.data(), N, C);
  EXPECT_LT(rel_err(dinp_f, dinp), kTolerance);
  EXPECT_LT(rel_err(dw_f, plus(dw0, dw)), kTolerance);
  EXPECT_LT(rel_err(db_f, plus(db0, db)), kTolerance);
}

// Sizes that are not multiples of the GEMM split's 64-wide tiles or of the vector width.
TEST_F(CpuVsReference, Matmul) {
  const int N = 67, C = 129, OC = 200;
  const auto inp = to_double(to_float(uniform(N * C, rng)));
  const auto w = to_double(to_float(uniform(OC * C, rng)));
  const auto bias = to_double(to_float(uniform(OC, rng)));
  std::vector<double> out(N * OC);
  cpu::matmul_forward(out.data(), inp.data(), w.data(), bias.data(), N, C, OC, 1);
  std::vector<float> out_f = nans(out.size());
  backend->matmul_forward(out_f.data(), to_float(inp).data(), to_float(w).data(),
                          to_float(bias).data(), N, C, OC);
  EXPECT_LT(rel_err(out_f, out), kTolerance);

  const auto dout = to_double(to_float(uniform(out.size(), rng)));
  const auto dw0 = prefill(w.size()), dbias0 = prefill(OC);
  std::vector<double> dw(w.size(), 0.0), dbias(OC, 0.0), dinp(N * C);
  auto dw_f = to_float(dw0), dbias_f = to_float(dbias0);
  std::vector<float> dinp_f = nans(dinp.size());
  cpu::matmul_backward(dinp.data(), dw.data(), dbias.data(), dout.data(), inp.data(), w.data(), N,
                       C, OC, 1);
  backend->matmul_backward(dinp_f.data(), dw_f.data(), dbias_f.data(), to_float(dout).data(),
                           to_float(inp).data(), to_float(w).data(), N, C, OC);
  EXPECT_LT(rel_err(dinp_f, dinp), kTolerance);
  EXPECT_LT(rel_err(dw_f, plus(dw0, dw)), kTolerance);
  EXPECT_LT(rel_err(dbias_f, plus(dbias0, dbias)), kTolerance);
}

TEST_F(CpuVsReference, MatmulWithoutBiasOrDinp) {
  const int N = 5, C = 70, OC = 130;  // OC > N: the GEMM split runs along the other dimension
  const auto inp = to_double(to_float(uniform(N * C, rng)));
  const auto w = to_double(to_float(uniform(OC * C, rng)));
  std::vector<double> out(N * OC);
  cpu::matmul_forward(out.data(), inp.data(), w.data(), static_cast<const double*>(nullptr), N, C,
                      OC, 1);
  std::vector<float> out_f = nans(out.size());
  backend->matmul_forward(out_f.data(), to_float(inp).data(), to_float(w).data(), nullptr, N, C,
                          OC);
  EXPECT_LT(rel_err(out_f, out), kTolerance);

  const auto dout = to_double(to_float(uniform(out.size(), rng)));
  const auto dw0 = prefill(w.size());
  std::vector<double> dw(w.size(), 0.0);
  auto dw_f = to_float(dw0);
  cpu::matmul_backward(static_cast<double*>(nullptr), dw.data(), static_cast<double*>(nullptr),
                       dout.data(), inp.data(), w.data(), N, C, OC, 1);
  backend->matmul_backward(nullptr, dw_f.data(), nullptr, to_float(dout).data(),
                           to_float(inp).data(), to_float(w).data(), N, C, OC);
  EXPECT_LT(rel_err(dw_f, plus(dw0, dw)), kTolerance);
}

TEST_F(CpuVsReference, Attention) {
  const int B = 2, T = 17, C = 48, NH = 3;
  const auto qkv = to_double(to_float(uniform(B * T * 3 * C, rng, -2.0, 2.0)));
  std::vector<double> out(B * T * C), att(B * NH * T * T);
  cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, 1);
  std::vector<float> out_f = nans(out.size()), att_f = nans(att.size());
  backend->attention_forward(out_f.data(), att_f.data(), to_float(qkv).data(), B, T, C, NH);
  EXPECT_LT(rel_err(out_f, out), kTolerance);
  EXPECT_LT(rel_err(att_f, att), kTolerance);
  for (int bh = 0; bh < B * NH; ++bh)  // the masked part is exactly zero
    for (int i = 0; i < T; ++i)
      for (int j = i + 1; j < T; ++j) ASSERT_EQ(att_f[(size_t(bh) * T + i) * T + j], 0.0f);

  const auto dout = to_double(to_float(uniform(out.size(), rng)));
  std::vector<double> dqkv(qkv.size()), scratch(att.size());
  std::vector<float> dqkv_f = nans(dqkv.size()), scratch_f = nans(scratch.size());
  cpu::attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, C,
                          NH, 1);
  backend->attention_backward(dqkv_f.data(), scratch_f.data(), to_float(dout).data(),
                              to_float(qkv).data(), out_f.data(), att_f.data(), B, T, C, NH);
  EXPECT_LT(rel_err(dqkv_f, dqkv), kTolerance);
}

TEST_F(CpuVsReference, Gelu) {
  const auto inp = to_double(to_float(uniform(1001, rng, -8.0, 8.0)));
  std::vector<double> out(inp.size());
  cpu::gelu_forward(out.data(), inp.data(), inp.size(), 1);
  std::vector<float> out_f = nans(out.size());
  backend->gelu_forward(out_f.data(), to_float(inp).data(), inp.size());
  EXPECT_LT(rel_err(out_f, out), kTolerance);

  const auto dout = to_double(to_float(uniform(inp.size(), rng)));
  std::vector<double> dinp(inp.size());
  std::vector<float> dinp_f = nans(dinp.size());
  cpu::gelu_backward(dinp.data(), inp.data(), dout.data(), inp.size(), 1);
  backend->gelu_backward(dinp_f.data(), to_float(inp).data(), to_float(dout).data(), inp.size());
  EXPECT_LT(rel_err(dinp_f, dinp), kTolerance);
}

// Far out, exp(-2u) under- or overflows: GELU must tend to x (slope 1) and to 0 (slope 0), no NaN.
// (Past |x| ~ 1e12, x³ overflows and the slope becomes NaN: no sane activation gets there.)
TEST_F(CpuVsReference, GeluTails) {
  const std::vector<float> inp = {20.0f, 200.0f, 1e6f, 1e11f, -20.0f, -200.0f, -1e6f, -1e11f};
  const std::vector<float> ones(inp.size(), 1.0f);
  std::vector<float> out = nans(inp.size()), dinp = nans(inp.size());
  backend->gelu_forward(out.data(), inp.data(), inp.size());
  backend->gelu_backward(dinp.data(), inp.data(), ones.data(), inp.size());
  for (size_t i = 0; i < inp.size(); ++i) {
    SCOPED_TRACE(inp[i]);
    EXPECT_FLOAT_EQ(out[i], inp[i] > 0 ? inp[i] : 0.0f);
    EXPECT_FLOAT_EQ(dinp[i], inp[i] > 0 ? 1.0f : 0.0f);
  }
}

TEST_F(CpuVsReference, AddAllowsAliasing) {
  const auto a = to_float(uniform(333, rng)), b = to_float(uniform(333, rng));
  std::vector<float> expected(a.size()), out = nans(a.size());
  for (size_t i = 0; i < a.size(); ++i) expected[i] = a[i] + b[i];
  backend->add(out.data(), a.data(), b.data(), a.size());
  EXPECT_EQ(out, expected);
  auto inplace = a;
  backend->add(inplace.data(), inplace.data(), b.data(), a.size());
  EXPECT_EQ(inplace, expected);
}

TEST_F(CpuVsReference, CrossEntropy) {
  const int N = 9, V = 1000, Vp = 1024;
  auto logits = to_double(to_float(uniform(size_t(N) * Vp, rng, -8.0, 8.0)));
  for (int n = 0; n < N; ++n)  // garbage in the padding, large enough to dominate if counted
    for (int v = V; v < Vp; ++v) logits[size_t(n) * Vp + v] = 50.0 + v;
  const auto targets = tokens(N, V, rng);
  std::vector<double> losses(N), probs = logits;
  cpu::crossentropy_forward(losses.data(), probs.data(), targets.data(), N, V, Vp, 1);
  std::vector<float> losses_f = nans(N), probs_f = to_float(logits);
  backend->crossentropy_forward(losses_f.data(), probs_f.data(), targets.data(), N, V, Vp);
  EXPECT_LT(rel_err(losses_f, losses), kTolerance);
  EXPECT_LT(rel_err(probs_f, probs), kTolerance);

  // Padding does not change the loss: the same rows with zeroed padding give the same bits.
  auto zero_padded = to_float(logits);
  for (int n = 0; n < N; ++n)
    for (int v = V; v < Vp; ++v) zero_padded[size_t(n) * Vp + v] = 0.0f;
  std::vector<float> losses_zero_pad(N);
  backend->crossentropy_forward(losses_zero_pad.data(), zero_padded.data(), targets.data(), N, V,
                                Vp);
  EXPECT_EQ(losses_zero_pad, losses_f);

  const double dloss = 1.0 / N;
  cpu::crossentropy_backward(probs.data(), targets.data(), dloss, N, V, Vp, 1);
  backend->crossentropy_backward(probs_f.data(), targets.data(), float(dloss), N, V, Vp);
  EXPECT_LT(rel_err(probs_f, probs), kTolerance);
  for (int n = 0; n < N; ++n)
    for (int v = V; v < Vp; ++v) {
      ASSERT_EQ(zero_padded[size_t(n) * Vp + v], 0.0f);  // probabilities of padding
      ASSERT_EQ(probs_f[size_t(n) * Vp + v], 0.0f);      // gradients of padding
    }
}

TEST_F(CpuVsReference, CrossEntropyRejectsBadTarget) {
  std::vector<float> logits(2 * 8, 0.0f), losses(2);
  const std::vector<int32_t> targets = {1, 5};
  EXPECT_THROW(backend->crossentropy_forward(losses.data(), logits.data(), targets.data(), 2, 5, 8),
               std::exception);
}

TEST_F(CpuVsReference, SumSquares) {
  const auto x = to_float(uniform(100003, rng));
  double expected = 0.0;
  for (float v : x) expected += double(v) * v;
  // Double accumulation: only the order of the double additions differs (~1e-16 each).
  EXPECT_NEAR(backend->sum_squares(x.data(), x.size()), expected, 1e-12 * expected);
}

// AdamW against the formula written out as a scalar double loop, three steps. The update is a
// handful of operations per value, so float agrees with double to a few ulp: 1e-5 relative.
TEST_F(CpuVsReference, AdamW) {
  const size_t n = 1007;  // splits into a vector part and a tail on either thread count
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  auto p = to_double(to_float(uniform(n, rng))), m = std::vector<double>(n, 0.0), v = m;
  auto p_f = to_float(p), m_f = to_float(m), v_f = to_float(v);
  for (int t = 1; t <= 3; ++t) {
    const auto g = to_double(to_float(uniform(n, rng)));
    const float grad_scale = t == 2 ? 0.37f : 1.0f;  // step 2 is a clipped one
    for (size_t i = 0; i < n; ++i) {
      const double gs = g[i] * double(grad_scale);
      m[i] = b1 * m[i] + (1 - b1) * gs;
      v[i] = b2 * v[i] + (1 - b2) * gs * gs;
      const double mhat = m[i] / (1 - std::pow(b1, t)), vhat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * p[i]);
    }
    backend->adamw_update(p_f.data(), m_f.data(), v_f.data(), to_float(g).data(), n, float(lr),
                          float(b1), float(b2), float(eps), float(wd), t, grad_scale);
    EXPECT_LT(rel_err(p_f, p), 1e-5) << "step " << t;
    EXPECT_LT(rel_err(m_f, m), 1e-5) << "step " << t;
    EXPECT_LT(rel_err(v_f, v), 1e-5) << "step " << t;
  }
}

// Clipping folded into the update gives the bits of scaling the gradients first (g *= s, in
// float), then updating with grad_scale 1.
TEST_F(CpuVsReference, AdamWGradScaleEqualsScalingFirst) {
  const size_t n = 1007;
  const auto g = to_float(uniform(n, rng));
  auto p1 = to_float(uniform(n, rng)), m1 = to_float(uniform(n, rng)), v1 = g;
  for (float& x : v1) x = x * x;
  auto p2 = p1, m2 = m1, v2 = v1, g2 = g;
  const float s = 0.37f;
  backend->adamw_update(p1.data(), m1.data(), v1.data(), g.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f,
                        0.1f, 4, s);
  for (float& x : g2) x *= s;
  backend->adamw_update(p2.data(), m2.data(), v2.data(), g2.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f,
                        0.1f, 4, 1.0f);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(p1[i], p2[i]) << i;
    ASSERT_EQ(m1[i], m2[i]) << i;
    ASSERT_EQ(v1[i], v2[i]) << i;
  }
}

TEST_F(CpuVsReference, GemmPeakIsMeasured) {
  const double flops = backend->measure_gemm_peak_flops();
  EXPECT_GT(flops, 1e9);   // any machine this runs on does better than 1 GFLOP/s
  EXPECT_LT(flops, 1e14);  // and no CPU reaches 100 TFLOP/s: a timing bug would show here
}

}  // namespace
}  // namespace trident
