// The CPU backend's kernels, templated on the scalar type.
//
// CpuBackend runs them in float; the tests run the same code in double as the reference for
// finite-difference gradient checks. Semantics are those of include/trident/backend.h: argument
// order outputs, saved values, inputs, weights, sizes; weight gradients accumulate (+=),
// activation gradients assign (=). The last argument is the OpenMP thread count.
// Definitions live in one .cpp per layer, instantiated for float and double there, so both are
// compiled with the backend's flags (-O3 -march=native) whoever calls them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace trident::cpu {

// ---- encoder.cpp
template <typename Real>
void encoder_forward(Real* out, const int32_t* tokens, const Real* wte, const Real* wpe, int B,
                     int T, int C, int threads);
template <typename Real>
void encoder_backward(Real* dwte, Real* dwpe, const Real* dout, const int32_t* tokens, int B, int T,
                      int C, int threads);

// ---- layernorm.cpp (eps = 1e-5); b, dw and db may be null (b: LayerNorm without a shift)
template <typename Real>
void layernorm_forward(Real* out, Real* mean, Real* rstd, const Real* inp, const Real* w,
                       const Real* b, int N, int C, int threads);
template <typename Real>
void layernorm_backward(Real* dinp, Real* dw, Real* db, const Real* dout, const Real* inp,
                        const Real* w, const Real* mean, const Real* rstd, int N, int C,
                        int threads);

// ---- matmul.cpp: out[N,OC] = inp[N,C] · w[OC,C]ᵀ + bias (bias, dinp, dbias may be null)
template <typename Real>
void matmul_forward(Real* out, const Real* inp, const Real* w, const Real* bias, int N, int C,
                    int OC, int threads);
template <typename Real>
void matmul_backward(Real* dinp, Real* dw, Real* dbias, const Real* dout, const Real* inp,
                     const Real* w, int N, int C, int OC, int threads);
// matmul_backward's dw GEMM on rows [r, r + rows) of dw: dw, dout offset by the caller, dout's
// rows ld apart (Backend::matmul_backward_weight_rows).
template <typename Real>
void matmul_backward_weight_rows(Real* dw, const Real* dout, int ld, const Real* inp, int N, int C,
                                 int rows, int threads);
// ---- gemm.cpp: the experts' products in one team (Backend::matmul_forward_grouped and
// Note [Grouped GEMM] in src/backend/gemm.cpp): expert e on rows [rows_at[e], rows_at[e + 1]),
// weight w + e·OC·C. dinp or dw may be null.
template <typename Real>
void matmul_forward_grouped(Real* out, const Real* inp, const Real* w, const int32_t* rows_at,
                            int E, int C, int OC, int threads);
template <typename Real>
void matmul_backward_grouped(Real* dinp, Real* dw, const Real* dout, const Real* inp, const Real* w,
                             const int32_t* rows_at, int E, int C, int OC, int threads);

// ---- rmsnorm.cpp: out = inp · rstd · w (Backend::rmsnorm_forward); dw may be null
template <typename Real>
void rmsnorm_forward(Real* out, Real* rstd, const Real* inp, const Real* w, int N, int C, Real eps,
                     int threads);
template <typename Real>
void rmsnorm_backward(Real* dinp, Real* dw, const Real* dout, const Real* inp, const Real* w,
                      const Real* rstd, int N, int C, int threads);

// ---- rope.cpp: rotary embedding in place on q|k|v rows [N, (NH + 2·KVH)·hs], tables [T, rot/2]
template <typename Real>
void rope_forward(Real* qkv, const Real* cos, const Real* sin, int N, int T, int NH, int KVH,
                  int hs, int rot, int threads);
template <typename Real>
void rope_backward(Real* dqkv, const Real* cos, const Real* sin, int N, int T, int NH, int KVH,
                   int hs, int rot, int threads);

// ---- swiglu.cpp: out[N,F] = silu(gate) · up, inp rows gate[F] | up[F]
template <typename Real>
void swiglu_forward(Real* out, const Real* inp, int N, int F, int threads);
template <typename Real>
void swiglu_backward(Real* dinp, const Real* inp, const Real* dout, int N, int F, int threads);

// ---- attention.cpp: causal attention, att [B,NH,T,T]. qkv [B,T,(NH + 2·KVH)·hs] with KVH kv
// heads (Backend::attention_forward_gqa); the multi-head forms take qkv [B,T,3C], KVH = NH.
template <typename Real>
void attention_forward_gqa(Real* out, Real* att, const Real* qkv, int B, int T, int NH, int KVH,
                           int hs, int threads);
template <typename Real>
void attention_backward_gqa(Real* dqkv, Real* scratch, const Real* dout, const Real* qkv,
                            const Real* att, int B, int T, int NH, int KVH, int hs, int threads);
template <typename Real>
void attention_forward(Real* out, Real* att, const Real* qkv, int B, int T, int C, int NH,
                       int threads);
template <typename Real>
void attention_backward(Real* dqkv, Real* scratch, const Real* dout, const Real* qkv,
                        const Real* att, int B, int T, int C, int NH, int threads);

// ---- attention_blockwise.cpp: causal attention by blocks, nothing T×T stored
// (Note [Attention blocks] in trident/backend.h, whose AttentionBlockArgs this mirrors for any
// Real).
template <typename Real>
struct AttentionBlockArgs {
  int B = 0, NH = 0, KVH = 0, hs = 0;
  int Tq = 0, Tk = 0;
  long q_pos = 0, k_pos = 0;
  const Real* q = nullptr;
  size_t q_bstride = 0, q_rstride = 0;
  const Real *k = nullptr, *v = nullptr;
  size_t kv_bstride = 0, kv_rstride = 0;
  Real* out = nullptr;
  const Real* dout = nullptr;
  size_t o_bstride = 0, o_rstride = 0;
  Real *lse = nullptr, *delta = nullptr;
  size_t s_bstride = 0, s_hstride = 0;
  Real* dq = nullptr;
  Real *dk = nullptr, *dv = nullptr;
};
// Forward merges into (out, lse); backward adds (+=) to dq, dk, dv; delta assigns
// rowsum(dout ⊙ out); reset sets lse to -inf. Each for the args' Tq query rows.
template <typename Real>
void attention_block_forward(const AttentionBlockArgs<Real>& a, int threads);
template <typename Real>
void attention_block_backward(const AttentionBlockArgs<Real>& a, int threads);
template <typename Real>
void attention_block_delta(const AttentionBlockArgs<Real>& a, int threads);
template <typename Real>
void attention_block_reset(const AttentionBlockArgs<Real>& a, int threads);
// attention_forward_gqa/backward_gqa as one block over all T: lse [B,NH,T] replaces att, delta
// [B,NH,T] is backward's scratch, out is forward's output; dqkv is assigned.
// The CPU backend runs the T×T op (attention.cpp) up to this T and the blockwise op beyond
// (Note [Blockwise attention threshold] in attention_blockwise.cpp).
constexpr int kTxTAttentionMaxT = 64;
template <typename Real>
void attention_forward_blockwise(Real* out, Real* lse, const Real* qkv, int B, int T, int NH,
                                 int KVH, int hs, int threads);
template <typename Real>
void attention_backward_blockwise(Real* dqkv, Real* delta, const Real* dout, const Real* qkv,
                                  const Real* out, const Real* lse, int B, int T, int NH, int KVH,
                                  int hs, int threads);

// ---- elementwise.cpp: tanh-GELU, exact (erf) GELU and add
template <typename Real>
void gelu_forward(Real* out, const Real* inp, size_t n, int threads);
template <typename Real>
void gelu_backward(Real* dinp, const Real* inp, const Real* dout, size_t n, int threads);
template <typename Real>
void gelu_erf_forward(Real* out, const Real* inp, size_t n, int threads);
template <typename Real>
void gelu_erf_backward(Real* dinp, const Real* inp, const Real* dout, size_t n, int threads);
template <typename Real>
void add(Real* out, const Real* a, const Real* b, size_t n, int threads);

// ---- crossentropy.cpp: softmax over the first V of Vp columns, in place
template <typename Real>
void crossentropy_forward(Real* losses, Real* logits_to_probs, const int32_t* targets, int N, int V,
                          int Vp, int threads);
template <typename Real>
void crossentropy_backward(Real* probs_to_dlogits, const int32_t* targets, Real dloss, int N, int V,
                           int Vp, int threads);

// ---- optimizer.cpp
template <typename Real>
double sum_squares(const Real* x, size_t n, int threads);
template <typename Real>
void adamw_update(Real* params, Real* m, Real* v, const Real* grads, size_t n, Real lr, Real beta1,
                  Real beta2, Real eps, Real weight_decay, int t, Real grad_scale, int threads);

}  // namespace trident::cpu
