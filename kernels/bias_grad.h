// Bias gradient of a linear layer on the GPU: dbias[OC] += Σ_n dout[n, oc] (CPU twin: the
// dbias part of Backend::matmul_backward). Deterministic: fixed-order partial sums.
#pragma once

#include <cstddef>

#include "cuda_check.h"

namespace trident::cuda {

size_t bias_backward_scratch_floats(int N, int OC);
void bias_backward_cuda(float* dbias, float* scratch, const float* dout, int N, int OC,
                        cudaStream_t stream);
// The same from a bf16 dout, fp32 sums (CPU twin: the dbias part of matmul_backward_bf16).
void bias_backward_bf16_cuda(float* dbias, float* scratch, const bf16* dout, int N, int OC,
                             cudaStream_t stream);

}  // namespace trident::cuda
