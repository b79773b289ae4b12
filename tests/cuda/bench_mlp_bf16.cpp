// The bf16 MLP's GELU with and without cuBLASLt's epilogues (Note [cuBLASLt epilogues]), as
// the model calls them, at N = 8192 tokens: forward fc + GELU (matmul_gelu_forward_bf16 against
// matmul_forward_bf16 then gelu_forward_bf16) and backward through fcproj and the GELU with
// fc's bias gradient (matmul_dgelu_backward_bf16 against matmul_backward_bf16's input gradient,
// gelu_backward_bf16, and the bias sums as fc's matmul_backward_bf16 took them). Fused and
// unfused run interleaved in one benchmark, so both see the same clocks; the counters are the
// two times and the fused one's TFLOP/s. Each op is first checked against its CPU twin.
// FLOPs: 2·N·C·4C for either GEMM.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

#include "bench_util.h"
#include "kernel_checks_bf16.h"
#include "trident/backend.h"
#include "trident/cuda_backend.h"

namespace trident::bench {
namespace {

constexpr int kTokens = 8 * 1024;

void BM_mlp_gelu(benchmark::State& state, int C, bool backward) {
  if (!require_gpu(state)) return;
  auto gpu = make_cuda_backend();
  const testing::Errors check =
      backward ? testing::check_matmul_dgelu_backward_bf16(*gpu, 256, 4 * C, C, true, 7)
               : testing::check_matmul_gelu_forward_bf16(*gpu, 256, C, 4 * C, true, 7);
  if (!validate(state, check)) return;
  const int N = kTokens, H = 4 * C;
  BackendBuffer<bfloat16> x(*gpu, size_t(N) * C), w(*gpu, size_t(H) * C), pre(*gpu, size_t(N) * H),
      out(*gpu, size_t(N) * H), tmp(*gpu, size_t(N) * H);
  BackendBuffer<float> bias(*gpu, H);
  for (auto* b : {&x, &w, &pre}) fill_nonzero(*gpu, *b);
  cudaStream_t stream = static_cast<cudaStream_t>(cuda_compute_stream(*gpu));
  // Forward: x [N,C] · w [H,C]ᵀ. Backward: dout = x [N,C] through fcproj's weight, read here
  // as w [C,H] (the same bytes), into the GELU's input gradient [N,H].
  auto fused = [&] {
    if (backward)
      gpu->matmul_dgelu_backward_bf16(out.data(), bias.data(), x.data(), w.data(), pre.data(), N, H,
                                      C);
    else
      gpu->matmul_gelu_forward_bf16(out.data(), pre.data(), x.data(), w.data(), bias.data(), N, C,
                                    H);
  };
  auto unfused = [&] {
    if (backward) {
      gpu->matmul_backward_bf16(tmp.data(), nullptr, nullptr, x.data(), nullptr, w.data(), N, H, C);
      gpu->gelu_backward_bf16(out.data(), pre.data(), tmp.data(), size_t(N) * H);
      gpu->matmul_backward_bf16(nullptr, nullptr, bias.data(), out.data(), nullptr, nullptr, N, C,
                                H);
    } else {
      gpu->matmul_forward_bf16(pre.data(), x.data(), w.data(), bias.data(), N, C, H);
      gpu->gelu_forward_bf16(out.data(), pre.data(), size_t(N) * H);
    }
  };
  const double flops = 2.0 * N * double(C) * H;
  std::vector<double> f, u;
  for (auto _ : state) {
    const double fused_ms = time_ms(fused, stream, 10, 2);
    const double unfused_ms = time_ms(unfused, stream, 10, 2);
    f.push_back(fused_ms);
    u.push_back(unfused_ms);
    report_flops(state, flops, fused_ms);
  }
  std::sort(f.begin(), f.end());
  std::sort(u.begin(), u.end());
  state.counters["fused_ms"] = f[f.size() / 2];
  state.counters["unfused_ms"] = u[u.size() / 2];
}

// GPT-2 124M (C 768), 350M (C 1024) and 1.5B (C 1600).
#define TRIDENT_MLP(C)                                                                  \
  BENCHMARK_CAPTURE(BM_mlp_gelu, c##C##_fwd, C, false)->UseManualTime()->Iterations(5); \
  BENCHMARK_CAPTURE(BM_mlp_gelu, c##C##_bwd, C, true)->UseManualTime()->Iterations(5)
TRIDENT_MLP(768);
TRIDENT_MLP(1024);
TRIDENT_MLP(1600);
#undef TRIDENT_MLP

}  // namespace
}  // namespace trident::bench
