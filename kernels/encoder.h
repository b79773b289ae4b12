// Token + position embedding on the GPU (CPU twin: Backend::encoder_forward/backward).
#pragma once

#include <cstdint>

#include "cuda_check.h"

namespace trident::cuda {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]. All device pointers, fp32, [B,T,C].
void encoder_forward_cuda(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                          int B, int T, int C, cudaStream_t stream);
// dwte[tok,:] += dout[b,t,:]; dwpe[t,:] += Σ_b dout[b,t,:] (accumulate). Either may be null.
void encoder_backward_cuda(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                           int B, int T, int C, cudaStream_t stream);

}  // namespace trident::cuda
