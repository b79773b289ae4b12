// Work splitting and reductions shared by the CPU kernels.
//
// Note [Deterministic reductions]
// A sum along a vector goes through sum_lanes, never `#pragma omp simd reduction` or atomics:
// an OpenMP simd reduction lets the compiler choose the order (and peel to align), so a result
// could change with a buffer's address; sum_lanes fixes the order in the source and GCC still
// vectorises it. Sums over rows give each thread its own columns; work is split statically and
// per-thread partials combine in thread order. So a fixed thread count is bitwise reproducible.
//
// sum_lanes keeps kLanes interleaved partial sums, combined as a tree; without -ffast-math the
// compiler must keep that order.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>

namespace trident::cpu {

struct Range {
  size_t begin = 0, end = 0;
  bool empty() const { return begin >= end; }
  size_t size() const { return end - begin; }
};

// Part `part` of `parts` contiguous pieces of [0, n); piece sizes are multiples of `align` (except
// the last), so vector loops and GEMM micro-tiles are not cut mid-way.
inline Range static_chunk(size_t n, int part, int parts, size_t align = 1) {
  size_t per = (n + parts - 1) / parts;
  per = (per + align - 1) / align * align;
  size_t begin = std::min(n, per * part);
  return {begin, std::min(n, begin + per)};
}

// Runs body(begin, end) on one static piece of [0, n) per thread (whole vectors of 16 values).
template <typename Body>
void parallel_range(size_t n, int threads, Body body) {
#pragma omp parallel num_threads(threads)
  {
    const Range r = static_chunk(n, omp_get_thread_num(), omp_get_num_threads(), 16);
    if (!r.empty()) body(r.begin, r.end);
  }
}

// Σ term(i) for i in [0, n), accumulated in Acc; see Note [Deterministic reductions].
template <typename Acc, typename Term>
inline Acc sum_lanes(size_t n, Term term) {
  constexpr size_t kLanes = 16;
  Acc lane[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t k = 0; k < kLanes; ++k) lane[k] += static_cast<Acc>(term(i + k));
  for (size_t k = 0; i + k < n; ++k) lane[k] += static_cast<Acc>(term(i + k));
  for (size_t width = kLanes / 2; width > 0; width /= 2)
    for (size_t k = 0; k < width; ++k) lane[k] += lane[k + width];
  return lane[0];
}

template <typename Acc, typename Real>
inline Acc sum_of(const Real* x, size_t n) {
  return sum_lanes<Acc>(n, [x](size_t i) { return x[i]; });
}

template <typename Acc, typename Real>
inline Acc dot_of(const Real* x, const Real* y, size_t n) {
  return sum_lanes<Acc>(n, [x, y](size_t i) { return static_cast<Acc>(x[i]) * y[i]; });
}

}  // namespace trident::cpu
