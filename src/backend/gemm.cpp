// GEMM for the CPU backend: OpenBLAS single-threaded, each product split across OpenMP threads.
//
// Note [GEMM threading]: the backend's other ops are OpenMP loops. With OpenBLAS's own pthreads
// doing the GEMMs, after each OpenMP loop libgomp's workers keep spinning while OpenBLAS's threads
// want the same two cores (and vice versa). Measured on the 2-core AVX2 dev machine (OpenBLAS
// 0.3.21 pthread, 2 threads), a loop of 12 × [fc GEMM 256×3072×768, GELU, fcproj GEMM
// 256×768×3072, elementwise]:
//   OpenBLAS 2 threads + OpenMP (default wait policy):   75 GFLOP/s
//   OpenBLAS 2 threads + OMP_WAIT_POLICY=passive:       125 GFLOP/s
//   OpenBLAS 1 thread, GEMM split by OpenMP (chosen):   147 GFLOP/s (151 with passive waiting)
// In isolation both schemes reach ~175-190 GFLOP/s on the model's shapes (sgemm 2048³: 188 vs
// 185 GFLOP/s), so the split loses nothing there and removes the contention; it also keeps one
// thread pool in the process. Eigen's own sgemm reached only ~125 GFLOP/s, hence OpenBLAS.
// Model shapes through this path, 2 threads (N=256 rows, C=768), GFLOP/s:
//   forward  out=inp·wᵀ:  qkv 182, attproj 181, fc 181, fcproj 180, lm-head 175
//   backward dinp=dout·w: qkv 177, attproj 180, fc 156-175, fcproj 183, lm-head 168
//   backward dw+=doutᵀ·inp: qkv 187, attproj 182, fc 189, fcproj 187, lm-head 186
// (tests/backend/test_benchmark.cpp re-measures these: see its DISABLED_ tests.)
//
// The split: the larger of the output's two dimensions is cut into `threads` contiguous blocks of
// whole 64-wide tiles, one OpenBLAS call per thread. Each output element is computed by exactly one
// call, so results are deterministic for a fixed thread count.
#include "backend/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "backend/eigen.h"
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

template <typename Real>
void gemm_split(Trans ta, Trans tb, int M, int N, int K, const Real* A, int lda, const Real* B,
                int ldb, Real beta, Real* C, int ldc, int threads) {
  if (M == 0 || N == 0) return;
  constexpr size_t kTile = 64;
  const bool split_rows = M > N;
#pragma omp parallel num_threads(threads)
  {
    const Range r =
        static_chunk(split_rows ? M : N, omp_get_thread_num(), omp_get_num_threads(), kTile);
    if (!r.empty()) {
      const int b = static_cast<int>(r.begin), n = static_cast<int>(r.size());
      if (split_rows) {  // rows b.. of op(A) and of C
        const Real* a = ta == Trans::kNo ? A + size_t(b) * lda : A + b;
        gemm_block(ta, tb, n, N, K, a, lda, B, ldb, beta, C + size_t(b) * ldc, ldc);
      } else {  // columns b.. of op(B) and of C
        const Real* bb = tb == Trans::kNo ? B + b : B + size_t(b) * ldb;
        gemm_block(ta, tb, M, n, K, A, lda, bb, ldb, beta, C + b, ldc);
      }
    }
  }
}

}  // namespace

void gemm(Trans ta, Trans tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
          float beta, float* C, int ldc, int threads) {
  ensure_openblas_single_threaded();
  gemm_split(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, threads);
}

void gemm(Trans ta, Trans tb, int M, int N, int K, const double* A, int lda, const double* B,
          int ldb, double beta, double* C, int ldc, int threads) {
  gemm_split(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, threads);
}

double measure_sgemm_flops(int threads, int size, int repeats) {
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
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * size * double(size) * size / best;
}

}  // namespace trident::cpu
