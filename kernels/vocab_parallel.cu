// The vocab-parallel embedding and loss (CPU twins: src/backend/vocab_parallel.cpp, Note
// [Vocab-parallel ops]). All five are deterministic: no atomics, every sum in a fixed order.
//
// Row-wise throughout: one block per token row (the rows are long: C up to 1600 channels, Vl up
// to ~50k logits), so a row's index is blockIdx.x and only the product row·width needs 64 bits.
// The softmax sums and the combine run in double, as the CPU does: they feed log S and every
// probability, and double keeps them within rounding of the twin whatever the logits' range.
// The fp64 cost is small next to reading the logits (an H200 has plenty of fp64 throughput).
#include <cstdint>

#include "reduce.cuh"
#include "vocab_parallel.h"

namespace trident::cuda {
namespace {

constexpr int kBlock = 256;

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

// out[n,:] = wte_slice row (when the token is on this rank) + wpe row (when given).
__global__ void embedding_slice_fwd_kernel(float* __restrict__ out,
                                           const int32_t* __restrict__ tokens,
                                           const float* __restrict__ wte_slice,
                                           const float* __restrict__ wpe, int v0, int v1, int T,
                                           int C) {
  const int n = blockIdx.x;
  const int tok = tokens[n];
  const float* e = (tok >= v0 && tok < v1) ? wte_slice + size_t(tok - v0) * C : nullptr;
  const float* p = wpe ? wpe + size_t(n % T) * C : nullptr;
  float* o = out + size_t(n) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = (e ? e[c] : 0.0f) + (p ? p[c] : 0.0f);
}

// dwpe[t, c] += Σ_b dout[b, t, c], b in order (the CPU's order): one thread per (t, c).
__global__ void slice_bwd_wpe_kernel(float* __restrict__ dwpe, const float* __restrict__ dout,
                                     int B, int T, int C) {
  const size_t total = size_t(T) * C;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    float acc = dwpe[i];
    for (int b = 0; b < B; ++b) acc += dout[size_t(b) * total + i];
    dwpe[i] = acc;
  }
}

constexpr int kWtePerThread = 4;                  // channels per thread
constexpr int kWteChunk = kBlock * kWtePerThread;  // channels per block (blockIdx.y)
constexpr int kWteWarps = kBlock / kWarp;
constexpr int kWteBatch = 4;  // matching rows loaded together before they are added in order

// Note [Deterministic dwte] (encoder.cu), restricted to this rank's tokens: the block of the
// first row holding a token of [v0, v1) owns that token's dwte_slice row and adds the dout rows
// of all its occurrences in row order, starting from the old value: the CPU twin's additions,
// in its order. Rows with a token off this rank, or a token seen earlier, exit at once.
// Grid: (N rows, channel chunks of kWteChunk).
__global__ void slice_bwd_wte_kernel(float* __restrict__ dwte_slice,
                                     const float* __restrict__ dout,
                                     const int32_t* __restrict__ tokens, int v0, int v1, int N,
                                     int C) {
  __shared__ int match_rows[kBlock];  // this chunk's matching rows, increasing
  __shared__ int warp_matches[kWteWarps];
  const int row = blockIdx.x;
  const int tok = tokens[row];
  if (tok < v0 || tok >= v1) return;  // block-uniform: every thread reads the same token
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;

  for (int j0 = 0; j0 < row; j0 += kBlock) {  // an earlier row owns it? (block-uniform exit)
    const int j = j0 + int(threadIdx.x);
    if (__syncthreads_or(j < row && tokens[j] == tok)) return;
  }

  const int c0 = blockIdx.y * kWteChunk + threadIdx.x;
  float* w = dwte_slice + size_t(tok - v0) * C;
  float acc[kWtePerThread];
#pragma unroll
  for (int k = 0; k < kWtePerThread; ++k) {
    const int c = c0 + k * kBlock;
    acc[k] = c < C ? w[c] : 0.0f;
  }
  for (int j0 = row; j0 < N; j0 += kBlock) {
    // Compact this chunk's matching rows into match_rows in increasing order: a match's slot is
    // the number of matches in earlier warps plus those in lower lanes of its own warp.
    const int j = j0 + int(threadIdx.x);
    const bool same = j < N && tokens[j] == tok;
    const unsigned bits = __ballot_sync(0xffffffffu, same);
    if (lane == 0) warp_matches[warp] = __popc(bits);
    __syncthreads();
    int before = 0, total = 0;
    for (int wi = 0; wi < kWteWarps; ++wi) {
      before += wi < warp ? warp_matches[wi] : 0;
      total += warp_matches[wi];
    }
    if (same) match_rows[before + __popc(bits & ((1u << lane) - 1u))] = j;
    __syncthreads();
    for (int i = 0; i < total; i += kWteBatch) {
      float x[kWteBatch][kWtePerThread];
#pragma unroll
      for (int r = 0; r < kWteBatch; ++r) {
        const bool have = i + r < total;
        const float* d = dout + size_t(have ? match_rows[i + r] : 0) * C;
#pragma unroll
        for (int k = 0; k < kWtePerThread; ++k) {
          const int c = c0 + k * kBlock;
          x[r][k] = have && c < C ? d[c] : 0.0f;
        }
      }
#pragma unroll
      for (int r = 0; r < kWteBatch; ++r) {
        if (i + r < total) {
#pragma unroll
          for (int k = 0; k < kWtePerThread; ++k) acc[k] += x[r][k];
        }
      }
    }
    __syncthreads();  // match_rows and warp_matches are rewritten by the next chunk
  }
#pragma unroll
  for (int k = 0; k < kWtePerThread; ++k) {
    const int c = c0 + k * kBlock;
    if (c < C) w[c] = acc[k];
  }
}

// stats[n] = (max_j<live x, Σ_j<live exp(x - max) in double, x[target - v0] or 0).
// live == 0 gives (-inf, 0, 0): block_max of nothing is -inf, the sum has no terms.
__global__ void crossentropy_slice_stats_kernel(float* __restrict__ stats,
                                                const float* __restrict__ logits,
                                                const int32_t* __restrict__ targets, int v0,
                                                int live, int Vl) {
  const int n = blockIdx.x;
  const float* x = logits + size_t(n) * Vl;
  float m = neg_inf();
  for (int j = threadIdx.x; j < live; j += blockDim.x) m = fmaxf(m, x[j]);
  m = block_max(m);
  double s = 0.0;
  for (int j = threadIdx.x; j < live; j += blockDim.x) s += exp(double(x[j]) - double(m));
  s = block_sum<double>(s);
  if (threadIdx.x == 0) {
    const int tj = targets[n] - v0;
    stats[3 * size_t(n)] = m;
    stats[3 * size_t(n) + 1] = float(s);
    stats[3 * size_t(n) + 2] = (tj >= 0 && tj < live) ? x[tj] : 0.0f;
  }
}

// Every thread folds the tp ranks' stats itself (tp is small; the reads are broadcasts), in rank
// order as the CPU does, so all threads hold the same M and S without a shared-memory exchange.
__global__ void crossentropy_slice_combine_kernel(float* __restrict__ losses,
                                                  float* __restrict__ x_to_p,
                                                  const float* __restrict__ all_stats, int tp,
                                                  int live, int N, int Vl) {
  const int n = blockIdx.x;
  float M = neg_inf();
  for (int r = 0; r < tp; ++r) {
    const float q0 = all_stats[(size_t(r) * N + n) * 3];
    M = M < q0 ? q0 : M;  // std::max(M, q0)
  }
  double S = 0.0, target_logit = 0.0;
  for (int r = 0; r < tp; ++r) {
    const float* q = all_stats + (size_t(r) * N + n) * 3;
    // A rank holding only padding has max -inf: skipped (its 0·exp(-inf - M) could be NaN).
    if (q[0] != neg_inf()) S += double(q[1]) * exp(double(q[0]) - double(M));
    target_logit += q[2];
  }
  if (threadIdx.x == 0) losses[n] = float(log(S) + double(M) - target_logit);
  float* x = x_to_p + size_t(n) * Vl;
  for (int j = threadIdx.x; j < Vl; j += blockDim.x)
    x[j] = j < live ? float(exp(double(x[j]) - double(M)) / S) : 0.0f;
}

// probs *= dloss, then -dloss at the target column when it is on this rank. __fmul_rn keeps
// the product from being fused with the subtraction (the CPU rounds the product first).
__global__ void crossentropy_slice_bwd_kernel(float* __restrict__ probs,
                                              const int32_t* __restrict__ targets, float dloss,
                                              int v0, int Vl) {
  const int n = blockIdx.x;
  float* p = probs + size_t(n) * Vl;
  const int tj = targets[n] - v0;  // may be outside [0, Vl): then no column matches
  for (int j = threadIdx.x; j < Vl; j += blockDim.x) {
    float g = __fmul_rn(p[j], dloss);
    if (j == tj) g -= dloss;
    p[j] = g;
  }
}

}  // namespace

void embedding_slice_forward_cuda(float* out, const int32_t* tokens, const float* wte_slice,
                                  const float* wpe, int v0, int v1, int B, int T, int C,
                                  cudaStream_t stream) {
  TRIDENT_CHECK(B >= 0 && T >= 0 && C >= 0, "{}: B={} T={} C={}", __func__, B, T, C);
  const int N = B * T;
  if (N == 0 || C == 0) return;
  TRIDENT_CHECK(out && tokens && (wte_slice || v1 <= v0), "{}: null pointer", __func__);
  embedding_slice_fwd_kernel<<<unsigned(N), kBlock, 0, stream>>>(out, tokens, wte_slice, wpe, v0,
                                                                 v1, T, C);
  TRIDENT_CUDA_LAUNCHED();
}

void embedding_slice_backward_cuda(float* dwte_slice, float* dwpe, const float* dout,
                                   const int32_t* tokens, int v0, int v1, int B, int T, int C,
                                   cudaStream_t stream) {
  TRIDENT_CHECK(B >= 0 && T >= 0 && C >= 0, "{}: B={} T={} C={}", __func__, B, T, C);
  const int N = B * T;
  if (N == 0 || C == 0) return;
  TRIDENT_CHECK(dout, "{}: null dout", __func__);
  if (dwpe) {
    const size_t work = size_t(T) * C;
    slice_bwd_wpe_kernel<<<grid_for(work, kBlock), kBlock, 0, stream>>>(dwpe, dout, B, T, C);
    TRIDENT_CUDA_LAUNCHED();
  }
  if (dwte_slice && v1 > v0) {
    TRIDENT_CHECK(tokens, "{}: null tokens", __func__);
    const dim3 grid(unsigned(N), ceil_div(size_t(C), kWteChunk));
    slice_bwd_wte_kernel<<<grid, kBlock, 0, stream>>>(dwte_slice, dout, tokens, v0, v1, N, C);
    TRIDENT_CUDA_LAUNCHED();
  }
}

void crossentropy_slice_stats_cuda(float* stats, const float* logits, const int32_t* targets,
                                   int v0, int live, int N, int Vl, cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && live >= 0 && live <= Vl, "{}: N={} live={} Vl={}", __func__, N, live,
                Vl);
  if (N == 0) return;
  TRIDENT_CHECK(stats && targets && (logits || Vl == 0), "{}: null pointer", __func__);
  crossentropy_slice_stats_kernel<<<unsigned(N), kBlock, 0, stream>>>(stats, logits, targets, v0,
                                                                      live, Vl);
  TRIDENT_CUDA_LAUNCHED();
}

void crossentropy_slice_combine_cuda(float* losses, float* logits_to_probs,
                                     const float* all_stats, int tp, int live, int N, int Vl,
                                     cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && tp >= 1 && live >= 0 && live <= Vl,
                "{}: N={} tp={} live={} Vl={}", __func__, N, tp, live, Vl);
  if (N == 0) return;
  TRIDENT_CHECK(losses && all_stats && (logits_to_probs || Vl == 0), "{}: null pointer",
                __func__);
  crossentropy_slice_combine_kernel<<<unsigned(N), kBlock, 0, stream>>>(
      losses, logits_to_probs, all_stats, tp, live, N, Vl);
  TRIDENT_CUDA_LAUNCHED();
}

void crossentropy_slice_backward_cuda(float* probs_to_dlogits, const int32_t* targets,
                                      float dloss, int v0, int N, int Vl, cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && Vl >= 0, "{}: N={} Vl={}", __func__, N, Vl);
  if (N == 0 || Vl == 0) return;
  TRIDENT_CHECK(probs_to_dlogits && targets, "{}: null pointer", __func__);
  crossentropy_slice_bwd_kernel<<<unsigned(N), kBlock, 0, stream>>>(probs_to_dlogits, targets,
                                                                    dloss, v0, Vl);
  TRIDENT_CUDA_LAUNCHED();
}

}  // namespace trident::cuda
