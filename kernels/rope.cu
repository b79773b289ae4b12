// Rotary position embedding (CPU twin: src/backend/rope.cpp). One thread per rotated pair
// (row n, head, i < rot/2): it reads x[i] and x[i + rot/2] of that head and writes both, so
// threads never share an element and the op is in place without synchronisation. Heads
// [0, NH) are q, [NH, NH + KVH) k; v follows and is never touched. On bf16 q|k|v the same
// kernel widens each pair and rounds it once (Note [bf16 activations]).
#include "launch.cuh"
#include "rope.h"

namespace trident::cuda {
namespace {

constexpr int kBlock = 256;

// sign = +1: forward; −1: backward (sin negated), as the CPU twin. Elem is float or bf16.
template <typename Elem>
__global__ void rope_kernel(Elem* __restrict__ qkv, const float* __restrict__ cos,
                            const float* __restrict__ sin, int N, int T, int NH, int KVH, int hs,
                            int rot, float sign) {
  const int half = rot / 2, heads = NH + KVH;
  const size_t row = size_t(NH + 2 * KVH) * hs;
  const size_t pairs = size_t(N) * heads * half;
  for (size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < pairs;
       idx += size_t(gridDim.x) * blockDim.x) {
    const int i = int(idx % half);
    const size_t rest = idx / half;
    const int head = int(rest % heads);
    const size_t n = rest / heads;
    const size_t t = n % size_t(T);
    const float c = cos[t * half + i], s = sign * sin[t * half + i];
    Elem* a = qkv + n * row + size_t(head) * hs;
    const float ai = load(a + i), bi = load(a + i + half);
    store(a + i, ai * c - bi * s);
    store(a + i + half, bi * c + ai * s);
  }
}

template <typename Elem>
void rope(const char* name, Elem* qkv, const float* cos, const float* sin, int N, int T, int NH,
          int KVH, int hs, int rot, float sign, cudaStream_t stream) {
  TRIDENT_CHECK(
      N >= 0 && T > 0 && NH > 0 && KVH > 0 && hs > 0 && rot >= 0 && rot % 2 == 0 && rot <= hs,
      "{}: N={} T={} NH={} KVH={} hs={} rot={}", name, N, T, NH, KVH, hs, rot);
  const size_t pairs = size_t(N) * (NH + KVH) * (rot / 2);
  if (pairs == 0) return;
  TRIDENT_CHECK(qkv && cos && sin, "{}: null pointer", name);
  rope_kernel<Elem>
      <<<grid_for(pairs, kBlock), kBlock, 0, stream>>>(qkv, cos, sin, N, T, NH, KVH, hs, rot, sign);
  TRIDENT_CUDA_LAUNCHED();
}

}  // namespace

void rope_forward_cuda(float* qkv, const float* cos, const float* sin, int N, int T, int NH,
                       int KVH, int hs, int rot, cudaStream_t stream) {
  rope("rope", qkv, cos, sin, N, T, NH, KVH, hs, rot, 1.0f, stream);
}

void rope_backward_cuda(float* dqkv, const float* cos, const float* sin, int N, int T, int NH,
                        int KVH, int hs, int rot, cudaStream_t stream) {
  rope("rope", dqkv, cos, sin, N, T, NH, KVH, hs, rot, -1.0f, stream);
}

void rope_forward_bf16_cuda(bf16* qkv, const float* cos, const float* sin, int N, int T, int NH,
                            int KVH, int hs, int rot, cudaStream_t stream) {
  rope("rope_bf16", qkv, cos, sin, N, T, NH, KVH, hs, rot, 1.0f, stream);
}

void rope_backward_bf16_cuda(bf16* dqkv, const float* cos, const float* sin, int N, int T, int NH,
                             int KVH, int hs, int rot, cudaStream_t stream) {
  rope("rope_bf16", dqkv, cos, sin, N, T, NH, KVH, hs, rot, -1.0f, stream);
}

}  // namespace trident::cuda
