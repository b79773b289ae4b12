// Shared by the plan tests: a prediction's term by name.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "plan/plan_parts.h"

namespace trident::testing {

// The value of the term called `name`; a test failure (and 0) where there is none.
inline double term(const std::vector<PlanTerm>& terms, const std::string& name) {
  for (const PlanTerm& t : terms)
    if (t.name == name) return t.value;
  ADD_FAILURE() << "no term " << name;
  return 0;
}

// A machine with round numbers: every GEMM at 1 TFLOP/s, 100 GB/s memory, links of
// `intra_gbytes_per_s` inside a node of `per_node` devices and 10 GB/s between nodes, without
// latency, no overlap cost.
inline Hardware round_machine(const std::string& dtype = "fp32", int per_node = 8,
                              double intra_gbytes_per_s = 10) {
  Hardware hw;
  hw.name = "round";
  hw.kind = "gpu";
  hw.devices_per_node = per_node;
  hw.dtype = dtype;
  hw.peak_tflops = 2;
  hw.gemm = {{64, 1.0}};
  hw.memory_gbytes_per_s = 100;
  hw.memory_gb = 80;
  hw.intra_node = {intra_gbytes_per_s, 0};
  hw.inter_node = {10, 0};
  return hw;
}

}  // namespace trident::testing
