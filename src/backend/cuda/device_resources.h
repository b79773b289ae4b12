// The CUDA backend's device resources (src/backend/cuda/cuda_backend.cpp is their one user):
// checked allocation, grow-only scratch, a pool of timing events and the spans timed with them.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "cuda_check.h"
#include "trident/backend.h"
#include "trident/check.h"

namespace trident::cuda {

// A cudaMalloc's result. Out of memory is the run's size, not a fault: said as bad input (exit
// 2) with what was asked for and what is free (`on`: the device's name, or empty); any other
// failure is an error.
inline void check_malloc(cudaError_t rc, size_t bytes, std::string_view what, std::string_view on) {
  if (rc == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    input_error("out of GPU memory: {:.2f} GiB {} asked for, {:.2f} GiB free of {:.2f} GiB{}{} "
                "(lower train.micro_batch, or set train.recompute)",
                double(bytes) / (1u << 30), what, double(free_bytes) / (1u << 30),
                double(total) / (1u << 30), on.empty() ? "" : " on ", on);
  }
  TRIDENT_CUDA(rc);
}

// Grow-only device scratch. Growing frees the old buffer; cudaFree waits for the device, so
// kernels still queued on it finish first. The memory plan (Trainer) counts the model's
// buffers, not these, so a run near the memory's end can fail here first: with the same
// message as an allocation of the model's (CudaBackend::allocate), not an internal error.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { cudaFree(p_); }
  void* get(size_t bytes) {
    if (bytes > bytes_) {
      TRIDENT_CUDA(cudaFree(p_));
      p_ = nullptr;
      bytes_ = 0;  // stays empty if the allocation below fails
      const cudaError_t rc = cudaMalloc(&p_, bytes);
      if (rc != cudaSuccess) p_ = nullptr;
      check_malloc(rc, bytes, "of scratch (the ops' staging and reductions)", {});
      bytes_ = bytes;
    }
    return p_;
  }
  template <typename T>
  T* of(size_t n) {
    return static_cast<T*>(get(std::max<size_t>(n, 1) * sizeof(T)));
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// CUDA events, reused: creating one per timed span would cost more than the span.
class EventPool {
 public:
  ~EventPool() {
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  cudaEvent_t get() {
    if (free_.empty()) {
      cudaEvent_t e;
      TRIDENT_CUDA(cudaEventCreate(&e));
      return e;
    }
    cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }
  void put(cudaEvent_t e) { free_.push_back(e); }

 private:
  std::vector<cudaEvent_t> free_;
};

// Device time between a push and its pop (CUDA events on the stream), summed per kind when
// taken (Backend::set_op_timing). Spans may nest: the open ones are on a stack. Used for the
// ops and, separately, for the model's layer phases.
class SpanTimer {
 public:
  explicit SpanTimer(EventPool& events) : events_(events) {}
  ~SpanTimer() {
    for (const Span& s : spans_) events_.put(s.start), events_.put(s.stop);
  }
  void push(std::string kind, cudaStream_t stream) {
    spans_.push_back({std::move(kind), events_.get(), events_.get()});
    open_.push_back(spans_.size() - 1);
    TRIDENT_CUDA(cudaEventRecord(spans_.back().start, stream));
  }
  // Called from destructors (Op, Phase): never throws. A failure (a CUDA error left by an
  // earlier fault) is kept and thrown by take(), which the caller reaches outside unwinding.
  void pop(cudaStream_t stream) noexcept {
    if (open_.empty()) return;  // pushed before timing was turned on
    const cudaError_t rc = cudaEventRecord(spans_[open_.back()].stop, stream);
    if (rc != cudaSuccess && pop_error_ == cudaSuccess) pop_error_ = rc;
    open_.pop_back();
  }
  std::vector<Backend::DeviceTime> take(cudaStream_t stream) {
    if (pop_error_ != cudaSuccess) {
      const cudaError_t rc = pop_error_;
      pop_error_ = cudaSuccess;
      TRIDENT_CUDA(rc);
    }
    TRIDENT_CUDA(cudaStreamSynchronize(stream));
    std::map<std::string, Backend::DeviceTime> sums;
    for (const Span& s : spans_) {
      float ms = 0;
      TRIDENT_CUDA(cudaEventElapsedTime(&ms, s.start, s.stop));
      Backend::DeviceTime& t = sums[s.kind];
      t.kind = s.kind;
      t.ms += ms;
      t.count += 1;
      events_.put(s.start);
      events_.put(s.stop);
    }
    spans_.clear();
    open_.clear();
    std::vector<Backend::DeviceTime> out;
    for (auto& [kind, t] : sums) out.push_back(t);
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.ms > b.ms; });
    return out;
  }

 private:
  struct Span {
    std::string kind;
    cudaEvent_t start, stop;
  };
  EventPool& events_;
  std::vector<Span> spans_;
  std::vector<size_t> open_;
  cudaError_t pop_error_ = cudaSuccess;
};

}  // namespace trident::cuda
