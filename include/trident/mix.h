// Counter-based randomness shared by initialisation and the sample order: both must give the
// same numbers on every machine, thread count and layout, so they hash counters instead of
// carrying generator state.
#pragma once

#include <cstdint>

namespace trident {

// SplitMix64's finaliser (Steele, Lea, Flood 2014): a bijective mix of a 64-bit counter.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace trident
