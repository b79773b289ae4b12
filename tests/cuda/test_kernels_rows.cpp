// Row-wise kernels (encoder, layernorm, bias gradient, cross-entropy) against their CPU twins on
// odd and GPT-2-like shapes; plus determinism of the reductions. Checks: kernel_checks_rows.h.
#include <gtest/gtest.h>

#include <cstring>
#include <initializer_list>
#include <tuple>

#include "kernel_checks_rows.h"

namespace trident::testing {
namespace {

using Shapes2 = std::initializer_list<std::tuple<int, int>>;
using Shapes3 = std::initializer_list<std::tuple<int, int, int>>;
using Shapes4 = std::initializer_list<std::tuple<int, int, int, int>>;

TEST(KernelEncoder, ForwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  // C = 96 and 768 take the float4 path, 37 and 1601 the scalar one.
  for (auto [B, T, C] : Shapes3{{2, 5, 37}, {3, 37, 96}, {2, 64, 768}, {1, 7, 1601}})
    expect_within(check_encoder_forward(B, T, C, 50, 11), fmt::format("B={} T={} C={}", B, T, C));
}

TEST(KernelEncoder, BackwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  // vocab 7: every token repeats many times. C = 1600 needs two channel chunks of dwte.
  for (auto [B, T, C, vocab] :
       Shapes4{{3, 37, 96, 7}, {2, 300, 1600, 7}, {4, 64, 768, 1000}, {1, 1, 5, 3}})
    expect_within(check_encoder_backward(B, T, C, vocab, true, true, 12),
                  fmt::format("B={} T={} C={} vocab={}", B, T, C, vocab));
}

// GPT-2 124M's shape with real-data-like repetition (Note [Deterministic dwte]): 32768 rows,
// half of them one token. The sums are the CPU's additions in its order, so the fp32
// tolerance (rounding of the same adds) holds however long a token's run is.
TEST(KernelEncoder, BackwardWithGpt2LikeRepetitionMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  expect_within(check_encoder_backward(32, 1024, 768, 50304, true, true, 15, /*skewed=*/true),
                "B=32 T=1024 C=768 vocab=50304, half the rows one token");
}

// Same inputs, two runs at that shape: bitwise the same dwte and dwpe (the sort into token runs
// and the sums over them use no atomics; Note [Deterministic dwte]).
TEST(KernelEncoder, BackwardIsDeterministic) {
  TRIDENT_REQUIRE_GPU();
  const int B = 32, T = 1024, C = 768, vocab = 50304;
  std::mt19937 rng(16);
  const std::vector<int32_t> tok = encoder_tokens(size_t(B) * T, vocab, /*skewed=*/true, rng);
  const std::vector<float> dout = random_floats(size_t(B) * T * C, rng);
  const std::vector<float> dwte = random_floats(size_t(vocab) * C, rng);
  const std::vector<float> dwpe = random_floats(size_t(T) * C, rng);
  const EncoderGrads first = run_encoder_backward_cuda(dwte, dwpe, dout, tok, true, true, B, T, C);
  const EncoderGrads second = run_encoder_backward_cuda(dwte, dwpe, dout, tok, true, true, B, T, C);
  EXPECT_FALSE(same_bits(first.dwte, dwte));  // the kernel ran: dwte took the gradient
  EXPECT_TRUE(same_bits(first.dwte, second.dwte));
  EXPECT_TRUE(same_bits(first.dwpe, second.dwpe));
}

TEST(KernelEncoder, BackwardWithOneGradientNull) {
  TRIDENT_REQUIRE_GPU();
  expect_within(check_encoder_backward(2, 37, 96, 5, true, false, 13), "dwpe null");
  expect_within(check_encoder_backward(2, 37, 96, 5, false, true, 14), "dwte null");
}

TEST(KernelLayernorm, ForwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  // C = 2560: NeoX 2.7B's. C = 4096: the row cache passes 48 KB (from C = 3073), so this kernel
  // too needs its shared-memory opt-in.
  for (auto [N, C] :
       Shapes2{{37, 1600}, {64, 96}, {5, 37}, {1000, 768}, {3, 1}, {7, 2560}, {3, 4096}})
    expect_within(check_layernorm_forward(N, C, 21), fmt::format("N={} C={}", N, C));
}

// model.bias false: no shift (b null), as the CPU twin.
TEST(KernelLayernorm, ForwardWithoutBiasMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  for (auto [N, C] : Shapes2{{37, 1600}, {5, 37}})
    expect_within(check_layernorm_forward(N, C, 28, /*with_bias=*/false),
                  fmt::format("N={} C={}", N, C));
}

TEST(KernelLayernorm, BackwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  // N = 1000 > 128 row chunks, with a last chunk shorter than the others. C = 1600 passes the
  // 48 KB of shared memory, C = 2560 (NeoX 2.7B) and 4096 then need larger opt-ins.
  for (auto [N, C] :
       Shapes2{{37, 1600}, {64, 96}, {5, 37}, {1000, 768}, {300, 1024}, {7, 2560}, {3, 4096}})
    expect_within(check_layernorm_backward(N, C, 22), fmt::format("N={} C={}", N, C));
}

// Same inputs, two runs: bitwise the same dinp, dw and db (no atomics in the reductions).
TEST(KernelLayernorm, BackwardIsDeterministic) {
  TRIDENT_REQUIRE_GPU();
  const int N = 1000, C = 1600;
  const LayernormBackwardInputs in(N, C, 23);
  const LayernormBackwardOutputs first = run_layernorm_backward_cuda(in, N, C);
  const LayernormBackwardOutputs second = run_layernorm_backward_cuda(in, N, C);
  EXPECT_TRUE(same_bits(first.dinp, second.dinp));
  EXPECT_TRUE(same_bits(first.dw, second.dw));
  EXPECT_TRUE(same_bits(first.db, second.db));
}

TEST(KernelBiasGrad, MatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  for (auto [N, OC] : Shapes2{{37, 1600}, {64, 96}, {1000, 2304}, {5, 3}, {1, 7}})
    expect_within(check_bias_backward(N, OC, 31), fmt::format("N={} OC={}", N, OC));
}

// The three GEMMs of a linear layer through the CUDA backend (cuBLASLt's row-major mapping,
// the bias epilogue, beta = 1 for dw), on shapes where N, C and OC all differ.
TEST(CudaBackendMatmul, MatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  const std::unique_ptr<Backend> gpu = make_cuda_backend();
  for (auto [N, C, OC] : Shapes3{{37, 13, 21}, {64, 128, 384}, {5, 96, 7}, {300, 768, 2304}})
    expect_within(check_matmul(*gpu, N, C, OC, 32), fmt::format("N={} C={} OC={}", N, C, OC));
}

// N, V, Vp: the decks' vocabularies (GPT-2's padded, Llama's 32000 and Llama 3's 128256
// unpadded) and small odd ones.
constexpr std::tuple<int, int, int> kCrossentropyShapes[] = {
    {37, 250, 384},  {4, 50257, 50304}, {3, 5, 5},
    {2, 1000, 1001}, {2, 32000, 32000}, {2, 128256, 128256}};

TEST(KernelCrossentropy, ForwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  for (auto [N, V, Vp] : kCrossentropyShapes)
    expect_within(check_crossentropy_forward(N, V, Vp, 41),
                  fmt::format("N={} V={} Vp={}", N, V, Vp));
}

TEST(KernelCrossentropy, BackwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  for (auto [N, V, Vp] : kCrossentropyShapes)
    expect_within(check_crossentropy_backward(N, V, Vp, 42),
                  fmt::format("N={} V={} Vp={}", N, V, Vp));
}

}  // namespace
}  // namespace trident::testing
