#include "app/gemm_peak.h"

#include <fmt/format.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>

#include "trident/check.h"
#include "trident/peak_check.h"

namespace trident {

int ranks_on_this_node() {
  MPI_Comm node;
  TRIDENT_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int size = 1;
  TRIDENT_MPI(MPI_Comm_size(node, &size));
  TRIDENT_MPI(MPI_Comm_free(&node));
  return size;
}

// Note [Train's GEMM peak]
// A run's MFU is against the peak it can reach, so train measures as carefully as its steps
// need: briefly (best of 2 sgemm 2048³ after a warm-up, ~0.3 s), then, where one step at that
// rate takes over 0.5 s, as bench does (best of 5-10, ~1-2 s) too, keeping the larger. GPT-2
// 124M's 1.1 s steps ran at 170 GFLOP/s against a brief 167 (bench: 202-207): large steps run
// near the peak, so a low figure turned their MFU off; they can afford a step's time for it.
// Small decks run far below the peak and keep starting fast. An MFU above 1 stays n/a: the
// careful figure is still a measurement (a busy machine lowers it).
double measure_train_gemm_peak(Backend& backend, double step_flops) {
  const double brief = backend.measure_gemm_peak_flops_brief();
  constexpr double kCarefulAboveStepS = 0.5;
  // A device backend has one measurement: its brief one is the careful one.
  if (backend.is_device() || (brief > 0 && step_flops / brief <= kCarefulAboveStepS)) return brief;
  return std::max(brief, backend.measure_gemm_peak_flops());
}

// Note [Peak measured again]
// A step that runs faster than the GEMM peak shows that the peak was measured low (a shared
// machine's careful figure moves by half from one minute to the next: docs/perf.md). Every
// rank then measures again, carefully (~2 s), at the same step boundary (agreed in the
// stop-signal all-reduce), and keeps the larger: the peak only rises, so MFU errs low, never
// high. At most kMaxPeakMeasurements times a run; after that an MFU above 1 stays n/a, with
// one warning.
double measure_gemm_peak_again(Backend& backend, double current, const BlasCoreCheck& blas,
                               int ranks_on_node) {
  const CheckedPeak again = check_gemm_peak(std::max(current, backend.measure_gemm_peak_flops()),
                                            backend, blas, ranks_on_node);
  return again.problem.empty() ? again.flops : current;
}

CheckedPeak check_gemm_peak(double measured_flops, const Backend& backend,
                            const BlasCoreCheck& blas, int ranks_on_node) {
  CheckedPeak p{measured_flops, measured_flops, ""};
  if (backend.is_device()) {
    const double nominal = backend.nominal_peak_flops();
    if (nominal > 0 && measured_flops > nominal)
      p.problem = fmt::format("the GEMM peak measured {:.1f} TFLOP/s, above the device's "
                              "nominal {:.1f}: the timing is wrong; MFU is not reported",
                              measured_flops / 1e12, nominal / 1e12);
  } else {
    const CpuPeakBounds bounds = cpu_gemm_peak_bounds(
        blas.fp32_lanes, backend.threads(), int(sysconf(_SC_NPROCESSORS_ONLN)), ranks_on_node);
    const PeakVerdict verdict = judge_peak(measured_flops, bounds);
    if (verdict != PeakVerdict::kPlausible)
      p.problem = peak_problem_message(measured_flops, bounds, verdict, isa_name(blas.cpu_isa),
                                       blas.chosen);
  }
  if (!p.problem.empty()) p.flops = 0;
  return p;
}

}  // namespace trident
