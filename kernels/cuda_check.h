// Checks for every CUDA runtime, cuBLASLt, cuDNN and NCCL call: a failing call becomes a
// trident::Error whose message names the call, the library's error name, the file, the line and
// the MPI rank (internal_error adds file, line and rank).
// Host-only header: included by .cu and .cpp files alike.
#pragma once

// fmt 9 turns its constexpr off under nvcc (FMT_USE_CONSTEXPR 0), yet still declares some
// functions constexpr and checks format strings in a consteval constructor; both then call
// non-constexpr functions and fail to compile ("call to consteval function ... did not produce
// a valid constant expression"). nvcc 12+ handles fmt's relaxed constexpr, so turn it back on.
// Must precede the first fmt include of a .cu file.
#if defined(__CUDACC__) && !defined(FMT_USE_CONSTEXPR)
#define FMT_USE_CONSTEXPR 1
#endif

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include "trident/check.h"

namespace trident::cuda {
using bf16 = __nv_bfloat16;
}  // namespace trident::cuda

#define TRIDENT_CUDA(call)                                                               \
  do {                                                                                   \
    cudaError_t trident_cuda_rc_ = (call);                                               \
    if (trident_cuda_rc_ != cudaSuccess)                                                 \
      ::trident::internal_error(                                                         \
          __FILE__, __LINE__,                                                            \
          ::fmt::format("{} failed: {} ({})", #call, cudaGetErrorName(trident_cuda_rc_), \
                        cudaGetErrorString(trident_cuda_rc_)));                          \
  } while (0)

// After a kernel launch: a bad launch configuration shows up here, not at the next sync.
#define TRIDENT_CUDA_LAUNCHED() TRIDENT_CUDA(cudaGetLastError())

#define TRIDENT_CUBLAS(call)                                                             \
  do {                                                                                   \
    cublasStatus_t trident_cublas_rc_ = (call);                                          \
    if (trident_cublas_rc_ != CUBLAS_STATUS_SUCCESS)                                     \
      ::trident::internal_error(                                                         \
          __FILE__, __LINE__,                                                            \
          ::fmt::format("{} failed: cublas status {}", #call, int(trident_cublas_rc_))); \
  } while (0)

#define TRIDENT_CUDNN(call)                                                               \
  do {                                                                                    \
    cudnnStatus_t trident_cudnn_rc_ = (call);                                             \
    if (trident_cudnn_rc_ != CUDNN_STATUS_SUCCESS)                                        \
      ::trident::internal_error(                                                          \
          __FILE__, __LINE__,                                                             \
          ::fmt::format("{} failed: {}", #call, cudnnGetErrorString(trident_cudnn_rc_))); \
  } while (0)

#define TRIDENT_NCCL(call)                                                              \
  do {                                                                                  \
    ncclResult_t trident_nccl_rc_ = (call);                                             \
    if (trident_nccl_rc_ != ncclSuccess && trident_nccl_rc_ != ncclInProgress)          \
      ::trident::internal_error(                                                        \
          __FILE__, __LINE__,                                                           \
          ::fmt::format("{} failed: {}", #call, ncclGetErrorString(trident_nccl_rc_))); \
  } while (0)
