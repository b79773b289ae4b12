// The bf16 tensor-parallel tests' model (tests/mpi test_tp_bf16 and test_tp_overlap_bf16):
// C 64 as tests/model/test_gpt_bf16.cpp's model (a bf16 rounding should average out over dot
// products of some length); vocab 250 pads differently at tp 1 and 4. The deck refuses bf16 on
// the CPU (Note [bf16 activations]); the host definitions of the bf16 ops run it here.
#pragma once

#include <string>
#include <vector>

#include "train_harness.h"
#include "trident/deck.h"

namespace trident::testing {

inline Deck bf16_tp_deck(const std::string& family, const std::vector<std::string>& overrides,
                         int steps) {
  const std::string yaml = R"(
model: {layers: 2, d_model: 64, heads: 4, vocab: 250, seq_len: 16}
train: {micro_batch: 2, accum: 1, steps: 8, lr: 3.0e-3, warmup_steps: 2, seed: 7,
        val_every: 0}
data: {train: inputs/data/tiny-train.bin, shuffle: true}
run: {threads: 1}
)";
  std::vector<std::string> keys = family_keys(family);
  keys.push_back("train.steps=" + std::to_string(steps));
  keys.insert(keys.end(), overrides.begin(), overrides.end());
  Deck d = parse_deck(yaml, TRIDENT_SOURCE_DIR, keys);
  d.run.precision = "bf16";
  return d;
}

}  // namespace trident::testing
