// Gradient buckets: which parameters are all-reduced together.
//
// Parameters sit contiguously in the flat gradient buffer in ready (backward) order, so a
// bucket is a run of consecutive parameters and an (offset, count) slice of that buffer,
// never a copy. The assignment is a pure function of the sizes and the byte limits, so every
// rank computes the same buckets (Note [Same buckets, same order] in trident/grad_reducer.h).
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

// Note [Padded buckets] (ZeRO, parallel.zero): with a sharded optimizer each dp rank owns a
// contiguous, equal slice of every bucket — rank r of n owns [offset + r·count/n, +count/n) —
// so a bucket is reduce-scattered and all-gathered as one slice of the flat buffers, with no
// copy. For that every bucket's count must be a multiple of n (and, here, of 16 floats per rank,
// so each shard starts 64-byte aligned): as Megatron's distributed optimizer does, the flat
// buffer gets zero padding at the end of each bucket, and the parameters after it move up.
// The buckets are those of assign_buckets on the unpadded sizes (the padding never changes
// which parameters go together), except that a parameter marked `alone` gets a bucket of its
// own (the tied wte with pp > 1, whose shard must be the same slice of wte on the first and the
// last stage). multiple = 1 with nothing alone gives assign_buckets's buckets and the unpadded,
// contiguous layout.
struct BucketLayout {
  std::vector<Bucket> buckets;        // offset, count: the padded slice of the flat buffer
  std::vector<size_t> param_offsets;  // each parameter's offset, in ready order
  size_t total = 0;                   // elements of the flat buffer, padding included
  // This rank's shard of bucket b: [buckets[b].offset + rank·shard_count(b), +shard_count(b)).
  size_t shard_count(size_t b, size_t ranks) const { return buckets[b].count / ranks; }
};
BucketLayout padded_bucket_layout(const std::vector<size_t>& param_counts_in_ready_order,
                                  size_t elem_bytes, size_t first_bucket_bytes,
                                  size_t bucket_bytes, size_t multiple,
                                  const std::vector<char>& alone = {});

// Note [Head gradient in pieces]: the LM head's weight gradient (the tied wte, V·C floats: 31% of
// GPT-2 124M's gradient, 64% of an L6 C384 model's) is one GEMM, dwte += dlogitsᵀ · x, and as one
// parameter it is one bucket that exists whole before its reduction can start, then holds the
// link for its whole wire time (0.6 s at 1 Gbit/s for 77 MB) and, with ZeRO-2, its memory until
// that ends. Its rows are independent, so the GEMM splits into row pieces that are the same
// arithmetic on a slice of the output (each element the same dot product over the same tokens),
// and each piece is reported ready, reduced and (ZeRO-2) released on its own: the first piece
// is on the wire after 1/K of the GEMM. head_gradient_pieces gives the row boundaries
// [0 = b0 < b1 < ... < bK = rows] of K = ceil(rows·channels·elem_bytes / bucket_bytes) pieces of
// about bucket_bytes each, every boundary a multiple of align_elems floats from wte's start (so
// that with ZeRO's padding, Note [Padded buckets], a piece that ends a bucket needs none and wte
// stays contiguous); empty when one piece would do. Pure: every rank computes the same.
std::vector<int> head_gradient_pieces(int rows, int channels, size_t elem_bytes,
                                      size_t bucket_bytes, size_t align_elems);

}  // namespace trident
