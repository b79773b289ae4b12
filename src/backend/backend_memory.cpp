// Backend memory for host backends (Note [Backend memory] in trident/backend.h): aligned
// host allocations, memcpy, memset. Device backends override all of these.
//
// Note [Untouched zero memory]
// allocate() promises zeroed memory. A block of 1 MiB or more comes straight from mmap, whose
// anonymous pages read as zero and take no memory until written, so a buffer used a slice at a
// time (ZeRO-3's full buffers, Note [ZeRO-3 units] in train/zero3.h) holds only what is written,
// where a memset would make the whole of it resident at start. Small blocks keep aligned_alloc
// and memset. A header below the pointer says which, for release.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "trident/backend.h"
#include "trident/check.h"

namespace trident {
namespace {

constexpr size_t kAlign = 256;                   // what allocate() promises
constexpr size_t kMapAtLeast = size_t(1) << 20;  // blocks from mmap: 1 MiB and more
constexpr uint64_t kHeap = 0x7472696465686561ULL, kMapped = 0x747269646d617070ULL;

struct Header {
  uint64_t kind;
  size_t bytes;  // mapped: the whole mapping; heap: unused
};

size_t page_size() {
  static const size_t page = size_t(sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

void* Backend::allocate(size_t bytes) {
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  if (rounded >= kMapAtLeast) {
    // One page for the header, so the block starts on a page (and a 256-byte) boundary.
    const size_t page = page_size();
    const size_t total = page + (rounded + page - 1) / page * page;
    void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TRIDENT_CHECK(base != MAP_FAILED, "out of host memory allocating {} bytes", bytes);
    auto* p = static_cast<char*>(base) + page;
    *reinterpret_cast<Header*>(p - sizeof(Header)) = {kMapped, total};
    return p;
  }
  const size_t size = kAlign + (rounded > 0 ? rounded : kAlign);
  auto* base = static_cast<char*>(std::aligned_alloc(kAlign, size));
  TRIDENT_CHECK(base != nullptr, "out of host memory allocating {} bytes", bytes);
  char* p = base + kAlign;
  std::memset(p, 0, size - kAlign);
  *reinterpret_cast<Header*>(p - sizeof(Header)) = {kHeap, 0};
  return p;
}

void Backend::release(void* p) noexcept {
  if (!p) return;
  auto* c = static_cast<char*>(p);
  const Header h = *reinterpret_cast<const Header*>(c - sizeof(Header));
  if (h.kind == kMapped) munmap(c - page_size(), h.bytes);
  else std::free(c - kAlign);
}

void Backend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
}

void Backend::fill_zero(void* p, size_t bytes) {
  if (bytes > 0) std::memset(p, 0, bytes);
}

namespace {

// memset 0 in 4 MiB pieces over `threads` OpenMP threads (at start-up: every page touched).
void zero_over_threads(char* dst, size_t bytes, int threads) {
  constexpr size_t kPiece = size_t(4) << 20;
  const auto pieces = static_cast<int64_t>((bytes + kPiece - 1) / kPiece);
#pragma omp parallel for num_threads(std::max(1, threads)) schedule(static)
  for (int64_t i = 0; i < pieces; ++i) {
    const size_t at = size_t(i) * kPiece;
    std::memset(dst + at, 0, std::min(kPiece, bytes - at));
  }
}

}  // namespace

// Note [Snapshots to the host]: the pages are touched here, once, so that no save pays for
// faulting them in (about 0.2 s per GiB here).
void* Backend::allocate_host_snapshot(size_t bytes) {
  void* p = Backend::allocate(bytes);
  zero_over_threads(static_cast<char*>(p), bytes, threads());
  return p;
}

void Backend::release_host_snapshot(void* p) noexcept { Backend::release(p); }

void Backend::start_host_snapshot(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);  // on the writer's thread, beside the step's team
}

}  // namespace trident
