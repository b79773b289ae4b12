// Microbenchmarks of the vocab-parallel kernels (kernels/vocab_parallel.cu) at a GPT-2-124M
// shape split over tp = 2: N = 8192 rows (B 8 × T 1024), C = 768, Vl = 25152 logits per rank.
// Each validates the five launchers against their CPU twins on a small case first, then reports
// GB/s of the minimal traffic against the copy ceiling.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "backend_test_util.h"
#include "bench_util.h"
#include "gpu_test_util.h"
#include "vocab_parallel.h"

namespace trident::bench {
namespace {

using testing::DeviceBuffer;

// Every launcher once on a small case (N 37, C 96, v0 128, Vl 384 of which 250 live, tp 2)
// against the CPU backend's twin; "" when all are within 1e-5 of the tensor's scale.
std::string validate() {
  const int N = 37, B = 1, T = 37, C = 96, v0 = 128, v1 = 256, Vl = 384, live = 250, tp = 2;
  std::mt19937 rng(11);
  auto cpu = make_cpu_backend(1);
  const auto tokens = testing::tokens(N, 384, rng);
  const auto wte = testing::to_float(testing::uniform(size_t(v1 - v0) * C, rng));
  const auto wpe = testing::to_float(testing::uniform(size_t(T) * C, rng));
  const auto logits = testing::to_float(testing::uniform(size_t(N) * Vl, rng, -4, 4));
  std::vector<double> errs;
  auto err = [&](const std::vector<float>& got, const std::vector<float>& want) {
    errs.push_back(testing::rel_err(got, testing::to_double(want)));
  };
  DeviceBuffer<int32_t> d_tok(tokens);
  {  // embedding forward and backward
    std::vector<float> want(size_t(N) * C), dwte(wte.size(), 0.5f), dwpe(wpe.size(), 0.25f);
    cpu->embedding_slice_forward(want.data(), tokens.data(), wte.data(), wpe.data(), v0, v1, B, T, C);
    DeviceBuffer<float> out(want.size()), d_wte(wte), d_wpe(wpe);
    cuda::embedding_slice_forward_cuda(out.get(), d_tok.get(), d_wte.get(), d_wpe.get(), v0, v1,
                                       B, T, C, nullptr);
    err(out.download(), want);
    DeviceBuffer<float> g_wte(dwte), g_wpe(dwpe), dout(want);
    cpu->embedding_slice_backward(dwte.data(), dwpe.data(), want.data(), tokens.data(), v0, v1,
                                  B, T, C);
    cuda::embedding_slice_backward_cuda(g_wte.get(), g_wpe.get(), dout.get(), d_tok.get(), v0, v1,
                                        B, T, C, nullptr);
    err(g_wte.download(), dwte);
    err(g_wpe.download(), dwpe);
  }
  {  // loss: stats of two ranks' slices, combine, backward
    std::vector<float> stats(size_t(tp) * N * 3), probs = logits, losses(N);
    for (int r = 0; r < tp; ++r)
      cpu->crossentropy_slice_stats(stats.data() + size_t(r) * N * 3, logits.data(),
                                    tokens.data(), v0 + r * Vl, live, N, Vl);
    DeviceBuffer<float> d_logits(logits), d_stats(size_t(N) * 3);
    cuda::crossentropy_slice_stats_cuda(d_stats.get(), d_logits.get(), d_tok.get(), v0, live, N,
                                        Vl, nullptr);
    err(d_stats.download(), std::vector<float>(stats.begin(), stats.begin() + size_t(N) * 3));
    cpu->crossentropy_slice_combine(losses.data(), probs.data(), stats.data(), tp, live, N, Vl);
    DeviceBuffer<float> d_all(stats), d_losses(N);
    cuda::crossentropy_slice_combine_cuda(d_losses.get(), d_logits.get(), d_all.get(), tp, live,
                                          N, Vl, nullptr);
    err(d_losses.download(), losses);
    err(d_logits.download(), probs);
    cpu->crossentropy_slice_backward(probs.data(), tokens.data(), 0.125f, v0, N, Vl);
    cuda::crossentropy_slice_backward_cuda(d_logits.get(), d_tok.get(), 0.125f, v0, N, Vl, nullptr);
    err(d_logits.download(), probs);
  }
  for (double e : errs)
    if (!(e <= 1e-5)) return "vocab-parallel kernel differs from its CPU twin: " + std::to_string(e);
  return "";
}

constexpr int kB = 8, kT = 1024, kC = 768, kVl = 25152;
constexpr size_t kN = size_t(kB) * kT;

enum class Op { kEmbeddingForward, kEmbeddingBackward, kStats, kCombine, kLossBackward };

void BM_vocab_parallel(benchmark::State& state, Op op) {
  if (!require_gpu(state)) return;
  if (const std::string why = validate(); !why.empty()) {
    state.SkipWithError(why.c_str());
    return;
  }
  std::mt19937 rng(5);
  DeviceBuffer<int32_t> tokens(testing::tokens(kN, 2 * kVl, rng));
  DeviceBuffer<float> rows(kN * kC), wte(size_t(kVl) * kC), wpe(size_t(kT) * kC),
      logits(kN * kVl), stats(2 * kN * 3), losses(kN);
  for (auto* b : {&rows, &wte, &wpe, &logits, &stats}) b->zero();
  cudaStream_t s = nullptr;
  double bytes = 0;  // the minimal traffic, read + written
  std::function<void()> launch;
  switch (op) {
    case Op::kEmbeddingForward:  // read tokens, the rows of this slice (~half), wpe; write N rows
      bytes = 4.0 * (kN + 1.5 * kN * kC + double(kT) * kC);
      launch = [&] { cuda::embedding_slice_forward_cuda(rows.get(), tokens.get(), wte.get(), wpe.get(), 0, kVl, kB, kT, kC, s); };
      break;
    case Op::kEmbeddingBackward:  // read dout twice (wte rows and wpe) + tokens; write both grads
      bytes = 4.0 * (2.0 * kN * kC + kN + double(kVl) * kC + 2.0 * kT * kC);
      launch = [&] { cuda::embedding_slice_backward_cuda(wte.get(), wpe.get(), rows.get(), tokens.get(), 0, kVl, kB, kT, kC, s); };
      break;
    case Op::kStats:  // read the logits; write 3 floats per row
      bytes = 4.0 * (double(kN) * kVl + 3.0 * kN);
      launch = [&] { cuda::crossentropy_slice_stats_cuda(stats.get(), logits.get(), tokens.get(), 0, kVl, kN, kVl, s); };
      break;
    case Op::kCombine:  // read and write the logits
      bytes = 4.0 * 2.0 * kN * kVl;
      launch = [&] { cuda::crossentropy_slice_combine_cuda(losses.get(), logits.get(), stats.get(), 2, kVl, kN, kVl, s); };
      break;
    case Op::kLossBackward:  // read and write the probabilities
      bytes = 4.0 * 2.0 * kN * kVl;
      launch = [&] { cuda::crossentropy_slice_backward_cuda(logits.get(), tokens.get(), 0.5f, 0, kN, kVl, s); };
      break;
  }
  for (auto _ : state) report_bandwidth(state, bytes, time_ms(launch, s));
}

#define TRIDENT_VP_BENCH(name, op) \
  BENCHMARK_CAPTURE(BM_vocab_parallel, name, op)->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond)
TRIDENT_VP_BENCH(embedding_slice_forward, Op::kEmbeddingForward);
TRIDENT_VP_BENCH(embedding_slice_backward, Op::kEmbeddingBackward);
TRIDENT_VP_BENCH(crossentropy_slice_stats, Op::kStats);
TRIDENT_VP_BENCH(crossentropy_slice_combine, Op::kCombine);
TRIDENT_VP_BENCH(crossentropy_slice_backward, Op::kLossBackward);

}  // namespace
}  // namespace trident::bench
