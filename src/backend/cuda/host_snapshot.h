// The CUDA backend's copies into pinned host memory for asynchronous checkpoints
// (Note [Snapshots to the host] in trident/backend.h; src/backend/cuda/cuda_backend.cpp is
// the one user): their own stream and the two events that order it with the compute stream.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace trident::cuda {

// Note [Pinned snapshot copies]
// Pinned memory, so a copy runs at the link's speed and asynchronously. The copy stream waits
// for the compute stream's ops so far, and the compute stream's later ops wait for the copy
// (an optimizer update must not change what is read); the host waits only in finish(). The
// stream and events are made by the first copy: a run that never saves asynchronously has none.
class HostSnapshotCopier {
 public:
  explicit HostSnapshotCopier(int device) : device_(device) {}
  ~HostSnapshotCopier();
  HostSnapshotCopier(const HostSnapshotCopier&) = delete;
  HostSnapshotCopier& operator=(const HostSnapshotCopier&) = delete;

  static void* allocate(size_t bytes);  // pinned, every page touched
  static void release(void* p) noexcept;
  // Device → pinned host, ordered after `compute`'s ops so far and before its later ones.
  void start(void* dst, const void* src, size_t bytes, cudaStream_t compute);
  // Waits for the copies started so far (on any thread: it sets the device first).
  void finish();

 private:
  int device_;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t before_copy_ = nullptr, copied_ = nullptr;
};

}  // namespace trident::cuda
