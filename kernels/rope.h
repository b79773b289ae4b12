// Rotary position embedding on the GPU (CPU twin: Backend::rope_forward/backward, which states
// the layout: q | k | v rows of (NH + 2·KVH)·hs, row n at position n % T, dimensions [0, rot)
// of each q and k head turned as rotate_half does; cos, sin the model's [T, rot/2] tables).
#pragma once

#include "cuda_check.h"

namespace trident::cuda {

// In place on qkv [N, (NH + 2·KVH)·hs].
void rope_forward_cuda(float* qkv, const float* cos, const float* sin, int N, int T, int NH,
                       int KVH, int hs, int rot, cudaStream_t stream);
// In place on dqkv: the transposed rotation (by −angle).
void rope_backward_cuda(float* dqkv, const float* cos, const float* sin, int N, int T, int NH,
                        int KVH, int hs, int rot, cudaStream_t stream);
// The same on bf16 q|k|v (or its gradient): widened, turned in fp32, rounded once.
void rope_forward_bf16_cuda(bf16* qkv, const float* cos, const float* sin, int N, int T, int NH,
                            int KVH, int hs, int rot, cudaStream_t stream);
void rope_backward_bf16_cuda(bf16* dqkv, const float* cos, const float* sin, int N, int T, int NH,
                             int KVH, int hs, int rot, cudaStream_t stream);

}  // namespace trident::cuda
