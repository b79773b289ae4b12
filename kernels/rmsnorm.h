// RMSNorm over the last dimension on the GPU (CPU twin: Backend::rmsnorm_*).
#pragma once

#include <cstddef>

#include "cuda_check.h"

namespace trident::cuda {

// out[N,C] = inp · rstd · w, rstd[n] = 1/sqrt(mean(inp[n]²) + eps) saved for backward.
void rmsnorm_forward_cuda(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                          float eps, cudaStream_t stream);
// The same with a bf16 out (Note [bf16 activations]; CPU twin: Backend::rmsnorm_forward_bf16).
void rmsnorm_forward_bf16_cuda(bf16* out, float* rstd, const float* inp, const float* w, int N,
                               int C, float eps, cudaStream_t stream);

// Floats of scratch rmsnorm_backward_cuda needs for N rows of C.
size_t rmsnorm_backward_scratch_floats(int N, int C);
// dinp = (assign, skipped when null); dw += Σ_n dout·x̂ (accumulate, skipped when null;
// deterministic: per-chunk partial sums in `scratch`, then a fixed-order sum).
void rmsnorm_backward_cuda(float* dinp, float* dw, float* scratch, const float* dout,
                           const float* inp, const float* w, const float* rstd, int N, int C,
                           cudaStream_t stream);
// dresidual += RMSNorm's input gradient for dout (bf16), then dresidual16 = bf16(dresidual) when
// non-null, in one pass; dw as above, same scratch (CPU twin: Backend::rmsnorm_backward_add_bf16).
void rmsnorm_backward_add_bf16_cuda(float* dresidual, bf16* dresidual16, float* dw, float* scratch,
                                    const bf16* dout, const float* inp, const float* w,
                                    const float* rstd, int N, int C, cudaStream_t stream);

}  // namespace trident::cuda
