// The planner's GEMM curve measured (inputs/hardware/*.yaml `gemm:`, Note [Hardware files] in
// src/plan/hardware.cpp): the rate of the CUDA backend's bf16 GEMM (matmul_forward_bf16:
// cuBLASLt, fp32 accumulation) by the smallest of M, N and K, the other two 4096, with the small
// dimension in each of the three places (rows, inner, columns). tools/gpu-check.sh runs it and
// tools/gemm_curve.py turns its JSON into a `gemm:` list (the mean of the three places per
// min_dim), to replace a hardware file's published or derated points with this machine's.
// FLOPs: 2·M·N·K. Checked first: a small product against the CPU backend's.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "backend_test_util.h"
#include "bench_util.h"
#include "trident/backend.h"
#include "trident/bfloat16.h"
#include "trident/cuda_backend.h"

namespace trident::bench {
namespace {

// bf16 inputs, fp32 accumulation, bf16 output: 2e-2 of the tensor's scale.
std::string validate(Backend& gpu) {
  const int N = 64, C = 96, OC = 80;
  std::mt19937 rng(5);
  const auto inp = testing::uniform(size_t(N) * C, rng), w = testing::uniform(size_t(OC) * C, rng);
  std::vector<float> want(size_t(N) * OC);
  make_cpu_backend(1)->matmul_forward(want.data(), testing::to_float(inp).data(),
                                      testing::to_float(w).data(), nullptr, N, C, OC);
  std::vector<bfloat16> inp16(inp.size()), w16(w.size());
  for (size_t i = 0; i < inp.size(); ++i) inp16[i] = to_bfloat16(float(inp[i]));
  for (size_t i = 0; i < w.size(); ++i) w16[i] = to_bfloat16(float(w[i]));
  BackendBuffer<bfloat16> d_inp(gpu, inp16.size()), d_w(gpu, w16.size()), d_out(gpu, want.size());
  gpu.copy(d_inp.data(), inp16.data(), inp16.size() * sizeof(bfloat16));
  gpu.copy(d_w.data(), w16.data(), w16.size() * sizeof(bfloat16));
  gpu.matmul_forward_bf16(d_out.data(), d_inp.data(), d_w.data(), nullptr, N, C, OC);
  std::vector<bfloat16> out16(want.size());
  gpu.copy(out16.data(), d_out.data(), out16.size() * sizeof(bfloat16));
  std::vector<double> got(out16.size());
  for (size_t i = 0; i < got.size(); ++i) got[i] = to_float(out16[i]);
  const double err =
      testing::rel_err(std::vector<float>(got.begin(), got.end()), testing::to_double(want));
  return err <= 2e-2 ? "" : "bf16 matmul differs from the CPU: " + std::to_string(err);
}

// place 0: the small dimension d is the rows (M), 1: the inner (K), 2: the columns (N).
void BM_gemm_curve(benchmark::State& state, int d, int place) {
  if (!require_gpu(state)) return;
  auto gpu = make_cuda_backend();
  if (const std::string why = validate(*gpu); !why.empty()) {
    state.SkipWithError(why.c_str());
    return;
  }
  constexpr int kBig = 4096;
  const int M = place == 0 ? d : kBig, K = place == 1 ? d : kBig, N = place == 2 ? d : kBig;
  BackendBuffer<bfloat16> inp(*gpu, size_t(M) * K), w(*gpu, size_t(N) * K),
      out(*gpu, size_t(M) * N);
  fill_nonzero(*gpu, inp);
  fill_nonzero(*gpu, w);
  cudaStream_t stream = static_cast<cudaStream_t>(cuda_compute_stream(*gpu));
  auto launch = [&] {
    gpu->matmul_forward_bf16(out.data(), inp.data(), w.data(), nullptr, M, K, N);
  };
  for (auto _ : state) report_flops(state, 2.0 * M * double(N) * K, time_ms(launch, stream, 20, 3));
  state.counters["min_dim"] = d;
}

#define TRIDENT_GEMM_CURVE(d)                                                        \
  BENCHMARK_CAPTURE(BM_gemm_curve, d##_rows, d, 0)->UseManualTime()->Iterations(3);  \
  BENCHMARK_CAPTURE(BM_gemm_curve, d##_inner, d, 1)->UseManualTime()->Iterations(3); \
  BENCHMARK_CAPTURE(BM_gemm_curve, d##_cols, d, 2)->UseManualTime()->Iterations(3)
TRIDENT_GEMM_CURVE(64);
TRIDENT_GEMM_CURVE(128);
TRIDENT_GEMM_CURVE(256);
TRIDENT_GEMM_CURVE(512);
TRIDENT_GEMM_CURVE(1024);
TRIDENT_GEMM_CURVE(2048);
TRIDENT_GEMM_CURVE(4096);

}  // namespace
}  // namespace trident::bench
