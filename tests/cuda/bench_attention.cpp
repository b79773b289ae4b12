// Causal attention: the fp32 flash kernels and cuDNN's fused bf16 attention, forward and
// backward, at GPT-2 sizes (B=8, T=1024, HS=64, NH=12 for 124M and 16 for 350M).
//
// FLOPs counted (the nominal causal count, what the kernels must do at the least):
//   forward  = 2 matmuls (Q·Kᵀ, P·V) × 2·B·NH·T²·HS / 2 (causal half) = 2·B·NH·T²·HS
//   backward = 2.5 × forward (Q·Kᵀ recomputed, dO·Vᵀ, dV, dK, dQ: 5 matmuls instead of 2).
// The flash backward recomputes P and dS in both of its passes, so it does more than this;
// the counter still reports the nominal count so that the two paths compare directly.
// Each benchmark first validates its path on a small shape against the CPU twin.
#include <benchmark/benchmark.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attention_cudnn.h"
#include "attention_flash.h"
#include "attention_reference.h"
#include "backend_test_util.h"
#include "bench_util.h"
#include "gpu_test_util.h"
#include "trident/backend.h"

namespace trident::bench {
namespace {

using testing::as_bf16;
using testing::DeviceBuffer;
using testing::from_bf16;
using testing::to_bf16;

constexpr int kB = 8, kT = 1024, kHS = 64;

double forward_flops(int B, int T, int NH, int HS) { return 2.0 * B * NH * double(T) * T * HS; }

// Small validation shape (HS=64 like the timed one, T not a tile multiple).
constexpr int vB = 2, vT = 100, vC = 256, vNH = 4;

testing::AttentionReference cpu_attention(bool bf16_inputs) {
  return testing::attention_reference(vB, vT, vC, vNH, bf16_inputs, 7);
}

// Empty string when the flash kernels match the CPU twin (fp32 tolerance as in the tests).
std::string validate_flash() {
  const testing::AttentionReference r = cpu_attention(false);
  DeviceBuffer<float> qkv(r.qkv), dout(r.dout), out(r.out.size()), dqkv(r.qkv.size());
  DeviceBuffer<float> lse(size_t(vB) * vNH * vT);
  DeviceBuffer<float> scratch(cuda::flash_attention_backward_scratch_floats(vB, vT, vC, vNH));
  cuda::flash_attention_forward_cuda(out.get(), lse.get(), qkv.get(), vB, vT, vC, vNH, nullptr);
  cuda::flash_attention_backward_cuda(dqkv.get(), scratch.get(), dout.get(), qkv.get(), out.get(),
                                      lse.get(), vB, vT, vC, vNH, nullptr);
  const double e_out = testing::rel_err(out.download(), testing::to_double(r.out));
  const double e_d = testing::rel_err(dqkv.download(), testing::to_double(r.dqkv));
  if (e_out <= 1e-5 && e_d <= 1e-5) return "";
  return "flash attention mismatch vs CPU: out " + std::to_string(e_out) + ", dqkv " +
         std::to_string(e_d);
}

std::string validate_cudnn(cuda::CudnnAttention& attention) {
  std::string why;
  if (!attention.supported(vB, vT, vC, vNH, &why)) return why;
  const testing::AttentionReference r = cpu_attention(true);
  DeviceBuffer<uint16_t> qkv(to_bf16(r.qkv)), dout(to_bf16(r.dout));
  DeviceBuffer<uint16_t> out(r.out.size()), dqkv(r.qkv.size());
  DeviceBuffer<float> stats(size_t(vB) * vNH * vT);
  attention.forward(as_bf16(out), stats.get(), as_bf16(qkv), vB, vT, vC, vNH, nullptr);
  attention.backward(as_bf16(dqkv), as_bf16(dout), as_bf16(qkv), as_bf16(out), stats.get(), vB, vT,
                     vC, vNH, nullptr);
  const double e_out = testing::rel_err(from_bf16(out.download()), testing::to_double(r.out));
  const double e_d = testing::rel_err(from_bf16(dqkv.download()), testing::to_double(r.dqkv));
  if (e_out <= 1e-2 && e_d <= 1e-2) return "";
  return "cuDNN attention mismatch vs CPU: out " + std::to_string(e_out) + ", dqkv " +
         std::to_string(e_d);
}

void report(benchmark::State& state, double flops, double ms) {
  report_flops(state, flops, ms);
  state.counters["ms"] = ms;
}

void BM_attention_flash(benchmark::State& state, bool backward) {
  if (!require_gpu(state)) return;
  static const std::string mismatch = validate_flash();
  if (!mismatch.empty()) {
    state.SkipWithError(mismatch.c_str());
    return;
  }
  const int NH = int(state.range(0)), C = NH * kHS;
  std::mt19937 rng(1);
  DeviceBuffer<float> qkv(testing::to_float(testing::uniform(size_t(kB) * kT * 3 * C, rng)));
  DeviceBuffer<float> dout(testing::to_float(testing::uniform(size_t(kB) * kT * C, rng)));
  DeviceBuffer<float> out(size_t(kB) * kT * C), dqkv(qkv.size()), lse(size_t(kB) * NH * kT);
  DeviceBuffer<float> scratch(cuda::flash_attention_backward_scratch_floats(kB, kT, C, NH));
  cudaStream_t stream = nullptr;
  cuda::flash_attention_forward_cuda(out.get(), lse.get(), qkv.get(), kB, kT, C, NH, stream);
  auto launch = [&] {
    if (backward)
      cuda::flash_attention_backward_cuda(dqkv.get(), scratch.get(), dout.get(), qkv.get(),
                                          out.get(), lse.get(), kB, kT, C, NH, stream);
    else cuda::flash_attention_forward_cuda(out.get(), lse.get(), qkv.get(), kB, kT, C, NH, stream);
  };
  double ms = 0;
  for (auto _ : state) {
    ms = time_ms(launch, stream);
    state.SetIterationTime(ms * 1e-3);
  }
  report(state, forward_flops(kB, kT, NH, kHS) * (backward ? 2.5 : 1.0), ms);
}

void BM_attention_cudnn(benchmark::State& state, bool backward) {
  if (!require_gpu(state)) return;
  const testing::CudnnHandle handle;
  cuda::CudnnAttention attention(handle.get());
  const std::string mismatch = validate_cudnn(attention);
  if (!mismatch.empty()) {
    state.SkipWithError(mismatch.c_str());
    return;
  }
  const int NH = int(state.range(0)), C = NH * kHS;
  std::string why;
  if (!attention.supported(kB, kT, C, NH, &why)) {
    state.SkipWithError(why.c_str());
    return;
  }
  std::mt19937 rng(1);
  DeviceBuffer<uint16_t> qkv(
      to_bf16(testing::to_float(testing::uniform(size_t(kB) * kT * 3 * C, rng))));
  DeviceBuffer<uint16_t> dout(
      to_bf16(testing::to_float(testing::uniform(size_t(kB) * kT * C, rng))));
  DeviceBuffer<uint16_t> out(size_t(kB) * kT * C), dqkv(qkv.size());
  DeviceBuffer<float> stats(size_t(kB) * NH * kT);
  cudaStream_t stream = nullptr;
  attention.forward(as_bf16(out), stats.get(), as_bf16(qkv), kB, kT, C, NH, stream);
  auto launch = [&] {
    if (backward)
      attention.backward(as_bf16(dqkv), as_bf16(dout), as_bf16(qkv), as_bf16(out), stats.get(), kB,
                         kT, C, NH, stream);
    else attention.forward(as_bf16(out), stats.get(), as_bf16(qkv), kB, kT, C, NH, stream);
  };
  double ms = 0;
  for (auto _ : state) {
    ms = time_ms(launch, stream);
    state.SetIterationTime(ms * 1e-3);
  }
  report(state, forward_flops(kB, kT, NH, kHS) * (backward ? 2.5 : 1.0), ms);
}

BENCHMARK_CAPTURE(BM_attention_flash, forward, false)
    ->Arg(12)
    ->Arg(16)
    ->ArgName("NH")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_attention_flash, backward, true)
    ->Arg(12)
    ->Arg(16)
    ->ArgName("NH")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_attention_cudnn, forward, false)
    ->Arg(12)
    ->Arg(16)
    ->ArgName("NH")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_attention_cudnn, backward, true)
    ->Arg(12)
    ->Arg(16)
    ->ArgName("NH")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace trident::bench
