// Fused softmax + cross-entropy over the first V of Vp columns, in place (CPU twin:
// src/backend/crossentropy.cpp). One block per row.
//
// Forward reads the row twice: pass 1 keeps a running (max, Σ exp(x - max)) per thread (online
// softmax, rescaling the sum when the max grows), the block combines them in a fixed order;
// pass 2 writes exp(x - max) / Σ. The CPU twin checks targets on the host and throws; here a
// target outside [0, V) cannot be reported without a sync, so it gives a NaN loss (forward) or a
// NaN row (backward), which the loss check then catches.
#include <cstdint>

#include "crossentropy.h"
#include "reduce.cuh"

namespace trident::cuda {
namespace {

constexpr int kBlock = 512;
constexpr int kUnroll = 4;  // independent loads in flight per thread

__device__ __forceinline__ void online_update(float x, float& m, float& s) {
  if (x > m) {  // first element: m = -inf, s = 0, and 0 · exp(-inf) = 0
    s = s * __expf(m - x) + 1.0f;
    m = x;
  } else if (x != -__int_as_float(0x7f800000)) {  // a -inf logit adds 0 (the CPU's exp_fast
    s += __expf(x - m);                           // too), not exp(-inf - -inf) = NaN
  }
}

__global__ void crossentropy_fwd_kernel(float* __restrict__ losses, float* __restrict__ logits,
                                        const int32_t* __restrict__ targets, int V, int Vp) {
  const int n = blockIdx.x;
  float* row = logits + size_t(n) * Vp;
  const int target = targets[n];
  const bool valid = target >= 0 && target < V;
  // Read before pass 2 overwrites the row (the barriers in block_max separate the two).
  const float target_logit = (threadIdx.x == 0 && valid) ? row[target] : 0.0f;

  const float kNegInf = -__int_as_float(0x7f800000);
  float m = kNegInf, s = 0.0f;
  const int step = blockDim.x;
  int v = threadIdx.x;
  for (; v + (kUnroll - 1) * step < V; v += kUnroll * step) {
    float x[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) x[k] = row[v + k * step];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) online_update(x[k], m, s);
  }
  for (; v < V; v += step) online_update(row[v], m, s);

  const float row_max = block_max(m);
  // A thread that saw no column has m = -inf and contributes nothing (exp(-inf - -inf) is NaN).
  const float scaled = m == kNegInf ? 0.0f : s * __expf(m - row_max);
  const double sum = block_sum<double>(double(scaled));
  const float inv_sum = float(1.0 / sum);
  if (threadIdx.x == 0) {
    // -log p_target from the logits, as in the CPU twin: finite even when p_target underflows.
    losses[n] =
        valid ? float(log(sum) - double(target_logit - row_max)) : __int_as_float(0x7fc00000);
  }

  for (v = threadIdx.x; v < Vp; v += step)
    row[v] = v < V ? __expf(row[v] - row_max) * inv_sum : 0.0f;
}

__global__ void crossentropy_bwd_kernel(float* __restrict__ probs,
                                        const int32_t* __restrict__ targets, float dloss, int V,
                                        int Vp) {
  const int n = blockIdx.x;
  float* row = probs + size_t(n) * Vp;
  const int target = targets[n];
  const bool valid = target >= 0 && target < V;
  const float kNaN = __int_as_float(0x7fc00000);
  for (int v = threadIdx.x; v < Vp; v += blockDim.x) {
    float g = 0.0f;
    if (v < V) {
      const float p = row[v];
      g = !valid ? kNaN : v == target ? dloss * (p - 1.0f) : dloss * p;
    }
    row[v] = g;
  }
}

// Forward and backward at once on bf16 logits (Note [bf16 activations]): pass 1 as the forward
// kernel's, on the widened row; pass 2 writes bf16(dloss · (p - onehot)) from the fp32 p, which
// is never stored. The row is read twice and written once.
__global__ void crossentropy_fused_bf16_kernel(float* __restrict__ losses,
                                               bf16* __restrict__ logits,
                                               const int32_t* __restrict__ targets, float dloss,
                                               int V, int Vp) {
  const int n = blockIdx.x;
  bf16* row = logits + size_t(n) * Vp;
  const int target = targets[n];
  const bool valid = target >= 0 && target < V;
  // Read before pass 2 overwrites the row (the barriers in block_max separate the two).
  const float target_logit = (threadIdx.x == 0 && valid) ? __bfloat162float(row[target]) : 0.0f;

  const float kNegInf = -__int_as_float(0x7f800000);
  float m = kNegInf, s = 0.0f;
  const int step = blockDim.x;
  int v = threadIdx.x;
  for (; v + (kUnroll - 1) * step < V; v += kUnroll * step) {
    float x[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) x[k] = __bfloat162float(row[v + k * step]);
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) online_update(x[k], m, s);
  }
  for (; v < V; v += step) online_update(__bfloat162float(row[v]), m, s);

  const float row_max = block_max(m);
  const float scaled = m == kNegInf ? 0.0f : s * __expf(m - row_max);
  const double sum = block_sum<double>(double(scaled));
  const float inv_sum = float(1.0 / sum);
  const float kNaN = __int_as_float(0x7fc00000);
  if (threadIdx.x == 0) losses[n] = valid ? float(log(sum) - double(target_logit - row_max)) : kNaN;

  // The forward's p, then the backward's gradient of it, in the same fp32 operations as the two
  // fp32 kernels, rounded once.
  for (v = threadIdx.x; v < Vp; v += step) {
    float g = 0.0f;
    if (v < V) {
      const float p = __expf(__bfloat162float(row[v]) - row_max) * inv_sum;
      g = !valid ? kNaN : v == target ? dloss * (p - 1.0f) : dloss * p;
    }
    row[v] = __float2bfloat16(g);
  }
}

}  // namespace

void crossentropy_forward_cuda(float* losses, float* logits_to_probs, const int32_t* targets, int N,
                               int V, int Vp, cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && V > 0 && V <= Vp, "crossentropy_forward_cuda: N={} V={} Vp={}", N, V, Vp);
  if (N == 0) return;
  TRIDENT_CHECK(losses && logits_to_probs && targets, "{}: null pointer", __func__);
  crossentropy_fwd_kernel<<<unsigned(N), kBlock, 0, stream>>>(losses, logits_to_probs, targets, V,
                                                              Vp);
  TRIDENT_CUDA_LAUNCHED();
}

void crossentropy_backward_cuda(float* probs_to_dlogits, const int32_t* targets, float dloss, int N,
                                int V, int Vp, cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && V > 0 && V <= Vp, "crossentropy_backward_cuda: N={} V={} Vp={}", N, V,
                Vp);
  if (N == 0) return;
  TRIDENT_CHECK(probs_to_dlogits && targets, "{}: null pointer", __func__);
  crossentropy_bwd_kernel<<<unsigned(N), kBlock, 0, stream>>>(probs_to_dlogits, targets, dloss, V,
                                                              Vp);
  TRIDENT_CUDA_LAUNCHED();
}

void crossentropy_fused_bf16_cuda(float* losses, bf16* logits_to_dlogits, const int32_t* targets,
                                  float dloss, int N, int V, int Vp, cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && V > 0 && V <= Vp, "crossentropy_fused_bf16_cuda: N={} V={} Vp={}", N, V,
                Vp);
  if (N == 0) return;
  TRIDENT_CHECK(losses && logits_to_dlogits && targets, "{}: null pointer", __func__);
  crossentropy_fused_bf16_kernel<<<unsigned(N), kBlock, 0, stream>>>(losses, logits_to_dlogits,
                                                                     targets, dloss, V, Vp);
  TRIDENT_CUDA_LAUNCHED();
}

}  // namespace trident::cuda
