// Bucket assignment: a pure function of parameter sizes and byte limits.
#include "trident/buckets.h"

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

}  // namespace trident
