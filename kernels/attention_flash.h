// Causal multi-head attention, flash-style (tiles of K/V streamed through shared memory, online
// softmax, nothing of size T×T stored), fp32 — the fallback when cuDNN's fused attention is
// unavailable for a shape (CPU twin: Backend::attention_forward/backward).
// qkv [B,T,3C] holds q|k|v per token, each [NH, HS] with HS = C/NH; out [B,T,C] (heads
// interleaved as [NH,HS]); lse [B,NH,T] the log-sum-exp of each row's scaled scores (scale
// 1/sqrt(HS)), saved for backward.
#pragma once

#include <cstddef>

#include "cuda_check.h"

namespace trident::cuda {

bool flash_attention_supported(int HS);  // head sizes the kernels are built for
void flash_attention_forward_cuda(float* out, float* lse, const float* qkv, int B, int T, int C,
                                  int NH, cudaStream_t stream);
// Floats of scratch the backward needs (D = rowsum(dout ⊙ out), [B,NH,T]).
size_t flash_attention_backward_scratch_floats(int B, int T, int C, int NH);
// dqkv [B,T,3C] (assign).
void flash_attention_backward_cuda(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                   const float* out, const float* lse, int B, int T, int C, int NH,
                                   cudaStream_t stream);

// Grouped-query attention (CPU twin: Backend::attention_forward_gqa/backward_gqa): qkv
// [B,T,(NH + 2·KVH)·HS] is q | k | v, query head h reads kv head h / (NH/KVH); out [B,T,NH·HS];
// lse [B,NH,T]. Backward's dK, dV sum over the query heads of a group, in head order, in
// registers (deterministic); scratch as above with C = NH·HS. KVH = NH is the calls above.
void flash_attention_forward_gqa_cuda(float* out, float* lse, const float* qkv, int B, int T,
                                      int NH, int KVH, int HS, cudaStream_t stream);
void flash_attention_backward_gqa_cuda(float* dqkv, float* scratch, const float* dout,
                                       const float* qkv, const float* out, const float* lse, int B,
                                       int T, int NH, int KVH, int HS, cudaStream_t stream);

}  // namespace trident::cuda
