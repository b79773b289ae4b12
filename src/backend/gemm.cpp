// GEMM for the CPU backend: OpenBLAS single-threaded, each product split across OpenMP threads.
//
// Note [GEMM threading]
// OpenBLAS runs single-threaded and each product is split across the backend's OpenMP team.
// The other ops are OpenMP loops; if OpenBLAS ran its own pthreads, libgomp's spinning workers
// and OpenBLAS's threads would fight for the same cores. In isolation both schemes run GEMMs
// equally fast, so the split loses nothing and the process keeps one thread pool.
//
// The split: the larger of the output's two dimensions is cut into `threads` contiguous blocks of
// whole 64-wide tiles, one OpenBLAS call per thread. Each output element is computed by exactly one
// call, so results are deterministic for a fixed thread count (1 and 2 threads differ by rounding:
// OpenBLAS blocks a narrower product differently).
#include "backend/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "backend/eigen.h"
#include "backend/kernels.h"
#include "backend/parallel.h"

namespace trident::cpu {
namespace {

// See Note [GEMM threading]. Done once per process, on first use, so the kernels are right even
// when called without a CpuBackend (as the tests do).
void ensure_openblas_single_threaded() {
  static const bool done = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)done;
}

CBLAS_TRANSPOSE cblas_trans(Trans t) { return t == Trans::kYes ? CblasTrans : CblasNoTrans; }

void gemm_block(Trans ta, Trans tb, int M, int N, int K, const float* A, int lda, const float* B,
                int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), M, N, K, 1.0f, A, lda, B, ldb, beta,
              C, ldc);
}

void gemm_block(Trans ta, Trans tb, int M, int N, int K, const double* A, int lda, const double* B,
                int ldb, double beta, double* C, int ldc) {
  using RowMajor = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Stride = Eigen::OuterStride<>;
  Eigen::Map<const RowMajor, 0, Stride> a(A, ta == Trans::kYes ? K : M, ta == Trans::kYes ? M : K,
                                          Stride(lda));
  Eigen::Map<const RowMajor, 0, Stride> b(B, tb == Trans::kYes ? N : K, tb == Trans::kYes ? K : N,
                                          Stride(ldb));
  Eigen::Map<RowMajor, 0, Stride> c(C, M, N, Stride(ldc));
  if (beta == 0.0) c.setZero();
  if (ta == Trans::kNo && tb == Trans::kNo) c.noalias() += a * b;
  if (ta == Trans::kNo && tb == Trans::kYes) c.noalias() += a * b.transpose();
  if (ta == Trans::kYes && tb == Trans::kNo) c.noalias() += a.transpose() * b;
  if (ta == Trans::kYes && tb == Trans::kYes) c.noalias() += a.transpose() * b.transpose();
}

// Part `part` of `parts` of one product (Note [GEMM threading]): the larger of the output's two
// dimensions cut into contiguous blocks of whole 64-wide tiles.
template <typename Real>
void gemm_part(Trans ta, Trans tb, int M, int N, int K, const Real* A, int lda, const Real* B,
               int ldb, Real beta, Real* C, int ldc, int part, int parts) {
  constexpr size_t kTile = 64;
  const bool split_rows = M > N;
  const Range r = static_chunk(split_rows ? M : N, part, parts, kTile);
  if (r.empty()) return;
  const int b = static_cast<int>(r.begin), n = static_cast<int>(r.size());
  if (split_rows) {  // rows b.. of op(A) and of C
    const Real* a = ta == Trans::kNo ? A + size_t(b) * lda : A + b;
    gemm_block(ta, tb, n, N, K, a, lda, B, ldb, beta, C + size_t(b) * ldc, ldc);
  } else {  // columns b.. of op(B) and of C
    const Real* bb = tb == Trans::kNo ? B + b : B + size_t(b) * ldb;
    gemm_block(ta, tb, M, n, K, A, lda, bb, ldb, beta, C + b, ldc);
  }
}

template <typename Real>
void gemm_split(Trans ta, Trans tb, int M, int N, int K, const Real* A, int lda, const Real* B,
                int ldb, Real beta, Real* C, int ldc, int threads) {
  if (M == 0 || N == 0) return;
#pragma omp parallel num_threads(threads)
  gemm_part(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, omp_get_thread_num(),
            omp_get_num_threads());
}

// One gemm() call's arguments, without the thread count.
template <typename Real>
struct Product {
  Trans ta, tb;
  int M, N, K;
  const Real* A;
  int lda;
  const Real* B;
  int ldb;
  Real beta;
  Real* C;
  int ldc;
};

template <typename Real>
Product<Real> product(Trans ta, Trans tb, int M, int N, int K, const Real* A, int lda,
                      const Real* B, int ldb, Real beta, Real* C, int ldc) {
  return {ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc};
}

// Note [Grouped GEMM]
// Independent products (the experts') run in one OpenMP region, each split as gemm() splits it
// alone (Note [GEMM threading]): thread t runs its part of every product in turn, with no
// barrier between products. So the OpenBLAS calls, and the bits, are those of one gemm() per
// product at the same thread count, and one region is opened instead of one per product.
// Fixed tiles would make the bits independent of the thread count but differ from gemm()'s
// (docs/decisions.md, "The experts' GEMMs in one call").

// Runs product_of(i) for i in [0, count); outputs must not overlap.
template <typename Real, typename ProductOf>
void gemm_grouped(int count, ProductOf product_of, int threads) {
  ensure_openblas_single_threaded();
#pragma omp parallel num_threads(threads)
  {
    const int self = omp_get_thread_num(), T = omp_get_num_threads();
    for (int i = 0; i < count; ++i) {
      const Product<Real> p = product_of(i);
      if (p.M > 0 && p.N > 0)
        gemm_part(p.ta, p.tb, p.M, p.N, p.K, p.A, p.lda, p.B, p.ldb, p.beta, p.C, p.ldc, self, T);
    }
  }
}

}  // namespace

template <typename Real>
void matmul_forward_grouped(Real* out, const Real* inp, const Real* w, const int32_t* rows_at,
                            int E, int C, int OC, int threads) {
  auto product_of = [=](int e) {
    const int r0 = rows_at[e], n = rows_at[e + 1] - r0;
    return product(Trans::kNo, Trans::kYes, n, OC, C, inp + size_t(r0) * C, C,
                   w + size_t(e) * OC * C, C, Real(0), out + size_t(r0) * OC, OC);
  };
  gemm_grouped<Real>(E, product_of, threads);
}

// Products 2e (expert e's dinp) and 2e + 1 (its dw), both reading its dout rows; a skipped one
// has no rows.
template <typename Real>
void matmul_backward_grouped(Real* dinp, Real* dw, const Real* dout, const Real* inp, const Real* w,
                             const int32_t* rows_at, int E, int C, int OC, int threads) {
  auto product_of = [=](int i) {
    const int e = i / 2, r0 = rows_at[e], n = rows_at[e + 1] - r0;
    const Real* d = dout + size_t(r0) * OC;
    const size_t we = size_t(e) * OC * C;
    if (i % 2 == 0)
      return product(Trans::kNo, Trans::kNo, dinp ? n : 0, C, OC, d, OC, w + we, C, Real(0),
                     dinp ? dinp + size_t(r0) * C : nullptr, C);
    return product(Trans::kYes, Trans::kNo, dw && n > 0 ? OC : 0, C, n, d, OC, inp + size_t(r0) * C,
                   C, Real(1), dw ? dw + we : nullptr, C);
  };
  gemm_grouped<Real>(2 * E, product_of, threads);
}

#define TRIDENT_INSTANTIATE(Real)                                                                  \
  template void matmul_forward_grouped<Real>(Real*, const Real*, const Real*, const int32_t*, int, \
                                             int, int, int);                                       \
  template void matmul_backward_grouped<Real>(Real*, Real*, const Real*, const Real*, const Real*, \
                                              const int32_t*, int, int, int, int);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

void gemm(Trans ta, Trans tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
          float beta, float* C, int ldc, int threads) {
  ensure_openblas_single_threaded();
  gemm_split(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, threads);
}

void gemm(Trans ta, Trans tb, int M, int N, int K, const double* A, int lda, const double* B,
          int ldb, double beta, double* C, int ldc, int threads) {
  gemm_split(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, threads);
}

double measure_sgemm_flops(int threads, int size, double budget_s, int min_runs) {
  const size_t n = size_t(size) * size;
  std::vector<float> a(n), b(n), c(n);
  for (size_t i = 0; i < n; ++i) {  // small, varied values: no denormals, no overflow
    a[i] = float(i % 13) * 0.01f - 0.06f;
    b[i] = float(i % 7) * 0.02f - 0.06f;
  }
  // out = inp · wᵀ: the shape of matmul_forward, the model's most common product.
  auto run = [&] {
    gemm(Trans::kNo, Trans::kYes, size, size, size, a.data(), size, b.data(), size, 0.0f, c.data(),
         size, threads);
  };
  run();  // warm-up: page faults, OpenBLAS buffers, thread start
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  double best = 1e30;
  for (int r = 0; r < 10; ++r) {
    const auto t0 = Clock::now();
    run();
    const auto t1 = Clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    if (r + 1 >= min_runs && std::chrono::duration<double>(t1 - start).count() > budget_s) break;
  }
  return 2.0 * size * double(size) * size / best;
}

}  // namespace trident::cpu
