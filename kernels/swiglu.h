// SwiGLU on the GPU (CPU twin: Backend::swiglu_forward/backward).
#pragma once

#include "cuda_check.h"

namespace trident::cuda {

// out[N,F] = silu(gate) · up, each row of inp [N,2F] being gate[F] | up[F].
void swiglu_forward_cuda(float* out, const float* inp, int N, int F, cudaStream_t stream);
// dinp[N,2F] = (d gate | d up) (assign).
void swiglu_backward_cuda(float* dinp, const float* inp, const float* dout, int N, int F,
                          cudaStream_t stream);

}  // namespace trident::cuda
