// Shared by the GPU tests and kernel benchmarks: skip without a device, device buffers that
// start poisoned (NaN bytes), so an element a kernel failed to write fails the comparison.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "trident/cuda_backend.h"

// Skips the current test, with the reason, when no usable CUDA device is present.
#define TRIDENT_REQUIRE_GPU()                                                    \
  do {                                                                           \
    std::string trident_gpu_why_;                                                \
    if (!::trident::cuda_device_available(&trident_gpu_why_))                    \
      GTEST_SKIP() << "no CUDA device: " << trident_gpu_why_;                    \
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
  void poison() { TRIDENT_CUDA(cudaMemset(ptr_, 0xFF, bytes())); }
  void zero() { TRIDENT_CUDA(cudaMemset(ptr_, 0, bytes())); }
  void upload(const std::vector<T>& host) {
    TRIDENT_CHECK(host.size() == n_, "upload of {} into {}", host.size(), n_);
    TRIDENT_CUDA(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    TRIDENT_CUDA(cudaDeviceSynchronize());
    TRIDENT_CUDA(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

}  // namespace trident::testing
