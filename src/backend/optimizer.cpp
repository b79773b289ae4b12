// Optimizer-side ops over the whole parameter/gradient buffers: Σx², x *= s, AdamW.
// These are memory-bound (124M floats for GPT-2 small), so each makes exactly one pass.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/eigen.h"
#include "backend/kernels.h"
#include "backend/parallel.h"
#include "trident/backend.h"

namespace trident::cpu {

// Each thread sums its static piece in double; the pieces are added in thread order.
template <typename Real>
double sum_squares(const Real* x, size_t n, int threads) {
  std::vector<double> partial(threads, 0.0);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const Range r = static_chunk(n, t, omp_get_num_threads(), 16);
    if (!r.empty()) partial[t] = dot_of<double>(x + r.begin, x + r.begin, r.size());
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

namespace {

template <typename Real>
struct AdamWCoefficients {
  Real lr, beta1, beta2, eps, weight_decay, inv_bias1, inv_bias2, grad_scale;
};

// One block of kBlock values through Eigen's fixed-size arrays. Why Eigen here: AdamW needs sqrt,
// and without -fno-math-errno GCC will not vectorise std::sqrt; this form runs at memory speed
// (docs/perf.md). Fixed-size blocks never peel for alignment, so every value takes the same
// vector path.
constexpr int kBlock = 16;

template <typename Real>
void adamw_block(Real* p, Real* m, Real* v, const Real* g, const AdamWCoefficients<Real>& c) {
  using Block = Eigen::Array<Real, kBlock, 1>;
  Eigen::Map<Block> P(p), M(m), V(v);
  // The clipped gradient, as the separate scaling pass stored it (the same float product).
  const Block G = Eigen::Map<const Block>(g) * c.grad_scale;
  M = c.beta1 * M + (Real(1) - c.beta1) * G;
  V = c.beta2 * V + (Real(1) - c.beta2) * G.square();
  P -= c.lr * ((M * c.inv_bias1) / ((V * c.inv_bias2).sqrt() + c.eps) + c.weight_decay * P);
}

}  // namespace

// m = β1 m + (1-β1) g;  v = β2 v + (1-β2) g²;  p -= lr (m̂ / (sqrt(v̂) + eps) + wd p),
// m̂ = m / (1-β1^t), v̂ = v / (1-β2^t), g = grads · grad_scale. One pass over p, m, v, g.
template <typename Real>
void adamw_update(Real* params, Real* m, Real* v, const Real* grads, size_t n, Real lr, Real beta1,
                  Real beta2, Real eps, Real weight_decay, int t, Real grad_scale, int threads) {
  const AdamWCoefficients<Real> c{lr,
                                  beta1,
                                  beta2,
                                  eps,
                                  weight_decay,
                                  Real(adamw_bias_correction(double(beta1), t)),
                                  Real(adamw_bias_correction(double(beta2), t)),
                                  grad_scale};
  // Pieces are multiples of kBlock except the very last, whose tail goes through a padded copy
  // so that it too takes the vector path.
  parallel_range(n, threads, [&](size_t begin, size_t end) {
    size_t i = begin;
    for (; i + kBlock <= end; i += kBlock) adamw_block(params + i, m + i, v + i, grads + i, c);
    if (i == end) return;
    const size_t rest = end - i;
    Real p_tail[kBlock] = {}, m_tail[kBlock] = {}, v_tail[kBlock] = {}, g_tail[kBlock] = {};
    std::memcpy(p_tail, params + i, rest * sizeof(Real));
    std::memcpy(m_tail, m + i, rest * sizeof(Real));
    std::memcpy(v_tail, v + i, rest * sizeof(Real));
    std::memcpy(g_tail, grads + i, rest * sizeof(Real));
    adamw_block(p_tail, m_tail, v_tail, g_tail, c);
    std::memcpy(params + i, p_tail, rest * sizeof(Real));
    std::memcpy(m + i, m_tail, rest * sizeof(Real));
    std::memcpy(v + i, v_tail, rest * sizeof(Real));
  });
}

#define TRIDENT_INSTANTIATE(Real)                                                              \
  template double sum_squares<Real>(const Real*, size_t, int);                                 \
  template void adamw_update<Real>(Real*, Real*, Real*, const Real*, size_t, Real, Real, Real, \
                                   Real, Real, int, Real, int);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(double)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::cpu
