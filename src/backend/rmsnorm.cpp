// RMSNorm over the last dimension: out = x · rstd · w, rstd = 1/sqrt(mean(x²) + eps).
// The same structure as layernorm.cpp: rows in parallel forward; backward's dinp per row and dw
// summed over rows in a second pass split by columns (a fixed row order for any thread count).
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "backend/kernels.h"
#include "backend/parallel.h"

namespace trident::cpu {

template <typename Real>
void rmsnorm_forward(Real* out, Real* rstd, const Real* inp, const Real* w, int N, int C, Real eps,
                     int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int n = 0; n < N; ++n) {
    const Real* x = inp + size_t(n) * C;
    const Real mean_square = dot_of<Real>(x, x, C) / C;
    const Real rs = Real(1) / std::sqrt(mean_square + eps);
    Real* o = out + size_t(n) * C;
    for (int c = 0; c < C; ++c) o[c] = x[c] * rs * w[c];
    rstd[n] = rs;
  }
}

// With xhat = x·rstd and g = dout·w:
//   dinp = rstd · (g - xhat · mean(g·xhat)),  dw += Σ_rows dout·xhat.
template <typename Real>
void rmsnorm_backward(Real* dinp, Real* dw, const Real* dout, const Real* inp, const Real* w,
                      const Real* rstd, int N, int C, int threads) {
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static) nowait  // the dw pass reads only inputs
    for (int n = 0; n < N; ++n) {
      const Real* x = inp + size_t(n) * C;
      const Real* d = dout + size_t(n) * C;
      const Real rs = rstd[n];
      const Real gx_mean =
          sum_lanes<Real>(C, [=](size_t i) { return d[i] * w[i] * (x[i] * rs); }) / C;
      Real* di = dinp + size_t(n) * C;
      for (int c = 0; c < C; ++c) di[c] = rs * (d[c] * w[c] - (x[c] * rs) * gx_mean);
    }
    constexpr int kTile = 64;  // columns summed in registers/L1 before touching dw
    const Range cols = static_chunk(C, omp_get_thread_num(), omp_get_num_threads(), kTile);
    for (size_t c0 = cols.begin; dw && c0 < cols.end; c0 += kTile) {
      const int width = static_cast<int>(std::min<size_t>(kTile, cols.end - c0));
      Real dw_acc[kTile] = {};
      for (int n = 0; n < N; ++n) {
        const Real* x = inp + size_t(n) * C + c0;
        const Real* d = dout + size_t(n) * C + c0;
        const Real rs = rstd[n];
        for (int k = 0; k < width; ++k) dw_acc[k] += d[k] * (x[k] * rs);
      }
      for (int k = 0; k < width; ++k) dw[c0 + k] += dw_acc[k];
    }
  }
}

#define TRIDENT_INSTANTIATE(Real)                                                             \
  template void rmsnorm_forward<Real>(Real*, Real*, const Real*, const Real*, int, int, Real, \
                                      int);                                                   \
  template void rmsnorm_backward<Real>(Real*, Real*, const Real*, const Real*, const Real*,   \
                                       const Real*, int, int, int);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu
