// Grouped-query attention on the GPU against the CPU twin (Backend::attention_forward_gqa /
// attention_backward_gqa): the fp32 flash kernels and cuDNN's bf16 graph with K and V of KVH < NH
// heads. Backward's dK and dV are the sums over each kv head's query heads, so a wrong group
// index or a missing term of the sum shows as an error of order 1 in those columns of dqkv.
// Tolerances are test_attention.cpp's: 1e-5 for fp32 (different summation orders and exp
// approximations; a group sums at most 8 heads' terms, which keeps the rounding far below it),
// 1e-2 for bf16 (inputs, P and dS rounded to 8 significant bits inside cuDNN's kernel).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "attention_cudnn.h"
#include "attention_flash.h"
#include "attention_reference.h"
#include "backend_test_util.h"
#include "gpu_test_util.h"
#include "source_file.h"
#include "trident/backend.h"
#include "trident/deck.h"

namespace trident::testing {
namespace {

constexpr double kFp32Tol = 1e-5;
constexpr double kBf16Tol = 1e-2;

struct GqaShape {
  int B, T, NH, KVH, HS;
  size_t qkv_floats() const { return size_t(B) * T * (NH + 2 * KVH) * HS; }
  size_t out_floats() const { return size_t(B) * T * NH * HS; }
  size_t lse_floats() const { return size_t(B) * NH * T; }
};
std::string shape_name(const GqaShape& s) {
  return fmt::format("B{}_T{}_NH{}_KVH{}_HS{}", s.B, s.T, s.NH, s.KVH, s.HS);
}
void PrintTo(const GqaShape& s, std::ostream* os) { *os << shape_name(s); }

// Inputs uniform in [-1, 1] (bf16-rounded first for cuDNN), the CPU twin's out and dqkv, and
// the log-sum-exp per query row in double.
struct GqaReference {
  std::vector<float> qkv, dout, out, dqkv;
  std::vector<double> lse;
};
GqaReference gqa_reference(const GqaShape& s, bool bf16_inputs, uint32_t seed = 4321) {
  std::mt19937 rng(seed);
  GqaReference r;
  r.qkv = to_float(uniform(s.qkv_floats(), rng));
  r.dout = to_float(uniform(s.out_floats(), rng));
  if (bf16_inputs) {
    r.qkv = from_bf16(to_bf16(r.qkv));
    r.dout = from_bf16(to_bf16(r.dout));
  }
  auto cpu = make_cpu_backend(2);
  std::vector<float> att(size_t(s.B) * s.NH * s.T * s.T), scratch(att.size());
  r.out.resize(s.out_floats());
  r.dqkv.resize(r.qkv.size());
  cpu->attention_forward_gqa(r.out.data(), att.data(), r.qkv.data(), s.B, s.T, s.NH, s.KVH, s.HS);
  cpu->attention_backward_gqa(r.dqkv.data(), scratch.data(), r.dout.data(), r.qkv.data(),
                              r.out.data(), att.data(), s.B, s.T, s.NH, s.KVH, s.HS);
  // lse: log Σ_{j≤i} exp(q_i·k_j / sqrt(HS)), query head h against kv head h / (NH/KVH).
  const size_t row = size_t(s.NH + 2 * s.KVH) * s.HS;
  const double scale = 1.0 / std::sqrt(double(s.HS));
  r.lse.resize(s.lse_floats());
  std::vector<double> scores(size_t(s.T));
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h) {
      const int kv = h / (s.NH / s.KVH);
      for (int i = 0; i < s.T; ++i) {
        const float* q = r.qkv.data() + (size_t(b) * s.T + i) * row + size_t(h) * s.HS;
        double mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const float* k = r.qkv.data() + (size_t(b) * s.T + j) * row + size_t(s.NH + kv) * s.HS;
          double dot = 0;
          for (int d = 0; d < s.HS; ++d) dot += double(q[d]) * k[d];
          scores[size_t(j)] = dot * scale;
          mx = std::max(mx, scores[size_t(j)]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += std::exp(scores[size_t(j)] - mx);
        r.lse[(size_t(b) * s.NH + h) * s.T + i] = mx + std::log(sum);
      }
    }
  return r;
}

struct FlashRun {
  std::vector<float> out, lse, dqkv;
};
FlashRun run_flash(const GqaReference& r, const GqaShape& s) {
  DeviceBuffer<float> qkv(r.qkv), dout(r.dout);
  DeviceBuffer<float> out(s.out_floats()), lse(s.lse_floats()), dqkv(s.qkv_floats());
  DeviceBuffer<float> scratch(
      cuda::flash_attention_backward_scratch_floats(s.B, s.T, s.NH * s.HS, s.NH));
  cuda::flash_attention_forward_gqa_cuda(out.get(), lse.get(), qkv.get(), s.B, s.T, s.NH, s.KVH,
                                         s.HS, nullptr);
  cuda::flash_attention_backward_gqa_cuda(dqkv.get(), scratch.get(), dout.get(), qkv.get(),
                                          out.get(), lse.get(), s.B, s.T, s.NH, s.KVH, s.HS,
                                          nullptr);
  return {out.download(), lse.download(), dqkv.download()};
}

class GqaAttentionTest : public ::testing::TestWithParam<GqaShape> {};

TEST_P(GqaAttentionTest, FlashMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const GqaShape s = GetParam();
  const GqaReference r = gqa_reference(s, false);
  const FlashRun g = run_flash(r, s);
  EXPECT_LE(rel_err(g.out, to_double(r.out)), kFp32Tol) << "out";
  EXPECT_LE(rel_err(g.lse, r.lse), kFp32Tol) << "lse";
  EXPECT_LE(rel_err(g.dqkv, to_double(r.dqkv)), kFp32Tol) << "dqkv";
}

// The group's sums are in registers in head order: two runs give the same bits.
TEST_P(GqaAttentionTest, FlashBackwardIsDeterministic) {
  TRIDENT_REQUIRE_GPU();
  const GqaShape s = GetParam();
  const GqaReference r = gqa_reference(s, false);
  const FlashRun a = run_flash(r, s), b = run_flash(r, s);
  EXPECT_EQ(std::memcmp(a.dqkv.data(), b.dqkv.data(), a.dqkv.size() * sizeof(float)), 0);
}

void expect_cudnn_matches_cpu(cuda::CudnnAttention& attention, const GqaShape& s) {
  const GqaReference r = gqa_reference(s, true);
  DeviceBuffer<uint16_t> qkv(to_bf16(r.qkv)), dout(to_bf16(r.dout));
  DeviceBuffer<uint16_t> out(s.out_floats()), dqkv(s.qkv_floats());
  DeviceBuffer<float> stats(s.lse_floats());
  attention.forward_gqa(as_bf16(out), stats.get(), as_bf16(qkv), s.B, s.T, s.NH, s.KVH, s.HS,
                        nullptr);
  attention.backward_gqa(as_bf16(dqkv), as_bf16(dout), as_bf16(qkv), as_bf16(out), stats.get(), s.B,
                         s.T, s.NH, s.KVH, s.HS, nullptr);
  EXPECT_LE(rel_err(from_bf16(out.download()), to_double(r.out)), kBf16Tol) << "out";
  EXPECT_LE(rel_err(stats.download(), r.lse), kBf16Tol) << "stats";
  EXPECT_LE(rel_err(from_bf16(dqkv.download()), to_double(r.dqkv)), kBf16Tol) << "dqkv";
}

// As test_attention.cpp's CudnnMatchesCpu: these are not deck shapes (LlamaDeckShapePlans has
// that), so a refusal is a skip naming cuDNN's reason, reported by tools/gpu-check.sh.
TEST_P(GqaAttentionTest, CudnnMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const GqaShape s = GetParam();
  const CudnnHandle handle;
  cuda::CudnnAttention attention(handle.get());
  std::string why;
  if (!attention.supported_gqa(s.B, s.T, s.NH, s.KVH, s.HS, &why))
    GTEST_SKIP() << "cuDNN has no fused-attention plan for " << shape_name(s)
                 << ", a shape no deck runs: " << why;
  expect_cudnn_matches_cpu(attention, s);
}

// The Llama deck tools/gpu-check.sh benchmarks (inputs/llama-1b.yaml) must plan on cuDNN at its
// own shape (a refusal would put its attention on the fp32 flash kernel), and match the CPU at
// a smaller batch and length with the same heads.
TEST(GqaCudnnAttention, LlamaDeckShapePlans) {
  TRIDENT_REQUIRE_GPU();
  int device = 0;
  cudaDeviceProp prop{};
  TRIDENT_CUDA(cudaGetDevice(&device));
  TRIDENT_CUDA(cudaGetDeviceProperties(&prop, device));
  if (prop.major < 8)
    TRIDENT_GPU_SKIP("cuDNN's fused attention needs sm_80 or newer; this GPU is sm_" +
                     std::to_string(prop.major) + std::to_string(prop.minor));
  const Deck d = load_deck(source_file("inputs/llama-1b.yaml"));
  const int NH = d.model.heads, KVH = d.model.kv_heads, HS = d.model.d_model / d.model.heads;
  ASSERT_LT(KVH, NH) << "the deck is meant to have grouped kv heads";
  const CudnnHandle handle;
  cuda::CudnnAttention attention(handle.get());
  std::string why;
  const GqaShape deck{d.train.micro_batch, d.model.seq_len, NH, KVH, HS};
  EXPECT_TRUE(attention.supported_gqa(deck.B, deck.T, NH, KVH, HS, &why))
      << "cuDNN has no plan for the llama-1b deck's attention " << shape_name(deck) << ": " << why;
  const GqaShape small{1, 256, NH, KVH, HS};
  ASSERT_TRUE(attention.supported_gqa(small.B, small.T, NH, KVH, HS, &why))
      << "cuDNN has no plan for " << shape_name(small) << ": " << why;
  expect_cudnn_matches_cpu(attention, small);
  std::cout << "cuDNN grouped attention: " << shape_name(deck) << " plans (backward "
            << attention.backward_graph_gqa(deck.B, deck.T, NH, KVH, HS) << ")\n";
}

// Groups of 2 and 4, multi-query (KVH 1), and KVH = NH (the multi-head kernels' path through
// the grouped code); HS 32, 64, 128; T below, at and across the tile sizes (64, and 32 for
// HS 128).
INSTANTIATE_TEST_SUITE_P(Shapes, GqaAttentionTest,
                         ::testing::Values(GqaShape{2, 64, 4, 2, 32},   // one full tile
                                           GqaShape{1, 100, 8, 2, 64},  // partial tile
                                           GqaShape{2, 97, 4, 1, 128},  // multi-query, 4 tiles
                                           GqaShape{1, 130, 6, 3, 64},  // groups of 2, 3 tiles
                                           GqaShape{2, 65, 2, 2, 64},   // KVH = NH
                                           GqaShape{3, 1, 4, 1, 64}     // one token
                                           ));

}  // namespace
}  // namespace trident::testing
