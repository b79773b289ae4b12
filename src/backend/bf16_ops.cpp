// Note [bf16 activations]
// The model's bf16 path (GPTOptions::precision, run.precision) stores in bf16 what the tensor
// cores read (LayerNorm outputs, q|k|v, attention output, MLP hidden, logits, the input
// gradients that feed a GEMM), so GEMMs need no cast pass and those buffers move half the bytes.
// What accumulates stays fp32 (residual stream and its gradient, LayerNorm statistics, losses,
// master weights, weight gradients, AdamW moments): bf16's 8-bit mantissa would lose updates.
//
// The GEMMs read a bf16 copy of the weights (GPT::params16) that AdamW writes in its own pass
// (adamw_update_bf16); forward casts a block's only where the weights changed otherwise (ZeRO's
// gather, a load).
//
// Every bf16 op is defined as its fp32 op on the widened inputs (widening is exact), with each
// bf16 output rounded once at the end (to nearest, ties to even) and fp32 accumulation
// throughout. That is what a tensor-core GEMM with fp32 accumulation and a bf16 epilogue
// computes, up to the order of the sums, so these host definitions are the CPU twin of the
// device kernels (tests/cuda) and let the CPU run the model's bf16 path in tests. They widen
// into temporary fp32 buffers and call the backend's fp32 ops: correct, not fast. The CPU
// refuses run.precision bf16 (it would only be slower than fp32); a device overrides them all.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/bf16_host.h"
#include "trident/backend.h"
#include "trident/check.h"

namespace trident {

using bf16_host::host_only;
using bf16_host::round_into;
using bf16_host::widen;

void Backend::cast_to_bf16(bfloat16* out, const float* inp, size_t n) {
  host_only(*this, __func__);
  round_into(out, inp, n);
}

void Backend::cast_to_fp32(float* out, const bfloat16* inp, size_t n) {
  host_only(*this, __func__);
  for (size_t i = 0; i < n; ++i) out[i] = to_float(inp[i]);
}

void Backend::adamw_update_bf16(float* params, bfloat16* params16, float* m, float* v,
                                const float* grads, size_t n, float lr, float beta1, float beta2,
                                float eps, float weight_decay, int t, float grad_scale) {
  host_only(*this, __func__);
  adamw_update(params, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale);
  round_into(params16, params, n);
}

void Backend::layernorm_forward_bf16(bfloat16* out, float* mean, float* rstd, const float* inp,
                                     const float* w, const float* b, int N, int C) {
  host_only(*this, __func__);
  std::vector<float> y(size_t(N) * C);
  layernorm_forward(y.data(), mean, rstd, inp, w, b, N, C);
  round_into(out, y.data(), y.size());
}

void Backend::layernorm_backward_add_bf16(float* dresidual, bfloat16* dresidual16, float* dw,
                                          float* db, const bfloat16* dout, const float* inp,
                                          const float* w, const float* mean, const float* rstd,
                                          int N, int C) {
  host_only(*this, __func__);
  const size_t n = size_t(N) * C;
  const std::vector<float> d = widen(dout, n);
  std::vector<float> dinp(n);
  layernorm_backward(dinp.data(), dw, db, d.data(), inp, w, mean, rstd, N, C);
  add(dresidual, dresidual, dinp.data(), n);
  if (dresidual16) round_into(dresidual16, dresidual, n);
}

void Backend::matmul_forward_bf16(bfloat16* out, const bfloat16* inp, const bfloat16* w,
                                  const float* bias, int N, int C, int OC) {
  host_only(*this, __func__);
  const std::vector<float> x = widen(inp, size_t(N) * C), wf = widen(w, size_t(OC) * C);
  std::vector<float> y(size_t(N) * OC);
  matmul_forward(y.data(), x.data(), wf.data(), bias, N, C, OC);
  round_into(out, y.data(), y.size());
}

void Backend::matmul_forward_add_bf16(float* out, const float* residual, const bfloat16* inp,
                                      const bfloat16* w, const float* bias, int N, int C, int OC) {
  host_only(*this, __func__);
  const std::vector<float> x = widen(inp, size_t(N) * C), wf = widen(w, size_t(OC) * C);
  std::vector<float> y(size_t(N) * OC);
  matmul_forward(y.data(), x.data(), wf.data(), bias, N, C, OC);
  if (residual) add(out, residual, y.data(), y.size());
  else std::memcpy(out, y.data(), y.size() * sizeof(float));
}

void Backend::matmul_backward_input_fp32_bf16(float* dinp, const bfloat16* dout, const bfloat16* w,
                                              int N, int C, int OC) {
  host_only(*this, __func__);
  const std::vector<float> d = widen(dout, size_t(N) * OC), wf = widen(w, size_t(OC) * C);
  matmul_backward(dinp, nullptr, nullptr, d.data(), nullptr, wf.data(), N, C, OC);
}

void Backend::matmul_backward_bf16(bfloat16* dinp, float* dw, float* dbias, const bfloat16* dout,
                                   const bfloat16* inp, const bfloat16* w, int N, int C, int OC) {
  host_only(*this, __func__);
  const std::vector<float> d = widen(dout, size_t(N) * OC);
  const std::vector<float> x = dw ? widen(inp, size_t(N) * C) : std::vector<float>();
  const std::vector<float> wf = dinp ? widen(w, size_t(OC) * C) : std::vector<float>();
  std::vector<float> dx(dinp ? size_t(N) * C : 0);
  matmul_backward(dinp ? dx.data() : nullptr, dw, dbias, d.data(), dw ? x.data() : nullptr,
                  dinp ? wf.data() : nullptr, N, C, OC);
  if (dinp) round_into(dinp, dx.data(), dx.size());
}

void Backend::matmul_gelu_forward_bf16(bfloat16* out, bfloat16* pre, const bfloat16* inp,
                                       const bfloat16* w, const float* bias, int N, int C, int OC) {
  host_only(*this, __func__);
  const size_t n = size_t(N) * OC;
  const std::vector<float> x = widen(inp, size_t(N) * C), wf = widen(w, size_t(OC) * C);
  std::vector<float> y(n), g(n);
  matmul_forward(y.data(), x.data(), wf.data(), bias, N, C, OC);
  gelu_forward(g.data(), y.data(), n);
  round_into(pre, y.data(), n);
  round_into(out, g.data(), n);
}

void Backend::matmul_dgelu_backward_bf16(bfloat16* dpre, float* dbias, const bfloat16* dout,
                                         const bfloat16* w, const bfloat16* pre, int N, int C,
                                         int OC) {
  host_only(*this, __func__);
  const size_t n = size_t(N) * C;
  const std::vector<float> d = widen(dout, size_t(N) * OC), wf = widen(w, size_t(OC) * C);
  const std::vector<float> x = widen(pre, n);
  std::vector<float> t(n), g(n);
  matmul_backward(t.data(), nullptr, nullptr, d.data(), nullptr, wf.data(), N, C, OC);
  gelu_backward(g.data(), x.data(), t.data(), n);
  round_into(dpre, g.data(), n);
  // The column sums of g, as matmul_backward sums a layer's dout into its bias gradient.
  if (dbias) matmul_backward(nullptr, nullptr, dbias, g.data(), nullptr, nullptr, N, OC, C);
}

void Backend::attention_forward_bf16(bfloat16* out, float* att, const bfloat16* qkv, int B, int T,
                                     int C, int NH) {
  host_only(*this, __func__);
  const size_t n = size_t(B) * T * C;
  const std::vector<float> q = widen(qkv, 3 * n);
  std::vector<float> y(n);
  attention_forward(y.data(), att, q.data(), B, T, C, NH);
  round_into(out, y.data(), n);
}

void Backend::attention_backward_bf16(bfloat16* dqkv, float* scratch, const bfloat16* dout,
                                      const bfloat16* qkv, const bfloat16* out, const float* att,
                                      int B, int T, int C, int NH) {
  host_only(*this, __func__);
  const size_t n = size_t(B) * T * C;
  const std::vector<float> d = widen(dout, n), q = widen(qkv, 3 * n), y = widen(out, n);
  std::vector<float> dq(3 * n);
  attention_backward(dq.data(), scratch, d.data(), q.data(), y.data(), att, B, T, C, NH);
  round_into(dqkv, dq.data(), dq.size());
}

void Backend::gelu_forward_bf16(bfloat16* out, const bfloat16* inp, size_t n) {
  host_only(*this, __func__);
  const std::vector<float> x = widen(inp, n);
  std::vector<float> y(n);
  gelu_forward(y.data(), x.data(), n);
  round_into(out, y.data(), n);
}

void Backend::gelu_backward_bf16(bfloat16* dinp, const bfloat16* inp, const bfloat16* dout,
                                 size_t n) {
  host_only(*this, __func__);
  const std::vector<float> x = widen(inp, n), d = widen(dout, n);
  std::vector<float> dx(n);
  gelu_backward(dx.data(), x.data(), d.data(), n);
  round_into(dinp, dx.data(), n);
}

void Backend::crossentropy_fused_bf16(float* losses, bfloat16* logits_to_dlogits,
                                      const int32_t* targets, float dloss, int N, int V, int Vp) {
  host_only(*this, __func__);
  std::vector<float> x = widen(logits_to_dlogits, size_t(N) * Vp);
  crossentropy_forward(losses, x.data(), targets, N, V, Vp);
  crossentropy_backward(x.data(), targets, dloss, N, V, Vp);
  round_into(logits_to_dlogits, x.data(), x.size());
}

}  // namespace trident
