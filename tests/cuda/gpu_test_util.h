// Shared by the GPU tests and kernel benchmarks: skip only where there is no GPU, device
// buffers that start poisoned (NaN bytes), so an element a kernel failed to write fails the
// comparison.
//
// Note [GPU skips]
// A GPU test skips only when the machine has no NVIDIA GPU or driver at all (kAbsent,
// Note [GPU or no GPU]); a GPU that is there but does not work is a failure naming the error.
// Every skip for want of hardware goes through TRIDENT_GPU_SKIP, so one switch covers them all:
// with TRIDENT_REQUIRE_GPU=1 (tools/gpu-check.sh sets it) each is a failure naming the reason,
// since on the machine of the GPU check nothing may fail to run.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "trident/cuda_backend.h"

namespace trident::testing {

// TRIDENT_REQUIRE_GPU is set to anything but "" or "0".
inline bool gpu_required() {
  const char* v = std::getenv("TRIDENT_REQUIRE_GPU");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

}  // namespace trident::testing

// Skips the current test with `reason` (a std::string), or fails it when gpu_required().
#define TRIDENT_GPU_SKIP(reason)                                                \
  do {                                                                          \
    const std::string trident_skip_why_ = (reason);                             \
    if (::trident::testing::gpu_required())                                     \
      GTEST_FAIL() << "TRIDENT_REQUIRE_GPU is set, so this skip is a failure: " \
                   << trident_skip_why_;                                        \
    GTEST_SKIP() << trident_skip_why_;                                          \
  } while (0)

// Fails when the GPU is there but CUDA does not work; skips (TRIDENT_GPU_SKIP) when the
// machine has none.
#define TRIDENT_REQUIRE_GPU()                                      \
  do {                                                             \
    const auto& trident_gpu_ = ::trident::cuda_device_status();    \
    if (trident_gpu_.state == ::trident::CudaDeviceState::kBroken) \
      GTEST_FAIL() << trident_gpu_.reason;                         \
    if (trident_gpu_.state == ::trident::CudaDeviceState::kAbsent) \
      TRIDENT_GPU_SKIP(trident_gpu_.reason);                       \
  } while (0)

namespace trident::testing {

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    TRIDENT_CUDA(cudaMalloc(&ptr_, bytes() > 0 ? bytes() : 1));
    poison();
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() { return ptr_; }
  const T* get() const { return ptr_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }
  // 0xFF bytes: NaN for float, double and bf16, -1 for integers.
  // Each write below is complete on return: it runs on the legacy default stream, which does
  // not order with the non-blocking streams of the backend and NcclComm, and cudaMemset (like
  // cudaMemcpy from pageable memory) may return before the device has written.
  void poison() { fill(0xFF); }
  void zero() { fill(0); }
  void upload(const std::vector<T>& host) {
    TRIDENT_CHECK(host.size() == n_, "upload of {} into {}", host.size(), n_);
    TRIDENT_CUDA(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice));
    TRIDENT_CUDA(cudaDeviceSynchronize());
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    TRIDENT_CUDA(cudaDeviceSynchronize());
    TRIDENT_CUDA(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  void fill(int byte) {
    TRIDENT_CUDA(cudaMemset(ptr_, byte, bytes()));
    TRIDENT_CUDA(cudaDeviceSynchronize());
  }

  T* ptr_ = nullptr;
  size_t n_ = 0;
};

}  // namespace trident::testing
