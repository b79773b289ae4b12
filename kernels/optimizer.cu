// Optimizer-side ops over the flat buffers: AdamW and Σx² (CPU twins: src/backend/optimizer.cpp).
// Both are memory-bound single passes: float4 grid-stride loops when every pointer is aligned
// (slices of the flat buffers need not be), scalar otherwise.
#include <cmath>
#include <cstdint>

#include "optimizer.h"
#include "reduce.cuh"
#include "trident/backend.h"

namespace trident::cuda {
namespace {

constexpr int kBlock = 256;

struct AdamWCoefficients {
  float lr, beta1, beta2, eps, weight_decay, inv_bias1, inv_bias2, grad_scale;
};

// The CPU twin's formula, element by element.
__device__ __forceinline__ void adamw_step(float& p, float& m, float& v, float g_raw,
                                           const AdamWCoefficients& c) {
  const float g = __fmul_rn(g_raw, c.grad_scale);  // never contracted into the FMAs below
  m = c.beta1 * m + (1.0f - c.beta1) * g;
  v = c.beta2 * v + (1.0f - c.beta2) * (g * g);
  p -= c.lr * ((m * c.inv_bias1) / (sqrtf(v * c.inv_bias2) + c.eps) + c.weight_decay * p);
}

__global__ void adamw_update_kernel(float* __restrict__ params, float* __restrict__ m,
                                    float* __restrict__ v, const float* __restrict__ grads,
                                    bf16* __restrict__ params_bf16, size_t n, AdamWCoefficients c,
                                    bool vec) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t start = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t n4 = vec ? n / 4 : 0;
  for (size_t i = start; i < n4; i += stride) {
    float4 p4 = reinterpret_cast<float4*>(params)[i];
    float4 m4 = reinterpret_cast<float4*>(m)[i];
    float4 v4 = reinterpret_cast<float4*>(v)[i];
    const float4 g4 = reinterpret_cast<const float4*>(grads)[i];
    adamw_step(p4.x, m4.x, v4.x, g4.x, c);
    adamw_step(p4.y, m4.y, v4.y, g4.y, c);
    adamw_step(p4.z, m4.z, v4.z, g4.z, c);
    adamw_step(p4.w, m4.w, v4.w, g4.w, c);
    reinterpret_cast<float4*>(params)[i] = p4;
    reinterpret_cast<float4*>(m)[i] = m4;
    reinterpret_cast<float4*>(v)[i] = v4;
    if (params_bf16) {
      __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(params_bf16) + 2 * i;
      o[0] = __floats2bfloat162_rn(p4.x, p4.y);
      o[1] = __floats2bfloat162_rn(p4.z, p4.w);
    }
  }
  for (size_t i = 4 * n4 + start; i < n; i += stride) {
    float p = params[i], mi = m[i], vi = v[i];
    adamw_step(p, mi, vi, grads[i], c);
    params[i] = p;
    m[i] = mi;
    v[i] = vi;
    if (params_bf16) params_bf16[i] = __float2bfloat16(p);
  }
}

// The grid size is a function of n (and alignment) only, so the partials, and their sum, are
// the same on every run. Squares of a float4 are added in float (4 terms), then in double.
__global__ void sum_squares_partial_kernel(double* __restrict__ partial,
                                           const float* __restrict__ x, size_t n, bool vec) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t start = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t n4 = vec ? n / 4 : 0;
  double acc = 0.0;
  for (size_t i = start; i < n4; i += stride) {
    const float4 a = reinterpret_cast<const float4*>(x)[i];
    acc += double(a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w);
  }
  for (size_t i = 4 * n4 + start; i < n; i += stride) acc += double(x[i]) * double(x[i]);
  const double total = block_sum<double>(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

__global__ void sum_squares_finish_kernel(double* __restrict__ result,
                                          const double* __restrict__ partial, int blocks) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < blocks; i += blockDim.x) acc += partial[i];
  const double total = block_sum<double>(acc);
  if (threadIdx.x == 0) *result = total;
}

// One block: a micro-batch has at most a few ten thousand losses, and this runs once per
// micro-batch, so one block's strided loop costs microseconds and needs no second pass.
__global__ void add_mean_kernel(double* __restrict__ acc, const float* __restrict__ x, size_t n) {
  double sum = 0.0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) sum += double(x[i]);
  const double total = block_sum<double>(sum);
  if (threadIdx.x == 0) *acc += double(float(total / double(n)));  // as forward() rounds it
}

constexpr unsigned kSumSquaresMaxBlocks = 1024;

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

void adamw_update_cuda(float* params, float* m, float* v, const float* grads, size_t n, float lr,
                       float beta1, float beta2, float eps, float weight_decay, int t,
                       float grad_scale, bf16* params_bf16, cudaStream_t stream) {
  TRIDENT_CHECK(t >= 1, "adamw_update_cuda: step t={} must be >= 1", t);
  if (n == 0) return;
  TRIDENT_CHECK(params && m && v && grads, "{}: null pointer", __func__);
  // Bias corrections in double on the host, as in the CPU twin.
  const AdamWCoefficients c{lr,
                            beta1,
                            beta2,
                            eps,
                            weight_decay,
                            float(adamw_bias_correction(beta1, t)),
                            float(adamw_bias_correction(beta2, t)),
                            grad_scale};
  const bool vec = aligned(params, 16) && aligned(m, 16) && aligned(v, 16) && aligned(grads, 16) &&
                   (!params_bf16 || aligned(params_bf16, 8));
  const unsigned grid = grid_for(vec ? (n + 3) / 4 : n, kBlock);
  adamw_update_kernel<<<grid, kBlock, 0, stream>>>(params, m, v, grads, params_bf16, n, c, vec);
  TRIDENT_CUDA_LAUNCHED();
}

void add_mean_cuda(double* acc, const float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  TRIDENT_CHECK(acc && x, "{}: null pointer", __func__);
  add_mean_kernel<<<1, kBlock, 0, stream>>>(acc, x, n);
  TRIDENT_CUDA_LAUNCHED();
}

size_t sum_squares_scratch_doubles() { return kSumSquaresMaxBlocks; }

void sum_squares_cuda(double* result, double* scratch, const float* x, size_t n,
                      cudaStream_t stream) {
  TRIDENT_CHECK(result && scratch && (x || n == 0), "{}: null pointer", __func__);
  const bool vec = aligned(x, 16);
  // n == 0 still launches one block, which writes 0.
  const unsigned blocks = grid_for(vec ? (n + 3) / 4 : n, kBlock, kSumSquaresMaxBlocks);
  sum_squares_partial_kernel<<<blocks, kBlock, 0, stream>>>(scratch, x, n, vec);
  TRIDENT_CUDA_LAUNCHED();
  sum_squares_finish_kernel<<<1, kBlock, 0, stream>>>(result, scratch, int(blocks));
  TRIDENT_CUDA_LAUNCHED();
}

}  // namespace trident::cuda
