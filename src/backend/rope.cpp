// Rotary position embedding, as transformers' apply_rotary_pos_emb computes it (rotate_half,
// partial rotary), in place on the q and k heads of q | k | v rows; v is never touched.
//
// In each head, dimensions i and i + rot/2 (i < rot/2) turn by the angle of position t and
// frequency i: the pair (a, b) becomes (a·c − b·s, b·c + a·s), c = cos[t,i], s = sin[t,i].
// Backward applies the transpose, the turn by −angle: (da, db) becomes (da·c + db·s, db·c − da·s).
// Rows are independent, so rows run in parallel and every value is computed the same way for any
// thread count.
#include "backend/kernels.h"

namespace trident::cpu {
namespace {

// sign = +1: forward; −1: backward (sin negated).
template <typename Real>
void rotate_rows(Real* qkv, const Real* cos, const Real* sin, int N, int T, int NH, int KVH, int hs,
                 int rot, Real sign, int threads) {
  const int half = rot / 2, row = (NH + 2 * KVH) * hs;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int n = 0; n < N; ++n) {
    const int t = n % T;
    const Real* c = cos + size_t(t) * half;
    const Real* s = sin + size_t(t) * half;
    Real* x = qkv + size_t(n) * row;
    for (int head = 0; head < NH + KVH; ++head) {  // the q heads, then the k heads
      Real* a = x + size_t(head) * hs;
      Real* b = a + half;
      for (int i = 0; i < half; ++i) {
        const Real ai = a[i], bi = b[i], si = sign * s[i];
        a[i] = ai * c[i] - bi * si;
        b[i] = bi * c[i] + ai * si;
      }
    }
  }
}

}  // namespace

template <typename Real>
void rope_forward(Real* qkv, const Real* cos, const Real* sin, int N, int T, int NH, int KVH,
                  int hs, int rot, int threads) {
  rotate_rows(qkv, cos, sin, N, T, NH, KVH, hs, rot, Real(1), threads);
}

template <typename Real>
void rope_backward(Real* dqkv, const Real* cos, const Real* sin, int N, int T, int NH, int KVH,
                   int hs, int rot, int threads) {
  rotate_rows(dqkv, cos, sin, N, T, NH, KVH, hs, rot, Real(-1), threads);
}

#define TRIDENT_INSTANTIATE(Real)                                                                  \
  template void rope_forward<Real>(Real*, const Real*, const Real*, int, int, int, int, int, int,  \
                                   int);                                                           \
  template void rope_backward<Real>(Real*, const Real*, const Real*, int, int, int, int, int, int, \
                                    int);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu
