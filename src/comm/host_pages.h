// Host memory pages handed back to the kernel, and counted: ZeRO-2's gradient release on the
// CPU (Note [ZeRO-2 on the host] in train/zero.h).
#pragma once

#include <cstddef>
#include <vector>

namespace trident {

// Makes floats [p, p + n) read as zero and returns the whole pages among them to the kernel
// (madvise MADV_DONTNEED: private anonymous memory then reads as zero and takes no memory until
// it is written again); the partial pages at either end are zeroed with memset, touching only
// these bytes, so a neighbour sharing an end page may be written meanwhile.
void release_host_floats(float* p, size_t n);

// Asks for transparent huge pages on the whole 2 MiB pages inside [p, p + bytes) (madvise
// MADV_HUGEPAGE; a no-op where THP is off): memory released and written again every step then
// faults in 2 MiB at a time instead of 4 KiB. Returns false if the kernel refused.
bool prefer_huge_pages(void* p, size_t bytes);

// Note [Huge pages released]
// Released buffers keep asking for huge pages, since writing them again in 4 KiB faults costs
// backward and the gathers far more (docs/decisions.md, "ZeRO-3 (issue 42, part 2)"). The price:
// khugepaged may collapse a released range beside a written one back into a resident 2 MiB
// page, a few per scan, each freed at its next release; so the bounds on what ZeRO-2 and ZeRO-3
// hold have a slack of a few huge pages, which the tests allow.

// Bytes of [p, p + bytes) whose pages are resident (mincore), in whole pages. `scratch` holds
// one byte per page and is reused (grown once).
size_t resident_bytes(const void* p, size_t bytes, std::vector<unsigned char>& scratch);

}  // namespace trident
