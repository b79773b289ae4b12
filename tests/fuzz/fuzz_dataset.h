// The property of the dataset targets (fuzz_tokens, fuzz_indexed): a dataset that opened reads
// back whole, every token below the vocab, and samples like any other.
#pragma once

#include <cstdint>
#include <vector>

#include "fuzz_support.h"
#include "trident/data.h"

namespace trident::fuzz {

// `shuffle` and `seed` vary the sample order with the input.
inline void check_reads_back(const TokenDataset& ds, int vocab, bool shuffle, uint64_t seed) {
  std::vector<int32_t> tokens(ds.n_tokens());
  ds.read(0, tokens.size(), tokens.data());
  for (int32_t t : tokens)
    if (t < 0 || t >= vocab)
      finding("an accepted dataset has a token outside the vocab", ds.describe());
  const int seq_len = 1 + static_cast<int>(tokens.size() % 7);
  if (tokens.size() >= static_cast<size_t>(seq_len) + 1) {
    SampleOrder order(ds, seq_len, shuffle, seed);
    std::vector<int32_t> in(seq_len), target(seq_len);
    for (size_t g = 0; g < 2 * order.num_samples(); ++g) order.fill(g, 1, in.data(), target.data());
  }
  (void)ds.describe();
}

}  // namespace trident::fuzz
