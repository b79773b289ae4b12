// LayerNorm over the last dimension (eps 1e-5) on the GPU (CPU twin: Backend::layernorm_*).
#pragma once

#include <cstddef>

#include "cuda_check.h"

namespace trident::cuda {

// out[N,C] = (inp - mean) * rstd * w + b (b null: no shift); mean, rstd [N] saved for backward.
void layernorm_forward_cuda(float* out, float* mean, float* rstd, const float* inp, const float* w,
                            const float* b, int N, int C, cudaStream_t stream);

// The same with out = bf16(...), rounded once (CPU twin: Backend::layernorm_forward_bf16).
void layernorm_forward_bf16_cuda(bf16* out, float* mean, float* rstd, const float* inp,
                                 const float* w, const float* b, int N, int C, cudaStream_t stream);

// Floats of scratch layernorm_backward_cuda needs for N rows of C.
size_t layernorm_backward_scratch_floats(int N, int C);
// dinp = (assign); dw += Σ_n dout·x̂; db += Σ_n dout (accumulate, deterministic: per-block
// partial sums in `scratch`, then a fixed-order sum).
void layernorm_backward_cuda(float* dinp, float* dw, float* db, float* scratch, const float* dout,
                             const float* inp, const float* w, const float* mean, const float* rstd,
                             int N, int C, cudaStream_t stream);
// dresidual += dinp (in place), then dresidual16 = bf16(dresidual) if non-null, in one pass;
// dw, db as above; dout bf16 (CPU twin: Backend::layernorm_backward_add_bf16). Same scratch.
// dresidual16 must not be dout (dw, db read dout after dresidual16 is written).
void layernorm_backward_add_bf16_cuda(float* dresidual, bf16* dresidual16, float* dw, float* db,
                                      float* scratch, const bf16* dout, const float* inp,
                                      const float* w, const float* mean, const float* rstd, int N,
                                      int C, cudaStream_t stream);

}  // namespace trident::cuda
