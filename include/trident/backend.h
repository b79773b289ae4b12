// The Backend: every layer's forward and backward routine, behind one interface.
//
// The model code calls these and never knows which backend it has: the CPU backend
// (make_cpu_backend, src/backend) or the CUDA backend (trident/cuda_backend.h, src/backend/cuda).
// Argument order is fixed, as in llm.c: outputs, saved values, inputs, weights, sizes.
// All tensors are contiguous, row-major fp32. N = B*T rows. Linear weights are stored
// [out_features, in_features] (llm.c / PyTorch order), so out = inp · wᵀ + bias.
//
// Note [Gradient accumulation]
// Weight gradients ACCUMULATE (+=): dw, db, dwte, dwpe, so micro-batches add up and a
// parameter used twice (the tied embedding) collects both contributions. Activation gradients
// ASSIGN (=): dinp is overwritten.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "trident/bfloat16.h"
#include "trident/check.h"

namespace trident {

// AdamW's bias correction 1 / (1 - beta^t) at (1-based) step t, in double: the one formula
// both backends' adamw_update use, so their updates agree.
inline double adamw_bias_correction(double beta, int t) { return 1.0 / (1.0 - std::pow(beta, t)); }

// What a fused attention (flash, cuDNN) saves per layer: the softmax statistics, one float per
// row of each head, padded to whole 16 bytes so that each layer's slice starts aligned (cuDNN
// declares the tensor 16-byte aligned). The CUDA backend allocates by it, the planner counts by it.
inline size_t fused_attention_saved_floats(int B, int T, int NH) {
  return (size_t(B) * NH * T + 3) / 4 * 4;
}

// Note [Attention blocks]
// Causal attention as blocks, flash-style: queries [Tq rows] × keys [Tk rows] for all B batches
// and NH heads (query head h reads kv head h / (NH / KVH)), at global positions q_pos + i and
// k_pos + j; query i sees key j iff k_pos + j <= q_pos + i. Forward keeps out normalised and
// lse = log Σ exp(q·k/sqrt(hs)), merging each block into them (lse = -inf: nothing yet);
// backward recomputes p = exp(q·k/sqrt(hs) - lse) per tile: dv += pᵀ·dout, ds = p ⊙ (dout·vᵀ -
// delta)/sqrt(hs), dq += ds·k, dk += dsᵀ·q. Sums run in a fixed order whatever the thread count.
// So context parallelism's ring (src/model/cp_attention.h) is these calls, chunk pair by pair.
//
// Layout: element (b, row, head, d) of a row tensor is at ptr + b·bstride + row·rstride +
// head·hs + d; the per-row statistics lse and delta are [b][h][i] at ptr + b·s_bstride +
// h·s_hstride + i. A block that sees nothing is skipped, one that sees everything unmasked.
struct AttentionBlockArgs {
  int B = 0, NH = 0, KVH = 0, hs = 0;
  int Tq = 0, Tk = 0;
  long q_pos = 0, k_pos = 0;
  const float* q = nullptr;  // NH heads
  size_t q_bstride = 0, q_rstride = 0;
  const float *k = nullptr, *v = nullptr;  // KVH heads
  size_t kv_bstride = 0, kv_rstride = 0;
  float* out = nullptr;  // NH heads; dout has out's strides
  const float* dout = nullptr;
  size_t o_bstride = 0, o_rstride = 0;
  float *lse = nullptr, *delta = nullptr;
  size_t s_bstride = 0, s_hstride = 0;
  float* dq = nullptr;                 // backward: q's strides
  float *dk = nullptr, *dv = nullptr;  // backward: k's and v's strides
};
// The shapes every block op relies on: kv heads dividing heads, rows of one tensor that do not
// overlap, nor one head's statistics rows. An internal error naming `op` otherwise.
void check_attention_block(const AttentionBlockArgs& a, const char* op);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual int threads() const = 0;

  // Token + position embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
  virtual void encoder_forward(float* out, const int32_t* tokens, const float* wte,
                               const float* wpe, int B, int T, int C) = 0;
  // dwte[tok,:] += dout[b,t,:]; dwpe[t,:] += sum_b dout[b,t,:]. Either pointer may be null.
  virtual void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                                int B, int T, int C) = 0;

  // LayerNorm over the last dim (eps 1e-5); mean and rstd [N] are saved for backward.
  // b == nullptr: no shift (a LayerNorm without bias, model.bias false); backward then takes
  // db == nullptr (CPU backend; a device backend may still require b).
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* w, const float* b, int N, int C) = 0;
  // dinp = ...; dw += ...; db += ... (dw or db null: skipped)
  virtual void layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                                  const float* inp, const float* w, const float* mean,
                                  const float* rstd, int N, int C) = 0;

  // out[N,OC] = inp[N,C] · w[OC,C]ᵀ + bias[OC] (bias may be null).
  virtual void matmul_forward(float* out, const float* inp, const float* w, const float* bias,
                              int N, int C, int OC) = 0;
  // dinp[N,C] = dout · w; dw[OC,C] += doutᵀ · inp; dbias[OC] += column sums of dout.
  // Each is skipped if its pointer is null (the LM head computes dw first on its own, so the
  // tied embedding's gradient can be reduced while dinp is computed).
  virtual void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout,
                               const float* inp, const float* w, int N, int C, int OC) = 0;
  // Rows [r, r + rows) of matmul_backward's dw, for dw = that layer's dw + r·C and dout = its
  // dout + r (rows ld floats apart, ld = the layer's OC): dw[rows,C] += doutᵀ · inp, each element
  // the same dot product over the N rows (Note [Head gradient in pieces], trident/buckets.h).
  // Host backends only: the trainer asks for pieces only there.
  virtual void matmul_backward_weight_rows(float* dw, const float* dout, int ld, const float* inp,
                                           int N, int C, int rows) {
    (void)dw, (void)dout, (void)ld, (void)inp, (void)N, (void)C, (void)rows;
    internal_error(__FILE__, __LINE__, "matmul_backward_weight_rows: not on this backend");
  }
  // The experts' linear layers (src/model/moe.cpp), E products in one call: expert e owns rows
  // [rows_at[e], rows_at[e + 1]) of inp, out, dout, dinp (rows_at: E + 1 host ints, rows_at[0]
  // = 0) and the weight w + e·OC·C (dw likewise). On its rows, matmul_forward without a bias and
  // matmul_backward without dbias (dinp assigns, dw += ; either skipped if null); an expert with
  // no rows is left alone. These defaults call matmul_forward / matmul_backward once per expert;
  // the CPU backend runs all the products in one team (Note [Grouped GEMM] in
  // src/backend/gemm.cpp).
  virtual void matmul_forward_grouped(float* out, const float* inp, const float* w,
                                      const int32_t* rows_at, int E, int C, int OC) {
    for (int e = 0; e < E; ++e) {
      const int r0 = rows_at[e], n = rows_at[e + 1] - r0;
      if (n > 0)
        matmul_forward(out + size_t(r0) * OC, inp + size_t(r0) * C, w + size_t(e) * OC * C, nullptr,
                       n, C, OC);
    }
  }
  virtual void matmul_backward_grouped(float* dinp, float* dw, const float* dout, const float* inp,
                                       const float* w, const int32_t* rows_at, int E, int C,
                                       int OC) {
    for (int e = 0; e < E; ++e) {
      const int r0 = rows_at[e], n = rows_at[e + 1] - r0;
      if (n > 0)
        matmul_backward(dinp ? dinp + size_t(r0) * C : nullptr,
                        dw ? dw + size_t(e) * OC * C : nullptr, nullptr, dout + size_t(r0) * OC,
                        inp + size_t(r0) * C, w + size_t(e) * OC * C, n, C, OC);
    }
  }

  // Causal multi-head self-attention. qkv [B,T,3C] holds q|k|v, each [NH, C/NH] per token;
  // out is [B,T,C]. `att` saves what backward needs, attention_saved_floats() of it (CPU: the
  // softmax probabilities [B,NH,T,T], scale 1/sqrt(C/NH); CUDA: per-row softmax statistics).
  virtual void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C,
                                 int NH) = 0;
  // dqkv = ... (assign). scratch holds attention_scratch_floats(); out is forward's output.
  virtual void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                  const float* out, const float* att, int B, int T, int C,
                                  int NH) = 0;
  virtual size_t attention_saved_floats(int B, int T, int C, int NH) const {
    (void)C;
    return size_t(B) * NH * T * T;
  }
  virtual size_t attention_scratch_floats(int B, int T, int C, int NH) const {
    return attention_saved_floats(B, T, C, NH);
  }

  // tanh-approximation GELU, elementwise over n values.
  virtual void gelu_forward(float* out, const float* inp, size_t n) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) = 0;

  // --- Model families (Note [Block shapes] in trident/model_config.h) ---------------------
  // The CPU backend implements these; a device backend that has not yet refuses them
  // (internal_error: the model checks the backend before it is built).
  // RMSNorm over the last dim: out = inp · rstd · w with rstd[n] = 1/sqrt(mean(inp[n]²) + eps),
  // saved for backward.
  virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N,
                               int C, float eps) {
    (void)out, (void)rstd, (void)inp, (void)w, (void)N, (void)C, (void)eps;
    refuse("rmsnorm_forward");
  }
  // dinp = ...; dw += ...
  virtual void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                                const float* w, const float* rstd, int N, int C) {
    (void)dinp, (void)dw, (void)dout, (void)inp, (void)w, (void)rstd, (void)N, (void)C;
    refuse("rmsnorm_backward");
  }
  // Rotary position embedding, in place on the q and k heads of qkv [N, (NH + 2·KVH)·hs]
  // (q | k | v, row n at position n % T). In each head dimensions [0, rot) turn as transformers'
  // rotate_half does: for i < rot/2, with c = cos[t, i], s = sin[t, i],
  //   x[i] ← x[i]·c − x[i + rot/2]·s,   x[i + rot/2] ← x[i + rot/2]·c + x[i]·s;
  // v and dimensions [rot, hs) are untouched. cos and sin are [T, rot/2] tables (the model's).
  virtual void rope_forward(float* qkv, const float* cos, const float* sin, int N, int T, int NH,
                            int KVH, int hs, int rot) {
    (void)qkv, (void)cos, (void)sin, (void)N, (void)T, (void)NH, (void)KVH, (void)hs, (void)rot;
    refuse("rope_forward");
  }
  // Its backward in place on dqkv: the transposed rotation (by −angle).
  virtual void rope_backward(float* dqkv, const float* cos, const float* sin, int N, int T, int NH,
                             int KVH, int hs, int rot) {
    (void)dqkv, (void)cos, (void)sin, (void)N, (void)T, (void)NH, (void)KVH, (void)hs, (void)rot;
    refuse("rope_backward");
  }
  // SwiGLU: out[N,F] = silu(gate) · up, where each row of inp [N,2F] is gate[F] | up[F].
  virtual void swiglu_forward(float* out, const float* inp, int N, int F) {
    (void)out, (void)inp, (void)N, (void)F;
    refuse("swiglu_forward");
  }
  // dinp[N,2F] = (d gate | d up) (assign).
  virtual void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) {
    (void)dinp, (void)inp, (void)dout, (void)N, (void)F;
    refuse("swiglu_backward");
  }
  // Exact GELU, x·Φ(x) = x·(1 + erf(x/√2))/2, elementwise over n values.
  virtual void gelu_erf_forward(float* out, const float* inp, size_t n) {
    (void)out, (void)inp, (void)n;
    refuse("gelu_erf_forward");
  }
  virtual void gelu_erf_backward(float* dinp, const float* inp, const float* dout, size_t n) {
    (void)dinp, (void)inp, (void)dout, (void)n;
    refuse("gelu_erf_backward");
  }
  // Causal grouped-query attention: qkv [B,T,(NH + 2·KVH)·hs] is q | k | v, query head h reads
  // key/value head h / (NH / KVH); out is [B,T,NH·hs]; `att` and scratch as attention_forward's
  // with C = NH·hs (scale 1/sqrt(hs)). dqkv (assign) sums the gradients of a shared kv head over
  // the query heads that read it. With KVH == NH it is attention_forward/backward.
  virtual void attention_forward_gqa(float* out, float* att, const float* qkv, int B, int T, int NH,
                                     int KVH, int hs) {
    if (KVH != NH) refuse("attention_forward_gqa with kv_heads < heads");
    attention_forward(out, att, qkv, B, T, NH * hs, NH);
  }
  virtual void attention_backward_gqa(float* dqkv, float* scratch, const float* dout,
                                      const float* qkv, const float* out, const float* att, int B,
                                      int T, int NH, int KVH, int hs) {
    if (KVH != NH) refuse("attention_backward_gqa with kv_heads < heads");
    attention_backward(dqkv, scratch, dout, qkv, out, att, B, T, NH * hs, NH);
  }

  // --- Attention by blocks (Note [Attention blocks]) --------------------------------------
  // One block of causal attention: the queries of one span of rows against the keys and values
  // of another, both spans at global positions, so that a query sees a key iff the key's
  // position is not after its own. attention_block_forward merges the block into a running
  // softmax (out, lse); attention_block_backward adds the block's dq, dk, dv from the final
  // lse and delta = rowsum(dout ⊙ out) (attention_block_delta). The blockwise attention is one
  // call over all T; context parallelism calls them per chunk pair (src/model/cp_attention.h).
  virtual void attention_block_forward(const AttentionBlockArgs& a) {
    (void)a;
    refuse("attention_block_forward");
  }
  virtual void attention_block_backward(const AttentionBlockArgs& a) {
    (void)a;
    refuse("attention_block_backward");
  }
  virtual void attention_block_delta(const AttentionBlockArgs& a) {
    (void)a;
    refuse("attention_block_delta");
  }
  // lse[b,h,i] = -inf for the args' query rows (an empty softmax, before the first block).
  virtual void attention_block_reset(const AttentionBlockArgs& a) {
    (void)a;
    refuse("attention_block_reset");
  }

  // out = a + b (out may alias a or b).
  virtual void add(float* out, const float* a, const float* b, size_t n) = 0;

  // Softmax cross-entropy over the first V of Vp columns (the padded columns never touch the
  // loss). logits [N,Vp] is overwritten with the probabilities (padded columns set to 0);
  // losses[n] = -log p[n, targets[n]].
  virtual void crossentropy_forward(float* losses, float* logits_to_probs, const int32_t* targets,
                                    int N, int V, int Vp) = 0;
  // In place: probs [N,Vp] becomes dlogits = dloss * (probs - onehot(target)); padded columns 0.
  virtual void crossentropy_backward(float* probs_to_dlogits, const int32_t* targets, float dloss,
                                     int N, int V, int Vp) = 0;

  // Vocab-parallel embedding and loss (tensor parallelism; Note [Vocab-parallel ops] in
  // src/backend/vocab_parallel.cpp). This rank holds vocabulary rows [v0, v1) of wte.
  // out[n,:] = (tokens[n] in [v0,v1) ? wte_slice[tokens[n]-v0,:] : 0) + (wpe ? wpe[n%T,:] : 0).
  virtual void embedding_slice_forward(float* out, const int32_t* tokens, const float* wte_slice,
                                       const float* wpe, int v0, int v1, int B, int T, int C);
  // dwte_slice[tok-v0,:] += dout[n,:] for tokens in [v0,v1); dwpe[t,:] += Σ_b dout (if non-null).
  virtual void embedding_slice_backward(float* dwte_slice, float* dwpe, const float* dout,
                                        const int32_t* tokens, int v0, int v1, int B, int T, int C);
  // Per row of this rank's logits [N,Vl] (its first `live` columns are real vocabulary):
  // stats[n] = (max, Σ exp(x - max), x[targets[n]-v0] or 0 when the target is not here).
  virtual void crossentropy_slice_stats(float* stats, const float* logits, const int32_t* targets,
                                        int v0, int live, int N, int Vl);
  // From every rank's stats all_stats [tp][N][3]: losses[n] = log Σ - target logit, and the
  // logits become this rank's probabilities (columns from `live` on: 0).
  virtual void crossentropy_slice_combine(float* losses, float* logits_to_probs,
                                          const float* all_stats, int tp, int live, int N, int Vl);
  // In place: probs become dloss * (probs - onehot(target)) on this rank's columns.
  virtual void crossentropy_slice_backward(float* probs_to_dlogits, const int32_t* targets,
                                           float dloss, int v0, int N, int Vl);
  // `rows` rows of `row_bytes` bytes: row i from src + i·src_pitch to dst + i·dst_pitch
  // (the sequence-parallel permutations). Ordered with the ops, like copy().
  virtual void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                         size_t row_bytes, size_t rows);

  // --- the mixture of experts (src/model/moe.h; Note [Mixture ops] in src/backend/moe_ops.cpp)
  // Defined here on the host (the CPU backend's, and the CUDA kernels' twin); a device backend
  // overrides every one. N tokens, E experts, k choices a token, C channels; a choice c = t·k + j.
  // Router: probs[N,E] = softmax(logits) (lse[N] its log-sum-exp) or sigmoid(logits) (lse = 0);
  // top[N,k] the k best experts by probs (+ bias[E] with sigmoid, when not null), ties to the
  // lower index; topw[N,k] their probs, divided by their sum when norm_topk.
  virtual void moe_route_forward(float* probs, float* lse, int32_t* top, float* topw,
                                 const float* logits, const float* bias, int N, int E, int k,
                                 bool sigmoid, bool norm_topk);
  // The permutation (Note [Expert capacity] in src/model/moe.h): pos[N,k] each choice's row in
  // expert order (token order, then choice; at most `cap` rows an expert; -1: dropped),
  // send_token[M] each row's token. Its summary, for the host: counts[2E] = the choices per
  // expert before drops | the rows kept; sums[E+1] = Σₜ probs[t,i] | Σₜ lse[t]² (double, in
  // token order). hf_count[E], when not null, += the choices per expert.
  virtual void moe_permute(int32_t* pos, int32_t* send_token, int32_t* counts, double* sums,
                           int32_t* hf_count, const int32_t* top, const float* probs,
                           const float* lse, int N, int E, int k, int cap);
  // rows[r,:] = x[send_token[r],:] for the M sent rows.
  virtual void moe_gather_rows(float* rows, const float* x, const int32_t* send_token, int M,
                               int C);
  // out[t,:] = gate[t]·shared[t,:] + Σⱼ topw[t,j]·ys[pos[t,j],:] over kept choices in choice
  // order (assign; shared null: no shared term; gate null: 1).
  virtual void moe_combine_forward(float* out, const float* ys, const float* shared,
                                   const float* gate, const int32_t* pos, const float* topw, int N,
                                   int C, int k);
  // dys[pos[t,j],:] = topw[t,j]·dout[t,:]; dtopw[t,j] = dout[t,:]·ys[pos[t,j],:], 0 when dropped
  // (assign).
  virtual void moe_combine_backward(float* dys, float* dtopw, const float* dout, const float* ys,
                                    const int32_t* pos, const float* topw, int N, int C, int k);
  // dx[t,:] += Σⱼ dxs[pos[t,j],:] over kept choices (the un-permutation; accumulates).
  virtual void moe_scatter_add(float* dx, const float* dxs, const int32_t* pos, int N, int C,
                               int k);
  // dlogits[N,E] (assign) from the combine weights' gradients dtopw, the load-balancing term
  // d aux/d pᵢ = aux_num · aux_count[i] / aux_den · loss_scale for every token (aux_count null:
  // none), and the z-loss's z2 · lse[t] / N · loss_scale · pᵢ (z2 = 2·z_coeff; 0: none).
  virtual void moe_route_backward(float* dlogits, const float* dtopw, const float* probs,
                                  const float* lse, const int32_t* top, const float* topw,
                                  const int32_t* aux_count, double aux_num, double aux_den,
                                  double z2, double loss_scale, int N, int E, int k, bool sigmoid,
                                  bool norm_topk);
  // out = 1 / (1 + exp(-inp)), elementwise (the shared experts' gate).
  virtual void sigmoid_forward(float* out, const float* inp, size_t n);
  // The gate's backward: dy[t,:] = gate[t]·dout[t,:]; dgate[t] = (dout[t,:]·y[t,:])·g(1 − g)
  // with g = gate[t] (assign; the pre-sigmoid gradient).
  virtual void moe_gate_backward(float* dgate, float* dy, const float* dout, const float* y,
                                 const float* gate, int N, int C);

  // --- bf16 activations (Note [bf16 activations] in src/backend/bf16_ops.cpp) -------------
  // The ops of the model's bf16 path (GPTOptions::precision): activations that feed GEMMs,
  // attention and GELU are bf16; the residual stream, its gradient (plus a bf16 copy for the
  // GEMMs), LayerNorm statistics, losses, weights and weight gradients stay fp32. Each op means
  // its fp32 op on the widened bf16 inputs, every bf16 output rounded once (to nearest even)
  // at the end, fp32 accumulation throughout. The definitions here compute exactly that on the
  // host (slowly: they are the CPU twin the device kernels are tested against, and the CPU
  // model tests' bf16 runs); a device backend overrides every one. Gradient rules as above.
  // out = bf16(inp)
  virtual void cast_to_bf16(bfloat16* out, const float* inp, size_t n);
  // out = float(inp), exact: where the bf16 path hands a tensor to an fp32 op
  // (Note [Widening at the bf16 boundary] in src/model/gpt_bf16_widen.cpp).
  virtual void cast_to_fp32(float* out, const bfloat16* inp, size_t n);
  // adamw_update, then params16 = bf16(params): the GEMMs' copy of the weights written in the
  // optimizer's pass (no cast pass per micro-batch; GPT::params16).
  virtual void adamw_update_bf16(float* params, bfloat16* params16, float* m, float* v,
                                 const float* grads, size_t n, float lr, float beta1, float beta2,
                                 float eps, float weight_decay, int t, float grad_scale);
  virtual void layernorm_forward_bf16(bfloat16* out, float* mean, float* rstd, const float* inp,
                                      const float* w, const float* b, int N, int C);
  // dresidual += LayerNorm's input gradient for dout = d(out) (the residual stream's
  // gradient collects it in place); then dresidual16 = bf16(dresidual) when non-null (the copy
  // the next GEMMs read); dw += ...; db += ...
  virtual void layernorm_backward_add_bf16(float* dresidual, bfloat16* dresidual16, float* dw,
                                           float* db, const bfloat16* dout, const float* inp,
                                           const float* w, const float* mean, const float* rstd,
                                           int N, int C);
  // out[N,OC] = bf16(inp · wᵀ + bias) (bias fp32, may be null).
  virtual void matmul_forward_bf16(bfloat16* out, const bfloat16* inp, const bfloat16* w,
                                   const float* bias, int N, int C, int OC);
  // out[N,OC] = residual + inp · wᵀ + bias, in fp32 (out may alias residual): a row-parallel
  // linear layer and the residual add after it in one op. A null residual adds nothing: the
  // fp32 partial sum a row-parallel linear reduces over tp first (Note [bf16 with tp]).
  virtual void matmul_forward_add_bf16(float* out, const float* residual, const bfloat16* inp,
                                       const bfloat16* w, const float* bias, int N, int C, int OC);
  // dinp[N,C] = dout · w in fp32 (assign): a column-parallel linear's input gradient, a partial
  // sum reduced over tp before its one rounding (Note [bf16 with tp]).
  virtual void matmul_backward_input_fp32_bf16(float* dinp, const bfloat16* dout, const bfloat16* w,
                                               int N, int C, int OC);
  // dinp = bf16(dout · w); dw += doutᵀ · inp; dbias += column sums of dout. Null: skipped.
  virtual void matmul_backward_bf16(bfloat16* dinp, float* dw, float* dbias, const bfloat16* dout,
                                    const bfloat16* inp, const bfloat16* w, int N, int C, int OC);
  // The MLP's first linear layer and its GELU in one op (cuBLASLt's GELU_AUX_BIAS epilogue):
  // with y = inp · wᵀ + bias in fp32, pre[N,OC] = bf16(y) (backward's GELU input) and
  // out[N,OC] = bf16(gelu(y)), the GELU taken before the rounding.
  virtual void matmul_gelu_forward_bf16(bfloat16* out, bfloat16* pre, const bfloat16* inp,
                                        const bfloat16* w, const float* bias, int N, int C, int OC);
  // The input gradient of the layer after the GELU, through the GELU (DGELU_BGRAD): with
  // g = gelu'(pre) ⊙ (dout · w) in fp32, dpre[N,C] = bf16(g) and, when non-null,
  // dbias[C] += the column sums of g (the bias gradient of the layer before the GELU).
  virtual void matmul_dgelu_backward_bf16(bfloat16* dpre, float* dbias, const bfloat16* dout,
                                          const bfloat16* w, const bfloat16* pre, int N, int C,
                                          int OC);
  // As attention_forward/backward (the same `att` and scratch sizes), on bf16 q|k|v.
  virtual void attention_forward_bf16(bfloat16* out, float* att, const bfloat16* qkv, int B, int T,
                                      int C, int NH);
  virtual void attention_backward_bf16(bfloat16* dqkv, float* scratch, const bfloat16* dout,
                                       const bfloat16* qkv, const bfloat16* out, const float* att,
                                       int B, int T, int C, int NH);
  virtual void gelu_forward_bf16(bfloat16* out, const bfloat16* inp, size_t n);
  virtual void gelu_backward_bf16(bfloat16* dinp, const bfloat16* inp, const bfloat16* dout,
                                  size_t n);
  // The families' ops on the bf16 path (src/backend/bf16_family_ops.cpp), each its fp32 family
  // op above under the same rule. A device backend that overrides them says so here (the model
  // refuses a family's bf16 path where this is false). RMSNorm, as LayerNorm's:
  virtual bool has_bf16_family_ops() const { return !is_device(); }
  virtual void rmsnorm_forward_bf16(bfloat16* out, float* rstd, const float* inp, const float* w,
                                    int N, int C, float eps);
  virtual void rmsnorm_backward_add_bf16(float* dresidual, bfloat16* dresidual16, float* dw,
                                         const bfloat16* dout, const float* inp, const float* w,
                                         const float* rstd, int N, int C);
  // RoPE in place on bf16 q|k|v (or its gradient), the fp32 tables: rope_forward/backward,
  // each rotated value rounded once (the rest are unchanged: widening then rounding is exact).
  virtual void rope_forward_bf16(bfloat16* qkv, const float* cos, const float* sin, int N, int T,
                                 int NH, int KVH, int hs, int rot);
  virtual void rope_backward_bf16(bfloat16* dqkv, const float* cos, const float* sin, int N, int T,
                                  int NH, int KVH, int hs, int rot);
  // SwiGLU on bf16 gate | up [N, 2F] → [N, F]; backward assigns dinp [N, 2F].
  virtual void swiglu_forward_bf16(bfloat16* out, const bfloat16* inp, int N, int F);
  virtual void swiglu_backward_bf16(bfloat16* dinp, const bfloat16* inp, const bfloat16* dout,
                                    int N, int F);
  // Exact (erf) GELU, elementwise.
  virtual void gelu_erf_forward_bf16(bfloat16* out, const bfloat16* inp, size_t n);
  virtual void gelu_erf_backward_bf16(bfloat16* dinp, const bfloat16* inp, const bfloat16* dout,
                                      size_t n);
  // attention_forward_gqa/backward_gqa on bf16 q|k|v. With KVH == NH these are
  // attention_forward_bf16/backward_bf16 (which a device overrides), called as such.
  virtual void attention_forward_gqa_bf16(bfloat16* out, float* att, const bfloat16* qkv, int B,
                                          int T, int NH, int KVH, int hs);
  virtual void attention_backward_gqa_bf16(bfloat16* dqkv, float* scratch, const bfloat16* dout,
                                           const bfloat16* qkv, const bfloat16* out,
                                           const float* att, int B, int T, int NH, int KVH, int hs);
  // The fused classifier: from bf16 logits [N,Vp], losses[n] = -log softmax(logits)[target]
  // (fp32) and, in the same pass, in place, logits = bf16(dloss · (probs - onehot(target)))
  // (padded columns 0). Forward and backward of the loss at once: the probabilities are never
  // stored in bf16 (p ≈ 1 would round to 1 and lose the target's gradient).
  virtual void crossentropy_fused_bf16(float* losses, bfloat16* logits_to_dlogits,
                                       const int32_t* targets, float dloss, int N, int V, int Vp);

  // *acc += float((Σ x, in double) / n), with acc a double in backend memory: a micro-batch's
  // mean loss, rounded to float as forward() returns it, kept on a device until the step ends
  // (GPT::forward_accumulate). The definition here sums in order.
  virtual void add_mean(double* acc, const float* x, size_t n) {
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += x[i];
    *acc += double(float(sum / double(n)));
  }
  // Σ x² in double (for the global gradient norm).
  virtual double sum_squares(const float* x, size_t n) = 0;
  // out[i] = Σ xs[i]² over ns[i] elements, for i < count (host out): the norm's per-tensor
  // sums with tp or pp > 1. A device waits once for all of them, where sum_squares waits per
  // call. The default calls sum_squares for each, in order.
  virtual void sum_squares_each(const float* const* xs, const size_t* ns, size_t count,
                                double* out) {
    for (size_t i = 0; i < count; ++i) out[i] = sum_squares(xs[i], ns[i]);
  }
  // AdamW step t (1-based) with decoupled weight decay on params[n], on the gradients times
  // grad_scale (global-norm clipping folded into the update's pass: grads stay unchanged).
  virtual void adamw_update(float* params, float* m, float* v, const float* grads, size_t n,
                            float lr, float beta1, float beta2, float eps, float weight_decay,
                            int t, float grad_scale) = 0;

  // Measured peak of this backend's GEMM (FLOP/s) at its thread count: the MFU denominator.
  // Careful (bench: several runs, seconds); the brief one is train's (a few hundred ms).
  virtual double measure_gemm_peak_flops() = 0;
  virtual double measure_gemm_peak_flops_brief() { return measure_gemm_peak_flops(); }
  // The vendor's dense peak for the backend's compute type (FLOP/s), 0 if none applies (CPU).
  virtual double nominal_peak_flops() const { return 0.0; }
  // Which attention path ran, in words, once it has run (and, where the preferred one refused
  // the shape, its reason): "" on backends with one path.
  virtual std::string attention_note() const { return {}; }

  // Note [Backend memory]
  // Every pointer given to the ops above lives in memory the backend allocated: host memory on
  // the CPU; on CUDA device memory, which the host reaches only through copy() or a HostView.
  // The ops run asynchronously, in order, on one stream; copy() and fill_zero() are ordered with
  // them, and a copy to host memory has completed when copy() returns. So the same model code
  // runs on either backend, and no host code reads device memory by accident.
  //
  // allocate() returns zeroed, 256-byte-aligned memory; copy() takes host or backend pointers
  // on either side.
  virtual void* allocate(size_t bytes);
  virtual void release(void* p) noexcept;
  virtual void copy(void* dst, const void* src, size_t bytes);
  virtual void fill_zero(void* p, size_t bytes);
  // Memory this backend could still allocate, in bytes (host: the kernel's MemAvailable, shared
  // by every rank on the machine; CUDA: the device's free memory); 0 if unknown.
  virtual size_t free_memory_bytes() const;
  // Note [Snapshots to the host]
  // An asynchronous checkpoint copies what it saves into host buffers allocated once, then
  // writes them while training goes on. A host backend copies on the calling thread (a memcpy;
  // the writer's, Note [Deferred host snapshot]): on return the copy is made. A device backend
  // copies into pinned host memory on a copy stream, after the ops issued so far and before any
  // issued later; the host does not wait, and the writer waits in finish_host_snapshot.
  virtual void* allocate_host_snapshot(size_t bytes);  // every page touched
  virtual void release_host_snapshot(void* p) noexcept;
  virtual void start_host_snapshot(void* dst, const void* src, size_t bytes);
  virtual void finish_host_snapshot() {}  // callable from another thread
  // Waits until every op issued so far has finished; afterwards the host may touch buffers.
  virtual void synchronize() {}
  // True when ops run asynchronously on a device (the host must synchronize() before reading).
  virtual bool is_device() const { return false; }

  // Profiling: a named range of ops (NVTX on CUDA; nothing on the CPU). Nesting is allowed.
  virtual void push_range(const char* name) { (void)name; }
  virtual void pop_range() {}
  // With op timing on, a device backend measures every op's device time (CUDA events around
  // it) and every range's (push_range/pop_range: the model's layer phases). The take_*
  // calls wait for the device and return the sums since the last call, per kind, largest
  // first: per op kind ("matmul fwd", "attention bwd", ...), and per kind of layer (the range's
  // name without its block number: "forward block 3" → "forward block"). Host backends
  // measure nothing and return empty lists.
  struct DeviceTime {
    std::string kind;
    double ms = 0;  // all spans of this kind together
    int count = 0;
  };
  virtual void set_op_timing(bool on) { (void)on; }
  virtual std::vector<DeviceTime> take_op_times_ms() { return {}; }
  virtual std::vector<DeviceTime> take_range_times_ms() { return {}; }

 protected:
  // The default of an op this backend does not have.
  [[noreturn]] void refuse(const char* op) const {
    internal_error(__FILE__, __LINE__, std::string(op) + ": not on the " + name() + " backend");
  }
};

// A typed array in backend memory (Note [Backend memory]); an empty one owns nothing.
template <typename T>
class BackendBuffer {
 public:
  BackendBuffer() = default;
  BackendBuffer(Backend& be, size_t n)
      : be_(&be), n_(n), p_(n ? static_cast<T*>(be.allocate(n * sizeof(T))) : nullptr) {}
  BackendBuffer(BackendBuffer&& o) noexcept { swap(o); }
  BackendBuffer& operator=(BackendBuffer&& o) noexcept {
    BackendBuffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;
  ~BackendBuffer() {
    if (p_) be_->release(p_);
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }

 private:
  void swap(BackendBuffer& o) noexcept {
    std::swap(be_, o.be_);
    std::swap(n_, o.n_);
    std::swap(p_, o.p_);
  }
  Backend* be_ = nullptr;
  size_t n_ = 0;
  T* p_ = nullptr;
};

// Host access to n values of backend memory (Note [Backend memory]): the memory itself on a host
// backend; on a device backend a zeroed host copy, filled from the device first when `load`,
// and written back by commit().
template <typename T>
class HostView {
 public:
  HostView(Backend& be, T* p, size_t n, bool load) : be_(be), p_(p), n_(n) {
    if (!be.is_device()) return;
    copy_.assign(n, T{});
    if (load) {
      be.copy(copy_.data(), p, n * sizeof(T));
      be.synchronize();
    }
  }
  T* data() { return be_.is_device() ? copy_.data() : p_; }
  size_t size() const { return n_; }
  void commit() {
    if (!be_.is_device()) return;
    be_.copy(p_, copy_.data(), n_ * sizeof(T));
    be_.synchronize();
  }

 private:
  Backend& be_;
  T* p_;
  size_t n_;
  std::vector<std::remove_const_t<T>> copy_;
};

// CPU backend: OpenBLAS for the GEMMs, vectorised OpenMP loops for the rest (src/backend/).
// `threads` (>= 1) is the OpenMP team size of every op; each GEMM is split across that team with
// OpenBLAS itself single-threaded (Note [GEMM threading] in src/backend/gemm.cpp). Results are
// bitwise reproducible for a fixed thread count.
std::unique_ptr<Backend> make_cpu_backend(int threads);

// A counting backend (Note [Memory plan] in src/backend/counting_backend.cpp): allocate() only adds
// the bytes to *bytes (rounded as the real one rounds) and returns addresses that must never be
// touched; it answers the real backend's sizing questions and refuses every op. Build a model
// on it to learn what it would allocate on `real`.
std::unique_ptr<Backend> make_counting_backend(const Backend& real, size_t* bytes);

}  // namespace trident
