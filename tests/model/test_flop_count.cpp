// The FLOP count that `trident bench` and `train` divide by the peak for MFU
// (GPTConfig::train_flops_per_token), per family, against counts written out here from each
// block's matrices: a count too large would report MFU above what the machine did.
#include <gtest/gtest.h>

#include "trident/model_config.h"

namespace trident {
namespace {

GPTConfig shape(Family f, int L, int C, int NH, int V) {
  GPTConfig cfg;
  cfg.apply_family(f);
  cfg.layers = L, cfg.channels = C, cfg.heads = NH, cfg.vocab = V;
  cfg.padded_vocab = GPTConfig::pad_vocab(V);
  return cfg;
}

// Training FLOPs per token: 6 per matmul weight (forward 2, backward 4) plus the attention
// products QKᵀ and AV at 12·T·C per layer (forward 4·T·C, backward twice that).
double expected(double L, double T, double C, double matmul_weights) {
  return 6.0 * matmul_weights + 12.0 * L * T * C;
}

TEST(FlopCount, Gpt2SmallIsSevenHundredFortyEightMflopPerToken) {
  const GPTConfig cfg = shape(Family::kGPT2, 12, 768, 12, 50257);
  const double C = 768;
  // Per block: qkv 3C², attproj C², fc 4C², fcproj 4C²; the tied head C·V (the real vocab).
  const double weights = 12 * (3 * C * C + C * C + 4 * C * C + 4 * C * C) + C * 50257;
  EXPECT_DOUBLE_EQ(cfg.train_flops_per_token(64), expected(12, 64, C, weights));
  EXPECT_DOUBLE_EQ(cfg.train_flops_per_token(64), 748270080.0);  // docs/perf.md's 748 MFLOP
}

TEST(FlopCount, LlamaCountsSwigluThreeMatricesAndGqaNarrowKv) {
  GPTConfig cfg = shape(Family::kLlama, 12, 768, 12, 32000);  // inputs/llama-124m.yaml
  cfg.kv_heads = 4, cfg.mlp_hidden = 2048;
  const double C = 768, hs = 64, F = 2048;
  // Per block: q C·C, k and v C·(4·hs) each, o C·C; gate, up C·F each, down F·C. Head C·V.
  const double block = C * C + 2 * C * (4 * hs) + C * C + 3 * C * F;
  const double weights = 12 * block + C * 32000;
  EXPECT_DOUBLE_EQ(cfg.matmul_params(), weights);
  EXPECT_DOUBLE_EQ(cfg.train_flops_per_token(64), expected(12, 64, C, weights));
  EXPECT_DOUBLE_EQ(cfg.train_flops_per_token(64), 607518720.0);
  // Multi-head attention and a 4C GELU MLP would count more: the count follows the keys.
  GPTConfig mha = cfg;
  mha.kv_heads = 0;
  EXPECT_DOUBLE_EQ(mha.train_flops_per_token(64) - cfg.train_flops_per_token(64),
                   6.0 * 12 * 2 * C * (12 - 4) * hs);
}

TEST(FlopCount, NeoxUntiedHeadCountsOnceAndGeluHasTwoMatrices) {
  const GPTConfig cfg = shape(Family::kNeoX, 2, 256, 4, 1000);
  const double C = 256;
  const double weights = 2 * (3 * C * C + C * C + 4 * C * C + 4 * C * C) + C * 1000;
  EXPECT_DOUBLE_EQ(cfg.train_flops_per_token(128), expected(2, 128, C, weights));
}

}  // namespace
}  // namespace trident
