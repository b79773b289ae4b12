// Dense matrix products for the CPU backend (see gemm.cpp for the threading scheme).
#pragma once

namespace trident::cpu {

enum class Trans { kNo, kYes };

// C[M,N] = op(A) · op(B) + beta · C, all row-major; op(A) is [M,K], op(B) is [K,N]; lda, ldb,
// ldc are the row strides of A, B, C as stored. beta is 0 (C is overwritten, whatever it held)
// or 1 (accumulate). float runs OpenBLAS, double runs Eigen (test reference only).
void gemm(Trans ta, Trans tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
          float beta, float* C, int ldc, int threads);
void gemm(Trans ta, Trans tb, int M, int N, int K, const double* A, int lda, const double* B,
          int ldb, double beta, double* C, int ldc, int threads);

// Best FLOP/s of a size³ float product through gemm(), after a warm-up: at least min_runs runs,
// more (up to 10) while within budget_s. Best-of-many because a neighbour's burst of load only
// ever makes a run slower, and the result is the MFU denominator.
double measure_sgemm_flops(int threads, int size = 2048, double budget_s = 1.2, int min_runs = 3);

}  // namespace trident::cpu
