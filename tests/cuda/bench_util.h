// Shared by the kernel microbenchmarks (tests/cuda/bench_*.cpp → bench_kernels).
//
// Rules (STYLE.md rule 8): a benchmark validates its kernel against the CPU twin once before it
// times anything (state.SkipWithError on a mismatch); times with CUDA events on one stream
// (manual time); reports bytes or FLOPs per second as counters next to the ceiling they compare
// with: the measured device-to-device copy bandwidth (read + write bytes per second) for
// memory-bound kernels, the measured cuBLASLt bf16 GEMM rate for matmuls.
#pragma once

#include <benchmark/benchmark.h>

#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_check.h"
#include "kernel_checks.h"
#include "trident/backend.h"
#include "trident/bfloat16.h"
#include "trident/cuda_backend.h"

namespace trident::bench {

// Fills a float or bf16 buffer with nonzero data: tensor cores run measurably faster on zeros (a
// GEMM's power draw depends on its data), so timing zeroed buffers would flatter the result.
template <typename T>
void fill_nonzero(Backend& be, BackendBuffer<T>& buf) {
  std::vector<T> host(buf.size());
  for (size_t i = 0; i < host.size(); ++i) {
    const float x = float((i * 2654435761u) % 1000u) / 1000.0f - 0.5f;
    if constexpr (std::is_same_v<T, bfloat16>) host[i] = to_bfloat16(x);
    else host[i] = x;
  }
  be.copy(buf.data(), host.data(), host.size() * sizeof(T));
}

// Skips the benchmark (with the reason) when CUDA is not usable; returns false then. (main
// refuses to start on a broken GPU or under TRIDENT_REQUIRE_GPU=1: Note [GPU skips].)
inline bool require_gpu(benchmark::State& state) {
  const CudaDeviceStatus& s = cuda_device_status();
  if (s.state == CudaDeviceState::kUsable) return true;
  state.SkipWithError(("no usable CUDA device: " + s.reason).c_str());
  return false;
}

// Milliseconds per call of `launch` (which enqueues on `stream`), median-free mean over `reps`
// calls after `warmup` calls, measured with CUDA events.
inline double time_ms(const std::function<void()>& launch, cudaStream_t stream, int reps = 20,
                      int warmup = 3) {
  for (int i = 0; i < warmup; ++i) launch();
  cudaEvent_t start, stop;
  TRIDENT_CUDA(cudaEventCreate(&start));
  TRIDENT_CUDA(cudaEventCreate(&stop));
  TRIDENT_CUDA(cudaEventRecord(start, stream));
  for (int i = 0; i < reps; ++i) launch();
  TRIDENT_CUDA(cudaEventRecord(stop, stream));
  TRIDENT_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  TRIDENT_CUDA(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return double(ms) / reps;
}

// Measured device-to-device copy rate in bytes/s, counting read + write (so it compares
// directly with a kernel's bytes read + written per second). Measured once, 1 GiB.
double measured_copy_bytes_per_s();

// Measured bf16 GEMM rate (FLOP/s) of the CUDA backend's cuBLASLt configuration (bf16 inputs,
// fp32 accumulation and output, 8192³): the ceiling for compute-bound kernels. Measured once.
double measured_gemm_flops();

// TFLOP/s achieved and the fraction of the measured GEMM rate.
inline void report_flops(benchmark::State& state, double flops, double ms) {
  state.SetIterationTime(ms * 1e-3);
  state.counters["TFLOP/s"] = flops / (ms * 1e-3) / 1e12;
  state.counters["of_gemm_peak"] = flops / (ms * 1e-3) / measured_gemm_flops();
}

// Sets the usual counters: GB/s achieved and the fraction of the copy ceiling.
inline void report_bandwidth(benchmark::State& state, double bytes_moved, double ms) {
  const double rate = bytes_moved / (ms * 1e-3);
  state.SetIterationTime(ms * 1e-3);
  state.counters["GB/s"] = rate / 1e9;
  state.counters["of_copy_ceiling"] = rate / measured_copy_bytes_per_s();
}

// A kernel check's result (kernel_checks.h) as the benchmark's go-ahead: false, with the
// mismatch as the skip reason, when any output is outside its tolerance.
inline bool validate(benchmark::State& state, const testing::Errors& errors) {
  if (testing::all_within(errors)) return true;
  state.SkipWithError(("mismatch against the CPU twin: " + testing::describe(errors)).c_str());
  return false;
}

// A stream of the benchmark's own.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { TRIDENT_CUDA(cudaStreamCreate(&s)); }
  ~Stream() { cudaStreamDestroy(s); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

// Times `launch` and reports `bytes` moved per call.
template <typename Launch>
void time_loop(benchmark::State& state, double bytes, const Stream& stream, Launch launch) {
  for (auto _ : state) report_bandwidth(state, bytes, time_ms(launch, stream.s));
}

}  // namespace trident::bench
