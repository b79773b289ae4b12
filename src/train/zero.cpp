// Note [ZeRO-1] and Note [Gathers before use] (zero.h): this rank's pieces and the gather order.
#include "train/zero.h"

#include <algorithm>
#include <climits>

#include "trident/grad_reducer.h"

namespace trident {

std::vector<OwnedPiece> owned_pieces(const std::vector<ParamInfo>& params,
                                     const GradReducer& reducer, int dp_rank) {
  std::vector<OwnedPiece> out;
  const std::vector<Bucket>& buckets = reducer.buckets();
  for (size_t b = 0; b < buckets.size(); ++b) {
    const size_t n = reducer.shard_count(b);
    const size_t lo = buckets[b].offset + size_t(dp_rank) * n, hi = lo + n;
    for (size_t i = buckets[b].first_param; i < buckets[b].first_param + buckets[b].num_params;
         ++i) {
      const ParamInfo& p = params[i];
      const size_t begin = std::max(lo, p.offset), end = std::min(hi, p.offset + p.count);
      if (begin >= end) continue;
      out.push_back({i, begin, end - begin, reducer.shard_offset(b) + (begin - lo), p.decay});
    }
  }
  return out;
}

std::vector<OwnedPiece> merge_pieces(const std::vector<OwnedPiece>& pieces) {
  std::vector<OwnedPiece> out;
  for (const OwnedPiece& p : pieces) {
    if (!out.empty()) {
      OwnedPiece& last = out.back();
      if (last.decay == p.decay && last.flat + last.count == p.flat &&
          last.shard + last.count == p.shard) {
        last.count += p.count;
        continue;
      }
    }
    out.push_back(p);
  }
  return out;
}

std::vector<size_t> forward_gather_order(const std::vector<ParamInfo>& params,
                                         const std::vector<Bucket>& buckets) {
  // When forward first reads a parameter: the embedding 0, block l at l + 1 (layer indices
  // grow in forward order on every stage), the final LayerNorm and a head-only stage's wte last.
  bool has_embedding = false;
  for (const ParamInfo& p : params) has_embedding = has_embedding || p.name == "wpe";
  auto first_use = [&](const ParamInfo& p) -> long {
    if (p.layer >= 0) return long(p.layer) + 1;
    if (p.name == "wpe" || (p.name == "wte" && has_embedding)) return 0;
    return LONG_MAX;
  };
  std::vector<long> use(buckets.size(), LONG_MAX);
  for (size_t b = 0; b < buckets.size(); ++b)
    for (size_t i = buckets[b].first_param; i < buckets[b].first_param + buckets[b].num_params;
         ++i)
      use[b] = std::min(use[b], first_use(params[i]));
  std::vector<size_t> order(buckets.size());
  for (size_t b = 0; b < order.size(); ++b) order[b] = order.size() - 1 - b;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return use[a] < use[b]; });
  return order;
}

}  // namespace trident
