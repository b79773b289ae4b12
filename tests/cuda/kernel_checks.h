// Checking each kernel launcher against its CPU twin: the helpers here, the checks in
// kernel_checks_rows.h (row-wise ops) and kernel_checks_flat.h (flat-buffer ops). Shared by the
// GPU tests (test_kernels_*.cpp, several shapes each) and the kernel benchmarks (one small
// validation before timing).
//
// A check runs the CPU backend (make_cpu_backend(1)) and the launcher on the same random inputs
// and returns the error of every output next to its tolerance. Outputs start poisoned (NaN), so
// an element the kernel never wrote fails; gradients that accumulate start from the same random
// nonzero values on both sides.
//
// Tolerances (relative to the tensor's scale, testing::rel_err):
//   kFp32Tol = 1e-5: fp32 results that differ from the CPU only by rounding: sums of at most a
//     few thousand terms in a different order (~sqrt(n)·6e-8 typically), and the fast-math
//     exp/rsqrt/division (a few ulp; __expf's error grows with |x|, ~1e-6 at |x| = 20);
//   kBf16Tol = 1e-2: a bf16 result has 8 significand bits, half an ulp is 2^-9 ≈ 2e-3.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend_test_util.h"
#include "gpu_test_util.h"
#include "trident/backend.h"

namespace trident::testing {

constexpr double kFp32Tol = 1e-5;
constexpr double kBf16Tol = 1e-2;

struct OutputError {
  std::string name;
  double err, tol;
};
using Errors = std::vector<OutputError>;

inline bool all_within(const Errors& errors) {
  for (const OutputError& e : errors)
    if (!(e.err <= e.tol)) return false;
  return true;
}
// Bitwise equality, for outputs that must not depend on the run (no float atomics).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
inline std::string describe(const Errors& errors) {
  std::string s;
  for (const OutputError& e : errors)
    s += fmt::format("{}: err {:.3g} (tol {:.0e}); ", e.name, e.err, e.tol);
  return s;
}
// One expectation per output: its error within its tolerance, said with the shape and every
// output's error on failure.
inline void expect_within(const Errors& errors, const std::string& shape) {
  for (const OutputError& e : errors)
    EXPECT_LE(e.err, e.tol) << e.name << " at " << shape << " (" << describe(errors) << ")";
}

inline std::vector<float> random_floats(size_t n, std::mt19937& rng, double lo = -1.0,
                                        double hi = 1.0) {
  return to_float(uniform(n, rng, lo, hi));
}
inline double err_vs(const std::vector<float>& got, const std::vector<float>& want) {
  return rel_err(got, to_double(want));
}
// The same with the scale floored at `min_scale`: a vector of one or three values can be near 0
// by cancellation, and then its own size is not the right yardstick for rounding differences.
inline double err_vs(const std::vector<float>& got, const std::vector<float>& want,
                     double min_scale) {
  double diff = 0.0, scale = min_scale;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(double(got[i]) - double(want[i]));
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, d);
    scale = std::max(scale, std::abs(double(want[i])));
  }
  return diff / scale;
}

// A device copy of `host` placed `offset` elements into a poisoned buffer, so that an offset of
// 1 sends the launchers down their unaligned (scalar) path.
template <typename T>
class OffsetBuffer {
 public:
  OffsetBuffer(const std::vector<T>& host, size_t offset)
      : buf_(host.size() + offset), off_(offset) {
    TRIDENT_CUDA(cudaMemcpy(get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  OffsetBuffer(size_t n, size_t offset) : buf_(n + offset), off_(offset) {}
  T* get() { return buf_.get() + off_; }
  std::vector<T> download() const {
    std::vector<T> all = buf_.download();
    return std::vector<T>(all.begin() + off_, all.end());
  }

 private:
  DeviceBuffer<T> buf_;
  size_t off_;
};

// Round to nearest even, as __float2bfloat16 does (finite inputs); the value as a float.
inline float bf16_round(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::bit_cast<float>(u & 0xffff0000u);
}
inline float bf16_value(cuda::bf16 b) {
  return std::bit_cast<float>(uint32_t(std::bit_cast<uint16_t>(b)) << 16);
}
inline cuda::bf16 bf16_from_rounded(float rounded) {
  return std::bit_cast<cuda::bf16>(uint16_t(std::bit_cast<uint32_t>(rounded) >> 16));
}
// Fraction of elements whose bf16 bits differ from bf16_round(want).
inline double bf16_mismatch(const std::vector<cuda::bf16>& got, const std::vector<float>& want) {
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::bit_cast<uint32_t>(bf16_value(got[i])) != std::bit_cast<uint32_t>(bf16_round(want[i])))
      ++bad;
  return want.empty() ? 0.0 : double(bad) / double(want.size());
}
inline std::vector<float> bf16_values(const std::vector<cuda::bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_value(v[i]);
  return out;
}

inline std::unique_ptr<Backend> cpu_twin() { return make_cpu_backend(1); }

}  // namespace trident::testing
