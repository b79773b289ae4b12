// The vocab-parallel kernels (kernels/vocab_parallel.cu) against their CPU twins; the checks
// and their tolerances are in kernel_checks_vocab.h.
#include <gtest/gtest.h>

#include <initializer_list>
#include <tuple>

#include "kernel_checks_vocab.h"

namespace trident::testing {
namespace {

TEST(KernelVocabSlice, EmbeddingForwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  // B = 3: with one sequence the position n % T is n itself, so a kernel indexing wpe by n
  // would pass.
  for (int C : {96, 1600, 37})
    for (bool with_wpe : {true, false})
      expect_within(check_embedding_slice_forward(3, 37, C, with_wpe, 51),
                    fmt::format("C={} wpe={}", C, with_wpe));
}

TEST(KernelVocabSlice, EmbeddingBackwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  // Tokens over [0, 384) (mostly distinct, a third on this rank) and over [120, 136) (repeating,
  // a few off the slice); B = 4, T = 300 gives more rows than one block scans at a time; GPT-2
  // 124M's 32 × 1024 rows at C 768 with 384 ids, about 85 rows per id (the long runs of real
  // data at the size the model runs).
  using Shape = std::tuple<int, int, int, int, int>;
  for (auto [B, T, C, lo, hi] : std::initializer_list<Shape>{{1, 37, 96, 0, 384},
                                                             {1, 37, 1600, 0, 384},
                                                             {3, 13, 96, 120, 136},
                                                             {4, 300, 1600, 120, 136},
                                                             {2, 5, 37, 0, 384},
                                                             {32, 1024, 768, 0, 384}})
    for (bool with_wpe : {true, false})
      expect_within(
          check_embedding_slice_backward(B, T, C, lo, hi, with_wpe, 52),
          fmt::format("B={} T={} C={} tokens [{}, {}) wpe={}", B, T, C, lo, hi, with_wpe));
}

// Same inputs, two runs: bitwise the same gradients (no atomics).
TEST(KernelVocabSlice, EmbeddingBackwardIsDeterministic) {
  TRIDENT_REQUIRE_GPU();
  const int B = 4, T = 300, C = 1600;
  std::mt19937 rng(53);
  const std::vector<int32_t> tok = tokens_in(size_t(B) * T, 120, 136, rng);
  const std::vector<float> dout = random_floats(size_t(B) * T * C, rng);
  const std::vector<float> dwte = random_floats(size_t(kSliceV1 - kSliceV0) * C, rng);
  const std::vector<float> dwpe = random_floats(size_t(T) * C, rng);
  const EmbeddingSliceGrads first =
      run_embedding_slice_backward(dwte, dwpe, dout, tok, true, B, T, C);
  const EmbeddingSliceGrads second =
      run_embedding_slice_backward(dwte, dwpe, dout, tok, true, B, T, C);
  EXPECT_TRUE(same_bits(first.dwte, second.dwte));
  EXPECT_TRUE(same_bits(first.dwpe, second.dwpe));
}

TEST(KernelVocabSlice, CrossentropyStatsMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  // live = 0: a rank holding only padding (max -inf, sum 0, target 0). Vl = 16000 and 64128:
  // Llama's and Llama 3's vocabularies at tp 2.
  for (auto [N, Vl, live] : std::initializer_list<std::tuple<int, int, int>>{{37, 384, 250},
                                                                             {37, 384, 0},
                                                                             {37, 384, 384},
                                                                             {3, 25152, 25000},
                                                                             {3, 16000, 16000},
                                                                             {2, 64128, 64128}})
    expect_within(check_crossentropy_slice_stats(N, Vl, live, 54),
                  fmt::format("N={} Vl={} live={}", N, Vl, live));
}

TEST(KernelVocabSlice, CrossentropyCombineMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  for (int tp : {2, 3})
    for (int live : {250, 0, 384})
      expect_within(check_crossentropy_slice_combine(37, 384, tp, live, 55),
                    fmt::format("tp={} live={}", tp, live));
}

TEST(KernelVocabSlice, CrossentropyBackwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  for (int live : {250, 0, 384})
    expect_within(check_crossentropy_slice_backward(37, 384, live, 56),
                  fmt::format("live={}", live));
}

}  // namespace
}  // namespace trident::testing
