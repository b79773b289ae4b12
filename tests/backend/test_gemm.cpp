// gemm() against a naive triple loop: every transpose combination, both beta values, shapes that
// split along rows or columns (or not at all), and thread counts that do not divide the work.
#include <gtest/gtest.h>

#include <tuple>

#include "backend/gemm.h"
#include "backend_test_util.h"

namespace trident {
namespace {

using namespace trident::testing;
using cpu::Trans;

// C[M,N] = op(A)·op(B) + beta·C in double, straight from the definition.
std::vector<double> naive(Trans ta, Trans tb, int M, int N, int K, const std::vector<double>& A,
                          const std::vector<double>& B, double beta, std::vector<double> C) {
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0.0;
      for (int k = 0; k < K; ++k) {
        const double a = ta == Trans::kNo ? A[size_t(i) * K + k] : A[size_t(k) * M + i];
        const double b = tb == Trans::kNo ? B[size_t(k) * N + j] : B[size_t(j) * K + k];
        s += a * b;
      }
      C[size_t(i) * N + j] = s + (beta == 0.0 ? 0.0 : beta * C[size_t(i) * N + j]);
    }
  return C;
}

class GemmTest : public ::testing::TestWithParam<std::tuple<Trans, Trans, int>> {};

TEST_P(GemmTest, MatchesNaiveProduct) {
  const auto [ta, tb, threads] = GetParam();
  std::mt19937 rng(11);
  const int shapes[][3] = {{1, 1, 1}, {5, 130, 7}, {130, 5, 9}, {67, 129, 200}, {200, 70, 3}};
  for (const auto& [M, N, K] : shapes) {
    for (double beta : {0.0, 1.0}) {
      SCOPED_TRACE(::testing::Message() << M << "x" << N << "x" << K << " beta " << beta);
      const auto A = to_double(to_float(uniform(size_t(M) * K, rng)));
      const auto B = to_double(to_float(uniform(size_t(K) * N, rng)));
      const auto C0 = to_double(to_float(uniform(size_t(M) * N, rng)));
      const auto want = naive(ta, tb, M, N, K, A, B, beta, C0);
      const int lda = ta == Trans::kNo ? K : M, ldb = tb == Trans::kNo ? N : K;

      // beta = 0 must overwrite whatever C held, NaN included.
      auto C_f = beta == 0.0 ? nans(C0.size()) : to_float(C0);
      cpu::gemm(ta, tb, M, N, K, to_float(A).data(), lda, to_float(B).data(), ldb, float(beta),
                C_f.data(), N, threads);
      // float: sums of ≤ 200 products, ~200·6e-8 worst case.
      EXPECT_LT(rel_err(C_f, want), 2e-5);

      auto C_d = C0;
      if (beta == 0.0) C_d.assign(C0.size(), std::numeric_limits<double>::quiet_NaN());
      cpu::gemm(ta, tb, M, N, K, A.data(), lda, B.data(), ldb, beta, C_d.data(), N, threads);
      EXPECT_LT(rel_err(C_d, want), 1e-13);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, GemmTest,
                         ::testing::Combine(::testing::Values(Trans::kNo, Trans::kYes),
                                            ::testing::Values(Trans::kNo, Trans::kYes),
                                            ::testing::Values(1, 2, 3)));

}  // namespace
}  // namespace trident
