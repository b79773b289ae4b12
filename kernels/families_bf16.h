// The model families' bf16 ops on the GPU (Note [bf16 activations]: the fp32 op on the widened
// bf16 inputs, all arithmetic fp32, each bf16 output rounded once). CPU twins: Backend::
// rmsnorm_*_bf16, rope_*_bf16, swiglu_*_bf16, gelu_erf_*_bf16 (src/backend/bf16_family_ops.cpp).
#pragma once

#include <cstddef>

#include "cuda_check.h"

namespace trident::cuda {

// out[N,C] = bf16(inp · rstd · w); rstd[n] saved (fp32) for backward.
void rmsnorm_forward_bf16_cuda(bf16* out, float* rstd, const float* inp, const float* w, int N,
                               int C, float eps, cudaStream_t stream);
// dresidual += RMSNorm's input gradient for dout (bf16), then dresidual16 = bf16(dresidual) when
// non-null, in one pass; dw += Σ_n dout·x̂ (skipped when null) through `scratch`
// (rmsnorm_backward_scratch_floats in rmsnorm.h floats), deterministically.
void rmsnorm_backward_add_bf16_cuda(float* dresidual, bf16* dresidual16, float* dw, float* scratch,
                                    const bf16* dout, const float* inp, const float* w,
                                    const float* rstd, int N, int C, cudaStream_t stream);
// RoPE in place on bf16 q|k|v (or its gradient), rope.h's layout and tables.
void rope_forward_bf16_cuda(bf16* qkv, const float* cos, const float* sin, int N, int T, int NH,
                            int KVH, int hs, int rot, cudaStream_t stream);
void rope_backward_bf16_cuda(bf16* dqkv, const float* cos, const float* sin, int N, int T, int NH,
                             int KVH, int hs, int rot, cudaStream_t stream);
// SwiGLU: out[N,F] = bf16(silu(gate)·up) from bf16 gate | up [N,2F]; dinp[N,2F] (assign).
void swiglu_forward_bf16_cuda(bf16* out, const bf16* inp, int N, int F, cudaStream_t stream);
void swiglu_backward_bf16_cuda(bf16* dinp, const bf16* inp, const bf16* dout, int N, int F,
                               cudaStream_t stream);
// Exact GELU, elementwise.
void gelu_erf_forward_bf16_cuda(bf16* out, const bf16* inp, size_t n, cudaStream_t stream);
void gelu_erf_backward_bf16_cuda(bf16* dinp, const bf16* inp, const bf16* dout, size_t n,
                                 cudaStream_t stream);

}  // namespace trident::cuda
