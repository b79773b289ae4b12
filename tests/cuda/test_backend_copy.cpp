// CudaBackend::copy (Note [Copies to the host wait] in src/backend/cuda/cuda_backend.cpp):
// a copy into host memory, pinned included, has completed when copy() returns; a copy between
// the backend's own blocks does not wait for the device.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "gpu_test_util.h"
#include "trident/backend.h"

namespace trident {
namespace {

// 1 GiB: a device-to-device copy of it takes ~0.5–1 ms on an H100 (reads and writes at about
// 3 TB/s), ages longer than copy()'s return and one cudaStreamQuery on the host.
constexpr size_t kBig = size_t(1) << 30;

TEST(CudaBackendCopy, DeviceToDeviceDoesNotWaitButToHostDoes) {
  TRIDENT_REQUIRE_GPU();
  CudaBackendOptions o;
  auto be = make_cuda_backend(o);
  auto* a = static_cast<char*>(be->allocate(kBig));
  auto* b = static_cast<char*>(be->allocate(kBig));
  be->synchronize();
  auto stream = static_cast<cudaStream_t>(cuda_compute_stream(*be));
  be->copy(b, a, kBig);  // within the backend's own blocks: no wait
  EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady)
      << "a copy between the backend's blocks waited for the device";
  be->synchronize();

  // Into pinned host memory, queued behind another big copy: complete on return.
  const size_t n = 1 << 20;
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = float(i) * 0.5f;
  be->copy(a, values.data(), n * sizeof(float));
  float* pinned = nullptr;
  TRIDENT_CUDA(cudaMallocHost(&pinned, n * sizeof(float)));
  std::memset(pinned, 0, n * sizeof(float));
  be->copy(b, a, kBig);
  be->copy(pinned, a, n * sizeof(float));
  EXPECT_EQ(0, std::memcmp(pinned, values.data(), n * sizeof(float)))
      << "copy() into pinned memory returned before the copy completed";
  cudaFreeHost(pinned);
  be->release(a);
  be->release(b);
}

}  // namespace
}  // namespace trident
