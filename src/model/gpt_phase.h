// A timed, profiled phase of the model's forward or backward (gpt.cpp, gpt_backward.cpp).
#pragma once

#include <chrono>
#include <string>

#include "trident/backend.h"
#include "trident/model.h"

namespace trident {

// One phase of forward or backward ("forward block 3"): a profiling range on the backend (NVTX
// on CUDA), and a report to the recorder (if any) when it goes out of scope. The name is the
// parameter table's (Note [Parameter table]), so a phase formats and copies nothing.
class Phase {
 public:
  Phase(Backend& be, const PhaseFn& fn, const std::string& name) : be_(be), fn_(fn), name_(name) {
    be_.push_range(name_.c_str());
    if (fn_) begin_ = std::chrono::steady_clock::now();
  }
  ~Phase() {
    if (fn_) fn_(name_, begin_, std::chrono::steady_clock::now());
    be_.pop_range();
  }

 private:
  Backend& be_;
  const PhaseFn& fn_;
  const std::string& name_;
  std::chrono::steady_clock::time_point begin_;
};

}  // namespace trident
