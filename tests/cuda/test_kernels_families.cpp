// The model families' kernels (RMSNorm, RoPE, SwiGLU, exact GELU) against their CPU twins on odd
// and Llama/NeoX-like shapes, and the determinism of RMSNorm's dw. Checks:
// kernel_checks_families.h.
#include <gtest/gtest.h>

#include <initializer_list>
#include <tuple>

#include "kernel_checks_families.h"

namespace trident::testing {
namespace {

TEST(KernelRmsnorm, ForwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  // C 37: fewer columns than a warp's lanes twice over; 2048: Llama-1B's width.
  for (auto [N, C] :
       std::initializer_list<std::tuple<int, int>>{{1, 1}, {7, 37}, {64, 768}, {33, 2048}})
    for (float eps : {1e-5f, 1e-6f})
      expect_within(check_rmsnorm_forward(N, C, eps, 21),
                    fmt::format("N={} C={} eps={}", N, C, eps));
}

TEST(KernelRmsnorm, BackwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  // N 300: more rows than row chunks (column_sum_row_chunks), so chunks hold several rows.
  for (auto [N, C] :
       std::initializer_list<std::tuple<int, int>>{{1, 5}, {7, 37}, {300, 768}, {64, 2048}})
    expect_within(check_rmsnorm_backward(N, C, 22), fmt::format("N={} C={}", N, C));
}

// dw sums rows in fixed chunks in a fixed order (Note [Deterministic GPU reductions]).
TEST(KernelRmsnorm, BackwardIsDeterministic) {
  TRIDENT_REQUIRE_GPU();
  const int N = 4096, C = 1024;
  std::mt19937 rng(23);
  const std::vector<float> inp = random_floats(size_t(N) * C, rng, -2.0, 2.0);
  const std::vector<float> w = random_floats(size_t(C), rng, 0.5, 1.5);
  const std::vector<float> dout = random_floats(inp.size(), rng);
  const std::vector<float> dw = random_floats(size_t(C), rng);
  const std::vector<float> rstd = random_floats(size_t(N), rng, 0.5, 1.5);
  const RmsnormGrads a = run_rmsnorm_backward_cuda(dw, dout, inp, w, rstd, N, C);
  const RmsnormGrads b = run_rmsnorm_backward_cuda(dw, dout, inp, w, rstd, N, C);
  EXPECT_FALSE(same_bits(a.dw, dw));  // the kernel ran
  EXPECT_TRUE(same_bits(a.dw, b.dw));
  EXPECT_TRUE(same_bits(a.dinp, b.dinp));
}

// (B, T, NH, KVH, hs, rot): full rotary with grouped kv heads (Llama), a quarter of each head
// (NeoX's rotary_pct 0.25), multi-query, and rot 2 (one pair per head).
using RopeShapes = std::initializer_list<std::tuple<int, int, int, int, int, int>>;
constexpr RopeShapes kRopeShapes = {
    {2, 17, 4, 2, 64, 64}, {1, 33, 4, 4, 32, 8}, {2, 9, 8, 1, 16, 16}, {1, 5, 2, 2, 6, 2}};

TEST(KernelRope, ForwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  for (auto [B, T, NH, KVH, hs, rot] : kRopeShapes)
    expect_within(check_rope(false, B, T, NH, KVH, hs, rot, 24),
                  fmt::format("B={} T={} NH={} KVH={} hs={} rot={}", B, T, NH, KVH, hs, rot));
}

TEST(KernelRope, BackwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  for (auto [B, T, NH, KVH, hs, rot] : kRopeShapes)
    expect_within(check_rope(true, B, T, NH, KVH, hs, rot, 25),
                  fmt::format("B={} T={} NH={} KVH={} hs={} rot={}", B, T, NH, KVH, hs, rot));
}

TEST(KernelSwiglu, MatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  for (auto [N, F] : std::initializer_list<std::tuple<int, int>>{{1, 1}, {7, 37}, {64, 2048}})
    for (bool backward : {false, true})
      for (double lim : {8.0, 100.0})
        expect_within(
            check_swiglu(backward, N, F, lim, 26),
            fmt::format("{} N={} F={} gates within ±{}", backward ? "bwd" : "fwd", N, F, lim));
}

TEST(KernelGeluErf, MatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  for (size_t n : {size_t(1), size_t(1001), size_t(1) << 16})
    for (size_t offset : {size_t(0), size_t(1)})
      for (bool backward : {false, true})
        expect_within(check_gelu_erf(backward, n, offset, 27),
                      fmt::format("{} n={} offset={}", backward ? "bwd" : "fwd", n, offset));
}

}  // namespace
}  // namespace trident::testing
