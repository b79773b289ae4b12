// The mixture of experts' routing, permutation and combine on the GPU (CPU twins: the Backend
// moe_* ops in src/backend/moe_ops.cpp; semantics in include/trident/backend.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_check.h"

namespace trident::cuda {

// One thread per token: softmax (double sums) or sigmoid, then top-k by probs (+ bias with
// sigmoid), ties to the lower index; E <= 256.
void moe_route_forward_cuda(float* probs, float* lse, int32_t* top, float* topw,
                            const float* logits, const float* bias, int N, int E, int k,
                            bool sigmoid, bool norm_topk, cudaStream_t stream);
// One block: each expert's choices ranked in token order by a warp (ballots), capacity `cap`,
// the rows' offsets, the tokens of the rows, and the summary (counts | kept, Σ probs | Σ lse²).
void moe_permute_cuda(int32_t* pos, int32_t* send_token, int32_t* counts, double* sums,
                      int32_t* hf_count, const int32_t* top, const float* probs, const float* lse,
                      int N, int E, int k, int cap, cudaStream_t stream);
void moe_gather_rows_cuda(float* rows, const float* x, const int32_t* send_token, int M, int C,
                          cudaStream_t stream);
void moe_combine_forward_cuda(float* out, const float* ys, const float* shared, const float* gate,
                              const int32_t* pos, const float* topw, int N, int C, int k,
                              cudaStream_t stream);
// One block per choice: its row's output gradient and its weight's gradient (a dot over C).
void moe_combine_backward_cuda(float* dys, float* dtopw, const float* dout, const float* ys,
                               const int32_t* pos, const float* topw, int N, int C, int k,
                               cudaStream_t stream);
void moe_scatter_add_cuda(float* dx, const float* dxs, const int32_t* pos, int N, int C, int k,
                          cudaStream_t stream);
// One thread per token, with no array of E (moe_token::route_backward).
void moe_route_backward_cuda(float* dlogits, const float* dtopw, const float* probs,
                             const float* lse, const int32_t* top, const float* topw,
                             const int32_t* aux_count, double aux_num, double aux_den, double z2,
                             double loss_scale, int N, int E, int k, bool sigmoid, bool norm_topk,
                             cudaStream_t stream);
void sigmoid_forward_cuda(float* out, const float* inp, size_t n, cudaStream_t stream);
// One block per token.
void moe_gate_backward_cuda(float* dgate, float* dy, const float* dout, const float* y,
                            const float* gate, int N, int C, cudaStream_t stream);

}  // namespace trident::cuda
