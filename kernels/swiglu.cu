// SwiGLU (CPU twin: src/backend/swiglu.cpp): out = silu(gate)·up, one thread per output
// element (n, f) in a grid-stride loop. The derivative and its overflow handling are the CPU
// twin's: σ(g) = 1/(1 + e), 1 − σ(g) = 1/(1 + 1/e) with e = exp(−g), so neither 0·inf nor a
// cancelling 1 − σ appears for large |g|. On bf16 the same kernels widen on load and round each
// output once (Note [bf16 activations]).
#include "launch.cuh"
#include "swiglu.h"

namespace trident::cuda {
namespace {

constexpr int kBlock = 256;

template <typename T>
__global__ void swiglu_fwd_kernel(T* __restrict__ out, const T* __restrict__ inp, int N, int F) {
  const size_t total = size_t(N) * F;
  for (size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const size_t n = idx / F, f = idx % F;
    const float g = load(inp + n * 2 * F + f), up = load(inp + n * 2 * F + F + f);
    store(out + idx, g * up / (1.0f + expf(-g)));
  }
}

template <typename T>
__global__ void swiglu_bwd_kernel(T* __restrict__ dinp, const T* __restrict__ inp,
                                  const T* __restrict__ dout, int N, int F) {
  const size_t total = size_t(N) * F;
  for (size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const size_t n = idx / F, f = idx % F;
    const size_t gate_at = n * 2 * F + f, up_at = gate_at + F;
    const float g = load(inp + gate_at), up = load(inp + up_at), d = load(dout + idx);
    const float e = expf(-g);
    const float s = 1.0f / (1.0f + e);
    const float one_minus_s = 1.0f / (1.0f + 1.0f / e);
    store(dinp + gate_at, d * up * s * (1.0f + g * one_minus_s));
    store(dinp + up_at, d * g * s);
  }
}

template <typename T>
void swiglu_forward(const char* name, T* out, const T* inp, int N, int F, cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && F > 0, "{}: N={} F={}", name, N, F);
  const size_t total = size_t(N) * F;
  if (total == 0) return;
  TRIDENT_CHECK(out && inp, "{}: null pointer", name);
  swiglu_fwd_kernel<T><<<grid_for(total, kBlock), kBlock, 0, stream>>>(out, inp, N, F);
  TRIDENT_CUDA_LAUNCHED();
}

template <typename T>
void swiglu_backward(const char* name, T* dinp, const T* inp, const T* dout, int N, int F,
                     cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && F > 0, "{}: N={} F={}", name, N, F);
  const size_t total = size_t(N) * F;
  if (total == 0) return;
  TRIDENT_CHECK(dinp && inp && dout, "{}: null pointer", name);
  swiglu_bwd_kernel<T><<<grid_for(total, kBlock), kBlock, 0, stream>>>(dinp, inp, dout, N, F);
  TRIDENT_CUDA_LAUNCHED();
}

}  // namespace

void swiglu_forward_cuda(float* out, const float* inp, int N, int F, cudaStream_t stream) {
  swiglu_forward(__func__, out, inp, N, F, stream);
}

void swiglu_backward_cuda(float* dinp, const float* inp, const float* dout, int N, int F,
                          cudaStream_t stream) {
  swiglu_backward(__func__, dinp, inp, dout, N, F, stream);
}

void swiglu_forward_bf16_cuda(bf16* out, const bf16* inp, int N, int F, cudaStream_t stream) {
  swiglu_forward(__func__, out, inp, N, F, stream);
}

void swiglu_backward_bf16_cuda(bf16* dinp, const bf16* inp, const bf16* dout, int N, int F,
                               cudaStream_t stream) {
  swiglu_backward(__func__, dinp, inp, dout, N, F, stream);
}

}  // namespace trident::cuda
