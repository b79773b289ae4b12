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

// Dynamic shared memory above the default 48 KB needs an opt-in per kernel and per device
// (cudaFuncSetAttribute), which stays set: one driver call per kernel, size and device, not per
// launch. `allowed` (a static at the call site) holds the largest size opted in so far on each
// device (a process drives two in the two-GPU tests); two threads racing both set it, harmless.
struct SmemOptIn {
  static constexpr int kDevices = 16;  // beyond this, every launch above 48 KB opts in again
  std::atomic<size_t> bytes[kDevices] = {};
};

template <typename Kernel>
void allow_dynamic_smem(Kernel kernel, size_t bytes, SmemOptIn& allowed) {
  int device = 0;
  TRIDENT_CUDA(cudaGetDevice(&device));
  std::atomic<size_t>* seen = device < SmemOptIn::kDevices ? &allowed.bytes[device] : nullptr;
  if (seen && bytes <= seen->load(std::memory_order_acquire)) return;
  TRIDENT_CUDA(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  if (seen) seen->store(bytes, std::memory_order_release);
}

// An activation element as fp32 arithmetic sees it: fp32 as is, bf16 widened on load and rounded
// once on store, to nearest even (Note [bf16 activations]). The kernels that take either are
// templates over these.
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(bf16* p, float v) { *p = __float2bfloat16(v); }
__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const bf16* p) { return __bfloat162float(*p); }

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
