// Microbenchmarks of the vocab-parallel kernels (kernels/vocab_parallel.cu) at a GPT-2-124M
// shape split over tp = 2: N = 8192 rows (B 8 × T 1024), C = 768, Vl = 25152 logits per rank.
// Each validates the five launchers against their CPU twins on a small case first
// (kernel_checks_vocab.h), then reports GB/s of the minimal traffic against the copy ceiling.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "kernel_checks_vocab.h"

namespace trident::bench {
namespace {

using testing::DeviceBuffer;

// Every launcher once on a small case against its CPU twin (kernel_checks_vocab.h).
bool validate_all(benchmark::State& state) {
  return validate(state, testing::check_embedding_slice_forward(3, 37, 96, true, 51)) &&
         validate(state, testing::check_embedding_slice_backward(1, 37, 96, 0, 384, true, 52)) &&
         validate(state, testing::check_crossentropy_slice_stats(37, 384, 250, 54)) &&
         validate(state, testing::check_crossentropy_slice_combine(37, 384, 2, 250, 55)) &&
         validate(state, testing::check_crossentropy_slice_backward(37, 384, 250, 56));
}

constexpr int kB = 8, kT = 1024, kC = 768, kVl = 25152;
constexpr size_t kN = size_t(kB) * kT;

enum class Op { kEmbeddingForward, kEmbeddingBackward, kStats, kCombine, kLossBackward };

void BM_vocab_parallel(benchmark::State& state, Op op) {
  if (!require_gpu(state) || !validate_all(state)) return;
  std::mt19937 rng(5);
  DeviceBuffer<int32_t> tokens(testing::tokens(kN, 2 * kVl, rng));
  DeviceBuffer<float> rows(kN * kC), wte(size_t(kVl) * kC), wpe(size_t(kT) * kC), logits(kN * kVl),
      stats(2 * kN * 3), losses(kN);
  for (auto* b : {&rows, &wte, &wpe, &logits, &stats}) b->zero();
  DeviceBuffer<unsigned char> scratch(cuda::embedding_backward_scratch_bytes(kN, kVl));
  cudaStream_t s = nullptr;
  double bytes = 0;  // the minimal traffic, read + written
  std::function<void()> launch;
  switch (op) {
    case Op::kEmbeddingForward:  // read tokens, the rows of this slice (~half), wpe; write N rows
      bytes = 4.0 * (kN + 1.5 * kN * kC + double(kT) * kC);
      launch = [&] {
        cuda::embedding_slice_forward_cuda(rows.get(), tokens.get(), wte.get(), wpe.get(), 0, kVl,
                                           kB, kT, kC, s);
      };
      break;
    case Op::kEmbeddingBackward:  // read dout twice (wte rows and wpe) + tokens; write both grads
      bytes = 4.0 * (2.0 * kN * kC + kN + double(kVl) * kC + 2.0 * kT * kC);
      launch = [&] {
        cuda::embedding_slice_backward_cuda(wte.get(), wpe.get(), scratch.get(), rows.get(),
                                            tokens.get(), 0, kVl, kB, kT, kC, s);
      };
      break;
    case Op::kStats:  // read the logits; write 3 floats per row
      bytes = 4.0 * (double(kN) * kVl + 3.0 * kN);
      launch = [&] {
        cuda::crossentropy_slice_stats_cuda(stats.get(), logits.get(), tokens.get(), 0, kVl, kN,
                                            kVl, s);
      };
      break;
    case Op::kCombine:  // read and write the logits
      bytes = 4.0 * 2.0 * kN * kVl;
      launch = [&] {
        cuda::crossentropy_slice_combine_cuda(losses.get(), logits.get(), stats.get(), 2, kVl, kN,
                                              kVl, s);
      };
      break;
    case Op::kLossBackward:  // read and write the probabilities
      bytes = 4.0 * 2.0 * kN * kVl;
      launch = [&] {
        cuda::crossentropy_slice_backward_cuda(logits.get(), tokens.get(), 0.5f, 0, kN, kVl, s);
      };
      break;
  }
  for (auto _ : state) report_bandwidth(state, bytes, time_ms(launch, s));
}

#define TRIDENT_VP_BENCH(name, op)               \
  BENCHMARK_CAPTURE(BM_vocab_parallel, name, op) \
      ->UseManualTime()                          \
      ->Iterations(3)                            \
      ->Unit(benchmark::kMillisecond)
TRIDENT_VP_BENCH(embedding_slice_forward, Op::kEmbeddingForward);
TRIDENT_VP_BENCH(embedding_slice_backward, Op::kEmbeddingBackward);
TRIDENT_VP_BENCH(crossentropy_slice_stats, Op::kStats);
TRIDENT_VP_BENCH(crossentropy_slice_combine, Op::kCombine);
TRIDENT_VP_BENCH(crossentropy_slice_backward, Op::kLossBackward);

}  // namespace
}  // namespace trident::bench
