// SwiGLU on the GPU (CPU twin: Backend::swiglu_forward/backward).
#pragma once

#include "cuda_check.h"

namespace trident::cuda {

// out[N,F] = silu(gate) · up, each row of inp [N,2F] being gate[F] | up[F].
void swiglu_forward_cuda(float* out, const float* inp, int N, int F, cudaStream_t stream);
// dinp[N,2F] = (d gate | d up) (assign).
void swiglu_backward_cuda(float* dinp, const float* inp, const float* dout, int N, int F,
                          cudaStream_t stream);
// The same on bf16 in and out, fp32 math, each output rounded once (CPU twins: Backend::
// swiglu_*_bf16).
void swiglu_forward_bf16_cuda(bf16* out, const bf16* inp, int N, int F, cudaStream_t stream);
void swiglu_backward_bf16_cuda(bf16* dinp, const bf16* inp, const bf16* dout, int N, int F,
                               cudaStream_t stream);

}  // namespace trident::cuda
