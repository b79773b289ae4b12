// The model families' bf16 kernels (families_bf16.h): the fp32 kernels' arithmetic
// (rmsnorm.cu, rope.cu, swiglu.cu, elementwise.cu's exact GELU) on bf16 values widened on load,
// each bf16 output rounded once on store (__float2bfloat16: to nearest even, as the CPU twin's
// to_bfloat16). Scalar grid-stride loops: memory-bound and simple; the fp32 kernels stay as
// they are. RMSNorm's layout is rmsnorm.cu's: one warp per row, dw by row-chunk partial sums
// summed in a fixed order (Note [Deterministic GPU reductions] in kernels/reduce.cuh).
#include "families_bf16.h"
#include "reduce.cuh"
#include "rmsnorm.h"

namespace trident::cuda {
namespace {

constexpr int kBlock = 256;
constexpr int kRowsPerBlock = 4;  // RMSNorm: warps per block, one row each
constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

__device__ __forceinline__ float wide(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ bf16 narrow(float x) { return __float2bfloat16(x); }

__global__ void rmsnorm_fwd_bf16_kernel(bf16* __restrict__ out, float* __restrict__ rstd,
                                        const float* __restrict__ inp, const float* __restrict__ w,
                                        int N, int C, float eps) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int n = blockIdx.x * kRowsPerBlock + warp;
  if (n >= N) return;  // warp-uniform
  const float* x = inp + size_t(n) * C;
  float sq = 0.0f;
  for (int c = lane; c < C; c += kWarp) sq += x[c] * x[c];
  const float rs = rsqrtf(warp_sum(sq) / float(C) + eps);
  bf16* o = out + size_t(n) * C;
  for (int c = lane; c < C; c += kWarp) o[c] = narrow(x[c] * rs * w[c]);
  if (lane == 0) rstd[n] = rs;
}

// dres += rstd · (g − x̂ · mean(g·x̂)), g = dout·w, x̂ = x·rstd; then dres16 = bf16(dres).
__global__ void rmsnorm_bwd_add_bf16_kernel(float* __restrict__ dres, bf16* __restrict__ dres16,
                                            const bf16* __restrict__ dout,
                                            const float* __restrict__ inp,
                                            const float* __restrict__ w,
                                            const float* __restrict__ rstd, int N, int C) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int n = blockIdx.x * kRowsPerBlock + warp;
  if (n >= N) return;
  const float* x = inp + size_t(n) * C;
  const bf16* d = dout + size_t(n) * C;
  const float rs = rstd[n];
  float gx_sum = 0.0f;
  for (int c = lane; c < C; c += kWarp) gx_sum += wide(d[c]) * w[c] * (x[c] * rs);
  const float gx_mean = warp_sum(gx_sum) / float(C);
  float* r = dres + size_t(n) * C;
  bf16* r16 = dres16 ? dres16 + size_t(n) * C : nullptr;
  for (int c = lane; c < C; c += kWarp) {
    const float v = r[c] + rs * (wide(d[c]) * w[c] - (x[c] * rs) * gx_mean);
    r[c] = v;
    if (r16) r16[c] = narrow(v);
  }
}

__global__ void rmsnorm_bwd_partial_bf16_kernel(float* __restrict__ partial_dw,
                                                const bf16* __restrict__ dout,
                                                const float* __restrict__ inp,
                                                const float* __restrict__ rstd, int N, int C,
                                                int rows_per_chunk) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int chunk = blockIdx.y;
  const int n0 = chunk * rows_per_chunk, n1 = min(N, n0 + rows_per_chunk);
  float dw = 0.0f;
  for (int n = n0; n < n1; ++n)
    dw += wide(dout[size_t(n) * C + c]) * (inp[size_t(n) * C + c] * rstd[n]);
  partial_dw[size_t(chunk) * C + c] = dw;
}

__global__ void column_finish_kernel(float* __restrict__ dw, const float* __restrict__ partial_dw,
                                     int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sum = 0.0f;
  for (int k = 0; k < chunks; ++k) sum += partial_dw[size_t(k) * C + c];
  dw[c] += sum;
}

// One thread per rotated pair, as rope.cu; sign −1: backward.
__global__ void rope_bf16_kernel(bf16* __restrict__ qkv, const float* __restrict__ cos,
                                 const float* __restrict__ sin, int N, int T, int NH, int KVH,
                                 int hs, int rot, float sign) {
  const int half = rot / 2, heads = NH + KVH;
  const size_t row = size_t(NH + 2 * KVH) * hs;
  const size_t pairs = size_t(N) * heads * half;
  for (size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < pairs;
       idx += size_t(gridDim.x) * blockDim.x) {
    const int i = int(idx % half);
    const size_t rest = idx / half;
    const int head = int(rest % heads);
    const size_t n = rest / heads;
    const size_t t = n % size_t(T);
    const float c = cos[t * half + i], s = sign * sin[t * half + i];
    bf16* a = qkv + n * row + size_t(head) * hs;
    const float ai = wide(a[i]), bi = wide(a[i + half]);
    a[i] = narrow(ai * c - bi * s);
    a[i + half] = narrow(bi * c + ai * s);
  }
}

__global__ void swiglu_fwd_bf16_kernel(bf16* __restrict__ out, const bf16* __restrict__ inp, int N,
                                       int F) {
  const size_t total = size_t(N) * F;
  for (size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const size_t n = idx / F, f = idx % F;
    const float g = wide(inp[n * 2 * F + f]), up = wide(inp[n * 2 * F + F + f]);
    out[idx] = narrow(g * up / (1.0f + expf(-g)));
  }
}

__global__ void swiglu_bwd_bf16_kernel(bf16* __restrict__ dinp, const bf16* __restrict__ inp,
                                       const bf16* __restrict__ dout, int N, int F) {
  const size_t total = size_t(N) * F;
  for (size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const size_t n = idx / F, f = idx % F;
    const size_t gate_at = n * 2 * F + f, up_at = gate_at + F;
    const float g = wide(inp[gate_at]), up = wide(inp[up_at]), d = wide(dout[idx]);
    const float e = expf(-g);
    const float s = 1.0f / (1.0f + e);
    const float one_minus_s = 1.0f / (1.0f + 1.0f / e);
    dinp[gate_at] = narrow(d * up * s * (1.0f + g * one_minus_s));
    dinp[up_at] = narrow(d * g * s);
  }
}

__global__ void gelu_erf_fwd_bf16_kernel(bf16* __restrict__ out, const bf16* __restrict__ inp,
                                         size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float x = wide(inp[i]);
    out[i] = narrow(x * 0.5f * erfcf(-x * kInvSqrt2));
  }
}

__global__ void gelu_erf_bwd_bf16_kernel(bf16* __restrict__ dinp, const bf16* __restrict__ inp,
                                         const bf16* __restrict__ dout, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float x = wide(inp[i]);
    const float cdf = 0.5f * erfcf(-x * kInvSqrt2);
    const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
    dinp[i] = narrow((cdf + x * pdf) * wide(dout[i]));
  }
}

void rope_bf16(bf16* qkv, const float* cos, const float* sin, int N, int T, int NH, int KVH, int hs,
               int rot, float sign, cudaStream_t stream) {
  TRIDENT_CHECK(
      N >= 0 && T > 0 && NH > 0 && KVH > 0 && hs > 0 && rot >= 0 && rot % 2 == 0 && rot <= hs,
      "rope_bf16: N={} T={} NH={} KVH={} hs={} rot={}", N, T, NH, KVH, hs, rot);
  const size_t pairs = size_t(N) * (NH + KVH) * (rot / 2);
  if (pairs == 0) return;
  TRIDENT_CHECK(qkv && cos && sin, "rope_bf16: null pointer");
  rope_bf16_kernel<<<grid_for(pairs, kBlock), kBlock, 0, stream>>>(qkv, cos, sin, N, T, NH, KVH, hs,
                                                                   rot, sign);
  TRIDENT_CUDA_LAUNCHED();
}

}  // namespace

void rmsnorm_forward_bf16_cuda(bf16* out, float* rstd, const float* inp, const float* w, int N,
                               int C, float eps, cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && C > 0, "{}: N={} C={}", __func__, N, C);
  if (N == 0) return;
  TRIDENT_CHECK(out && rstd && inp && w, "{}: null pointer", __func__);
  rmsnorm_fwd_bf16_kernel<<<ceil_div(size_t(N), kRowsPerBlock), kRowsPerBlock * kWarp, 0, stream>>>(
      out, rstd, inp, w, N, C, eps);
  TRIDENT_CUDA_LAUNCHED();
}

void rmsnorm_backward_add_bf16_cuda(float* dresidual, bf16* dresidual16, float* dw, float* scratch,
                                    const bf16* dout, const float* inp, const float* w,
                                    const float* rstd, int N, int C, cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && C > 0, "{}: N={} C={}", __func__, N, C);
  if (N == 0) return;
  TRIDENT_CHECK(dresidual && dout && inp && w && rstd, "{}: null pointer", __func__);
  rmsnorm_bwd_add_bf16_kernel<<<ceil_div(size_t(N), kRowsPerBlock), kRowsPerBlock * kWarp, 0,
                                stream>>>(dresidual, dresidual16, dout, inp, w, rstd, N, C);
  TRIDENT_CUDA_LAUNCHED();
  if (!dw) return;
  TRIDENT_CHECK(scratch, "{}: null scratch", __func__);
  const int chunks = column_sum_row_chunks(N);
  const int rows_per_chunk = int(ceil_div(size_t(N), size_t(chunks)));
  const dim3 grid(ceil_div(size_t(C), kBlock), unsigned(chunks));
  rmsnorm_bwd_partial_bf16_kernel<<<grid, kBlock, 0, stream>>>(scratch, dout, inp, rstd, N, C,
                                                               rows_per_chunk);
  TRIDENT_CUDA_LAUNCHED();
  column_finish_kernel<<<ceil_div(size_t(C), kBlock), kBlock, 0, stream>>>(dw, scratch, chunks, C);
  TRIDENT_CUDA_LAUNCHED();
}

void rope_forward_bf16_cuda(bf16* qkv, const float* cos, const float* sin, int N, int T, int NH,
                            int KVH, int hs, int rot, cudaStream_t stream) {
  rope_bf16(qkv, cos, sin, N, T, NH, KVH, hs, rot, 1.0f, stream);
}

void rope_backward_bf16_cuda(bf16* dqkv, const float* cos, const float* sin, int N, int T, int NH,
                             int KVH, int hs, int rot, cudaStream_t stream) {
  rope_bf16(dqkv, cos, sin, N, T, NH, KVH, hs, rot, -1.0f, stream);
}

void swiglu_forward_bf16_cuda(bf16* out, const bf16* inp, int N, int F, cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && F > 0, "{}: N={} F={}", __func__, N, F);
  const size_t total = size_t(N) * F;
  if (total == 0) return;
  TRIDENT_CHECK(out && inp, "{}: null pointer", __func__);
  swiglu_fwd_bf16_kernel<<<grid_for(total, kBlock), kBlock, 0, stream>>>(out, inp, N, F);
  TRIDENT_CUDA_LAUNCHED();
}

void swiglu_backward_bf16_cuda(bf16* dinp, const bf16* inp, const bf16* dout, int N, int F,
                               cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && F > 0, "{}: N={} F={}", __func__, N, F);
  const size_t total = size_t(N) * F;
  if (total == 0) return;
  TRIDENT_CHECK(dinp && inp && dout, "{}: null pointer", __func__);
  swiglu_bwd_bf16_kernel<<<grid_for(total, kBlock), kBlock, 0, stream>>>(dinp, inp, dout, N, F);
  TRIDENT_CUDA_LAUNCHED();
}

void gelu_erf_forward_bf16_cuda(bf16* out, const bf16* inp, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  TRIDENT_CHECK(out && inp, "{}: null pointer", __func__);
  gelu_erf_fwd_bf16_kernel<<<grid_for(n, kBlock), kBlock, 0, stream>>>(out, inp, n);
  TRIDENT_CUDA_LAUNCHED();
}

void gelu_erf_backward_bf16_cuda(bf16* dinp, const bf16* inp, const bf16* dout, size_t n,
                                 cudaStream_t stream) {
  if (n == 0) return;
  TRIDENT_CHECK(dinp && inp && dout, "{}: null pointer", __func__);
  gelu_erf_bwd_bf16_kernel<<<grid_for(n, kBlock), kBlock, 0, stream>>>(dinp, inp, dout, n);
  TRIDENT_CUDA_LAUNCHED();
}

}  // namespace trident::cuda
