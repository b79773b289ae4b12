// Shared by the .cu files only: deterministic block-wide reductions and the row split of the
// column-sum kernels (layernorm dw/db, bias gradient).
//
// Note [Deterministic GPU reductions]
// No float atomics. A block reduces lane values with warp_sum (a fixed butterfly), then the
// warps' results in warp order; sums over rows (weight gradients) are split into a fixed number
// of row chunks whose partial sums go to a scratch buffer, and a second kernel adds the chunks
// in chunk order. The split depends only on the sizes, so every run gives bitwise the same sums.
#pragma once

#include <cstddef>

#include "launch.cuh"

namespace trident::cuda {

// Sum of x over the block (any blockDim.x that is a multiple of 32, at most 1024). Every thread
// gets the result. Contains __syncthreads: call it from all threads of the block.
template <typename Real>
__device__ Real block_sum(Real x) {
  __shared__ Real warp_totals[32];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  x = warp_sum(x);
  __syncthreads();  // a previous call may still be reading warp_totals
  if (lane == 0) warp_totals[warp] = x;
  __syncthreads();
  Real total = lane < warps ? warp_totals[lane] : Real(0);
  return warp_sum(total);
}

__device__ __forceinline__ float block_max(float x) {
  __shared__ float warp_maxes[32];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) warp_maxes[warp] = x;
  __syncthreads();
  const float m = lane < warps ? warp_maxes[lane] : -__int_as_float(0x7f800000);
  return warp_max(m);
}

// Column sums over N rows are split into this many row chunks (fewer when N is small): enough
// blocks to fill an H200 even when the columns give only a few blocks.
inline int column_sum_row_chunks(int N) { return N < 128 ? (N > 0 ? N : 1) : 128; }

}  // namespace trident::cuda
