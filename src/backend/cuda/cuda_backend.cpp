// CudaBackend's members (the class: cuda_backend.h) but its bf16 ops (cuda_backend_bf16.cpp):
// construction, memory and copies, op timing, the fp32 layers and family ops, the tp and
// mixture ops, the optimizer side; and make_cuda_backend.
//
// Note [Mixed precision]
// With fp32 precision, activations, gradients, master weights and AdamW moments are fp32 in
// memory, as the Backend interface is, so the model code is the same on both backends. The
// tensor-core work runs in bf16: each GEMM casts its inputs to bf16 staging buffers and
// accumulates in fp32 into an fp32 output (cuBLASLt), and cuDNN's fused attention takes bf16
// q, k, v. The casts cost memory traffic (about 6 bytes per element cast).
//
// run.precision bf16 is the other design (Note [bf16 activations] in src/backend/bf16_ops.cpp):
// the *_bf16 ops of cuda_backend_bf16.cpp read and write bf16 activations with no cast pass.
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "attention_block.h"
#include "attention_cudnn.h"
#include "attention_flash.h"
#include "backend/cuda/attention_choice.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_resources.h"
#include "backend/cuda/host_snapshot.h"
#include "backend/cuda/lt_gemm.h"
#include "bias_grad.h"
#include "crossentropy.h"
#include "cuda_check.h"
#include "elementwise.h"
#include "encoder.h"
#include "layernorm.h"
#include "moe.h"
#include "optimizer.h"
#include "rmsnorm.h"
#include "rope.h"
#include "swiglu.h"
#include "trident/cuda_backend.h"
#include "vocab_parallel.h"

namespace trident {

using cuda::bf16;
using cuda::check_malloc;

CudaBackend::CudaBackend(const CudaBackendOptions& options)
    : device_(options.device), attention_(options.attention) {
  TRIDENT_CUDA(cudaSetDevice(device_));
  TRIDENT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  TRIDENT_CUDA(cudaGetDeviceProperties(&prop, device_));
  device_name_ = prop.name;
  sm_ = prop.major * 10 + prop.minor;
  gemm_ = std::make_unique<cuda::LtGemm>();
  TRIDENT_CUDNN(cudnnCreate(&cudnn_));
  TRIDENT_CUDNN(cudnnSetStream(cudnn_, stream_));
  cudnn_attention_ = std::make_unique<cuda::CudnnAttention>(cudnn_);
  TRIDENT_CUDA(cudaMallocHost(&host_double_, sizeof(double)));
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream_);
  cudnn_attention_.reset();
  gemm_.reset();
  if (cudnn_) cudnnDestroy(cudnn_);
  cudaFreeHost(host_double_);
  cudaStreamDestroy(stream_);
}

size_t CudaBackend::free_memory_bytes() const {  // Note [Memory plan]
  size_t free_bytes = 0, total = 0;
  return cudaMemGetInfo(&free_bytes, &total) == cudaSuccess ? free_bytes : 0;
}

void* CudaBackend::allocate(size_t bytes) {
  void* p = nullptr;
  const size_t n = std::max<size_t>(bytes, 256);
  check_malloc(cudaMalloc(&p, n), n, "more", device_name_);
  TRIDENT_CUDA(cudaMemsetAsync(p, 0, n, stream_));
  blocks_[reinterpret_cast<uintptr_t>(p)] = n;
  return p;
}

void CudaBackend::release(void* p) noexcept {
  blocks_.erase(reinterpret_cast<uintptr_t>(p));
  cudaFree(p);
}

// Note [Copies to the host wait]
// Note [Backend memory] promises a copy to host memory has completed on return. The runtime
// waits by itself for pageable memory, not for pinned memory, so every destination outside
// this backend's own allocations is waited for. The backend knows its blocks (a lookup in a
// map, no driver call per copy); device memory from elsewhere is only waited for needlessly.
void CudaBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  TRIDENT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
  if (!owns(dst)) synchronize();
}

bool CudaBackend::owns(const void* p) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = blocks_.upper_bound(a);
  if (it == blocks_.begin()) return false;
  --it;
  return a < it->first + it->second;
}

void CudaBackend::fill_zero(void* p, size_t bytes) {
  if (bytes > 0) TRIDENT_CUDA(cudaMemsetAsync(p, 0, bytes, stream_));
}

void* CudaBackend::allocate_host_snapshot(size_t bytes) {
  return cuda::HostSnapshotCopier::allocate(bytes);
}

void CudaBackend::start_host_snapshot(void* dst, const void* src, size_t bytes) {
  snapshots_.start(dst, src, bytes, stream_);
}

void CudaBackend::push_range(const char* name) {
  nvtxRangePushA(name);
  if (!timing_) return;
  std::string kind(name);
  while (!kind.empty() &&
         (std::isdigit(static_cast<unsigned char>(kind.back())) || kind.back() == ' '))
    kind.pop_back();
  layer_times_.push(std::move(kind), stream_);
}

void CudaBackend::pop_range() {
  layer_times_.pop(stream_);
  nvtxRangePop();
}

std::vector<Backend::DeviceTime> CudaBackend::take_range_times_ms() {
  std::vector<DeviceTime> out = layer_times_.take(stream_);
  for (DeviceTime& t : cast_times_.take(stream_)) out.push_back(t);
  return out;
}

void CudaBackend::encoder_forward(float* out, const int32_t* tokens, const float* wte,
                                  const float* wpe, int B, int T, int C) {
  Op op(*this, "encoder fwd");
  cuda::encoder_forward_cuda(out, tokens, wte, wpe, B, T, C, stream_);
}

void CudaBackend::encoder_backward(float* dwte, float* dwpe, const float* dout,
                                   const int32_t* tokens, int B, int T, int C) {
  Op op(*this, "encoder bwd");
  // The sort's keys, rows and runs (Note [Deterministic dwte]); only dwte needs them.
  void* scratch =
      dwte ? reduce_scratch_.of<char>(cuda::encoder_backward_scratch_bytes(B * T)) : nullptr;
  cuda::encoder_backward_cuda(dwte, dwpe, scratch, dout, tokens, B, T, C, stream_);
}

void CudaBackend::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                    const float* w, const float* b, int N, int C) {
  Op op(*this, "layernorm fwd");
  cuda::layernorm_forward_cuda(out, mean, rstd, inp, w, b, N, C, stream_);
}

void CudaBackend::layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                                     const float* inp, const float* w, const float* mean,
                                     const float* rstd, int N, int C) {
  Op op(*this, "layernorm bwd");
  float* scratch = reduce_scratch_.of<float>(cuda::layernorm_backward_scratch_floats(N, C));
  cuda::layernorm_backward_cuda(dinp, dw, db, scratch, dout, inp, w, mean, rstd, N, C, stream_);
}

void CudaBackend::matmul_forward(float* out, const float* inp, const float* w, const float* bias,
                                 int N, int C, int OC) {
  Op op(*this, "matmul fwd");
  bf16* inp16 = to_bf16(stage_a_, inp, size_t(N) * C);
  bf16* w16 = to_bf16(stage_w_, w, size_t(OC) * C);
  // out[N,OC] = inp[N,C] · w[OC,C]ᵀ + bias
  gemm_->matmul(out, inp16, w16, bias, N, OC, C, false, true, 0.0f, stream_);
}

void CudaBackend::matmul_backward(float* dinp, float* dw, float* dbias, const float* dout,
                                  const float* inp, const float* w, int N, int C, int OC) {
  Op op(*this, "matmul bwd");
  bf16* dout16 = to_bf16(stage_b_, dout, size_t(N) * OC);
  if (dinp) {  // dinp[N,C] = dout[N,OC] · w[OC,C]
    bf16* w16 = to_bf16(stage_w_, w, size_t(OC) * C);
    gemm_->matmul(dinp, dout16, w16, nullptr, N, C, OC, false, false, 0.0f, stream_);
  }
  if (dw) {  // dw[OC,C] += dout[N,OC]ᵀ · inp[N,C]
    bf16* inp16 = to_bf16(stage_a_, inp, size_t(N) * C);
    gemm_->matmul(dw, dout16, inp16, nullptr, OC, C, N, true, false, 1.0f, stream_);
  }
  if (dbias) {
    float* scratch = reduce_scratch_.of<float>(cuda::bias_backward_scratch_floats(N, OC));
    cuda::bias_backward_cuda(dbias, scratch, dout, N, OC, stream_);
  }
}

size_t CudaBackend::attention_saved_floats(int B, int T, int C, int NH) const {
  (void)C;
  return fused_attention_saved_floats(B, T, NH);
}

size_t CudaBackend::attention_scratch_floats(int B, int T, int C, int NH) const {
  return std::max<size_t>(cuda::flash_attention_backward_scratch_floats(B, T, C, NH), 1);
}

void CudaBackend::attention_forward(float* out, float* att, const float* qkv, int B, int T, int C,
                                    int NH) {
  Op op(*this, "attention fwd");
  if (use_cudnn(B, T, C, NH)) {
    bf16* qkv16 = to_bf16(stage_a_, qkv, size_t(B) * T * 3 * C);
    bf16* out16 = stage_b_.of<bf16>(size_t(B) * T * C);
    cudnn_attention_->forward(out16, att, qkv16, B, T, C, NH, stream_);
    to_f32(out, out16, size_t(B) * T * C);
    return;
  }
  cuda::flash_attention_forward_cuda(out, att, qkv, B, T, C, NH, stream_);
}

void CudaBackend::attention_backward(float* dqkv, float* scratch, const float* dout,
                                     const float* qkv, const float* out, const float* att, int B,
                                     int T, int C, int NH) {
  Op op(*this, "attention bwd");
  if (use_cudnn(B, T, C, NH)) {
    const size_t n3 = size_t(B) * T * 3 * C, n1 = size_t(B) * T * C;
    bf16* qkv16 = to_bf16(stage_a_, qkv, n3);
    bf16* out16 = to_bf16(stage_b_, out, n1);
    bf16* dout16 = to_bf16(stage_c_, dout, n1);
    bf16* dqkv16 = stage_d_.of<bf16>(n3);
    cudnn_attention_->backward(dqkv16, dout16, qkv16, out16, att, B, T, C, NH, stream_);
    to_f32(dqkv, dqkv16, n3);
    return;
  }
  cuda::flash_attention_backward_cuda(dqkv, scratch, dout, qkv, out, att, B, T, C, NH, stream_);
}

void CudaBackend::attention_block_forward(const AttentionBlockArgs& a) {
  Op op(*this, "attention block fwd");
  cuda::attention_block_fwd_cuda(a, stream_);
}

void CudaBackend::attention_block_backward(const AttentionBlockArgs& a) {
  Op op(*this, "attention block bwd");
  cuda::attention_block_bwd_cuda(a, stream_);
}

void CudaBackend::attention_block_delta(const AttentionBlockArgs& a) {
  cuda::attention_block_delta_cuda(a, stream_);
}

void CudaBackend::attention_block_reset(const AttentionBlockArgs& a) {
  cuda::attention_block_reset_cuda(a, stream_);
}

void CudaBackend::gelu_forward(float* out, const float* inp, size_t n) {
  Op op(*this, "gelu fwd");
  cuda::gelu_forward_cuda(out, inp, n, stream_);
}

void CudaBackend::gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  Op op(*this, "gelu bwd");
  cuda::gelu_backward_cuda(dinp, inp, dout, n, stream_);
}

void CudaBackend::add(float* out, const float* a, const float* b, size_t n) {
  Op op(*this, "residual add");
  cuda::add_cuda(out, a, b, n, stream_);
}

void CudaBackend::rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N,
                                  int C, float eps) {
  Op op(*this, "rmsnorm fwd");
  cuda::rmsnorm_forward_cuda(out, rstd, inp, w, N, C, eps, stream_);
}

void CudaBackend::rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                                   const float* w, const float* rstd, int N, int C) {
  Op op(*this, "rmsnorm bwd");
  float* scratch = reduce_scratch_.of<float>(cuda::rmsnorm_backward_scratch_floats(N, C));
  cuda::rmsnorm_backward_cuda(dinp, dw, scratch, dout, inp, w, rstd, N, C, stream_);
}

void CudaBackend::rope_forward(float* qkv, const float* cos, const float* sin, int N, int T, int NH,
                               int KVH, int hs, int rot) {
  Op op(*this, "rope fwd");
  cuda::rope_forward_cuda(qkv, cos, sin, N, T, NH, KVH, hs, rot, stream_);
}

void CudaBackend::rope_backward(float* dqkv, const float* cos, const float* sin, int N, int T,
                                int NH, int KVH, int hs, int rot) {
  Op op(*this, "rope bwd");
  cuda::rope_backward_cuda(dqkv, cos, sin, N, T, NH, KVH, hs, rot, stream_);
}

void CudaBackend::swiglu_forward(float* out, const float* inp, int N, int F) {
  Op op(*this, "swiglu fwd");
  cuda::swiglu_forward_cuda(out, inp, N, F, stream_);
}

void CudaBackend::swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) {
  Op op(*this, "swiglu bwd");
  cuda::swiglu_backward_cuda(dinp, inp, dout, N, F, stream_);
}

void CudaBackend::gelu_erf_forward(float* out, const float* inp, size_t n) {
  Op op(*this, "gelu erf fwd");
  cuda::gelu_erf_forward_cuda(out, inp, n, stream_);
}

void CudaBackend::gelu_erf_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  Op op(*this, "gelu erf bwd");
  cuda::gelu_erf_backward_cuda(dinp, inp, dout, n, stream_);
}

void CudaBackend::attention_forward_gqa(float* out, float* att, const float* qkv, int B, int T,
                                        int NH, int KVH, int hs) {
  if (KVH == NH) return attention_forward(out, att, qkv, B, T, NH * hs, NH);
  Op op(*this, "attention fwd");
  if (use_cudnn(B, T, NH, KVH, hs)) {
    const size_t n3 = size_t(B) * T * (NH + 2 * KVH) * hs, n1 = size_t(B) * T * NH * hs;
    bf16* qkv16 = to_bf16(stage_a_, qkv, n3);
    bf16* out16 = stage_b_.of<bf16>(n1);
    cudnn_attention_->forward_gqa(out16, att, qkv16, B, T, NH, KVH, hs, stream_);
    to_f32(out, out16, n1);
    return;
  }
  cuda::flash_attention_forward_gqa_cuda(out, att, qkv, B, T, NH, KVH, hs, stream_);
}

void CudaBackend::attention_backward_gqa(float* dqkv, float* scratch, const float* dout,
                                         const float* qkv, const float* out, const float* att,
                                         int B, int T, int NH, int KVH, int hs) {
  if (KVH == NH) return attention_backward(dqkv, scratch, dout, qkv, out, att, B, T, NH * hs, NH);
  Op op(*this, "attention bwd");
  if (use_cudnn(B, T, NH, KVH, hs)) {
    const size_t n3 = size_t(B) * T * (NH + 2 * KVH) * hs, n1 = size_t(B) * T * NH * hs;
    bf16* qkv16 = to_bf16(stage_a_, qkv, n3);
    bf16* out16 = to_bf16(stage_b_, out, n1);
    bf16* dout16 = to_bf16(stage_c_, dout, n1);
    bf16* dqkv16 = stage_d_.of<bf16>(n3);
    cudnn_attention_->backward_gqa(dqkv16, dout16, qkv16, out16, att, B, T, NH, KVH, hs, stream_);
    to_f32(dqkv, dqkv16, n3);
    return;
  }
  cuda::flash_attention_backward_gqa_cuda(dqkv, scratch, dout, qkv, out, att, B, T, NH, KVH, hs,
                                          stream_);
}

void CudaBackend::crossentropy_forward(float* losses, float* logits_to_probs,
                                       const int32_t* targets, int N, int V, int Vp) {
  Op op(*this, "crossentropy fwd");
  cuda::crossentropy_forward_cuda(losses, logits_to_probs, targets, N, V, Vp, stream_);
}

void CudaBackend::crossentropy_backward(float* probs_to_dlogits, const int32_t* targets,
                                        float dloss, int N, int V, int Vp) {
  Op op(*this, "crossentropy bwd");
  cuda::crossentropy_backward_cuda(probs_to_dlogits, targets, dloss, N, V, Vp, stream_);
}

void CudaBackend::embedding_slice_forward(float* out, const int32_t* tokens, const float* wte_slice,
                                          const float* wpe, int v0, int v1, int B, int T, int C) {
  Op op(*this, "embedding fwd");
  cuda::embedding_slice_forward_cuda(out, tokens, wte_slice, wpe, v0, v1, B, T, C, stream_);
}

void CudaBackend::embedding_slice_backward(float* dwte_slice, float* dwpe, const float* dout,
                                           const int32_t* tokens, int v0, int v1, int B, int T,
                                           int C) {
  Op op(*this, "embedding bwd");
  void* scratch =
      dwte_slice && v1 > v0
          ? reduce_scratch_.of<char>(cuda::embedding_backward_scratch_bytes(B * T, v1 - v0))
          : nullptr;
  cuda::embedding_slice_backward_cuda(dwte_slice, dwpe, scratch, dout, tokens, v0, v1, B, T, C,
                                      stream_);
}

void CudaBackend::crossentropy_slice_stats(float* stats, const float* logits,
                                           const int32_t* targets, int v0, int live, int N,
                                           int Vl) {
  Op op(*this, "crossentropy fwd");
  cuda::crossentropy_slice_stats_cuda(stats, logits, targets, v0, live, N, Vl, stream_);
}

void CudaBackend::crossentropy_slice_combine(float* losses, float* logits_to_probs,
                                             const float* all_stats, int tp, int live, int N,
                                             int Vl) {
  Op op(*this, "crossentropy fwd");
  cuda::crossentropy_slice_combine_cuda(losses, logits_to_probs, all_stats, tp, live, N, Vl,
                                        stream_);
}

void CudaBackend::crossentropy_slice_backward(float* probs, const int32_t* targets, float dloss,
                                              int v0, int N, int Vl) {
  Op op(*this, "crossentropy bwd");
  cuda::crossentropy_slice_backward_cuda(probs, targets, dloss, v0, N, Vl, stream_);
}

void CudaBackend::copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                            size_t row_bytes, size_t rows) {
  Op op(*this, "sequence permute");
  if (rows > 0 && row_bytes > 0)
    TRIDENT_CUDA(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows,
                                   cudaMemcpyDefault, stream_));
}

void CudaBackend::moe_route_forward(float* probs, float* lse, int32_t* top, float* topw,
                                    const float* logits, const float* bias, int N, int E, int k,
                                    bool sigmoid, bool norm_topk) {
  Op op(*this, "moe route fwd");
  cuda::moe_route_forward_cuda(probs, lse, top, topw, logits, bias, N, E, k, sigmoid, norm_topk,
                               stream_);
}

void CudaBackend::moe_permute(int32_t* pos, int32_t* send_token, int32_t* counts, double* sums,
                              int32_t* hf_count, const int32_t* top, const float* probs,
                              const float* lse, int N, int E, int k, int cap) {
  Op op(*this, "moe permute");
  cuda::moe_permute_cuda(pos, send_token, counts, sums, hf_count, top, probs, lse, N, E, k, cap,
                         stream_);
}

void CudaBackend::moe_gather_rows(float* rows, const float* x, const int32_t* send_token, int M,
                                  int C) {
  Op op(*this, "moe permute");
  cuda::moe_gather_rows_cuda(rows, x, send_token, M, C, stream_);
}

void CudaBackend::moe_combine_forward(float* out, const float* ys, const float* shared,
                                      const float* gate, const int32_t* pos, const float* topw,
                                      int N, int C, int k) {
  Op op(*this, "moe combine fwd");
  cuda::moe_combine_forward_cuda(out, ys, shared, gate, pos, topw, N, C, k, stream_);
}

void CudaBackend::moe_combine_backward(float* dys, float* dtopw, const float* dout, const float* ys,
                                       const int32_t* pos, const float* topw, int N, int C, int k) {
  Op op(*this, "moe combine bwd");
  cuda::moe_combine_backward_cuda(dys, dtopw, dout, ys, pos, topw, N, C, k, stream_);
}

void CudaBackend::moe_scatter_add(float* dx, const float* dxs, const int32_t* pos, int N, int C,
                                  int k) {
  Op op(*this, "moe combine bwd");
  cuda::moe_scatter_add_cuda(dx, dxs, pos, N, C, k, stream_);
}

void CudaBackend::moe_route_backward(float* dlogits, const float* dtopw, const float* probs,
                                     const float* lse, const int32_t* top, const float* topw,
                                     const int32_t* aux_count, double aux_num, double aux_den,
                                     double z2, double loss_scale, int N, int E, int k,
                                     bool sigmoid, bool norm_topk) {
  Op op(*this, "moe route bwd");
  cuda::moe_route_backward_cuda(dlogits, dtopw, probs, lse, top, topw, aux_count, aux_num, aux_den,
                                z2, loss_scale, N, E, k, sigmoid, norm_topk, stream_);
}

void CudaBackend::sigmoid_forward(float* out, const float* inp, size_t n) {
  Op op(*this, "moe gate");
  cuda::sigmoid_forward_cuda(out, inp, n, stream_);
}

void CudaBackend::moe_gate_backward(float* dgate, float* dy, const float* dout, const float* y,
                                    const float* gate, int N, int C) {
  Op op(*this, "moe gate");
  cuda::moe_gate_backward_cuda(dgate, dy, dout, y, gate, N, C, stream_);
}

double CudaBackend::sum_squares(const float* x, size_t n) {
  Op op(*this, "grad norm");
  double* result = norm_scratch_.of<double>(1 + cuda::sum_squares_scratch_doubles());
  cuda::sum_squares_cuda(result, result + 1, x, n, stream_);
  TRIDENT_CUDA(
      cudaMemcpyAsync(host_double_, result, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  synchronize();
  return *host_double_;
}

void CudaBackend::add_mean(double* acc, const float* x, size_t n) {
  Op op(*this, "loss sum");
  cuda::add_mean_cuda(acc, x, n, stream_);
}

void CudaBackend::sum_squares_each(const float* const* xs, const size_t* ns, size_t count,
                                   double* out) {
  if (count == 0) return;
  Op op(*this, "grad norm");
  double* results = norm_scratch_.of<double>(count + cuda::sum_squares_scratch_doubles());
  for (size_t i = 0; i < count; ++i)
    cuda::sum_squares_cuda(results + i, results + count, xs[i], ns[i], stream_);
  TRIDENT_CUDA(
      cudaMemcpyAsync(out, results, count * sizeof(double), cudaMemcpyDeviceToHost, stream_));
  synchronize();  // `out` may be pageable: the copy is complete only after this
}

void CudaBackend::adamw_update(float* params, float* m, float* v, const float* grads, size_t n,
                               float lr, float beta1, float beta2, float eps, float weight_decay,
                               int t, float grad_scale) {
  Op op(*this, "adamw");
  cuda::adamw_update_cuda(params, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, t,
                          grad_scale, nullptr, stream_);
}

bf16* CudaBackend::to_bf16(Scratch& stage, const float* x, size_t n) {
  bf16* out = stage.of<bf16>(n);
  CastSpan span(*this);
  cuda::cast_f32_to_bf16_cuda(out, x, n, stream_);
  return out;
}

void CudaBackend::to_f32(float* out, const bf16* x, size_t n) {
  CastSpan span(*this);
  cuda::cast_bf16_to_f32_cuda(out, x, 1.0f, n, stream_);
}

bool CudaBackend::use_cudnn(int B, int T, int C, int NH) {
  return use_cudnn(B, T, NH, NH, NH > 0 && C % NH == 0 ? C / NH : 0);
}

bool CudaBackend::use_cudnn(int B, int T, int NH, int KVH, int HS) {
  return attention_.use_cudnn(*cudnn_attention_, B, T, NH, KVH, HS);
}

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

void* cuda_compute_stream(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  return cuda ? static_cast<void*>(cuda->stream()) : nullptr;
}

}  // namespace trident
