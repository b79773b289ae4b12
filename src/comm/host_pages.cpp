// Note [ZeRO-2 on the host] (train/zero.h): releasing and counting gradient pages.
#include "comm/host_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "trident/check.h"

namespace trident {
namespace {

uintptr_t page_size() {
  static const auto size = uintptr_t(sysconf(_SC_PAGESIZE));
  return size;
}

}  // namespace

void release_host_floats(float* p, size_t n) {
  if (n == 0) return;
  const uintptr_t page = page_size();
  const auto begin = reinterpret_cast<uintptr_t>(p), end = begin + n * sizeof(float);
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (first >= last) {  // no whole page inside
    std::memset(p, 0, n * sizeof(float));
    return;
  }
  std::memset(p, 0, first - begin);
  std::memset(reinterpret_cast<void*>(last), 0, end - last);
  TRIDENT_CHECK(madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) == 0,
                "madvise(MADV_DONTNEED) of {} bytes of gradients failed", last - first);
}

bool prefer_huge_pages(void* p, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  const auto begin = reinterpret_cast<uintptr_t>(p), end = begin + bytes;
  const uintptr_t first = (begin + kHuge - 1) / kHuge * kHuge, last = end / kHuge * kHuge;
  if (first >= last) return true;
  return madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE) == 0;
}

size_t resident_bytes(const void* p, size_t bytes, std::vector<unsigned char>& in_core) {
  if (bytes == 0) return 0;
  const uintptr_t page = page_size();
  const auto begin = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + bytes;
  const size_t pages = (end - begin + page - 1) / page;
  if (in_core.size() < pages) in_core.resize(pages);
  TRIDENT_CHECK(mincore(reinterpret_cast<void*>(begin), end - begin, in_core.data()) == 0,
                "mincore of {} bytes failed", end - begin);
  size_t resident = 0;
  for (size_t i = 0; i < pages; ++i) resident += in_core[i] & 1;
  return resident * page;
}

}  // namespace trident
