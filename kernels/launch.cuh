// Shared by the .cu files only: launch-size helpers and small device utilities.
#pragma once

#include <atomic>
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

// Dynamic shared memory above the default 48 KB needs an opt-in per kernel
// (cudaFuncSetAttribute), which stays set: one driver call per kernel and size, not per launch.
// `allowed` (a static at the call site) holds the largest size opted in so far; two threads
// racing both set it, which is harmless. trident runs one device per process.
template <typename Kernel>
void allow_dynamic_smem(Kernel kernel, size_t bytes, std::atomic<size_t>& allowed) {
  if (bytes <= allowed.load(std::memory_order_acquire)) return;
  TRIDENT_CUDA(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  allowed.store(bytes, std::memory_order_release);
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
