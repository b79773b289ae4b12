// The vocab-parallel embedding and loss (CPU twins: src/backend/vocab_parallel.cpp,
// Note [Vocab-parallel ops]). All five are deterministic: no atomics, every sum in a fixed order.
//
// Row-wise except dwte: one block per token row (the rows are long: C up to 1600 channels, Vl
// up to ~50k logits), so a row's index is blockIdx.x and only the product row·width needs 64
// bits. dwte sorts the rows by token first (CUB's radix sort) and sums each token's rows.
// The softmax sums and the combine run in double, as the CPU does: they feed log S and every
// probability, and double keeps them within rounding of the twin whatever the logits' range.
// The fp64 cost is small next to reading the logits (an H200 has plenty of fp64 throughput).
#include <algorithm>
#include <bit>
#include <cstdint>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>

#include "reduce.cuh"
#include "vocab_parallel.h"

namespace trident::cuda {
namespace {

constexpr int kBlock = 256;

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

// out[n,:] = wte_slice row (when the token is on this rank) + wpe row (when given).
__global__ void embedding_slice_fwd_kernel(float* __restrict__ out,
                                           const int32_t* __restrict__ tokens,
                                           const float* __restrict__ wte_slice,
                                           const float* __restrict__ wpe, int v0, int v1, int T,
                                           int C) {
  const int n = blockIdx.x;
  const int tok = tokens[n];
  const float* e = (tok >= v0 && tok < v1) ? wte_slice + size_t(tok - v0) * C : nullptr;
  const float* p = wpe ? wpe + size_t(n % T) * C : nullptr;
  float* o = out + size_t(n) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = (e ? e[c] : 0.0f) + (p ? p[c] : 0.0f);
}

// dwpe[t, c] += Σ_b dout[b, t, c], b in order (the CPU's order): one thread per (t, c).
__global__ void slice_bwd_wpe_kernel(float* __restrict__ dwpe, const float* __restrict__ dout,
                                     int B, int T, int C) {
  const size_t total = size_t(T) * C;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    float acc = dwpe[i];
    for (int b = 0; b < B; ++b) acc += dout[size_t(b) * total + i];
    dwpe[i] = acc;
  }
}

// The dwte backward of Note [Deterministic dwte] (kernels/encoder.cu): sort the rows by token, find
// the runs of equal tokens, add each run's dout rows in row order.

// Sort key of a row: its row of dwte_slice, or `off_slice` = v1 - v0 (sorts after every real
// key) when its token is not on this rank; value: the row index itself.
__global__ void dwte_keys_kernel(uint32_t* __restrict__ keys, int* __restrict__ row_ids,
                                 const int32_t* __restrict__ tokens, int v0, int v1, int N) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const int tok = tokens[n];
  keys[n] = tok >= v0 && tok < v1 ? uint32_t(tok - v0) : uint32_t(v1 - v0);
  row_ids[n] = n;
}

// run_marks[i] = i where a run of equal sorted keys starts, else -1 (DeviceSelect keeps i >= 0).
__global__ void dwte_run_marks_kernel(int* __restrict__ run_marks,
                                      const uint32_t* __restrict__ sorted_keys, int N) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= N) return;
  run_marks[i] = i == 0 || sorted_keys[i] != sorted_keys[i - 1] ? i : -1;
}

struct IsRunStart {
  __host__ __device__ bool operator()(int mark) const { return mark >= 0; }
};

constexpr int kWteBlock = 128;       // channels per block (blockIdx.y chunks), one per thread
constexpr int kWteTile = kWteBlock;  // row ids staged in shared memory at a time, one per thread
constexpr int kWteInFlight = 32;     // dout rows loaded together before they are added in order
constexpr unsigned kMaxRunBlocks = 1024;  // blockIdx.x; more runs than this are strided over
static_assert(kWteTile % kWteInFlight == 0, "a batch never straddles two tiles");

// Grid (run blocks, channel chunks). Block x takes runs x, x + gridDim.x, ... of the
// *num_runs found on the device; a block with no run left exits, and so does the run of
// off-slice rows (always the last). For its run, the thread of channel c starts from the old
// dwte value and adds dout[row][c] for the run's rows in sorted order, which the stable sort
// left increasing: the CPU twin's additions, in its order. The row ids come through shared
// memory a tile at a time (the next tile's ids load while this one is added), and kWteInFlight
// rows' loads are issued before their adds, so a frequent token's long run is not bound by one
// load's latency. Every branch on the run is block-uniform, so the __syncthreads are safe.
__global__ void slice_bwd_wte_kernel(float* __restrict__ dwte_slice, const float* __restrict__ dout,
                                     const uint32_t* __restrict__ sorted_keys,
                                     const int* __restrict__ sorted_rows,
                                     const int* __restrict__ run_starts,
                                     const int* __restrict__ num_runs_found, uint32_t off_slice,
                                     int N, int C) {
  __shared__ int tile_rows[kWteTile];
  const int num_runs = *num_runs_found;
  const int c = blockIdx.y * kWteBlock + threadIdx.x;
  const int c_load = min(c, C - 1);
  for (int run = blockIdx.x; run < num_runs; run += gridDim.x) {
    const int begin = run_starts[run];
    const int end = run + 1 < num_runs ? run_starts[run + 1] : N;
    const uint32_t key = sorted_keys[begin];
    if (key == off_slice) continue;
    float* w = dwte_slice + size_t(key) * C;
    float acc = c < C ? w[c] : 0.0f;
    int next = int(threadIdx.x) < end - begin ? sorted_rows[begin + threadIdx.x] : 0;
    for (int t0 = begin; t0 < end; t0 += kWteTile) {
      const int n = min(kWteTile, end - t0);
      __syncthreads();  // the previous tile (or run) is done with tile_rows
      tile_rows[threadIdx.x] = next;
      __syncthreads();
      if (end - t0 - kWteTile > int(threadIdx.x)) next = sorted_rows[t0 + kWteTile + threadIdx.x];
      for (int i = 0; i < n; i += kWteInFlight) {
        // Loads without branches, so that all kWteInFlight are in flight at once: a slot past
        // the tile's end reloads its last row (an L1 hit), a channel past C reads channel C-1;
        // neither is added.
        float x[kWteInFlight];
#pragma unroll
        for (int r = 0; r < kWteInFlight; ++r)
          x[r] = dout[size_t(tile_rows[min(i + r, n - 1)]) * C + c_load];
#pragma unroll
        for (int r = 0; r < kWteInFlight; ++r)
          // Skipped, not added as 0: -0.0f + 0.0f is +0.0f, which the CPU would not produce.
          if (i + r < n) acc += x[r];
      }
    }
    if (c < C) w[c] = acc;
  }
}

// The scratch of the dwte sort, carved in this order, every piece 256-byte aligned (as
// cudaMalloc's base is, and as CUB wants its temporary storage). One definition for both the
// size the caller allocates and the pointers the launcher uses.
struct DwteScratch {
  static constexpr size_t kAlign = 256;
  int key_bits = 0;  // the sort looks at key bits [0, key_bits): enough for off_slice
  size_t keys = 0, row_ids = 0, sorted_keys = 0, sorted_rows = 0, run_marks = 0, run_starts = 0,
         num_runs = 0, temp = 0, temp_bytes = 0, total = 0;

  DwteScratch(int N, int vocab_rows) {
    if (N <= 0 || vocab_rows <= 0) return;
    key_bits = std::bit_width(uint32_t(vocab_rows));
    size_t sort_bytes = 0, select_bytes = 0;
    TRIDENT_CUDA(cub::DeviceRadixSort::SortPairs(
        nullptr, sort_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
        static_cast<const int*>(nullptr), static_cast<int*>(nullptr), N, 0, key_bits));
    TRIDENT_CUDA(cub::DeviceSelect::If(nullptr, select_bytes, static_cast<int*>(nullptr),
                                       static_cast<int*>(nullptr), static_cast<int*>(nullptr), N,
                                       IsRunStart{}));
    temp_bytes = std::max(sort_bytes, select_bytes);  // the two run one after the other
    const size_t ints = size_t(N) * sizeof(int);
    for (size_t* piece : {&keys, &row_ids, &sorted_keys, &sorted_rows, &run_marks, &run_starts})
      *piece = take(ints);
    num_runs = take(sizeof(int));
    temp = take(temp_bytes);
  }

 private:
  size_t take(size_t bytes) {
    const size_t at = total;
    total += (bytes + kAlign - 1) / kAlign * kAlign;
    return at;
  }
};

// stats[n] = (max_j<live x, Σ_j<live exp(x - max) in double, x[target - v0] or 0).
// live == 0 gives (-inf, 0, 0): block_max of nothing is -inf, the sum has no terms.
__global__ void crossentropy_slice_stats_kernel(float* __restrict__ stats,
                                                const float* __restrict__ logits,
                                                const int32_t* __restrict__ targets, int v0,
                                                int live, int Vl) {
  const int n = blockIdx.x;
  const float* x = logits + size_t(n) * Vl;
  float m = neg_inf();
  for (int j = threadIdx.x; j < live; j += blockDim.x) m = fmaxf(m, x[j]);
  m = block_max(m);
  double s = 0.0;
  for (int j = threadIdx.x; j < live; j += blockDim.x) s += exp(double(x[j]) - double(m));
  s = block_sum<double>(s);
  if (threadIdx.x == 0) {
    const int tj = targets[n] - v0;
    stats[3 * size_t(n)] = m;
    stats[3 * size_t(n) + 1] = float(s);
    stats[3 * size_t(n) + 2] = (tj >= 0 && tj < live) ? x[tj] : 0.0f;
  }
}

// Every thread folds the tp ranks' stats itself (tp is small; the reads are broadcasts), in rank
// order as the CPU does, so all threads hold the same M and S without a shared-memory exchange.
__global__ void crossentropy_slice_combine_kernel(float* __restrict__ losses,
                                                  float* __restrict__ x_to_p,
                                                  const float* __restrict__ all_stats, int tp,
                                                  int live, int N, int Vl) {
  const int n = blockIdx.x;
  float M = neg_inf();
  for (int r = 0; r < tp; ++r) {
    const float q0 = all_stats[(size_t(r) * N + n) * 3];
    M = M < q0 ? q0 : M;  // std::max(M, q0)
  }
  double S = 0.0, target_logit = 0.0;
  for (int r = 0; r < tp; ++r) {
    const float* q = all_stats + (size_t(r) * N + n) * 3;
    // A rank holding only padding has max -inf: skipped (its 0·exp(-inf - M) could be NaN).
    if (q[0] != neg_inf()) S += double(q[1]) * exp(double(q[0]) - double(M));
    target_logit += q[2];
  }
  if (threadIdx.x == 0) losses[n] = float(log(S) + double(M) - target_logit);
  float* x = x_to_p + size_t(n) * Vl;
  for (int j = threadIdx.x; j < Vl; j += blockDim.x)
    x[j] = j < live ? float(exp(double(x[j]) - double(M)) / S) : 0.0f;
}

// probs *= dloss, then -dloss at the target column when it is on this rank. __fmul_rn keeps
// the product from being fused with the subtraction (the CPU rounds the product first).
__global__ void crossentropy_slice_bwd_kernel(float* __restrict__ probs,
                                              const int32_t* __restrict__ targets, float dloss,
                                              int v0, int Vl) {
  const int n = blockIdx.x;
  float* p = probs + size_t(n) * Vl;
  const int tj = targets[n] - v0;  // may be outside [0, Vl): then no column matches
  for (int j = threadIdx.x; j < Vl; j += blockDim.x) {
    float g = __fmul_rn(p[j], dloss);
    if (j == tj) g -= dloss;
    p[j] = g;
  }
}

}  // namespace

void embedding_slice_forward_cuda(float* out, const int32_t* tokens, const float* wte_slice,
                                  const float* wpe, int v0, int v1, int B, int T, int C,
                                  cudaStream_t stream) {
  TRIDENT_CHECK(B >= 0 && T >= 0 && C >= 0, "{}: B={} T={} C={}", __func__, B, T, C);
  const int N = B * T;
  if (N == 0 || C == 0) return;
  TRIDENT_CHECK(out && tokens && (wte_slice || v1 <= v0), "{}: null pointer", __func__);
  embedding_slice_fwd_kernel<<<unsigned(N), kBlock, 0, stream>>>(out, tokens, wte_slice, wpe, v0,
                                                                 v1, T, C);
  TRIDENT_CUDA_LAUNCHED();
}

size_t embedding_backward_scratch_bytes(int N, int vocab_rows) {
  return DwteScratch(N, vocab_rows).total;
}

void embedding_slice_backward_cuda(float* dwte_slice, float* dwpe, void* scratch, const float* dout,
                                   const int32_t* tokens, int v0, int v1, int B, int T, int C,
                                   cudaStream_t stream) {
  TRIDENT_CHECK(B >= 0 && T >= 0 && C >= 0, "{}: B={} T={} C={}", __func__, B, T, C);
  TRIDENT_CHECK(v0 >= 0 && v1 >= v0, "{}: vocabulary slice [{}, {})", __func__, v0, v1);
  const int N = B * T;
  if (N == 0 || C == 0) return;
  TRIDENT_CHECK(dout, "{}: null dout", __func__);
  if (dwpe) {
    const size_t work = size_t(T) * C;
    slice_bwd_wpe_kernel<<<grid_for(work, kBlock), kBlock, 0, stream>>>(dwpe, dout, B, T, C);
    TRIDENT_CUDA_LAUNCHED();
  }
  if (!dwte_slice || v1 == v0) return;
  TRIDENT_CHECK(tokens && scratch, "{}: null tokens or scratch", __func__);
  // Row indices plus a tile stay far from INT_MAX, so the kernels' int arithmetic cannot wrap.
  TRIDENT_CHECK(N <= (1 << 30), "{}: {} rows, at most 2^30", __func__, N);
  const DwteScratch layout(N, v1 - v0);
  char* base = static_cast<char*>(scratch);
  auto* keys = reinterpret_cast<uint32_t*>(base + layout.keys);
  auto* row_ids = reinterpret_cast<int*>(base + layout.row_ids);
  auto* sorted_keys = reinterpret_cast<uint32_t*>(base + layout.sorted_keys);
  auto* sorted_rows = reinterpret_cast<int*>(base + layout.sorted_rows);
  auto* run_marks = reinterpret_cast<int*>(base + layout.run_marks);
  auto* run_starts = reinterpret_cast<int*>(base + layout.run_starts);
  auto* num_runs = reinterpret_cast<int*>(base + layout.num_runs);
  void* temp = base + layout.temp;

  const unsigned row_blocks = ceil_div(size_t(N), kBlock);
  dwte_keys_kernel<<<row_blocks, kBlock, 0, stream>>>(keys, row_ids, tokens, v0, v1, N);
  TRIDENT_CUDA_LAUNCHED();
  // Stable: rows of one token stay in increasing order.
  size_t temp_bytes = layout.temp_bytes;
  TRIDENT_CUDA(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, sorted_keys, row_ids,
                                               sorted_rows, N, 0, layout.key_bits, stream));
  dwte_run_marks_kernel<<<row_blocks, kBlock, 0, stream>>>(run_marks, sorted_keys, N);
  TRIDENT_CUDA_LAUNCHED();
  temp_bytes = layout.temp_bytes;
  TRIDENT_CUDA(cub::DeviceSelect::If(temp, temp_bytes, run_marks, run_starts, num_runs, N,
                                     IsRunStart{}, stream));
  // At most min(N, v1 - v0 + 1) runs (the +1: the off-slice rows); how many is known only on
  // the device, so the grid is that bound (capped) and the kernel reads *num_runs.
  const size_t run_bound = std::min(size_t(N), size_t(v1 - v0) + 1);
  const dim3 grid(unsigned(std::min<size_t>(run_bound, kMaxRunBlocks)),
                  ceil_div(size_t(C), kWteBlock));
  slice_bwd_wte_kernel<<<grid, kWteBlock, 0, stream>>>(
      dwte_slice, dout, sorted_keys, sorted_rows, run_starts, num_runs, uint32_t(v1 - v0), N, C);
  TRIDENT_CUDA_LAUNCHED();
}

void crossentropy_slice_stats_cuda(float* stats, const float* logits, const int32_t* targets,
                                   int v0, int live, int N, int Vl, cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && live >= 0 && live <= Vl, "{}: N={} live={} Vl={}", __func__, N, live, Vl);
  if (N == 0) return;
  TRIDENT_CHECK(stats && targets && (logits || Vl == 0), "{}: null pointer", __func__);
  crossentropy_slice_stats_kernel<<<unsigned(N), kBlock, 0, stream>>>(stats, logits, targets, v0,
                                                                      live, Vl);
  TRIDENT_CUDA_LAUNCHED();
}

void crossentropy_slice_combine_cuda(float* losses, float* logits_to_probs, const float* all_stats,
                                     int tp, int live, int N, int Vl, cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && tp >= 1 && live >= 0 && live <= Vl, "{}: N={} tp={} live={} Vl={}",
                __func__, N, tp, live, Vl);
  if (N == 0) return;
  TRIDENT_CHECK(losses && all_stats && (logits_to_probs || Vl == 0), "{}: null pointer", __func__);
  crossentropy_slice_combine_kernel<<<unsigned(N), kBlock, 0, stream>>>(losses, logits_to_probs,
                                                                        all_stats, tp, live, N, Vl);
  TRIDENT_CUDA_LAUNCHED();
}

void crossentropy_slice_backward_cuda(float* probs_to_dlogits, const int32_t* targets, float dloss,
                                      int v0, int N, int Vl, cudaStream_t stream) {
  TRIDENT_CHECK(N >= 0 && Vl >= 0, "{}: N={} Vl={}", __func__, N, Vl);
  if (N == 0 || Vl == 0) return;
  TRIDENT_CHECK(probs_to_dlogits && targets, "{}: null pointer", __func__);
  crossentropy_slice_bwd_kernel<<<unsigned(N), kBlock, 0, stream>>>(probs_to_dlogits, targets,
                                                                    dloss, v0, Vl);
  TRIDENT_CUDA_LAUNCHED();
}

}  // namespace trident::cuda
