// Backend memory for host backends (Note [Backend memory] in trident/backend.h): aligned
// host allocations, memcpy, memset. Device backends override all of these.
#include <cstdlib>
#include <cstring>

#include "trident/backend.h"
#include "trident/check.h"

namespace trident {

void* Backend::allocate(size_t bytes) {
  constexpr size_t kAlign = 256;
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded > 0 ? rounded : kAlign);
  TRIDENT_CHECK(p != nullptr, "out of host memory allocating {} bytes", bytes);
  std::memset(p, 0, rounded);
  return p;
}

void Backend::release(void* p) noexcept { std::free(p); }

void Backend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
}

void Backend::fill_zero(void* p, size_t bytes) {
  if (bytes > 0) std::memset(p, 0, bytes);
}

}  // namespace trident
