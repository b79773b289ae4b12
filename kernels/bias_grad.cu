// Bias gradient of a linear layer: dbias[OC] += Σ_n dout[n, oc] (CPU twin: the dbias part of
// src/backend/matmul.cpp). Deterministic (Note [Deterministic GPU reductions] in
// kernels/reduce.cuh): partial column sums per chunk of rows into `scratch`, then the chunks
// added in order.
#include "bias_grad.h"
#include "reduce.cuh"

namespace trident::cuda {
namespace {

constexpr int kBlock = 256;
constexpr int kUnroll = 4;  // independent row loads in flight per thread

__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(bf16 x) { return __bfloat162float(x); }

// One thread per column, the rows of chunk blockIdx.y in order; coalesced over columns. Dout is
// float or bf16 (widened exactly; the sums are fp32 either way).
template <typename Dout>
__global__ void bias_bwd_partial_kernel(float* __restrict__ partial, const Dout* __restrict__ dout,
                                        int N, int OC, int rows_per_chunk) {
  const int oc = blockIdx.x * blockDim.x + threadIdx.x;
  if (oc >= OC) return;
  const int chunk = blockIdx.y;
  const int n0 = chunk * rows_per_chunk;
  const int n1 = min(N, n0 + rows_per_chunk);
  const Dout* col = dout + oc;
  float sum = 0.0f;
  int n = n0;
  for (; n + kUnroll <= n1; n += kUnroll) {
    float x[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) x[k] = widen(col[size_t(n + k) * OC]);
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) sum += x[k];
  }
  for (; n < n1; ++n) sum += widen(col[size_t(n) * OC]);
  partial[size_t(chunk) * OC + oc] = sum;
}

__global__ void bias_bwd_finish_kernel(float* __restrict__ dbias, const float* __restrict__ partial,
                                       int chunks, int OC) {
  const int oc = blockIdx.x * blockDim.x + threadIdx.x;
  if (oc >= OC) return;
  float sum = 0.0f;
  for (int k = 0; k < chunks; ++k) sum += partial[size_t(k) * OC + oc];
  dbias[oc] += sum;
}

template <typename Dout>
void bias_backward(float* dbias, float* scratch, const Dout* dout, int N, int OC,
                   cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && OC >= 0, "bias_backward_cuda: N={} OC={}", N, OC);
  if (N == 0 || OC == 0) return;
  TRIDENT_CHECK(dbias && scratch && dout, "{}: null pointer", __func__);
  const int chunks = column_sum_row_chunks(N);
  const int rows_per_chunk = int(ceil_div(size_t(N), size_t(chunks)));
  const dim3 grid(ceil_div(size_t(OC), kBlock), unsigned(chunks));
  bias_bwd_partial_kernel<Dout><<<grid, kBlock, 0, stream>>>(scratch, dout, N, OC, rows_per_chunk);
  TRIDENT_CUDA_LAUNCHED();
  bias_bwd_finish_kernel<<<ceil_div(size_t(OC), kBlock), kBlock, 0, stream>>>(dbias, scratch,
                                                                              chunks, OC);
  TRIDENT_CUDA_LAUNCHED();
}

}  // namespace

size_t bias_backward_scratch_floats(int N, int OC) {
  return size_t(column_sum_row_chunks(N)) * size_t(OC > 0 ? OC : 0);
}

void bias_backward_cuda(float* dbias, float* scratch, const float* dout, int N, int OC,
                        cudaStream_t stream) {
  bias_backward(dbias, scratch, dout, N, OC, stream);
}

void bias_backward_bf16_cuda(float* dbias, float* scratch, const bf16* dout, int N, int OC,
                             cudaStream_t stream) {
  bias_backward(dbias, scratch, dout, N, OC, stream);
}

}  // namespace trident::cuda
