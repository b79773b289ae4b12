// RMSNorm over the last dimension (CPU twin: src/backend/rmsnorm.cpp), laid out as layernorm.cu:
// forward and backward's dinp one warp per row, each lane on its columns c = lane + 32k; dw by
// per-row-chunk partial column sums in `scratch`, then a fixed-order sum of the chunks
// (Note [Deterministic GPU reductions] in kernels/reduce.cuh). The row is read twice from
// global memory rather than cached in shared memory: one row is at most a few tens of KB, so
// the second read hits L1/L2, and no shared-memory opt-in is needed for any C.
// The bf16 variants (Note [bf16 activations]) are the same kernels with a bf16 output (forward)
// or a bf16 dout read and widened (backward, which then adds into the fp32 residual gradient and
// rounds it once), all arithmetic fp32.
#include "reduce.cuh"
#include "rmsnorm.h"

namespace trident::cuda {
namespace {

constexpr int kRowsPerBlock = 4;  // warps per block, one row each

template <typename Out>
__global__ void rmsnorm_fwd_kernel(Out* __restrict__ out, float* __restrict__ rstd,
                                   const float* __restrict__ inp, const float* __restrict__ w,
                                   int N, int C, float eps) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int n = blockIdx.x * kRowsPerBlock + warp;
  if (n >= N) return;  // warp-uniform
  const float* x = inp + size_t(n) * C;
  float sq = 0.0f;
  for (int c = lane; c < C; c += kWarp) sq += x[c] * x[c];
  const float rs = rsqrtf(warp_sum(sq) / float(C) + eps);
  Out* o = out + size_t(n) * C;
  for (int c = lane; c < C; c += kWarp) store(o + c, x[c] * rs * w[c]);
  if (lane == 0) rstd[n] = rs;
}

// g_in = rstd · (g − x̂ · mean(g·x̂)), g = dout·w, x̂ = x·rstd. dinp = g_in, or with kAdd
// dinp += g_in and then dinp16 = bf16(dinp) when non-null.
template <typename Dout, bool kAdd>
__global__ void rmsnorm_bwd_dinp_kernel(float* __restrict__ dinp, bf16* __restrict__ dinp16,
                                        const Dout* __restrict__ dout,
                                        const float* __restrict__ inp, const float* __restrict__ w,
                                        const float* __restrict__ rstd, int N, int C) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int n = blockIdx.x * kRowsPerBlock + warp;
  if (n >= N) return;
  const float* x = inp + size_t(n) * C;
  const Dout* d = dout + size_t(n) * C;
  const float rs = rstd[n];
  float gx_sum = 0.0f;
  for (int c = lane; c < C; c += kWarp) gx_sum += load(d + c) * w[c] * (x[c] * rs);
  const float gx_mean = warp_sum(gx_sum) / float(C);
  float* di = dinp + size_t(n) * C;
  bf16* di16 = dinp16 ? dinp16 + size_t(n) * C : nullptr;
  for (int c = lane; c < C; c += kWarp) {
    const float g = rs * (load(d + c) * w[c] - (x[c] * rs) * gx_mean);
    if constexpr (kAdd) {
      const float v = di[c] + g;
      di[c] = v;
      if (di16) store(di16 + c, v);
    } else {
      di[c] = g;
    }
  }
}

// Partial column sums Σ dout·x̂ over one chunk of rows (blockIdx.y), rows in order.
template <typename Dout>
__global__ void rmsnorm_bwd_partial_kernel(float* __restrict__ partial_dw,
                                           const Dout* __restrict__ dout,
                                           const float* __restrict__ inp,
                                           const float* __restrict__ rstd, int N, int C,
                                           int rows_per_chunk) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int chunk = blockIdx.y;
  const int n0 = chunk * rows_per_chunk, n1 = min(N, n0 + rows_per_chunk);
  float dw = 0.0f;
  for (int n = n0; n < n1; ++n)
    dw += load(dout + size_t(n) * C + c) * (inp[size_t(n) * C + c] * rstd[n]);
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

template <typename Out>
void rmsnorm_forward(const char* name, Out* out, float* rstd, const float* inp, const float* w,
                     int N, int C, float eps, cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && C > 0, "{}: N={} C={}", name, N, C);
  if (N == 0) return;
  TRIDENT_CHECK(out && rstd && inp && w, "{}: null pointer", name);
  rmsnorm_fwd_kernel<Out><<<ceil_div(size_t(N), kRowsPerBlock), kRowsPerBlock * kWarp, 0, stream>>>(
      out, rstd, inp, w, N, C, eps);
  TRIDENT_CUDA_LAUNCHED();
}

// dinp (assign, or add with dinp16 when kAdd; skipped when null), then dw (accumulate).
template <typename Dout, bool kAdd>
void rmsnorm_backward(const char* name, float* dinp, bf16* dinp16, float* dw, float* scratch,
                      const Dout* dout, const float* inp, const float* w, const float* rstd, int N,
                      int C, cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && C > 0, "{}: N={} C={}", name, N, C);
  if (N == 0) return;
  TRIDENT_CHECK(dout && inp && rstd, "{}: null input", name);
  if (dinp) {
    TRIDENT_CHECK(w, "{}: null w", name);
    rmsnorm_bwd_dinp_kernel<Dout, kAdd>
        <<<ceil_div(size_t(N), kRowsPerBlock), kRowsPerBlock * kWarp, 0, stream>>>(
            dinp, dinp16, dout, inp, w, rstd, N, C);
    TRIDENT_CUDA_LAUNCHED();
  }
  if (!dw) return;
  TRIDENT_CHECK(scratch, "{}: null scratch", name);
  const int chunks = column_sum_row_chunks(N);
  const int rows_per_chunk = int(ceil_div(size_t(N), size_t(chunks)));
  constexpr int kBlock = 256;
  const dim3 grid(ceil_div(size_t(C), kBlock), unsigned(chunks));
  rmsnorm_bwd_partial_kernel<Dout>
      <<<grid, kBlock, 0, stream>>>(scratch, dout, inp, rstd, N, C, rows_per_chunk);
  TRIDENT_CUDA_LAUNCHED();
  rmsnorm_bwd_finish_kernel<<<ceil_div(size_t(C), kBlock), kBlock, 0, stream>>>(dw, scratch, chunks,
                                                                                C);
  TRIDENT_CUDA_LAUNCHED();
}

}  // namespace

void rmsnorm_forward_cuda(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                          float eps, cudaStream_t stream) {
  rmsnorm_forward(__func__, out, rstd, inp, w, N, C, eps, stream);
}

void rmsnorm_forward_bf16_cuda(bf16* out, float* rstd, const float* inp, const float* w, int N,
                               int C, float eps, cudaStream_t stream) {
  rmsnorm_forward(__func__, out, rstd, inp, w, N, C, eps, stream);
}

size_t rmsnorm_backward_scratch_floats(int N, int C) {
  return size_t(column_sum_row_chunks(N)) * size_t(C > 0 ? C : 0);
}

void rmsnorm_backward_cuda(float* dinp, float* dw, float* scratch, const float* dout,
                           const float* inp, const float* w, const float* rstd, int N, int C,
                           cudaStream_t stream) {
  rmsnorm_backward<float, false>(__func__, dinp, nullptr, dw, scratch, dout, inp, w, rstd, N, C,
                                 stream);
}

void rmsnorm_backward_add_bf16_cuda(float* dresidual, bf16* dresidual16, float* dw, float* scratch,
                                    const bf16* dout, const float* inp, const float* w,
                                    const float* rstd, int N, int C, cudaStream_t stream) {
  TRIDENT_CHECK(N == 0 || dresidual, "{}: null dresidual", __func__);
  rmsnorm_backward<bf16, true>(__func__, dresidual, dresidual16, dw, scratch, dout, inp, w, rstd, N,
                               C, stream);
}

}  // namespace trident::cuda
