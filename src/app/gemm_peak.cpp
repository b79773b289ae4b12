#include "app/gemm_peak.h"

#include <fmt/format.h>
#include <mpi.h>
#include <unistd.h>

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
