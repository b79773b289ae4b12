// Sanity bounds on a measured CPU GEMM peak, and MFU that is never above 1.
#include "trident/peak_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace trident {

// Note [CPU peak bounds]
// A measured CPU GEMM peak must lie between the extremes of an fp32 FMA kernel's two unknowns,
// 2 FLOPs per lane per FMA port per cycle: high ("impossible") 2 ports at 6.0 GHz on every
// thread, up to the node's CPUs; low ("implausible") 1 FMA per cycle at 1 GHz on the cores this
// rank has to itself (the node's CPUs shared by the ranks measuring at once, at most its
// threads). The low bound catches a fallback kernel; a machine busy with other work can fail
// it too, and then the figure is not to be trusted either.
CpuPeakBounds cpu_gemm_peak_bounds(int fp32_lanes, int threads, int online_cpus,
                                   int ranks_on_node) {
  const int cpus = std::max(1, online_cpus);
  const int high_cores = std::clamp(threads, 1, cpus);
  const int low_cores = std::clamp(cpus / std::max(1, ranks_on_node), 1, high_cores);
  const double flops_per_fma = 2.0 * fp32_lanes;
  return {low_cores * flops_per_fma * 1.0 * 1.0e9, high_cores * flops_per_fma * 2.0 * 6.0e9};
}

PeakVerdict judge_peak(double measured_flops, const CpuPeakBounds& bounds) {
  if (!(measured_flops > bounds.low_flops)) return PeakVerdict::kImplausiblyLow;  // NaN too
  if (measured_flops > bounds.high_flops) return PeakVerdict::kImpossible;
  return PeakVerdict::kPlausible;
}

std::string peak_problem_message(double measured_flops, const CpuPeakBounds& bounds,
                                 PeakVerdict verdict, const std::string& cpu_isa,
                                 const std::string& blas_core) {
  if (verdict == PeakVerdict::kImpossible)
    return fmt::format("the GEMM peak measured {:.1f} GFLOP/s, above the {:.1f} this CPU's {} "
                       "allows at any clock: the timer or the FLOP count is wrong; MFU is not "
                       "reported",
                       measured_flops / 1e9, bounds.high_flops / 1e9, cpu_isa);
  if (verdict == PeakVerdict::kImplausiblyLow)
    return fmt::format("the GEMM peak measured {:.1f} GFLOP/s, below the {:.1f} even 1 GHz "
                       "and one FMA per cycle give this CPU's {}: the BLAS may run a fallback "
                       "kernel (blas_core={}), or the machine was busy while measuring; MFU is "
                       "not reported",
                       measured_flops / 1e9, bounds.low_flops / 1e9, cpu_isa, blas_core);
  return "";
}

double mfu_or_nan(double achieved_flops, double peak_flops) {
  if (!(peak_flops > 0) || !std::isfinite(peak_flops)) return NAN;
  const double mfu = achieved_flops / peak_flops;
  return mfu <= 1.0 ? mfu : NAN;  // NaN stays NaN
}

std::string format_mfu_percent(double mfu) {
  return std::isnan(mfu) ? "n/a" : fmt::format("{:.1f}%", 100 * mfu);
}

std::string format_mfu_fraction(double mfu) {
  return std::isnan(mfu) ? "n/a" : fmt::format("{:.4f}", mfu);
}

}  // namespace trident
