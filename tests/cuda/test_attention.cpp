// Causal attention on the GPU against the CPU twin (Backend::attention_forward/backward):
// the fp32 flash kernels (kernels/attention_flash.cu) and cuDNN's fused bf16 attention
// (kernels/attention_cudnn.cu). The CPU twin saves probabilities, the GPU paths save the
// log-sum-exp, so the comparisons are on out, dqkv and (against a double host reference) lse.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention_cudnn.h"
#include "attention_flash.h"
#include "attention_reference.h"
#include "backend_test_util.h"
#include "gpu_test_util.h"
#include "trident/backend.h"

namespace trident::testing {
namespace {

struct AttnShape {
  int B, T, C, NH;
};

void PrintTo(const AttnShape& s, std::ostream* os) {
  *os << "B" << s.B << "_T" << s.T << "_C" << s.C << "_NH" << s.NH;
}

// fp32 tolerance, relative to the tensor's largest entry. Both sides are fp32 with different
// summation orders (tiles + online rescaling vs Eigen's row-wise softmax) and different exp
// approximations (ex2.approx vs exp_fast, each ~1e-7 relative); over T ≤ 257 terms the
// accumulated rounding stays a few 1e-7 of the largest entry, so 1e-5 leaves ~10x headroom
// while still catching any indexing or masking mistake (those give errors of order 1).
constexpr double kFp32Tol = 1e-5;
// bf16 (8 significant bits, rounding 2^-9 ≈ 2e-3): inputs, P and dS pass through bf16 inside
// cuDNN's kernel, so a few roundings of 2e-3 add up to well under 1e-2.
constexpr double kBf16Tol = 1e-2;

// Inputs and the CPU twin's outputs for one shape, with the log-sum-exp the GPU saves.
struct Reference : AttentionReference {
  std::vector<double> lse;  // [B,NH,T], in double on the host
};

// log Σ_{j≤i} exp(q_i·k_j / sqrt(HS)), in double.
std::vector<double> reference_lse(const std::vector<float>& qkv, const AttnShape& s) {
  const int HS = s.C / s.NH;
  const double scale = 1.0 / std::sqrt(double(HS));
  std::vector<double> lse(size_t(s.B) * s.NH * s.T), scores(s.T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int i = 0; i < s.T; ++i) {
        const float* q = qkv.data() + (size_t(b) * s.T + i) * 3 * s.C + size_t(h) * HS;
        double mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const float* k = qkv.data() + (size_t(b) * s.T + j) * 3 * s.C + s.C + size_t(h) * HS;
          double dot = 0;
          for (int d = 0; d < HS; ++d) dot += double(q[d]) * k[d];
          scores[j] = dot * scale;
          mx = std::max(mx, scores[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += std::exp(scores[j] - mx);
        lse[(size_t(b) * s.NH + h) * s.T + i] = mx + std::log(sum);
      }
  return lse;
}

Reference make_reference(const AttnShape& s, bool bf16_inputs, uint32_t seed = 1234) {
  Reference r{attention_reference(s.B, s.T, s.C, s.NH, bf16_inputs, seed), {}};
  r.lse = reference_lse(r.qkv, s);
  return r;
}

// Device results of the flash path; every output buffer starts poisoned.
struct FlashRun {
  std::vector<float> out, lse, dqkv;
};

FlashRun run_flash(const Reference& r, const AttnShape& s) {
  DeviceBuffer<float> qkv(r.qkv), dout(r.dout);
  DeviceBuffer<float> out(r.out.size()), lse(size_t(s.B) * s.NH * s.T), dqkv(r.qkv.size());
  DeviceBuffer<float> scratch(cuda::flash_attention_backward_scratch_floats(s.B, s.T, s.C, s.NH));
  cuda::flash_attention_forward_cuda(out.get(), lse.get(), qkv.get(), s.B, s.T, s.C, s.NH,
                                     nullptr);
  cuda::flash_attention_backward_cuda(dqkv.get(), scratch.get(), dout.get(), qkv.get(), out.get(),
                                      lse.get(), s.B, s.T, s.C, s.NH, nullptr);
  return {out.download(), lse.download(), dqkv.download()};
}

class AttentionTest : public ::testing::TestWithParam<AttnShape> {};

TEST_P(AttentionTest, FlashMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const AttnShape s = GetParam();
  ASSERT_TRUE(cuda::flash_attention_supported(s.C / s.NH));
  const Reference r = make_reference(s, false);
  const FlashRun g = run_flash(r, s);
  EXPECT_LE(rel_err(g.out, to_double(r.out)), kFp32Tol) << "out";
  EXPECT_LE(rel_err(g.lse, r.lse), kFp32Tol) << "lse";
  EXPECT_LE(rel_err(g.dqkv, to_double(r.dqkv)), kFp32Tol) << "dqkv";
}

// No atomics in the backward: two runs give the same bits.
TEST_P(AttentionTest, FlashBackwardIsDeterministic) {
  TRIDENT_REQUIRE_GPU();
  const AttnShape s = GetParam();
  const Reference r = make_reference(s, false);
  const FlashRun a = run_flash(r, s), b = run_flash(r, s);
  ASSERT_EQ(a.dqkv.size(), b.dqkv.size());
  EXPECT_EQ(std::memcmp(a.dqkv.data(), b.dqkv.data(), a.dqkv.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)), 0);
}

TEST_P(AttentionTest, CudnnMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const AttnShape s = GetParam();
  const CudnnHandle handle;
  cuda::CudnnAttention attention(handle.get());
  std::string why;
  if (!attention.supported(s.B, s.T, s.C, s.NH, &why)) GTEST_SKIP() << why;

  const Reference r = make_reference(s, true);
  DeviceBuffer<uint16_t> qkv(to_bf16(r.qkv)), dout(to_bf16(r.dout));
  DeviceBuffer<uint16_t> out(r.out.size()), dqkv(r.qkv.size());
  DeviceBuffer<float> stats(size_t(s.B) * s.NH * s.T);
  attention.forward(as_bf16(out), stats.get(), as_bf16(qkv), s.B, s.T, s.C, s.NH, nullptr);
  attention.backward(as_bf16(dqkv), as_bf16(dout), as_bf16(qkv), as_bf16(out), stats.get(), s.B,
                     s.T, s.C, s.NH, nullptr);
  EXPECT_LE(rel_err(from_bf16(out.download()), to_double(r.out)), kBf16Tol) << "out";
  EXPECT_LE(rel_err(stats.download(), r.lse), kBf16Tol) << "stats";
  EXPECT_LE(rel_err(from_bf16(dqkv.download()), to_double(r.dqkv)), kBf16Tol) << "dqkv";
}

// CudnnMatchesCpu skips shapes cuDNN rejects, so a graph cuDNN never accepts would pass
// silently (and training would quietly fall back to flash). On Hopper, GPT-2's shape must plan.
TEST(CudnnAttention, PlansGpt2ShapeOnHopper) {
  TRIDENT_REQUIRE_GPU();
  int device = 0;
  cudaDeviceProp prop{};
  TRIDENT_CUDA(cudaGetDevice(&device));
  TRIDENT_CUDA(cudaGetDeviceProperties(&prop, device));
  if (prop.major != 9) GTEST_SKIP() << "not Hopper (sm_" << prop.major << prop.minor << ")";
  const CudnnHandle handle;
  cuda::CudnnAttention attention(handle.get());
  std::string why;
  EXPECT_TRUE(attention.supported(4, 64, 768, 12, &why)) << why;
}

// HS = 32, 64, 128; T below, at and across tile boundaries (64 for HS ≤ 64, 32 for HS = 128).
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Values(AttnShape{2, 64, 128, 4},   // HS 32, one full tile
                                           AttnShape{1, 100, 192, 3},  // HS 64, partial tile
                                           AttnShape{2, 257, 256, 2},  // HS 128, 9 tiles
                                           AttnShape{3, 1, 64, 1},     // HS 64, one token
                                           AttnShape{1, 200, 128, 2}   // HS 64, 4 tiles
                                           ));

}  // namespace
}  // namespace trident::testing
