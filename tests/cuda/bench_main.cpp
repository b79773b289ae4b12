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
    const double ms = time_ms([&] { TRIDENT_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, nullptr)); },
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
  std::string why;
  if (trident::cuda_device_available(&why))
    fmt::print("ceilings: device-to-device copy {:.0f} GB/s (read + write); cuBLASLt bf16 GEMM "
               "(fp32 accumulate, 8192³) {:.0f} TFLOP/s\n",
               trident::bench::measured_copy_bytes_per_s() / 1e9,
               trident::bench::measured_gemm_flops() / 1e12);
  else
    fmt::print("no CUDA device ({}): every benchmark skips\n", why);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
