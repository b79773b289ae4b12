// SwiGLU: out = silu(gate) · up, each input row gate[F] | up[F] (the fc layer's two halves).
//
// silu(g) = g·σ(g), σ(g) = 1/(1 + e), e = exp(−g) through the vectorisable exp_fast. The
// derivative: d gate = dout · up · σ(g)·(1 + g·(1 − σ(g))), d up = dout · silu(g). 1 − σ is
// taken as 1/(1 + 1/e), as GELU's backward does: exact for large g, and no 0·inf once e
// overflows (g < −88: σ = 0 and 1 − σ = 1; g > 88: e = 0, 1/e = inf, 1 − σ = 0).
#include "backend/fast_math.h"
#include "backend/kernels.h"

namespace trident::cpu {

template <typename Real>
void swiglu_forward(Real* out, const Real* inp, int N, int F, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int n = 0; n < N; ++n) {
    const Real* gate = inp + size_t(n) * 2 * F;
    const Real* up = gate + F;
    Real* o = out + size_t(n) * F;
    for (int f = 0; f < F; ++f) o[f] = gate[f] * up[f] / (Real(1) + exp_fast(-gate[f]));
  }
}

template <typename Real>
void swiglu_backward(Real* dinp, const Real* inp, const Real* dout, int N, int F, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int n = 0; n < N; ++n) {
    const Real* gate = inp + size_t(n) * 2 * F;
    const Real* up = gate + F;
    const Real* d = dout + size_t(n) * F;
    Real* dgate = dinp + size_t(n) * 2 * F;
    Real* dup = dgate + F;
    for (int f = 0; f < F; ++f) {
      const Real g = gate[f];
      const Real e = exp_fast(-g);
      const Real s = Real(1) / (Real(1) + e);
      const Real one_minus_s = Real(1) / (Real(1) + Real(1) / e);
      dgate[f] = d[f] * up[f] * s * (Real(1) + g * one_minus_s);
      dup[f] = d[f] * g * s;
    }
  }
}

#define TRIDENT_INSTANTIATE(Real)                                        \
  template void swiglu_forward<Real>(Real*, const Real*, int, int, int); \
  template void swiglu_backward<Real>(Real*, const Real*, const Real*, int, int, int);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu
