// Note [ZeRO-1] and Note [Gathers before use] (zero.h): this rank's pieces and the gather order.
#include "train/zero.h"

#include <algorithm>
#include <climits>

#include <fmt/format.h>

#include "trident/grad_reducer.h"

namespace trident {

std::vector<size_t> GradUnits::counts() const {
  std::vector<size_t> out;
  for (const ParamInfo& u : units) out.push_back(u.count);
  return out;
}

GradUnits grad_units(const std::vector<ParamInfo>& params, int split_param,
                     const std::vector<int>& piece_rows, int row_elems) {
  GradUnits g;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    g.first.push_back(int(g.units.size()));
    if (int(i) != split_param || piece_rows.size() < 3) {
      g.units.push_back(p);
      g.pieces.push_back(0);
      continue;
    }
    for (size_t k = 0; k + 1 < piece_rows.size(); ++k) {
      ParamInfo u = p;
      u.name = fmt::format("{}[rows {}..{}]", p.name, piece_rows[k], piece_rows[k + 1]);
      u.offset = p.offset + size_t(piece_rows[k]) * size_t(row_elems);
      u.count = size_t(piece_rows[k + 1] - piece_rows[k]) * size_t(row_elems);
      g.units.push_back(u);
      g.pieces.push_back(1);
    }
  }
  g.first.push_back(int(g.units.size()));
  return g;
}

std::vector<OwnedPiece> owned_pieces(const std::vector<ParamInfo>& params,
                                     const GradReducer& reducer) {
  // Parameters and buckets both run through the buffer in order: one pass over each.
  std::vector<OwnedPiece> out;
  const std::vector<Bucket>& buckets = reducer.buckets();
  size_t first = 0;  // the first parameter that may reach into the current shard
  for (size_t b = 0; b < buckets.size(); ++b) {
    const size_t n = reducer.shard_count(b);
    const size_t lo = buckets[b].offset + size_t(reducer.shard_rank(b)) * n, hi = lo + n;
    while (first < params.size() && params[first].offset + params[first].count <= lo) ++first;
    for (size_t i = first; i < params.size() && params[i].offset < hi; ++i) {
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
  // The embedding is on the stage that holds block 0 (the first), with or without wpe.
  bool has_embedding = false;
  for (const ParamInfo& p : params) has_embedding = has_embedding || p.layer == 0;
  auto first_use = [&](const ParamInfo& p) -> long {
    if (p.layer >= 0) return long(p.layer) + 1;
    if (p.name == "wpe" || (p.name == "wte" && has_embedding)) return 0;
    return LONG_MAX;
  };
  std::vector<long> use(buckets.size(), LONG_MAX);
  for (size_t b = 0; b < buckets.size(); ++b)
    for (size_t i = buckets[b].first_param; i < buckets[b].first_param + buckets[b].num_params; ++i)
      use[b] = std::min(use[b], first_use(params[i]));
  std::vector<size_t> order(buckets.size());
  for (size_t b = 0; b < order.size(); ++b) order[b] = order.size() - 1 - b;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return use[a] < use[b]; });
  return order;
}

}  // namespace trident
