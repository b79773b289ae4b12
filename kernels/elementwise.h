// Elementwise ops on the GPU: tanh-GELU, exact GELU, residual add, casts (CPU twins: Backend::
// gelu_forward/backward, gelu_erf_forward/backward, add; the casts round to nearest even like
// __float2bfloat16).
#pragma once

#include <cstddef>

#include "cuda_check.h"

namespace trident::cuda {

void gelu_forward_cuda(float* out, const float* inp, size_t n, cudaStream_t stream);
// dinp = gelu'(inp) * dout (assign).
void gelu_backward_cuda(float* dinp, const float* inp, const float* dout, size_t n,
                        cudaStream_t stream);
// Exact GELU x·Φ(x): out = gelu_erf(inp); dinp = gelu_erf'(inp) * dout (assign).
void gelu_erf_forward_cuda(float* out, const float* inp, size_t n, cudaStream_t stream);
void gelu_erf_backward_cuda(float* dinp, const float* inp, const float* dout, size_t n,
                            cudaStream_t stream);
// bf16 in and out, fp32 math, each output rounded once (CPU twins: Backend::gelu_*_bf16).
void gelu_forward_bf16_cuda(bf16* out, const bf16* inp, size_t n, cudaStream_t stream);
void gelu_backward_bf16_cuda(bf16* dinp, const bf16* inp, const bf16* dout, size_t n,
                             cudaStream_t stream);
void gelu_erf_forward_bf16_cuda(bf16* out, const bf16* inp, size_t n, cudaStream_t stream);
void gelu_erf_backward_bf16_cuda(bf16* dinp, const bf16* inp, const bf16* dout, size_t n,
                                 cudaStream_t stream);
// out = a + b; out may alias a or b.
void add_cuda(float* out, const float* a, const float* b, size_t n, cudaStream_t stream);

void cast_f32_to_bf16_cuda(bf16* out, const float* in, size_t n, cudaStream_t stream);
// out = scale * float(in)
void cast_bf16_to_f32_cuda(float* out, const bf16* in, float scale, size_t n, cudaStream_t stream);

}  // namespace trident::cuda
