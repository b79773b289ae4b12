// Shared by the bf16 tp tests (test_tp_bf16, test_tp_bf16_cp_moe): a model's gradients as
// global tensors, to compare layouts whose flat buffers differ.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "trident/grid.h"
#include "trident/model.h"

namespace trident::testing {

// Each parameter's gradient as its global tensor: the tp shards all-gathered and placed by
// ParamInfo::global_index; a replicated tensor must be equal on every tp rank. NaN where no tp
// rank of this one's holds it (the experts of other ep ranks); wte and lmw cut to the live
// vocabulary (the padding differs between layouts).
inline std::map<std::string, std::vector<float>> global_grads(GPT& m, ProcessGrid* grid) {
  std::map<std::string, std::vector<float>> out;
  const int tp = m.tensor_parallel().size;
  for (const ParamInfo& p : m.params_info()) {
    size_t global = 1;
    for (int d : p.global_shape) global *= size_t(d);
    std::vector<float> shards(p.count * size_t(tp));
    if (tp > 1) grid->tp().all_gather(m.grads() + p.offset, shards.data(), p.count).wait();
    else std::memcpy(shards.data(), m.grads() + p.offset, p.count * sizeof(float));
    std::vector<float> g(global, NAN);
    size_t differ = 0;  // elements of a replicated tensor that differ from tp rank 0's
    // A routed expert is whole on every tp rank (its tp_rank says ep's: Note [Expert tensors]).
    for (int r = 0; r < tp && p.expert; ++r)
      for (size_t i = 0; i < p.count; ++i) {
        const float x = shards[size_t(r) * p.count + i];
        if (r == 0) g[p.global_index(i)] = x;
        else differ += x != g[p.global_index(i)];
      }
    for (int r = 0; r < tp && !p.expert; ++r) {
      ParamInfo q = p;
      q.tp_rank = r;
      for (size_t i = 0; i < p.count; ++i) {
        const float x = shards[size_t(r) * p.count + i];
        if (p.shard == Shard::kReplicated && r > 0) differ += x != g[q.global_index(i)];
        else g[q.global_index(i)] = x;
      }
    }
    EXPECT_EQ(differ, 0u) << p.name << ": elements that differ between tp ranks";
    if (p.name == "wte" || p.name == "lmw")
      g.resize(size_t(m.config().vocab) * m.config().channels);
    out[p.name] = std::move(g);
  }
  return out;
}

}  // namespace trident::testing
