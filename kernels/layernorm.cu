// LayerNorm over the last dimension, eps 1e-5 (CPU twin: src/backend/layernorm.cpp).
//
// Forward and the dinp part of backward: one warp per row, the row cached in shared memory so
// it is read from global memory once (C = 1600 is 6.4 KB a row). Each lane touches only its own
// columns c = lane + 32k, so the cache needs no synchronisation.
// The bf16 variants (Note [bf16 activations]) are the same kernels with a bf16 output (forward)
// or a bf16 dout read and widened (backward), all arithmetic fp32.
// Backward's dw, db: column sums over rows, deterministic
// (Note [Deterministic GPU reductions] in kernels/reduce.cuh): per-row-chunk partial sums in
// `scratch`, then a fixed-order sum of the chunks.
#include "layernorm.h"
#include "reduce.cuh"

namespace trident::cuda {
namespace {

constexpr float kEps = 1e-5f;
constexpr int kRowsPerBlock = 4;  // warps per block, one row each
constexpr size_t kDefaultSmem = 48 * 1024;
constexpr size_t kMaxSmem = 227 * 1024;  // sm_90 opt-in limit per block

// Two passes like the CPU twin (mean, then squared deviations): no cancellation when
// |mean| >> std. Out is float or bf16; the arithmetic is the same fp32 for both. b null: no
// shift (model.bias false).
template <typename Out>
__global__ void layernorm_fwd_kernel(Out* __restrict__ out, float* __restrict__ mean,
                                     float* __restrict__ rstd, const float* __restrict__ inp,
                                     const float* __restrict__ w, const float* __restrict__ b,
                                     int N, int C) {
  extern __shared__ float cache[];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int n = blockIdx.x * kRowsPerBlock + warp;
  if (n >= N) return;  // warp-uniform; no block-wide barrier follows
  float* xs = cache + size_t(warp) * C;
  const float* x = inp + size_t(n) * C;

  float sum = 0.0f;
  for (int c = lane; c < C; c += kWarp) {
    const float v = x[c];
    xs[c] = v;
    sum += v;
  }
  const float mu = warp_sum(sum) / float(C);
  float sq = 0.0f;
  for (int c = lane; c < C; c += kWarp) {
    const float d = xs[c] - mu;
    sq += d * d;
  }
  const float rs = rsqrtf(warp_sum(sq) / float(C) + kEps);
  Out* o = out + size_t(n) * C;
  for (int c = lane; c < C; c += kWarp) store(o + c, (xs[c] - mu) * rs * w[c] + (b ? b[c] : 0.0f));
  if (lane == 0) {
    mean[n] = mu;
    rstd[n] = rs;
  }
}

// dinp = rstd · (g - mean(g) - xhat · mean(g·xhat)), g = dout·w, xhat = (x - mean)·rstd.
// The cache holds g and xhat of the row (2C floats per warp). kAdd (the bf16 op): dinp is the
// residual gradient, dinp += the value, then dinp16 = bf16(dinp) when non-null, in the same
// pass; else dinp = the value. Dout is float or bf16.
template <typename Dout, bool kAdd>
__global__ void layernorm_bwd_dinp_kernel(float* __restrict__ dinp, bf16* __restrict__ dinp16,
                                          const Dout* __restrict__ dout,
                                          const float* __restrict__ inp,
                                          const float* __restrict__ w,
                                          const float* __restrict__ mean,
                                          const float* __restrict__ rstd, int N, int C) {
  extern __shared__ float cache[];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int n = blockIdx.x * kRowsPerBlock + warp;
  if (n >= N) return;
  float* gs = cache + size_t(warp) * 2 * C;
  float* xhats = gs + C;
  const float* x = inp + size_t(n) * C;
  const Dout* d = dout + size_t(n) * C;
  const float mu = mean[n], rs = rstd[n];

  float g_sum = 0.0f, gx_sum = 0.0f;
  for (int c = lane; c < C; c += kWarp) {
    const float g = load(d + c) * w[c];
    const float xhat = (x[c] - mu) * rs;
    gs[c] = g;
    xhats[c] = xhat;
    g_sum += g;
    gx_sum += g * xhat;
  }
  const float g_mean = warp_sum(g_sum) / float(C);
  const float gx_mean = warp_sum(gx_sum) / float(C);
  float* di = dinp + size_t(n) * C;
  for (int c = lane; c < C; c += kWarp) {
    const float v = rs * (gs[c] - g_mean - xhats[c] * gx_mean);
    if constexpr (kAdd) {
      const float sum = di[c] + v;  // the CPU twin's add(dresidual, dresidual, dinp)
      di[c] = sum;
      if (dinp16) dinp16[size_t(n) * C + c] = __float2bfloat16(sum);
    } else {
      di[c] = v;
    }
  }
}

// Partial column sums over one chunk of rows (blockIdx.y): one thread per column, rows in order.
template <typename Dout>
__global__ void layernorm_bwd_partial_kernel(
    float* __restrict__ partial_dw, float* __restrict__ partial_db, const Dout* __restrict__ dout,
    const float* __restrict__ inp, const float* __restrict__ mean, const float* __restrict__ rstd,
    int N, int C, int rows_per_chunk) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int chunk = blockIdx.y;
  const int n0 = chunk * rows_per_chunk;
  const int n1 = min(N, n0 + rows_per_chunk);
  float dw = 0.0f, db = 0.0f;
  for (int n = n0; n < n1; ++n) {
    const float d = load(dout + size_t(n) * C + c);
    dw += d * ((inp[size_t(n) * C + c] - mean[n]) * rstd[n]);
    db += d;
  }
  partial_dw[size_t(chunk) * C + c] = dw;
  partial_db[size_t(chunk) * C + c] = db;
}

// dw[c] += Σ_chunk partial_dw[chunk, c] in chunk order; the same for db. Either may be null.
__global__ void layernorm_bwd_finish_kernel(float* __restrict__ dw, float* __restrict__ db,
                                            const float* __restrict__ partial_dw,
                                            const float* __restrict__ partial_db, int chunks,
                                            int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sum_dw = 0.0f, sum_db = 0.0f;
  for (int k = 0; k < chunks; ++k) {
    sum_dw += partial_dw[size_t(k) * C + c];
    sum_db += partial_db[size_t(k) * C + c];
  }
  if (dw) dw[c] += sum_dw;
  if (db) db[c] += sum_db;
}

// Dynamic shared memory above the default 48 KB needs an opt-in per kernel, made once per size
// per device (allow_dynamic_smem in launch.cuh; `allowed` is the call site's static).
template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes, int C, SmemOptIn& allowed) {
  TRIDENT_CHECK(bytes <= kMaxSmem, "layernorm: C={} needs {} bytes of shared memory", C, bytes);
  if (bytes > kDefaultSmem) allow_dynamic_smem(kernel, bytes, allowed);
}

template <typename Out>
void layernorm_forward(Out* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C, cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && C > 0, "layernorm_forward_cuda: N={} C={}", N, C);
  if (N == 0) return;
  TRIDENT_CHECK(out && mean && rstd && inp && w, "{}: null pointer", __func__);
  const size_t smem = size_t(kRowsPerBlock) * C * sizeof(float);
  static SmemOptIn allowed;  // one per instantiation, as the opt-in is per kernel
  allow_smem(layernorm_fwd_kernel<Out>, smem, C, allowed);
  layernorm_fwd_kernel<Out>
      <<<ceil_div(size_t(N), kRowsPerBlock), kRowsPerBlock * kWarp, smem, stream>>>(
          out, mean, rstd, inp, w, b, N, C);
  TRIDENT_CUDA_LAUNCHED();
}

// dinp (assign, or add with dinp16 when kAdd; skipped when null), then dw, db (accumulate).
template <typename Dout, bool kAdd>
void layernorm_backward(float* dinp, bf16* dinp16, float* dw, float* db, float* scratch,
                        const Dout* dout, const float* inp, const float* w, const float* mean,
                        const float* rstd, int N, int C, cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && C > 0, "layernorm_backward_cuda: N={} C={}", N, C);
  if (N == 0) return;
  TRIDENT_CHECK(dout && inp && mean && rstd, "{}: null input", __func__);
  TRIDENT_CHECK(static_cast<const void*>(dinp16) != static_cast<const void*>(dout) || (!dw && !db),
                "{}: dresidual16 is dout, which dw and db read after it is written", __func__);
  if (dinp) {
    TRIDENT_CHECK(w, "{}: null w", __func__);
    const size_t smem = size_t(kRowsPerBlock) * 2 * C * sizeof(float);
    static SmemOptIn allowed;
    allow_smem(layernorm_bwd_dinp_kernel<Dout, kAdd>, smem, C, allowed);
    layernorm_bwd_dinp_kernel<Dout, kAdd>
        <<<ceil_div(size_t(N), kRowsPerBlock), kRowsPerBlock * kWarp, smem, stream>>>(
            dinp, dinp16, dout, inp, w, mean, rstd, N, C);
    TRIDENT_CUDA_LAUNCHED();
  }
  if (!dw && !db) return;
  TRIDENT_CHECK(scratch, "{}: null scratch", __func__);
  const int chunks = column_sum_row_chunks(N);
  const int rows_per_chunk = int(ceil_div(size_t(N), size_t(chunks)));
  float* partial_dw = scratch;
  float* partial_db = scratch + size_t(chunks) * C;
  constexpr int kBlock = 256;
  const dim3 grid(ceil_div(size_t(C), kBlock), unsigned(chunks));
  layernorm_bwd_partial_kernel<Dout><<<grid, kBlock, 0, stream>>>(partial_dw, partial_db, dout, inp,
                                                                  mean, rstd, N, C, rows_per_chunk);
  TRIDENT_CUDA_LAUNCHED();
  layernorm_bwd_finish_kernel<<<ceil_div(size_t(C), kBlock), kBlock, 0, stream>>>(
      dw, db, partial_dw, partial_db, chunks, C);
  TRIDENT_CUDA_LAUNCHED();
}

}  // namespace

void layernorm_forward_cuda(float* out, float* mean, float* rstd, const float* inp, const float* w,
                            const float* b, int N, int C, cudaStream_t stream) {
  layernorm_forward(out, mean, rstd, inp, w, b, N, C, stream);
}

void layernorm_forward_bf16_cuda(bf16* out, float* mean, float* rstd, const float* inp,
                                 const float* w, const float* b, int N, int C,
                                 cudaStream_t stream) {
  layernorm_forward(out, mean, rstd, inp, w, b, N, C, stream);
}

size_t layernorm_backward_scratch_floats(int N, int C) {
  return 2 * size_t(column_sum_row_chunks(N)) * size_t(C > 0 ? C : 0);
}

void layernorm_backward_cuda(float* dinp, float* dw, float* db, float* scratch, const float* dout,
                             const float* inp, const float* w, const float* mean, const float* rstd,
                             int N, int C, cudaStream_t stream) {
  layernorm_backward<float, false>(dinp, nullptr, dw, db, scratch, dout, inp, w, mean, rstd, N, C,
                                   stream);
}

void layernorm_backward_add_bf16_cuda(float* dresidual, bf16* dresidual16, float* dw, float* db,
                                      float* scratch, const bf16* dout, const float* inp,
                                      const float* w, const float* mean, const float* rstd, int N,
                                      int C, cudaStream_t stream) {
  TRIDENT_CHECK(N == 0 || dresidual, "{}: null dresidual", __func__);
  layernorm_backward<bf16, true>(dresidual, dresidual16, dw, db, scratch, dout, inp, w, mean, rstd,
                                 N, C, stream);
}

}  // namespace trident::cuda
