// SwiGLU (CPU twin: src/backend/swiglu.cpp): out = silu(gate)·up, one thread per output
// element (n, f) in a grid-stride loop. The derivative and its overflow handling are the CPU
// twin's: σ(g) = 1/(1 + e), 1 − σ(g) = 1/(1 + 1/e) with e = exp(−g), so neither 0·inf nor a
// cancelling 1 − σ appears for large |g|.
#include "launch.cuh"
#include "swiglu.h"

namespace trident::cuda {
namespace {

constexpr int kBlock = 256;

__global__ void swiglu_fwd_kernel(float* __restrict__ out, const float* __restrict__ inp, int N,
                                  int F) {
  const size_t total = size_t(N) * F;
  for (size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const size_t n = idx / F, f = idx % F;
    const float g = inp[n * 2 * F + f], up = inp[n * 2 * F + F + f];
    out[idx] = g * up / (1.0f + expf(-g));
  }
}

__global__ void swiglu_bwd_kernel(float* __restrict__ dinp, const float* __restrict__ inp,
                                  const float* __restrict__ dout, int N, int F) {
  const size_t total = size_t(N) * F;
  for (size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const size_t n = idx / F, f = idx % F;
    const size_t gate_at = n * 2 * F + f, up_at = gate_at + F;
    const float g = inp[gate_at], up = inp[up_at], d = dout[idx];
    const float e = expf(-g);
    const float s = 1.0f / (1.0f + e);
    const float one_minus_s = 1.0f / (1.0f + 1.0f / e);
    dinp[gate_at] = d * up * s * (1.0f + g * one_minus_s);
    dinp[up_at] = d * g * s;
  }
}

}  // namespace

void swiglu_forward_cuda(float* out, const float* inp, int N, int F, cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && F > 0, "swiglu_forward_cuda: N={} F={}", N, F);
  const size_t total = size_t(N) * F;
  if (total == 0) return;
  TRIDENT_CHECK(out && inp, "{}: null pointer", __func__);
  swiglu_fwd_kernel<<<grid_for(total, kBlock), kBlock, 0, stream>>>(out, inp, N, F);
  TRIDENT_CUDA_LAUNCHED();
}

void swiglu_backward_cuda(float* dinp, const float* inp, const float* dout, int N, int F,
                          cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && F > 0, "swiglu_backward_cuda: N={} F={}", N, F);
  const size_t total = size_t(N) * F;
  if (total == 0) return;
  TRIDENT_CHECK(dinp && inp && dout, "{}: null pointer", __func__);
  swiglu_bwd_kernel<<<grid_for(total, kBlock), kBlock, 0, stream>>>(dinp, inp, dout, N, F);
  TRIDENT_CUDA_LAUNCHED();
}

}  // namespace trident::cuda
