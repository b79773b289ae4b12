// SampleOrder: global sample position -> sample -> token window (see include/trident/data.h).
#include <random>

#include "trident/check.h"
#include "trident/data.h"
#include "trident/mix.h"

namespace trident {

namespace {

// A uniform integer in [0, n]. Written out (rejection sampling on the top bits) instead of
// std::uniform_int_distribution, whose algorithm differs between standard libraries: the
// shuffled order must be the same wherever the run is repeated.
uint64_t uniform_upto(std::mt19937_64& rng, uint64_t n) {
  if (n == 0) return 0;
  int shift = __builtin_clzll(n);  // keep just enough bits to cover n
  for (;;) {
    uint64_t r = rng() >> shift;
    if (r <= n) return r;
  }
}

}  // namespace

SampleOrder::SampleOrder(const TokenDataset& data, int seq_len, bool shuffle, uint64_t seed)
    : data_(data), seq_len_(seq_len), shuffle_(shuffle), seed_(seed), num_samples_(0) {
  if (seq_len <= 0) input_error("{}: model.seq_len {} must be positive", data.path(), seq_len);
  num_samples_ = (data.n_tokens() - 1) / static_cast<size_t>(seq_len);
  if (num_samples_ == 0)
    input_error("{}: {} tokens are too few for one sample of model.seq_len {} (needs {} tokens)",
                data.path(), data.n_tokens(), seq_len, static_cast<uint64_t>(seq_len) + 1);
}

// Note [Epoch permutation]
// Epoch e's order is a Fisher-Yates shuffle of 0..S-1 driven by mt19937_64 seeded with
// splitmix64(splitmix64(seed) ^ e). It depends on (seed, e, S) only, so every rank computes the
// same permutation without communicating, and any rank can jump to any global position (after
// a resume, say) by recomputing one epoch.
size_t SampleOrder::sample_at(uint64_t g) const {
  const uint64_t S = num_samples_;
  if (!shuffle_) return static_cast<size_t>(g % S);
  const uint64_t epoch = g / S;
  if (epoch != cached_epoch_) {
    perm_.resize(S);
    for (uint64_t i = 0; i < S; ++i) perm_[i] = i;
    std::mt19937_64 rng(splitmix64(splitmix64(seed_) ^ epoch));
    for (uint64_t i = S - 1; i > 0; --i) std::swap(perm_[i], perm_[uniform_upto(rng, i)]);
    cached_epoch_ = epoch;
  }
  return static_cast<size_t>(perm_[g % S]);
}

void SampleOrder::fill(uint64_t g0, int B, int32_t* inputs, int32_t* targets, int cp,
                       int cp_rank) const {
  const size_t T = static_cast<size_t>(seq_len_);
  TRIDENT_CHECK(cp >= 1 && cp_rank >= 0 && cp_rank < cp && (cp == 1 || T % (2 * size_t(cp)) == 0),
                "cp rank {} of {} with sequences of {}", cp_rank, cp, T);
  const size_t c = T / (2 * size_t(cp)), Tl = T / size_t(cp);
  const size_t chunk[2] = {size_t(cp_rank), 2 * size_t(cp) - 1 - size_t(cp_rank)};
  std::vector<int32_t> window(T + 1);
  for (int b = 0; b < B; ++b) {
    size_t start = sample_at(g0 + static_cast<uint64_t>(b)) * T;
    data_.read(start, T + 1, window.data());
    if (cp == 1) {
      std::copy(window.begin(), window.begin() + T, inputs + b * T);
      std::copy(window.begin() + 1, window.end(), targets + b * T);
      continue;
    }
    for (int k = 0; k < 2; ++k) {
      const auto from = window.begin() + std::ptrdiff_t(chunk[k] * c);
      const size_t to = size_t(b) * Tl + size_t(k) * c;
      std::copy(from, from + std::ptrdiff_t(c), inputs + to);
      std::copy(from + 1, from + 1 + std::ptrdiff_t(c), targets + to);
    }
  }
}

}  // namespace trident
