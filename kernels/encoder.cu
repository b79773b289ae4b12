// Token + position embedding, forward and backward (CPU twin: src/backend/encoder.cpp).
//
// Note [Deterministic dwte]: a token can occur in many rows, so rows of dwte are not owned by
// one (b,t) and atomicAdd would make the sum's order (and its rounding) vary run to run.
// Instead, the block of row r first checks whether an earlier row holds the same token; if so it
// exits, and otherwise it owns that token's dwte row: it walks rows r..N-1 in order and adds
// every matching dout row, starting from the old dwte value. That is the CPU twin's order, so
// the result is deterministic (and matches the CPU's additions). Cost: every block scans up to
// N token ids (cheap, L2-resident); a token occurring k times costs its owner k row loads,
// overlapped kWteBatch at a time, so a very frequent token still makes one long block.
#include <cstdint>

#include "encoder.h"
#include "launch.cuh"

namespace trident::cuda {
namespace {

constexpr int kFwdBlock = 256;

// out[bt, c] = wte[tokens[bt], c] + wpe[bt % T, c]; one float4 per step when C % 4 == 0 and the
// pointers are aligned (then a float4 never straddles two rows).
__global__ void encoder_fwd_kernel(float* __restrict__ out, const int32_t* __restrict__ tokens,
                                   const float* __restrict__ wte, const float* __restrict__ wpe,
                                   int N, int T, int C, bool vec) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t start = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec) {
    const int C4 = C / 4;
    const size_t total4 = size_t(N) * C4;
    for (size_t i = start; i < total4; i += stride) {
      const int bt = int(i / C4), c4 = int(i % C4);
      const float4 a = reinterpret_cast<const float4*>(wte + size_t(tokens[bt]) * C)[c4];
      const float4 p = reinterpret_cast<const float4*>(wpe + size_t(bt % T) * C)[c4];
      reinterpret_cast<float4*>(out)[i] = make_float4(a.x + p.x, a.y + p.y, a.z + p.z, a.w + p.w);
    }
    return;
  }
  const size_t total = size_t(N) * C;
  for (size_t i = start; i < total; i += stride) {
    const int bt = int(i / C), c = int(i % C);
    out[i] = wte[size_t(tokens[bt]) * C + c] + wpe[size_t(bt % T) * C + c];
  }
}

// dwpe[t, c] += Σ_b dout[b, t, c], b in order: one thread per (t, c), coalesced over c.
__global__ void encoder_bwd_wpe_kernel(float* __restrict__ dwpe, const float* __restrict__ dout,
                                       int B, int T, int C) {
  const size_t total = size_t(T) * C;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    float acc = dwpe[i];
    for (int b = 0; b < B; ++b) acc += dout[size_t(b) * total + i];
    dwpe[i] = acc;
  }
}

constexpr int kWteBlock = 256;
constexpr int kWtePerThread = 4;                      // channels per thread
constexpr int kWteChunk = kWteBlock * kWtePerThread;  // channels per block (blockIdx.y)
constexpr int kWteWarps = kWteBlock / kWarp;
constexpr int kWteBatch = 4;  // matching rows whose loads are in flight together

// See Note [Deterministic dwte]. Grid: (N rows, channel chunks of kWteChunk).
__global__ void encoder_bwd_wte_kernel(float* __restrict__ dwte, const float* __restrict__ dout,
                                       const int32_t* __restrict__ tokens, int N, int C) {
  __shared__ int match_rows[kWteBlock];  // this chunk's matching rows, increasing
  __shared__ int warp_matches[kWteWarps];
  const int row = blockIdx.x;
  const int tok = tokens[row];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;

  // An earlier row with the same token owns the dwte row. The exit is block-uniform.
  for (int j0 = 0; j0 < row; j0 += kWteBlock) {
    const int j = j0 + threadIdx.x;
    if (__syncthreads_or(j < row && tokens[j] == tok)) return;
  }

  const int c0 = blockIdx.y * kWteChunk + threadIdx.x;
  float* w = dwte + size_t(tok) * C;
  float acc[kWtePerThread];
#pragma unroll
  for (int k = 0; k < kWtePerThread; ++k) {
    const int c = c0 + k * kWteBlock;
    acc[k] = c < C ? w[c] : 0.0f;
  }
  // Rows j >= row in chunks of kWteBlock: list the matches in increasing j (ballot, then each
  // match's rank among the block's matches), then add their dout rows in that order. The
  // batches only let several rows' loads overlap; the additions stay in row order.
  for (int j0 = row; j0 < N; j0 += kWteBlock) {
    const int j = j0 + threadIdx.x;
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
          const int c = c0 + k * kWteBlock;
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
    __syncthreads();  // match_rows and warp_matches are overwritten in the next chunk
  }
#pragma unroll
  for (int k = 0; k < kWtePerThread; ++k) {
    const int c = c0 + k * kWteBlock;
    if (c < C) w[c] = acc[k];
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void encoder_forward_cuda(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                          int B, int T, int C, cudaStream_t stream) {
  TRIDENT_CHECK(B >= 0 && T >= 0 && C >= 0, "encoder_forward_cuda: B={} T={} C={}", B, T, C);
  const int N = B * T;
  if (N == 0 || C == 0) return;
  TRIDENT_CHECK(out && tokens && wte && wpe, "{}: null pointer", __func__);
  const bool vec = C % 4 == 0 && aligned16(out) && aligned16(wte) && aligned16(wpe);
  const size_t work = vec ? size_t(N) * (C / 4) : size_t(N) * C;
  encoder_fwd_kernel<<<grid_for(work, kFwdBlock), kFwdBlock, 0, stream>>>(out, tokens, wte, wpe, N,
                                                                          T, C, vec);
  TRIDENT_CUDA_LAUNCHED();
}

void encoder_backward_cuda(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                           int B, int T, int C, cudaStream_t stream) {
  TRIDENT_CHECK(B >= 0 && T >= 0 && C >= 0, "encoder_backward_cuda: B={} T={} C={}", B, T, C);
  const int N = B * T;
  if (N == 0 || C == 0) return;
  TRIDENT_CHECK(dout, "{}: null dout", __func__);
  if (dwpe) {
    const size_t work = size_t(T) * C;
    encoder_bwd_wpe_kernel<<<grid_for(work, 256), 256, 0, stream>>>(dwpe, dout, B, T, C);
    TRIDENT_CUDA_LAUNCHED();
  }
  if (dwte) {
    TRIDENT_CHECK(tokens, "{}: null tokens", __func__);
    const dim3 grid(unsigned(N), ceil_div(size_t(C), kWteChunk));
    encoder_bwd_wte_kernel<<<grid, kWteBlock, 0, stream>>>(dwte, dout, tokens, N, C);
    TRIDENT_CUDA_LAUNCHED();
  }
}

}  // namespace trident::cuda
