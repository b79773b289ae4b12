// Causal attention on the GPU against the CPU twin (Backend::attention_forward/backward):
// the fp32 flash kernels (kernels/attention_flash.cu) and cuDNN's fused bf16 attention
// (kernels/attention_cudnn.cu). The CPU twin saves probabilities, the GPU paths save the
// log-sum-exp, so the comparisons are on out, dqkv and (against a double host reference) lse.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>
#include <set>
#include <string>
#include <tuple>
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

struct AttnShape {
  int B, T, C, NH;
};

std::string shape_name(const AttnShape& s) {
  return "B" + std::to_string(s.B) + "_T" + std::to_string(s.T) + "_C" + std::to_string(s.C) +
         "_NH" + std::to_string(s.NH);
}
void PrintTo(const AttnShape& s, std::ostream* os) { *os << shape_name(s); }

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
  cuda::flash_attention_forward_cuda(out.get(), lse.get(), qkv.get(), s.B, s.T, s.C, s.NH, nullptr);
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

// cuDNN's bf16 forward and backward against the CPU twin; the shape must have a plan.
void expect_cudnn_matches_cpu(cuda::CudnnAttention& attention, const AttnShape& s) {
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

// These shapes are not ones trident's decks run (DeckShapesPlanAndMatchCpu has those): where
// cuDNN has no plan, run.attention auto uses the flash kernel, which FlashMatchesCpu covers.
// So a rejection here is a plain skip naming cuDNN's reason, not a want of hardware: it stays
// a skip under TRIDENT_REQUIRE_GPU=1, and tools/gpu-check.sh reports it by the words "a shape
// no deck runs" instead of failing (Note [GPU check phases]).
TEST_P(AttentionTest, CudnnMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const AttnShape s = GetParam();
  const CudnnHandle handle;
  cuda::CudnnAttention attention(handle.get());
  std::string why;
  if (!attention.supported(s.B, s.T, s.C, s.NH, &why))
    GTEST_SKIP() << "cuDNN has no fused-attention plan for " << shape_name(s)
                 << ", a shape no deck runs: " << why;
  expect_cudnn_matches_cpu(attention, s);
}

// The attention shapes trident's GPT-2 decks run with cuDNN (inputs/gpt2-*.yaml whose
// run.attention is not flash): each deck's head layout (C, NH) at its own seq_len and at 1024
// (tools/gpu-check.sh benchmarks every GPT-2 deck at 1024), at the deck's micro_batch.
struct DeckShape {
  std::string deck;
  AttnShape shape;
};
std::vector<DeckShape> deck_attention_shapes() {
  std::vector<std::string> paths;
  for (const auto& e : std::filesystem::directory_iterator(source_file("inputs"))) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("gpt2-") && name.ends_with(".yaml")) paths.push_back(e.path().string());
  }
  std::sort(paths.begin(), paths.end());
  std::vector<DeckShape> shapes;
  for (const std::string& path : paths) {
    const Deck d = load_deck(path);
    if (d.run.attention == "flash") continue;  // cuDNN is never asked
    const std::string deck = std::filesystem::path(path).filename().string();
    for (int T : std::set<int>{d.model.seq_len, 1024})
      shapes.push_back({deck, {d.train.micro_batch, T, d.model.d_model, d.model.heads}});
    // The micro-batches tools/gpu-check.sh tries at 1024 (B 32 is GPT-2's usual 0.5M-token
    // batch on 16 GPUs): a refusal there would put the benchmarks on the fp32 flash kernel.
    for (int B : {8, 16, 32, 64})
      if (B != d.train.micro_batch || d.model.seq_len != 1024)
        shapes.push_back({deck, {B, 1024, d.model.d_model, d.model.heads}});
  }
  return shapes;
}

// Which shapes DeckShapesPlanAndMatchCpu requires, checked without a GPU against the decks as
// written: all three GPT-2 decks, GPT-2's head size 64 throughout, and 124M (which the deck runs
// at sequence 64, micro-batch 4) also at 1024.
TEST(CudnnAttention, DeckShapesCoverEveryGpt2Deck) {
  std::set<std::string> decks, at_b32_t1024;
  std::set<int> gpt2_124m_lengths;
  for (const DeckShape& d : deck_attention_shapes()) {
    decks.insert(d.deck);
    EXPECT_EQ(d.shape.C / d.shape.NH, 64) << d.deck;
    if (d.deck == "gpt2-124m.yaml" && d.shape.B == 4 && d.shape.C == 768 && d.shape.NH == 12)
      gpt2_124m_lengths.insert(d.shape.T);
    if (d.shape.B == 32 && d.shape.T == 1024) at_b32_t1024.insert(d.deck);
  }
  for (const char* deck : {"gpt2-124m.yaml", "gpt2-350m.yaml", "gpt2-1.5b.yaml"}) {
    EXPECT_TRUE(decks.contains(deck)) << deck;
    EXPECT_TRUE(at_b32_t1024.contains(deck)) << deck << " at B 32, T 1024";
  }
  EXPECT_EQ(gpt2_124m_lengths, (std::set<int>{64, 1024}));
}

// A shape a deck runs must plan: a rejection would silently move training onto the slower
// flash kernel. cuDNN's fused attention needs sm_80 or newer (its support matrix); the
// numerics are checked at micro-batch 1 or 2 (the CPU twin at 16 × 1024² would take minutes),
// which needs its own plan, required too.
TEST(CudnnAttention, DeckShapesPlanAndMatchCpu) {
  TRIDENT_REQUIRE_GPU();
  int device = 0;
  cudaDeviceProp prop{};
  TRIDENT_CUDA(cudaGetDevice(&device));
  TRIDENT_CUDA(cudaGetDeviceProperties(&prop, device));
  if (prop.major < 8)
    TRIDENT_GPU_SKIP("cuDNN's fused attention needs sm_80 or newer; this GPU is sm_" +
                     std::to_string(prop.major) + std::to_string(prop.minor));
  const std::vector<DeckShape> shapes = deck_attention_shapes();
  ASSERT_FALSE(shapes.empty()) << "no inputs/gpt2-*.yaml deck uses cuDNN attention";
  const CudnnHandle handle;
  cuda::CudnnAttention attention(handle.get());
  std::set<std::tuple<int, int, int>> compared;  // (T, C, NH)
  for (const DeckShape& d : shapes) {
    const AttnShape& s = d.shape;
    SCOPED_TRACE(d.deck + " " + shape_name(s));
    std::string why;
    EXPECT_TRUE(attention.supported(s.B, s.T, s.C, s.NH, &why))
        << "cuDNN has no plan for a shape " << d.deck << " runs: " << why;
    if (!compared.insert({s.T, s.C, s.NH}).second) continue;
    const AttnShape small{s.T <= 256 ? 2 : 1, s.T, s.C, s.NH};
    ASSERT_TRUE(attention.supported(small.B, small.T, small.C, small.NH, &why))
        << "cuDNN has no plan for " << shape_name(small) << ": " << why;
    expect_cudnn_matches_cpu(attention, small);
    std::cout << "cuDNN attention: " << d.deck << " " << shape_name(s) << " plans (backward "
              << attention.backward_graph(s.B, s.T, s.C, s.NH) << "), " << shape_name(small)
              << " matches the CPU\n";
  }
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
