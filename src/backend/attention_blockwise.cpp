// Causal attention by blocks, flash-style (Note [Attention blocks] in include/trident/backend.h):
// nothing of size T×T is stored. A call covers queries [Tq rows] × keys [Tk rows] at global
// positions; the work is cut into tiles of kTile query rows × kTile key rows, tiles that the
// causal mask hides entirely are skipped and only tiles that straddle the diagonal are masked.
//
// Forward, per (batch, head, query tile): the running softmax of each row is (m, l, acc) with
// out = acc / l and lse = m + log l. The incoming (out, lse) is that state with m = lse, l = 1,
// acc = out (lse = -inf: l = 0, nothing yet), so merging a block is the online softmax continued
// over the block's key tiles, in place in `out`; at the end out = acc / l, lse = m + log l.
// Backward recomputes p = exp(s·q·k - lse) per tile from the final lse and delta.
//
// Note [Blockwise backward order]
// One backward task is one (batch, kv head), as in attention.cpp
// (Note [Shared kv head gradients]): it owns that kv head's dk, dv and its query heads' dq, and
// adds tile products in the order query head, query tile, key tile. No two tasks write the same
// memory and each sum's order is fixed in the source, so results are bitwise the same for any
// thread count.
//
// Note [Blockwise attention threshold]
// The CPU backend runs attention.cpp's T×T op up to T 64 (kTxTAttentionMaxT) and this op beyond.
// Measured (test_attention_benchmark.cpp; B 4, NH 4, hs 16/32/64 and KVH 1; forward + backward,
// medians of interleaved runs; docs/perf.md), blockwise / T×T is 0.92-1.07 at T 64, a tie that
// keeps the old op and its exact bits; 0.77-0.94 at 128, 0.48-0.66 at 256, 0.27-0.48 at 1024,
// 0.17-0.35 at 4096. Tiles of 32 lost at T 64 (1.04-1.28), 128 gained nothing. Past 64, `att`
// and scratch are B·NH·max(T, 64²) floats, so that a shorter T's T×T op fits in a buffer sized
// for the longest T (monotone sizes), never more than the T×T op took at 64.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/eigen.h"
#include "backend/fast_math.h"
#include "backend/kernels.h"
#include "backend/parallel.h"
#include "trident/backend.h"
#include "trident/check.h"

namespace trident::cpu {
namespace {

constexpr int kTile = 64;

// At most kTile × kTile, on the stack: no allocation per call.
template <typename Real>
using Tile = Eigen::Matrix<Real, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor, kTile, kTile>;

// Where a query tile [i0, i0 + rows) stands against the keys: it sees keys [0, j_end) at most,
// and query row r sees the first visible(r, j0, cols) columns of key tile [j0, j0 + cols).
struct QueryTile {
  long q_pos, k_pos;
  int i0, rows, j_end;

  QueryTile(long q_pos_, long k_pos_, int Tq, int Tk, int qt)
      : q_pos(q_pos_), k_pos(k_pos_), i0(qt * kTile), rows(std::min(kTile, Tq - qt * kTile)) {
    // Query i sees key j iff k_pos + j <= q_pos + i.
    j_end = int(std::clamp<long>(q_pos + i0 + rows - k_pos, 0, Tk));
  }
  int visible(int r, int j0, int cols) const {
    return int(std::clamp<long>(q_pos + i0 + r - k_pos - j0 + 1, 0, cols));
  }
};

template <typename Real>
const Real* row_ptr(const Real* p, size_t bstride, size_t rstride, int b, int row, int head,
                    int hs) {
  return p + size_t(b) * bstride + size_t(row) * rstride + size_t(head) * hs;
}
template <typename Real>
Real* row_ptr(Real* p, size_t bstride, size_t rstride, int b, int row, int head, int hs) {
  return p + size_t(b) * bstride + size_t(row) * rstride + size_t(head) * hs;
}

template <typename Real>
void forward_query_tile(const AttentionBlockArgs<Real>& a, int b, int h, int qt) {
  const QueryTile t(a.q_pos, a.k_pos, a.Tq, a.Tk, qt);
  if (t.j_end == 0) return;  // no row of this tile sees a key: (out, lse) unchanged
  const int hs = a.hs, kv = h / (a.NH / a.KVH);
  const Real scale = Real(1) / std::sqrt(Real(hs)),
             neg_inf = -std::numeric_limits<Real>::infinity();
  const Eigen::OuterStride<> q_stride(a.q_rstride), kv_stride(a.kv_rstride), o_stride(a.o_rstride);
  ConstView<Real> Q(row_ptr(a.q, a.q_bstride, a.q_rstride, b, t.i0, h, hs), t.rows, hs, q_stride);
  View<Real> O(row_ptr(a.out, a.o_bstride, a.o_rstride, b, t.i0, h, hs), t.rows, hs, o_stride);
  Real* lse = a.lse + size_t(b) * a.s_bstride + size_t(h) * a.s_hstride + t.i0;

  Real m[kTile], l[kTile];
  bool touched[kTile];
  for (int r = 0; r < t.rows; ++r) {
    m[r] = lse[r];
    l[r] = m[r] == neg_inf ? Real(0) : Real(1);
    touched[r] = false;
  }
  Tile<Real> P;
  for (int j0 = 0; j0 < t.j_end; j0 += kTile) {
    const int cols = std::min(kTile, t.j_end - j0);
    ConstView<Real> K(row_ptr(a.k, a.kv_bstride, a.kv_rstride, b, j0, kv, hs), cols, hs, kv_stride);
    ConstView<Real> V(row_ptr(a.v, a.kv_bstride, a.kv_rstride, b, j0, kv, hs), cols, hs, kv_stride);
    P.resize(t.rows, cols);
    P.noalias() = Q * K.transpose();
    for (int r = 0; r < t.rows; ++r) {
      Real* p = P.data() + size_t(r) * cols;
      const int n = t.visible(r, j0, cols);
      if (n > 0) {
        Real mx = neg_inf;
        for (int c = 0; c < n; ++c) mx = std::max(mx, p[c] * scale);
        const Real m_new = std::max(m[r], mx);
        for (int c = 0; c < n; ++c) p[c] = exp_fast(p[c] * scale - m_new);
        // The first keys a row sees: its out row may hold anything, so it is set, not scaled.
        if (l[r] == Real(0)) O.row(r).setZero();
        else if (m_new > m[r]) {
          const Real alpha = exp_fast(m[r] - m_new);
          l[r] *= alpha;
          O.row(r) *= alpha;
        }
        l[r] += sum_of<Real>(p, n);
        m[r] = m_new;
        touched[r] = true;
      }
      std::fill(p + n, p + cols, Real(0));
    }
    O.noalias() += P * V;
  }
  for (int r = 0; r < t.rows; ++r) {
    if (!touched[r]) continue;
    O.row(r) *= Real(1) / l[r];
    lse[r] = m[r] + std::log(l[r]);
  }
}

// The tile products of one query tile of head h against all the keys it sees (dq, dk, dv +=).
template <typename Real>
void backward_query_tile(const AttentionBlockArgs<Real>& a, int b, int h, int qt) {
  const QueryTile t(a.q_pos, a.k_pos, a.Tq, a.Tk, qt);
  if (t.j_end == 0) return;
  const int hs = a.hs, kv = h / (a.NH / a.KVH);
  const Real scale = Real(1) / std::sqrt(Real(hs));
  const Eigen::OuterStride<> q_stride(a.q_rstride), kv_stride(a.kv_rstride), o_stride(a.o_rstride);
  ConstView<Real> Q(row_ptr(a.q, a.q_bstride, a.q_rstride, b, t.i0, h, hs), t.rows, hs, q_stride);
  View<Real> dQ(row_ptr(a.dq, a.q_bstride, a.q_rstride, b, t.i0, h, hs), t.rows, hs, q_stride);
  ConstView<Real> dO(row_ptr(a.dout, a.o_bstride, a.o_rstride, b, t.i0, h, hs), t.rows, hs,
                     o_stride);
  const size_t s_offset = size_t(b) * a.s_bstride + size_t(h) * a.s_hstride + t.i0;
  const Real *lse = a.lse + s_offset, *delta = a.delta + s_offset;

  Tile<Real> P, dS;
  for (int j0 = 0; j0 < t.j_end; j0 += kTile) {
    const int cols = std::min(kTile, t.j_end - j0);
    const size_t k_offset = size_t(b) * a.kv_bstride + size_t(j0) * a.kv_rstride + size_t(kv) * hs;
    ConstView<Real> K(a.k + k_offset, cols, hs, kv_stride), V(a.v + k_offset, cols, hs, kv_stride);
    View<Real> dK(a.dk + k_offset, cols, hs, kv_stride), dV(a.dv + k_offset, cols, hs, kv_stride);
    P.resize(t.rows, cols);
    dS.resize(t.rows, cols);
    P.noalias() = Q * K.transpose();
    for (int r = 0; r < t.rows; ++r) {
      Real* p = P.data() + size_t(r) * cols;
      const int n = t.visible(r, j0, cols);
      for (int c = 0; c < n; ++c) p[c] = exp_fast(p[c] * scale - lse[r]);
      std::fill(p + n, p + cols, Real(0));
    }
    dS.noalias() = dO * V.transpose();  // dP
    dV.noalias() += P.transpose() * dO;
    for (int r = 0; r < t.rows; ++r) {
      const Real* p = P.data() + size_t(r) * cols;
      Real* ds = dS.data() + size_t(r) * cols;
      for (int c = 0; c < cols; ++c) ds[c] = scale * p[c] * (ds[c] - delta[r]);
    }
    dQ.noalias() += dS * K;
    dK.noalias() += dS.transpose() * Q;
  }
}

int query_tiles(int Tq) { return (Tq + kTile - 1) / kTile; }

}  // namespace

template <typename Real>
void attention_block_forward(const AttentionBlockArgs<Real>& a, int threads) {
  const int tiles = query_tiles(a.Tq), tasks = a.B * a.NH * tiles;
  // Later query tiles see more keys: dynamic scheduling balances them; each task owns its rows.
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int task = 0; task < tasks; ++task)
    forward_query_tile(a, task / (a.NH * tiles), task / tiles % a.NH, task % tiles);
}

// One task per (batch, kv head): Note [Blockwise backward order].
template <typename Real>
void attention_block_backward(const AttentionBlockArgs<Real>& a, int threads) {
  const int group = a.NH / a.KVH, tiles = query_tiles(a.Tq);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int bkv = 0; bkv < a.B * a.KVH; ++bkv) {
    const int b = bkv / a.KVH, kv = bkv % a.KVH;
    for (int g = 0; g < group; ++g)
      for (int qt = 0; qt < tiles; ++qt) backward_query_tile(a, b, kv * group + g, qt);
  }
}

template <typename Real>
void attention_block_delta(const AttentionBlockArgs<Real>& a, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int bh = 0; bh < a.B * a.NH; ++bh) {
    const int b = bh / a.NH, h = bh % a.NH;
    Real* delta = a.delta + size_t(b) * a.s_bstride + size_t(h) * a.s_hstride;
    for (int i = 0; i < a.Tq; ++i)
      delta[i] = dot_of<Real>(row_ptr(a.dout, a.o_bstride, a.o_rstride, b, i, h, a.hs),
                              row_ptr(a.out, a.o_bstride, a.o_rstride, b, i, h, a.hs), a.hs);
  }
}

template <typename Real>
void attention_block_reset(const AttentionBlockArgs<Real>& a, int threads) {
  (void)threads;  // B·NH·Tq stores
  for (int bh = 0; bh < a.B * a.NH; ++bh) {
    Real* lse = a.lse + size_t(bh / a.NH) * a.s_bstride + size_t(bh % a.NH) * a.s_hstride;
    std::fill(lse, lse + a.Tq, -std::numeric_limits<Real>::infinity());
  }
}

template <typename Real>
AttentionBlockArgs<Real> whole_sequence_block(const Real* qkv, int B, int T, int NH, int KVH,
                                              int hs) {
  const size_t row = size_t(NH + 2 * KVH) * hs, C = size_t(NH) * hs;
  AttentionBlockArgs<Real> a;
  a.B = B, a.NH = NH, a.KVH = KVH, a.hs = hs, a.Tq = T, a.Tk = T;
  a.q = qkv, a.k = qkv + C, a.v = qkv + C + size_t(KVH) * hs;
  a.q_bstride = a.kv_bstride = size_t(T) * row;
  a.q_rstride = a.kv_rstride = row;
  a.o_bstride = size_t(T) * C, a.o_rstride = C;
  a.s_bstride = size_t(NH) * T, a.s_hstride = T;
  return a;
}

template <typename Real>
void attention_forward_blockwise(Real* out, Real* lse, const Real* qkv, int B, int T, int NH,
                                 int KVH, int hs, int threads) {
  AttentionBlockArgs<Real> a = whole_sequence_block(qkv, B, T, NH, KVH, hs);
  a.out = out, a.lse = lse;
  attention_block_reset(a, threads);
  attention_block_forward(a, threads);
}

template <typename Real>
void attention_backward_blockwise(Real* dqkv, Real* delta, const Real* dout, const Real* qkv,
                                  const Real* out, const Real* lse, int B, int T, int NH, int KVH,
                                  int hs, int threads) {
  AttentionBlockArgs<Real> a = whole_sequence_block(qkv, B, T, NH, KVH, hs);
  a.out = const_cast<Real*>(out), a.dout = dout, a.lse = const_cast<Real*>(lse), a.delta = delta;
  a.dq = dqkv, a.dk = dqkv + (a.k - qkv), a.dv = dqkv + (a.v - qkv);
  attention_block_delta(a, threads);
  std::fill(dqkv, dqkv + size_t(B) * T * (NH + 2 * KVH) * hs, Real(0));  // dqkv is assigned
  attention_block_backward(a, threads);
}

}  // namespace trident::cpu

namespace trident {

void check_attention_block(const AttentionBlockArgs& a, const char* op) {
  TRIDENT_CHECK(a.KVH > 0 && a.NH % a.KVH == 0 && a.hs > 0,
                "{}: kv heads {} must divide heads {}, head size {} > 0", op, a.KVH, a.NH, a.hs);
  const size_t q_row = size_t(a.NH) * a.hs, kv_row = size_t(a.KVH) * a.hs;
  TRIDENT_CHECK(a.B > 0 && a.Tq >= 0 && a.Tk >= 0, "{}: need B > 0, Tq, Tk >= 0, got {}, {}, {}",
                op, a.B, a.Tq, a.Tk);
  TRIDENT_CHECK(a.q_rstride >= q_row && a.o_rstride >= q_row && a.kv_rstride >= kv_row &&
                    a.s_hstride >= size_t(a.Tq) && a.s_bstride >= size_t(a.NH) * a.s_hstride,
                "{}: row strides q {} out {} kv {} below the heads' width {} / {}, or stats "
                "strides {}, {} below Tq {}",
                op, a.q_rstride, a.o_rstride, a.kv_rstride, q_row, kv_row, a.s_bstride, a.s_hstride,
                a.Tq);
}

}  // namespace trident

namespace trident::cpu {

#define TRIDENT_INSTANTIATE(Real)                                                                \
  template void attention_block_forward<Real>(const AttentionBlockArgs<Real>&, int);             \
  template void attention_block_backward<Real>(const AttentionBlockArgs<Real>&, int);            \
  template void attention_block_delta<Real>(const AttentionBlockArgs<Real>&, int);               \
  template void attention_block_reset<Real>(const AttentionBlockArgs<Real>&, int);               \
  template void attention_forward_blockwise<Real>(Real*, Real*, const Real*, int, int, int, int, \
                                                  int, int);                                     \
  template void attention_backward_blockwise<Real>(Real*, Real*, const Real*, const Real*,       \
                                                   const Real*, const Real*, int, int, int, int, \
                                                   int, int);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu
