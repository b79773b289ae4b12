// The host definitions' helpers of the bf16 ops (Note [bf16 activations] in bf16_ops.cpp):
// widen bf16 to fp32 (exact), round fp32 to bf16 (to nearest, ties to even), and refuse a
// host definition on a device backend.
#pragma once

#include <string>
#include <vector>

#include "trident/backend.h"
#include "trident/check.h"

namespace trident::bf16_host {

inline std::vector<float> widen(const bfloat16* x, size_t n) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = to_float(x[i]);
  return out;
}

inline void round_into(bfloat16* out, const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = to_bfloat16(x[i]);
}

inline void host_only(const Backend& be, const char* op) {
  if (be.is_device())
    internal_error(__FILE__, __LINE__,
                   std::string(op) + ": the host definition was called on a device backend");
}

}  // namespace trident::bf16_host
