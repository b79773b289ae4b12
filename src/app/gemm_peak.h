// The MFU denominator of train and bench, checked before it is used (trident/peak_check.h).
#pragma once

#include <string>

#include "trident/backend.h"
#include "trident/blas_core.h"

namespace trident {

struct CheckedPeak {
  double measured_flops = 0;
  double flops = 0;     // the MFU denominator; 0 when the measurement was rejected
  std::string problem;  // why it was rejected and what to do ("" when accepted)
};

// train's measurement of the MFU denominator (Note [Train's GEMM peak]): briefly, and carefully
// as bench does too when one step of step_flops (this rank's share) takes over 0.5 s.
double measure_train_gemm_peak(Backend& backend, double step_flops);

// Note [Peak measured again]: how many times a run may measure its peak after start-up, and
// the measurement: the larger of current and a careful one, if that passes check_gemm_peak;
// current otherwise.
inline constexpr int kMaxPeakMeasurements = 3;
double measure_gemm_peak_again(Backend& backend, double current, const BlasCoreCheck& blas,
                               int ranks_on_node);

// Collective over MPI_COMM_WORLD: the ranks on this rank's node (they share its cores).
int ranks_on_this_node();

// CPU backends: against the bounds of the vector width (Note [CPU peak bounds]); device
// backends: not above the vendor's nominal peak.
CheckedPeak check_gemm_peak(double measured_flops, const Backend& backend,
                            const BlasCoreCheck& blas, int ranks_on_node);

}  // namespace trident
