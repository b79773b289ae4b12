// Elementwise ops: tanh-GELU forward/backward (fp32, and bf16 in/out), exact GELU forward/backward,
// add, fp32 <-> bf16 casts.
//
// All memory-bound, one pass each. Grid-stride loops over float4 when every pointer is 16-byte
// aligned (slices of the flat buffers need not be), then a scalar tail; otherwise all scalar.
// GELU follows the CPU twin (src/backend/elementwise.cpp): x·σ(2u), u = sqrt(2/π)(x + 0.044715x³).
// Exact GELU too: Φ(x) as erfc(−x/√2)/2, which keeps its relative accuracy for x << 0.
#include <cstdint>
#include <type_traits>

#include "elementwise.h"
#include "launch.cuh"

namespace trident::cuda {
namespace {

constexpr int kBlock = 256;
constexpr float kSqrt2OverPi = 0.79788456080286535588f;
constexpr float kCubic = 0.044715f;
constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
bool aligned8(const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; }

__device__ __forceinline__ float gelu(float x) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  // For x -> -inf, expf overflows to inf and the quotient is -0 (no NaN).
  return x / (1.0f + expf(-2.0f * u));
}

__device__ __forceinline__ float gelu_grad(float x, float dout) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
  const float e = expf(-2.0f * u);
  const float s = 1.0f / (1.0f + e);
  // 1 - s as 1/(1 + 1/e), as in the CPU twin: no cancellation once s ≈ 1, no 0·inf.
  const float one_minus_s = 1.0f / (1.0f + 1.0f / e);
  return (s + x * 2.0f * s * one_minus_s * du) * dout;
}

__device__ __forceinline__ float gelu_erf(float x) { return x * 0.5f * erfcf(-x * kInvSqrt2); }

// Φ(x) + x·φ(x), φ(x) = exp(−x²/2)/√(2π).
__device__ __forceinline__ float gelu_erf_grad(float x, float dout) {
  const float cdf = 0.5f * erfcf(-x * kInvSqrt2);
  const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
  return (cdf + x * pdf) * dout;
}

// The two GELUs as template arguments of the kernels below: f(x), and df(x, dout) = f'(x)·dout.
struct GeluTanh {
  __device__ static float f(float x) { return gelu(x); }
  __device__ static float df(float x, float dout) { return gelu_grad(x, dout); }
};
struct GeluErf {
  __device__ static float f(float x) { return gelu_erf(x); }
  __device__ static float df(float x, float dout) { return gelu_erf_grad(x, dout); }
};

struct Range4 {
  size_t start, stride, n4;  // first index, grid stride, number of float4s (0: all scalar)
};

__device__ __forceinline__ Range4 range4(size_t n, bool vec) {
  return {size_t(blockIdx.x) * blockDim.x + threadIdx.x, size_t(gridDim.x) * blockDim.x,
          vec ? n / 4 : 0};
}

template <typename Act>
__global__ void gelu_fwd_kernel(float* __restrict__ out, const float* __restrict__ inp, size_t n,
                                bool vec) {
  const Range4 r = range4(n, vec);
  for (size_t i = r.start; i < r.n4; i += r.stride) {
    float4 x = reinterpret_cast<const float4*>(inp)[i];
    x.x = Act::f(x.x), x.y = Act::f(x.y), x.z = Act::f(x.z), x.w = Act::f(x.w);
    reinterpret_cast<float4*>(out)[i] = x;
  }
  for (size_t i = 4 * r.n4 + r.start; i < n; i += r.stride) out[i] = Act::f(inp[i]);
}

template <typename Act>
__global__ void gelu_bwd_kernel(float* __restrict__ dinp, const float* __restrict__ inp,
                                const float* __restrict__ dout, size_t n, bool vec) {
  const Range4 r = range4(n, vec);
  for (size_t i = r.start; i < r.n4; i += r.stride) {
    const float4 x = reinterpret_cast<const float4*>(inp)[i];
    const float4 d = reinterpret_cast<const float4*>(dout)[i];
    reinterpret_cast<float4*>(dinp)[i] =
        make_float4(Act::df(x.x, d.x), Act::df(x.y, d.y), Act::df(x.z, d.z), Act::df(x.w, d.w));
  }
  for (size_t i = 4 * r.n4 + r.start; i < n; i += r.stride) dinp[i] = Act::df(inp[i], dout[i]);
}

// The bf16 variants (Note [bf16 activations]): bf16 in and out, the same fp32 math, one rounding.
// The vector path takes four values (two bf16 pairs, 8 bytes) per step.
template <typename Act>
__global__ void gelu_fwd_bf16_kernel(bf16* __restrict__ out, const bf16* __restrict__ inp, size_t n,
                                     bool vec) {
  const Range4 r = range4(n, vec);
  for (size_t i = r.start; i < r.n4; i += r.stride) {
    const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(inp) + 2 * i;
    const float2 lo = __bfloat1622float2(p[0]), hi = __bfloat1622float2(p[1]);
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(out) + 2 * i;
    o[0] = __floats2bfloat162_rn(Act::f(lo.x), Act::f(lo.y));
    o[1] = __floats2bfloat162_rn(Act::f(hi.x), Act::f(hi.y));
  }
  for (size_t i = 4 * r.n4 + r.start; i < n; i += r.stride)
    out[i] = __float2bfloat16(Act::f(__bfloat162float(inp[i])));
}

template <typename Act>
__global__ void gelu_bwd_bf16_kernel(bf16* __restrict__ dinp, const bf16* __restrict__ inp,
                                     const bf16* __restrict__ dout, size_t n, bool vec) {
  const Range4 r = range4(n, vec);
  for (size_t i = r.start; i < r.n4; i += r.stride) {
    const __nv_bfloat162* x = reinterpret_cast<const __nv_bfloat162*>(inp) + 2 * i;
    const __nv_bfloat162* d = reinterpret_cast<const __nv_bfloat162*>(dout) + 2 * i;
    const float2 x_lo = __bfloat1622float2(x[0]), x_hi = __bfloat1622float2(x[1]);
    const float2 d_lo = __bfloat1622float2(d[0]), d_hi = __bfloat1622float2(d[1]);
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(dinp) + 2 * i;
    o[0] = __floats2bfloat162_rn(Act::df(x_lo.x, d_lo.x), Act::df(x_lo.y, d_lo.y));
    o[1] = __floats2bfloat162_rn(Act::df(x_hi.x, d_hi.x), Act::df(x_hi.y, d_hi.y));
  }
  for (size_t i = 4 * r.n4 + r.start; i < n; i += r.stride)
    dinp[i] = __float2bfloat16(Act::df(__bfloat162float(inp[i]), __bfloat162float(dout[i])));
}

// No __restrict__: out may alias a or b (each element is read before it is written, by the same
// thread).
__global__ void add_kernel(float* out, const float* a, const float* b, size_t n, bool vec) {
  const Range4 r = range4(n, vec);
  for (size_t i = r.start; i < r.n4; i += r.stride) {
    const float4 x = reinterpret_cast<const float4*>(a)[i];
    const float4 y = reinterpret_cast<const float4*>(b)[i];
    reinterpret_cast<float4*>(out)[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  }
  for (size_t i = 4 * r.n4 + r.start; i < n; i += r.stride) out[i] = a[i] + b[i];
}

__global__ void cast_f32_to_bf16_kernel(bf16* __restrict__ out, const float* __restrict__ in,
                                        size_t n, bool vec) {
  const Range4 r = range4(n, vec);
  for (size_t i = r.start; i < r.n4; i += r.stride) {
    const float4 x = reinterpret_cast<const float4*>(in)[i];
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(out) + 2 * i;
    o[0] = __floats2bfloat162_rn(x.x, x.y);
    o[1] = __floats2bfloat162_rn(x.z, x.w);
  }
  for (size_t i = 4 * r.n4 + r.start; i < n; i += r.stride) out[i] = __float2bfloat16(in[i]);
}

__global__ void cast_bf16_to_f32_kernel(float* __restrict__ out, const bf16* __restrict__ in,
                                        float scale, size_t n, bool vec) {
  const Range4 r = range4(n, vec);
  for (size_t i = r.start; i < r.n4; i += r.stride) {
    const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(in) + 2 * i;
    const float2 lo = __bfloat1622float2(p[0]), hi = __bfloat1622float2(p[1]);
    reinterpret_cast<float4*>(out)[i] =
        make_float4(scale * lo.x, scale * lo.y, scale * hi.x, scale * hi.y);
  }
  for (size_t i = 4 * r.n4 + r.start; i < n; i += r.stride)
    out[i] = scale * __bfloat162float(in[i]);
}

// One float4 per thread per step on the vector path, so size the grid by n/4.
unsigned grid_for_vec(size_t n, bool vec) { return grid_for(vec ? (n + 3) / 4 : n, kBlock); }

// The vector path needs float4 (fp32: 16 bytes) or two bf16 pairs (8 bytes) aligned.
bool vec_aligned(const float* p) { return aligned16(p); }
bool vec_aligned(const bf16* p) { return aligned8(p); }

template <typename Act, typename Elem>
void gelu_forward(Elem* out, const Elem* inp, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  TRIDENT_CHECK(out && inp, "gelu forward: null pointer");
  const bool vec = vec_aligned(out) && vec_aligned(inp);
  if constexpr (std::is_same_v<Elem, float>)
    gelu_fwd_kernel<Act><<<grid_for_vec(n, vec), kBlock, 0, stream>>>(out, inp, n, vec);
  else gelu_fwd_bf16_kernel<Act><<<grid_for_vec(n, vec), kBlock, 0, stream>>>(out, inp, n, vec);
  TRIDENT_CUDA_LAUNCHED();
}

template <typename Act, typename Elem>
void gelu_backward(Elem* dinp, const Elem* inp, const Elem* dout, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  TRIDENT_CHECK(dinp && inp && dout, "gelu backward: null pointer");
  const bool vec = vec_aligned(dinp) && vec_aligned(inp) && vec_aligned(dout);
  if constexpr (std::is_same_v<Elem, float>)
    gelu_bwd_kernel<Act><<<grid_for_vec(n, vec), kBlock, 0, stream>>>(dinp, inp, dout, n, vec);
  else
    gelu_bwd_bf16_kernel<Act><<<grid_for_vec(n, vec), kBlock, 0, stream>>>(dinp, inp, dout, n, vec);
  TRIDENT_CUDA_LAUNCHED();
}

}  // namespace

void gelu_forward_cuda(float* out, const float* inp, size_t n, cudaStream_t stream) {
  gelu_forward<GeluTanh>(out, inp, n, stream);
}

void gelu_backward_cuda(float* dinp, const float* inp, const float* dout, size_t n,
                        cudaStream_t stream) {
  gelu_backward<GeluTanh>(dinp, inp, dout, n, stream);
}

void gelu_erf_forward_cuda(float* out, const float* inp, size_t n, cudaStream_t stream) {
  gelu_forward<GeluErf>(out, inp, n, stream);
}

void gelu_erf_backward_cuda(float* dinp, const float* inp, const float* dout, size_t n,
                            cudaStream_t stream) {
  gelu_backward<GeluErf>(dinp, inp, dout, n, stream);
}

void gelu_forward_bf16_cuda(bf16* out, const bf16* inp, size_t n, cudaStream_t stream) {
  gelu_forward<GeluTanh>(out, inp, n, stream);
}

void gelu_backward_bf16_cuda(bf16* dinp, const bf16* inp, const bf16* dout, size_t n,
                             cudaStream_t stream) {
  gelu_backward<GeluTanh>(dinp, inp, dout, n, stream);
}

void gelu_erf_forward_bf16_cuda(bf16* out, const bf16* inp, size_t n, cudaStream_t stream) {
  gelu_forward<GeluErf>(out, inp, n, stream);
}

void gelu_erf_backward_bf16_cuda(bf16* dinp, const bf16* inp, const bf16* dout, size_t n,
                                 cudaStream_t stream) {
  gelu_backward<GeluErf>(dinp, inp, dout, n, stream);
}

void add_cuda(float* out, const float* a, const float* b, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  TRIDENT_CHECK(out && a && b, "{}: null pointer", __func__);
  const bool vec = aligned16(out) && aligned16(a) && aligned16(b);
  add_kernel<<<grid_for_vec(n, vec), kBlock, 0, stream>>>(out, a, b, n, vec);
  TRIDENT_CUDA_LAUNCHED();
}

void cast_f32_to_bf16_cuda(bf16* out, const float* in, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  TRIDENT_CHECK(out && in, "{}: null pointer", __func__);
  const bool vec = aligned8(out) && aligned16(in);
  cast_f32_to_bf16_kernel<<<grid_for_vec(n, vec), kBlock, 0, stream>>>(out, in, n, vec);
  TRIDENT_CUDA_LAUNCHED();
}

void cast_bf16_to_f32_cuda(float* out, const bf16* in, float scale, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  TRIDENT_CHECK(out && in, "{}: null pointer", __func__);
  const bool vec = aligned16(out) && aligned8(in);
  cast_bf16_to_f32_kernel<<<grid_for_vec(n, vec), kBlock, 0, stream>>>(out, in, scale, n, vec);
  TRIDENT_CUDA_LAUNCHED();
}

}  // namespace trident::cuda
