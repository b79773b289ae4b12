// GPT-2's initialisation, for every family, with a counter-based generator.
//
// Every element's value is a pure function of (seed, parameter name, element index), so the
// weights do not depend on the thread count, and a later tensor-parallel shard can take its
// slice of the same global weights by global index.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "trident/check.h"
#include "trident/mix.h"
#include "trident/model.h"

namespace trident {
namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// Uniform in (0, 1]: never 0, so log() below is finite.
double uniform_open(uint64_t bits) { return (double((bits >> 11) + 1)) * 0x1.0p-53; }

// Standard normal number `index` of the stream `key` (Box–Muller over pairs of counters).
double normal_at(uint64_t key, uint64_t index) {
  uint64_t pair = index / 2;
  double u1 = uniform_open(splitmix64(key ^ splitmix64(2 * pair)));
  double u2 = uniform_open(splitmix64(key ^ splitmix64(2 * pair + 1)));
  double r = std::sqrt(-2.0 * std::log(u1));
  double angle = 2.0 * std::numbers::pi * u2;
  return (index % 2 == 0) ? r * std::cos(angle) : r * std::sin(angle);
}

bool ends_with(const std::string& s, const char* suffix) {
  std::string t(suffix);
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

}  // namespace

void GPT::init_weights(uint64_t seed) { init_params(seed, 0, infos_.size()); }

void GPT::init_params(uint64_t seed, size_t first, size_t end, float* base) {
  TRIDENT_CHECK(first <= end && end <= infos_.size(), "init_params [{}, {}) of {}", first, end,
                infos_.size());
  if (first == end) return;
  const double std_base = 0.02;
  const double std_residual = 0.02 / std::sqrt(2.0 * cfg_.layers);
  // A view of the parameters' span only (on a host backend no copy at all). params(): the
  // bf16 copy is stale from here on.
  size_t view_lo = SIZE_MAX, view_hi = 0;
  for (size_t i = first; i < end; ++i) {
    view_lo = std::min(view_lo, infos_[i].offset);
    view_hi = std::max(view_hi, infos_[i].offset + infos_[i].count);
  }
  HostView<float> host(be_, (base ? base : params()) + view_lo, view_hi - view_lo, /*load=*/true);
  for (size_t i = first; i < end; ++i) {
    const ParamInfo& p = infos_[i];
    float* w = host.data() + (p.offset - view_lo);
    const bool is_ln_weight =
        ends_with(p.name, "ln1w") || ends_with(p.name, "ln2w") || p.name == "lnfw";
    if (is_ln_weight) {
      std::fill(w, w + p.count, 1.0f);
      continue;
    }
    if (!p.decay) {  // biases and LayerNorm shifts
      std::fill(w, w + p.count, 0.0f);
      continue;
    }
    const double stddev =
        (ends_with(p.name, "attprojw") || ends_with(p.name, "fcprojw")) ? std_residual : std_base;
    const uint64_t key = splitmix64(seed ^ fnv1a(p.name));
    // Values are drawn by global index (Note [Tensor-parallel shards]), so every layout holds
    // the same global weights. Padded vocabulary rows of wte stay zero.
    const bool vocab_rows = p.name == "wte" || p.name == "lmw";
    const size_t live = vocab_rows ? size_t(cfg_.vocab) * cfg_.channels : SIZE_MAX;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < p.count; ++i) {
      const size_t g = p.global_index(i);
      w[i] = g < live ? float(stddev * normal_at(key, g)) : 0.0f;
    }
  }
  host.commit();
}

}  // namespace trident
