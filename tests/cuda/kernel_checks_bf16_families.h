// Checks of the CUDA backend's bf16 family ops (the bf16 instances of kernels/rmsnorm.cu, rope.cu,
// swiglu.cu, elementwise.cu, and the bf16 GQA attention) against their CPU twins
// (src/backend/bf16_family_ops.cpp), as kernel_checks_bf16.h checks GPT-2's, with its tolerances: a
// bf16 output within one bf16 ulp of the twin's plus kFp32Tol of the tensor's scale (the two fp32
// values before rounding differ by the fp32 kernels' rounding, kernel_checks.h); fp32 outputs
// (rstd, the residual gradient, dw) within kFp32Tol; attention as check_attention_bf16 (cuDNN keeps
// P and dS in bf16: kBf16Tol).
#pragma once

#include <string>
#include <vector>

#include "kernel_checks_bf16.h"

namespace trident::testing {

inline Errors check_rmsnorm_forward_bf16(Backend& gpu, int N, int C, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<float> inp = random_floats(size_t(N) * C, rng, -2.0, 3.0);
  const std::vector<float> w = random_floats(C, rng);
  std::vector<bfloat16> out(size_t(N) * C);
  std::vector<float> rstd(N);
  cpu_twin()->rmsnorm_forward_bf16(out.data(), rstd.data(), inp.data(), w.data(), N, C, 1e-6f);
  BackendBuffer<float> d_inp = upload(gpu, inp), d_w = upload(gpu, w);
  BackendBuffer<float> d_rstd = poisoned<float>(gpu, N);
  BackendBuffer<bfloat16> d_out = poisoned<bfloat16>(gpu, out.size());
  gpu.rmsnorm_forward_bf16(d_out.data(), d_rstd.data(), d_inp.data(), d_w.data(), N, C, 1e-6f);
  return {{"out_ulps", bf16_ulp_err(download(gpu, d_out.data(), out.size()), out, kFp32Tol), 1.0},
          {"rstd", err_vs(download(gpu, d_rstd.data(), N), rstd), kFp32Tol}};
}

// rstd from the CPU's forward; dresidual and dw start from the same random values. With the
// copy, its bits are also checked against the rounding of the GPU's own dresidual.
inline Errors check_rmsnorm_backward_add_bf16(Backend& gpu, int N, int C, bool with_copy,
                                              uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t n = size_t(N) * C;
  const std::vector<float> inp = random_floats(n, rng, -2.0, 3.0), w = random_floats(C, rng);
  const std::vector<bfloat16> dout = random_bf16(n, rng);
  std::vector<float> dres = random_floats(n, rng), dw = random_floats(C, rng);
  std::vector<float> rstd(N), out(n);
  const std::unique_ptr<Backend> cpu = cpu_twin();
  cpu->rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), N, C, 1e-5f);
  BackendBuffer<float> d_dres = upload(gpu, dres), d_dw = upload(gpu, dw), d_inp = upload(gpu, inp),
                       d_w = upload(gpu, w), d_rstd = upload(gpu, rstd);
  BackendBuffer<bfloat16> d_dout = upload(gpu, dout), d_dres16 = poisoned<bfloat16>(gpu, n);
  std::vector<bfloat16> dres16(with_copy ? n : 0);
  cpu->rmsnorm_backward_add_bf16(dres.data(), with_copy ? dres16.data() : nullptr, dw.data(),
                                 dout.data(), inp.data(), w.data(), rstd.data(), N, C);
  gpu.rmsnorm_backward_add_bf16(d_dres.data(), with_copy ? d_dres16.data() : nullptr, d_dw.data(),
                                d_dout.data(), d_inp.data(), d_w.data(), d_rstd.data(), N, C);
  const std::vector<float> got_dres = download(gpu, d_dres.data(), n);
  Errors errors{{"dresidual", err_vs(got_dres, dres), kFp32Tol},
                {"dw", err_vs(download(gpu, d_dw.data(), C), dw), kFp32Tol}};
  if (with_copy) add_dresidual16_errors(errors, gpu, d_dres16.data(), got_dres, dres16);
  return errors;
}

// In place on q|k|v [N, (NH + 2·KVH)·hs], tables of real angles (base 10000).
inline Errors check_rope_bf16(Backend& gpu, int N, int T, int NH, int KVH, int hs, int rot,
                              bool backward, uint32_t seed) {
  std::mt19937 rng(seed);
  const int half = rot / 2;
  std::vector<float> cos(size_t(T) * half), sin(cos.size());
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < half; ++i) {
      const float angle = float(t) / std::pow(10000.0f, float(2 * i) / float(rot));
      cos[size_t(t) * half + i] = std::cos(angle);
      sin[size_t(t) * half + i] = std::sin(angle);
    }
  std::vector<bfloat16> x = random_bf16(size_t(N) * (NH + 2 * KVH) * hs, rng, -2.0, 2.0);
  BackendBuffer<bfloat16> d_x = upload(gpu, x);
  BackendBuffer<float> d_cos = upload(gpu, cos), d_sin = upload(gpu, sin);
  const std::unique_ptr<Backend> cpu = cpu_twin();
  if (backward) {
    cpu->rope_backward_bf16(x.data(), cos.data(), sin.data(), N, T, NH, KVH, hs, rot);
    gpu.rope_backward_bf16(d_x.data(), d_cos.data(), d_sin.data(), N, T, NH, KVH, hs, rot);
  } else {
    cpu->rope_forward_bf16(x.data(), cos.data(), sin.data(), N, T, NH, KVH, hs, rot);
    gpu.rope_forward_bf16(d_x.data(), d_cos.data(), d_sin.data(), N, T, NH, KVH, hs, rot);
  }
  return {{"qkv_ulps", bf16_ulp_err(download(gpu, d_x.data(), x.size()), x, kFp32Tol), 1.0}};
}

inline Errors check_swiglu_bf16(Backend& gpu, int N, int F, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<bfloat16> inp = random_bf16(size_t(N) * 2 * F, rng, -8.0, 8.0),
                              dout = random_bf16(size_t(N) * F, rng);
  std::vector<bfloat16> out(size_t(N) * F), dinp(inp.size());
  const std::unique_ptr<Backend> cpu = cpu_twin();
  cpu->swiglu_forward_bf16(out.data(), inp.data(), N, F);
  cpu->swiglu_backward_bf16(dinp.data(), inp.data(), dout.data(), N, F);
  BackendBuffer<bfloat16> d_inp = upload(gpu, inp), d_dout = upload(gpu, dout),
                          d_out = poisoned<bfloat16>(gpu, out.size()),
                          d_dinp = poisoned<bfloat16>(gpu, dinp.size());
  gpu.swiglu_forward_bf16(d_out.data(), d_inp.data(), N, F);
  gpu.swiglu_backward_bf16(d_dinp.data(), d_inp.data(), d_dout.data(), N, F);
  return {
      {"out_ulps", bf16_ulp_err(download(gpu, d_out.data(), out.size()), out, kFp32Tol), 1.0},
      {"dinp_ulps", bf16_ulp_err(download(gpu, d_dinp.data(), dinp.size()), dinp, kFp32Tol), 1.0}};
}

inline Errors check_gelu_erf_bf16(Backend& gpu, size_t n, size_t offset, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<bfloat16> inp = random_bf16(n, rng, -8.0, 8.0), dout = random_bf16(n, rng);
  std::vector<bfloat16> out(n), dinp(n);
  const std::unique_ptr<Backend> cpu = cpu_twin();
  cpu->gelu_erf_forward_bf16(out.data(), inp.data(), n);
  cpu->gelu_erf_backward_bf16(dinp.data(), inp.data(), dout.data(), n);
  BackendBuffer<bfloat16> d_inp = upload(gpu, inp, offset), d_dout = upload(gpu, dout, offset),
                          d_out = poisoned<bfloat16>(gpu, n, offset),
                          d_dinp = poisoned<bfloat16>(gpu, n, offset);
  gpu.gelu_erf_forward_bf16(d_out.data() + offset, d_inp.data() + offset, n);
  gpu.gelu_erf_backward_bf16(d_dinp.data() + offset, d_inp.data() + offset, d_dout.data() + offset,
                             n);
  return {
      {"out_ulps", bf16_ulp_err(download(gpu, d_out.data() + offset, n), out, kFp32Tol), 1.0},
      {"dinp_ulps", bf16_ulp_err(download(gpu, d_dinp.data() + offset, n), dinp, kFp32Tol), 1.0}};
}

// Grouped-query attention on bf16 q|k|v, forward and backward (the shared kv heads' gradients
// summed), as check_attention_bf16.
inline Errors check_attention_gqa_bf16(Backend& gpu, int B, int T, int NH, int KVH, int hs,
                                       uint32_t seed, std::string* path) {
  std::mt19937 rng(seed);
  const int C = NH * hs;
  const size_t n1 = size_t(B) * T * C, n3 = size_t(B) * T * (NH + 2 * KVH) * hs;
  const std::vector<bfloat16> qkv = random_bf16(n3, rng), dout = random_bf16(n1, rng);
  const std::unique_ptr<Backend> cpu = cpu_twin();
  std::vector<bfloat16> out(n1), dqkv(n3);
  std::vector<float> att(cpu->attention_saved_floats(B, T, C, NH)),
      scratch(cpu->attention_scratch_floats(B, T, C, NH));
  cpu->attention_forward_gqa_bf16(out.data(), att.data(), qkv.data(), B, T, NH, KVH, hs);
  cpu->attention_backward_gqa_bf16(dqkv.data(), scratch.data(), dout.data(), qkv.data(), out.data(),
                                   att.data(), B, T, NH, KVH, hs);
  BackendBuffer<bfloat16> d_qkv = upload(gpu, qkv), d_dout = upload(gpu, dout),
                          d_out = poisoned<bfloat16>(gpu, n1), d_dqkv = poisoned<bfloat16>(gpu, n3);
  BackendBuffer<float> d_att = poisoned<float>(gpu, gpu.attention_saved_floats(B, T, C, NH)),
                       d_scratch(gpu, gpu.attention_scratch_floats(B, T, C, NH));
  gpu.attention_forward_gqa_bf16(d_out.data(), d_att.data(), d_qkv.data(), B, T, NH, KVH, hs);
  gpu.attention_backward_gqa_bf16(d_dqkv.data(), d_scratch.data(), d_dout.data(), d_qkv.data(),
                                  d_out.data(), d_att.data(), B, T, NH, KVH, hs);
  const std::vector<bfloat16> got_out = download(gpu, d_out.data(), n1),
                              got_dqkv = download(gpu, d_dqkv.data(), n3);
  *path = gpu.attention_note();
  const bool cudnn = path->starts_with("cuDNN");
  return {cudnn ? OutputError{"out", rel_err_bf16(got_out, out), kBf16Tol}
                : OutputError{"out_ulps", bf16_ulp_err(got_out, out, kFp32Tol), 1.0},
          {"dqkv", rel_err_bf16(got_dqkv, dqkv), kBf16Tol}};
}

}  // namespace trident::testing
