// A test backend that behaves like a device backend towards the code above it: it computes
// with the CPU backend, but its memory is unreadable and unwritable from the host except
// inside its own ops and copies (mprotect PROT_NONE in between). Any code path that touches
// backend memory directly instead of through Backend::copy or a HostView
// (Note [Backend memory]) crashes with SIGSEGV at the offending line — the bug that on a GPU
// would read garbage or fault. The results are the CPU backend's, bit for bit.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "trident/backend.h"
#include "trident/check.h"
#include "trident/comm.h"

namespace trident::testing {

// n floats from src to dst; nothing when n is 0, where either may be null (an empty collective),
// which memcpy does not allow.
inline void copy_floats(void* dst, const void* src, size_t n) {
  if (n > 0) std::memcpy(dst, src, n * sizeof(float));
}

class StrictDeviceBackend final : public Backend {
 public:
  // bf16_family_ops false: a device without the families' bf16 kernels (the model refuses a
  // family's bf16 path on it).
  explicit StrictDeviceBackend(bool bf16_family_ops = true)
      : cpu_(make_cpu_backend(1)), bf16_family_ops_(bf16_family_ops) {}
  ~StrictDeviceBackend() override {
    for (auto& [p, bytes] : regions_) munmap(p, bytes);
  }

  std::string name() const override { return "strict-device"; }
  int threads() const override { return 1; }
  bool is_device() const override { return true; }

  void* allocate(size_t bytes) override {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t n = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
    void* p = mmap(nullptr, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);  // zeroed
    TRIDENT_CHECK(p != MAP_FAILED, "mmap of {} bytes", n);
    std::lock_guard<std::mutex> lock(mutex_);
    regions_[p] = n;
    ++allocations_;
    in_use_ += n;
    peak_ = std::max(peak_, in_use_);
    return p;
  }
  void release(void* p) noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = regions_.find(p);
    if (it == regions_.end()) return;
    ++releases_;
    in_use_ -= it->second;
    munmap(it->first, it->second);
    regions_.erase(it);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    Open open(*this);
    if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
    if (bytes > 0 && mine(src) && !mine(dst)) ++copies_to_host_;
  }
  // Copies from backend memory to the host so far: each is a wait for the device on a GPU.
  size_t copies_to_host() const { return copies_to_host_; }
  // allocate() and release() calls so far (on a GPU a cudaMalloc or cudaFree, which a step
  // must not make: Note [Weights in unit slots] in src/train/zero3_pool.h).
  size_t allocations() const { return allocations_; }
  size_t releases() const { return releases_; }
  // Bytes allocated and not released (in whole pages), now and at most so far.
  size_t bytes_in_use() const { return in_use_; }
  size_t peak_bytes() const { return peak_; }
  // What the memory plan (Note [Memory plan]) is told is free; 0: the host's MemAvailable.
  void set_free_memory_bytes(size_t bytes) { free_memory_ = bytes; }
  size_t free_memory_bytes() const override {
    return free_memory_ ? free_memory_ : Backend::free_memory_bytes();
  }
  void fill_zero(void* p, size_t bytes) override {
    Open open(*this);
    if (bytes > 0) std::memset(p, 0, bytes);
  }

  // Every op: memory opened, the CPU op, memory closed again.
  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C) override {
    Open open(*this);
    cpu_->encoder_forward(out, tokens, wte, wpe, B, T, C);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C) override {
    Open open(*this);
    cpu_->encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C) override {
    Open open(*this);
    cpu_->layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) override {
    Open open(*this);
    cpu_->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C,
                      int OC) override {
    Open open(*this);
    cpu_->matmul_forward(out, inp, w, bias, N, C, OC);
  }
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                       const float* w, int N, int C, int OC) override {
    Open open(*this);
    cpu_->matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC);
  }
  void matmul_backward_weight_rows(float* dw, const float* dout, int ld, const float* inp, int N,
                                   int C, int rows) override {
    Open open(*this);
    cpu_->matmul_backward_weight_rows(dw, dout, ld, inp, N, C, rows);
  }
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C,
                         int NH) override {
    Open open(*this);
    cpu_->attention_forward(out, att, qkv, B, T, C, NH);
  }
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                          const float* out, const float* att, int B, int T, int C,
                          int NH) override {
    Open open(*this);
    cpu_->attention_backward(dqkv, scratch, dout, qkv, out, att, B, T, C, NH);
  }
  void gelu_forward(float* out, const float* inp, size_t n) override {
    Open open(*this);
    cpu_->gelu_forward(out, inp, n);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) override {
    Open open(*this);
    cpu_->gelu_backward(dinp, inp, dout, n);
  }
  // The model families' ops (Note [Families on the GPT-2 paths] in src/model/gpt_slots.cpp).
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                       float eps) override {
    Open open(*this);
    cpu_->rmsnorm_forward(out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                        const float* rstd, int N, int C) override {
    Open open(*this);
    cpu_->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  }
  void rope_forward(float* qkv, const float* cos, const float* sin, int N, int T, int NH, int KVH,
                    int hs, int rot) override {
    Open open(*this);
    cpu_->rope_forward(qkv, cos, sin, N, T, NH, KVH, hs, rot);
  }
  void rope_backward(float* dqkv, const float* cos, const float* sin, int N, int T, int NH, int KVH,
                     int hs, int rot) override {
    Open open(*this);
    cpu_->rope_backward(dqkv, cos, sin, N, T, NH, KVH, hs, rot);
  }
  void swiglu_forward(float* out, const float* inp, int N, int F) override {
    Open open(*this);
    cpu_->swiglu_forward(out, inp, N, F);
  }
  void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) override {
    Open open(*this);
    cpu_->swiglu_backward(dinp, inp, dout, N, F);
  }
  void gelu_erf_forward(float* out, const float* inp, size_t n) override {
    Open open(*this);
    cpu_->gelu_erf_forward(out, inp, n);
  }
  void gelu_erf_backward(float* dinp, const float* inp, const float* dout, size_t n) override {
    Open open(*this);
    cpu_->gelu_erf_backward(dinp, inp, dout, n);
  }
  void attention_forward_gqa(float* out, float* att, const float* qkv, int B, int T, int NH,
                             int KVH, int hs) override {
    Open open(*this);
    cpu_->attention_forward_gqa(out, att, qkv, B, T, NH, KVH, hs);
  }
  void attention_backward_gqa(float* dqkv, float* scratch, const float* dout, const float* qkv,
                              const float* out, const float* att, int B, int T, int NH, int KVH,
                              int hs) override {
    Open open(*this);
    cpu_->attention_backward_gqa(dqkv, scratch, dout, qkv, out, att, B, T, NH, KVH, hs);
  }
  // The CPU backend's sizes and blocks (Note [Blockwise attention threshold]).
  size_t attention_saved_floats(int B, int T, int C, int NH) const override {
    return cpu_->attention_saved_floats(B, T, C, NH);
  }
  size_t attention_scratch_floats(int B, int T, int C, int NH) const override {
    return cpu_->attention_scratch_floats(B, T, C, NH);
  }
  void attention_block_forward(const AttentionBlockArgs& a) override {
    Open open(*this);
    cpu_->attention_block_forward(a);
  }
  void attention_block_backward(const AttentionBlockArgs& a) override {
    Open open(*this);
    cpu_->attention_block_backward(a);
  }
  void attention_block_delta(const AttentionBlockArgs& a) override {
    Open open(*this);
    cpu_->attention_block_delta(a);
  }
  void attention_block_reset(const AttentionBlockArgs& a) override {
    Open open(*this);
    cpu_->attention_block_reset(a);
  }
  void add(float* out, const float* a, const float* b, size_t n) override {
    Open open(*this);
    cpu_->add(out, a, b, n);
  }
  void crossentropy_forward(float* losses, float* logits, const int32_t* targets, int N, int V,
                            int Vp) override {
    Open open(*this);
    cpu_->crossentropy_forward(losses, logits, targets, N, V, Vp);
  }
  void crossentropy_backward(float* probs, const int32_t* targets, float dloss, int N, int V,
                             int Vp) override {
    Open open(*this);
    cpu_->crossentropy_backward(probs, targets, dloss, N, V, Vp);
  }
  void embedding_slice_forward(float* out, const int32_t* tokens, const float* wte_slice,
                               const float* wpe, int v0, int v1, int B, int T, int C) override {
    Open open(*this);
    cpu_->embedding_slice_forward(out, tokens, wte_slice, wpe, v0, v1, B, T, C);
  }
  void embedding_slice_backward(float* dwte_slice, float* dwpe, const float* dout,
                                const int32_t* tokens, int v0, int v1, int B, int T,
                                int C) override {
    Open open(*this);
    cpu_->embedding_slice_backward(dwte_slice, dwpe, dout, tokens, v0, v1, B, T, C);
  }
  void crossentropy_slice_stats(float* stats, const float* logits, const int32_t* targets, int v0,
                                int live, int N, int Vl) override {
    Open open(*this);
    cpu_->crossentropy_slice_stats(stats, logits, targets, v0, live, N, Vl);
  }
  void crossentropy_slice_combine(float* losses, float* logits_to_probs, const float* all_stats,
                                  int tp, int live, int N, int Vl) override {
    Open open(*this);
    cpu_->crossentropy_slice_combine(losses, logits_to_probs, all_stats, tp, live, N, Vl);
  }
  void crossentropy_slice_backward(float* probs, const int32_t* targets, float dloss, int v0, int N,
                                   int Vl) override {
    Open open(*this);
    cpu_->crossentropy_slice_backward(probs, targets, dloss, v0, N, Vl);
  }
  void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
                 size_t rows) override {
    Open open(*this);
    cpu_->copy_rows(dst, dst_pitch, src, src_pitch, row_bytes, rows);
  }
  // The mixture's ops (Note [Mixture ops]): the CPU backend's host definitions.
  void moe_route_forward(float* probs, float* lse, int32_t* top, float* topw, const float* logits,
                         const float* bias, int N, int E, int k, bool sigmoid,
                         bool norm_topk) override {
    Open open(*this);
    cpu_->moe_route_forward(probs, lse, top, topw, logits, bias, N, E, k, sigmoid, norm_topk);
  }
  void moe_permute(int32_t* pos, int32_t* send_token, int32_t* counts, double* sums,
                   int32_t* hf_count, const int32_t* top, const float* probs, const float* lse,
                   int N, int E, int k, int cap) override {
    Open open(*this);
    cpu_->moe_permute(pos, send_token, counts, sums, hf_count, top, probs, lse, N, E, k, cap);
  }
  void moe_gather_rows(float* rows, const float* x, const int32_t* send_token, int M,
                       int C) override {
    Open open(*this);
    cpu_->moe_gather_rows(rows, x, send_token, M, C);
  }
  void moe_combine_forward(float* out, const float* ys, const float* shared, const float* gate,
                           const int32_t* pos, const float* topw, int N, int C, int k) override {
    Open open(*this);
    cpu_->moe_combine_forward(out, ys, shared, gate, pos, topw, N, C, k);
  }
  void moe_combine_backward(float* dys, float* dtopw, const float* dout, const float* ys,
                            const int32_t* pos, const float* topw, int N, int C, int k) override {
    Open open(*this);
    cpu_->moe_combine_backward(dys, dtopw, dout, ys, pos, topw, N, C, k);
  }
  void moe_scatter_add(float* dx, const float* dxs, const int32_t* pos, int N, int C,
                       int k) override {
    Open open(*this);
    cpu_->moe_scatter_add(dx, dxs, pos, N, C, k);
  }
  void moe_route_backward(float* dlogits, const float* dtopw, const float* probs, const float* lse,
                          const int32_t* top, const float* topw, const int32_t* aux_count,
                          double aux_num, double aux_den, double z2, double loss_scale, int N,
                          int E, int k, bool sigmoid, bool norm_topk) override {
    Open open(*this);
    cpu_->moe_route_backward(dlogits, dtopw, probs, lse, top, topw, aux_count, aux_num, aux_den, z2,
                             loss_scale, N, E, k, sigmoid, norm_topk);
  }
  void sigmoid_forward(float* out, const float* inp, size_t n) override {
    Open open(*this);
    cpu_->sigmoid_forward(out, inp, n);
  }
  void moe_gate_backward(float* dgate, float* dy, const float* dout, const float* y,
                         const float* gate, int N, int C) override {
    Open open(*this);
    cpu_->moe_gate_backward(dgate, dy, dout, y, gate, N, C);
  }
  double sum_squares(const float* x, size_t n) override {
    Open open(*this);
    return cpu_->sum_squares(x, n);
  }
  void add_mean(double* acc, const float* x, size_t n) override {
    Open open(*this);
    cpu_->add_mean(acc, x, n);
  }
  // The bf16 path's ops (Note [bf16 activations]): the CPU backend's host definitions.
  void cast_to_bf16(bfloat16* out, const float* inp, size_t n) override {
    Open open(*this);
    cpu_->cast_to_bf16(out, inp, n);
  }
  void cast_to_fp32(float* out, const bfloat16* inp, size_t n) override {
    Open open(*this);
    cpu_->cast_to_fp32(out, inp, n);
  }
  void adamw_update_bf16(float* params, bfloat16* params16, float* m, float* v, const float* grads,
                         size_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, int t, float grad_scale) override {
    Open open(*this);
    cpu_->adamw_update_bf16(params, params16, m, v, grads, n, lr, beta1, beta2, eps, weight_decay,
                            t, grad_scale);
  }
  void matmul_gelu_forward_bf16(bfloat16* out, bfloat16* pre, const bfloat16* inp,
                                const bfloat16* w, const float* bias, int N, int C,
                                int OC) override {
    Open open(*this);
    cpu_->matmul_gelu_forward_bf16(out, pre, inp, w, bias, N, C, OC);
  }
  void matmul_dgelu_backward_bf16(bfloat16* dpre, float* dbias, const bfloat16* dout,
                                  const bfloat16* w, const bfloat16* pre, int N, int C,
                                  int OC) override {
    Open open(*this);
    cpu_->matmul_dgelu_backward_bf16(dpre, dbias, dout, w, pre, N, C, OC);
  }
  void layernorm_forward_bf16(bfloat16* out, float* mean, float* rstd, const float* inp,
                              const float* w, const float* b, int N, int C) override {
    Open open(*this);
    cpu_->layernorm_forward_bf16(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward_add_bf16(float* dresidual, bfloat16* dresidual16, float* dw, float* db,
                                   const bfloat16* dout, const float* inp, const float* w,
                                   const float* mean, const float* rstd, int N, int C) override {
    Open open(*this);
    cpu_->layernorm_backward_add_bf16(dresidual, dresidual16, dw, db, dout, inp, w, mean, rstd, N,
                                      C);
  }
  void matmul_forward_bf16(bfloat16* out, const bfloat16* inp, const bfloat16* w, const float* bias,
                           int N, int C, int OC) override {
    Open open(*this);
    cpu_->matmul_forward_bf16(out, inp, w, bias, N, C, OC);
  }
  void matmul_forward_add_bf16(float* out, const float* residual, const bfloat16* inp,
                               const bfloat16* w, const float* bias, int N, int C,
                               int OC) override {
    Open open(*this);
    cpu_->matmul_forward_add_bf16(out, residual, inp, w, bias, N, C, OC);
  }
  void matmul_backward_input_fp32_bf16(float* dinp, const bfloat16* dout, const bfloat16* w, int N,
                                       int C, int OC) override {
    Open open(*this);
    cpu_->matmul_backward_input_fp32_bf16(dinp, dout, w, N, C, OC);
  }
  void matmul_backward_bf16(bfloat16* dinp, float* dw, float* dbias, const bfloat16* dout,
                            const bfloat16* inp, const bfloat16* w, int N, int C, int OC) override {
    Open open(*this);
    cpu_->matmul_backward_bf16(dinp, dw, dbias, dout, inp, w, N, C, OC);
  }
  void attention_forward_bf16(bfloat16* out, float* att, const bfloat16* qkv, int B, int T, int C,
                              int NH) override {
    Open open(*this);
    cpu_->attention_forward_bf16(out, att, qkv, B, T, C, NH);
  }
  void attention_backward_bf16(bfloat16* dqkv, float* scratch, const bfloat16* dout,
                               const bfloat16* qkv, const bfloat16* out, const float* att, int B,
                               int T, int C, int NH) override {
    Open open(*this);
    cpu_->attention_backward_bf16(dqkv, scratch, dout, qkv, out, att, B, T, C, NH);
  }
  void gelu_forward_bf16(bfloat16* out, const bfloat16* inp, size_t n) override {
    Open open(*this);
    cpu_->gelu_forward_bf16(out, inp, n);
  }
  void gelu_backward_bf16(bfloat16* dinp, const bfloat16* inp, const bfloat16* dout,
                          size_t n) override {
    Open open(*this);
    cpu_->gelu_backward_bf16(dinp, inp, dout, n);
  }
  void crossentropy_fused_bf16(float* losses, bfloat16* logits, const int32_t* targets, float dloss,
                               int N, int V, int Vp) override {
    Open open(*this);
    cpu_->crossentropy_fused_bf16(losses, logits, targets, dloss, N, V, Vp);
  }
  // The families' bf16 ops: the CPU backend's host definitions.
  bool has_bf16_family_ops() const override { return bf16_family_ops_; }
  void rmsnorm_forward_bf16(bfloat16* out, float* rstd, const float* inp, const float* w, int N,
                            int C, float eps) override {
    Open open(*this);
    cpu_->rmsnorm_forward_bf16(out, rstd, inp, w, N, C, eps);
  }
  void rmsnorm_backward_add_bf16(float* dresidual, bfloat16* dresidual16, float* dw,
                                 const bfloat16* dout, const float* inp, const float* w,
                                 const float* rstd, int N, int C) override {
    Open open(*this);
    cpu_->rmsnorm_backward_add_bf16(dresidual, dresidual16, dw, dout, inp, w, rstd, N, C);
  }
  void rope_forward_bf16(bfloat16* qkv, const float* cos, const float* sin, int N, int T, int NH,
                         int KVH, int hs, int rot) override {
    Open open(*this);
    cpu_->rope_forward_bf16(qkv, cos, sin, N, T, NH, KVH, hs, rot);
  }
  void rope_backward_bf16(bfloat16* dqkv, const float* cos, const float* sin, int N, int T, int NH,
                          int KVH, int hs, int rot) override {
    Open open(*this);
    cpu_->rope_backward_bf16(dqkv, cos, sin, N, T, NH, KVH, hs, rot);
  }
  void swiglu_forward_bf16(bfloat16* out, const bfloat16* inp, int N, int F) override {
    Open open(*this);
    cpu_->swiglu_forward_bf16(out, inp, N, F);
  }
  void swiglu_backward_bf16(bfloat16* dinp, const bfloat16* inp, const bfloat16* dout, int N,
                            int F) override {
    Open open(*this);
    cpu_->swiglu_backward_bf16(dinp, inp, dout, N, F);
  }
  void gelu_erf_forward_bf16(bfloat16* out, const bfloat16* inp, size_t n) override {
    Open open(*this);
    cpu_->gelu_erf_forward_bf16(out, inp, n);
  }
  void gelu_erf_backward_bf16(bfloat16* dinp, const bfloat16* inp, const bfloat16* dout,
                              size_t n) override {
    Open open(*this);
    cpu_->gelu_erf_backward_bf16(dinp, inp, dout, n);
  }
  void attention_forward_gqa_bf16(bfloat16* out, float* att, const bfloat16* qkv, int B, int T,
                                  int NH, int KVH, int hs) override {
    Open open(*this);
    cpu_->attention_forward_gqa_bf16(out, att, qkv, B, T, NH, KVH, hs);
  }
  void attention_backward_gqa_bf16(bfloat16* dqkv, float* scratch, const bfloat16* dout,
                                   const bfloat16* qkv, const bfloat16* out, const float* att,
                                   int B, int T, int NH, int KVH, int hs) override {
    Open open(*this);
    cpu_->attention_backward_gqa_bf16(dqkv, scratch, dout, qkv, out, att, B, T, NH, KVH, hs);
  }
  void adamw_update(float* params, float* m, float* v, const float* grads, size_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, int t,
                    float grad_scale) override {
    Open open(*this);
    cpu_->adamw_update(params, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale);
  }
  double measure_gemm_peak_flops() override { return cpu_->measure_gemm_peak_flops(); }

  // Opens every region for its lifetime (one op, one copy, one device-communicator
  // operation). Counted, so that a communication thread's operation and the compute thread's
  // ops may overlap: the memory closes when the last one ends (while both are open, a stray
  // host access on the other thread goes unnoticed — the test is weaker there, not wrong).
  // `op`: a backend op or copy (the "compute stream" of its thread, counted per thread for
  // StrictDeviceComm's marks); a communicator's own access is not one.
  class Open {
   public:
    explicit Open(StrictDeviceBackend& be, bool op = true) : be_(be) {
      std::lock_guard<std::mutex> lock(be_.mutex_);
      if (op) ++be_.ops_[std::this_thread::get_id()];
      if (be_.open_++ == 0) be_.protect(PROT_READ | PROT_WRITE);
    }
    ~Open() {
      std::lock_guard<std::mutex> lock(be_.mutex_);
      if (--be_.open_ == 0) be_.protect(PROT_NONE);
    }

   private:
    StrictDeviceBackend& be_;
  };

  // The ops and copies the calling thread has run so far (its compute stream's position).
  uint64_t ops_on_this_thread() {
    std::lock_guard<std::mutex> lock(mutex_);
    return ops_[std::this_thread::get_id()];
  }

 private:
  bool mine(const void* p) const {
    auto it = regions_.upper_bound(const_cast<void*>(p));
    if (it == regions_.begin()) return false;
    --it;
    const char* base = static_cast<const char*>(it->first);
    return static_cast<const char*>(p) < base + it->second;
  }
  void protect(int prot) {
    for (auto& [p, bytes] : regions_) mprotect(p, bytes, prot);
  }

  std::unique_ptr<Backend> cpu_;
  bool bf16_family_ops_ = true;
  std::map<void*, size_t> regions_;
  std::mutex mutex_;
  int open_ = 0;
  size_t copies_to_host_ = 0;
  size_t allocations_ = 0, releases_ = 0;
  size_t in_use_ = 0, peak_ = 0;
  size_t free_memory_ = 0;
  std::map<std::thread::id, uint64_t> ops_;
};

// A "device communicator" for the strict backend's memory: each collective runs to completion
// on the wrapped host communicator while the memory is open, so code that hands backend memory
// to it (the GradReducer, the model's tp collectives) works, and code that hands backend
// memory to a host communicator instead crashes.
//
// Point-to-point transfers behave as a device link's, strictly
// (Note [Stage transfers on a device] in trident/pipeline.h):
//   - pairing by order: only tag 0 is accepted (the host transfers all use tag 0, which MPI
//     matches in order, as NCCL does);
//   - a send or receive must be ordered after everything the calling thread's compute stream
//     did so far (a mark recorded, then order_after it, with no backend op between): else an
//     Error, the send might read data not yet written or the receive overwrite data in use;
//   - a received buffer holds NaN from the receive's start and the data only once compute
//     waited for it (compute_waits_for_comm), as a kernel that read it earlier might see: a
//     missing wait trains on NaN.
// A send copies its data out at its start (the device would read it once ordered there).
class StrictDeviceComm final : public Communicator {
 public:
  StrictDeviceComm(StrictDeviceBackend& be, Communicator& host) : be_(be), host_(host) {}
  // All-reduces, reduce-scatters and all-gathers in flight until tested complete (staged through
  // host buffers, landing then), as on a device stream: a thread driving two such communicators
  // (ZeRO-3's reduce-scatters and gathers) may start them in another order on each rank.
  // Default: each runs to completion when started.
  void set_asynchronous(bool on) { asynchronous_ = on; }
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  const std::string& name() const override { return host_.name(); }

  struct Mark : ComputeMark {
    std::thread::id thread;
    uint64_t ops = 0;
    bool recorded = false;
  };
  std::shared_ptr<ComputeMark> new_mark(bool timed) override {
    if (timed) return nullptr;  // no device time
    return std::make_shared<Mark>();
  }
  void record_mark(ComputeMark& mark) override {
    Mark& m = static_cast<Mark&>(mark);
    m.thread = std::this_thread::get_id();
    m.ops = be_.ops_on_this_thread();
    m.recorded = true;
  }
  void order_after(const ComputeMark* mark) override {
    if (!mark) return;
    ordered_ = static_cast<const Mark&>(*mark);
    if (ordered_.recorded) ++orders_;
  }
  // order_after calls with a recorded mark so far (ZeRO-3: one per unit gather).
  size_t orders() const { return orders_; }
  // The receives started so far land in their buffers.
  void compute_waits_for_comm() override {
    for (auto& t : landing_) {
      if (!t->done) t->host.wait();
      t->done = true;
      StrictDeviceBackend::Open open(be_, /*op=*/false);
      copy_floats(t->dst, t->staging.data(), t->staging.size());
    }
    landing_.clear();
  }
  size_t point_to_point_count() const { return transfers_; }
  // Bytes all-gathered so far in elements of `type` (the full outputs, as OpRecord counts them).
  size_t all_gather_bytes(ElemType type) const { return all_gather_bytes_[size_t(type)]; }
  Work start_all_to_all_v(const void* send, const size_t* send_counts, void* recv,
                          const size_t* recv_counts, ElemType type) override {
    return now(
        [&] { return host_.start_all_to_all_v(send, send_counts, recv, recv_counts, type); });
  }

 protected:
  template <typename Fn>
  Work now(Fn fn) {
    StrictDeviceBackend::Open open(be_, /*op=*/false);
    Work w = fn();
    w.wait();
    return w;  // complete, its record readable (cp's grouped ring times its exchanges)
  }
  Work start_all_reduce(void* data, size_t count, ElemType type) override {
    return start_all_reduce_op(data, count, type, ReduceOp::kSum, {});
  }
  Work start_all_reduce_op(void* data, size_t count, ElemType type, ReduceOp op,
                           std::string_view label) override {
    TRIDENT_CHECK(type == ElemType::kFloat32, "strict comm: float data only");
    if (asynchronous_) {  // in place: staged in, summed there, landing back
      auto t = staged(data, 0, data, count);
      {
        StrictDeviceBackend::Open open(be_, /*op=*/false);
        copy_floats(t->staging.data(), data, count);
      }
      t->host = host_.all_reduce(t->staging.data(), count, op, label);
      return Work(std::make_unique<CollectiveWork>(t, be_));
    }
    return now([&] { return host_.all_reduce(static_cast<float*>(data), count, op, label); });
  }
  Work start_reduce_scatter(const void* send, void* recv, size_t recv_count,
                            ElemType type) override {
    TRIDENT_CHECK(type == ElemType::kFloat32, "strict comm: float data only");
    if (asynchronous_) {
      auto t = staged(send, recv_count * size_t(size()), recv, recv_count);
      t->host = host_.reduce_scatter(t->staging_in.data(), t->staging.data(), recv_count);
      return Work(std::make_unique<CollectiveWork>(t, be_));
    }
    return now([&] {
      return host_.reduce_scatter(static_cast<const float*>(send), static_cast<float*>(recv),
                                  recv_count);
    });
  }
  Work start_all_gather(const void* send, void* recv, size_t send_count, ElemType type) override {
    TRIDENT_CHECK(type == ElemType::kFloat32 || type == ElemType::kBfloat16,
                  "strict comm: float or bf16 data only");
    all_gather_bytes_[size_t(type)] += send_count * size_t(size()) * elem_bytes(type);
    if (type == ElemType::kBfloat16) return all_gather_bf16(send, recv, send_count);
    if (asynchronous_) {
      auto t = staged(send, send_count, recv, send_count * size_t(size()));
      t->host = host_.all_gather(t->staging_in.data(), t->staging.data(), send_count);
      return Work(std::make_unique<CollectiveWork>(t, be_));
    }
    return now([&] {
      return host_.all_gather(static_cast<const float*>(send), static_cast<float*>(recv),
                              send_count);
    });
  }
  // bf16 (ZeRO-3's weight gathers, Note [bf16 unit gathers]): staged as bytes in the float
  // buffers, landing as many bytes as were gathered.
  Work all_gather_bf16(const void* send, void* recv, size_t send_count) {
    const size_t recv_count = send_count * size_t(size());
    if (!asynchronous_)
      return now([&] {
        return host_.all_gather(static_cast<const bfloat16*>(send), static_cast<bfloat16*>(recv),
                                send_count);
      });
    auto t = std::make_shared<Transfer>();
    t->staging_in.resize((send_count + 1) / 2);
    t->staging.resize((recv_count + 1) / 2);
    t->dst = static_cast<float*>(recv);
    t->land_bytes = recv_count * sizeof(bfloat16);
    {
      StrictDeviceBackend::Open open(be_, /*op=*/false);
      if (send_count > 0) std::memcpy(t->staging_in.data(), send, send_count * sizeof(bfloat16));
    }
    t->host = host_.all_gather(reinterpret_cast<const bfloat16*>(t->staging_in.data()),
                               reinterpret_cast<bfloat16*>(t->staging.data()), send_count);
    return Work(std::make_unique<CollectiveWork>(t, be_));
  }
  Work start_broadcast(void*, size_t, ElemType, int) override {
    internal_error(__FILE__, __LINE__, "strict comm: broadcast not needed");
  }
  Work start_send(const void* data, size_t count, ElemType type, int dest, int tag) override {
    check_point_to_point("send", type, tag);
    auto t = std::make_shared<Transfer>();
    t->staging.resize(count);
    {
      StrictDeviceBackend::Open open(be_, /*op=*/false);
      copy_floats(t->staging.data(), data, count);
    }
    t->host = host_.send(t->staging.data(), count, dest, 0);
    return Work(std::make_unique<TransferWork>(t));
  }
  Work start_recv(void* data, size_t count, ElemType type, int src, int tag) override {
    check_point_to_point("recv", type, tag);
    auto t = std::make_shared<Transfer>();
    t->staging.resize(count);
    t->dst = static_cast<float*>(data);
    {
      StrictDeviceBackend::Open open(be_, /*op=*/false);
      std::fill_n(t->dst, count, std::numeric_limits<float>::quiet_NaN());
    }
    t->host = host_.recv(t->staging.data(), count, src, 0);
    landing_.push_back(t);
    return Work(std::make_unique<TransferWork>(t));
  }

 private:
  struct Transfer {
    std::vector<float> staging;
    Work host;
    bool done = false;
    float* dst = nullptr;           // a receive's buffer
    std::vector<float> staging_in;  // an asynchronous collective's input
    size_t land_bytes = 0;          // bf16: the bytes that land (0: all of staging)
  };
  // An asynchronous collective: its input copied out now, its output landing when complete.
  std::shared_ptr<Transfer> staged(const void* send, size_t send_count, void* recv,
                                   size_t recv_count) {
    auto t = std::make_shared<Transfer>();
    t->staging_in.resize(send_count);
    t->staging.resize(recv_count);
    t->dst = static_cast<float*>(recv);
    StrictDeviceBackend::Open open(be_, /*op=*/false);
    copy_floats(t->staging_in.data(), send, send_count);
    return t;
  }
  class CollectiveWork final : public Work::Impl {
   public:
    CollectiveWork(std::shared_ptr<Transfer> t, StrictDeviceBackend& be)
        : t_(std::move(t)), be_(be) {}
    bool test() override {
      if (!t_->done && t_->host.test()) land();
      return t_->done;
    }
    void wait() override {
      if (t_->done) return;
      t_->host.wait();
      land();
    }
    const OpRecord& record() const override { return t_->host.record(); }

   private:
    void land() {
      StrictDeviceBackend::Open open(be_, /*op=*/false);
      if (t_->land_bytes > 0) std::memcpy(t_->dst, t_->staging.data(), t_->land_bytes);
      else copy_floats(t_->dst, t_->staging.data(), t_->staging.size());
      t_->done = true;
    }
    std::shared_ptr<Transfer> t_;
    StrictDeviceBackend& be_;
  };
  class TransferWork final : public Work::Impl {
   public:
    explicit TransferWork(std::shared_ptr<Transfer> t) : t_(std::move(t)) {}
    bool test() override { return t_->done || (t_->done = t_->host.test()); }
    void wait() override {
      if (!t_->done) t_->host.wait();
      t_->done = true;
    }
    const OpRecord& record() const override { return t_->host.record(); }

   private:
    std::shared_ptr<Transfer> t_;
  };

  void check_point_to_point(const char* op, ElemType type, int tag) {
    TRIDENT_CHECK(type == ElemType::kFloat32, "strict comm: float data only");
    TRIDENT_CHECK(tag == 0, "strict comm '{}': {} with tag {}; a device link pairs by order",
                  name(), op, tag);
    TRIDENT_CHECK(ordered_.recorded && ordered_.thread == std::this_thread::get_id() &&
                      ordered_.ops == be_.ops_on_this_thread(),
                  "strict comm '{}': a {} not ordered after the compute stream's last op (record "
                  "a mark, then order_after it, right before)",
                  name(), op);
    ++transfers_;
  }

  StrictDeviceBackend& be_;
  Communicator& host_;
  Mark ordered_;  // the last order_after's
  std::vector<std::shared_ptr<Transfer>> landing_;
  size_t transfers_ = 0;
  size_t orders_ = 0;
  std::array<size_t, 6> all_gather_bytes_{};  // per ElemType
  bool asynchronous_ = false;
};

}  // namespace trident::testing
