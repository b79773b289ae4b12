// Figures that cannot mislead: a measured GEMM peak checked against what the CPU's vector width
// allows, and an MFU that is never reported above 1.
//
// An MFU above 1 means the denominator (the measured peak) was wrong: measured while the BLAS
// ran a fallback kernel, or while the machine was busy. Such a figure is not printed as a
// number: "n/a" in text, null in metrics JSON, and a line says what went wrong.
#pragma once

#include <string>

namespace trident {

// Limits of a plausible fp32 GEMM peak (FLOP/s) for one rank of a CPU backend.
struct CpuPeakBounds {
  double low_flops = 0;   // below: implausibly low for this vector width
  double high_flops = 0;  // above: impossible
};

// fp32_lanes: 16 (AVX-512), 8 (AVX/AVX2), 4 (SSE); threads: the measurement's; online_cpus:
// logical CPUs of the node; ranks_on_node: ranks sharing them (they measure at the same time).
CpuPeakBounds cpu_gemm_peak_bounds(int fp32_lanes, int threads, int online_cpus, int ranks_on_node);

enum class PeakVerdict { kPlausible, kImplausiblyLow, kImpossible };
PeakVerdict judge_peak(double measured_flops, const CpuPeakBounds& bounds);

// What went wrong and what to do, for a verdict other than kPlausible. cpu_isa: "AVX-512", ...
std::string peak_problem_message(double measured_flops, const CpuPeakBounds& bounds,
                                 PeakVerdict verdict, const std::string& cpu_isa,
                                 const std::string& blas_core);

// achieved / peak as a fraction, or NaN when it cannot be true or is unknown: peak ≤ 0 (not
// measured or rejected), or a ratio above 1 (nlohmann::json writes NaN as null).
double mfu_or_nan(double achieved_flops, double peak_flops);
// "12.3%" / "0.1234", or "n/a" for NaN.
std::string format_mfu_percent(double mfu);
std::string format_mfu_fraction(double mfu);

}  // namespace trident
