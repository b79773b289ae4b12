// Causal self-attention with grouped key/value heads: NH query heads, KVH key/value heads
// (NH % KVH == 0), query head h reading kv head h / (NH / KVH). KVH == NH is multi-head
// attention (attention_forward/backward call these with KVH = NH), KVH == 1 multi-query.
//
// Per query head, with Q, K, V the [T,hs] slices of qkv (row stride (NH + 2·KVH)·hs: q | k | v)
// and s = 1/sqrt(hs):
//   forward:  P = softmax_causal(s·Q·Kᵀ) (saved in att, zeros above the diagonal), O = P·V
//   backward: dP = dO·Vᵀ, dV = Pᵀ·dO, dS = s·P ⊙ (dP - rowsum(P ⊙ dP)), dQ = dS·K, dK = dSᵀ·Q
// The products are small (T×T×hs) and triangular: Eigen's triangular products compute only the
// causal half, faster than hand-written dot/axpy loops (docs/perf.md). Each task owns its slices
// of out and dqkv, so tasks never race, and each runs single-threaded Eigen code: deterministic.
//
// Note [Shared kv head gradients]
// A kv head's dK and dV are sums over the NH / KVH query heads that read it. The backward task is
// one (batch, kv head): it runs its query heads in order, the first assigning dK, dV and the rest
// adding, so the sum's order is fixed whatever the thread count, and with KVH == NH the code is
// multi-head attention's, operation for operation. The price: B·KVH tasks rather than B·NH, which
// leaves threads idle in backward only when B·KVH < threads (multi-query at batch 1).
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/eigen.h"
#include "backend/fast_math.h"
#include "backend/kernels.h"
#include "backend/parallel.h"

namespace trident::cpu {
namespace {

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
void attention_forward_gqa(Real* out, Real* att, const Real* qkv, int B, int T, int NH, int KVH,
                           int hs, int threads) {
  const int C = NH * hs, row = (NH + 2 * KVH) * hs, group = NH / KVH;
  const Real scale = Real(1) / std::sqrt(Real(hs));
  const Eigen::OuterStride<> qkv_stride(row), out_stride(C), att_stride(T);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH, h = bh % NH, kv = h / group;
    const Real* x = qkv + size_t(b) * T * row;
    ConstView<Real> Q(x + size_t(h) * hs, T, hs, qkv_stride),
        K(x + size_t(NH + kv) * hs, T, hs, qkv_stride),
        V(x + size_t(NH + KVH + kv) * hs, T, hs, qkv_stride);
    View<Real> P(att + size_t(bh) * T * T, T, T, att_stride);
    View<Real> O(out + size_t(b) * T * C + size_t(h) * hs, T, hs, out_stride);

    P.template triangularView<Eigen::Lower>() = Q * K.transpose();
    for (int i = 0; i < T; ++i) causal_softmax_row(P.data() + size_t(i) * T, i, T, scale);
    O.noalias() = P.template triangularView<Eigen::Lower>() * V;
  }
}

// One task per (batch, kv head): it owns that kv head's dK, dV and its query heads' dQ, and sums
// dK, dV over the query heads in head order (Note [Shared kv head gradients]).
template <typename Real>
void attention_backward_gqa(Real* dqkv, Real* scratch, const Real* dout, const Real* qkv,
                            const Real* att, int B, int T, int NH, int KVH, int hs, int threads) {
  const int C = NH * hs, row = (NH + 2 * KVH) * hs, group = NH / KVH;
  const Real scale = Real(1) / std::sqrt(Real(hs));
  const Eigen::OuterStride<> qkv_stride(row), out_stride(C), att_stride(T);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int bkv = 0; bkv < B * KVH; ++bkv) {
    const int b = bkv / KVH, kv = bkv % KVH;
    const size_t k_offset = size_t(b) * T * row + size_t(NH + kv) * hs;
    const size_t v_offset = k_offset + size_t(KVH) * hs;
    ConstView<Real> K(qkv + k_offset, T, hs, qkv_stride), V(qkv + v_offset, T, hs, qkv_stride);
    View<Real> dK(dqkv + k_offset, T, hs, qkv_stride), dV(dqkv + v_offset, T, hs, qkv_stride);
    for (int g = 0; g < group; ++g) {
      const int h = kv * group + g;
      const size_t bh = size_t(b) * NH + h, q_offset = size_t(b) * T * row + size_t(h) * hs;
      ConstView<Real> Q(qkv + q_offset, T, hs, qkv_stride);
      View<Real> dQ(dqkv + q_offset, T, hs, qkv_stride);
      ConstView<Real> P(att + bh * T * T, T, T, att_stride);
      ConstView<Real> dO(dout + size_t(b) * T * C + size_t(h) * hs, T, hs, out_stride);
      View<Real> dS(scratch + bh * T * T, T, T, att_stride);  // holds dP, then dS

      // Only the lower triangle of dP/dS is written and read; the rest of scratch is never used.
      dS.template triangularView<Eigen::Lower>() = dO * V.transpose();
      if (g == 0)
        dV.noalias() = P.transpose().template triangularView<Eigen::Upper>() * dO;  // Pᵀ: upper
      else dV.noalias() += P.transpose().template triangularView<Eigen::Upper>() * dO;
      for (int i = 0; i < T; ++i) {
        const Real* p = P.data() + size_t(i) * T;
        Real* ds = dS.data() + size_t(i) * T;
        const Real p_dot_dp = dot_of<Real>(p, ds, i + 1);
        for (int j = 0; j <= i; ++j) ds[j] = scale * p[j] * (ds[j] - p_dot_dp);
      }
      dQ.noalias() = dS.template triangularView<Eigen::Lower>() * K;
      if (g == 0) dK.noalias() = dS.transpose().template triangularView<Eigen::Upper>() * Q;
      else dK.noalias() += dS.transpose().template triangularView<Eigen::Upper>() * Q;
    }
  }
}

template <typename Real>
void attention_forward(Real* out, Real* att, const Real* qkv, int B, int T, int C, int NH,
                       int threads) {
  attention_forward_gqa(out, att, qkv, B, T, NH, NH, C / NH, threads);
}

template <typename Real>
void attention_backward(Real* dqkv, Real* scratch, const Real* dout, const Real* qkv,
                        const Real* att, int B, int T, int C, int NH, int threads) {
  attention_backward_gqa(dqkv, scratch, dout, qkv, att, B, T, NH, NH, C / NH, threads);
}

#define TRIDENT_INSTANTIATE(Real)                                                                  \
  template void attention_forward_gqa<Real>(Real*, Real*, const Real*, int, int, int, int, int,    \
                                            int);                                                  \
  template void attention_backward_gqa<Real>(Real*, Real*, const Real*, const Real*, const Real*,  \
                                             int, int, int, int, int, int);                        \
  template void attention_forward<Real>(Real*, Real*, const Real*, int, int, int, int, int);       \
  template void attention_backward<Real>(Real*, Real*, const Real*, const Real*, const Real*, int, \
                                         int, int, int, int);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu
