// Token + position embedding.
#include <omp.h>

#include "backend/kernels.h"
#include "backend/parallel.h"

namespace trident::cpu {

template <typename Real>
void encoder_forward(Real* out, const int32_t* tokens, const Real* wte, const Real* wpe, int B,
                     int T, int C, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int bt = 0; bt < B * T; ++bt) {
    const Real* tok = wte + size_t(tokens[bt]) * C;
    const Real* pos = wpe + size_t(bt % T) * C;
    Real* o = out + size_t(bt) * C;
    for (int c = 0; c < C; ++c) o[c] = tok[c] + pos[c];
  }
}

// A token may occur many times, so rows of dwte are not owned by one (b,t). Threads own column
// slices instead and walk all (b,t) in order: no races, and each element's sum has the same order
// whatever the thread count.
template <typename Real>
void encoder_backward(Real* dwte, Real* dwpe, const Real* dout, const int32_t* tokens, int B, int T,
                      int C, int threads) {
#pragma omp parallel num_threads(threads)
  {
    const Range cols = static_chunk(C, omp_get_thread_num(), omp_get_num_threads(), 16);
    for (int bt = 0; bt < B * T && !cols.empty(); ++bt) {
      const Real* d = dout + size_t(bt) * C;
      if (dwte) {
        Real* row = dwte + size_t(tokens[bt]) * C;
        for (size_t c = cols.begin; c < cols.end; ++c) row[c] += d[c];
      }
      if (dwpe) {
        Real* row = dwpe + size_t(bt % T) * C;
        for (size_t c = cols.begin; c < cols.end; ++c) row[c] += d[c];
      }
    }
  }
}

#define TRIDENT_INSTANTIATE(Real)                                                                \
  template void encoder_forward<Real>(Real*, const int32_t*, const Real*, const Real*, int, int, \
                                      int, int);                                                 \
  template void encoder_backward<Real>(Real*, Real*, const Real*, const int32_t*, int, int, int, \
                                       int);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu
