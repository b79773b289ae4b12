// Bucket assignment: a pure function of parameter sizes and byte limits.
#include "trident/buckets.h"

#include <algorithm>
#include <cstddef>
#include <numeric>

namespace trident {

std::vector<Bucket> assign_buckets(const std::vector<size_t>& param_counts_in_ready_order,
                                   size_t elem_bytes, size_t first_bucket_bytes,
                                   size_t bucket_bytes) {
  std::vector<Bucket> buckets;
  Bucket open;
  size_t open_bytes = 0;
  size_t limit = first_bucket_bytes;
  size_t offset = 0;
  for (size_t i = 0; i < param_counts_in_ready_order.size(); ++i) {
    const size_t count = param_counts_in_ready_order[i];
    const size_t bytes = count * elem_bytes;
    // open_bytes + bytes cannot overflow: both are sizes of real buffers.
    if (open.num_params > 0 && open_bytes + bytes > limit) {
      buckets.push_back(open);
      limit = bucket_bytes;
      open = Bucket{i, 0, offset, 0};
      open_bytes = 0;
    }
    open.num_params += 1;
    open.count += count;
    open_bytes += bytes;
    offset += count;
  }
  if (open.num_params > 0) buckets.push_back(open);
  return buckets;
}

BucketLayout padded_bucket_layout(const std::vector<size_t>& counts, size_t elem_bytes,
                                  size_t first_bucket_bytes, size_t bucket_bytes, size_t multiple,
                                  const std::vector<char>& alone, const std::vector<char>& breaks) {
  // Group with assign_buckets, one run of non-alone parameters at a time (a break also ends a
  // run); bucket 0 of the whole list keeps the first-bucket limit.
  auto flag = [](const std::vector<char>& v, size_t i) { return i < v.size() && v[i]; };
  std::vector<Bucket> groups;
  for (size_t i = 0; i < counts.size();) {
    const bool single = flag(alone, i);
    size_t end = i + 1;
    while (!single && end < counts.size() && !flag(alone, end) && !flag(breaks, end)) ++end;
    const std::vector<size_t> run(counts.begin() + std::ptrdiff_t(i),
                                  counts.begin() + std::ptrdiff_t(end));
    const size_t first_limit = groups.empty() ? first_bucket_bytes : bucket_bytes;
    for (Bucket b : assign_buckets(run, elem_bytes, first_limit, bucket_bytes)) {
      b.first_param += i;
      groups.push_back(b);
    }
    i = end;
  }
  BucketLayout out;
  out.param_offsets.resize(counts.size());
  const size_t step = multiple == 1 ? 1 : multiple * 16;
  size_t offset = 0;
  for (Bucket b : groups) {
    b.offset = offset;
    for (size_t k = 0; k < b.num_params; ++k) {
      out.param_offsets[b.first_param + k] = offset;
      offset += counts[b.first_param + k];
    }
    b.count = (b.count + step - 1) / step * step;
    offset = b.offset + b.count;
    out.buckets.push_back(b);
  }
  out.total = offset;
  return out;
}

}  // namespace trident
