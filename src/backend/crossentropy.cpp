// Softmax cross-entropy over the first V of Vp (padded) vocabulary columns, in place.
//
// One row (≤ 200 KB at V=50304) stays in L2 while it is read four times: max, exp, sum,
// normalise. The exponentials are summed in double: 50k positive terms in float would lose ~1e-5
// relative, and the double sum costs little next to the exp.
#include <cmath>

#include "backend/eigen.h"
#include "backend/fast_math.h"
#include "backend/kernels.h"
#include "backend/parallel.h"
#include "trident/check.h"

namespace trident::cpu {
namespace {

void check_targets(const int32_t* targets, int N, int V) {
  for (int n = 0; n < N; ++n)
    TRIDENT_CHECK(targets[n] >= 0 && targets[n] < V, "target[{}] = {} outside [0, {})", n,
                  targets[n], V);
}

}  // namespace

template <typename Real>
void crossentropy_forward(Real* losses, Real* logits_to_probs, const int32_t* targets, int N, int V,
                          int Vp, int threads) {
  check_targets(targets, N, V);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int n = 0; n < N; ++n) {
    Real* row = logits_to_probs + size_t(n) * Vp;
    // max is exact in any order, so Eigen's vectorised maxCoeff keeps results deterministic.
    const Real max = Eigen::Map<const Eigen::Array<Real, Eigen::Dynamic, 1>>(row, V).maxCoeff();
    const Real target_logit = row[targets[n]];
    for (int v = 0; v < V; ++v) row[v] = exp_fast(row[v] - max);
    const double sum = sum_of<double>(row, V);
    const Real inv_sum = Real(1.0 / sum);
    for (int v = 0; v < V; ++v) row[v] *= inv_sum;
    for (int v = V; v < Vp; ++v) row[v] = Real(0);
    // -log p_target from the logits rather than from p_target: finite even when p_target
    // underflows.
    losses[n] = Real(std::log(sum) - double(target_logit - max));
  }
}

template <typename Real>
void crossentropy_backward(Real* probs_to_dlogits, const int32_t* targets, Real dloss, int N, int V,
                           int Vp, int threads) {
  check_targets(targets, N, V);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int n = 0; n < N; ++n) {
    Real* row = probs_to_dlogits + size_t(n) * Vp;
    const Real p_target = row[targets[n]];
    for (int v = 0; v < V; ++v) row[v] *= dloss;
    row[targets[n]] = dloss * (p_target - Real(1));
    for (int v = V; v < Vp; ++v) row[v] = Real(0);
  }
}

#define TRIDENT_INSTANTIATE(Real)                                                             \
  template void crossentropy_forward<Real>(Real*, Real*, const int32_t*, int, int, int, int); \
  template void crossentropy_backward<Real>(Real*, const int32_t*, Real, int, int, int, int);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu
