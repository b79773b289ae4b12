// CudaBackend: the Backend interface on one GPU. Every op is enqueued on one stream (in order,
// asynchronous to the host); the host waits only in synchronize(), sum_squares() and the
// copies that return data to it. The class is declared here so that two files can define its
// members: cuda_backend.cpp (memory, the fp32 ops, tp and mixture ops, the optimizer side;
// Note [Mixed precision]) and cuda_backend_bf16.cpp (the *_bf16 ops, Note [bf16 activations]
// in src/backend/bf16_ops.cpp). Internal to trident_cuda: the rest of trident reaches the
// backend through include/trident/cuda_backend.h.
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>
#include <nvtx3/nvToolsExt.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "attention_cudnn.h"
#include "backend/cuda/attention_choice.h"
#include "backend/cuda/device_resources.h"
#include "backend/cuda/host_snapshot.h"
#include "backend/cuda/lt_gemm.h"
#include "cuda_check.h"
#include "trident/backend.h"
#include "trident/cuda_backend.h"

namespace trident {

class CudaBackend final : public Backend {
  using bf16 = cuda::bf16;
  using Scratch = cuda::Scratch;

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
  explicit CudaBackend(const CudaBackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  int threads() const override { return 1; }
  bool is_device() const override { return true; }
  cudaStream_t stream() const { return stream_; }
  size_t free_memory_bytes() const override;

  // --- memory (Note [Backend memory]) ---------------------------------------------------
  // Plain device memory, not managed memory: a model too large for the GPU fails here with a
  // message instead of oversubscribing (which pages to the host and can stall the GPU).
  void* allocate(size_t bytes) override;
  void release(void* p) noexcept override;
  // Note [Copies to the host wait] (cuda_backend.cpp).
  void copy(void* dst, const void* src, size_t bytes) override;
  bool owns(const void* p) const;
  void fill_zero(void* p, size_t bytes) override;
  void synchronize() override { TRIDENT_CUDA(cudaStreamSynchronize(stream_)); }

  // Note [Snapshots to the host], on a copy stream: Note [Pinned snapshot copies].
  void* allocate_host_snapshot(size_t bytes) override;
  void release_host_snapshot(void* p) noexcept override { cuda::HostSnapshotCopier::release(p); }
  void start_host_snapshot(void* dst, const void* src, size_t bytes) override;
  void finish_host_snapshot() override { snapshots_.finish(); }
  // A layer phase ("forward block 3"): an NVTX range, and with op timing on its device time,
  // summed per kind of layer (the name without its block number).
  void push_range(const char* name) override;
  void pop_range() override;
  void set_op_timing(bool on) override { timing_ = on; }
  std::vector<DeviceTime> take_op_times_ms() override { return op_times_.take(stream_); }
  // The layer phases, then one row for the fp32 -> bf16 casts (and the two bf16 -> fp32 ones
  // after cuDNN's attention): device time inside the ops above, which the bf16 path removes.
  std::vector<DeviceTime> take_range_times_ms() override;

  // --- layers ---------------------------------------------------------------------------
  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C) override;
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C) override;
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C) override;
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) override;

  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C,
                      int OC) override;
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                       const float* w, int N, int C, int OC) override;

  // Attention state (Note [Backend memory]): both paths save only the per-row log-sum-exp
  // [B,NH,T]; backward takes the forward output from the model.
  size_t attention_saved_floats(int B, int T, int C, int NH) const override;
  size_t attention_scratch_floats(int B, int T, int C, int NH) const override;
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C,
                         int NH) override;
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                          const float* out, const float* att, int B, int T, int C, int NH) override;
  // Attention by blocks (Note [Attention blocks]): context parallelism's ring, fp32.
  void attention_block_forward(const AttentionBlockArgs& a) override;
  void attention_block_backward(const AttentionBlockArgs& a) override;
  void attention_block_delta(const AttentionBlockArgs& a) override;
  void attention_block_reset(const AttentionBlockArgs& a) override;

  void gelu_forward(float* out, const float* inp, size_t n) override;
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) override;
  void add(float* out, const float* a, const float* b, size_t n) override;
  // --- model families (Note [Block shapes] in trident/model_config.h) --------------------
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                       float eps) override;
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                        const float* rstd, int N, int C) override;
  void rope_forward(float* qkv, const float* cos, const float* sin, int N, int T, int NH, int KVH,
                    int hs, int rot) override;
  void rope_backward(float* dqkv, const float* cos, const float* sin, int N, int T, int NH, int KVH,
                     int hs, int rot) override;
  void swiglu_forward(float* out, const float* inp, int N, int F) override;
  void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) override;
  void gelu_erf_forward(float* out, const float* inp, size_t n) override;
  void gelu_erf_backward(float* dinp, const float* inp, const float* dout, size_t n) override;
  // Grouped-query attention: with KVH = NH the multi-head ops above (their plans and notes);
  // else the same two paths with K and V of KVH heads. The saved lse and the scratch are the
  // multi-head sizes with C = NH·hs (attention_saved_floats, attention_scratch_floats).
  void attention_forward_gqa(float* out, float* att, const float* qkv, int B, int T, int NH,
                             int KVH, int hs) override;
  void attention_backward_gqa(float* dqkv, float* scratch, const float* dout, const float* qkv,
                              const float* out, const float* att, int B, int T, int NH, int KVH,
                              int hs) override;

  void crossentropy_forward(float* losses, float* logits_to_probs, const int32_t* targets, int N,
                            int V, int Vp) override;
  void crossentropy_backward(float* probs_to_dlogits, const int32_t* targets, float dloss, int N,
                             int V, int Vp) override;

  // --- bf16 activations (cuda_backend_bf16.cpp; Note [bf16 activations]) ----------------
  static_assert(sizeof(bfloat16) == sizeof(bf16) && alignof(bfloat16) <= alignof(bf16),
                "trident::bfloat16 has __nv_bfloat16's layout (trident/bfloat16.h)");
  static bf16* dev(bfloat16* p) { return reinterpret_cast<bf16*>(p); }
  static const bf16* dev(const bfloat16* p) { return reinterpret_cast<const bf16*>(p); }
  // The bf16 rounding of the attention fallback's fp32 outputs (timed with the casts).
  void into_bf16(bf16* out, const float* x, size_t n);

  void cast_to_bf16(bfloat16* out, const float* inp, size_t n) override;
  void cast_to_fp32(float* out, const bfloat16* inp, size_t n) override;
  void adamw_update_bf16(float* params, bfloat16* params16, float* m, float* v, const float* grads,
                         size_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, int t, float grad_scale) override;
  void layernorm_forward_bf16(bfloat16* out, float* mean, float* rstd, const float* inp,
                              const float* w, const float* b, int N, int C) override;
  void layernorm_backward_add_bf16(float* dresidual, bfloat16* dresidual16, float* dw, float* db,
                                   const bfloat16* dout, const float* inp, const float* w,
                                   const float* mean, const float* rstd, int N, int C) override;
  void matmul_forward_bf16(bfloat16* out, const bfloat16* inp, const bfloat16* w, const float* bias,
                           int N, int C, int OC) override;
  void matmul_forward_add_bf16(float* out, const float* residual, const bfloat16* inp,
                               const bfloat16* w, const float* bias, int N, int C, int OC) override;
  void matmul_backward_input_fp32_bf16(float* dinp, const bfloat16* dout, const bfloat16* w, int N,
                                       int C, int OC) override;
  void matmul_backward_bf16(bfloat16* dinp, float* dw, float* dbias, const bfloat16* dout,
                            const bfloat16* inp, const bfloat16* w, int N, int C, int OC) override;
  // The GELU in the GEMM's epilogue (Note [cuBLASLt epilogues]); where cuBLASLt has none for
  // the shape, the GEMM and the GELU kernel (the GELU then reads the rounded pre-activation).
  void matmul_gelu_forward_bf16(bfloat16* out, bfloat16* pre, const bfloat16* inp,
                                const bfloat16* w, const float* bias, int N, int C,
                                int OC) override;
  void matmul_dgelu_backward_bf16(bfloat16* dpre, float* dbias, const bfloat16* dout,
                                  const bfloat16* w, const bfloat16* pre, int N, int C,
                                  int OC) override;
  // cuDNN's fused attention takes bf16 q|k|v and writes bf16 outputs: the tensors as they are.
  // Where it has no plan for the shape (or run.attention is flash), the fp32 flash kernel on
  // widened copies, its outputs rounded once: the op's definition, at the cost of the casts.
  void attention_forward_bf16(bfloat16* out, float* att, const bfloat16* qkv, int B, int T, int C,
                              int NH) override;
  void attention_backward_bf16(bfloat16* dqkv, float* scratch, const bfloat16* dout,
                               const bfloat16* qkv, const bfloat16* out, const float* att, int B,
                               int T, int C, int NH) override;
  void gelu_forward_bf16(bfloat16* out, const bfloat16* inp, size_t n) override;
  void gelu_backward_bf16(bfloat16* dinp, const bfloat16* inp, const bfloat16* dout,
                          size_t n) override;
  // The families' bf16 ops: the fp32 kernels instantiated on bf16 (kernels/rmsnorm.cu, rope.cu,
  // swiglu.cu, elementwise.cu); CPU twins in bf16_family_ops.cpp.
  bool has_bf16_family_ops() const override;
  void rmsnorm_forward_bf16(bfloat16* out, float* rstd, const float* inp, const float* w, int N,
                            int C, float eps) override;
  void rmsnorm_backward_add_bf16(float* dresidual, bfloat16* dresidual16, float* dw,
                                 const bfloat16* dout, const float* inp, const float* w,
                                 const float* rstd, int N, int C) override;
  void rope_forward_bf16(bfloat16* qkv, const float* cos, const float* sin, int N, int T, int NH,
                         int KVH, int hs, int rot) override;
  void rope_backward_bf16(bfloat16* dqkv, const float* cos, const float* sin, int N, int T, int NH,
                          int KVH, int hs, int rot) override;
  void swiglu_forward_bf16(bfloat16* out, const bfloat16* inp, int N, int F) override;
  void swiglu_backward_bf16(bfloat16* dinp, const bfloat16* inp, const bfloat16* dout, int N,
                            int F) override;
  void gelu_erf_forward_bf16(bfloat16* out, const bfloat16* inp, size_t n) override;
  void gelu_erf_backward_bf16(bfloat16* dinp, const bfloat16* inp, const bfloat16* dout,
                              size_t n) override;
  // Grouped-query attention on bf16 q|k|v: cuDNN's graph with K and V of KVH heads on the
  // tensors as they are, else the fp32 flash kernel on widened copies (as the multi-head op).
  void attention_forward_gqa_bf16(bfloat16* out, float* att, const bfloat16* qkv, int B, int T,
                                  int NH, int KVH, int hs) override;
  void attention_backward_gqa_bf16(bfloat16* dqkv, float* scratch, const bfloat16* dout,
                                   const bfloat16* qkv, const bfloat16* out, const float* att,
                                   int B, int T, int NH, int KVH, int hs) override;
  // Forward and backward of the loss in one kernel: timed as the forward, its larger half.
  void crossentropy_fused_bf16(float* losses, bfloat16* logits_to_dlogits, const int32_t* targets,
                               float dloss, int N, int V, int Vp) override;

  // --- tensor parallelism (Note [Vocab-parallel ops]) -------------------------------------
  void embedding_slice_forward(float* out, const int32_t* tokens, const float* wte_slice,
                               const float* wpe, int v0, int v1, int B, int T, int C) override;
  void embedding_slice_backward(float* dwte_slice, float* dwpe, const float* dout,
                                const int32_t* tokens, int v0, int v1, int B, int T,
                                int C) override;
  void crossentropy_slice_stats(float* stats, const float* logits, const int32_t* targets, int v0,
                                int live, int N, int Vl) override;
  void crossentropy_slice_combine(float* losses, float* logits_to_probs, const float* all_stats,
                                  int tp, int live, int N, int Vl) override;
  void crossentropy_slice_backward(float* probs, const int32_t* targets, float dloss, int v0, int N,
                                   int Vl) override;
  void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
                 size_t rows) override;

  // --- the mixture of experts (kernels/moe.cu; Note [Mixture ops]) ----------------------
  void moe_route_forward(float* probs, float* lse, int32_t* top, float* topw, const float* logits,
                         const float* bias, int N, int E, int k, bool sigmoid,
                         bool norm_topk) override;
  void moe_permute(int32_t* pos, int32_t* send_token, int32_t* counts, double* sums,
                   int32_t* hf_count, const int32_t* top, const float* probs, const float* lse,
                   int N, int E, int k, int cap) override;
  void moe_gather_rows(float* rows, const float* x, const int32_t* send_token, int M,
                       int C) override;
  void moe_combine_forward(float* out, const float* ys, const float* shared, const float* gate,
                           const int32_t* pos, const float* topw, int N, int C, int k) override;
  void moe_combine_backward(float* dys, float* dtopw, const float* dout, const float* ys,
                            const int32_t* pos, const float* topw, int N, int C, int k) override;
  void moe_scatter_add(float* dx, const float* dxs, const int32_t* pos, int N, int C,
                       int k) override;
  void moe_route_backward(float* dlogits, const float* dtopw, const float* probs, const float* lse,
                          const int32_t* top, const float* topw, const int32_t* aux_count,
                          double aux_num, double aux_den, double z2, double loss_scale, int N,
                          int E, int k, bool sigmoid, bool norm_topk) override;
  void sigmoid_forward(float* out, const float* inp, size_t n) override;
  void moe_gate_backward(float* dgate, float* dy, const float* dout, const float* y,
                         const float* gate, int N, int C) override;

  // --- optimizer side -------------------------------------------------------------------
  double sum_squares(const float* x, size_t n) override;
  void add_mean(double* acc, const float* x, size_t n) override;
  // Each sum into its own device double, then one copy of them all and one wait.
  void sum_squares_each(const float* const* xs, const size_t* ns, size_t count,
                        double* out) override;
  void adamw_update(float* params, float* m, float* v, const float* grads, size_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, int t,
                    float grad_scale) override;

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
  bf16* to_bf16(Scratch& stage, const float* x, size_t n);
  void to_f32(float* out, const bf16* x, size_t n);
  bool use_cudnn(int B, int T, int C, int NH);
  bool use_cudnn(int B, int T, int NH, int KVH, int HS);
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
  cuda::Scratch stage_a_, stage_b_, stage_c_, stage_d_, stage_w_, reduce_scratch_, norm_scratch_;
  double* host_double_ = nullptr;
  std::map<uintptr_t, size_t> blocks_;  // allocate()'s blocks: start → bytes
  bool timing_ = false;
  cuda::EventPool events_;
  cuda::SpanTimer op_times_{events_}, layer_times_{events_}, cast_times_{events_};
};

}  // namespace trident
