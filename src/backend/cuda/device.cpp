// Whether a CUDA device is usable here. GPU tests skip only when the machine has no NVIDIA GPU
// or driver at all, and fail (naming the error) when one is there but CUDA does not work; the
// app refuses `run.backend: cuda` with the reason either way.
//
// Note [GPU or no GPU]
// A machine has no GPU (kAbsent: tests skip) only when it has no GPU device node (/dev/nvidia<n>,
// or /dev/dxg under WSL) and the driver library libcuda.so.1 either does not load or reports no
// device; or when CUDA_VISIBLE_DEVICES hides every device, named in the reason. Anything else
// short of a working device is kBroken (tests fail). cudaGetDeviceCount alone cannot tell: it
// answers cudaErrorInsufficientDriver both without a driver and with one older than the toolkit,
// and skipping on both would let a GPU machine with a broken driver pass every GPU test.
//
// kBroken covers a device node without a working driver (a container without the driver
// mounted, a driver older than the toolkit, a GPU in a bad state), and a driver that loads and
// fails with another error.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "trident/cuda_backend.h"

namespace trident {

namespace {

// /dev/nvidia<digits> (one per GPU) and /dev/dxg (WSL's GPU), sorted; not nvidiactl or
// nvidia-uvm, which the driver creates even when it finds no GPU.
std::vector<std::string> gpu_device_nodes() {
  std::vector<std::string> nodes;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev", ec)) {
    const std::string name = entry.path().filename().string();
    const bool numbered = name.size() > 6 && name.starts_with("nvidia") &&
                          std::all_of(name.begin() + 6, name.end(),
                                      [](unsigned char c) { return std::isdigit(c) != 0; });
    if (numbered || name == "dxg") nodes.push_back("/dev/" + name);
  }
  std::sort(nodes.begin(), nodes.end());
  return nodes;
}

CudaDeviceProbe probe_this_machine() {
  CudaDeviceProbe p;
  const cudaError_t rc = cudaGetDeviceCount(&p.devices);
  if (rc != cudaSuccess) {
    p.devices = 0;
    p.runtime_error = fmt::format("{} ({})", cudaGetErrorName(rc), cudaGetErrorString(rc));
    p.runtime_says_no_device = rc == cudaErrorNoDevice;
    cudaGetLastError();  // clear the error so that later calls start clean
  }
  if (void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    p.driver_loads = true;
    dlclose(driver);
  } else {
    const char* why = dlerror();
    p.driver_error = why ? why : "dlopen failed";
  }
  p.device_nodes = gpu_device_nodes();
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    p.visible_devices_set = true;
    p.visible_devices = visible;
  }
  return p;
}

}  // namespace

CudaDeviceStatus classify_cuda_device(const CudaDeviceProbe& p) {
  CudaDeviceStatus s;
  s.devices = p.devices;
  if (p.runtime_error.empty() && p.devices > 0) {
    s.state = CudaDeviceState::kUsable;
    return s;
  }
  const std::string runtime = p.runtime_error.empty()
                                  ? std::string("cudaGetDeviceCount found 0 devices")
                                  : "cudaGetDeviceCount: " + p.runtime_error;
  const bool none_found = p.runtime_error.empty() || p.runtime_says_no_device;
  const std::string driver = p.driver_loads
                                 ? std::string("libcuda.so.1 loads")
                                 : "libcuda.so.1 cannot be loaded (" + p.driver_error + ")";
  std::string nodes;
  for (const std::string& n : p.device_nodes) nodes += (nodes.empty() ? "" : ", ") + n;

  if (none_found && p.visible_devices_set) {
    s.state = CudaDeviceState::kAbsent;
    s.reason = fmt::format("CUDA_VISIBLE_DEVICES='{}' hides every device ({})", p.visible_devices,
                           runtime);
    return s;
  }
  if (p.device_nodes.empty() && (!p.driver_loads || none_found)) {
    s.state = CudaDeviceState::kAbsent;
    s.reason = fmt::format("no NVIDIA GPU or driver on this machine: {}, no /dev/nvidia<N> or "
                           "/dev/dxg device node ({})",
                           driver, runtime);
    return s;
  }
  s.state = CudaDeviceState::kBroken;
  s.reason = fmt::format("this machine has an NVIDIA GPU or driver, but CUDA does not work: {}; "
                         "{}; GPU device nodes: {}",
                         runtime, driver, nodes.empty() ? std::string("none") : nodes);
  if (p.driver_loads && !none_found)
    s.reason += " (is the driver older than the CUDA runtime, or the GPU in a bad state? see "
                "nvidia-smi)";
  return s;
}

const CudaDeviceStatus& cuda_device_status() {
  static const CudaDeviceStatus status = classify_cuda_device(probe_this_machine());
  return status;
}

bool cuda_device_available(std::string* reason) {
  const CudaDeviceStatus& s = cuda_device_status();
  if (s.state == CudaDeviceState::kUsable) return true;
  if (reason) *reason = s.reason;
  return false;
}

}  // namespace trident
