// Causal multi-head self-attention, one (batch, head) pair per task.
//
// Per head, with Q, K, V the [T,hs] slices of qkv (row stride 3C) and s = 1/sqrt(hs):
//   forward:  P = softmax_causal(s·Q·Kᵀ) (saved in att, zeros above the diagonal), O = P·V
//   backward: dP = dO·Vᵀ, dV = Pᵀ·dO, dS = s·P ⊙ (dP - rowsum(P ⊙ dP)), dQ = dS·K, dK = dSᵀ·Q
// The products are small (T×T×hs) and triangular: Eigen's triangular products compute only the
// causal half, faster than hand-written dot/axpy loops (docs/perf.md). A (b,h) task owns its
// slices of out and dqkv, so tasks never race, and each runs single-threaded Eigen code:
// deterministic.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/eigen.h"
#include "backend/fast_math.h"
#include "backend/kernels.h"
#include "backend/parallel.h"

namespace trident::cpu {
namespace {

template <typename Real>
using RowMajor = Eigen::Matrix<Real, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename Real>
using View = Eigen::Map<RowMajor<Real>, 0, Eigen::OuterStride<>>;
template <typename Real>
using ConstView = Eigen::Map<const RowMajor<Real>, 0, Eigen::OuterStride<>>;

// Row i of P (length T): scale the causal part j <= i, softmax it in place, zero the rest.
template <typename Real>
void causal_softmax_row(Real* p, int i, int T, Real scale) {
  Real max = -std::numeric_limits<Real>::infinity();
  for (int j = 0; j <= i; ++j) max = std::max(max, p[j] * scale);
  for (int j = 0; j <= i; ++j) p[j] = exp_fast(p[j] * scale - max);
  const Real inv_sum = Real(1) / sum_of<Real>(p, i + 1);
  for (int j = 0; j <= i; ++j) p[j] *= inv_sum;
  for (int j = i + 1; j < T; ++j) p[j] = Real(0);
}

}  // namespace

template <typename Real>
void attention_forward(Real* out, Real* att, const Real* qkv, int B, int T, int C, int NH,
                       int threads) {
  const int hs = C / NH;
  const Real scale = Real(1) / std::sqrt(Real(hs));
  const Eigen::OuterStride<> qkv_stride(3 * C), out_stride(C), att_stride(T);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH, h = bh % NH;
    const Real* q = qkv + size_t(b) * T * 3 * C + size_t(h) * hs;
    ConstView<Real> Q(q, T, hs, qkv_stride), K(q + C, T, hs, qkv_stride),
        V(q + 2 * C, T, hs, qkv_stride);
    View<Real> P(att + size_t(bh) * T * T, T, T, att_stride);
    View<Real> O(out + size_t(b) * T * C + size_t(h) * hs, T, hs, out_stride);

    P.template triangularView<Eigen::Lower>() = Q * K.transpose();
    for (int i = 0; i < T; ++i) causal_softmax_row(P.data() + size_t(i) * T, i, T, scale);
    O.noalias() = P.template triangularView<Eigen::Lower>() * V;
  }
}

template <typename Real>
void attention_backward(Real* dqkv, Real* scratch, const Real* dout, const Real* qkv,
                        const Real* att, int B, int T, int C, int NH, int threads) {
  const int hs = C / NH;
  const Real scale = Real(1) / std::sqrt(Real(hs));
  const Eigen::OuterStride<> qkv_stride(3 * C), out_stride(C), att_stride(T);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH, h = bh % NH;
    const size_t offset = size_t(b) * T * 3 * C + size_t(h) * hs;
    ConstView<Real> Q(qkv + offset, T, hs, qkv_stride), K(qkv + offset + C, T, hs, qkv_stride),
        V(qkv + offset + 2 * C, T, hs, qkv_stride);
    View<Real> dQ(dqkv + offset, T, hs, qkv_stride), dK(dqkv + offset + C, T, hs, qkv_stride),
        dV(dqkv + offset + 2 * C, T, hs, qkv_stride);
    ConstView<Real> P(att + size_t(bh) * T * T, T, T, att_stride);
    ConstView<Real> dO(dout + size_t(b) * T * C + size_t(h) * hs, T, hs, out_stride);
    View<Real> dS(scratch + size_t(bh) * T * T, T, T, att_stride);  // holds dP, then dS

    // Only the lower triangle of dP/dS is written and read; the rest of scratch is never used.
    dS.template triangularView<Eigen::Lower>() = dO * V.transpose();
    dV.noalias() = P.transpose().template triangularView<Eigen::Upper>() * dO;  // Pᵀ is upper
    for (int i = 0; i < T; ++i) {
      const Real* p = P.data() + size_t(i) * T;
      Real* ds = dS.data() + size_t(i) * T;
      const Real p_dot_dp = dot_of<Real>(p, ds, i + 1);
      for (int j = 0; j <= i; ++j) ds[j] = scale * p[j] * (ds[j] - p_dot_dp);
    }
    dQ.noalias() = dS.template triangularView<Eigen::Lower>() * K;
    dK.noalias() = dS.transpose().template triangularView<Eigen::Upper>() * Q;
  }
}

#define TRIDENT_INSTANTIATE(Real)                                                                  \
  template void attention_forward<Real>(Real*, Real*, const Real*, int, int, int, int, int);       \
  template void attention_backward<Real>(Real*, Real*, const Real*, const Real*, const Real*, int, \
                                         int, int, int, int);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu
