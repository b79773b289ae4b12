// Whether a CUDA device is usable here. Tests skip with this reason; the app refuses
// `run.backend: cuda` with it.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <string>

#include "trident/cuda_backend.h"

namespace trident {

bool cuda_device_available(std::string* reason) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    if (reason) *reason = fmt::format("cudaGetDeviceCount: {}", cudaGetErrorString(rc));
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  if (count == 0) {
    if (reason) *reason = "cudaGetDeviceCount found 0 devices";
    return false;
  }
  return true;
}

}  // namespace trident
