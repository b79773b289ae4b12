// bench_kernels: every kernel's microbenchmark (tests/cuda/bench_*.cpp). Prints the ceilings
// first, then Google Benchmark's table. Run: build/tests/bench_kernels [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include "bench_util.h"

namespace trident::bench {

double measured_copy_bytes_per_s() {
  static const double rate = [] {
    const size_t bytes = size_t(1) << 30;
    void *a = nullptr, *b = nullptr;
    TRIDENT_CUDA(cudaMalloc(&a, bytes));
    TRIDENT_CUDA(cudaMalloc(&b, bytes));
    const double ms = time_ms(
        [&] { TRIDENT_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, nullptr)); },
        nullptr, 10, 2);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * double(bytes) / (ms * 1e-3);
  }();
  return rate;
}

double measured_gemm_flops() {
  static const double rate = [] { return make_cuda_backend()->measure_gemm_peak_flops(); }();
  return rate;
}

}  // namespace trident::bench

int main(int argc, char** argv) {
  // Note [GPU skips] (gpu_test_util.h): without a GPU every benchmark skips, unless
  // TRIDENT_REQUIRE_GPU=1 says this machine must have one; a GPU that does not work is an error.
  const trident::CudaDeviceStatus& gpu = trident::cuda_device_status();
  const bool must_have_gpu = trident::testing::gpu_required();
  if (gpu.state == trident::CudaDeviceState::kBroken ||
      (gpu.state == trident::CudaDeviceState::kAbsent && must_have_gpu)) {
    fmt::print(stderr, "bench_kernels: no usable CUDA device{}: {}\n",
               must_have_gpu ? " (TRIDENT_REQUIRE_GPU is set)" : "", gpu.reason);
    return 1;
  }
  if (gpu.state == trident::CudaDeviceState::kUsable)
    fmt::print("ceilings: device-to-device copy {:.0f} GB/s (read + write); cuBLASLt bf16 GEMM "
               "(fp32 accumulate, 8192³) {:.0f} TFLOP/s\n",
               trident::bench::measured_copy_bytes_per_s() / 1e9,
               trident::bench::measured_gemm_flops() / 1e12);
  else fmt::print("no CUDA device ({}): every benchmark skips\n", gpu.reason);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
