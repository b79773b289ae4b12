// Models and inputs for the model tests: the bf16 tests' small model, token ids drawn uniformly
// from the vocabulary, and one training micro-step (zeroed gradients, forward with targets,
// backward).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "trident/model.h"

namespace trident::testing {

// The bf16 tests' model. Wider than test_gpt's tiny one (C 64): a bf16 rounding error of 2^-9
// per value should average out over dot products of realistic length, not dominate 16-term
// ones. Run at kSmallB × kSmallT.
inline GPTConfig small_config() {
  GPTConfig c;
  c.layers = 2;
  c.channels = 64;
  c.heads = 4;
  c.vocab = 50;  // padded to 128: the padded columns must get no gradient
  c.padded_vocab = GPTConfig::pad_vocab(c.vocab);
  c.max_seq_len = 16;
  return c;
}
constexpr int kSmallB = 2, kSmallT = 16;

inline GPTOptions bf16_options() {
  GPTOptions o;
  o.precision = Precision::kBf16;
  return o;
}

// n token ids in [0, vocab), from std::mt19937 seeded with `seed` (the same ids on every
// platform: mt19937's sequence is specified by the standard).
inline std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % uint32_t(vocab));
  return t;
}

// One forward and backward at loss scale 1; returns the loss, leaves the gradients in `m`.
inline float forward_backward(GPT& m, const std::vector<int32_t>& in,
                              const std::vector<int32_t>& tg, int B, int T) {
  m.zero_grads();
  const float loss = m.forward(in.data(), tg.data(), B, T);
  m.backward(1.0f);
  return loss;
}

}  // namespace trident::testing
