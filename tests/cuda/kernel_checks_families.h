// Checks of the model families' kernels against their CPU twins: RMSNorm, RoPE, SwiGLU, exact
// GELU (see kernel_checks.h for the tolerances: each is fp32 on both sides, differing only by
// summation order and the fast-math exp, division and rsqrt).
#pragma once

#include <cmath>

#include "elementwise.h"
#include "kernel_checks.h"
#include "rmsnorm.h"
#include "rope.h"
#include "swiglu.h"

namespace trident::testing {

inline Errors check_rmsnorm_forward(int N, int C, float eps, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  const std::vector<float> inp = random_floats(size_t(N) * C, rng, -2.0, 2.0);
  const std::vector<float> w = random_floats(size_t(C), rng, 0.5, 1.5);
  std::vector<float> want(inp.size()), want_rstd(static_cast<size_t>(N));
  cpu_twin()->rmsnorm_forward(want.data(), want_rstd.data(), inp.data(), w.data(), N, C, eps);
  DeviceBuffer<float> out(inp.size()), rstd(static_cast<size_t>(N)), d_inp(inp), d_w(w);
  cuda::rmsnorm_forward_cuda(out.get(), rstd.get(), d_inp.get(), d_w.get(), N, C, eps, nullptr);
  return {{"out", err_vs(out.download(), want), kFp32Tol},
          {"rstd", err_vs(rstd.download(), want_rstd), kFp32Tol}};
}

struct RmsnormGrads {
  std::vector<float> dinp, dw;
};

// The GPU's backward on the CPU twin's rstd, dw accumulating into a copy of `dw`.
inline RmsnormGrads run_rmsnorm_backward_cuda(const std::vector<float>& dw,
                                              const std::vector<float>& dout,
                                              const std::vector<float>& inp,
                                              const std::vector<float>& w,
                                              const std::vector<float>& rstd, int N, int C) {
  DeviceBuffer<float> d_dinp(inp.size()), d_dw(dw), d_dout(dout), d_inp(inp), d_w(w), d_rstd(rstd);
  DeviceBuffer<float> scratch(cuda::rmsnorm_backward_scratch_floats(N, C));
  cuda::rmsnorm_backward_cuda(d_dinp.get(), d_dw.get(), scratch.get(), d_dout.get(), d_inp.get(),
                              d_w.get(), d_rstd.get(), N, C, nullptr);
  return {d_dinp.download(), d_dw.download()};
}

// dw starts from the same nonzero values on both sides (it accumulates).
inline Errors check_rmsnorm_backward(int N, int C, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  const std::vector<float> inp = random_floats(size_t(N) * C, rng, -2.0, 2.0);
  const std::vector<float> w = random_floats(size_t(C), rng, 0.5, 1.5);
  const std::vector<float> dout = random_floats(inp.size(), rng);
  std::vector<float> dw = random_floats(size_t(C), rng);
  auto cpu = cpu_twin();
  std::vector<float> out(inp.size()), rstd(static_cast<size_t>(N)), want_dinp(inp.size());
  cpu->rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), N, C, 1e-5f);
  const RmsnormGrads got = run_rmsnorm_backward_cuda(dw, dout, inp, w, rstd, N, C);
  cpu->rmsnorm_backward(want_dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(),
                        N, C);
  return {{"dinp", err_vs(got.dinp, want_dinp), kFp32Tol}, {"dw", err_vs(got.dw, dw), kFp32Tol}};
}

// The model's tables (Note [RoPE tables] in src/model/gpt_slots.cpp): [T, rot/2].
struct RopeTables {
  std::vector<float> cos, sin;
};
inline RopeTables rope_tables(int T, int rot, float base) {
  const int half = rot / 2;
  RopeTables r{std::vector<float>(size_t(T) * half), std::vector<float>(size_t(T) * half)};
  for (int i = 0; i < half; ++i) {
    const float inv_freq = 1.0f / std::pow(base, float(2 * i) / float(rot));
    for (int t = 0; t < T; ++t) {
      r.cos[size_t(t) * half + i] = std::cos(float(t) * inv_freq);
      r.sin[size_t(t) * half + i] = std::sin(float(t) * inv_freq);
    }
  }
  return r;
}

// In place on the whole q | k | v buffer, so an element the kernel must not touch (v, the
// dimensions past rot) is compared too. N = B·T rows.
inline Errors check_rope(bool backward, int B, int T, int NH, int KVH, int hs, int rot,
                         uint32_t seed = 1) {
  std::mt19937 rng(seed);
  const int N = B * T;
  std::vector<float> want = random_floats(size_t(N) * (NH + 2 * KVH) * hs, rng);
  const RopeTables tab = rope_tables(T, rot, 10000.0f);
  DeviceBuffer<float> x(want), cos(tab.cos), sin(tab.sin);
  auto cpu = cpu_twin();
  if (backward) {
    cuda::rope_backward_cuda(x.get(), cos.get(), sin.get(), N, T, NH, KVH, hs, rot, nullptr);
    cpu->rope_backward(want.data(), tab.cos.data(), tab.sin.data(), N, T, NH, KVH, hs, rot);
  } else {
    cuda::rope_forward_cuda(x.get(), cos.get(), sin.get(), N, T, NH, KVH, hs, rot, nullptr);
    cpu->rope_forward(want.data(), tab.cos.data(), tab.sin.data(), N, T, NH, KVH, hs, rot);
  }
  return {{backward ? "dqkv" : "qkv", err_vs(x.download(), want), kFp32Tol}};
}

// Gates in [-lim, lim]: lim 8 for the accuracy, 100 for the overflow handling (exp(−g)
// overflows or flushes to 0; the results must stay finite and match the CPU's limits).
inline Errors check_swiglu(bool backward, int N, int F, double lim, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  const std::vector<float> inp = random_floats(size_t(N) * 2 * F, rng, -lim, lim);
  const std::vector<float> dout = random_floats(size_t(N) * F, rng);
  auto cpu = cpu_twin();
  DeviceBuffer<float> d_inp(inp), d_dout(dout);
  if (backward) {
    std::vector<float> want(inp.size());
    cpu->swiglu_backward(want.data(), inp.data(), dout.data(), N, F);
    DeviceBuffer<float> dinp(inp.size());
    cuda::swiglu_backward_cuda(dinp.get(), d_inp.get(), d_dout.get(), N, F, nullptr);
    return {{"dinp", err_vs(dinp.download(), want), kFp32Tol}};
  }
  std::vector<float> want(dout.size());
  cpu->swiglu_forward(want.data(), inp.data(), N, F);
  DeviceBuffer<float> out(dout.size());
  cuda::swiglu_forward_cuda(out.get(), d_inp.get(), N, F, nullptr);
  return {{"out", err_vs(out.download(), want), kFp32Tol}};
}

// x in [-8, 8]: both tails of Φ and the slope's bump; `offset` 1 takes the scalar path.
inline Errors check_gelu_erf(bool backward, size_t n, size_t offset, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  const std::vector<float> inp = random_floats(n, rng, -8.0, 8.0);
  const std::vector<float> dout = random_floats(n, rng);
  std::vector<float> want(n);
  OffsetBuffer<float> d_inp(inp, offset), d_dout(dout, offset), d_out(n, offset);
  if (backward) {
    cpu_twin()->gelu_erf_backward(want.data(), inp.data(), dout.data(), n);
    cuda::gelu_erf_backward_cuda(d_out.get(), d_inp.get(), d_dout.get(), n, nullptr);
    return {{"dinp", err_vs(d_out.download(), want), kFp32Tol}};
  }
  cpu_twin()->gelu_erf_forward(want.data(), inp.data(), n);
  cuda::gelu_erf_forward_cuda(d_out.get(), d_inp.get(), n, nullptr);
  return {{"out", err_vs(d_out.download(), want), kFp32Tol}};
}

}  // namespace trident::testing
