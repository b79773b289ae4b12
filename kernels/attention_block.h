// Causal attention by blocks in fp32 (Note [Attention blocks] in trident/backend.h): one block
// of queries against one block of keys at global positions, merged into a running (out, lse);
// the block calls context parallelism's ring makes (src/model/cp_attention.h). CPU twins:
// Backend::attention_block_forward/backward/delta/reset (src/backend/attention_blockwise.cpp).
// Head sizes up to kAttentionBlockMaxHs; the arguments are checked before anything is launched.
#pragma once

#include "cuda_check.h"
#include "trident/backend.h"

namespace trident::cuda {

constexpr int kAttentionBlockMaxHs = 256;

// out, lse merged with the block (rows that see no key of it unchanged).
void attention_block_fwd_cuda(const AttentionBlockArgs& a, cudaStream_t stream);
// dq, dk, dv += the block's terms, from the final lse and delta.
void attention_block_bwd_cuda(const AttentionBlockArgs& a, cudaStream_t stream);
// delta = rowsum(dout ⊙ out) for the args' query rows.
void attention_block_delta_cuda(const AttentionBlockArgs& a, cudaStream_t stream);
// lse = -inf for the args' query rows.
void attention_block_reset_cuda(const AttentionBlockArgs& a, cudaStream_t stream);

}  // namespace trident::cuda
