// Token + position embedding, forward and backward (CPU twin: src/backend/encoder.cpp). The
// backward is the vocab-parallel embedding's (vocab_parallel.cu) with the whole vocabulary.
//
// Note [Deterministic dwte]
// dwte is summed without atomics, each token's rows added in increasing row order, so the
// result is the same every run and bitwise the CPU twin's. A token occurs in many rows, so no
// (b,t) owns a row of dwte, and atomicAdd would let the order of a row's sum (and its rounding)
// vary run to run. So the rows are sorted by token (a stable sort) and each run of equal tokens
// is summed by one block, in row order (embedding_slice_backward_cuda in vocab_parallel.cu).
//
// The steps:
//   1. key each row by its token (rows whose token is off the rank's slice get a key that sorts
//      last and are skipped) and sort (key, row) pairs with CUB's radix sort, which is stable:
//      the rows of one token stay in increasing row order;
//   2. mark where a run of equal keys starts and compact the marks (cub::DeviceSelect), giving
//      each distinct token its first position in the sorted order and, on the device, the
//      number of runs;
//   3. one block per (run, chunk of channels) adds the run's dout rows, in that order, onto the
//      old dwte row: the CPU twin's additions in its order, so the result is deterministic and
//      bitwise the CPU's. The run count stays on the device: the grid is its upper bound
//      min(N, v1 - v0 + 1), capped, and blocks stride over the runs *num_runs says there are.
// Cost: O(N) besides the sort of N pairs (a few passes over 8 bytes per row). A token occurring
// k times is still k dependent additions per channel (the order is fixed), so its block loads
// kWteInFlight rows at a time to stay off one load's latency.
#include <cstdint>

#include <limits>

#include "encoder.h"
#include "launch.cuh"
#include "vocab_parallel.h"

namespace trident::cuda {
namespace {

constexpr int kFwdBlock = 256;

// out[bt, c] = wte[tokens[bt], c] + wpe[bt % T, c]; one float4 per step when C % 4 == 0 and the
// pointers are aligned (then a float4 never straddles two rows).
__global__ void encoder_fwd_kernel(float* __restrict__ out, const int32_t* __restrict__ tokens,
                                   const float* __restrict__ wte, const float* __restrict__ wpe,
                                   int N, int T, int C, bool vec) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t start = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec) {
    const int C4 = C / 4;
    const size_t total4 = size_t(N) * C4;
    for (size_t i = start; i < total4; i += stride) {
      const int bt = int(i / C4), c4 = int(i % C4);
      const float4 a = reinterpret_cast<const float4*>(wte + size_t(tokens[bt]) * C)[c4];
      const float4 p = reinterpret_cast<const float4*>(wpe + size_t(bt % T) * C)[c4];
      reinterpret_cast<float4*>(out)[i] = make_float4(a.x + p.x, a.y + p.y, a.z + p.z, a.w + p.w);
    }
    return;
  }
  const size_t total = size_t(N) * C;
  for (size_t i = start; i < total; i += stride) {
    const int bt = int(i / C), c = int(i % C);
    out[i] = wte[size_t(tokens[bt]) * C + c] + wpe[size_t(bt % T) * C + c];
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void encoder_forward_cuda(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                          int B, int T, int C, cudaStream_t stream) {
  TRIDENT_CHECK(B >= 0 && T >= 0 && C >= 0, "encoder_forward_cuda: B={} T={} C={}", B, T, C);
  const int N = B * T;
  if (N == 0 || C == 0) return;
  TRIDENT_CHECK(out && tokens && wte && wpe, "{}: null pointer", __func__);
  const bool vec = C % 4 == 0 && aligned16(out) && aligned16(wte) && aligned16(wpe);
  const size_t work = vec ? size_t(N) * (C / 4) : size_t(N) * C;
  encoder_fwd_kernel<<<grid_for(work, kFwdBlock), kFwdBlock, 0, stream>>>(out, tokens, wte, wpe, N,
                                                                          T, C, vec);
  TRIDENT_CUDA_LAUNCHED();
}

size_t encoder_backward_scratch_bytes(int N) {
  return embedding_backward_scratch_bytes(N, std::numeric_limits<int>::max());
}

void encoder_backward_cuda(float* dwte, float* dwpe, void* scratch, const float* dout,
                           const int32_t* tokens, int B, int T, int C, cudaStream_t stream) {
  // The whole vocabulary is one slice: the vocab-parallel kernels (Note [Deterministic dwte]
  // is theirs too) with v0 = 0 and no upper bound (so the sort looks at 31 key bits).
  embedding_slice_backward_cuda(dwte, dwpe, scratch, dout, tokens, 0,
                                std::numeric_limits<int>::max(), B, T, C, stream);
}

}  // namespace trident::cuda
