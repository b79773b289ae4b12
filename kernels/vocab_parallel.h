// The vocab-parallel embedding and loss on the GPU (tensor parallelism; CPU twins: the
// Backend base class's embedding_slice_* and crossentropy_slice_* in
// src/backend/vocab_parallel.cpp, Note [Vocab-parallel ops]). This rank holds vocabulary rows
// [v0, v1) of wte and the logits [N, Vl] of those columns, of which the first `live` are real
// vocabulary.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_check.h"

namespace trident::cuda {

// out[n,:] = (tokens[n] in [v0,v1) ? wte_slice[tokens[n]-v0,:] : 0) + (wpe ? wpe[n%T,:] : 0).
void embedding_slice_forward_cuda(float* out, const int32_t* tokens, const float* wte_slice,
                                  const float* wpe, int v0, int v1, int B, int T, int C,
                                  cudaStream_t stream);
// Bytes of scratch embedding_slice_backward_cuda needs for N token rows and a slice of
// vocab_rows = v1 - v0 wte rows (the sort's keys, its row order, the runs and CUB's temporary
// storage). Host-only; asks CUB for its temporary sizes, so it needs a current device.
size_t embedding_backward_scratch_bytes(int N, int vocab_rows);
// dwte_slice[tok-v0,:] += dout[n,:] for tokens in [v0,v1), n in increasing order (the CPU
// twin's additions: bitwise its result); dwpe[t,:] += Σ_b dout[b,t,:] when dwpe is non-null.
// Deterministic (no float atomics; Note [Deterministic dwte] in kernels/encoder.cu). `scratch`
// holds embedding_backward_scratch_bytes(B*T, v1-v0) bytes; unused (may be null) without
// dwte_slice.
// Asynchronous on `stream`: nothing is copied to the host.
void embedding_slice_backward_cuda(float* dwte_slice, float* dwpe, void* scratch, const float* dout,
                                   const int32_t* tokens, int v0, int v1, int B, int T, int C,
                                   cudaStream_t stream);
// stats[n] = (max over the live columns, Σ exp(x - max) (accumulated in double, stored as
// float), x[targets[n]-v0] when 0 <= targets[n]-v0 < live else 0).
void crossentropy_slice_stats_cuda(float* stats, const float* logits, const int32_t* targets,
                                   int v0, int live, int N, int Vl, cudaStream_t stream);
// all_stats [tp][N][3]: M = max_r max_r, S = Σ_r sum_r·exp(max_r - M) (ranks whose max is -inf
// skipped), losses[n] = log S + M - Σ_r target_r; logits[n, j<live] = exp(x - M)/S, others 0.
void crossentropy_slice_combine_cuda(float* losses, float* logits_to_probs, const float* all_stats,
                                     int tp, int live, int N, int Vl, cudaStream_t stream);
// probs *= dloss; probs[n, targets[n]-v0] -= dloss when that column is on this rank.
void crossentropy_slice_backward_cuda(float* probs_to_dlogits, const int32_t* targets, float dloss,
                                      int v0, int N, int Vl, cudaStream_t stream);

}  // namespace trident::cuda
