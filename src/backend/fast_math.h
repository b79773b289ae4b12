// exp for the float kernels (softmax, cross-entropy, GELU).
//
// Why not std::exp: without -ffast-math GCC keeps glibc's expf a scalar call per element, and
// tanhf is worse (times in docs/perf.md). This version uses only arithmetic and integer
// operations, so GCC vectorises the loops that call it; it has no float comparisons (which
// -ftrapping-math keeps GCC from if-converting), and every element takes the same path, so
// results do not depend on buffer alignment.
//
// Accuracy: max relative error 1e-7 over the normal range (test_fast_math.cpp); x > 88.73 gives
// +inf, x < -87.7 gives 0 (no denormals), NaN stays NaN. The double overload is std::exp: the
// double kernels are the test reference, where speed does not matter.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace trident::cpu {

inline float exp_fast(float x) {
  // |x| > 120 (but not NaN) becomes ±120: exp still overflows/underflows, and the rounding trick
  // below stays exact. Done on the bits so that no float comparison appears.
  const int32_t bits = std::bit_cast<int32_t>(x);
  const int32_t magnitude = bits & 0x7fffffff;
  constexpr int32_t kBits120 = 0x42f00000, kBitsInf = 0x7f800000;
  const bool clamp = magnitude > kBits120 && magnitude <= kBitsInf;
  x = clamp ? std::bit_cast<float>((bits & int32_t(0x80000000)) | kBits120) : x;

  // exp(x) = 2^n · exp(f), n = round(x / ln2), |f| <= ln2/2. Adding 1.5·2^23 rounds x/ln2 to an
  // integer that then sits in the low mantissa bits.
  constexpr float kRound = 12582912.0f;  // 1.5 · 2^23
  const float shifted = x * 1.44269504088896341f + kRound;
  const float n = shifted - kRound;
  const int32_t ni = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRound);
  // ln2 split in two so that n·kLn2Hi is exact (kLn2Hi has 16 significant bits, |n| < 256).
  constexpr float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.428606765330187045e-6f;
  float f = x - n * kLn2Hi;
  f = f - n * kLn2Lo;
  // Taylor series to degree 7: truncation error < 6e-9 on |f| <= 0.347.
  float p = 1.0f / 5040.0f;
  p = p * f + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  // 2^n as two normal powers of two (|n| <= 174), so that n = 128 (x in [88.03, 88.72]) still
  // gives a finite result and larger n overflow to inf in the last multiply. Below 2^-126 the
  // result is flushed to 0 rather than left to produce slow denormals.
  const int32_t half = ni >> 1;
  const int32_t low_bits = ni < -126 ? 0 : (half + 127) << 23;
  const float low = std::bit_cast<float>(low_bits);
  const float high = std::bit_cast<float>((ni - half + 127) << 23);
  return p * low * high;
}

inline double exp_fast(double x) { return std::exp(x); }

}  // namespace trident::cpu
