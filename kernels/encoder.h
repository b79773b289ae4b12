// Token + position embedding on the GPU (CPU twin: Backend::encoder_forward/backward).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_check.h"

namespace trident::cuda {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]. All device pointers, fp32, [B,T,C].
void encoder_forward_cuda(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                          int B, int T, int C, cudaStream_t stream);
// Bytes of scratch encoder_backward_cuda needs for N = B*T rows (any vocabulary size).
size_t encoder_backward_scratch_bytes(int N);
// dwte[tok,:] += dout[b,t,:]; dwpe[t,:] += Σ_b dout[b,t,:] (accumulate). Either may be null.
// Deterministic, bitwise the CPU twin's dwte (Note [Deterministic dwte] in kernels/encoder.cu).
// `scratch`: encoder_backward_scratch_bytes(B*T) bytes (unused, may be null, without dwte).
void encoder_backward_cuda(float* dwte, float* dwpe, void* scratch, const float* dout,
                           const int32_t* tokens, int B, int T, int C, cudaStream_t stream);

}  // namespace trident::cuda
