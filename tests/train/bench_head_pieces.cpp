// The LM head's weight gradient whole or in row pieces (Note [Head gradient in pieces],
// trident/buckets.h): dwte[V,C] += dlogits[N,V]ᵀ · x[N,C] as one GEMM, or as K GEMMs of V/K
// rows each (the pieces head_gradient_pieces makes for bucket_mb ≈ V·C·4/K bytes), on one
// thread, as a dp rank runs it. The pieces do the same arithmetic; what they may cost is the
// smaller GEMMs' efficiency. Shapes: HeadGradient/C/N/K — the L6 C384 weak-scaling deck
// (N = 4 × 256 tokens; K 3 = bucket_mb 25, K 11 = 7) and GPT-2 124M's bench shape (N = 4 × 64;
// K 6 = 25 MiB, K 15 = 10).
// Run: build/tests/bench_train --benchmark_filter=HeadGradient; not part of ctest.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "train/tied_embedding.h"
#include "trident/backend.h"
#include "trident/buckets.h"

namespace trident {
namespace {

void BM_HeadGradient(benchmark::State& state) {
  const int C = int(state.range(0)), N = int(state.range(1)), K = int(state.range(2));
  const int V = 50304;
  auto be = make_cpu_backend(1);
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> dlogits(size_t(N) * V), x(size_t(N) * C), dw(size_t(V) * C, 0.0f);
  for (float& v : dlogits) v = d(rng);
  for (float& v : x) v = d(rng);
  const size_t bucket = (size_t(V) * C * 4 + size_t(K) - 1) / size_t(K);
  const std::vector<int> rows =
      K > 1 ? head_gradient_pieces(V, C, 4, bucket, 32) : std::vector<int>{};
  for (auto _ : state) {
    if (rows.empty()) {
      be->matmul_backward(nullptr, dw.data(), nullptr, dlogits.data(), x.data(), nullptr, N, C, V);
    } else {
      for (size_t k = 0; k + 1 < rows.size(); ++k)
        be->matmul_backward_weight_rows(dw.data() + size_t(rows[k]) * C, dlogits.data() + rows[k],
                                        V, x.data(), N, C, rows[k + 1] - rows[k]);
    }
    benchmark::DoNotOptimize(dw.data());
  }
  state.counters["pieces"] = double(rows.empty() ? 1 : rows.size() - 1);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * N * V * C * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_HeadGradient)
    ->Args({384, 1024, 1})
    ->Args({384, 1024, 3})
    ->Args({384, 1024, 11})
    ->Args({768, 256, 1})
    ->Args({768, 256, 6})
    ->Args({768, 256, 15})
    ->Unit(benchmark::kMillisecond)
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);

}  // namespace
}  // namespace trident
