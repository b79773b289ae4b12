// Checks of the flat-buffer kernels against their CPU twins: GELU, add, scale, bf16 casts,
// AdamW, sum of squares (see kernel_checks.h for the tolerances). `offset` places every buffer
// that many elements past an aligned address: 1 exercises the launchers' scalar path.
#pragma once

#include <cmath>

#include "elementwise.h"
#include "kernel_checks.h"
#include "optimizer.h"

namespace trident::testing {

// x in [-8, 8]: both tails of GELU and its slope.
inline Errors check_gelu_forward(size_t n, size_t offset, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  const std::vector<float> inp = random_floats(n, rng, -8.0, 8.0);
  std::vector<float> want(n);
  cpu_twin()->gelu_forward(want.data(), inp.data(), n);
  OffsetBuffer<float> d_inp(inp, offset), d_out(n, offset);
  cuda::gelu_forward_cuda(d_out.get(), d_inp.get(), n, nullptr);
  return {{"out", err_vs(d_out.download(), want), kFp32Tol}};
}

inline Errors check_gelu_backward(size_t n, size_t offset, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  const std::vector<float> inp = random_floats(n, rng, -8.0, 8.0);
  const std::vector<float> dout = random_floats(n, rng);
  std::vector<float> want(n);
  cpu_twin()->gelu_backward(want.data(), inp.data(), dout.data(), n);
  OffsetBuffer<float> d_inp(inp, offset), d_dout(dout, offset), d_dinp(n, offset);
  cuda::gelu_backward_cuda(d_dinp.get(), d_inp.get(), d_dout.get(), n, nullptr);
  return {{"dinp", err_vs(d_dinp.download(), want), kFp32Tol}};
}

inline Errors check_add(size_t n, size_t offset, int alias, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  const std::vector<float> a = random_floats(n, rng), b = random_floats(n, rng);
  std::vector<float> want(n);
  cpu_twin()->add(want.data(), a.data(), b.data(), n);
  OffsetBuffer<float> d_a(a, offset), d_b(b, offset), d_out(n, offset);
  OffsetBuffer<float>& out = alias == 1 ? d_a : alias == 2 ? d_b : d_out;
  cuda::add_cuda(out.get(), d_a.get(), d_b.get(), n, nullptr);
  return {{"out", err_vs(out.download(), want), kFp32Tol}};
}

// Values within bf16's half-ulp of the input, and bitwise round-to-nearest-even.
inline Errors check_cast_f32_to_bf16(size_t n, size_t offset, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  const std::vector<float> in = random_floats(n, rng, -100.0, 100.0);
  OffsetBuffer<float> d_in(in, offset);
  OffsetBuffer<cuda::bf16> d_out(n, offset);
  cuda::cast_f32_to_bf16_cuda(d_out.get(), d_in.get(), n, nullptr);
  const std::vector<cuda::bf16> got = d_out.download();
  return {{"value", err_vs(bf16_values(got), in), kBf16Tol},
          {"bits_vs_round_to_nearest_even", bf16_mismatch(got, in), 0.0}};
}

// bf16 -> float is exact, so only the one fp32 multiply by `scale` rounds.
inline Errors check_cast_bf16_to_f32(size_t n, size_t offset, float scale, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::vector<float> values = random_floats(n, rng, -100.0, 100.0);
  std::vector<cuda::bf16> in(n);
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i) {
    const float rounded = bf16_round(values[i]);
    in[i] = bf16_from_rounded(rounded);
    want[i] = scale * rounded;
  }
  OffsetBuffer<cuda::bf16> d_in(in, offset);
  OffsetBuffer<float> d_out(n, offset);
  cuda::cast_bf16_to_f32_cuda(d_out.get(), d_in.get(), scale, n, nullptr);
  return {{"out", err_vs(d_out.download(), want), kFp32Tol}};
}

// Step t = 3, so the bias corrections are not 1. Besides params, m and v, the update itself
// (p_new - p_old, ~lr) is compared: the params' tolerance alone would hide a wrong update of
// relative size < 1e-5 / lr. Its tolerance is 1e-3: p_new is rounded to float at |p| ≤ 1, an
// error of up to 6e-8, i.e. ~6e-5 of an update of 1e-3.
inline Errors check_adamw(size_t n, size_t offset, bool with_bf16, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  const std::vector<float> p0 = random_floats(n, rng), grads = random_floats(n, rng);
  std::vector<float> params = p0, m = random_floats(n, rng, -0.1, 0.1),
                     v = random_floats(n, rng, 0.0, 0.01);
  OffsetBuffer<float> d_p(params, offset), d_m(m, offset), d_v(v, offset), d_g(grads, offset);
  OffsetBuffer<cuda::bf16> d_p16(n, offset);
  const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  const int t = 3;
  const float grad_scale = 0.37f;   // clipping folded in
  std::vector<bfloat16> want16(n);  // the twin of Backend::adamw_update_bf16 (CudaBackend's)
  if (with_bf16)
    cpu_twin()->adamw_update_bf16(params.data(), want16.data(), m.data(), v.data(), grads.data(), n,
                                  lr, beta1, beta2, eps, wd, t, grad_scale);
  else
    cpu_twin()->adamw_update(params.data(), m.data(), v.data(), grads.data(), n, lr, beta1, beta2,
                             eps, wd, t, grad_scale);
  cuda::adamw_update_cuda(d_p.get(), d_m.get(), d_v.get(), d_g.get(), n, lr, beta1, beta2, eps, wd,
                          t, grad_scale, with_bf16 ? d_p16.get() : nullptr, nullptr);
  const std::vector<float> got = d_p.download();
  std::vector<float> got_update(n), want_update(n);
  for (size_t i = 0; i < n; ++i) {
    got_update[i] = got[i] - p0[i];
    want_update[i] = params[i] - p0[i];
  }
  // Scales floored at the inputs' ranges (see err_vs): with n = 1, m can cancel to ~0.
  Errors errors{{"params", err_vs(got, params, 1.0), kFp32Tol},
                {"update", err_vs(got_update, want_update, lr), 1e-3},
                {"m", err_vs(d_m.download(), m, 0.1), kFp32Tol},
                {"v", err_vs(d_v.download(), v, 0.01), kFp32Tol}};
  if (with_bf16) {
    const std::vector<cuda::bf16> p16 = d_p16.download();
    errors.push_back({"params_bf16", err_vs(bf16_values(p16), params, 1.0), kBf16Tol});
    // The twin's copy is bf16 of the twin's fp32 params, which agree with the GPU's to kFp32Tol:
    // a bf16 value differs only where that rounding straddles a bf16 midpoint (≤ 1 ulp, 2^-8).
    std::vector<float> twin16(n);
    for (size_t i = 0; i < n; ++i) twin16[i] = to_float(want16[i]);
    errors.push_back({"params_bf16_vs_twin", err_vs(bf16_values(p16), twin16, 1.0), kBf16Tol});
    errors.push_back({"params_bf16_bits_vs_gpu_params", bf16_mismatch(p16, got), 0.0});
  }
  return errors;
}

inline Errors check_sum_squares(size_t n, size_t offset, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  const std::vector<float> x = random_floats(n, rng);
  const double want = cpu_twin()->sum_squares(x.data(), n);
  OffsetBuffer<float> d_x(x, offset);
  DeviceBuffer<double> result(1), scratch(cuda::sum_squares_scratch_doubles());
  cuda::sum_squares_cuda(result.get(), scratch.get(), d_x.get(), n, nullptr);
  const double got = result.download()[0];
  const double err = std::abs(got - want) / (want > 0 ? want : 1.0);
  return {{"sum", std::isnan(got) ? INFINITY : err, kFp32Tol}};
}

}  // namespace trident::testing
