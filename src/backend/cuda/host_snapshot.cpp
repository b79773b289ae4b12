// Note [Pinned snapshot copies] (host_snapshot.h).
#include "backend/cuda/host_snapshot.h"

#include <algorithm>
#include <cstring>

#include "cuda_check.h"
#include "trident/check.h"

namespace trident::cuda {

HostSnapshotCopier::~HostSnapshotCopier() {
  if (!copy_stream_) return;
  cudaStreamSynchronize(copy_stream_);
  cudaEventDestroy(before_copy_);
  cudaEventDestroy(copied_);
  cudaStreamDestroy(copy_stream_);
}

void* HostSnapshotCopier::allocate(size_t bytes) {
  void* p = nullptr;
  TRIDENT_CUDA(cudaHostAlloc(&p, std::max<size_t>(bytes, 256), cudaHostAllocDefault));
  std::memset(p, 0, bytes);
  return p;
}

void HostSnapshotCopier::release(void* p) noexcept { cudaFreeHost(p); }

void HostSnapshotCopier::start(void* dst, const void* src, size_t bytes, cudaStream_t compute) {
  if (!copy_stream_) {
    TRIDENT_CUDA(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    TRIDENT_CUDA(cudaEventCreateWithFlags(&before_copy_, cudaEventDisableTiming));
    TRIDENT_CUDA(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
  }
  TRIDENT_CUDA(cudaEventRecord(before_copy_, compute));
  TRIDENT_CUDA(cudaStreamWaitEvent(copy_stream_, before_copy_, 0));
  TRIDENT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, copy_stream_));
  TRIDENT_CUDA(cudaEventRecord(copied_, copy_stream_));
  TRIDENT_CUDA(cudaStreamWaitEvent(compute, copied_, 0));
}

void HostSnapshotCopier::finish() {
  if (!copy_stream_) return;
  TRIDENT_CUDA(cudaSetDevice(device_));  // the writer thread's current device
  TRIDENT_CUDA(cudaEventSynchronize(copied_));
}

}  // namespace trident::cuda
