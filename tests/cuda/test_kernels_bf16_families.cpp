// The CUDA backend's bf16 family ops (RMSNorm, RoPE, SwiGLU, exact GELU, grouped-query
// attention) against their CPU twins (checks and tolerances: kernel_checks_bf16_families.h):
// Llama-1B-like widths (C 2048, SwiGLU 5632, hs 64 with 32 query and 8 kv heads) and odd small
// shapes; skipped without a GPU, except the last test, which runs the checks CPU against CPU.
#include <gtest/gtest.h>

#include <iostream>
#include <tuple>
#include <vector>

#include "kernel_checks_bf16_families.h"
#include "trident/cuda_backend.h"

namespace trident::testing {
namespace {

using Shapes2 = std::vector<std::tuple<int, int>>;

TEST(CudaBf16Families, TheCudaBackendHasThem) {
  TRIDENT_REQUIRE_GPU();
  EXPECT_TRUE(make_cuda_backend()->has_bf16_family_ops());
}

TEST(CudaBf16Families, RmsnormForwardAndBackwardAddMatchCpu) {
  TRIDENT_REQUIRE_GPU();
  const std::unique_ptr<Backend> gpu = make_cuda_backend();
  for (auto [N, C] : Shapes2{{256, 2048}, {2048, 768}, {37, 1600}, {5, 13}, {1, 1}}) {
    const std::string shape = fmt::format("N={} C={}", N, C);
    expect_within(check_rmsnorm_forward_bf16(*gpu, N, C, 201), shape);
    for (bool copy : {true, false})
      expect_within(check_rmsnorm_backward_add_bf16(*gpu, N, C, copy, 202),
                    shape + fmt::format(" dresidual16 {}", copy));
  }
}

TEST(CudaBf16Families, RopeMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const std::unique_ptr<Backend> gpu = make_cuda_backend();
  struct Shape {
    int N, T, NH, KVH, hs, rot;
  };
  for (const Shape s : {Shape{512, 256, 32, 8, 64, 64}, Shape{256, 128, 12, 12, 64, 16},
                        Shape{37, 5, 4, 1, 8, 4}, Shape{3, 3, 2, 2, 6, 2}})
    for (bool backward : {false, true})
      expect_within(check_rope_bf16(*gpu, s.N, s.T, s.NH, s.KVH, s.hs, s.rot, backward, 203),
                    fmt::format("N={} T={} NH={} KVH={} hs={} rot={} {}", s.N, s.T, s.NH, s.KVH,
                                s.hs, s.rot, backward ? "backward" : "forward"));
}

TEST(CudaBf16Families, SwigluMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const std::unique_ptr<Backend> gpu = make_cuda_backend();
  for (auto [N, F] : Shapes2{{256, 5632}, {37, 96}, {1, 1}})
    expect_within(check_swiglu_bf16(*gpu, N, F, 204), fmt::format("N={} F={}", N, F));
}

TEST(CudaBf16Families, ExactGeluMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const std::unique_ptr<Backend> gpu = make_cuda_backend();
  for (size_t n : {size_t(1), size_t(37), size_t(4099), size_t(1000003)})
    for (size_t off : {size_t(0), size_t(1)})
      expect_within(check_gelu_erf_bf16(*gpu, n, off, 205), fmt::format("n={} offset={}", n, off));
}

// Llama's 32 query / 8 kv heads of 64 (cuDNN where it has a plan), multi-query, and hs 32,
// through the default backend and one with attention "flash".
TEST(CudaBf16Families, GroupedQueryAttentionMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  struct Shape {
    int B, T, NH, KVH, hs;
  };
  for (const Shape s : {Shape{1, 256, 32, 8, 64}, Shape{2, 64, 8, 1, 64}, Shape{1, 100, 6, 2, 32}})
    for (const char* mode : {"auto", "flash"}) {
      const std::unique_ptr<Backend> gpu = make_cuda_backend({.device = 0, .attention = mode});
      std::string path;
      const Errors errors = check_attention_gqa_bf16(*gpu, s.B, s.T, s.NH, s.KVH, s.hs, 206, &path);
      const std::string shape =
          fmt::format("B={} T={} NH={} KVH={} hs={}", s.B, s.T, s.NH, s.KVH, s.hs);
      std::cout << "attention gqa bf16 " << shape << ": " << path << "\n";
      expect_within(errors, shape + " (" + path + ")");
    }
}

// Without a GPU: the checks run with the CPU backend on both sides, every error 0 (every
// poisoned output written, every size lined up).
TEST(CudaBf16FamiliesChecks, AgreeWithThemselvesOnTheCpu) {
  const std::unique_ptr<Backend> cpu = cpu_twin();
  std::string path;
  std::vector<std::pair<std::string, Errors>> all;
  all.push_back({"rmsnorm fwd", check_rmsnorm_forward_bf16(*cpu, 5, 13, 1)});
  all.push_back({"rmsnorm bwd", check_rmsnorm_backward_add_bf16(*cpu, 5, 13, true, 1)});
  all.push_back({"rope fwd", check_rope_bf16(*cpu, 37, 5, 4, 1, 8, 4, false, 1)});
  all.push_back({"rope bwd", check_rope_bf16(*cpu, 37, 5, 4, 1, 8, 4, true, 1)});
  all.push_back({"swiglu", check_swiglu_bf16(*cpu, 37, 96, 1)});
  all.push_back({"gelu erf", check_gelu_erf_bf16(*cpu, 37, 1, 1)});
  all.push_back({"attention gqa", check_attention_gqa_bf16(*cpu, 1, 10, 6, 2, 8, 1, &path)});
  for (const auto& [name, errors] : all)
    for (const OutputError& e : errors) EXPECT_EQ(e.err, 0.0) << name << " " << e.name;
}

}  // namespace
}  // namespace trident::testing
