// Fused softmax + cross-entropy over the first V of Vp columns on the GPU (CPU twin:
// Backend::crossentropy_forward/backward). One block per row; padded columns never enter the
// softmax and come out 0.
#pragma once

#include <cstdint>

#include "cuda_check.h"

namespace trident::cuda {

// logits [N,Vp] become probabilities in place; losses[n] = -log p[n, targets[n]].
void crossentropy_forward_cuda(float* losses, float* logits_to_probs, const int32_t* targets, int N,
                               int V, int Vp, cudaStream_t stream);
// In place: probs become dloss * (probs - onehot(target)); padded columns 0.
void crossentropy_backward_cuda(float* probs_to_dlogits, const int32_t* targets, float dloss, int N,
                                int V, int Vp, cudaStream_t stream);
// bf16 logits [N,Vp]: losses[n] = -log p[n, targets[n]] (fp32) and, in place, logits become
// bf16(dloss * (p - onehot(target))), padded columns 0 (CPU twin:
// Backend::crossentropy_fused_bf16).
void crossentropy_fused_bf16_cuda(float* losses, bf16* logits_to_dlogits, const int32_t* targets,
                                  float dloss, int N, int V, int Vp, cudaStream_t stream);

}  // namespace trident::cuda
