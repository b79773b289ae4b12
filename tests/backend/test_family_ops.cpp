// The model families' CPU ops (RMSNorm, RoPE, SwiGLU, exact GELU, grouped-query attention, and
// LayerNorm without a shift) against references written here from each op's definition, in
// double. Each op is checked three ways:
//   - the backend's fp32 forward and backward against the reference's values and its analytic
//     gradient, and against central differences of the reference forward;
//   - the double instantiation of the same kernel against those differences (tighter);
//   - bitwise reproducibility at 1 and 2 threads (Note [Deterministic reductions]).
//
// Tolerances, all scale-relative (rel_err):
//   kFloat 1e-5 — fp32 against double on the same fp32-rounded inputs. The longest chain of
//     roundings is a sum of C = 40 terms (RMSNorm) or a softmax and two T×hs products
//     (attention), each rounding ≤ 6e-8 relative: at most ~40·6e-8 = 2.4e-6 even if every error
//     adds; exp_fast adds 1e-7, erfcf a few ulps. A wrong term or sign gives O(1e-1) or more.
//   kDouble 1e-6 with step 1e-5 — as tests/backend/test_gradcheck.cpp: the differences' own error
//     is ~1e-10 (truncation h²·f''' and rounding 1e-16/h), so 1e-6 is a wide margin.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "backend/kernels.h"
#include "backend_test_util.h"
#include "trident/backend.h"
#include "trident/check.h"

namespace trident {
namespace {

using namespace trident::testing;
constexpr double kFloat = 1e-5;
constexpr double kDouble = 1e-6;
constexpr double kStep = 1e-5;
constexpr int kThreads = 2;
constexpr double kPi = 3.14159265358979323846;

using Vec = std::vector<double>;

// Values as fp32 holds them, in double: the reference then sees exactly what the fp32 op sees.
Vec rounded(const Vec& v) { return to_double(to_float(v)); }

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---------------------------------------------------------------- references, from definitions

// RMSNorm: y = x / sqrt(mean(x²) + eps) · w.
Vec rmsnorm_ref(const Vec& x, const Vec& w, int N, int C, double eps) {
  Vec y(x.size());
  for (int n = 0; n < N; ++n) {
    double ms = 0;
    for (int c = 0; c < C; ++c) ms += x[n * C + c] * x[n * C + c];
    const double r = 1.0 / std::sqrt(ms / C + eps);
    for (int c = 0; c < C; ++c) y[n * C + c] = x[n * C + c] * r * w[c];
  }
  return y;
}

// ∂y_i/∂x_j = w_i·(r·δ_ij − r³·x_i·x_j / C); ∂y_i/∂w_i = x_i·r.
void rmsnorm_ref_backward(Vec& dx, Vec& dw, const Vec& dy, const Vec& x, const Vec& w, int N, int C,
                          double eps) {
  dx.assign(x.size(), 0.0);
  dw.assign(C, 0.0);
  for (int n = 0; n < N; ++n) {
    const double* xr = &x[n * C];
    const double* d = &dy[n * C];
    double ms = 0, dwx = 0;
    for (int c = 0; c < C; ++c) ms += xr[c] * xr[c], dwx += d[c] * w[c] * xr[c];
    const double r = 1.0 / std::sqrt(ms / C + eps);
    for (int j = 0; j < C; ++j) dx[n * C + j] = d[j] * w[j] * r - r * r * r * xr[j] * dwx / C;
    for (int c = 0; c < C; ++c) dw[c] += d[c] * xr[c] * r;
  }
}

// RoPE tables as transformers builds them: inv_freq[i] = 1 / base^(2i/rot), angle t·inv_freq[i],
// i < rot/2 (transformers' emb = cat(freqs, freqs) repeats these for the second half).
struct RopeTables {
  Vec cos, sin;  // [T, rot/2], fp32-rounded
};
RopeTables rope_tables(int T, int rot, double base) {
  RopeTables tables;
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < rot / 2; ++i) {
      const double angle = t / std::pow(base, 2.0 * i / rot);
      tables.cos.push_back(std::cos(angle));
      tables.sin.push_back(std::sin(angle));
    }
  tables.cos = rounded(tables.cos);
  tables.sin = rounded(tables.sin);
  return tables;
}

// transformers' apply_rotary_pos_emb on the first rot dims of every q and k head:
// x_rot·cos_full + rotate_half(x_rot)·sin_full, rotate_half(x) = cat(−x[h:], x[:h]).
Vec rope_ref(const Vec& qkv, const RopeTables& tab, int N, int T, int NH, int KVH, int hs,
             int rot) {
  Vec out = qkv;
  const int h = rot / 2, row = (NH + 2 * KVH) * hs;
  for (int n = 0; n < N; ++n)
    for (int head = 0; head < NH + KVH; ++head) {
      const double* x = &qkv[size_t(n) * row + head * hs];
      double* y = &out[size_t(n) * row + head * hs];
      for (int i = 0; i < rot; ++i) {
        const double c = tab.cos[(n % T) * h + i % h], s = tab.sin[(n % T) * h + i % h];
        const double rotated = i < h ? -x[i + h] : x[i - h];
        y[i] = x[i] * c + rotated * s;
      }
    }
  return out;
}

// The transpose of y = x·c + R(x)·s, R = rotate_half: dx = dy·c + Rᵀ(dy·s), Rᵀ(z)_j = z_{j+h}
// (j < h), −z_{j−h} (j ≥ h).
Vec rope_ref_backward(const Vec& dqkv, const RopeTables& tab, int N, int T, int NH, int KVH, int hs,
                      int rot) {
  Vec dx = dqkv;
  const int h = rot / 2, row = (NH + 2 * KVH) * hs;
  for (int n = 0; n < N; ++n)
    for (int head = 0; head < NH + KVH; ++head) {
      const double* dy = &dqkv[size_t(n) * row + head * hs];
      double* d = &dx[size_t(n) * row + head * hs];
      const double* c = &tab.cos[(n % T) * h];
      const double* s = &tab.sin[(n % T) * h];
      for (int j = 0; j < rot; ++j)
        d[j] = j < h ? dy[j] * c[j] + dy[j + h] * s[j] : dy[j] * c[j - h] - dy[j - h] * s[j - h];
    }
  return dx;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

Vec swiglu_ref(const Vec& inp, int N, int F) {
  Vec out(size_t(N) * F);
  for (int n = 0; n < N; ++n)
    for (int f = 0; f < F; ++f) {
      const double g = inp[size_t(n) * 2 * F + f], u = inp[size_t(n) * 2 * F + F + f];
      out[size_t(n) * F + f] = g * sigmoid(g) * u;
    }
  return out;
}

// silu'(g) = σ(g) + g·σ(g)(1 − σ(g)).
Vec swiglu_ref_backward(const Vec& inp, const Vec& dout, int N, int F) {
  Vec dinp(inp.size());
  for (int n = 0; n < N; ++n)
    for (int f = 0; f < F; ++f) {
      const double g = inp[size_t(n) * 2 * F + f], u = inp[size_t(n) * 2 * F + F + f];
      const double d = dout[size_t(n) * F + f], s = sigmoid(g);
      dinp[size_t(n) * 2 * F + f] = d * u * (s + g * s * (1 - s));
      dinp[size_t(n) * 2 * F + F + f] = d * g * s;
    }
  return dinp;
}

double gelu_erf_ref(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_erf_ref_slope(double x) {
  return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * kPi);
}

// Causal attention, query head h reading kv head h / (NH / KVH), scale 1/sqrt(hs).
struct AttnShape {
  int B, T, NH, KVH, hs;
  int row() const { return (NH + 2 * KVH) * hs; }
  size_t q(int b, int t, int h) const { return (size_t(b) * T + t) * row() + size_t(h) * hs; }
  size_t k(int b, int t, int h) const { return q(b, t, NH + h / (NH / KVH)); }
  size_t v(int b, int t, int h) const { return q(b, t, NH + KVH + h / (NH / KVH)); }
  size_t o(int b, int t, int h) const { return (size_t(b) * T + t) * NH * hs + size_t(h) * hs; }
  size_t qkv_size() const { return size_t(B) * T * row(); }
  size_t out_size() const { return size_t(B) * T * NH * hs; }
  size_t att_size() const { return size_t(B) * NH * T * T; }
};

double dot(const double* a, const double* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Softmax row i of head (b, h): p[j], j <= i.
Vec attention_probs(const Vec& qkv, const AttnShape& s, int b, int h, int i) {
  Vec p(i + 1);
  const double scale = 1.0 / std::sqrt(double(s.hs));
  double max = -1e300, sum = 0;
  for (int j = 0; j <= i; ++j) {
    p[j] = scale * dot(&qkv[s.q(b, i, h)], &qkv[s.k(b, j, h)], s.hs);
    max = std::max(max, p[j]);
  }
  for (double& x : p) sum += (x = std::exp(x - max));
  for (double& x : p) x /= sum;
  return p;
}

Vec attention_ref(const Vec& qkv, const AttnShape& s) {
  Vec out(s.out_size(), 0.0);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int i = 0; i < s.T; ++i) {
        const Vec p = attention_probs(qkv, s, b, h, i);
        for (int j = 0; j <= i; ++j)
          for (int d = 0; d < s.hs; ++d) out[s.o(b, i, h) + d] += p[j] * qkv[s.v(b, j, h) + d];
      }
  return out;
}

// Per query row: dP_j = dO·V_j, dV_j += P_j·dO, dS_j = P_j(dP_j − Σ P·dP), dQ += scale·dS_j·K_j,
// dK_j += scale·dS_j·Q. A kv head's dK, dV collect every query head that reads it.
Vec attention_ref_backward(const Vec& qkv, const Vec& dout, const AttnShape& s) {
  Vec dqkv(s.qkv_size(), 0.0);
  const double scale = 1.0 / std::sqrt(double(s.hs));
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int i = 0; i < s.T; ++i) {
        const Vec p = attention_probs(qkv, s, b, h, i);
        const double* dO = &dout[s.o(b, i, h)];
        Vec dp(i + 1);
        double p_dot_dp = 0;
        for (int j = 0; j <= i; ++j) {
          dp[j] = dot(dO, &qkv[s.v(b, j, h)], s.hs);
          p_dot_dp += p[j] * dp[j];
        }
        for (int j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - p_dot_dp);
          for (int d = 0; d < s.hs; ++d) {
            dqkv[s.v(b, j, h) + d] += p[j] * dO[d];
            dqkv[s.q(b, i, h) + d] += scale * ds * qkv[s.k(b, j, h) + d];
            dqkv[s.k(b, j, h) + d] += scale * ds * qkv[s.q(b, i, h) + d];
          }
        }
      }
  return dqkv;
}

// ------------------------------------------------------------------------------------ the tests

class FamilyOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend(kThreads);
  std::mt19937 rng{35};
};

TEST_F(FamilyOps, RMSNorm) {
  const int N = 7;
  const double eps = 1e-5;
  for (int C : {24, 40}) {
    SCOPED_TRACE(C);
    auto x = rounded(uniform(N * C, rng, -2.0, 3.0)), w = rounded(uniform(C, rng, 0.5, 1.5));
    const auto dy = rounded(uniform(N * C, rng));
    const Vec y = rmsnorm_ref(x, w, N, C, eps);
    Vec dx_ref, dw_ref;
    rmsnorm_ref_backward(dx_ref, dw_ref, dy, x, w, N, C, eps);
    auto loss = [&] { return weighted_sum(rmsnorm_ref(x, w, N, C, eps), dy); };
    const Vec dx_fd = numeric_grad(x, loss, kStep), dw_fd = numeric_grad(w, loss, kStep);
    ASSERT_LT(rel_err(dx_ref, dx_fd), kDouble);  // the reference agrees with itself
    ASSERT_LT(rel_err(dw_ref, dw_fd), kDouble);

    std::vector<float> y_f = nans(y.size()), rstd_f = nans(N), dx_f = nans(x.size());
    std::vector<float> dw_f(C, 0.0f);
    be->rmsnorm_forward(y_f.data(), rstd_f.data(), to_float(x).data(), to_float(w).data(), N, C,
                        float(eps));
    be->rmsnorm_backward(dx_f.data(), dw_f.data(), to_float(dy).data(), to_float(x).data(),
                         to_float(w).data(), rstd_f.data(), N, C);
    EXPECT_LT(rel_err(y_f, y), kFloat);
    EXPECT_LT(rel_err(dx_f, dx_ref), kFloat);
    EXPECT_LT(rel_err(dw_f, dw_ref), kFloat);
    EXPECT_LT(rel_err(dx_f, dx_fd), kFloat);
    EXPECT_LT(rel_err(dw_f, dw_fd), kFloat);

    // dw accumulates: a second backward adds the same again.
    be->rmsnorm_backward(dx_f.data(), dw_f.data(), to_float(dy).data(), to_float(x).data(),
                         to_float(w).data(), rstd_f.data(), N, C);
    Vec twice = dw_ref;
    for (double& v : twice) v *= 2;
    EXPECT_LT(rel_err(dw_f, twice), kFloat);

    Vec y_d(y.size()), rstd_d(N), dx_d(x.size()), dw_d(C, 0.0);
    cpu::rmsnorm_forward(y_d.data(), rstd_d.data(), x.data(), w.data(), N, C, eps, kThreads);
    cpu::rmsnorm_backward(dx_d.data(), dw_d.data(), dy.data(), x.data(), w.data(), rstd_d.data(), N,
                          C, kThreads);
    EXPECT_LT(rel_err(y_d, y), kDouble);
    EXPECT_LT(rel_err(dx_d, dx_fd), kDouble);
    EXPECT_LT(rel_err(dw_d, dw_fd), kDouble);
  }
}

TEST_F(FamilyOps, RoPE) {
  const int B = 2, T = 5, N = B * T, NH = 4, hs = 8;
  for (double base : {10000.0, 500000.0})
    for (int KVH : {4, 2, 1})
      for (int rot : {4, 8}) {  // partial rotary (NeoX's rotary_pct) and the whole head
        SCOPED_TRACE(::testing::Message() << "base " << base << " KVH " << KVH << " rot " << rot);
        const RopeTables tab = rope_tables(T, rot, base);
        const int row = (NH + 2 * KVH) * hs;
        auto qkv = rounded(uniform(size_t(N) * row, rng, -2.0, 2.0));
        const auto dy = rounded(uniform(qkv.size(), rng));
        const Vec y = rope_ref(qkv, tab, N, T, NH, KVH, hs, rot);
        const Vec dx_ref = rope_ref_backward(dy, tab, N, T, NH, KVH, hs, rot);
        auto loss = [&] { return weighted_sum(rope_ref(qkv, tab, N, T, NH, KVH, hs, rot), dy); };
        const Vec dx_fd = numeric_grad(qkv, loss, kStep);
        ASSERT_LT(rel_err(dx_ref, dx_fd), kDouble);

        const auto cos_f = to_float(tab.cos), sin_f = to_float(tab.sin);
        std::vector<float> y_f = to_float(qkv), dx_f = to_float(dy);
        be->rope_forward(y_f.data(), cos_f.data(), sin_f.data(), N, T, NH, KVH, hs, rot);
        be->rope_backward(dx_f.data(), cos_f.data(), sin_f.data(), N, T, NH, KVH, hs, rot);
        EXPECT_LT(rel_err(y_f, y), kFloat);
        EXPECT_LT(rel_err(dx_f, dx_ref), kFloat);
        EXPECT_LT(rel_err(dx_f, dx_fd), kFloat);
        // v, and dimensions [rot, hs) of q and k, are left exactly as they were.
        const auto x_f = to_float(qkv), dy_f = to_float(dy);
        int moved = 0;
        for (int n = 0; n < N; ++n)
          for (int c = 0; c < row; ++c) {
            const bool rotated = c < (NH + KVH) * hs && c % hs < rot;
            const size_t i = size_t(n) * row + c;
            if (!rotated) moved += (y_f[i] != x_f[i]) + (dx_f[i] != dy_f[i]);
          }
        EXPECT_EQ(moved, 0);

        Vec y_d = qkv, dx_d = dy;
        cpu::rope_forward(y_d.data(), tab.cos.data(), tab.sin.data(), N, T, NH, KVH, hs, rot,
                          kThreads);
        cpu::rope_backward(dx_d.data(), tab.cos.data(), tab.sin.data(), N, T, NH, KVH, hs, rot,
                           kThreads);
        EXPECT_LT(rel_err(y_d, y), kDouble);
        EXPECT_LT(rel_err(dx_d, dx_fd), kDouble);
      }
}

TEST_F(FamilyOps, SwiGLU) {
  const int N = 7;
  for (int F : {24, 40}) {
    SCOPED_TRACE(F);
    auto inp = rounded(uniform(size_t(N) * 2 * F, rng, -6.0, 6.0));
    const auto dy = rounded(uniform(size_t(N) * F, rng));
    const Vec y = swiglu_ref(inp, N, F);
    const Vec dx_ref = swiglu_ref_backward(inp, dy, N, F);
    auto loss = [&] { return weighted_sum(swiglu_ref(inp, N, F), dy); };
    const Vec dx_fd = numeric_grad(inp, loss, kStep);
    ASSERT_LT(rel_err(dx_ref, dx_fd), kDouble);

    std::vector<float> y_f = nans(y.size()), dx_f = nans(inp.size());
    be->swiglu_forward(y_f.data(), to_float(inp).data(), N, F);
    be->swiglu_backward(dx_f.data(), to_float(inp).data(), to_float(dy).data(), N, F);
    EXPECT_LT(rel_err(y_f, y), kFloat);
    EXPECT_LT(rel_err(dx_f, dx_ref), kFloat);
    EXPECT_LT(rel_err(dx_f, dx_fd), kFloat);

    Vec y_d(y.size()), dx_d(inp.size());
    cpu::swiglu_forward(y_d.data(), inp.data(), N, F, kThreads);
    cpu::swiglu_backward(dx_d.data(), inp.data(), dy.data(), N, F, kThreads);
    EXPECT_LT(rel_err(y_d, y), kDouble);
    EXPECT_LT(rel_err(dx_d, dx_fd), kDouble);
  }
}

// Gates far out, where exp(−g) over- or underflows: silu → g (slope 1) and → 0 (slope 0).
TEST_F(FamilyOps, SwiGLUTails) {
  const std::vector<float> gate = {100.0f, 1e4f, 1e30f, -100.0f, -1e4f, -1e30f};
  const int F = int(gate.size());
  std::vector<float> inp = gate;
  inp.insert(inp.end(), F, 2.0f);  // up = 2
  const std::vector<float> dout(F, 1.0f);
  std::vector<float> out = nans(F), dinp = nans(2 * F);
  be->swiglu_forward(out.data(), inp.data(), 1, F);
  be->swiglu_backward(dinp.data(), inp.data(), dout.data(), 1, F);
  for (int f = 0; f < F; ++f) {
    SCOPED_TRACE(gate[f]);
    const bool high = gate[f] > 0;
    EXPECT_EQ(out[f], high ? 2 * gate[f] : 0.0f);
    EXPECT_EQ(dinp[f], high ? 2.0f : 0.0f);         // d gate = up · silu'(g)
    EXPECT_EQ(dinp[F + f], high ? gate[f] : 0.0f);  // d up = silu(g)
  }
}

TEST_F(FamilyOps, GeluErf) {
  const size_t n = 7 * 40;
  auto x = rounded(uniform(n, rng, -6.0, 6.0));
  const auto dy = rounded(uniform(n, rng));
  Vec y(n), dx_ref(n);
  for (size_t i = 0; i < n; ++i)
    y[i] = gelu_erf_ref(x[i]), dx_ref[i] = gelu_erf_ref_slope(x[i]) * dy[i];
  auto loss = [&] {
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += gelu_erf_ref(x[i]) * dy[i];
    return s;
  };
  const Vec dx_fd = numeric_grad(x, loss, kStep);
  ASSERT_LT(rel_err(dx_ref, dx_fd), kDouble);

  std::vector<float> y_f = nans(n), dx_f = nans(n);
  be->gelu_erf_forward(y_f.data(), to_float(x).data(), n);
  be->gelu_erf_backward(dx_f.data(), to_float(x).data(), to_float(dy).data(), n);
  EXPECT_LT(rel_err(y_f, y), kFloat);
  EXPECT_LT(rel_err(dx_f, dx_ref), kFloat);
  EXPECT_LT(rel_err(dx_f, dx_fd), kFloat);

  Vec y_d(n), dx_d(n);
  cpu::gelu_erf_forward(y_d.data(), x.data(), n, kThreads);
  cpu::gelu_erf_backward(dx_d.data(), x.data(), dy.data(), n, kThreads);
  EXPECT_LT(rel_err(y_d, y), kDouble);
  EXPECT_LT(rel_err(dx_d, dx_fd), kDouble);
}

// The negative tail, value by value: x·Φ(x) is tiny there, and Φ taken as (1 + erf)/2 in fp32
// would keep only a digit or two (x = −5: 2.9e-7 from 1 − 0.99999971). 1e-5 relative per value:
// the fp32 rounding of z = −x/√2 (3e-8 relative) moves erfc(z) by about 2z²·3e-8, 2.5e-6 at
// x = −9; exp_fast's 1e-7 and erfcf's few ulps are smaller.
TEST_F(FamilyOps, GeluErfNegativeTail) {
  const std::vector<float> x = {-3.0f, -5.0f, -7.0f, -9.0f};
  std::vector<float> y = nans(x.size()), slope = nans(x.size());
  const std::vector<float> ones(x.size(), 1.0f);
  be->gelu_erf_forward(y.data(), x.data(), x.size());
  be->gelu_erf_backward(slope.data(), x.data(), ones.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    SCOPED_TRACE(x[i]);
    // Here the reference itself needs erfc: (1 + erf) cancels in double too (Φ(−9) = 1e-19).
    const double cdf = 0.5 * std::erfc(-x[i] / std::sqrt(2.0));
    const double want = x[i] * cdf;
    const double want_slope = cdf + x[i] * std::exp(-0.5 * x[i] * x[i]) / std::sqrt(2 * kPi);
    EXPECT_LT(std::abs(y[i] - want), 1e-5 * std::abs(want));
    EXPECT_LT(std::abs(slope[i] - want_slope), 1e-5 * std::abs(want_slope));
  }
}

// Grouped-query attention against the reference, at KVH = 4 (multi-head), 2 and 1 (multi-query).
TEST_F(FamilyOps, GroupedQueryAttention) {
  for (int KVH : {4, 2, 1}) {
    SCOPED_TRACE(KVH);
    const AttnShape s{2, 5, 4, KVH, 8};
    auto qkv = rounded(uniform(s.qkv_size(), rng, -2.0, 2.0));
    const auto dy = rounded(uniform(s.out_size(), rng));
    const Vec y = attention_ref(qkv, s);
    const Vec dx_ref = attention_ref_backward(qkv, dy, s);
    auto loss = [&] { return weighted_sum(attention_ref(qkv, s), dy); };
    const Vec dx_fd = numeric_grad(qkv, loss, kStep);
    ASSERT_LT(rel_err(dx_ref, dx_fd), kDouble);

    std::vector<float> y_f = nans(y.size()), att_f = nans(s.att_size());
    std::vector<float> dx_f = nans(qkv.size()), scratch_f = nans(s.att_size());
    be->attention_forward_gqa(y_f.data(), att_f.data(), to_float(qkv).data(), s.B, s.T, s.NH, KVH,
                              s.hs);
    be->attention_backward_gqa(dx_f.data(), scratch_f.data(), to_float(dy).data(),
                               to_float(qkv).data(), y_f.data(), att_f.data(), s.B, s.T, s.NH, KVH,
                               s.hs);
    EXPECT_LT(rel_err(y_f, y), kFloat);
    EXPECT_LT(rel_err(dx_f, dx_ref), kFloat);
    EXPECT_LT(rel_err(dx_f, dx_fd), kFloat);

    Vec y_d(y.size()), att_d(s.att_size()), dx_d(qkv.size()), scratch_d(s.att_size());
    cpu::attention_forward_gqa(y_d.data(), att_d.data(), qkv.data(), s.B, s.T, s.NH, KVH, s.hs,
                               kThreads);
    cpu::attention_backward_gqa(dx_d.data(), scratch_d.data(), dy.data(), qkv.data(), att_d.data(),
                                s.B, s.T, s.NH, KVH, s.hs, kThreads);
    EXPECT_LT(rel_err(y_d, y), kDouble);
    EXPECT_LT(rel_err(dx_d, dx_fd), kDouble);
  }
}

// KVH < NH is multi-head attention on k, v repeated per group; dk, dv are the group's sums. The
// sums are taken in a different order than the kernel's (fp32, kFloat).
TEST_F(FamilyOps, GroupedQueryAttentionIsRepeatedKV) {
  for (int KVH : {2, 1}) {
    SCOPED_TRACE(KVH);
    const AttnShape g{2, 5, 4, KVH, 8}, m{2, 5, 4, 4, 8};
    const auto qkv = to_float(uniform(g.qkv_size(), rng, -2.0, 2.0));
    const auto dy = to_float(uniform(g.out_size(), rng));
    std::vector<float> qkv_m(m.qkv_size());
    for (int b = 0; b < g.B; ++b)
      for (int t = 0; t < g.T; ++t)
        for (int h = 0; h < g.NH; ++h)
          for (int d = 0; d < g.hs; ++d) {
            qkv_m[m.q(b, t, h) + d] = qkv[g.q(b, t, h) + d];
            qkv_m[m.k(b, t, h) + d] = qkv[g.k(b, t, h) + d];
            qkv_m[m.v(b, t, h) + d] = qkv[g.v(b, t, h) + d];
          }
    const int C = g.NH * g.hs;
    std::vector<float> y_m = nans(m.out_size()), att_m = nans(m.att_size());
    std::vector<float> dx_m = nans(m.qkv_size()), scratch_m = nans(m.att_size());
    be->attention_forward(y_m.data(), att_m.data(), qkv_m.data(), g.B, g.T, C, g.NH);
    be->attention_backward(dx_m.data(), scratch_m.data(), dy.data(), qkv_m.data(), y_m.data(),
                           att_m.data(), g.B, g.T, C, g.NH);
    std::vector<float> y_g = nans(g.out_size()), att_g = nans(g.att_size());
    std::vector<float> dx_g = nans(g.qkv_size()), scratch_g = nans(g.att_size());
    be->attention_forward_gqa(y_g.data(), att_g.data(), qkv.data(), g.B, g.T, g.NH, KVH, g.hs);
    be->attention_backward_gqa(dx_g.data(), scratch_g.data(), dy.data(), qkv.data(), y_g.data(),
                               att_g.data(), g.B, g.T, g.NH, KVH, g.hs);
    EXPECT_LT(rel_err(y_g, to_double(y_m)), kFloat);
    EXPECT_LT(rel_err(att_g, to_double(att_m)), kFloat);

    Vec want(g.qkv_size(), 0.0);  // q: as MHA's; k, v: Σ over the group of MHA's per-head grads
    for (int b = 0; b < g.B; ++b)
      for (int t = 0; t < g.T; ++t)
        for (int h = 0; h < g.NH; ++h)
          for (int d = 0; d < g.hs; ++d) {
            want[g.q(b, t, h) + d] = dx_m[m.q(b, t, h) + d];
            want[g.k(b, t, h) + d] += dx_m[m.k(b, t, h) + d];
            want[g.v(b, t, h) + d] += dx_m[m.v(b, t, h) + d];
          }
    EXPECT_LT(rel_err(dx_g, want), kFloat);
  }
}

// KVH == NH runs multi-head attention's code: the same bits.
TEST_F(FamilyOps, GroupedQueryAttentionAtKVHEqualsNHIsMultiHead) {
  const int B = 2, T = 9, NH = 4, hs = 8, C = NH * hs;
  const auto qkv = to_float(uniform(size_t(B) * T * 3 * C, rng, -2.0, 2.0));
  const auto dy = to_float(uniform(size_t(B) * T * C, rng));
  const size_t att_n = size_t(B) * NH * T * T;
  std::vector<float> y1(B * T * C), att1(att_n), dx1(qkv.size()), scratch1(att_n);
  std::vector<float> y2(B * T * C), att2(att_n), dx2(qkv.size()), scratch2(att_n);
  be->attention_forward(y1.data(), att1.data(), qkv.data(), B, T, C, NH);
  be->attention_backward(dx1.data(), scratch1.data(), dy.data(), qkv.data(), y1.data(), att1.data(),
                         B, T, C, NH);
  be->attention_forward_gqa(y2.data(), att2.data(), qkv.data(), B, T, NH, NH, hs);
  be->attention_backward_gqa(dx2.data(), scratch2.data(), dy.data(), qkv.data(), y2.data(),
                             att2.data(), B, T, NH, NH, hs);
  EXPECT_TRUE(bitwise_equal(y1, y2));
  EXPECT_TRUE(bitwise_equal(att1, att2));
  EXPECT_TRUE(bitwise_equal(dx1, dx2));
}

// A LayerNorm without a shift: b == nullptr is b = 0, and db == nullptr leaves dinp and dw as
// they are with db.
TEST_F(FamilyOps, LayerNormWithoutBias) {
  const int N = 7, C = 40;
  const auto x = to_float(uniform(N * C, rng, -2.0, 3.0)), w = to_float(uniform(C, rng));
  const auto dy = to_float(uniform(N * C, rng));
  const std::vector<float> zeros(C, 0.0f);
  std::vector<float> y0(N * C), mean0(N), rstd0(N), y1 = nans(N * C), mean1(N), rstd1(N);
  be->layernorm_forward(y0.data(), mean0.data(), rstd0.data(), x.data(), w.data(), zeros.data(), N,
                        C);
  be->layernorm_forward(y1.data(), mean1.data(), rstd1.data(), x.data(), w.data(), nullptr, N, C);
  EXPECT_EQ(y1, y0);  // == rather than bits: x·w + 0 may turn −0 into +0
  EXPECT_EQ(rstd1, rstd0);

  std::vector<float> dx0(N * C), dw0(C, 0.0f), db0(C, 0.0f), dx1 = nans(N * C), dw1(C, 0.0f);
  be->layernorm_backward(dx0.data(), dw0.data(), db0.data(), dy.data(), x.data(), w.data(),
                         mean0.data(), rstd0.data(), N, C);
  be->layernorm_backward(dx1.data(), dw1.data(), nullptr, dy.data(), x.data(), w.data(),
                         mean1.data(), rstd1.data(), N, C);
  EXPECT_TRUE(bitwise_equal(dx1, dx0));
  EXPECT_TRUE(bitwise_equal(dw1, dw0));
}

// Every op twice at 1 and at 2 threads: the same bits each time, and the same bits at 1 as at 2
// (no op here splits a sum across threads: rows are independent, RMSNorm's dw is split by
// columns, each attention task owns its heads). The second run's buffers sit one float further
// into their allocation (a different alignment).
TEST_F(FamilyOps, Deterministic) {
  const int B = 2, T = 5, N = B * T, NH = 4, KVH = 2, hs = 8, rot = 4, C = 40, F = 24;
  const AttnShape s{B, T, NH, KVH, hs};
  const auto x = to_float(uniform(N * C, rng, -2.0, 3.0)), w = to_float(uniform(C, rng));
  const auto dyC = to_float(uniform(N * C, rng));
  const auto qkv = to_float(uniform(s.qkv_size(), rng, -2.0, 2.0));
  const auto dqkv_in = to_float(uniform(s.qkv_size(), rng));
  const auto dyO = to_float(uniform(s.out_size(), rng));
  const auto gu = to_float(uniform(size_t(N) * 2 * F, rng, -6.0, 6.0));
  const auto dyF = to_float(uniform(size_t(N) * F, rng));
  const RopeTables tab = rope_tables(T, rot, 10000.0);
  const auto cos_f = to_float(tab.cos), sin_f = to_float(tab.sin);

  auto run = [&](int threads, int shift) {
    auto backend = make_cpu_backend(threads);
    std::vector<std::vector<float>> results;
    auto buf = [&](size_t n) { return std::vector<float>(n + shift, 0.0f); };
    auto keep = [&](const std::vector<float>& v) {
      results.emplace_back(v.begin() + shift, v.end());
    };
    auto y = buf(N * C), rstd = buf(N), dx = buf(N * C), dw = buf(C);
    backend->rmsnorm_forward(y.data() + shift, rstd.data() + shift, x.data(), w.data(), N, C,
                             1e-5f);
    backend->rmsnorm_backward(dx.data() + shift, dw.data() + shift, dyC.data(), x.data(), w.data(),
                              rstd.data() + shift, N, C);
    keep(y), keep(rstd), keep(dx), keep(dw);

    auto q = buf(qkv.size()), dq = buf(qkv.size());
    std::copy(qkv.begin(), qkv.end(), q.begin() + shift);
    std::copy(dqkv_in.begin(), dqkv_in.end(), dq.begin() + shift);
    backend->rope_forward(q.data() + shift, cos_f.data(), sin_f.data(), N, T, NH, KVH, hs, rot);
    backend->rope_backward(dq.data() + shift, cos_f.data(), sin_f.data(), N, T, NH, KVH, hs, rot);
    keep(q), keep(dq);

    auto o = buf(s.out_size()), att = buf(s.att_size()), da = buf(s.qkv_size());
    auto scratch = buf(s.att_size());
    backend->attention_forward_gqa(o.data() + shift, att.data() + shift, q.data() + shift, B, T, NH,
                                   KVH, hs);
    backend->attention_backward_gqa(da.data() + shift, scratch.data() + shift, dyO.data(),
                                    q.data() + shift, o.data() + shift, att.data() + shift, B, T,
                                    NH, KVH, hs);
    keep(o), keep(att), keep(da);

    auto sw = buf(N * F), dsw = buf(N * 2 * F), ge = buf(N * 2 * F), dge = buf(N * 2 * F);
    backend->swiglu_forward(sw.data() + shift, gu.data(), N, F);
    backend->swiglu_backward(dsw.data() + shift, gu.data(), dyF.data(), N, F);
    backend->gelu_erf_forward(ge.data() + shift, gu.data(), gu.size());
    backend->gelu_erf_backward(dge.data() + shift, gu.data(), gu.data(), gu.size());
    keep(sw), keep(dsw), keep(ge), keep(dge);
    return results;
  };
  const auto one = run(1, 0), one_again = run(1, 1), two = run(2, 0), two_again = run(2, 1);
  for (size_t i = 0; i < one.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(bitwise_equal(one[i], one_again[i]));
    EXPECT_TRUE(bitwise_equal(two[i], two_again[i]));
    EXPECT_TRUE(bitwise_equal(one[i], two[i]));
  }
}

TEST_F(FamilyOps, RefusesImpossibleShapes) {
  std::vector<float> buf(4096);
  float* p = buf.data();
  EXPECT_THROW(be->attention_forward_gqa(p, p, p, 1, 2, 4, 3, 8), Error);  // 3 does not divide 4
  EXPECT_THROW(be->attention_backward_gqa(p, p, p, p, p, p, 1, 2, 4, 0, 8), Error);
  EXPECT_THROW(be->rope_forward(p, p, p, 2, 2, 4, 2, 8, 3), Error);    // odd rot
  EXPECT_THROW(be->rope_backward(p, p, p, 2, 2, 4, 2, 8, 10), Error);  // rot > hs
}

}  // namespace
}  // namespace trident
