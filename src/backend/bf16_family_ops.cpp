// The model families' bf16 ops (RMSNorm, RoPE, SwiGLU, exact GELU, grouped-query attention):
// host definitions by Note [bf16 activations]'s rule, each the fp32 family op on the widened
// inputs with every bf16 output rounded once: the CPU twins of the bf16 instances of
// kernels/rmsnorm.cu, rope.cu, swiglu.cu, elementwise.cu and the CUDA backend's bf16 GQA attention
// (tests/cuda/test_kernels_bf16_families.cpp).
//
// Exact GELU is its own elementwise op after matmul_forward_bf16, not an erf variant of
// matmul_gelu_forward_bf16: cuBLASLt's GELU epilogues are the tanh form, so a fused erf op
// would be a GEMM plus a pass on the device anyway, and SwiGLU (which no epilogue has) takes
// the same unfused path, one code path for both.
#include <vector>

#include "backend/bf16_host.h"
#include "trident/backend.h"

namespace trident {

using bf16_host::host_only;
using bf16_host::round_into;
using bf16_host::widen;

void Backend::rmsnorm_forward_bf16(bfloat16* out, float* rstd, const float* inp, const float* w,
                                   int N, int C, float eps) {
  host_only(*this, __func__);
  std::vector<float> y(size_t(N) * C);
  rmsnorm_forward(y.data(), rstd, inp, w, N, C, eps);
  round_into(out, y.data(), y.size());
}

void Backend::rmsnorm_backward_add_bf16(float* dresidual, bfloat16* dresidual16, float* dw,
                                        const bfloat16* dout, const float* inp, const float* w,
                                        const float* rstd, int N, int C) {
  host_only(*this, __func__);
  const size_t n = size_t(N) * C;
  const std::vector<float> d = widen(dout, n);
  std::vector<float> dinp(n);
  rmsnorm_backward(dinp.data(), dw, d.data(), inp, w, rstd, N, C);
  add(dresidual, dresidual, dinp.data(), n);
  if (dresidual16) round_into(dresidual16, dresidual, n);
}

void Backend::rope_forward_bf16(bfloat16* qkv, const float* cos, const float* sin, int N, int T,
                                int NH, int KVH, int hs, int rot) {
  host_only(*this, __func__);
  const size_t n = size_t(N) * (NH + 2 * KVH) * hs;
  std::vector<float> x = widen(qkv, n);
  rope_forward(x.data(), cos, sin, N, T, NH, KVH, hs, rot);
  round_into(qkv, x.data(), n);
}

void Backend::rope_backward_bf16(bfloat16* dqkv, const float* cos, const float* sin, int N, int T,
                                 int NH, int KVH, int hs, int rot) {
  host_only(*this, __func__);
  const size_t n = size_t(N) * (NH + 2 * KVH) * hs;
  std::vector<float> d = widen(dqkv, n);
  rope_backward(d.data(), cos, sin, N, T, NH, KVH, hs, rot);
  round_into(dqkv, d.data(), n);
}

void Backend::swiglu_forward_bf16(bfloat16* out, const bfloat16* inp, int N, int F) {
  host_only(*this, __func__);
  const std::vector<float> x = widen(inp, size_t(N) * 2 * F);
  std::vector<float> y(size_t(N) * F);
  swiglu_forward(y.data(), x.data(), N, F);
  round_into(out, y.data(), y.size());
}

void Backend::swiglu_backward_bf16(bfloat16* dinp, const bfloat16* inp, const bfloat16* dout, int N,
                                   int F) {
  host_only(*this, __func__);
  const std::vector<float> x = widen(inp, size_t(N) * 2 * F), d = widen(dout, size_t(N) * F);
  std::vector<float> dx(x.size());
  swiglu_backward(dx.data(), x.data(), d.data(), N, F);
  round_into(dinp, dx.data(), dx.size());
}

void Backend::gelu_erf_forward_bf16(bfloat16* out, const bfloat16* inp, size_t n) {
  host_only(*this, __func__);
  const std::vector<float> x = widen(inp, n);
  std::vector<float> y(n);
  gelu_erf_forward(y.data(), x.data(), n);
  round_into(out, y.data(), n);
}

void Backend::gelu_erf_backward_bf16(bfloat16* dinp, const bfloat16* inp, const bfloat16* dout,
                                     size_t n) {
  host_only(*this, __func__);
  const std::vector<float> x = widen(inp, n), d = widen(dout, n);
  std::vector<float> dx(n);
  gelu_erf_backward(dx.data(), x.data(), d.data(), n);
  round_into(dinp, dx.data(), n);
}

void Backend::attention_forward_gqa_bf16(bfloat16* out, float* att, const bfloat16* qkv, int B,
                                         int T, int NH, int KVH, int hs) {
  if (KVH == NH) {  // the multi-head op, which a device backend has
    attention_forward_bf16(out, att, qkv, B, T, NH * hs, NH);
    return;
  }
  host_only(*this, __func__);
  const size_t rows = size_t(B) * T, q = size_t(NH) * hs;
  const std::vector<float> x = widen(qkv, rows * (NH + 2 * KVH) * hs);
  std::vector<float> y(rows * q);
  attention_forward_gqa(y.data(), att, x.data(), B, T, NH, KVH, hs);
  round_into(out, y.data(), y.size());
}

void Backend::attention_backward_gqa_bf16(bfloat16* dqkv, float* scratch, const bfloat16* dout,
                                          const bfloat16* qkv, const bfloat16* out,
                                          const float* att, int B, int T, int NH, int KVH, int hs) {
  if (KVH == NH) {
    attention_backward_bf16(dqkv, scratch, dout, qkv, out, att, B, T, NH * hs, NH);
    return;
  }
  host_only(*this, __func__);
  const size_t rows = size_t(B) * T, q = size_t(NH) * hs, qkv_n = rows * (NH + 2 * KVH) * hs;
  const std::vector<float> d = widen(dout, rows * q), x = widen(qkv, qkv_n);
  const std::vector<float> y = widen(out, rows * q);
  std::vector<float> dx(qkv_n);
  attention_backward_gqa(dx.data(), scratch, d.data(), x.data(), y.data(), att, B, T, NH, KVH, hs);
  round_into(dqkv, dx.data(), dx.size());
}

}  // namespace trident
