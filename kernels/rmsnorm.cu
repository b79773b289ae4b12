// RMSNorm over the last dimension (CPU twin: src/backend/rmsnorm.cpp), laid out as layernorm.cu:
// forward and backward's dinp one warp per row, each lane on its columns c = lane + 32k; dw by
// per-row-chunk partial column sums in `scratch`, then a fixed-order sum of the chunks
// (Note [Deterministic GPU reductions] in kernels/reduce.cuh). The row is read twice from
// global memory rather than cached in shared memory: one row is at most a few tens of KB, so
// the second read hits L1/L2, and no shared-memory opt-in is needed for any C.
#include "reduce.cuh"
#include "rmsnorm.h"

namespace trident::cuda {
namespace {

constexpr int kRowsPerBlock = 4;  // warps per block, one row each

__global__ void rmsnorm_fwd_kernel(float* __restrict__ out, float* __restrict__ rstd,
                                   const float* __restrict__ inp, const float* __restrict__ w,
                                   int N, int C, float eps) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int n = blockIdx.x * kRowsPerBlock + warp;
  if (n >= N) return;  // warp-uniform
  const float* x = inp + size_t(n) * C;
  float sq = 0.0f;
  for (int c = lane; c < C; c += kWarp) sq += x[c] * x[c];
  const float rs = rsqrtf(warp_sum(sq) / float(C) + eps);
  float* o = out + size_t(n) * C;
  for (int c = lane; c < C; c += kWarp) o[c] = x[c] * rs * w[c];
  if (lane == 0) rstd[n] = rs;
}

// dinp = rstd · (g − x̂ · mean(g·x̂)), g = dout·w, x̂ = x·rstd.
__global__ void rmsnorm_bwd_dinp_kernel(float* __restrict__ dinp, const float* __restrict__ dout,
                                        const float* __restrict__ inp, const float* __restrict__ w,
                                        const float* __restrict__ rstd, int N, int C) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int n = blockIdx.x * kRowsPerBlock + warp;
  if (n >= N) return;
  const float* x = inp + size_t(n) * C;
  const float* d = dout + size_t(n) * C;
  const float rs = rstd[n];
  float gx_sum = 0.0f;
  for (int c = lane; c < C; c += kWarp) gx_sum += d[c] * w[c] * (x[c] * rs);
  const float gx_mean = warp_sum(gx_sum) / float(C);
  float* di = dinp + size_t(n) * C;
  for (int c = lane; c < C; c += kWarp) di[c] = rs * (d[c] * w[c] - (x[c] * rs) * gx_mean);
}

// Partial column sums Σ dout·x̂ over one chunk of rows (blockIdx.y), rows in order.
__global__ void rmsnorm_bwd_partial_kernel(float* __restrict__ partial_dw,
                                           const float* __restrict__ dout,
                                           const float* __restrict__ inp,
                                           const float* __restrict__ rstd, int N, int C,
                                           int rows_per_chunk) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int chunk = blockIdx.y;
  const int n0 = chunk * rows_per_chunk, n1 = min(N, n0 + rows_per_chunk);
  float dw = 0.0f;
  for (int n = n0; n < n1; ++n) dw += dout[size_t(n) * C + c] * (inp[size_t(n) * C + c] * rstd[n]);
  partial_dw[size_t(chunk) * C + c] = dw;
}

// dw[c] += Σ_chunk partial_dw[chunk, c] in chunk order.
__global__ void rmsnorm_bwd_finish_kernel(float* __restrict__ dw,
                                          const float* __restrict__ partial_dw, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sum = 0.0f;
  for (int k = 0; k < chunks; ++k) sum += partial_dw[size_t(k) * C + c];
  dw[c] += sum;
}

}  // namespace

void rmsnorm_forward_cuda(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                          float eps, cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && C > 0, "rmsnorm_forward_cuda: N={} C={}", N, C);
  if (N == 0) return;
  TRIDENT_CHECK(out && rstd && inp && w, "{}: null pointer", __func__);
  rmsnorm_fwd_kernel<<<ceil_div(size_t(N), kRowsPerBlock), kRowsPerBlock * kWarp, 0, stream>>>(
      out, rstd, inp, w, N, C, eps);
  TRIDENT_CUDA_LAUNCHED();
}

size_t rmsnorm_backward_scratch_floats(int N, int C) {
  return size_t(column_sum_row_chunks(N)) * size_t(C > 0 ? C : 0);
}

void rmsnorm_backward_cuda(float* dinp, float* dw, float* scratch, const float* dout,
                           const float* inp, const float* w, const float* rstd, int N, int C,
                           cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && C > 0, "rmsnorm_backward_cuda: N={} C={}", N, C);
  if (N == 0) return;
  TRIDENT_CHECK(dout && inp && rstd, "{}: null input", __func__);
  if (dinp) {
    TRIDENT_CHECK(w, "{}: null w", __func__);
    rmsnorm_bwd_dinp_kernel<<<ceil_div(size_t(N), kRowsPerBlock), kRowsPerBlock * kWarp, 0,
                              stream>>>(dinp, dout, inp, w, rstd, N, C);
    TRIDENT_CUDA_LAUNCHED();
  }
  if (!dw) return;
  TRIDENT_CHECK(scratch, "{}: null scratch", __func__);
  const int chunks = column_sum_row_chunks(N);
  const int rows_per_chunk = int(ceil_div(size_t(N), size_t(chunks)));
  constexpr int kBlock = 256;
  const dim3 grid(ceil_div(size_t(C), kBlock), unsigned(chunks));
  rmsnorm_bwd_partial_kernel<<<grid, kBlock, 0, stream>>>(scratch, dout, inp, rstd, N, C,
                                                          rows_per_chunk);
  TRIDENT_CUDA_LAUNCHED();
  rmsnorm_bwd_finish_kernel<<<ceil_div(size_t(C), kBlock), kBlock, 0, stream>>>(dw, scratch, chunks,
                                                                                C);
  TRIDENT_CUDA_LAUNCHED();
}

}  // namespace trident::cuda
