// CudaBackend: the Backend interface on one GPU. Every op is enqueued on one stream (in order,
// asynchronous to the host); the host waits only in synchronize(), sum_squares() and the
// copies that return data to it.
//
// Note [Mixed precision]
// With fp32 precision, activations, gradients, master weights and AdamW moments are fp32 in
// memory, as the Backend interface is, so the model code is the same on both backends. The
// tensor-core work runs in bf16: each GEMM casts its inputs to bf16 staging buffers and
// accumulates in fp32 into an fp32 output (cuBLASLt), and cuDNN's fused attention takes bf16
// q, k, v. The casts cost memory traffic (about 6 bytes per element cast).
//
// run.precision bf16 is the other design (Note [bf16 activations] in src/backend/bf16_ops.cpp):
// the *_bf16 ops below read and write bf16 activations with no cast pass.
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
namespace {

using cuda::bf16;

using cuda::check_malloc;
using cuda::EventPool;
using cuda::Scratch;
using cuda::SpanTimer;

class CudaBackend final : public Backend {
  // One op: an NVTX range, and its device time when op timing is on.
  struct Op {
    Op(CudaBackend& be, const char* name) : be_(be), timed_(be.timing_) {
      nvtxRangePushA(name);
      if (timed_) be_.op_times_.push(name, be_.stream_);
    }
    ~Op() {
      if (timed_) be_.op_times_.pop(be_.stream_);
      nvtxRangePop();
    }
    CudaBackend& be_;
    bool timed_;
  };

 public:
  explicit CudaBackend(const CudaBackendOptions& options)
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
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    cudnn_attention_.reset();
    gemm_.reset();
    if (cudnn_) cudnnDestroy(cudnn_);
    cudaFreeHost(host_double_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda"; }
  int threads() const override { return 1; }
  bool is_device() const override { return true; }
  cudaStream_t stream() const { return stream_; }
  size_t free_memory_bytes() const override {  // Note [Memory plan]
    size_t free_bytes = 0, total = 0;
    return cudaMemGetInfo(&free_bytes, &total) == cudaSuccess ? free_bytes : 0;
  }

  // --- memory (Note [Backend memory]) ---------------------------------------------------
  // Plain device memory, not managed memory: a model too large for the GPU fails here with a
  // message instead of oversubscribing (which pages to the host and can stall the GPU).
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    const size_t n = std::max<size_t>(bytes, 256);
    check_malloc(cudaMalloc(&p, n), n, "more", device_name_);
    TRIDENT_CUDA(cudaMemsetAsync(p, 0, n, stream_));
    blocks_[reinterpret_cast<uintptr_t>(p)] = n;
    return p;
  }
  void release(void* p) noexcept override {
    blocks_.erase(reinterpret_cast<uintptr_t>(p));
    cudaFree(p);
  }
  // Note [Copies to the host wait]
  // Note [Backend memory] promises a copy to host memory has completed on return. The runtime
  // waits by itself for pageable memory, not for pinned memory, so every destination outside
  // this backend's own allocations is waited for. The backend knows its blocks (a lookup in a
  // map, no driver call per copy); device memory from elsewhere is only waited for needlessly.
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    TRIDENT_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
    if (!owns(dst)) synchronize();
  }
  bool owns(const void* p) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = blocks_.upper_bound(a);
    if (it == blocks_.begin()) return false;
    --it;
    return a < it->first + it->second;
  }
  void fill_zero(void* p, size_t bytes) override {
    if (bytes > 0) TRIDENT_CUDA(cudaMemsetAsync(p, 0, bytes, stream_));
  }
  void synchronize() override { TRIDENT_CUDA(cudaStreamSynchronize(stream_)); }

  // Note [Snapshots to the host], on a copy stream: Note [Pinned snapshot copies].
  void* allocate_host_snapshot(size_t bytes) override {
    return cuda::HostSnapshotCopier::allocate(bytes);
  }
  void release_host_snapshot(void* p) noexcept override { cuda::HostSnapshotCopier::release(p); }
  void start_host_snapshot(void* dst, const void* src, size_t bytes) override {
    snapshots_.start(dst, src, bytes, stream_);
  }
  void finish_host_snapshot() override { snapshots_.finish(); }
  // A layer phase ("forward block 3"): an NVTX range, and with op timing on its device time,
  // summed per kind of layer (the name without its block number).
  void push_range(const char* name) override {
    nvtxRangePushA(name);
    if (!timing_) return;
    std::string kind(name);
    while (!kind.empty() &&
           (std::isdigit(static_cast<unsigned char>(kind.back())) || kind.back() == ' '))
      kind.pop_back();
    layer_times_.push(std::move(kind), stream_);
  }
  void pop_range() override {
    layer_times_.pop(stream_);
    nvtxRangePop();
  }
  void set_op_timing(bool on) override { timing_ = on; }
  std::vector<DeviceTime> take_op_times_ms() override { return op_times_.take(stream_); }
  // The layer phases, then one row for the fp32 -> bf16 casts (and the two bf16 -> fp32 ones
  // after cuDNN's attention): device time inside the ops above, which the bf16 path removes.
  std::vector<DeviceTime> take_range_times_ms() override {
    std::vector<DeviceTime> out = layer_times_.take(stream_);
    for (DeviceTime& t : cast_times_.take(stream_)) out.push_back(t);
    return out;
  }

  // --- layers ---------------------------------------------------------------------------
  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C) override {
    Op op(*this, "encoder fwd");
    cuda::encoder_forward_cuda(out, tokens, wte, wpe, B, T, C, stream_);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C) override {
    Op op(*this, "encoder bwd");
    // The sort's keys, rows and runs (Note [Deterministic dwte]); only dwte needs them.
    void* scratch =
        dwte ? reduce_scratch_.of<char>(cuda::encoder_backward_scratch_bytes(B * T)) : nullptr;
    cuda::encoder_backward_cuda(dwte, dwpe, scratch, dout, tokens, B, T, C, stream_);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C) override {
    Op op(*this, "layernorm fwd");
    cuda::layernorm_forward_cuda(out, mean, rstd, inp, w, b, N, C, stream_);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) override {
    Op op(*this, "layernorm bwd");
    float* scratch = reduce_scratch_.of<float>(cuda::layernorm_backward_scratch_floats(N, C));
    cuda::layernorm_backward_cuda(dinp, dw, db, scratch, dout, inp, w, mean, rstd, N, C, stream_);
  }

  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C,
                      int OC) override {
    Op op(*this, "matmul fwd");
    bf16* inp16 = to_bf16(stage_a_, inp, size_t(N) * C);
    bf16* w16 = to_bf16(stage_w_, w, size_t(OC) * C);
    // out[N,OC] = inp[N,C] · w[OC,C]ᵀ + bias
    gemm_->matmul(out, inp16, w16, bias, N, OC, C, false, true, 0.0f, stream_);
  }
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                       const float* w, int N, int C, int OC) override {
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

  // Attention state (Note [Backend memory]): both paths save only the per-row log-sum-exp
  // [B,NH,T]; backward takes the forward output from the model.
  size_t attention_saved_floats(int B, int T, int C, int NH) const override {
    (void)C;
    return fused_attention_saved_floats(B, T, NH);
  }
  size_t attention_scratch_floats(int B, int T, int C, int NH) const override {
    return std::max<size_t>(cuda::flash_attention_backward_scratch_floats(B, T, C, NH), 1);
  }
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C,
                         int NH) override {
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
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                          const float* out, const float* att, int B, int T, int C,
                          int NH) override {
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
  // Attention by blocks (Note [Attention blocks]): context parallelism's ring, fp32.
  void attention_block_forward(const AttentionBlockArgs& a) override {
    Op op(*this, "attention block fwd");
    cuda::attention_block_fwd_cuda(a, stream_);
  }
  void attention_block_backward(const AttentionBlockArgs& a) override {
    Op op(*this, "attention block bwd");
    cuda::attention_block_bwd_cuda(a, stream_);
  }
  void attention_block_delta(const AttentionBlockArgs& a) override {
    cuda::attention_block_delta_cuda(a, stream_);
  }
  void attention_block_reset(const AttentionBlockArgs& a) override {
    cuda::attention_block_reset_cuda(a, stream_);
  }

  void gelu_forward(float* out, const float* inp, size_t n) override {
    Op op(*this, "gelu fwd");
    cuda::gelu_forward_cuda(out, inp, n, stream_);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) override {
    Op op(*this, "gelu bwd");
    cuda::gelu_backward_cuda(dinp, inp, dout, n, stream_);
  }
  void add(float* out, const float* a, const float* b, size_t n) override {
    Op op(*this, "residual add");
    cuda::add_cuda(out, a, b, n, stream_);
  }
  // --- model families (Note [Block shapes] in trident/model_config.h) --------------------
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                       float eps) override {
    Op op(*this, "rmsnorm fwd");
    cuda::rmsnorm_forward_cuda(out, rstd, inp, w, N, C, eps, stream_);
  }
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                        const float* rstd, int N, int C) override {
    Op op(*this, "rmsnorm bwd");
    float* scratch = reduce_scratch_.of<float>(cuda::rmsnorm_backward_scratch_floats(N, C));
    cuda::rmsnorm_backward_cuda(dinp, dw, scratch, dout, inp, w, rstd, N, C, stream_);
  }
  void rope_forward(float* qkv, const float* cos, const float* sin, int N, int T, int NH, int KVH,
                    int hs, int rot) override {
    Op op(*this, "rope fwd");
    cuda::rope_forward_cuda(qkv, cos, sin, N, T, NH, KVH, hs, rot, stream_);
  }
  void rope_backward(float* dqkv, const float* cos, const float* sin, int N, int T, int NH, int KVH,
                     int hs, int rot) override {
    Op op(*this, "rope bwd");
    cuda::rope_backward_cuda(dqkv, cos, sin, N, T, NH, KVH, hs, rot, stream_);
  }
  void swiglu_forward(float* out, const float* inp, int N, int F) override {
    Op op(*this, "swiglu fwd");
    cuda::swiglu_forward_cuda(out, inp, N, F, stream_);
  }
  void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) override {
    Op op(*this, "swiglu bwd");
    cuda::swiglu_backward_cuda(dinp, inp, dout, N, F, stream_);
  }
  void gelu_erf_forward(float* out, const float* inp, size_t n) override {
    Op op(*this, "gelu erf fwd");
    cuda::gelu_erf_forward_cuda(out, inp, n, stream_);
  }
  void gelu_erf_backward(float* dinp, const float* inp, const float* dout, size_t n) override {
    Op op(*this, "gelu erf bwd");
    cuda::gelu_erf_backward_cuda(dinp, inp, dout, n, stream_);
  }
  // Grouped-query attention: with KVH = NH the multi-head ops above (their plans and notes);
  // else the same two paths with K and V of KVH heads. The saved lse and the scratch are the
  // multi-head sizes with C = NH·hs (attention_saved_floats, attention_scratch_floats).
  void attention_forward_gqa(float* out, float* att, const float* qkv, int B, int T, int NH,
                             int KVH, int hs) override {
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
  void attention_backward_gqa(float* dqkv, float* scratch, const float* dout, const float* qkv,
                              const float* out, const float* att, int B, int T, int NH, int KVH,
                              int hs) override {
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

  void crossentropy_forward(float* losses, float* logits_to_probs, const int32_t* targets, int N,
                            int V, int Vp) override {
    Op op(*this, "crossentropy fwd");
    cuda::crossentropy_forward_cuda(losses, logits_to_probs, targets, N, V, Vp, stream_);
  }
  void crossentropy_backward(float* probs_to_dlogits, const int32_t* targets, float dloss, int N,
                             int V, int Vp) override {
    Op op(*this, "crossentropy bwd");
    cuda::crossentropy_backward_cuda(probs_to_dlogits, targets, dloss, N, V, Vp, stream_);
  }

  // --- bf16 activations (Note [bf16 activations] in src/backend/bf16_ops.cpp) -------------
  // Native: every GEMM reads its bf16 operands as they are (no cast pass) and writes a bf16 D
  // or adds into fp32; the row and elementwise kernels read and write bf16 directly. The op
  // kinds are the fp32 ops' names, so the op-time table compares the two paths.
  static_assert(sizeof(bfloat16) == sizeof(bf16) && alignof(bfloat16) <= alignof(bf16),
                "trident::bfloat16 has __nv_bfloat16's layout (trident/bfloat16.h)");
  static bf16* dev(bfloat16* p) { return reinterpret_cast<bf16*>(p); }
  static const bf16* dev(const bfloat16* p) { return reinterpret_cast<const bf16*>(p); }
  // The bf16 rounding of the attention fallback's fp32 outputs (timed with the casts).
  void into_bf16(bf16* out, const float* x, size_t n) {
    CastSpan span(*this);
    cuda::cast_f32_to_bf16_cuda(out, x, n, stream_);
  }

  void cast_to_bf16(bfloat16* out, const float* inp, size_t n) override {
    Op op(*this, "cast bf16");
    cuda::cast_f32_to_bf16_cuda(dev(out), inp, n, stream_);
  }
  void cast_to_fp32(float* out, const bfloat16* inp, size_t n) override {
    Op op(*this, "cast fp32");
    cuda::cast_bf16_to_f32_cuda(out, dev(inp), 1.0f, n, stream_);
  }
  void adamw_update_bf16(float* params, bfloat16* params16, float* m, float* v, const float* grads,
                         size_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, int t, float grad_scale) override {
    Op op(*this, "adamw");
    cuda::adamw_update_cuda(params, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, t,
                            grad_scale, dev(params16), stream_);
  }
  void layernorm_forward_bf16(bfloat16* out, float* mean, float* rstd, const float* inp,
                              const float* w, const float* b, int N, int C) override {
    Op op(*this, "layernorm fwd");
    cuda::layernorm_forward_bf16_cuda(dev(out), mean, rstd, inp, w, b, N, C, stream_);
  }
  void layernorm_backward_add_bf16(float* dresidual, bfloat16* dresidual16, float* dw, float* db,
                                   const bfloat16* dout, const float* inp, const float* w,
                                   const float* mean, const float* rstd, int N, int C) override {
    Op op(*this, "layernorm bwd");
    float* scratch = reduce_scratch_.of<float>(cuda::layernorm_backward_scratch_floats(N, C));
    cuda::layernorm_backward_add_bf16_cuda(dresidual, dev(dresidual16), dw, db, scratch, dev(dout),
                                           inp, w, mean, rstd, N, C, stream_);
  }
  void matmul_forward_bf16(bfloat16* out, const bfloat16* inp, const bfloat16* w, const float* bias,
                           int N, int C, int OC) override {
    Op op(*this, "matmul fwd");
    // out[N,OC] = bf16(inp[N,C] · w[OC,C]ᵀ + bias)
    gemm_->matmul_bf16(dev(out), dev(inp), dev(w), bias, N, OC, C, false, true, stream_);
  }
  void matmul_forward_add_bf16(float* out, const float* residual, const bfloat16* inp,
                               const bfloat16* w, const float* bias, int N, int C,
                               int OC) override {
    Op op(*this, "matmul fwd");
    // out[N,OC] = residual + inp[N,C] · w[OC,C]ᵀ + bias: the residual is cuBLASLt's C; without
    // one, beta 0 and an fp32 D (a row-parallel partial sum: Note [bf16 with tp])
    if (!residual) gemm_->matmul(out, dev(inp), dev(w), bias, N, OC, C, false, true, 0.0f, stream_);
    else gemm_->matmul_add(out, residual, dev(inp), dev(w), bias, N, OC, C, false, true, stream_);
  }
  void matmul_backward_input_fp32_bf16(float* dinp, const bfloat16* dout, const bfloat16* w, int N,
                                       int C, int OC) override {
    Op op(*this, "matmul bwd");
    if (N == 0) return;  // dinp[N,C] = dout[N,OC] · w[OC,C], fp32 D (D's layout type)
    gemm_->matmul(dinp, dev(dout), dev(w), nullptr, N, C, OC, false, false, 0.0f, stream_);
  }
  void matmul_backward_bf16(bfloat16* dinp, float* dw, float* dbias, const bfloat16* dout,
                            const bfloat16* inp, const bfloat16* w, int N, int C, int OC) override {
    Op op(*this, "matmul bwd");
    if (N == 0) return;  // dinp has no rows and dw, dbias gain nothing
    if (dinp)            // dinp[N,C] = bf16(dout[N,OC] · w[OC,C])
      gemm_->matmul_bf16(dev(dinp), dev(dout), dev(w), nullptr, N, C, OC, false, false, stream_);
    if (dw && dbias) {
      // dw[OC,C] += dout[N,OC]ᵀ · inp[N,C] and Σ_n dout in the same pass over dout (BGRADB;
      // Note [cuBLASLt epilogues]): cuBLASLt writes the sums, they are added here.
      float* sums = reduce_scratch_.of<float>(size_t(OC));
      if (gemm_->matmul_bgrad_a(dw, sums, dev(dout), dev(inp), OC, C, N, true, false, 1.0f,
                                stream_)) {
        cuda::add_cuda(dbias, dbias, sums, size_t(OC), stream_);
        return;
      }
    }
    if (dw)  // dw[OC,C] += dout[N,OC]ᵀ · inp[N,C]
      gemm_->matmul(dw, dev(dout), dev(inp), nullptr, OC, C, N, true, false, 1.0f, stream_);
    if (dbias) {
      float* scratch = reduce_scratch_.of<float>(cuda::bias_backward_scratch_floats(N, OC));
      cuda::bias_backward_bf16_cuda(dbias, scratch, dev(dout), N, OC, stream_);
    }
  }
  // The GELU in the GEMM's epilogue (Note [cuBLASLt epilogues]); where cuBLASLt has none for
  // the shape, the GEMM and the GELU kernel (the GELU then reads the rounded pre-activation).
  void matmul_gelu_forward_bf16(bfloat16* out, bfloat16* pre, const bfloat16* inp,
                                const bfloat16* w, const float* bias, int N, int C,
                                int OC) override {
    Op op(*this, "matmul fwd");
    if (N == 0) return;
    // out, pre [N,OC] from inp[N,C] · w[OC,C]ᵀ + bias
    if (gemm_->matmul_gelu_bf16(dev(out), dev(pre), dev(inp), dev(w), bias, N, OC, C, false, true,
                                stream_))
      return;
    gemm_->matmul_bf16(dev(pre), dev(inp), dev(w), bias, N, OC, C, false, true, stream_);
    cuda::gelu_forward_bf16_cuda(dev(out), dev(pre), size_t(N) * OC, stream_);
  }
  void matmul_dgelu_backward_bf16(bfloat16* dpre, float* dbias, const bfloat16* dout,
                                  const bfloat16* w, const bfloat16* pre, int N, int C,
                                  int OC) override {
    Op op(*this, "matmul bwd");
    if (N == 0) return;
    // dpre[N,C] = bf16(gelu'(pre) ⊙ dout[N,OC] · w[OC,C]); cuBLASLt writes the bias sums.
    if (dbias) {
      float* sums = reduce_scratch_.of<float>(size_t(C));
      if (gemm_->matmul_dgelu_bf16(dev(dpre), sums, dev(dout), dev(w), dev(pre), N, C, OC, false,
                                   false, stream_)) {
        cuda::add_cuda(dbias, dbias, sums, size_t(C), stream_);
        return;
      }
    }
    // Where cuBLASLt takes no fp32 bias gradient with a bf16 D (Note [cuBLASLt epilogues]):
    // DGELU alone, and the bias gradient summed from dpre, as the unfused path sums it.
    if (gemm_->matmul_dgelu_bf16(dev(dpre), nullptr, dev(dout), dev(w), dev(pre), N, C, OC, false,
                                 false, stream_)) {
      if (dbias) {
        float* scratch = reduce_scratch_.of<float>(cuda::bias_backward_scratch_floats(N, C));
        cuda::bias_backward_bf16_cuda(dbias, scratch, dev(dpre), N, C, stream_);
      }
      return;
    }
    bf16* product = stage_a_.of<bf16>(size_t(N) * C);
    gemm_->matmul_bf16(product, dev(dout), dev(w), nullptr, N, C, OC, false, false, stream_);
    cuda::gelu_backward_bf16_cuda(dev(dpre), dev(pre), product, size_t(N) * C, stream_);
    if (dbias) {
      float* scratch = reduce_scratch_.of<float>(cuda::bias_backward_scratch_floats(N, C));
      cuda::bias_backward_bf16_cuda(dbias, scratch, dev(dpre), N, C, stream_);
    }
  }
  // cuDNN's fused attention takes bf16 q|k|v and writes bf16 outputs: the tensors as they are.
  // Where it has no plan for the shape (or run.attention is flash), the fp32 flash kernel on
  // widened copies, its outputs rounded once: the op's definition, at the cost of the casts.
  void attention_forward_bf16(bfloat16* out, float* att, const bfloat16* qkv, int B, int T, int C,
                              int NH) override {
    Op op(*this, "attention fwd");
    if (use_cudnn(B, T, C, NH)) {
      cudnn_attention_->forward(dev(out), att, dev(qkv), B, T, C, NH, stream_);
      return;
    }
    const size_t n3 = size_t(B) * T * 3 * C, n1 = size_t(B) * T * C;
    float* qkv32 = stage_a_.of<float>(n3);
    float* out32 = stage_b_.of<float>(n1);
    to_f32(qkv32, dev(qkv), n3);
    cuda::flash_attention_forward_cuda(out32, att, qkv32, B, T, C, NH, stream_);
    into_bf16(dev(out), out32, n1);
  }
  void attention_backward_bf16(bfloat16* dqkv, float* scratch, const bfloat16* dout,
                               const bfloat16* qkv, const bfloat16* out, const float* att, int B,
                               int T, int C, int NH) override {
    Op op(*this, "attention bwd");
    if (use_cudnn(B, T, C, NH)) {
      cudnn_attention_->backward(dev(dqkv), dev(dout), dev(qkv), dev(out), att, B, T, C, NH,
                                 stream_);
      return;
    }
    const size_t n3 = size_t(B) * T * 3 * C, n1 = size_t(B) * T * C;
    float* qkv32 = stage_a_.of<float>(n3);
    float* out32 = stage_b_.of<float>(n1);
    float* dout32 = stage_c_.of<float>(n1);
    float* dqkv32 = stage_d_.of<float>(n3);
    to_f32(qkv32, dev(qkv), n3);
    to_f32(out32, dev(out), n1);
    to_f32(dout32, dev(dout), n1);
    cuda::flash_attention_backward_cuda(dqkv32, scratch, dout32, qkv32, out32, att, B, T, C, NH,
                                        stream_);
    into_bf16(dev(dqkv), dqkv32, n3);
  }
  void gelu_forward_bf16(bfloat16* out, const bfloat16* inp, size_t n) override {
    Op op(*this, "gelu fwd");
    cuda::gelu_forward_bf16_cuda(dev(out), dev(inp), n, stream_);
  }
  void gelu_backward_bf16(bfloat16* dinp, const bfloat16* inp, const bfloat16* dout,
                          size_t n) override {
    Op op(*this, "gelu bwd");
    cuda::gelu_backward_bf16_cuda(dev(dinp), dev(inp), dev(dout), n, stream_);
  }
  // The families' bf16 ops: the fp32 kernels instantiated on bf16 (kernels/rmsnorm.cu, rope.cu,
  // swiglu.cu, elementwise.cu); CPU twins in bf16_family_ops.cpp.
  bool has_bf16_family_ops() const override { return true; }
  void rmsnorm_forward_bf16(bfloat16* out, float* rstd, const float* inp, const float* w, int N,
                            int C, float eps) override {
    Op op(*this, "rmsnorm fwd");
    cuda::rmsnorm_forward_bf16_cuda(dev(out), rstd, inp, w, N, C, eps, stream_);
  }
  void rmsnorm_backward_add_bf16(float* dresidual, bfloat16* dresidual16, float* dw,
                                 const bfloat16* dout, const float* inp, const float* w,
                                 const float* rstd, int N, int C) override {
    Op op(*this, "rmsnorm bwd");
    float* scratch = reduce_scratch_.of<float>(cuda::rmsnorm_backward_scratch_floats(N, C));
    cuda::rmsnorm_backward_add_bf16_cuda(dresidual, dev(dresidual16), dw, scratch, dev(dout), inp,
                                         w, rstd, N, C, stream_);
  }
  void rope_forward_bf16(bfloat16* qkv, const float* cos, const float* sin, int N, int T, int NH,
                         int KVH, int hs, int rot) override {
    Op op(*this, "rope fwd");
    cuda::rope_forward_bf16_cuda(dev(qkv), cos, sin, N, T, NH, KVH, hs, rot, stream_);
  }
  void rope_backward_bf16(bfloat16* dqkv, const float* cos, const float* sin, int N, int T, int NH,
                          int KVH, int hs, int rot) override {
    Op op(*this, "rope bwd");
    cuda::rope_backward_bf16_cuda(dev(dqkv), cos, sin, N, T, NH, KVH, hs, rot, stream_);
  }
  void swiglu_forward_bf16(bfloat16* out, const bfloat16* inp, int N, int F) override {
    Op op(*this, "swiglu fwd");
    cuda::swiglu_forward_bf16_cuda(dev(out), dev(inp), N, F, stream_);
  }
  void swiglu_backward_bf16(bfloat16* dinp, const bfloat16* inp, const bfloat16* dout, int N,
                            int F) override {
    Op op(*this, "swiglu bwd");
    cuda::swiglu_backward_bf16_cuda(dev(dinp), dev(inp), dev(dout), N, F, stream_);
  }
  void gelu_erf_forward_bf16(bfloat16* out, const bfloat16* inp, size_t n) override {
    Op op(*this, "gelu erf fwd");
    cuda::gelu_erf_forward_bf16_cuda(dev(out), dev(inp), n, stream_);
  }
  void gelu_erf_backward_bf16(bfloat16* dinp, const bfloat16* inp, const bfloat16* dout,
                              size_t n) override {
    Op op(*this, "gelu erf bwd");
    cuda::gelu_erf_backward_bf16_cuda(dev(dinp), dev(inp), dev(dout), n, stream_);
  }
  // Grouped-query attention on bf16 q|k|v: cuDNN's graph with K and V of KVH heads on the
  // tensors as they are, else the fp32 flash kernel on widened copies (as the multi-head op).
  void attention_forward_gqa_bf16(bfloat16* out, float* att, const bfloat16* qkv, int B, int T,
                                  int NH, int KVH, int hs) override {
    if (KVH == NH) return attention_forward_bf16(out, att, qkv, B, T, NH * hs, NH);
    Op op(*this, "attention fwd");
    if (use_cudnn(B, T, NH, KVH, hs))
      return cudnn_attention_->forward_gqa(dev(out), att, dev(qkv), B, T, NH, KVH, hs, stream_);
    const size_t n3 = size_t(B) * T * (NH + 2 * KVH) * hs, n1 = size_t(B) * T * NH * hs;
    float *qkv32 = stage_a_.of<float>(n3), *out32 = stage_b_.of<float>(n1);
    to_f32(qkv32, dev(qkv), n3);
    cuda::flash_attention_forward_gqa_cuda(out32, att, qkv32, B, T, NH, KVH, hs, stream_);
    into_bf16(dev(out), out32, n1);
  }
  void attention_backward_gqa_bf16(bfloat16* dqkv, float* scratch, const bfloat16* dout,
                                   const bfloat16* qkv, const bfloat16* out, const float* att,
                                   int B, int T, int NH, int KVH, int hs) override {
    if (KVH == NH)
      return attention_backward_bf16(dqkv, scratch, dout, qkv, out, att, B, T, NH * hs, NH);
    Op op(*this, "attention bwd");
    if (use_cudnn(B, T, NH, KVH, hs))
      return cudnn_attention_->backward_gqa(dev(dqkv), dev(dout), dev(qkv), dev(out), att, B, T, NH,
                                            KVH, hs, stream_);
    const size_t n3 = size_t(B) * T * (NH + 2 * KVH) * hs, n1 = size_t(B) * T * NH * hs;
    float *qkv32 = stage_a_.of<float>(n3), *out32 = stage_b_.of<float>(n1);
    float *dout32 = stage_c_.of<float>(n1), *dqkv32 = stage_d_.of<float>(n3);
    to_f32(qkv32, dev(qkv), n3);
    to_f32(out32, dev(out), n1);
    to_f32(dout32, dev(dout), n1);
    cuda::flash_attention_backward_gqa_cuda(dqkv32, scratch, dout32, qkv32, out32, att, B, T, NH,
                                            KVH, hs, stream_);
    into_bf16(dev(dqkv), dqkv32, n3);
  }
  // Forward and backward of the loss in one kernel: timed as the forward, its larger half.
  void crossentropy_fused_bf16(float* losses, bfloat16* logits_to_dlogits, const int32_t* targets,
                               float dloss, int N, int V, int Vp) override {
    Op op(*this, "crossentropy fwd");
    cuda::crossentropy_fused_bf16_cuda(losses, dev(logits_to_dlogits), targets, dloss, N, V, Vp,
                                       stream_);
  }

  // --- tensor parallelism (Note [Vocab-parallel ops]) -------------------------------------
  void embedding_slice_forward(float* out, const int32_t* tokens, const float* wte_slice,
                               const float* wpe, int v0, int v1, int B, int T, int C) override {
    Op op(*this, "embedding fwd");
    cuda::embedding_slice_forward_cuda(out, tokens, wte_slice, wpe, v0, v1, B, T, C, stream_);
  }
  void embedding_slice_backward(float* dwte_slice, float* dwpe, const float* dout,
                                const int32_t* tokens, int v0, int v1, int B, int T,
                                int C) override {
    Op op(*this, "embedding bwd");
    void* scratch =
        dwte_slice && v1 > v0
            ? reduce_scratch_.of<char>(cuda::embedding_backward_scratch_bytes(B * T, v1 - v0))
            : nullptr;
    cuda::embedding_slice_backward_cuda(dwte_slice, dwpe, scratch, dout, tokens, v0, v1, B, T, C,
                                        stream_);
  }
  void crossentropy_slice_stats(float* stats, const float* logits, const int32_t* targets, int v0,
                                int live, int N, int Vl) override {
    Op op(*this, "crossentropy fwd");
    cuda::crossentropy_slice_stats_cuda(stats, logits, targets, v0, live, N, Vl, stream_);
  }
  void crossentropy_slice_combine(float* losses, float* logits_to_probs, const float* all_stats,
                                  int tp, int live, int N, int Vl) override {
    Op op(*this, "crossentropy fwd");
    cuda::crossentropy_slice_combine_cuda(losses, logits_to_probs, all_stats, tp, live, N, Vl,
                                          stream_);
  }
  void crossentropy_slice_backward(float* probs, const int32_t* targets, float dloss, int v0, int N,
                                   int Vl) override {
    Op op(*this, "crossentropy bwd");
    cuda::crossentropy_slice_backward_cuda(probs, targets, dloss, v0, N, Vl, stream_);
  }
  void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
                 size_t rows) override {
    Op op(*this, "sequence permute");
    if (rows > 0 && row_bytes > 0)
      TRIDENT_CUDA(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows,
                                     cudaMemcpyDefault, stream_));
  }

  // --- the mixture of experts (kernels/moe.cu; Note [Mixture ops]) ----------------------
  void moe_route_forward(float* probs, float* lse, int32_t* top, float* topw, const float* logits,
                         const float* bias, int N, int E, int k, bool sigmoid,
                         bool norm_topk) override {
    Op op(*this, "moe route fwd");
    cuda::moe_route_forward_cuda(probs, lse, top, topw, logits, bias, N, E, k, sigmoid, norm_topk,
                                 stream_);
  }
  void moe_permute(int32_t* pos, int32_t* send_token, int32_t* counts, double* sums,
                   int32_t* hf_count, const int32_t* top, const float* probs, const float* lse,
                   int N, int E, int k, int cap) override {
    Op op(*this, "moe permute");
    cuda::moe_permute_cuda(pos, send_token, counts, sums, hf_count, top, probs, lse, N, E, k, cap,
                           stream_);
  }
  void moe_gather_rows(float* rows, const float* x, const int32_t* send_token, int M,
                       int C) override {
    Op op(*this, "moe permute");
    cuda::moe_gather_rows_cuda(rows, x, send_token, M, C, stream_);
  }
  void moe_combine_forward(float* out, const float* ys, const float* shared, const float* gate,
                           const int32_t* pos, const float* topw, int N, int C, int k) override {
    Op op(*this, "moe combine fwd");
    cuda::moe_combine_forward_cuda(out, ys, shared, gate, pos, topw, N, C, k, stream_);
  }
  void moe_combine_backward(float* dys, float* dtopw, const float* dout, const float* ys,
                            const int32_t* pos, const float* topw, int N, int C, int k) override {
    Op op(*this, "moe combine bwd");
    cuda::moe_combine_backward_cuda(dys, dtopw, dout, ys, pos, topw, N, C, k, stream_);
  }
  void moe_scatter_add(float* dx, const float* dxs, const int32_t* pos, int N, int C,
                       int k) override {
    Op op(*this, "moe combine bwd");
    cuda::moe_scatter_add_cuda(dx, dxs, pos, N, C, k, stream_);
  }
  void moe_route_backward(float* dlogits, const float* dtopw, const float* probs, const float* lse,
                          const int32_t* top, const float* topw, const int32_t* aux_count,
                          double aux_num, double aux_den, double z2, double loss_scale, int N,
                          int E, int k, bool sigmoid, bool norm_topk) override {
    Op op(*this, "moe route bwd");
    cuda::moe_route_backward_cuda(dlogits, dtopw, probs, lse, top, topw, aux_count, aux_num,
                                  aux_den, z2, loss_scale, N, E, k, sigmoid, norm_topk, stream_);
  }
  void sigmoid_forward(float* out, const float* inp, size_t n) override {
    Op op(*this, "moe gate");
    cuda::sigmoid_forward_cuda(out, inp, n, stream_);
  }
  void moe_gate_backward(float* dgate, float* dy, const float* dout, const float* y,
                         const float* gate, int N, int C) override {
    Op op(*this, "moe gate");
    cuda::moe_gate_backward_cuda(dgate, dy, dout, y, gate, N, C, stream_);
  }

  // --- optimizer side -------------------------------------------------------------------
  double sum_squares(const float* x, size_t n) override {
    Op op(*this, "grad norm");
    double* result = norm_scratch_.of<double>(1 + cuda::sum_squares_scratch_doubles());
    cuda::sum_squares_cuda(result, result + 1, x, n, stream_);
    TRIDENT_CUDA(
        cudaMemcpyAsync(host_double_, result, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    synchronize();
    return *host_double_;
  }
  void add_mean(double* acc, const float* x, size_t n) override {
    Op op(*this, "loss sum");
    cuda::add_mean_cuda(acc, x, n, stream_);
  }
  // Each sum into its own device double, then one copy of them all and one wait.
  void sum_squares_each(const float* const* xs, const size_t* ns, size_t count,
                        double* out) override {
    if (count == 0) return;
    Op op(*this, "grad norm");
    double* results = norm_scratch_.of<double>(count + cuda::sum_squares_scratch_doubles());
    for (size_t i = 0; i < count; ++i)
      cuda::sum_squares_cuda(results + i, results + count, xs[i], ns[i], stream_);
    TRIDENT_CUDA(
        cudaMemcpyAsync(out, results, count * sizeof(double), cudaMemcpyDeviceToHost, stream_));
    synchronize();  // `out` may be pageable: the copy is complete only after this
  }
  void adamw_update(float* params, float* m, float* v, const float* grads, size_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, int t,
                    float grad_scale) override {
    Op op(*this, "adamw");
    cuda::adamw_update_cuda(params, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, t,
                            grad_scale, nullptr, stream_);
  }

  double measure_gemm_peak_flops() override { return gemm_->measure_peak_flops(stream_); }
  // H100/H200 (sm_90) SXM: 989 TFLOP/s dense bf16.
  double nominal_peak_flops() const override { return sm_ == 90 ? 989e12 : 0.0; }

 private:
  // A cast's device time when op timing is on (take_range_times_ms), nested in its op's.
  struct CastSpan {
    explicit CastSpan(CudaBackend& be) : be_(be), timed_(be.timing_) {
      if (timed_) be_.cast_times_.push("casts (within the ops)", be_.stream_);
    }
    ~CastSpan() {
      if (timed_) be_.cast_times_.pop(be_.stream_);
    }
    CudaBackend& be_;
    bool timed_;
  };
  bf16* to_bf16(Scratch& stage, const float* x, size_t n) {
    bf16* out = stage.of<bf16>(n);
    CastSpan span(*this);
    cuda::cast_f32_to_bf16_cuda(out, x, n, stream_);
    return out;
  }
  void to_f32(float* out, const bf16* x, size_t n) {
    CastSpan span(*this);
    cuda::cast_bf16_to_f32_cuda(out, x, 1.0f, n, stream_);
  }
  bool use_cudnn(int B, int T, int C, int NH) {
    return use_cudnn(B, T, NH, NH, NH > 0 && C % NH == 0 ? C / NH : 0);
  }
  bool use_cudnn(int B, int T, int NH, int KVH, int HS) {
    return attention_.use_cudnn(*cudnn_attention_, B, T, NH, KVH, HS);
  }
  std::string attention_note() const override { return attention_.note(); }

  int device_ = 0;
  int sm_ = 0;
  std::string device_name_;
  cuda::AttentionChoice attention_;  // run.attention's path per shape, attention_note()
  cudaStream_t stream_ = nullptr;
  cuda::HostSnapshotCopier snapshots_{device_};  // Note [Pinned snapshot copies]
  cudnnHandle_t cudnn_ = nullptr;
  std::unique_ptr<cuda::LtGemm> gemm_;
  std::unique_ptr<cuda::CudnnAttention> cudnn_attention_;
  Scratch stage_a_, stage_b_, stage_c_, stage_d_, stage_w_, reduce_scratch_, norm_scratch_;
  double* host_double_ = nullptr;
  std::map<uintptr_t, size_t> blocks_;  // allocate()'s blocks: start → bytes
  bool timing_ = false;
  EventPool events_;
  SpanTimer op_times_{events_}, layer_times_{events_}, cast_times_{events_};
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

void* cuda_compute_stream(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  return cuda ? static_cast<void*>(cuda->stream()) : nullptr;
}

}  // namespace trident
