// Gradient buckets: which parameters are all-reduced together.
//
// Parameters sit contiguously in the flat gradient buffer in ready (backward) order, so a
// bucket is a run of consecutive parameters and an (offset, count) slice of that buffer,
// never a copy. The assignment is a pure function of the sizes and the byte limits, so every
// rank computes the same buckets (Note [Same buckets, same order] in src/comm/grad_reducer.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace trident {

struct Bucket {
  size_t first_param = 0;  // index in ready order
  size_t num_params = 0;
  size_t offset = 0;  // elements, from the first parameter's start
  size_t count = 0;   // elements
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

// Note [Padded buckets]
// With ZeRO each dp rank owns a contiguous, equal slice of every bucket (rank r of n: [offset +
// r·count/n, +count/n)), so a bucket is reduce-scattered and all-gathered in place. So every
// bucket's count is padded with zeros to a multiple of 16·n floats (64-byte aligned shards), as
// Megatron's distributed optimizer does; the parameters after it move up. Padding never changes
// which parameters go together, except that a parameter marked `alone` gets a bucket of its own.
//
// padded_bucket_layout: assign_buckets on the unpadded sizes, then the padding. multiple = 1 with
// nothing alone gives assign_buckets's buckets and the unpadded, contiguous layout. A parameter
// marked in `breaks` starts a new bucket (ZeRO-3: a bucket never holds two units, so a unit is
// gathered as whole buckets: Note [ZeRO-3 units] in train/zero3.h).
struct BucketLayout {
  std::vector<Bucket> buckets;        // offset, count: the padded slice of the flat buffer
  std::vector<size_t> param_offsets;  // each parameter's offset, in ready order
  size_t total = 0;                   // elements of the flat buffer, padding included
  // This rank's shard of bucket b: [buckets[b].offset + rank·shard_count(b), +shard_count(b)).
  size_t shard_count(size_t b, size_t ranks) const { return buckets[b].count / ranks; }
};
BucketLayout padded_bucket_layout(const std::vector<size_t>& param_counts_in_ready_order,
                                  size_t elem_bytes, size_t first_bucket_bytes, size_t bucket_bytes,
                                  size_t multiple, const std::vector<char>& alone = {},
                                  const std::vector<char>& breaks = {});

}  // namespace trident
