// The CUDA backend's linear layers as the model calls them (bf16 casts of both inputs, then the
// cuBLASLt GEMM with fp32 accumulation): forward, and backward (dinp and dw), at the GPT-2
// shapes, against the measured GEMM rate. The gap between these and the 8192³ ceiling is the
// cost of the casts plus the smaller shapes (Note [Mixed precision]).
// FLOPs: forward 2·N·C·OC; backward 4·N·C·OC (dinp and dw).
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "backend_test_util.h"
#include "bench_util.h"
#include "trident/backend.h"
#include "trident/cuda_backend.h"

namespace trident::bench {
namespace {

// A small case against the CPU backend first (bf16 inputs: 1e-2 of the tensor's scale).
std::string validate(Backend& gpu) {
  const int N = 64, C = 96, OC = 80;
  std::mt19937 rng(3);
  const auto inp = testing::uniform(size_t(N) * C, rng), w = testing::uniform(size_t(OC) * C, rng);
  const auto bias = testing::uniform(OC, rng);
  std::vector<float> want(size_t(N) * OC);
  make_cpu_backend(1)->matmul_forward(want.data(), testing::to_float(inp).data(),
                                      testing::to_float(w).data(), testing::to_float(bias).data(),
                                      N, C, OC);
  BackendBuffer<float> d_inp(gpu, inp.size()), d_w(gpu, w.size()), d_b(gpu, OC),
      d_out(gpu, want.size());
  gpu.copy(d_inp.data(), testing::to_float(inp).data(), inp.size() * 4);
  gpu.copy(d_w.data(), testing::to_float(w).data(), w.size() * 4);
  gpu.copy(d_b.data(), testing::to_float(bias).data(), OC * 4);
  gpu.matmul_forward(d_out.data(), d_inp.data(), d_w.data(), d_b.data(), N, C, OC);
  HostView<float> got(gpu, d_out.data(), want.size(), /*load=*/true);
  const double err = testing::rel_err(std::vector<float>(got.data(), got.data() + got.size()),
                                      testing::to_double(want));
  return err <= 1e-2 ? "" : "backend matmul differs from the CPU: " + std::to_string(err);
}

void BM_linear(benchmark::State& state, int C, int OC, bool backward) {
  if (!require_gpu(state)) return;
  auto gpu = make_cuda_backend();
  if (const std::string why = validate(*gpu); !why.empty()) {
    state.SkipWithError(why.c_str());
    return;
  }
  const int N = 8 * 1024;
  BackendBuffer<float> inp(*gpu, size_t(N) * C), w(*gpu, size_t(OC) * C), bias(*gpu, OC),
      out(*gpu, size_t(N) * OC), dinp(*gpu, size_t(N) * C), dw(*gpu, size_t(OC) * C), db(*gpu, OC);
  for (auto* b : {&inp, &w, &bias, &out}) fill_nonzero(*gpu, *b);
  cudaStream_t stream = static_cast<cudaStream_t>(cuda_compute_stream(*gpu));
  auto launch = [&] {
    if (backward)
      gpu->matmul_backward(dinp.data(), dw.data(), db.data(), out.data(), inp.data(), w.data(), N,
                           C, OC);
    else gpu->matmul_forward(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  };
  const double flops = (backward ? 4.0 : 2.0) * N * double(C) * OC;
  for (auto _ : state) report_flops(state, flops, time_ms(launch, stream, 10, 2));
}

// GPT-2 124M (C 768) and 350M (C 1024): qkv, attproj, fc, fcproj, LM head.
#define TRIDENT_LINEAR(name, C, OC)                                                       \
  BENCHMARK_CAPTURE(BM_linear, name##_fwd, C, OC, false)->UseManualTime()->Iterations(3); \
  BENCHMARK_CAPTURE(BM_linear, name##_bwd, C, OC, true)->UseManualTime()->Iterations(3)
TRIDENT_LINEAR(c768_qkv, 768, 2304);
TRIDENT_LINEAR(c768_attproj, 768, 768);
TRIDENT_LINEAR(c768_fc, 768, 3072);
TRIDENT_LINEAR(c768_fcproj, 3072, 768);
TRIDENT_LINEAR(c768_head, 768, 50304);
TRIDENT_LINEAR(c1024_fc, 1024, 4096);
TRIDENT_LINEAR(c1024_fcproj, 4096, 1024);

}  // namespace
}  // namespace trident::bench
