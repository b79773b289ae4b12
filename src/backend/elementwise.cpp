// Elementwise ops: tanh-approximation GELU, exact GELU and add.
//
// GELU(x) = x/2 · (1 + tanh(u)), u = sqrt(2/π)·(x + 0.044715·x³). Since (1 + tanh(u))/2 equals
// the logistic σ(2u), this computes x·σ(2u) = x / (1 + exp(-2u)) with the vectorisable exp_fast
// (glibc's tanhf is a scalar call ~30x slower). For x → -inf, exp overflows to inf and the result
// is -0, no NaN (the slope stays finite up to |x| ~ 1e12, where x³ overflows).
// The derivative: σ(2u) + x · 2σ(2u)(1 - σ(2u)) · du/dx.
//
// Exact GELU(x) = x·Φ(x), Φ the normal CDF, taken as erfc(−x/√2)/2 rather than (1 + erf(x/√2))/2:
// the same function, but for x << 0 the latter cancels (at x = −5 it keeps 2 of float's 7 digits)
// while erfc keeps its relative accuracy. Its derivative is Φ(x) + x·φ(x), φ = exp(−x²/2)/√(2π).
// std::erfc is a scalar libm call, so these loops do not vectorise.
#include <cmath>

#include "backend/fast_math.h"
#include "backend/kernels.h"
#include "backend/parallel.h"

namespace trident::cpu {
namespace {

constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kCubic = 0.044715;
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

}  // namespace

template <typename Real>
void gelu_forward(Real* out, const Real* inp, size_t n, int threads) {
  parallel_range(n, threads, [=](size_t begin, size_t end) {
    const Real k = Real(kSqrt2OverPi), a = Real(kCubic);
    for (size_t i = begin; i < end; ++i) {
      const Real x = inp[i];
      const Real u = k * (x + a * x * x * x);
      out[i] = x / (Real(1) + exp_fast(Real(-2) * u));
    }
  });
}

template <typename Real>
void gelu_backward(Real* dinp, const Real* inp, const Real* dout, size_t n, int threads) {
  parallel_range(n, threads, [=](size_t begin, size_t end) {
    const Real k = Real(kSqrt2OverPi), a = Real(kCubic);
    for (size_t i = begin; i < end; ++i) {
      const Real x = inp[i];
      const Real u = k * (x + a * x * x * x);
      const Real du = k * (Real(1) + Real(3) * a * x * x);
      const Real e = exp_fast(Real(-2) * u);
      const Real s = Real(1) / (Real(1) + e);
      // 1 - s as 1/(1 + 1/e): written as 1 - s it loses all digits once s ≈ 1 (large x, where
      // x·du amplifies the error), and s·e would give 0·inf = NaN once e overflows.
      const Real one_minus_s = Real(1) / (Real(1) + Real(1) / e);
      dinp[i] = (s + x * Real(2) * s * one_minus_s * du) * dout[i];
    }
  });
}

template <typename Real>
void gelu_erf_forward(Real* out, const Real* inp, size_t n, int threads) {
  parallel_range(n, threads, [=](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const Real x = inp[i];
      out[i] = x * Real(0.5) * std::erfc(-x * Real(kInvSqrt2));
    }
  });
}

template <typename Real>
void gelu_erf_backward(Real* dinp, const Real* inp, const Real* dout, size_t n, int threads) {
  parallel_range(n, threads, [=](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const Real x = inp[i];
      const Real cdf = Real(0.5) * std::erfc(-x * Real(kInvSqrt2));
      const Real pdf = Real(kInvSqrt2Pi) * exp_fast(Real(-0.5) * x * x);
      dinp[i] = (cdf + x * pdf) * dout[i];
    }
  });
}

// out may alias a or b: each index is read before it is written.
template <typename Real>
void add(Real* out, const Real* a, const Real* b, size_t n, int threads) {
  parallel_range(n, threads, [=](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) out[i] = a[i] + b[i];
  });
}

#define TRIDENT_INSTANTIATE(Real)                                                      \
  template void gelu_forward<Real>(Real*, const Real*, size_t, int);                   \
  template void gelu_backward<Real>(Real*, const Real*, const Real*, size_t, int);     \
  template void gelu_erf_forward<Real>(Real*, const Real*, size_t, int);               \
  template void gelu_erf_backward<Real>(Real*, const Real*, const Real*, size_t, int); \
  template void add<Real>(Real*, const Real*, const Real*, size_t, int);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu
