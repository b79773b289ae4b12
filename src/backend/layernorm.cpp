// LayerNorm over the last dimension, eps 1e-5. b == nullptr is a LayerNorm without a shift
// (model.bias false); backward then takes db == nullptr.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "backend/kernels.h"
#include "backend/parallel.h"

namespace trident::cpu {

template <typename Real>
void layernorm_forward(Real* out, Real* mean, Real* rstd, const Real* inp, const Real* w,
                       const Real* b, int N, int C, int threads) {
  constexpr Real kEps = Real(1e-5);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int n = 0; n < N; ++n) {
    const Real* x = inp + size_t(n) * C;
    // Two passes (mean, then squared deviations): no cancellation when |mean| >> std.
    const Real mu = sum_of<Real>(x, C) / C;
    const Real var =
        sum_lanes<Real>(C, [x, mu](size_t i) { return (x[i] - mu) * (x[i] - mu); }) / C;
    const Real rs = Real(1) / std::sqrt(var + kEps);
    Real* o = out + size_t(n) * C;
    if (b)
      for (int c = 0; c < C; ++c) o[c] = (x[c] - mu) * rs * w[c] + b[c];
    else
      for (int c = 0; c < C; ++c) o[c] = (x[c] - mu) * rs * w[c];
    mean[n] = mu;
    rstd[n] = rs;
  }
}

// With xhat = (x - mean)·rstd and g = dout·w:
//   dinp = rstd · (g - mean(g) - xhat · mean(g·xhat)),  dw += Σ_rows dout·xhat,  db += Σ_rows dout.
// dinp is per row; dw and db sum over rows, so they get a second pass split by columns (threads
// never share an element, and the row order is the same for any thread count).
template <typename Real>
void layernorm_backward(Real* dinp, Real* dw, Real* db, const Real* dout, const Real* inp,
                        const Real* w, const Real* mean, const Real* rstd, int N, int C,
                        int threads) {
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static) nowait  // pass 2 reads only inputs
    for (int n = 0; n < N; ++n) {
      const Real* x = inp + size_t(n) * C;
      const Real* d = dout + size_t(n) * C;
      const Real mu = mean[n], rs = rstd[n];
      const Real g_mean = sum_lanes<Real>(C, [d, w](size_t i) { return d[i] * w[i]; }) / C;
      const Real gx_mean =
          sum_lanes<Real>(C, [=](size_t i) { return d[i] * w[i] * ((x[i] - mu) * rs); }) / C;
      Real* di = dinp + size_t(n) * C;
      for (int c = 0; c < C; ++c) {
        const Real xhat = (x[c] - mu) * rs;
        di[c] = rs * (d[c] * w[c] - g_mean - xhat * gx_mean);
      }
    }
    constexpr int kTile = 64;  // columns summed in registers/L1 before touching dw, db
    const Range cols = static_chunk(C, omp_get_thread_num(), omp_get_num_threads(), kTile);
    for (size_t c0 = cols.begin; c0 < cols.end; c0 += kTile) {
      const int width = static_cast<int>(std::min<size_t>(kTile, cols.end - c0));
      Real dw_acc[kTile] = {}, db_acc[kTile] = {};
      for (int n = 0; n < N; ++n) {
        const Real* x = inp + size_t(n) * C + c0;
        const Real* d = dout + size_t(n) * C + c0;
        const Real mu = mean[n], rs = rstd[n];
        for (int k = 0; k < width; ++k) {
          dw_acc[k] += d[k] * ((x[k] - mu) * rs);
          db_acc[k] += d[k];
        }
      }
      for (int k = 0; k < width; ++k) {
        if (dw) dw[c0 + k] += dw_acc[k];
        if (db) db[c0 + k] += db_acc[k];
      }
    }
  }
}

#define TRIDENT_INSTANTIATE(Real)                                                       \
  template void layernorm_forward<Real>(Real*, Real*, Real*, const Real*, const Real*,  \
                                        const Real*, int, int, int);                    \
  template void layernorm_backward<Real>(Real*, Real*, Real*, const Real*, const Real*, \
                                         const Real*, const Real*, const Real*, int, int, int);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu
