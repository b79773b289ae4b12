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

#include "trident/backend.h"

namespace trident {

// True when the CUDA runtime finds a device (with a working driver); else `reason` (if given)
// says why not, e.g. "cudaGetDeviceCount: no CUDA-capable device is detected".
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
