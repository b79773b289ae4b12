// Checks of the vocab-parallel kernels (kernels/vocab_parallel.cu) against their CPU twins, the
// Backend base class's embedding_slice_* and crossentropy_slice_*, in the style of
// kernel_checks.h: shared by the GPU tests (test_vocab_parallel.cpp) and the benchmarks'
// validation (bench_vocab_parallel.cpp).
// This rank holds vocabulary [v0, v1) = [128, 256); tokens and targets are drawn beyond both
// ends, so some fall off the slice and must contribute nothing.
//
// Tolerance kFp32Tol = 1e-5 relative to the tensor's largest magnitude (testing::rel_err): the
// embedding ops and the loss backward make the same fp32 additions and products as the CPU (in
// the same order for the gradients), so they agree to rounding or better; the softmax sums and
// the combine run in double on both sides and differ only in summation order (~1e-16 relative),
// so their float results differ by at most an ulp or so (6e-8). Maxima and target logits are
// copies of inputs: compared bitwise, which also covers the -inf of a rank with live = 0.
#pragma once

#include <memory>

#include "kernel_checks.h"
#include "vocab_parallel.h"

namespace trident::testing {

constexpr int kSliceV0 = 128, kSliceV1 = 256;

// Tokens in [lo, hi): a narrow range makes tokens repeat, which dwte's ownership must handle.
inline std::vector<int32_t> tokens_in(size_t n, int lo, int hi, std::mt19937& rng) {
  std::vector<int32_t> t = tokens(n, hi - lo, rng);
  for (int32_t& x : t) x += lo;
  return t;
}

inline Errors check_embedding_slice_forward(int B, int T, int C, bool with_wpe, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t N = size_t(B) * T;
  const std::vector<int32_t> tok = tokens_in(N, 0, 384, rng);
  const std::vector<float> wte = random_floats(size_t(kSliceV1 - kSliceV0) * C, rng);
  const std::vector<float> wpe = random_floats(size_t(T) * C, rng);
  std::vector<float> want(N * C);
  cpu_twin()->embedding_slice_forward(want.data(), tok.data(), wte.data(),
                                      with_wpe ? wpe.data() : nullptr, kSliceV0, kSliceV1, B, T, C);
  DeviceBuffer<float> out(N * C), d_wte(wte), d_wpe(wpe);
  DeviceBuffer<int32_t> d_tok(tok);
  cuda::embedding_slice_forward_cuda(out.get(), d_tok.get(), d_wte.get(),
                                     with_wpe ? d_wpe.get() : nullptr, kSliceV0, kSliceV1, B, T, C,
                                     nullptr);
  return {{"out", err_vs(out.download(), want), kFp32Tol}};
}

struct EmbeddingSliceGrads {
  std::vector<float> dwte, dwpe;
};

// Runs the launcher from the given starting gradients (dwpe skipped when !with_wpe).
inline EmbeddingSliceGrads run_embedding_slice_backward(const std::vector<float>& dwte,
                                                        const std::vector<float>& dwpe,
                                                        const std::vector<float>& dout,
                                                        const std::vector<int32_t>& tok,
                                                        bool with_wpe, int B, int T, int C) {
  DeviceBuffer<float> d_dwte(dwte), d_dwpe(dwpe), d_dout(dout);
  DeviceBuffer<int32_t> d_tok(tok);
  DeviceBuffer<unsigned char> scratch(
      cuda::embedding_backward_scratch_bytes(B * T, kSliceV1 - kSliceV0));
  cuda::embedding_slice_backward_cuda(d_dwte.get(), with_wpe ? d_dwpe.get() : nullptr,
                                      scratch.get(), d_dout.get(), d_tok.get(), kSliceV0, kSliceV1,
                                      B, T, C, nullptr);
  return {d_dwte.download(), d_dwpe.download()};
}

inline Errors check_embedding_slice_backward(int B, int T, int C, int lo, int hi, bool with_wpe,
                                             uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t N = size_t(B) * T;
  const std::vector<int32_t> tok = tokens_in(N, lo, hi, rng);
  const std::vector<float> dout = random_floats(N * C, rng);
  std::vector<float> dwte = random_floats(size_t(kSliceV1 - kSliceV0) * C, rng);
  std::vector<float> dwpe = random_floats(size_t(T) * C, rng);
  const EmbeddingSliceGrads got =
      run_embedding_slice_backward(dwte, dwpe, dout, tok, with_wpe, B, T, C);
  cpu_twin()->embedding_slice_backward(dwte.data(), with_wpe ? dwpe.data() : nullptr, dout.data(),
                                       tok.data(), kSliceV0, kSliceV1, B, T, C);
  // A null dwpe must stay untouched: compared with its unchanged starting values.
  return {{"dwte", err_vs(got.dwte, dwte), kFp32Tol}, {"dwpe", err_vs(got.dwpe, dwpe), kFp32Tol}};
}

// SliceStats split into (max, sum, target) columns.
struct SliceStats {
  std::vector<float> max, sum, target;
  explicit SliceStats(const std::vector<float>& s) {
    for (size_t i = 0; i + 2 < s.size(); i += 3) {
      max.push_back(s[i]);
      sum.push_back(s[i + 1]);
      target.push_back(s[i + 2]);
    }
  }
};

// Logits in [-4, 4]; the padded columns (j >= live) hold random values that must not count.
inline Errors check_crossentropy_slice_stats(int N, int Vl, int live, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<float> logits = random_floats(size_t(N) * Vl, rng, -4.0, 4.0);
  const std::vector<int32_t> targets = tokens_in(N, 0, 384, rng);
  std::vector<float> stats(3 * size_t(N));
  cpu_twin()->crossentropy_slice_stats(stats.data(), logits.data(), targets.data(), kSliceV0, live,
                                       N, Vl);
  DeviceBuffer<float> d_stats(3 * size_t(N)), d_logits(logits);
  DeviceBuffer<int32_t> d_targets(targets);
  cuda::crossentropy_slice_stats_cuda(d_stats.get(), d_logits.get(), d_targets.get(), kSliceV0,
                                      live, N, Vl, nullptr);
  const SliceStats want(stats), got(d_stats.download());
  return {{"max (bitwise)", same_bits(got.max, want.max) ? 0.0 : 1.0, 0.0},
          {"sum", err_vs(got.sum, want.sum), kFp32Tol},
          {"target (bitwise)", same_bits(got.target, want.target) ? 0.0 : 1.0, 0.0}};
}

// tp ranks of Vl columns each; this rank is the last one, with `live` real columns (the others
// are full). all_stats comes from the CPU stats of each rank's own random logits.
inline Errors check_crossentropy_slice_combine(int N, int Vl, int tp, int live, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<int32_t> targets = tokens_in(N, 0, tp * Vl, rng);
  const std::unique_ptr<Backend> cpu = cpu_twin();
  std::vector<float> all_stats(size_t(tp) * N * 3), mine;
  for (int r = 0; r < tp; ++r) {
    std::vector<float> logits = random_floats(size_t(N) * Vl, rng, -4.0, 4.0);
    const int live_r = r == tp - 1 ? live : Vl;
    cpu->crossentropy_slice_stats(all_stats.data() + size_t(r) * N * 3, logits.data(),
                                  targets.data(), r * Vl, live_r, N, Vl);
    mine = std::move(logits);
  }
  // The device copy's padded columns are NaN: they fail unless the kernel writes its zeros.
  std::vector<float> device_logits = mine;
  for (int n = 0; n < N; ++n)
    for (int j = live; j < Vl; ++j) device_logits[size_t(n) * Vl + j] = nans(1)[0];
  DeviceBuffer<float> d_probs(device_logits), d_stats(all_stats), d_losses(N);
  std::vector<float> losses(N);
  cpu->crossentropy_slice_combine(losses.data(), mine.data(), all_stats.data(), tp, live, N, Vl);
  cuda::crossentropy_slice_combine_cuda(d_losses.get(), d_probs.get(), d_stats.get(), tp, live, N,
                                        Vl, nullptr);
  return {{"losses", err_vs(d_losses.download(), losses), kFp32Tol},
          {"probs", err_vs(d_probs.download(), mine), kFp32Tol}};
}

// Probabilities with zero padding; targets in [0, 640) land before, in and after this rank's
// columns [128, 128 + Vl).
inline Errors check_crossentropy_slice_backward(int N, int Vl, int live, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> probs = random_floats(size_t(N) * Vl, rng, 0.0, 1.0);
  for (int n = 0; n < N; ++n)
    for (int j = live; j < Vl; ++j) probs[size_t(n) * Vl + j] = 0.0f;
  const std::vector<int32_t> targets = tokens_in(N, 0, 640, rng);
  const float dloss = 0.37f;
  DeviceBuffer<float> d_probs(probs);
  DeviceBuffer<int32_t> d_targets(targets);
  cpu_twin()->crossentropy_slice_backward(probs.data(), targets.data(), dloss, kSliceV0, N, Vl);
  cuda::crossentropy_slice_backward_cuda(d_probs.get(), d_targets.get(), dloss, kSliceV0, N, Vl,
                                         nullptr);
  return {{"dlogits", err_vs(d_probs.download(), probs), kFp32Tol}};
}

}  // namespace trident::testing
