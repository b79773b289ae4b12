// Causal attention by blocks in fp32 (see attention_block.h; semantics: Note [Attention blocks]
// in trident/backend.h; CPU twin: src/backend/attention_blockwise.cpp).
//
// Note [Attention block kernels]
// Simple before fast: one warp per output row, lanes splitting the head's elements (d = lane +
// 32·k, in registers), one key (or query) at a time, each dot product a butterfly of shuffles
// that leaves the same bits in every lane. Forward: a warp per query row continues its online
// softmax over the keys it sees. Backward: a warp per key row sums dK, dV over its query heads
// (head order) and the query rows that see it (row order); a warp per query row sums dQ over
// the keys; each output row has one writer and a fixed order, so no atomics and bitwise
// repeatable. p is recomputed in both passes. Far from flash speed: no shared-memory tiles.
#include <cmath>

#include "attention_block.h"
#include "launch.cuh"

namespace trident::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / kWarp;
constexpr int kPerLane = kAttentionBlockMaxHs / kWarp;

// The same sum in every lane: each step adds a pair whose order does not change the bits.
__device__ float warp_sum(float x) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ const float* row_at(const float* p, size_t bstride, size_t rstride, int b, int row,
                               int head, int hs) {
  return p + size_t(b) * bstride + size_t(row) * rstride + size_t(head) * hs;
}
__device__ float* row_at(float* p, size_t bstride, size_t rstride, int b, int row, int head,
                         int hs) {
  return p + size_t(b) * bstride + size_t(row) * rstride + size_t(head) * hs;
}

// This lane's elements of a row (zeros past hs).
__device__ void load_lane(float (&x)[kPerLane], const float* row, int hs, int lane) {
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int d = lane + kWarp * k;
    x[k] = d < hs ? row[d] : 0.0f;
  }
}

__device__ float dot_lane(const float (&x)[kPerLane], const float* row, int hs, int lane) {
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int d = lane + kWarp * k;
    if (d < hs) s += x[k] * row[d];
  }
  return warp_sum(s);
}

// How many of the block's keys query row i sees (a prefix: k_pos + j <= q_pos + i).
__device__ int keys_seen(const AttentionBlockArgs& a, int i) {
  const long n = a.q_pos + i - a.k_pos + 1;
  return int(n < 0 ? 0 : n > a.Tk ? a.Tk : n);
}

// This warp's row of a grid of warps over (batch, head, row), rows fastest; false past the end.
struct WarpRow {
  int b, head, row, lane;
};
__device__ bool warp_row(int B, int heads, int rows, WarpRow* r) {
  const long w = long(blockIdx.x) * kWarps + threadIdx.x / kWarp;
  if (w >= long(B) * heads * rows) return false;
  *r = {int(w / (long(rows) * heads)), int(w / rows % heads), int(w % rows),
        int(threadIdx.x % kWarp)};
  return true;
}

__global__ void attention_block_fwd_kernel(AttentionBlockArgs a, float scale) {
  WarpRow r;
  if (!warp_row(a.B, a.NH, a.Tq, &r)) return;
  const int b = r.b, h = r.head, i = r.row, lane = r.lane, hs = a.hs;
  const int kv = h / (a.NH / a.KVH), n = keys_seen(a, i);
  if (n == 0) return;  // (out, lse) unchanged
  float q[kPerLane], acc[kPerLane];
  load_lane(q, row_at(a.q, a.q_bstride, a.q_rstride, b, i, h, hs), hs, lane);
  float* out = row_at(a.out, a.o_bstride, a.o_rstride, b, i, h, hs);
  float* lse = a.lse + size_t(b) * a.s_bstride + size_t(h) * a.s_hstride + i;
  // The running softmax (m, l, acc) of the incoming (out, lse); lse = -inf: empty, and out may
  // hold anything, so it is not read.
  float m = *lse, l = m == -INFINITY ? 0.0f : 1.0f;
  if (l > 0.0f) load_lane(acc, out, hs, lane);
  else
    for (float& x : acc) x = 0.0f;
  for (int j = 0; j < n; ++j) {
    const float s =
        dot_lane(q, row_at(a.k, a.kv_bstride, a.kv_rstride, b, j, kv, hs), hs, lane) * scale;
    const float m_new = fmaxf(m, s), alpha = expf(m - m_new), p = expf(s - m_new);
    const float* v = row_at(a.v, a.kv_bstride, a.kv_rstride, b, j, kv, hs);
    l = l * alpha + p;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int d = lane + kWarp * k;
      if (d < hs) acc[k] = acc[k] * alpha + p * v[d];
    }
    m = m_new;
  }
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int d = lane + kWarp * k;
    if (d < hs) out[d] = acc[k] / l;
  }
  __syncwarp();  // every lane read lse before it is replaced
  if (lane == 0) *lse = m + logf(l);
}

// dK, dV of one key row j of kv head kv: Note [Attention block kernels].
__global__ void attention_block_bwd_dkv_kernel(AttentionBlockArgs a, float scale) {
  WarpRow r;
  if (!warp_row(a.B, a.KVH, a.Tk, &r)) return;
  const int b = r.b, kv = r.head, j = r.row, lane = r.lane, hs = a.hs;
  const long first = a.k_pos + j - a.q_pos;  // the first query row that sees key j
  if (first >= a.Tq) return;
  const int i0 = first < 0 ? 0 : int(first), group = a.NH / a.KVH;
  float k[kPerLane], v[kPerLane], dk[kPerLane] = {}, dv[kPerLane] = {};
  load_lane(k, row_at(a.k, a.kv_bstride, a.kv_rstride, b, j, kv, hs), hs, lane);
  load_lane(v, row_at(a.v, a.kv_bstride, a.kv_rstride, b, j, kv, hs), hs, lane);
  for (int g = 0; g < group; ++g) {
    const int h = kv * group + g;
    const size_t s_row = size_t(b) * a.s_bstride + size_t(h) * a.s_hstride;
    for (int i = i0; i < a.Tq; ++i) {
      const float* q = row_at(a.q, a.q_bstride, a.q_rstride, b, i, h, hs);
      const float* dout = row_at(a.dout, a.o_bstride, a.o_rstride, b, i, h, hs);
      const float p = expf(dot_lane(k, q, hs, lane) * scale - a.lse[s_row + i]);
      const float ds = scale * p * (dot_lane(v, dout, hs, lane) - a.delta[s_row + i]);
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const int d = lane + kWarp * e;
        if (d < hs) dv[e] += p * dout[d], dk[e] += ds * q[d];
      }
    }
  }
  float* dk_row = row_at(a.dk, a.kv_bstride, a.kv_rstride, b, j, kv, hs);
  float* dv_row = row_at(a.dv, a.kv_bstride, a.kv_rstride, b, j, kv, hs);
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int d = lane + kWarp * e;
    if (d < hs) dk_row[d] += dk[e], dv_row[d] += dv[e];
  }
}

// dQ of one query row i of head h, over the keys it sees in key order.
__global__ void attention_block_bwd_dq_kernel(AttentionBlockArgs a, float scale) {
  WarpRow r;
  if (!warp_row(a.B, a.NH, a.Tq, &r)) return;
  const int b = r.b, h = r.head, i = r.row, lane = r.lane, hs = a.hs;
  const int kv = h / (a.NH / a.KVH), n = keys_seen(a, i);
  if (n == 0) return;
  float q[kPerLane], dout[kPerLane], dq[kPerLane] = {};
  load_lane(q, row_at(a.q, a.q_bstride, a.q_rstride, b, i, h, hs), hs, lane);
  load_lane(dout, row_at(a.dout, a.o_bstride, a.o_rstride, b, i, h, hs), hs, lane);
  const size_t s_at = size_t(b) * a.s_bstride + size_t(h) * a.s_hstride + i;
  const float lse = a.lse[s_at], delta = a.delta[s_at];
  for (int j = 0; j < n; ++j) {
    const float* k = row_at(a.k, a.kv_bstride, a.kv_rstride, b, j, kv, hs);
    const float* v = row_at(a.v, a.kv_bstride, a.kv_rstride, b, j, kv, hs);
    const float p = expf(dot_lane(q, k, hs, lane) * scale - lse);
    const float ds = scale * p * (dot_lane(dout, v, hs, lane) - delta);
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int d = lane + kWarp * e;
      if (d < hs) dq[e] += ds * k[d];
    }
  }
  float* dq_row = row_at(a.dq, a.q_bstride, a.q_rstride, b, i, h, hs);
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int d = lane + kWarp * e;
    if (d < hs) dq_row[d] += dq[e];
  }
}

__global__ void attention_block_delta_kernel(AttentionBlockArgs a) {
  WarpRow r;
  if (!warp_row(a.B, a.NH, a.Tq, &r)) return;
  const int b = r.b, h = r.head, i = r.row, lane = r.lane, hs = a.hs;
  float dout[kPerLane];
  load_lane(dout, row_at(a.dout, a.o_bstride, a.o_rstride, b, i, h, hs), hs, lane);
  const float delta =
      dot_lane(dout, row_at(a.out, a.o_bstride, a.o_rstride, b, i, h, hs), hs, lane);
  if (lane == 0) a.delta[size_t(b) * a.s_bstride + size_t(h) * a.s_hstride + i] = delta;
}

__global__ void attention_block_reset_kernel(AttentionBlockArgs a) {
  const long n = long(a.B) * a.NH * a.Tq;
  for (long t = long(blockIdx.x) * blockDim.x + threadIdx.x; t < n;
       t += long(gridDim.x) * blockDim.x) {
    const int i = int(t % a.Tq), h = int(t / a.Tq % a.NH), b = int(t / (long(a.Tq) * a.NH));
    a.lse[size_t(b) * a.s_bstride + size_t(h) * a.s_hstride + i] = -INFINITY;
  }
}

// The shapes every block op relies on, and the head-size limit.
void check_args(const AttentionBlockArgs& a, const char* op) {
  check_attention_block(a, op);
  TRIDENT_CHECK(a.hs <= kAttentionBlockMaxHs, "{}: head size {} above the kernels' {}", op, a.hs,
                kAttentionBlockMaxHs);
}

// No query row of the block sees a key of it (or either side is empty): nothing to launch.
bool hidden(const AttentionBlockArgs& a) {
  return a.Tq == 0 || a.Tk == 0 || a.k_pos > a.q_pos + a.Tq - 1;
}

float scale_of(const AttentionBlockArgs& a) { return 1.0f / sqrtf(float(a.hs)); }

unsigned warps_grid(long rows) { return ceil_div(size_t(rows), size_t(kWarps)); }

}  // namespace

void attention_block_fwd_cuda(const AttentionBlockArgs& a, cudaStream_t stream) {
  check_args(a, "attention_block_forward");
  TRIDENT_CHECK(a.q && a.k && a.v && a.out && a.lse,
                "attention_block_forward: null q, k, v, out or lse");
  if (hidden(a)) return;
  attention_block_fwd_kernel<<<warps_grid(long(a.B) * a.NH * a.Tq), kThreads, 0, stream>>>(
      a, scale_of(a));
  TRIDENT_CUDA_LAUNCHED();
}

void attention_block_bwd_cuda(const AttentionBlockArgs& a, cudaStream_t stream) {
  check_args(a, "attention_block_backward");
  TRIDENT_CHECK(a.q && a.k && a.v && a.dout && a.lse && a.delta && a.dq && a.dk && a.dv,
                "attention_block_backward: null q, k, v, dout, lse, delta, dq, dk or dv");
  if (hidden(a)) return;
  attention_block_bwd_dkv_kernel<<<warps_grid(long(a.B) * a.KVH * a.Tk), kThreads, 0, stream>>>(
      a, scale_of(a));
  TRIDENT_CUDA_LAUNCHED();
  attention_block_bwd_dq_kernel<<<warps_grid(long(a.B) * a.NH * a.Tq), kThreads, 0, stream>>>(
      a, scale_of(a));
  TRIDENT_CUDA_LAUNCHED();
}

void attention_block_delta_cuda(const AttentionBlockArgs& a, cudaStream_t stream) {
  check_args(a, "attention_block_delta");
  TRIDENT_CHECK(a.out && a.dout && a.delta, "attention_block_delta: null out, dout or delta");
  if (a.Tq == 0) return;
  attention_block_delta_kernel<<<warps_grid(long(a.B) * a.NH * a.Tq), kThreads, 0, stream>>>(a);
  TRIDENT_CUDA_LAUNCHED();
}

void attention_block_reset_cuda(const AttentionBlockArgs& a, cudaStream_t stream) {
  check_args(a, "attention_block_reset");
  TRIDENT_CHECK(a.lse, "attention_block_reset: null lse");
  const size_t n = size_t(a.B) * a.NH * a.Tq;
  if (n == 0) return;
  attention_block_reset_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(a);
  TRIDENT_CUDA_LAUNCHED();
}

}  // namespace trident::cuda
