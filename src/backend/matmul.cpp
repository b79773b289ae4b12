// Linear layer: out[N,OC] = inp[N,C] · w[OC,C]ᵀ + bias[OC]. The products go through gemm().
#include <omp.h>

#include <algorithm>

#include "backend/gemm.h"
#include "backend/kernels.h"
#include "backend/parallel.h"

namespace trident::cpu {

template <typename Real>
void matmul_forward(Real* out, const Real* inp, const Real* w, const Real* bias, int N, int C,
                    int OC, int threads) {
  gemm(Trans::kNo, Trans::kYes, N, OC, C, inp, C, w, C, Real(0), out, OC, threads);
  if (!bias) return;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int n = 0; n < N; ++n) {
    Real* o = out + size_t(n) * OC;
    for (int j = 0; j < OC; ++j) o[j] += bias[j];
  }
}

template <typename Real>
void matmul_backward(Real* dinp, Real* dw, Real* dbias, const Real* dout, const Real* inp,
                     const Real* w, int N, int C, int OC, int threads) {
  if (dinp) gemm(Trans::kNo, Trans::kNo, N, C, OC, dout, OC, w, C, Real(0), dinp, C, threads);
  if (dw) gemm(Trans::kYes, Trans::kNo, OC, C, N, dout, OC, inp, C, Real(1), dw, C, threads);
  if (!dbias) return;
    // Column sums: threads own column slices, rows are added in order (see encoder_backward).
#pragma omp parallel num_threads(threads)
  {
    constexpr int kTile = 256;
    const Range cols = static_chunk(OC, omp_get_thread_num(), omp_get_num_threads(), 16);
    for (size_t j0 = cols.begin; j0 < cols.end; j0 += kTile) {
      const int width = static_cast<int>(std::min<size_t>(kTile, cols.end - j0));
      Real acc[kTile] = {};
      for (int n = 0; n < N; ++n) {
        const Real* d = dout + size_t(n) * OC + j0;
        for (int k = 0; k < width; ++k) acc[k] += d[k];
      }
      for (int k = 0; k < width; ++k) dbias[j0 + k] += acc[k];
    }
  }
}

template <typename Real>
void matmul_backward_weight_rows(Real* dw, const Real* dout, int ld, const Real* inp, int N, int C,
                                 int rows, int threads) {
  gemm(Trans::kYes, Trans::kNo, rows, C, N, dout, ld, inp, C, Real(1), dw, C, threads);
}

#define TRIDENT_INSTANTIATE(Real)                                                                 \
  template void matmul_forward<Real>(Real*, const Real*, const Real*, const Real*, int, int, int, \
                                     int);                                                        \
  template void matmul_backward<Real>(Real*, Real*, Real*, const Real*, const Real*, const Real*, \
                                      int, int, int, int);                                        \
  template void matmul_backward_weight_rows<Real>(Real*, const Real*, int, const Real*, int, int, \
                                                  int, int);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu
