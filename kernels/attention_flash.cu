// Flash-style causal attention in fp32 (see attention_flash.h for the layout).
//
// Grouped-query attention (NH query heads, KVH key/value heads, query head h reading kv head
// h / (NH/KVH)): qkv rows are q | k | v of (NH + 2·KVH)·HS floats; with KVH = NH this is the
// [B,T,3C] multi-head layout.
//
// Every kernel works on square tiles of TILE queries × TILE keys of one (batch, head) pair,
// staged in shared memory; nothing of size T×T is stored. 256 threads per block, arranged as
// 16 × 16: thread (ty, tx) owns the RM = TILE/16 tile rows ty·RM + i and, of a score tile, the
// columns tx + 16·j (j < RM), of a [TILE, HS] accumulator the columns tx + 16·k (k < HS/16).
// Shared tiles have a row stride of HS+1 (TILE+1 for score tiles): the two row groups a warp
// touches then sit in different banks, and the 16 key rows a warp reads in a dot product too.
//
// Scores are kept in the log2 domain (s·log2e, exp2f), so the softmax costs one ex2 per entry;
// lse is converted back to the natural log for the caller.
//
// Backward, deterministic (no atomics, fixed summation order):
//   D_i = Σ_d dO_id·O_id                                  (attention_rowdot_kernel)
//   per key tile:   dV_j = Σ_i P_ij dO_i, dK_j = s·Σ_i dS_ij Q_i, looping over the query heads
//                   that read the kv head (in head order) and, per head, over query tiles
//   per query tile: dQ_i = s·Σ_j dS_ij K_j,               looping over key tiles
// with P_ij = exp(s·q_i·k_j − lse_i), dS_ij = P_ij (dO_i·v_j − D_i). Both passes recompute P
// and dS; that costs FLOPs but keeps each output written by exactly one thread.
#include <cmath>

#include "attention_flash.h"
#include "launch.cuh"

namespace trident::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int HS>
constexpr int tile_for() {
  return HS <= 64 ? 64 : 32;  // HS=128 with 64-row tiles would need ~200 KB of shared memory
}

// Rows row0.. of one [T, HS] slice (row stride `stride` floats) into a [TILE, HS+1] tile; rows
// at or past T become zeros so that padded rows contribute nothing.
template <int HS, int TILE>
__device__ void load_rows(float* tile, const float* src, size_t stride, int row0, int T) {
  constexpr int LD = HS + 1;
  for (int idx = threadIdx.x; idx < TILE * HS; idx += kThreads) {
    const int r = idx / HS, d = idx % HS;
    const int t = row0 + r;
    tile[r * LD + d] = t < T ? src[size_t(t) * stride + d] : 0.0f;
  }
}

// acc[i][j] = Σ_d A[ty·RM+i][d] · B[tx+16j][d] for two [TILE, HS+1] tiles.
template <int HS, int TILE>
__device__ void dot_tile(float (&acc)[TILE / 16][TILE / 16], const float* A, const float* B, int ty,
                         int tx) {
  constexpr int LD = HS + 1, RM = TILE / 16;
#pragma unroll
  for (int i = 0; i < RM; ++i)
#pragma unroll
    for (int j = 0; j < RM; ++j) acc[i][j] = 0.0f;
#pragma unroll 8
  for (int d = 0; d < HS; ++d) {
    float a[RM], b[RM];
#pragma unroll
    for (int i = 0; i < RM; ++i) a[i] = A[(ty * RM + i) * LD + d];
#pragma unroll
    for (int j = 0; j < RM; ++j) b[j] = B[(tx + 16 * j) * LD + d];
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
      for (int j = 0; j < RM; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
  }
}

template <int HS, int TILE>
constexpr size_t fwd_smem_floats() {
  return 3 * size_t(TILE) * (HS + 1) + size_t(TILE) * (TILE + 1) + 3 * TILE;
}

// grid (query tiles, B·NH); the last query tiles (most key tiles) are scheduled first.
template <int HS, int TILE>
__global__ void __launch_bounds__(kThreads)
    attention_fwd_kernel(float* out, float* lse, const float* qkv, int T, int NH, int KVH,
                         float scale_log2) {
  constexpr int LD = HS + 1, SLD = TILE + 1, RM = TILE / 16, CM = HS / 16;
  extern __shared__ float smem[];
  float* Qs = smem;
  float* Ks = Qs + TILE * LD;
  float* Vs = Ks + TILE * LD;
  float* Ss = Vs + TILE * LD;  // scores, then probabilities
  float* row_max = Ss + TILE * SLD;
  float* row_sum = row_max + TILE;
  float* row_rescale = row_sum + TILE;

  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  const int warp = tid / kWarp, lane = tid % kWarp;
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x);
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH, kv = h / (NH / KVH);
  const int q0 = qt * TILE;
  const size_t C = size_t(NH) * HS, stride = size_t(NH + 2 * KVH) * HS;
  const float* q_base = qkv + size_t(b) * T * stride + size_t(h) * HS;
  const float* k_base = qkv + size_t(b) * T * stride + size_t(NH + kv) * HS;
  const float* v_base = k_base + size_t(KVH) * HS;

  load_rows<HS, TILE>(Qs, q_base, stride, q0, T);
  if (tid < TILE) {
    row_max[tid] = -INFINITY;
    row_sum[tid] = 0.0f;
  }
  float acc[RM][CM];
#pragma unroll
  for (int i = 0; i < RM; ++i)
#pragma unroll
    for (int k = 0; k < CM; ++k) acc[i][k] = 0.0f;

  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * TILE;
    __syncthreads();  // the previous tile's Ks, Vs, Ss are no longer read
    load_rows<HS, TILE>(Ks, k_base, stride, k0, T);
    load_rows<HS, TILE>(Vs, v_base, stride, k0, T);
    __syncthreads();

    float s[RM][RM];
    dot_tile<HS, TILE>(s, Qs, Ks, ty, tx);
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
      for (int j = 0; j < RM; ++j) {
        const int r = ty * RM + i, c = tx + 16 * j;
        const int query = q0 + r, key = k0 + c;
        Ss[r * SLD + c] = (key <= query && key < T) ? s[i][j] * scale_log2 : -INFINITY;
      }
    __syncthreads();

    // Online softmax, one warp per row: new running max, rescale factor for what was summed
    // so far, and the tile's probabilities relative to the new max.
    for (int r = warp; r < TILE; r += kThreads / kWarp) {
      float mx = -INFINITY;
      for (int c = lane; c < TILE; c += kWarp) mx = fmaxf(mx, Ss[r * SLD + c]);
      mx = warp_max(mx);
      const float m_old = row_max[r];
      const float m_new = fmaxf(m_old, mx);
      const float m_ref = m_new == -INFINITY ? 0.0f : m_new;  // a fully masked row stays 0
      float sum = 0.0f;
      for (int c = lane; c < TILE; c += kWarp) {
        const float p = exp2f(Ss[r * SLD + c] - m_ref);
        Ss[r * SLD + c] = p;
        sum += p;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float rescale = exp2f(m_old - m_ref);
        row_rescale[r] = rescale;
        row_sum[r] = row_sum[r] * rescale + sum;
        row_max[r] = m_new;
      }
    }
    __syncthreads();

#pragma unroll
    for (int i = 0; i < RM; ++i) {
      const float rescale = row_rescale[ty * RM + i];
#pragma unroll
      for (int k = 0; k < CM; ++k) acc[i][k] *= rescale;
    }
#pragma unroll 4
    for (int c = 0; c < TILE; ++c) {
      float p[RM];
#pragma unroll
      for (int i = 0; i < RM; ++i) p[i] = Ss[(ty * RM + i) * SLD + c];
#pragma unroll
      for (int k = 0; k < CM; ++k) {
        const float v = Vs[c * LD + tx + 16 * k];
#pragma unroll
        for (int i = 0; i < RM; ++i) acc[i][k] = fmaf(p[i], v, acc[i][k]);
      }
    }
  }

  // row_max/row_sum were last written before the final __syncthreads above.
#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int r = ty * RM + i, query = q0 + r;
    if (query >= T) continue;
    const float inv = 1.0f / row_sum[r];
    float* o = out + (size_t(b) * T + query) * C + size_t(h) * HS;
#pragma unroll
    for (int k = 0; k < CM; ++k) o[tx + 16 * k] = acc[i][k] * inv;
  }
  if (tid < TILE && q0 + tid < T)
    lse[size_t(bh) * T + q0 + tid] = (row_max[tid] + log2f(row_sum[tid])) * kLn2;
}

// D[bh, t] = Σ_d dout·out over one head's row; one warp per row.
__global__ void attention_rowdot_kernel(float* D, const float* dout, const float* out, int B, int T,
                                        int C, int NH) {
  const int HS = C / NH;
  const size_t rows = size_t(B) * NH * T;
  const size_t warps = size_t(gridDim.x) * blockDim.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  for (size_t n = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; n < rows; n += warps) {
    const size_t bh = n / T, t = n % T, b = bh / NH, h = bh % NH;
    const size_t offset = (b * T + t) * C + h * HS;
    float sum = 0.0f;
    for (int d = lane; d < HS; d += kWarp) sum += dout[offset + d] * out[offset + d];
    sum = warp_sum(sum);
    if (lane == 0) D[n] = sum;
  }
}

template <int HS, int TILE>
constexpr size_t bwd_smem_floats() {
  return 4 * size_t(TILE) * (HS + 1) + 2 * size_t(TILE) * (TILE + 1) + 2 * TILE;
}

// Shared-memory layout of both backward kernels.
template <int HS, int TILE>
struct BwdTiles {
  float *Qs, *dOs, *Ks, *Vs, *Ps, *dSs, *lse2, *Drow;
  __device__ explicit BwdTiles(float* smem) {
    constexpr int LD = HS + 1, SLD = TILE + 1;
    Qs = smem;
    dOs = Qs + TILE * LD;
    Ks = dOs + TILE * LD;
    Vs = Ks + TILE * LD;
    Ps = Vs + TILE * LD;
    dSs = Ps + TILE * SLD;
    lse2 = dSs + TILE * SLD;  // lse·log2e per query row
    Drow = lse2 + TILE;
  }
};

// Query-side rows of tile q0: Q, dO, lse (log2 units) and D; padded rows get zeros.
template <int HS, int TILE>
__device__ void load_query_side(const BwdTiles<HS, TILE>& s, const float* q_base,
                                const float* do_base, const float* lse_bh, const float* D_bh,
                                int q0, int T, size_t stride, size_t C) {
  load_rows<HS, TILE>(s.Qs, q_base, stride, q0, T);
  load_rows<HS, TILE>(s.dOs, do_base, C, q0, T);
  if (threadIdx.x < TILE) {
    const int query = q0 + threadIdx.x;
    s.lse2[threadIdx.x] = query < T ? lse_bh[query] * kLog2e : 0.0f;
    s.Drow[threadIdx.x] = query < T ? D_bh[query] : 0.0f;
  }
}

// Ps[r][c] = P(query q0+r, key k0+c) and dSs[r][c] = P ⊙ (dP − D), zero where masked or padded.
template <int HS, int TILE>
__device__ void probs_and_dscores(const BwdTiles<HS, TILE>& s, int q0, int k0, int T,
                                  float scale_log2, int ty, int tx) {
  constexpr int RM = TILE / 16, SLD = TILE + 1;
  float sc[RM][RM], dp[RM][RM];
  dot_tile<HS, TILE>(sc, s.Qs, s.Ks, ty, tx);
  dot_tile<HS, TILE>(dp, s.dOs, s.Vs, ty, tx);
#pragma unroll
  for (int i = 0; i < RM; ++i)
#pragma unroll
    for (int j = 0; j < RM; ++j) {
      const int r = ty * RM + i, c = tx + 16 * j;
      const int query = q0 + r, key = k0 + c;
      const float p = (key <= query && query < T) ? exp2f(sc[i][j] * scale_log2 - s.lse2[r]) : 0.0f;
      s.Ps[r * SLD + c] = p;
      s.dSs[r * SLD + c] = p * (dp[i][j] - s.Drow[r]);
    }
}

// grid (key tiles, B·KVH); key tile kt of kv head kv visits, for each query head h of its group
// in order, query tiles kt..last (low kt = most work, first). The group's sum stays in registers:
// each dK, dV element is written once, by one thread, its terms added in a fixed order (heads
// outer, as Note [Shared kv head gradients] in src/backend/attention.cpp has it on the CPU).
template <int HS, int TILE>
__global__ void __launch_bounds__(kThreads)
    attention_bwd_dkdv_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                              const float* D, int T, int NH, int KVH, float scale,
                              float scale_log2) {
  constexpr int LD = HS + 1, SLD = TILE + 1, RM = TILE / 16, CM = HS / 16;
  extern __shared__ float smem[];
  const BwdTiles<HS, TILE> s(smem);
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  const int kt = blockIdx.x, n_tiles = gridDim.x;
  const int bkv = blockIdx.y, b = bkv / KVH, kv = bkv % KVH, group = NH / KVH;
  const int k0 = kt * TILE;
  const size_t C = size_t(NH) * HS, stride = size_t(NH + 2 * KVH) * HS;
  const float* k_base = qkv + size_t(b) * T * stride + size_t(NH + kv) * HS;
  const float* v_base = k_base + size_t(KVH) * HS;

  load_rows<HS, TILE>(s.Ks, k_base, stride, k0, T);
  load_rows<HS, TILE>(s.Vs, v_base, stride, k0, T);
  float dk[RM][CM], dv[RM][CM];  // rows: keys ty·RM+i
#pragma unroll
  for (int i = 0; i < RM; ++i)
#pragma unroll
    for (int k = 0; k < CM; ++k) dk[i][k] = dv[i][k] = 0.0f;

  for (int g = 0; g < group; ++g)
    for (int qt = kt; qt < n_tiles; ++qt) {
      const int h = kv * group + g, bh = b * NH + h;
      const float* q_base = qkv + size_t(b) * T * stride + size_t(h) * HS;
      const float* do_base = dout + size_t(b) * T * C + size_t(h) * HS;
      const int q0 = qt * TILE;
      __syncthreads();  // the previous query tile is no longer read
      load_query_side<HS, TILE>(s, q_base, do_base, lse + size_t(bh) * T, D + size_t(bh) * T, q0, T,
                                stride, C);
      __syncthreads();
      probs_and_dscores<HS, TILE>(s, q0, k0, T, scale_log2, ty, tx);
      __syncthreads();
#pragma unroll 4
      for (int r = 0; r < TILE; ++r) {  // r: query row of the tile
        float p[RM], ds[RM];
#pragma unroll
        for (int i = 0; i < RM; ++i) {
          p[i] = s.Ps[r * SLD + ty * RM + i];
          ds[i] = s.dSs[r * SLD + ty * RM + i];
        }
#pragma unroll
        for (int k = 0; k < CM; ++k) {
          const float dov = s.dOs[r * LD + tx + 16 * k], qv = s.Qs[r * LD + tx + 16 * k];
#pragma unroll
          for (int i = 0; i < RM; ++i) {
            dv[i][k] = fmaf(p[i], dov, dv[i][k]);
            dk[i][k] = fmaf(ds[i], qv, dk[i][k]);
          }
        }
      }
    }

#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int key = k0 + ty * RM + i;
    if (key >= T) continue;
    float* dk_row = dqkv + (size_t(b) * T + key) * stride + size_t(NH + kv) * HS;
    float* dv_row = dk_row + size_t(KVH) * HS;
#pragma unroll
    for (int k = 0; k < CM; ++k) {
      dk_row[tx + 16 * k] = dk[i][k] * scale;
      dv_row[tx + 16 * k] = dv[i][k];
    }
  }
}

// grid (query tiles, B·NH); query tile qt visits key tiles 0..qt (high qt first).
template <int HS, int TILE>
__global__ void __launch_bounds__(kThreads)
    attention_bwd_dq_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                            const float* D, int T, int NH, int KVH, float scale, float scale_log2) {
  constexpr int LD = HS + 1, SLD = TILE + 1, RM = TILE / 16, CM = HS / 16;
  extern __shared__ float smem[];
  const BwdTiles<HS, TILE> s(smem);
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x);
  const int bh = blockIdx.y, b = bh / NH, h = bh % NH, kv_head = h / (NH / KVH);
  const int q0 = qt * TILE;
  const size_t C = size_t(NH) * HS, stride = size_t(NH + 2 * KVH) * HS;
  const float* q_base = qkv + size_t(b) * T * stride + size_t(h) * HS;
  const float* k_base = qkv + size_t(b) * T * stride + size_t(NH + kv_head) * HS;
  const float* v_base = k_base + size_t(KVH) * HS;
  const float* do_base = dout + size_t(b) * T * C + size_t(h) * HS;

  load_query_side<HS, TILE>(s, q_base, do_base, lse + size_t(bh) * T, D + size_t(bh) * T, q0, T,
                            stride, C);
  float dq[RM][CM];  // rows: queries ty·RM+i
#pragma unroll
  for (int i = 0; i < RM; ++i)
#pragma unroll
    for (int k = 0; k < CM; ++k) dq[i][k] = 0.0f;

  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * TILE;
    __syncthreads();  // the previous key tile is no longer read
    load_rows<HS, TILE>(s.Ks, k_base, stride, k0, T);
    load_rows<HS, TILE>(s.Vs, v_base, stride, k0, T);
    __syncthreads();
    probs_and_dscores<HS, TILE>(s, q0, k0, T, scale_log2, ty, tx);
    __syncthreads();
#pragma unroll 4
    for (int c = 0; c < TILE; ++c) {  // c: key row of the tile
      float ds[RM];
#pragma unroll
      for (int i = 0; i < RM; ++i) ds[i] = s.dSs[(ty * RM + i) * SLD + c];
#pragma unroll
      for (int k = 0; k < CM; ++k) {
        const float kv = s.Ks[c * LD + tx + 16 * k];
#pragma unroll
        for (int i = 0; i < RM; ++i) dq[i][k] = fmaf(ds[i], kv, dq[i][k]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < RM; ++i) {
    const int query = q0 + ty * RM + i;
    if (query >= T) continue;
    float* row = dqkv + (size_t(b) * T + query) * stride + size_t(h) * HS;
#pragma unroll
    for (int k = 0; k < CM; ++k) row[tx + 16 * k] = dq[i][k] * scale;
  }
}

// The kernels need more than the default 48 KB of dynamic shared memory: allow_dynamic_smem
// (launch.cuh), once per instantiation (the statics below are per template instance).
template <int HS>
void forward_hs(float* out, float* lse, const float* qkv, int B, int T, int NH, int KVH,
                cudaStream_t stream) {
  constexpr int TILE = tile_for<HS>();
  const size_t smem = fwd_smem_floats<HS, TILE>() * sizeof(float);
  const float scale_log2 = kLog2e / std::sqrt(float(HS));
  static SmemOptIn allowed;
  allow_dynamic_smem(attention_fwd_kernel<HS, TILE>, smem, allowed);
  const dim3 grid(ceil_div(T, TILE), unsigned(B * NH));
  attention_fwd_kernel<HS, TILE>
      <<<grid, kThreads, smem, stream>>>(out, lse, qkv, T, NH, KVH, scale_log2);
  TRIDENT_CUDA_LAUNCHED();
}

template <int HS>
void backward_hs(float* dqkv, const float* D, const float* dout, const float* qkv, const float* lse,
                 int B, int T, int NH, int KVH, cudaStream_t stream) {
  constexpr int TILE = tile_for<HS>();
  const size_t smem = bwd_smem_floats<HS, TILE>() * sizeof(float);
  const float scale = 1.0f / std::sqrt(float(HS));
  const float scale_log2 = scale * kLog2e;
  static SmemOptIn allowed_dkdv, allowed_dq;
  allow_dynamic_smem(attention_bwd_dkdv_kernel<HS, TILE>, smem, allowed_dkdv);
  const dim3 kv_grid(ceil_div(T, TILE), unsigned(B * KVH));
  attention_bwd_dkdv_kernel<HS, TILE>
      <<<kv_grid, kThreads, smem, stream>>>(dqkv, dout, qkv, lse, D, T, NH, KVH, scale, scale_log2);
  TRIDENT_CUDA_LAUNCHED();
  allow_dynamic_smem(attention_bwd_dq_kernel<HS, TILE>, smem, allowed_dq);
  const dim3 q_grid(ceil_div(T, TILE), unsigned(B * NH));
  attention_bwd_dq_kernel<HS, TILE>
      <<<q_grid, kThreads, smem, stream>>>(dqkv, dout, qkv, lse, D, T, NH, KVH, scale, scale_log2);
  TRIDENT_CUDA_LAUNCHED();
}

void check_shape(int B, int T, int NH, int KVH, int HS) {
  TRIDENT_CHECK(B >= 0 && T >= 0 && NH > 0 && KVH > 0 && NH % KVH == 0 && HS > 0,
                "attention shape B={} T={} NH={} KVH={} HS={}", B, T, NH, KVH, HS);
  TRIDENT_CHECK(flash_attention_supported(HS), "flash attention has no kernel for HS={}", HS);
  TRIDENT_CHECK(size_t(B) * NH <= 65535, "B*NH = {} exceeds the grid's y dimension", B * NH);
}

}  // namespace

bool flash_attention_supported(int HS) { return HS == 32 || HS == 64 || HS == 128; }

void flash_attention_forward_gqa_cuda(float* out, float* lse, const float* qkv, int B, int T,
                                      int NH, int KVH, int HS, cudaStream_t stream) {
  check_shape(B, T, NH, KVH, HS);
  if (B == 0 || T == 0) return;
  switch (HS) {
    case 32: return forward_hs<32>(out, lse, qkv, B, T, NH, KVH, stream);
    case 64: return forward_hs<64>(out, lse, qkv, B, T, NH, KVH, stream);
    case 128: return forward_hs<128>(out, lse, qkv, B, T, NH, KVH, stream);
  }
}

void flash_attention_forward_cuda(float* out, float* lse, const float* qkv, int B, int T, int C,
                                  int NH, cudaStream_t stream) {
  TRIDENT_CHECK(NH > 0 && C % NH == 0, "attention shape C={} NH={}", C, NH);
  flash_attention_forward_gqa_cuda(out, lse, qkv, B, T, NH, NH, C / NH, stream);
}

size_t flash_attention_backward_scratch_floats(int B, int T, int C, int NH) {
  (void)C;
  return size_t(B) * NH * T;
}

void flash_attention_backward_gqa_cuda(float* dqkv, float* scratch, const float* dout,
                                       const float* qkv, const float* out, const float* lse, int B,
                                       int T, int NH, int KVH, int HS, cudaStream_t stream) {
  check_shape(B, T, NH, KVH, HS);
  if (B == 0 || T == 0) return;
  const size_t rows = size_t(B) * NH * T;
  const int block = 256;
  attention_rowdot_kernel<<<grid_for(rows * kWarp, block), block, 0, stream>>>(scratch, dout, out,
                                                                               B, T, NH * HS, NH);
  TRIDENT_CUDA_LAUNCHED();
  switch (HS) {
    case 32: return backward_hs<32>(dqkv, scratch, dout, qkv, lse, B, T, NH, KVH, stream);
    case 64: return backward_hs<64>(dqkv, scratch, dout, qkv, lse, B, T, NH, KVH, stream);
    case 128: return backward_hs<128>(dqkv, scratch, dout, qkv, lse, B, T, NH, KVH, stream);
  }
}

void flash_attention_backward_cuda(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                   const float* out, const float* lse, int B, int T, int C, int NH,
                                   cudaStream_t stream) {
  TRIDENT_CHECK(NH > 0 && C % NH == 0, "attention shape C={} NH={}", C, NH);
  flash_attention_backward_gqa_cuda(dqkv, scratch, dout, qkv, out, lse, B, T, NH, NH, C / NH,
                                    stream);
}

}  // namespace trident::cuda
