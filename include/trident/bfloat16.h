// bfloat16 on the host: the type of the model's bf16 activations (Note [bf16 activations] in
// src/backend/bf16_ops.cpp) as the Backend interface names them. Its layout is CUDA's
// __nv_bfloat16 (the upper 16 bits of an IEEE fp32), so a device backend passes the same
// memory to its kernels.
#pragma once

#include <cstdint>
#include <cstring>

namespace trident {

struct bfloat16 {
  uint16_t bits = 0;
};
static_assert(sizeof(bfloat16) == 2, "bfloat16 is two bytes, as on the device");

// Round to nearest, ties to even (as CUDA's __float2bfloat16 and PyTorch); NaN stays a NaN.
inline bfloat16 to_bfloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x0040u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return {uint16_t(u >> 16)};
}

// Exact: every bfloat16 is an fp32.
inline float to_float(bfloat16 h) {
  const uint32_t u = uint32_t(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace trident
