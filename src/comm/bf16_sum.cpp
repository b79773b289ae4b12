#include "bf16_sum.h"

#include <cstring>

#include "trident/bfloat16.h"
#include "trident/check.h"

namespace trident::bf16 {
namespace {

// The rounding of the model's bf16 activations (trident/bfloat16.h): one definition for both.
inline uint16_t round_one(float f) { return ::trident::to_bfloat16(f).bits; }
inline float widen_one(uint16_t h) { return ::trident::to_float(bfloat16{h}); }

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
