// Checks of the CUDA backend's bf16 ops (Note [bf16 activations] in src/backend/bf16_ops.cpp)
// against their CPU twins, the Backend base definitions reached through cpu_twin()'s *_bf16
// methods: the fp32 op on widened inputs, each bf16 output rounded once. Both sides get the same
// inputs (bf16 ones made by rounding random fp32 values); the GPU side runs through the backend
// method the model calls (make_cuda_backend), on buffers the backend allocated. Outputs start
// poisoned (NaN bytes), accumulated gradients from the same random values on both sides.
//
// Tolerances (see kernel_checks.h for kFp32Tol and kBf16Tol):
//   - a bf16 output: within one bf16 ulp of the twin's (round to nearest of two fp32 values less
//     than an ulp apart gives the same or neighbouring bf16 values), plus the fp32 tolerance of
//     the value before rounding (where the fp32 values differ by more than an ulp of a small
//     element): bf16_ulp_err ≤ 1, with the fp32 part as an absolute floor, tol · max|want|;
//   - kGemmTol = 1e-4 for a GEMM's fp32 part (the fp32 outputs dw and the residual sum, and the
//     floor of its bf16 outputs): identical bf16 operands, so only the order and the rounding of
//     K ≤ 3072 fp32 sums differ; a tensor core aligns each block of products to the largest and
//     truncates, ~2^-23 of the accumulator per block of 16 terms, K/16 ≤ 192 of them biased the
//     same way: ≤ 2.3e-5 of the result, 4x under 1e-4 (the fp32 matmul check's kBf16Tol
//     covers its rounding of the inputs, which these ops do not do);
//   - kFp32Tol for the fp32 outputs of the row ops (LayerNorm statistics and gradients, bias
//     gradient, losses), as their fp32 kernels' checks;
//   - cuDNN's attention keeps P and dS in bf16 inside the kernel: kBf16Tol relative to the
//     tensor's scale, as test_attention.cpp; the flash fallback's backward reads the bf16 `out`
//     (rounded, 2^-9) in D = rowsum(dout ⊙ out), where the twin uses its probabilities: kBf16Tol.
#pragma once

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernel_checks.h"
#include "trident/bfloat16.h"

namespace trident::testing {

constexpr double kGemmTol = 1e-4;

// Host <-> backend memory, through the backend's own copy (Note [Backend memory]).
template <typename T>
BackendBuffer<T> upload(Backend& be, const std::vector<T>& host, size_t offset = 0) {
  BackendBuffer<T> buf(be, host.size() + offset + 1);
  std::vector<T> poison(buf.size());
  std::memset(static_cast<void*>(poison.data()), 0xFF, poison.size() * sizeof(T));
  be.copy(buf.data(), poison.data(), poison.size() * sizeof(T));
  be.copy(buf.data() + offset, host.data(), host.size() * sizeof(T));
  return buf;
}
// n poisoned values (NaN bytes), `offset` elements into the buffer.
template <typename T>
BackendBuffer<T> poisoned(Backend& be, size_t n, size_t offset = 0) {
  return upload(be, std::vector<T>(), n + offset);
}
template <typename T>
std::vector<T> download(Backend& be, const T* p, size_t n) {
  std::vector<T> host(n);
  be.synchronize();
  be.copy(host.data(), p, n * sizeof(T));
  return host;
}

inline std::vector<bfloat16> random_bf16(size_t n, std::mt19937& rng, double lo = -1.0,
                                         double hi = 1.0) {
  const std::vector<float> x = random_floats(n, rng, lo, hi);
  std::vector<bfloat16> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = to_bfloat16(x[i]);
  return out;
}
inline std::vector<float> widened(const std::vector<bfloat16>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = to_float(x[i]);
  return out;
}

// One bf16 ulp at |x| (x a bf16 value): 2^(e-8) for |x| in [2^(e-1), 2^e); 0 at 0.
inline double bf16_ulp(double x) {
  if (x == 0.0) return 0.0;
  int e = 0;
  std::frexp(std::abs(x), &e);
  return std::ldexp(1.0, e - 8);
}
// max_i |got - want| / (ulp(max(|got|, |want|)) + tol · max|want|): at most 1 when every element
// is within one ulp of the twin's plus the fp32 tolerance of the value before rounding. NaN: inf.
// bias (when non-null, the bias[OC] of a row-major [N, OC] output): each element may also be
// off by one bf16 ulp of its column's bias, the most that rounding the bias to bf16 moves the
// sum (half an ulp), times a GELU's slope (≤ 1.13) after it: the device rounds the bias where
// cuBLASLt takes no fp32 one with a bf16 output (Note [cuBLASLt epilogues]).
inline double bf16_ulp_err(const std::vector<bfloat16>& got, const std::vector<bfloat16>& want,
                           double tol, const std::vector<float>* bias = nullptr) {
  double scale = 0.0;
  for (const bfloat16& w : want) scale = std::max(scale, std::abs(double(to_float(w))));
  double worst = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = to_float(got[i]), w = to_float(want[i]);
    const double d = std::abs(g - w);
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    const double rounded_bias =
        bias && !bias->empty() ? bf16_ulp(std::abs(double((*bias)[i % bias->size()]))) : 0.0;
    const double allowed =
        bf16_ulp(std::max(std::abs(g), std::abs(w))) + rounded_bias + tol * scale;
    if (d > 0) worst = std::max(worst, allowed > 0 ? d / allowed : INFINITY);
  }
  return worst;
}
// Fraction of elements whose bits differ (bitwise-defined outputs: casts, the bf16 copy).
inline double bits_differ(const std::vector<bfloat16>& got, const std::vector<bfloat16>& want) {
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) bad += got[i].bits != want[i].bits;
  return want.empty() ? 0.0 : double(bad) / double(want.size());
}
inline double rel_err_bf16(const std::vector<bfloat16>& got, const std::vector<bfloat16>& want) {
  return err_vs(widened(got), widened(want));
}

// cast_to_bf16: round to nearest even, bitwise the host's to_bfloat16.
inline Errors check_cast_to_bf16(Backend& gpu, size_t n, size_t offset, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<float> in = random_floats(n, rng, -100.0, 100.0);
  std::vector<bfloat16> want(n);
  cpu_twin()->cast_to_bf16(want.data(), in.data(), n);
  BackendBuffer<float> d_in = upload(gpu, in, offset);
  BackendBuffer<bfloat16> d_out = poisoned<bfloat16>(gpu, n, offset);
  gpu.cast_to_bf16(d_out.data() + offset, d_in.data() + offset, n);
  return {{"bits", bits_differ(download(gpu, d_out.data() + offset, n), want), 0.0}};
}

// cast_to_fp32: the exact widening, bitwise the host's to_float (NaN payloads aside: the
// inputs are finite). Fraction of floats whose bits differ.
inline Errors check_cast_to_fp32(Backend& gpu, size_t n, size_t offset, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<bfloat16> in = random_bf16(n, rng, -100.0, 100.0);
  std::vector<float> want(n);
  cpu_twin()->cast_to_fp32(want.data(), in.data(), n);
  BackendBuffer<bfloat16> d_in = upload(gpu, in, offset);
  BackendBuffer<float> d_out = poisoned<float>(gpu, n, offset);
  gpu.cast_to_fp32(d_out.data() + offset, d_in.data() + offset, n);
  const std::vector<float> got = download(gpu, d_out.data() + offset, n);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
  return {{"bits", n ? double(bad) / double(n) : 0.0, 0.0}};
}

inline Errors check_gelu_forward_bf16(Backend& gpu, size_t n, size_t offset, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<bfloat16> inp = random_bf16(n, rng, -8.0, 8.0);
  std::vector<bfloat16> want(n);
  cpu_twin()->gelu_forward_bf16(want.data(), inp.data(), n);
  BackendBuffer<bfloat16> d_inp = upload(gpu, inp, offset);
  BackendBuffer<bfloat16> d_out = poisoned<bfloat16>(gpu, n, offset);
  gpu.gelu_forward_bf16(d_out.data() + offset, d_inp.data() + offset, n);
  return {{"out_ulps", bf16_ulp_err(download(gpu, d_out.data() + offset, n), want, kFp32Tol), 1.0}};
}

inline Errors check_gelu_backward_bf16(Backend& gpu, size_t n, size_t offset, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<bfloat16> inp = random_bf16(n, rng, -8.0, 8.0), dout = random_bf16(n, rng);
  std::vector<bfloat16> want(n);
  cpu_twin()->gelu_backward_bf16(want.data(), inp.data(), dout.data(), n);
  BackendBuffer<bfloat16> d_inp = upload(gpu, inp, offset), d_dout = upload(gpu, dout, offset);
  BackendBuffer<bfloat16> d_dinp = poisoned<bfloat16>(gpu, n, offset);
  gpu.gelu_backward_bf16(d_dinp.data() + offset, d_inp.data() + offset, d_dout.data() + offset, n);
  return {
      {"dinp_ulps", bf16_ulp_err(download(gpu, d_dinp.data() + offset, n), want, kFp32Tol), 1.0}};
}

// Inputs with a mean offset from 0 (as the fp32 check), so a one-pass variance would show.
inline Errors check_layernorm_forward_bf16(Backend& gpu, int N, int C, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<float> inp = random_floats(size_t(N) * C, rng, -2.0, 3.0);
  const std::vector<float> w = random_floats(C, rng), b = random_floats(C, rng);
  std::vector<bfloat16> out(size_t(N) * C);
  std::vector<float> mean(N), rstd(N);
  cpu_twin()->layernorm_forward_bf16(out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
                                     b.data(), N, C);
  BackendBuffer<float> d_inp = upload(gpu, inp), d_w = upload(gpu, w), d_b = upload(gpu, b);
  BackendBuffer<float> d_mean = poisoned<float>(gpu, N), d_rstd = poisoned<float>(gpu, N);
  BackendBuffer<bfloat16> d_out = poisoned<bfloat16>(gpu, out.size());
  gpu.layernorm_forward_bf16(d_out.data(), d_mean.data(), d_rstd.data(), d_inp.data(), d_w.data(),
                             d_b.data(), N, C);
  return {{"out_ulps", bf16_ulp_err(download(gpu, d_out.data(), out.size()), out, kFp32Tol), 1.0},
          {"mean", err_vs(download(gpu, d_mean.data(), N), mean), kFp32Tol},
          {"rstd", err_vs(download(gpu, d_rstd.data(), N), rstd), kFp32Tol}};
}

// The bf16 copy of a residual gradient (the *_backward_add_bf16 ops): within one bf16 ulp of the
// twin's, and bit for bit the GPU's own fp32 result rounded once.
inline void add_dresidual16_errors(Errors& errors, Backend& gpu, const bfloat16* d_dres16,
                                   const std::vector<float>& got_dres,
                                   const std::vector<bfloat16>& dres16) {
  const size_t n = got_dres.size();
  const std::vector<bfloat16> got16 = download(gpu, d_dres16, n);
  std::vector<bfloat16> own(n);
  for (size_t i = 0; i < n; ++i) own[i] = to_bfloat16(got_dres[i]);
  errors.push_back({"dresidual16_ulps", bf16_ulp_err(got16, dres16, kFp32Tol), 1.0});
  errors.push_back({"dresidual16_bits_vs_gpu_dresidual", bits_differ(got16, own), 0.0});
}

// mean and rstd from the CPU's forward, so both sides see the same saved values; dresidual,
// dw, db start from the same random values. With dresidual16, its bits are checked against the
// rounding of the GPU's own dresidual too (the copy must be of the sum just written).
inline Errors check_layernorm_backward_add_bf16(Backend& gpu, int N, int C, bool with_copy,
                                                uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t n = size_t(N) * C;
  const std::vector<float> inp = random_floats(n, rng, -2.0, 3.0);
  const std::vector<float> w = random_floats(C, rng), b = random_floats(C, rng);
  const std::vector<bfloat16> dout = random_bf16(n, rng);
  std::vector<float> dres = random_floats(n, rng), dw = random_floats(C, rng),
                     db = random_floats(C, rng);
  std::vector<float> mean(N), rstd(N), ln_out(n);
  const std::unique_ptr<Backend> cpu = cpu_twin();
  cpu->layernorm_forward(ln_out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N,
                         C);
  BackendBuffer<float> d_dres = upload(gpu, dres), d_dw = upload(gpu, dw), d_db = upload(gpu, db),
                       d_inp = upload(gpu, inp), d_w = upload(gpu, w), d_mean = upload(gpu, mean),
                       d_rstd = upload(gpu, rstd);
  BackendBuffer<bfloat16> d_dout = upload(gpu, dout), d_dres16 = poisoned<bfloat16>(gpu, n);
  std::vector<bfloat16> dres16(with_copy ? n : 0);
  cpu->layernorm_backward_add_bf16(dres.data(), with_copy ? dres16.data() : nullptr, dw.data(),
                                   db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                                   rstd.data(), N, C);
  gpu.layernorm_backward_add_bf16(d_dres.data(), with_copy ? d_dres16.data() : nullptr, d_dw.data(),
                                  d_db.data(), d_dout.data(), d_inp.data(), d_w.data(),
                                  d_mean.data(), d_rstd.data(), N, C);
  const std::vector<float> got_dres = download(gpu, d_dres.data(), n);
  Errors errors{{"dresidual", err_vs(got_dres, dres), kFp32Tol},
                {"dw", err_vs(download(gpu, d_dw.data(), C), dw), kFp32Tol},
                {"db", err_vs(download(gpu, d_db.data(), C), db), kFp32Tol}};
  if (with_copy) add_dresidual16_errors(errors, gpu, d_dres16.data(), got_dres, dres16);
  return errors;
}

// matmul_forward_bf16 (out bf16) and matmul_forward_add_bf16 (out fp32 = residual + ..., out
// aliasing the residual or not).
inline Errors check_matmul_forward_bf16(Backend& gpu, int N, int C, int OC, bool with_bias,
                                        uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<bfloat16> inp = random_bf16(size_t(N) * C, rng),
                              w = random_bf16(size_t(OC) * C, rng);
  const std::vector<float> bias = random_floats(OC, rng);
  std::vector<bfloat16> out(size_t(N) * OC);
  cpu_twin()->matmul_forward_bf16(out.data(), inp.data(), w.data(),
                                  with_bias ? bias.data() : nullptr, N, C, OC);
  BackendBuffer<bfloat16> d_inp = upload(gpu, inp), d_w = upload(gpu, w),
                          d_out = poisoned<bfloat16>(gpu, out.size());
  BackendBuffer<float> d_bias = upload(gpu, bias);
  gpu.matmul_forward_bf16(d_out.data(), d_inp.data(), d_w.data(),
                          with_bias ? d_bias.data() : nullptr, N, C, OC);
  return {{"out_ulps",
           bf16_ulp_err(download(gpu, d_out.data(), out.size()), out, kGemmTol,
                        with_bias ? &bias : nullptr),
           1.0}};
}

inline Errors check_matmul_forward_add_bf16(Backend& gpu, int N, int C, int OC, bool with_bias,
                                            bool in_place, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<bfloat16> inp = random_bf16(size_t(N) * C, rng),
                              w = random_bf16(size_t(OC) * C, rng);
  const std::vector<float> bias = random_floats(OC, rng);
  const std::vector<float> residual = random_floats(size_t(N) * OC, rng, -4.0, 4.0);
  std::vector<float> out(residual.size());
  cpu_twin()->matmul_forward_add_bf16(out.data(), residual.data(), inp.data(), w.data(),
                                      with_bias ? bias.data() : nullptr, N, C, OC);
  BackendBuffer<bfloat16> d_inp = upload(gpu, inp), d_w = upload(gpu, w);
  BackendBuffer<float> d_bias = upload(gpu, bias), d_res = upload(gpu, residual),
                       d_out = poisoned<float>(gpu, out.size());
  float* dst = in_place ? d_res.data() : d_out.data();
  gpu.matmul_forward_add_bf16(dst, d_res.data(), d_inp.data(), d_w.data(),
                              with_bias ? d_bias.data() : nullptr, N, C, OC);
  Errors errors{{"out", err_vs(download(gpu, dst, out.size()), out), kGemmTol}};
  if (!in_place)  // the residual is an input: unchanged
    errors.push_back(
        {"residual_unchanged", err_vs(download(gpu, d_res.data(), out.size()), residual), 0.0});
  return errors;
}

// The row-parallel partial sum (Note [bf16 with tp]): matmul_forward_add_bf16 with no residual
// writes out = inp · wᵀ + bias in fp32 over a poisoned buffer.
inline Errors check_matmul_forward_partial_bf16(Backend& gpu, int N, int C, int OC, bool with_bias,
                                                uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<bfloat16> inp = random_bf16(size_t(N) * C, rng),
                              w = random_bf16(size_t(OC) * C, rng);
  const std::vector<float> bias = random_floats(OC, rng);
  std::vector<float> out(size_t(N) * OC);
  cpu_twin()->matmul_forward_add_bf16(out.data(), nullptr, inp.data(), w.data(),
                                      with_bias ? bias.data() : nullptr, N, C, OC);
  BackendBuffer<bfloat16> d_inp = upload(gpu, inp), d_w = upload(gpu, w);
  BackendBuffer<float> d_bias = upload(gpu, bias), d_out = poisoned<float>(gpu, out.size());
  gpu.matmul_forward_add_bf16(d_out.data(), nullptr, d_inp.data(), d_w.data(),
                              with_bias ? d_bias.data() : nullptr, N, C, OC);
  return {{"out", err_vs(download(gpu, d_out.data(), out.size()), out), kGemmTol}};
}

// A column-parallel input gradient in fp32 (Note [bf16 with tp]): dinp = dout · w, assigned
// over a poisoned buffer.
inline Errors check_matmul_backward_input_fp32_bf16(Backend& gpu, int N, int C, int OC,
                                                    uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<bfloat16> w = random_bf16(size_t(OC) * C, rng),
                              dout = random_bf16(size_t(N) * OC, rng);
  std::vector<float> dinp(size_t(N) * C);
  cpu_twin()->matmul_backward_input_fp32_bf16(dinp.data(), dout.data(), w.data(), N, C, OC);
  BackendBuffer<bfloat16> d_w = upload(gpu, w), d_dout = upload(gpu, dout);
  BackendBuffer<float> d_dinp = poisoned<float>(gpu, dinp.size());
  gpu.matmul_backward_input_fp32_bf16(d_dinp.data(), d_dout.data(), d_w.data(), N, C, OC);
  return {{"dinp", err_vs(download(gpu, d_dinp.data(), dinp.size()), dinp), kGemmTol}};
}

// Which of dinp, dw, dbias are asked for: each is skipped when null.
struct MatmulGrads {
  bool dinp = true, dw = true, dbias = true;
};

inline Errors check_matmul_backward_bf16(Backend& gpu, int N, int C, int OC, MatmulGrads want_g,
                                         uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<bfloat16> inp = random_bf16(size_t(N) * C, rng),
                              w = random_bf16(size_t(OC) * C, rng),
                              dout = random_bf16(size_t(N) * OC, rng);
  std::vector<float> dw = random_floats(size_t(OC) * C, rng), dbias = random_floats(OC, rng);
  std::vector<bfloat16> dinp(size_t(N) * C);
  BackendBuffer<bfloat16> d_inp = upload(gpu, inp), d_w = upload(gpu, w),
                          d_dout = upload(gpu, dout), d_dinp = poisoned<bfloat16>(gpu, dinp.size());
  BackendBuffer<float> d_dw = upload(gpu, dw), d_dbias = upload(gpu, dbias);
  cpu_twin()->matmul_backward_bf16(
      want_g.dinp ? dinp.data() : nullptr, want_g.dw ? dw.data() : nullptr,
      want_g.dbias ? dbias.data() : nullptr, dout.data(), inp.data(), w.data(), N, C, OC);
  gpu.matmul_backward_bf16(want_g.dinp ? d_dinp.data() : nullptr, want_g.dw ? d_dw.data() : nullptr,
                           want_g.dbias ? d_dbias.data() : nullptr, d_dout.data(), d_inp.data(),
                           d_w.data(), N, C, OC);
  // A skipped gradient stays as it started (dw, dbias: the start values, which the CPU kept).
  Errors errors{{"dw", err_vs(download(gpu, d_dw.data(), dw.size()), dw), kGemmTol},
                {"dbias", err_vs(download(gpu, d_dbias.data(), OC), dbias), kFp32Tol}};
  if (want_g.dinp)
    errors.push_back({"dinp_ulps",
                      bf16_ulp_err(download(gpu, d_dinp.data(), dinp.size()), dinp, kGemmTol),
                      1.0});
  return errors;
}

// The GEMMs with the GELU in their epilogue (Note [cuBLASLt epilogues]): matmul_gelu_forward_bf16
// and matmul_dgelu_backward_bf16. The twin takes the GELU (or its derivative) of the fp32
// product, as cuBLASLt's epilogue does: one ulp plus kGemmTol, as a GEMM's bf16 output. Where
// cuBLASLt has no such algorithm the backend runs the unfused ops, whose GELU reads the product
// already rounded to bf16 (half an ulp, times the GELU's slope ≤ 1.13 where it matters, then its
// own rounding): 2 ulps covers both paths. The pre-activation is bf16(product) on both: 1 ulp.
// dbias sums g in fp32 (fused) or its bf16 rounding (unfused): kBf16Tol of the largest sum.
inline Errors check_matmul_gelu_forward_bf16(Backend& gpu, int N, int C, int OC, bool with_bias,
                                             uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<bfloat16> inp = random_bf16(size_t(N) * C, rng),
                              w = random_bf16(size_t(OC) * C, rng, -0.1, 0.1);
  const std::vector<float> bias = random_floats(OC, rng);
  std::vector<bfloat16> out(size_t(N) * OC), pre(out.size());
  cpu_twin()->matmul_gelu_forward_bf16(out.data(), pre.data(), inp.data(), w.data(),
                                       with_bias ? bias.data() : nullptr, N, C, OC);
  BackendBuffer<bfloat16> d_inp = upload(gpu, inp), d_w = upload(gpu, w),
                          d_out = poisoned<bfloat16>(gpu, out.size()),
                          d_pre = poisoned<bfloat16>(gpu, out.size());
  BackendBuffer<float> d_bias = upload(gpu, bias);
  gpu.matmul_gelu_forward_bf16(d_out.data(), d_pre.data(), d_inp.data(), d_w.data(),
                               with_bias ? d_bias.data() : nullptr, N, C, OC);
  const std::vector<float>* b = with_bias ? &bias : nullptr;
  return {
      {"pre_ulps", bf16_ulp_err(download(gpu, d_pre.data(), pre.size()), pre, kGemmTol, b), 1.0},
      {"out_ulps", bf16_ulp_err(download(gpu, d_out.data(), out.size()), out, kGemmTol, b), 2.0}};
}

inline Errors check_matmul_dgelu_backward_bf16(Backend& gpu, int N, int C, int OC, bool with_dbias,
                                               uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<bfloat16> dout = random_bf16(size_t(N) * OC, rng),
                              w = random_bf16(size_t(OC) * C, rng, -0.1, 0.1),
                              pre = random_bf16(size_t(N) * C, rng, -3.0, 3.0);
  std::vector<float> dbias = random_floats(C, rng);
  std::vector<bfloat16> dpre(size_t(N) * C);
  BackendBuffer<bfloat16> d_dout = upload(gpu, dout), d_w = upload(gpu, w),
                          d_pre = upload(gpu, pre), d_dpre = poisoned<bfloat16>(gpu, dpre.size());
  BackendBuffer<float> d_dbias = upload(gpu, dbias);  // the start values, before the twin adds
  cpu_twin()->matmul_dgelu_backward_bf16(dpre.data(), with_dbias ? dbias.data() : nullptr,
                                         dout.data(), w.data(), pre.data(), N, C, OC);
  gpu.matmul_dgelu_backward_bf16(d_dpre.data(), with_dbias ? d_dbias.data() : nullptr,
                                 d_dout.data(), d_w.data(), d_pre.data(), N, C, OC);
  return {
      {"dpre_ulps", bf16_ulp_err(download(gpu, d_dpre.data(), dpre.size()), dpre, kGemmTol), 2.0},
      {"dbias", err_vs(download(gpu, d_dbias.data(), dbias.size()), dbias), kBf16Tol}};
}

// Forward then backward on each side with its own saved state (the CPU saves probabilities, the
// GPU the log-sum-exp) and its own bf16 output; dout the same. `path` gets the GPU's attention
// note (which path ran). cuDNN: kBf16Tol on both; the flash fallback: the ulp check on out.
inline Errors check_attention_bf16(Backend& gpu, int B, int T, int C, int NH, uint32_t seed,
                                   std::string* path) {
  std::mt19937 rng(seed);
  const size_t n1 = size_t(B) * T * C, n3 = 3 * n1;
  const std::vector<bfloat16> qkv = random_bf16(n3, rng), dout = random_bf16(n1, rng);
  const std::unique_ptr<Backend> cpu = cpu_twin();
  std::vector<bfloat16> out(n1), dqkv(n3);
  std::vector<float> att(cpu->attention_saved_floats(B, T, C, NH)),
      scratch(cpu->attention_scratch_floats(B, T, C, NH));
  cpu->attention_forward_bf16(out.data(), att.data(), qkv.data(), B, T, C, NH);
  cpu->attention_backward_bf16(dqkv.data(), scratch.data(), dout.data(), qkv.data(), out.data(),
                               att.data(), B, T, C, NH);

  BackendBuffer<bfloat16> d_qkv = upload(gpu, qkv), d_dout = upload(gpu, dout),
                          d_out = poisoned<bfloat16>(gpu, n1), d_dqkv = poisoned<bfloat16>(gpu, n3);
  BackendBuffer<float> d_att = poisoned<float>(gpu, gpu.attention_saved_floats(B, T, C, NH)),
                       d_scratch(gpu, gpu.attention_scratch_floats(B, T, C, NH));
  gpu.attention_forward_bf16(d_out.data(), d_att.data(), d_qkv.data(), B, T, C, NH);
  gpu.attention_backward_bf16(d_dqkv.data(), d_scratch.data(), d_dout.data(), d_qkv.data(),
                              d_out.data(), d_att.data(), B, T, C, NH);
  const std::vector<bfloat16> got_out = download(gpu, d_out.data(), n1),
                              got_dqkv = download(gpu, d_dqkv.data(), n3);
  *path = gpu.attention_note();
  const bool cudnn = path->starts_with("cuDNN");
  return {cudnn ? OutputError{"out", rel_err_bf16(got_out, out), kBf16Tol}
                : OutputError{"out_ulps", bf16_ulp_err(got_out, out, kFp32Tol), 1.0},
          {"dqkv", rel_err_bf16(got_dqkv, dqkv), kBf16Tol}};
}

// Logits in [-4, 4]; targets[0] = 0 and targets[N-1] = V-1 (the first and last real columns).
// The GPU's padded columns start as NaN: they must come out 0 without being read.
// with_neg_inf: every 7th logit (off the target) is -inf, as an overflowing run's may be: it
// adds nothing to the softmax (a thread whose first logit is -inf must not make its sum NaN).
inline Errors check_crossentropy_fused_bf16(Backend& gpu, int N, int V, int Vp, uint32_t seed,
                                            bool with_neg_inf = false) {
  std::mt19937 rng(seed);
  std::vector<bfloat16> logits = random_bf16(size_t(N) * Vp, rng, -4.0, 4.0);
  std::vector<int32_t> targets = tokens(N, V, rng);
  targets[0] = 0;
  targets[N - 1] = V - 1;
  if (with_neg_inf)
    for (int n = 0; n < N; ++n)
      for (int v = 3; v < V; v += 7)
        if (v != targets[size_t(n)]) logits[size_t(n) * Vp + v].bits = 0xFF80;  // -inf
  const float dloss = 0.37f;
  std::vector<bfloat16> device_logits = logits;
  for (int n = 0; n < N; ++n)
    for (int v = V; v < Vp; ++v) device_logits[size_t(n) * Vp + v].bits = 0xFFFF;
  std::vector<float> losses(N);
  cpu_twin()->crossentropy_fused_bf16(losses.data(), logits.data(), targets.data(), dloss, N, V,
                                      Vp);
  BackendBuffer<bfloat16> d_logits = upload(gpu, device_logits);
  BackendBuffer<int32_t> d_targets = upload(gpu, targets);
  BackendBuffer<float> d_losses = poisoned<float>(gpu, N);
  gpu.crossentropy_fused_bf16(d_losses.data(), d_logits.data(), d_targets.data(), dloss, N, V, Vp);
  return {{"losses", err_vs(download(gpu, d_losses.data(), N), losses), kFp32Tol},
          {"dlogits_ulps",
           bf16_ulp_err(download(gpu, d_logits.data(), logits.size()), logits, kFp32Tol), 1.0}};
}

}  // namespace trident::testing
