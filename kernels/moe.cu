// The mixture of experts' ops (CPU twin: src/backend/moe_ops.cpp, Note [Mixture ops]).
// Routing is one thread per token (E ≤ 256 experts, k ≤ E choices: a token's work is small and
// its own); the permutation is one block, each expert's choices ranked in token order by one
// warp with ballots, so positions, drops and counts are the CPU's exactly; the per-expert sums
// run in token order (Note [Deterministic GPU reductions]). Row kernels are grid-stride loops.
#include "moe.h"

#include "backend/moe_token.h"
#include "reduce.cuh"

namespace trident::cuda {
namespace {

constexpr int kBlock = 256;
constexpr int kPermuteThreads = 1024;
constexpr int kMaxExperts = 256;  // the permutation's shared offsets

__global__ void moe_route_fwd_kernel(float* probs, float* lse, int32_t* top, float* topw,
                                     const float* logits, const float* bias, int N, int E, int k,
                                     bool sigmoid, bool norm_topk) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N) return;
  moe_token::route(probs + size_t(t) * E, lse + t, top + size_t(t) * k, topw + size_t(t) * k,
                   logits + size_t(t) * E, bias, E, k, sigmoid, norm_topk);
}

__global__ void moe_permute_kernel(int32_t* pos, int32_t* send_token, int32_t* counts, double* sums,
                                   int32_t* hf_count, const int32_t* top, const float* probs,
                                   const float* lse, int N, int E, int k, int cap) {
  __shared__ int32_t start[kMaxExperts];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  const int choices = N * k;
  // Expert e's choices in token order, then choice order: a warp walks them 32 at a time.
  for (int e = warp; e < E; e += warps) {
    int seen = 0;
    for (int base = 0; base < choices; base += kWarp) {
      const int c = base + lane;
      const bool mine = c < choices && top[c] == e;
      const unsigned ballot = __ballot_sync(0xffffffffu, mine);
      if (mine) {
        const int rank = seen + __popc(ballot & ((1u << lane) - 1u));
        pos[c] = rank < cap ? rank : -1;
      }
      seen += __popc(ballot);
    }
    if (lane == 0) {
      counts[e] = seen;
      counts[E + e] = seen < cap ? seen : cap;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int first = 0;
    for (int e = 0; e < E; ++e) start[e] = first, first += counts[E + e];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < choices; c += blockDim.x) {
    const int p = pos[c];
    if (p < 0) continue;
    const int r = p + start[top[c]];
    pos[c] = r;
    send_token[r] = c / k;
  }
  for (int i = threadIdx.x; i <= E; i += blockDim.x) {
    double s = 0;
    if (i < E) {
      for (int t = 0; t < N; ++t) s += probs[size_t(t) * E + i];
      if (hf_count) hf_count[i] += counts[i];
    } else {
      for (int t = 0; t < N; ++t) s = __dadd_rn(s, __dmul_rn(double(lse[t]), double(lse[t])));
    }
    sums[i] = s;
  }
}

__global__ void moe_gather_rows_kernel(float* rows, const float* x, const int32_t* send_token,
                                       int M, int C) {
  const size_t total = size_t(M) * C;
  for (size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const size_t r = idx / C, c = idx % C;
    rows[idx] = x[size_t(send_token[r]) * C + c];
  }
}

__global__ void moe_combine_fwd_kernel(float* out, const float* ys, const float* shared,
                                       const float* gate, const int32_t* pos, const float* topw,
                                       int N, int C, int k) {
  const size_t total = size_t(N) * C;
  for (size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const size_t t = idx / C, c = idx % C;
    float o = shared ? (gate ? gate[t] : 1.0f) * shared[idx] : 0.0f;
    for (int j = 0; j < k; ++j) {
      const int r = pos[t * k + j];
      if (r >= 0) o += topw[t * k + j] * ys[size_t(r) * C + c];
    }
    out[idx] = o;
  }
}

__global__ void moe_combine_bwd_kernel(float* dys, float* dtopw, const float* dout, const float* ys,
                                       const int32_t* pos, const float* topw, int C, int k) {
  const size_t c = blockIdx.x;  // one choice a block
  const int r = pos[c];
  if (r < 0) {  // the whole block leaves together
    if (threadIdx.x == 0) dtopw[c] = 0.0f;
    return;
  }
  const float* d = dout + (c / k) * C;
  const float* y = ys + size_t(r) * C;
  float* dy = dys + size_t(r) * C;
  const float w = topw[c];
  double dot = 0;
  for (int q = threadIdx.x; q < C; q += blockDim.x) {
    dot += double(d[q]) * y[q];
    dy[q] = w * d[q];
  }
  dot = block_sum(dot);
  if (threadIdx.x == 0) dtopw[c] = float(dot);
}

__global__ void moe_scatter_add_kernel(float* dx, const float* dxs, const int32_t* pos, int N,
                                       int C, int k) {
  const size_t total = size_t(N) * C;
  for (size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    const size_t t = idx / C, c = idx % C;
    float d = dx[idx];
    for (int j = 0; j < k; ++j) {
      const int r = pos[t * k + j];
      if (r >= 0) d += dxs[size_t(r) * C + c];
    }
    dx[idx] = d;
  }
}

__global__ void moe_route_bwd_kernel(float* dlogits, const float* dtopw, const float* probs,
                                     const float* lse, const int32_t* top, const float* topw,
                                     const int32_t* aux_count, double aux_num, double aux_den,
                                     double z2, double loss_scale, int N, int E, int k,
                                     bool sigmoid, bool norm_topk) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const double z = z2 > 0 ? z2 * lse[t] / N * loss_scale : 0.0;
  moe_token::route_backward(dlogits + size_t(t) * E, probs + size_t(t) * E, top + size_t(t) * k,
                            topw + size_t(t) * k, dtopw + size_t(t) * k, aux_count, aux_num,
                            aux_den, loss_scale, z, E, k, sigmoid, norm_topk);
}

__global__ void sigmoid_kernel(float* out, const float* inp, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    out[i] = 1.0f / (1.0f + expf(-inp[i]));
}

__global__ void moe_gate_bwd_kernel(float* dgate, float* dy, const float* dout, const float* y,
                                    const float* gate, int C) {
  const size_t t = blockIdx.x;  // one token a block
  const float g = gate[t];
  double dot = 0;
  for (int q = threadIdx.x; q < C; q += blockDim.x) {
    dot += double(dout[t * C + q]) * y[t * C + q];
    dy[t * C + q] = g * dout[t * C + q];
  }
  dot = block_sum(dot);
  if (threadIdx.x == 0) dgate[t] = float(dot * g * (1.0 - g));
}

void check_experts(const char* op, int N, int E, int k) {
  TRIDENT_CHECK(N >= 0 && E > 0 && E <= kMaxExperts && k > 0 && k <= E,
                "{}: N={} E={} k={} (1 <= k <= E <= {})", op, N, E, k, kMaxExperts);
}

}  // namespace

void moe_route_forward_cuda(float* probs, float* lse, int32_t* top, float* topw,
                            const float* logits, const float* bias, int N, int E, int k,
                            bool sigmoid, bool norm_topk, cudaStream_t stream) {
  check_experts("moe_route_forward", N, E, k);
  if (N == 0) return;
  moe_route_fwd_kernel<<<ceil_div(size_t(N), 128), 128, 0, stream>>>(
      probs, lse, top, topw, logits, bias, N, E, k, sigmoid, norm_topk);
  TRIDENT_CUDA_LAUNCHED();
}

void moe_permute_cuda(int32_t* pos, int32_t* send_token, int32_t* counts, double* sums,
                      int32_t* hf_count, const int32_t* top, const float* probs, const float* lse,
                      int N, int E, int k, int cap, cudaStream_t stream) {
  check_experts("moe_permute", N, E, k);
  moe_permute_kernel<<<1, kPermuteThreads, 0, stream>>>(pos, send_token, counts, sums, hf_count,
                                                        top, probs, lse, N, E, k, cap);
  TRIDENT_CUDA_LAUNCHED();
}

void moe_gather_rows_cuda(float* rows, const float* x, const int32_t* send_token, int M, int C,
                          cudaStream_t stream) {
  const size_t total = size_t(M) * size_t(C);
  if (total == 0) return;
  moe_gather_rows_kernel<<<grid_for(total, kBlock), kBlock, 0, stream>>>(rows, x, send_token, M, C);
  TRIDENT_CUDA_LAUNCHED();
}

void moe_combine_forward_cuda(float* out, const float* ys, const float* shared, const float* gate,
                              const int32_t* pos, const float* topw, int N, int C, int k,
                              cudaStream_t stream) {
  const size_t total = size_t(N) * size_t(C);
  if (total == 0) return;
  moe_combine_fwd_kernel<<<grid_for(total, kBlock), kBlock, 0, stream>>>(out, ys, shared, gate, pos,
                                                                         topw, N, C, k);
  TRIDENT_CUDA_LAUNCHED();
}

void moe_combine_backward_cuda(float* dys, float* dtopw, const float* dout, const float* ys,
                               const int32_t* pos, const float* topw, int N, int C, int k,
                               cudaStream_t stream) {
  if (N == 0) return;
  moe_combine_bwd_kernel<<<unsigned(size_t(N) * k), 128, 0, stream>>>(dys, dtopw, dout, ys, pos,
                                                                      topw, C, k);
  TRIDENT_CUDA_LAUNCHED();
}

void moe_scatter_add_cuda(float* dx, const float* dxs, const int32_t* pos, int N, int C, int k,
                          cudaStream_t stream) {
  const size_t total = size_t(N) * size_t(C);
  if (total == 0) return;
  moe_scatter_add_kernel<<<grid_for(total, kBlock), kBlock, 0, stream>>>(dx, dxs, pos, N, C, k);
  TRIDENT_CUDA_LAUNCHED();
}

void moe_route_backward_cuda(float* dlogits, const float* dtopw, const float* probs,
                             const float* lse, const int32_t* top, const float* topw,
                             const int32_t* aux_count, double aux_num, double aux_den, double z2,
                             double loss_scale, int N, int E, int k, bool sigmoid, bool norm_topk,
                             cudaStream_t stream) {
  check_experts("moe_route_backward", N, E, k);
  if (N == 0) return;
  moe_route_bwd_kernel<<<ceil_div(size_t(N), 128), 128, 0, stream>>>(
      dlogits, dtopw, probs, lse, top, topw, aux_count, aux_num, aux_den, z2, loss_scale, N, E, k,
      sigmoid, norm_topk);
  TRIDENT_CUDA_LAUNCHED();
}

void sigmoid_forward_cuda(float* out, const float* inp, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  sigmoid_kernel<<<grid_for(n, kBlock), kBlock, 0, stream>>>(out, inp, n);
  TRIDENT_CUDA_LAUNCHED();
}

void moe_gate_backward_cuda(float* dgate, float* dy, const float* dout, const float* y,
                            const float* gate, int N, int C, cudaStream_t stream) {
  if (N == 0) return;
  moe_gate_bwd_kernel<<<unsigned(N), 128, 0, stream>>>(dgate, dy, dout, y, gate, C);
  TRIDENT_CUDA_LAUNCHED();
}

}  // namespace trident::cuda
