// Causal multi-head self-attention, one (batch, head) pair per task.
//
// Per head, with Q, K, V the [T,hs] slices of qkv (row stride 3C) and s = 1/sqrt(hs):
//   forward:  P = softmax_causal(s·Q·Kᵀ) (saved in att, zeros above the diagonal), O = P·V
//   backward: dP = dO·Vᵀ, dV = Pᵀ·dO, dS = P ⊙ (dP - rowsum(P ⊙ dP)), dQ = s·dS·K, dK = s·dSᵀ·Q
// Only the causal triangle j <= i is computed. The loops are dot products and axpys over hs
// contiguous values, which vectorise; a (b,h) task owns its output columns, so tasks never race.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/fast_math.h"
#include "backend/kernels.h"
#include "backend/parallel.h"

namespace trident::cpu {
namespace {

// Where one head's rows live: row t of Q is q + t·stride (K and V are C and 2C further on).
template <typename Real>
struct HeadView {
  Real* q;
  size_t stride;
  int C;
  Real* q_row(int t) const { return q + t * stride; }
  Real* k_row(int t) const { return q + t * stride + C; }
  Real* v_row(int t) const { return q + t * stride + 2 * size_t(C); }
};

template <typename Real>
void axpy(Real* y, Real a, const Real* x, int n) {
  for (int d = 0; d < n; ++d) y[d] += a * x[d];
}

}  // namespace

template <typename Real>
void attention_forward(Real* out, Real* att, const Real* qkv, int B, int T, int C, int NH,
                       int threads) {
  const int hs = C / NH;
  const Real scale = Real(1) / std::sqrt(Real(hs));
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH, h = bh % NH;
    const HeadView<const Real> head{qkv + size_t(b) * T * 3 * C + size_t(h) * hs, 3 * size_t(C), C};
    for (int i = 0; i < T; ++i) {
      Real* p = att + (size_t(bh) * T + i) * T;
      const Real* q = head.q_row(i);
      Real max = -std::numeric_limits<Real>::infinity();
      for (int j = 0; j <= i; ++j) {
        p[j] = dot_of<Real>(q, head.k_row(j), hs) * scale;
        max = std::max(max, p[j]);
      }
      for (int j = 0; j <= i; ++j) p[j] = exp_fast(p[j] - max);
      const Real inv_sum = Real(1) / sum_of<Real>(p, i + 1);
      for (int j = 0; j <= i; ++j) p[j] *= inv_sum;
      for (int j = i + 1; j < T; ++j) p[j] = Real(0);

      Real* o = out + (size_t(b) * T + i) * C + size_t(h) * hs;
      for (int d = 0; d < hs; ++d) o[d] = Real(0);
      for (int j = 0; j <= i; ++j) axpy(o, p[j], head.v_row(j), hs);
    }
  }
}

template <typename Real>
void attention_backward(Real* dqkv, Real* scratch, const Real* dout, const Real* qkv,
                        const Real* att, int B, int T, int C, int NH, int threads) {
  const int hs = C / NH;
  const Real scale = Real(1) / std::sqrt(Real(hs));
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH, h = bh % NH;
    const size_t offset = size_t(b) * T * 3 * C + size_t(h) * hs;
    const HeadView<const Real> head{qkv + offset, 3 * size_t(C), C};
    const HeadView<Real> grad{dqkv + offset, 3 * size_t(C), C};
    for (int t = 0; t < T; ++t) {  // dqkv is assigned: clear this head's columns first
      for (int d = 0; d < hs; ++d) grad.q_row(t)[d] = grad.k_row(t)[d] = grad.v_row(t)[d] = Real(0);
    }
    for (int i = 0; i < T; ++i) {
      const Real* p = att + (size_t(bh) * T + i) * T;
      const Real* g = dout + (size_t(b) * T + i) * C + size_t(h) * hs;  // dO row i
      Real* dp = scratch + (size_t(bh) * T + i) * T;
      for (int j = 0; j <= i; ++j) {
        dp[j] = dot_of<Real>(g, head.v_row(j), hs);
        axpy(grad.v_row(j), p[j], g, hs);
      }
      const Real p_dot_dp = dot_of<Real>(p, dp, i + 1);
      for (int j = 0; j <= i; ++j) {
        const Real ds = p[j] * (dp[j] - p_dot_dp) * scale;
        axpy(grad.q_row(i), ds, head.k_row(j), hs);
        axpy(grad.k_row(j), ds, head.q_row(i), hs);
      }
    }
  }
}

#define TRIDENT_INSTANTIATE(Real)                                                            \
  template void attention_forward<Real>(Real*, Real*, const Real*, int, int, int, int, int); \
  template void attention_backward<Real>(Real*, Real*, const Real*, const Real*, const Real*, \
                                         int, int, int, int, int);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu
