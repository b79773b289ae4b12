// Wall-clock milliseconds for the step timings (steady_clock, which CommClock also is).
#pragma once

#include <chrono>

namespace trident {

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace trident
