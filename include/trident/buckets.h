// Gradient buckets: which parameters are all-reduced together.
//
// Parameters sit contiguously in the flat gradient buffer in ready (backward) order, so a
// bucket is a run of consecutive parameters and an (offset, count) slice of that buffer,
// never a copy. The assignment is a pure function of the sizes and the byte limits, so every
// rank computes the same buckets (Note [Same buckets, same order] in grad_reducer.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace trident {

struct Bucket {
  size_t first_param = 0;  // index in ready order
  size_t num_params = 0;
  size_t offset = 0;       // elements, from the first parameter's start
  size_t count = 0;        // elements
  bool operator==(const Bucket&) const = default;
};

// Limits worth a name: 0 gives one bucket per parameter, kOneBucket one bucket for everything.
// The defaults are PyTorch DDP's (1 MiB first bucket so communication starts early, 25 MiB).
constexpr size_t kOneBucketPerParam = 0;
constexpr size_t kOneBucket = SIZE_MAX;
constexpr size_t kDefaultFirstBucketBytes = size_t{1} << 20;
constexpr size_t kDefaultBucketBytes = size_t{25} << 20;

// Walks the parameters in ready order, adding each to the open bucket; the open bucket closes
// first when adding the next parameter would exceed its byte limit, so a parameter larger
// than the limit gets a bucket of its own. Bucket 0's limit is first_bucket_bytes, the
// others' bucket_bytes. Empty input gives no buckets.
std::vector<Bucket> assign_buckets(const std::vector<size_t>& param_counts_in_ready_order,
                                   size_t elem_bytes, size_t first_bucket_bytes,
                                   size_t bucket_bytes);

}  // namespace trident
