// Sanity bounds on a measured CPU GEMM peak, and MFU that is never above 1.
#include "trident/peak_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace trident {

// Note [CPU peak bounds]: per core and cycle an fp32 FMA kernel does 2 FLOPs per lane per FMA
// port. The bounds take the extremes of the two unknowns, port count and clock:
//   high ("impossible"): 2 FMA ports (no x86 core has more for fp32 so far) at 6.0 GHz (the
//     fastest shipped boost clock) on every thread, up to the node's CPUs;
//   low ("implausible"): 1 FMA per cycle at 1 GHz, below any server's AVX-512 clock under
//     load, on the cores this rank has to itself (the node's CPUs shared by the ranks
//     measuring at once, never more than its threads).
// The low bound is what catches a fallback kernel: an AVX-512 CPU's right kernel measured ~90
// GFLOP/s per core on the 2.1 GHz dev VM, 2.8× above the bound of 32; its SSE3 "Prescott"
// fallback ~13, below it. Two ranks oversubscribing the cores still pass (they count as
// sharing); a machine busy with other work can fail it, and then the figure is not to be
// trusted either.
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
