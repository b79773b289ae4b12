// Grouped-query causal attention, cuDNN's bf16 graph with K and V of fewer heads, forward and
// backward, at the llama-1b deck's shape (B=4, T=2048, 32 query heads and 8 kv heads of 64).
// FLOPs counted as bench_attention.cpp counts them (the nominal causal count per query head:
// sharing kv heads saves memory traffic, not matmul work). Validated first on a small shape
// against the CPU twin (Backend::attention_forward_gqa/backward_gqa), bf16 tolerance 1e-2.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "attention_cudnn.h"
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

constexpr int kB = 4, kT = 2048, kNH = 32, kKVH = 8, kHS = 64;

size_t qkv_size(int B, int T, int NH, int KVH, int HS) {
  return size_t(B) * T * (NH + 2 * KVH) * HS;
}

// Empty when cuDNN's grouped graph matches the CPU twin at B 2, T 100, 8 heads over 2 kv heads.
std::string validate_cudnn_gqa(cuda::CudnnAttention& attention) {
  const int B = 2, T = 100, NH = 8, KVH = 2, HS = 64;
  std::string why;
  if (!attention.supported_gqa(B, T, NH, KVH, HS, &why)) return why;
  std::mt19937 rng(7);
  std::vector<float> qkv = from_bf16(to_bf16(
                         testing::to_float(testing::uniform(qkv_size(B, T, NH, KVH, HS), rng)))),
                     dout = from_bf16(to_bf16(
                         testing::to_float(testing::uniform(size_t(B) * T * NH * HS, rng))));
  auto cpu = make_cpu_backend(1);
  std::vector<float> att(size_t(B) * NH * T * T), scratch(att.size()), out(dout.size()),
      dqkv(qkv.size());
  cpu->attention_forward_gqa(out.data(), att.data(), qkv.data(), B, T, NH, KVH, HS);
  cpu->attention_backward_gqa(dqkv.data(), scratch.data(), dout.data(), qkv.data(), out.data(),
                              att.data(), B, T, NH, KVH, HS);
  DeviceBuffer<uint16_t> d_qkv(to_bf16(qkv)), d_dout(to_bf16(dout)), d_out(out.size()),
      d_dqkv(qkv.size());
  DeviceBuffer<float> stats(size_t(B) * NH * T);
  attention.forward_gqa(as_bf16(d_out), stats.get(), as_bf16(d_qkv), B, T, NH, KVH, HS, nullptr);
  attention.backward_gqa(as_bf16(d_dqkv), as_bf16(d_dout), as_bf16(d_qkv), as_bf16(d_out),
                         stats.get(), B, T, NH, KVH, HS, nullptr);
  const double e_out = testing::rel_err(from_bf16(d_out.download()), testing::to_double(out));
  const double e_d = testing::rel_err(from_bf16(d_dqkv.download()), testing::to_double(dqkv));
  if (e_out <= 1e-2 && e_d <= 1e-2) return "";
  return "cuDNN grouped attention mismatch vs CPU: out " + std::to_string(e_out) + ", dqkv " +
         std::to_string(e_d);
}

void BM_attention_cudnn_gqa(benchmark::State& state, bool backward) {
  if (!require_gpu(state)) return;
  const testing::CudnnHandle handle;
  cuda::CudnnAttention attention(handle.get());
  const std::string mismatch = validate_cudnn_gqa(attention);
  if (!mismatch.empty()) {
    state.SkipWithError(mismatch.c_str());
    return;
  }
  std::string why;
  if (!attention.supported_gqa(kB, kT, kNH, kKVH, kHS, &why)) {
    state.SkipWithError(why.c_str());
    return;
  }
  std::mt19937 rng(1);
  DeviceBuffer<uint16_t> qkv(
      to_bf16(testing::to_float(testing::uniform(qkv_size(kB, kT, kNH, kKVH, kHS), rng))));
  DeviceBuffer<uint16_t> dout(
      to_bf16(testing::to_float(testing::uniform(size_t(kB) * kT * kNH * kHS, rng))));
  DeviceBuffer<uint16_t> out(size_t(kB) * kT * kNH * kHS), dqkv(qkv.size());
  DeviceBuffer<float> stats(size_t(kB) * kNH * kT);
  cudaStream_t stream = nullptr;
  attention.forward_gqa(as_bf16(out), stats.get(), as_bf16(qkv), kB, kT, kNH, kKVH, kHS, stream);
  auto launch = [&] {
    if (backward)
      attention.backward_gqa(as_bf16(dqkv), as_bf16(dout), as_bf16(qkv), as_bf16(out), stats.get(),
                             kB, kT, kNH, kKVH, kHS, stream);
    else
      attention.forward_gqa(as_bf16(out), stats.get(), as_bf16(qkv), kB, kT, kNH, kKVH, kHS,
                            stream);
  };
  double ms = 0;
  for (auto _ : state) {
    ms = time_ms(launch, stream);
    state.SetIterationTime(ms * 1e-3);
  }
  const double forward_flops = 2.0 * kB * kNH * double(kT) * kT * kHS;
  report_flops(state, forward_flops * (backward ? 2.5 : 1.0), ms);
  state.counters["ms"] = ms;
}

BENCHMARK_CAPTURE(BM_attention_cudnn_gqa, forward, false)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_attention_cudnn_gqa, backward, true)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace trident::bench
