// Shared by the .cu files only: launch-size helpers and small device utilities.
#pragma once

#include <cstddef>

#include "cuda_check.h"

namespace trident::cuda {

constexpr int kWarp = 32;

inline unsigned ceil_div(size_t n, size_t d) { return unsigned((n + d - 1) / d); }

// Grid size for a grid-stride loop over n elements: enough blocks to fill the GPU a few times
// over, never more than there is work for.
inline unsigned grid_for(size_t n, int block, unsigned max_blocks = 132 * 16) {
  const unsigned need = ceil_div(n, size_t(block));
  return need < max_blocks ? (need > 0 ? need : 1) : max_blocks;
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = kWarp / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ double warp_sum(double x) {
  for (int o = kWarp / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int o = kWarp / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

}  // namespace trident::cuda
