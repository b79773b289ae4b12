#include "bf16_sum.h"

#include <cstring>

#include "trident/check.h"

namespace trident::bf16 {
namespace {

inline uint16_t round_one(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float widen_one(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

extern "C" void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = round_one(widen_one(a[i]) + widen_one(b[i]));
}

}  // namespace

void from_float(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = round_one(in[i]);
}

void to_float(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = widen_one(in[i]);
}

MPI_User_function* sum_function() { return &bf16_sum; }

}  // namespace trident::bf16
