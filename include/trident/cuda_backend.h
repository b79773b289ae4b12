// The CUDA backend (built when TRIDENT_HAVE_CUDA is defined; library trident_cuda).
//
// It implements the same Backend interface as the CPU backend, on device memory it allocates
// itself (Backend::allocate): cuBLASLt GEMMs with bf16 inputs and fp32 accumulation, cuDNN's
// fused attention (or the flash-style kernel in kernels/ where cuDNN has no plan), and the
// hand-written kernels in kernels/ for everything else. Activations and master weights stay
// fp32 in memory; see Note [Mixed precision] in src/backend/cuda/cuda_backend.cpp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "trident/backend.h"

namespace trident {

// Whether CUDA works here (Note [GPU or no GPU] in src/backend/cuda/device.cpp): kUsable;
// kAbsent, the machine has no NVIDIA GPU or driver at all (GPU tests skip); kBroken, it has
// one but CUDA fails on it (GPU tests fail). `reason` names what was found when not usable.
enum class CudaDeviceState { kUsable, kAbsent, kBroken };
struct CudaDeviceStatus {
  CudaDeviceState state = CudaDeviceState::kAbsent;
  int devices = 0;
  std::string reason;
};
// Probed once per process (cudaGetDeviceCount, dlopen of libcuda.so.1, /dev).
const CudaDeviceStatus& cuda_device_status();

// What the probe saw, and the decision taken from it (a pure function, tested without a GPU).
struct CudaDeviceProbe {
  int devices = 0;                        // from cudaGetDeviceCount
  std::string runtime_error;              // its error name and text; empty on success
  bool runtime_says_no_device = false;    // the error is cudaErrorNoDevice
  bool driver_loads = false;              // dlopen("libcuda.so.1") succeeded
  std::string driver_error;               // dlerror() when it did not
  std::vector<std::string> device_nodes;  // /dev/nvidia<N> and /dev/dxg
  bool visible_devices_set = false;       // CUDA_VISIBLE_DEVICES is in the environment
  std::string visible_devices;
};
CudaDeviceStatus classify_cuda_device(const CudaDeviceProbe& probe);

// True when cuda_device_status() is kUsable; else `reason` (if given) says why not.
bool cuda_device_available(std::string* reason = nullptr);

struct CudaBackendOptions {
  int device = 0;
  // "auto": cuDNN fused attention where it has a plan, else the flash kernel; "cudnn" or
  // "flash" force one (cudnn fails if it has no plan).
  std::string attention = "auto";
};
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options = {});

// The CUDA stream every op of a CUDA backend runs on (a cudaStream_t), for communicators that
// must order their work after it (NcclComm). Null for any other backend.
void* cuda_compute_stream(Backend& backend);

}  // namespace trident
