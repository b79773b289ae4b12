// The CUDA backend's bf16 ops against their CPU twins (checks and tolerances:
// kernel_checks_bf16.h): GPT-2 124M shapes (C 768, OC 2304/3072/768, N up to 2048) and odd
// small ones; flat ops on aligned buffers and one element off (the scalar path).
#include <gtest/gtest.h>

#include <iostream>
#include <tuple>
#include <utility>
#include <vector>

#include "kernel_checks_bf16.h"
#include "trident/cuda_backend.h"

namespace trident::testing {
namespace {

using Shapes2 = std::vector<std::tuple<int, int>>;
using Shapes3 = std::vector<std::tuple<int, int, int>>;

constexpr size_t kSizes[] = {1, 3, 4, 37, 4099, 1000003};
constexpr size_t kOffsets[] = {0, 1};
std::string flat(size_t n, size_t offset) { return fmt::format("n={} offset={}", n, offset); }

// (N, C, OC): the block's four GEMMs at 256 and 2048 tokens (qkv 2304, fc 3072, proj back to
// 768 from 768 and from 3072), and odd sizes no tile divides.
const Shapes3 kMatmulShapes = {{256, 768, 2304}, {2048, 768, 3072}, {256, 3072, 768},
                               {2048, 768, 768}, {37, 13, 21},      {5, 96, 7}};

TEST(CudaBf16, CastToBf16IsRoundToNearestEven) {
  TRIDENT_REQUIRE_GPU();
  const std::unique_ptr<Backend> gpu = make_cuda_backend();
  for (size_t n : kSizes)
    for (size_t off : kOffsets) expect_within(check_cast_to_bf16(*gpu, n, off, 101), flat(n, off));
}

TEST(CudaBf16, CastToFp32IsExact) {
  TRIDENT_REQUIRE_GPU();
  const std::unique_ptr<Backend> gpu = make_cuda_backend();
  for (size_t n : kSizes)
    for (size_t off : kOffsets) expect_within(check_cast_to_fp32(*gpu, n, off, 111), flat(n, off));
}

TEST(CudaBf16, GeluForwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const std::unique_ptr<Backend> gpu = make_cuda_backend();
  for (size_t n : kSizes)
    for (size_t off : kOffsets)
      expect_within(check_gelu_forward_bf16(*gpu, n, off, 102), flat(n, off));
}

TEST(CudaBf16, GeluBackwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const std::unique_ptr<Backend> gpu = make_cuda_backend();
  for (size_t n : kSizes)
    for (size_t off : kOffsets)
      expect_within(check_gelu_backward_bf16(*gpu, n, off, 103), flat(n, off));
}

TEST(CudaBf16, LayernormForwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const std::unique_ptr<Backend> gpu = make_cuda_backend();
  // C = 2560: NeoX 2.7B's. C = 4096: the row cache passes 48 KB, this kernel's opt-in.
  for (auto [N, C] :
       Shapes2{{256, 768}, {2048, 768}, {37, 1600}, {5, 13}, {1, 1}, {7, 2560}, {3, 4096}})
    expect_within(check_layernorm_forward_bf16(*gpu, N, C, 104), fmt::format("N={} C={}", N, C));
}

TEST(CudaBf16, LayernormBackwardAddMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const std::unique_ptr<Backend> gpu = make_cuda_backend();
  // C = 1600 passes the 48 KB of shared memory; C = 2560 (NeoX 2.7B) needs a larger opt-in.
  for (auto [N, C] : Shapes2{{256, 768}, {2048, 768}, {37, 1600}, {5, 13}, {1, 1}, {7, 2560}})
    for (bool copy : {true, false})
      expect_within(check_layernorm_backward_add_bf16(*gpu, N, C, copy, 105),
                    fmt::format("N={} C={} dresidual16 {}", N, C, copy));
}

TEST(CudaBf16, MatmulForwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const std::unique_ptr<Backend> gpu = make_cuda_backend();
  for (auto [N, C, OC] : kMatmulShapes)
    for (bool bias : {true, false})
      expect_within(check_matmul_forward_bf16(*gpu, N, C, OC, bias, 106),
                    fmt::format("N={} C={} OC={} bias {}", N, C, OC, bias));
}

TEST(CudaBf16, MatmulForwardAddMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const std::unique_ptr<Backend> gpu = make_cuda_backend();
  for (auto [N, C, OC] : kMatmulShapes)
    for (bool bias : {true, false})
      for (bool in_place : {true, false})
        expect_within(check_matmul_forward_add_bf16(*gpu, N, C, OC, bias, in_place, 107),
                      fmt::format("N={} C={} OC={} bias {} in place {}", N, C, OC, bias, in_place));
}

// bf16 with tp (Note [bf16 with tp]): the row-parallel partial sum (no residual, fp32 D over
// whatever was there) and the column-parallel fp32 input gradient.
TEST(CudaBf16, MatmulFp32OutputsMatchCpu) {
  TRIDENT_REQUIRE_GPU();
  const std::unique_ptr<Backend> gpu = make_cuda_backend();
  for (auto [N, C, OC] : kMatmulShapes) {
    for (bool bias : {true, false})
      expect_within(check_matmul_forward_partial_bf16(*gpu, N, C, OC, bias, 112),
                    fmt::format("partial N={} C={} OC={} bias {}", N, C, OC, bias));
    expect_within(check_matmul_backward_input_fp32_bf16(*gpu, N, C, OC, 113),
                  fmt::format("dinp fp32 N={} C={} OC={}", N, C, OC));
  }
}

TEST(CudaBf16, MatmulBackwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const std::unique_ptr<Backend> gpu = make_cuda_backend();
  for (auto [N, C, OC] : kMatmulShapes)
    expect_within(check_matmul_backward_bf16(*gpu, N, C, OC, {}, 108),
                  fmt::format("N={} C={} OC={}", N, C, OC));
  // Each gradient on its own (the LM head asks for dw first, then dinp).
  for (const MatmulGrads g : {MatmulGrads{true, false, false}, MatmulGrads{false, true, false},
                              MatmulGrads{false, false, true}})
    expect_within(check_matmul_backward_bf16(*gpu, 256, 768, 2304, g, 109),
                  fmt::format("N=256 C=768 OC=2304 dinp {} dw {} dbias {}", g.dinp, g.dw, g.dbias));
}

// The MLP's shapes (OC = 4C forward, C = 4C backward), a ragged one (cuBLASLt's aux wants a
// leading dimension divisible by 8: 36 is not, so the unfused ops run) and one row.
TEST(CudaBf16, MatmulGeluEpiloguesMatchCpu) {
  TRIDENT_REQUIRE_GPU();
  const std::unique_ptr<Backend> gpu = make_cuda_backend();
  const Shapes3 shapes = {{256, 768, 3072}, {1024, 1600, 6400}, {37, 52, 36}, {1, 64, 256}};
  for (auto [N, C, OC] : shapes)
    for (bool bias : {true, false}) {
      expect_within(check_matmul_gelu_forward_bf16(*gpu, N, C, OC, bias, 110),
                    fmt::format("forward N={} C={} OC={} bias {}", N, C, OC, bias));
      // Backward: the GELU's input is [N, OC] here, the layer after it reads OC and writes C.
      expect_within(check_matmul_dgelu_backward_bf16(*gpu, N, OC, C, bias, 111),
                    fmt::format("backward N={} C={} OC={} dbias {}", N, OC, C, bias));
    }
}

// GPT-2 124M's heads (HS 64: cuDNN where it has a plan) and HS 32, each through the default
// backend and through one made with attention "flash" (the fallback with casts around it). A
// fresh backend per shape: attention_note() names the path of the largest shape run so far.
TEST(CudaBf16, AttentionMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  struct Shape {
    int B, T, C, NH;
  };
  for (const Shape s : {Shape{2, 256, 768, 12}, Shape{2, 64, 128, 4}, Shape{1, 100, 192, 3}})
    for (const char* mode : {"auto", "flash"}) {
      const std::unique_ptr<Backend> gpu = make_cuda_backend({.device = 0, .attention = mode});
      std::string path;
      const Errors errors = check_attention_bf16(*gpu, s.B, s.T, s.C, s.NH, 110, &path);
      const std::string shape = fmt::format("B={} T={} C={} NH={}", s.B, s.T, s.C, s.NH);
      std::cout << "attention bf16 " << shape << ": " << path << "\n";
      expect_within(errors, shape + " (" + path + ")");
    }
}

TEST(CudaBf16, CrossentropyFusedMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const std::unique_ptr<Backend> gpu = make_cuda_backend();
  // The decks' vocabularies: GPT-2's padded, Llama's 32000 and Llama 3's 128256 unpadded.
  for (auto [N, V, Vp] : Shapes3{{64, 50257, 50304},
                                 {37, 250, 384},
                                 {3, 5, 5},
                                 {2, 1000, 1001},
                                 {2, 32000, 32000},
                                 {2, 128256, 128256}})
    expect_within(check_crossentropy_fused_bf16(*gpu, N, V, Vp, 111),
                  fmt::format("N={} V={} Vp={}", N, V, Vp));
  for (auto [N, V, Vp] : Shapes3{{37, 250, 384}, {2, 50257, 50304}})
    expect_within(check_crossentropy_fused_bf16(*gpu, N, V, Vp, 112, /*with_neg_inf=*/true),
                  fmt::format("N={} V={} Vp={}, every 7th logit -inf", N, V, Vp));
}

// No float atomics in the bf16 row ops either: two runs give the same bits.
TEST(CudaBf16, LayernormBackwardAddIsDeterministic) {
  TRIDENT_REQUIRE_GPU();
  const std::unique_ptr<Backend> gpu = make_cuda_backend();
  const int N = 1000, C = 768;
  std::mt19937 rng(112);
  const size_t n = size_t(N) * C;
  const std::vector<float> inp = random_floats(n, rng, -2.0, 3.0), w = random_floats(C, rng),
                           dres = random_floats(n, rng), mean = random_floats(N, rng),
                           rstd = random_floats(N, rng, 0.5, 2.0);
  const std::vector<bfloat16> dout = random_bf16(n, rng);
  BackendBuffer<float> d_inp = upload(*gpu, inp), d_w = upload(*gpu, w),
                       d_mean = upload(*gpu, mean), d_rstd = upload(*gpu, rstd);
  BackendBuffer<bfloat16> d_dout = upload(*gpu, dout);
  std::vector<std::vector<float>> runs;
  for (int r = 0; r < 2; ++r) {
    BackendBuffer<float> d_dres = upload(*gpu, dres), d_dw = upload(*gpu, std::vector<float>(C)),
                         d_db = upload(*gpu, std::vector<float>(C));
    gpu->layernorm_backward_add_bf16(d_dres.data(), nullptr, d_dw.data(), d_db.data(),
                                     d_dout.data(), d_inp.data(), d_w.data(), d_mean.data(),
                                     d_rstd.data(), N, C);
    std::vector<float> all = download(*gpu, d_dres.data(), n);
    for (float x : download(*gpu, d_dw.data(), C)) all.push_back(x);
    for (float x : download(*gpu, d_db.data(), C)) all.push_back(x);
    runs.push_back(std::move(all));
  }
  EXPECT_EQ(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)), 0);
}

// Without a GPU: the checks themselves, run with the CPU backend on both sides (every error 0,
// so every poisoned output was written and every size lines up), and the ulp measure on known
// differences. Small shapes: this runs in the CPU test pass too.
TEST(CudaBf16Checks, AgreeWithThemselvesOnTheCpu) {
  const std::unique_ptr<Backend> cpu = cpu_twin();
  std::vector<std::pair<std::string, Errors>> all;
  all.push_back({"cast", check_cast_to_bf16(*cpu, 37, 1, 1)});
  all.push_back({"widen", check_cast_to_fp32(*cpu, 37, 1, 1)});
  all.push_back({"gelu fwd", check_gelu_forward_bf16(*cpu, 37, 1, 1)});
  all.push_back({"gelu bwd", check_gelu_backward_bf16(*cpu, 37, 1, 1)});
  all.push_back({"layernorm fwd", check_layernorm_forward_bf16(*cpu, 5, 13, 1)});
  all.push_back({"layernorm bwd", check_layernorm_backward_add_bf16(*cpu, 5, 13, true, 1)});
  all.push_back({"matmul fwd", check_matmul_forward_bf16(*cpu, 37, 13, 21, true, 1)});
  all.push_back({"matmul add", check_matmul_forward_add_bf16(*cpu, 37, 13, 21, true, false, 1)});
  all.push_back(
      {"matmul add in place", check_matmul_forward_add_bf16(*cpu, 37, 13, 21, false, true, 1)});
  all.push_back({"matmul bwd", check_matmul_backward_bf16(*cpu, 37, 13, 21, {}, 1)});
  all.push_back({"matmul partial", check_matmul_forward_partial_bf16(*cpu, 37, 13, 21, true, 1)});
  all.push_back({"matmul bwd fp32", check_matmul_backward_input_fp32_bf16(*cpu, 37, 13, 21, 1)});
  all.push_back(
      {"matmul bwd dw", check_matmul_backward_bf16(*cpu, 37, 13, 21, {false, true, false}, 1)});
  all.push_back({"matmul gelu fwd", check_matmul_gelu_forward_bf16(*cpu, 37, 13, 21, true, 1)});
  all.push_back({"matmul dgelu bwd", check_matmul_dgelu_backward_bf16(*cpu, 37, 13, 21, true, 1)});
  std::string path;
  all.push_back({"attention", check_attention_bf16(*cpu, 2, 16, 64, 2, 1, &path)});
  all.push_back({"crossentropy", check_crossentropy_fused_bf16(*cpu, 3, 250, 256, 1)});
  all.push_back({"crossentropy with -inf logits",
                 check_crossentropy_fused_bf16(*cpu, 3, 250, 256, 1, /*with_neg_inf=*/true)});
  for (const auto& [op, errors] : all)
    for (const OutputError& e : errors) EXPECT_EQ(e.err, 0.0) << op << ": " << e.name;
}

TEST(CudaBf16Checks, UlpMeasure) {
  auto b = [](float x) { return to_bfloat16(x); };
  // 1.0's ulp is 2^-7 (bf16 has 8 significant bits); 0.5's is 2^-8.
  EXPECT_EQ(bf16_ulp(1.0), std::ldexp(1.0, -7));
  EXPECT_EQ(bf16_ulp(0.75), std::ldexp(1.0, -8));
  const float one_up = 1.0f + std::ldexp(1.0f, -7), two_up = 1.0f + std::ldexp(1.0f, -6);
  EXPECT_LE(bf16_ulp_err({b(one_up)}, {b(1.0f)}, 0.0), 1.0);
  EXPECT_GT(bf16_ulp_err({b(two_up)}, {b(1.0f)}, 0.0), 1.0);
  // The floor: tol · max|want| absolute, for elements far below the tensor's scale.
  EXPECT_LE(bf16_ulp_err({b(1.0f), b(1e-3f)}, {b(1.0f), b(1.1e-3f)}, 1e-4), 1.0);
  EXPECT_GT(bf16_ulp_err({b(1.0f), b(1e-3f)}, {b(1.0f), b(1.1e-3f)}, 1e-5), 1.0);
  // The bias allowance: an output of 0.1 off by 0.004 (8 of its ulps, 2^-11) is within one
  // ulp of a bias of 1.0 (2^-7), not without it or with a bias of 0.01.
  const std::vector<float> big_bias = {1.0f}, small_bias = {0.01f};
  EXPECT_LE(bf16_ulp_err({b(0.104f)}, {b(0.1f)}, 0.0, &big_bias), 1.0);
  EXPECT_GT(bf16_ulp_err({b(0.104f)}, {b(0.1f)}, 0.0), 1.0);
  EXPECT_GT(bf16_ulp_err({b(0.104f)}, {b(0.1f)}, 0.0, &small_bias), 1.0);
  bfloat16 nan;
  nan.bits = 0xFFFF;
  EXPECT_TRUE(std::isinf(bf16_ulp_err({nan}, {b(1.0f)}, 1.0)));
}

}  // namespace
}  // namespace trident::testing
