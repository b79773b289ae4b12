// CpuBackend: the Backend interface over the float instantiations of the CPU kernels.
//
// Threads: every kernel opens its own OpenMP team of `threads`, and GEMMs are split across that
// team with OpenBLAS itself single-threaded (Note [GEMM threading] in src/backend/gemm.cpp), so
// `threads` cores run everything and no second thread pool competes for them.
#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "backend/gemm.h"
#include "backend/kernels.h"
#include "trident/backend.h"
#include "trident/check.h"

namespace trident {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : threads_(threads) {
    TRIDENT_CHECK(threads >= 1, "the CPU backend needs at least 1 thread, got {}", threads);
    omp_set_num_threads(threads);  // for any OpenMP code outside the kernels
    openblas_set_num_threads(1);   // see Note [GEMM threading]
  }

  std::string name() const override { return "cpu"; }
  int threads() const override { return threads_; }

  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C) override {
    cpu::encoder_forward(out, tokens, wte, wpe, B, T, C, threads_);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C) override {
    cpu::encoder_backward(dwte, dwpe, dout, tokens, B, T, C, threads_);
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C) override {
    cpu::layernorm_forward(out, mean, rstd, inp, w, b, N, C, threads_);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N,
                          int C) override {
    cpu::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, threads_);
  }

  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int C,
                      int OC) override {
    cpu::matmul_forward(out, inp, w, bias, N, C, OC, threads_);
  }
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                       const float* w, int N, int C, int OC) override {
    cpu::matmul_backward(dinp, dw, dbias, dout, inp, w, N, C, OC, threads_);
  }
  void matmul_backward_weight_rows(float* dw, const float* dout, int ld, const float* inp, int N,
                                   int C, int rows) override {
    cpu::matmul_backward_weight_rows(dw, dout, ld, inp, N, C, rows, threads_);
  }
  void matmul_forward_grouped(float* out, const float* inp, const float* w, const int32_t* rows_at,
                              int E, int C, int OC) override {
    cpu::matmul_forward_grouped(out, inp, w, rows_at, E, C, OC, threads_);
  }
  void matmul_backward_grouped(float* dinp, float* dw, const float* dout, const float* inp,
                               const float* w, const int32_t* rows_at, int E, int C,
                               int OC) override {
    cpu::matmul_backward_grouped(dinp, dw, dout, inp, w, rows_at, E, C, OC, threads_);
  }

  // Note [Blockwise attention threshold]: the T×T op up to kTxTAttentionMaxT, blockwise beyond
  // (att then holds lse [B,NH,T], scratch delta [B,NH,T]).
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C,
                         int NH) override {
    TRIDENT_CHECK(NH > 0 && C % NH == 0, "C = {} is not a multiple of NH = {}", C, NH);
    attention_forward_gqa(out, att, qkv, B, T, NH, NH, C / NH);
  }
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                          const float* out, const float* att, int B, int T, int C,
                          int NH) override {
    TRIDENT_CHECK(NH > 0 && C % NH == 0, "C = {} is not a multiple of NH = {}", C, NH);
    attention_backward_gqa(dqkv, scratch, dout, qkv, out, att, B, T, NH, NH, C / NH);
  }

  void attention_forward_gqa(float* out, float* att, const float* qkv, int B, int T, int NH,
                             int KVH, int hs) override {
    check_heads(NH, KVH, hs);
    if (T <= cpu::kTxTAttentionMaxT)
      cpu::attention_forward_gqa(out, att, qkv, B, T, NH, KVH, hs, threads_);
    else cpu::attention_forward_blockwise(out, att, qkv, B, T, NH, KVH, hs, threads_);
  }
  void attention_backward_gqa(float* dqkv, float* scratch, const float* dout, const float* qkv,
                              const float* out, const float* att, int B, int T, int NH, int KVH,
                              int hs) override {
    check_heads(NH, KVH, hs);
    if (T <= cpu::kTxTAttentionMaxT)
      cpu::attention_backward_gqa(dqkv, scratch, dout, qkv, att, B, T, NH, KVH, hs, threads_);
    else
      cpu::attention_backward_blockwise(dqkv, scratch, dout, qkv, out, att, B, T, NH, KVH, hs,
                                        threads_);
  }
  // Monotone in T, so that buffers sized for the longest T hold a shorter T's T×T op too.
  size_t attention_saved_floats(int B, int T, int C, int NH) const override {
    (void)C;
    constexpr size_t kTb = cpu::kTxTAttentionMaxT;
    const size_t per_head = T <= int(kTb) ? size_t(T) * T : std::max(size_t(T), kTb * kTb);
    return size_t(B) * NH * per_head;
  }
  size_t attention_scratch_floats(int B, int T, int C, int NH) const override {
    return attention_saved_floats(B, T, C, NH);  // dP/dS [B,NH,T,T] or delta [B,NH,T]
  }

  void attention_block_forward(const AttentionBlockArgs& a) override {
    check_attention_block(a, "attention_block_forward");
    TRIDENT_CHECK(a.k && a.v && a.out && a.lse, "attention_block_forward: null k, v, out or lse");
    cpu::attention_block_forward(to_cpu(a), threads_);
  }
  void attention_block_backward(const AttentionBlockArgs& a) override {
    check_attention_block(a, "attention_block_backward");
    TRIDENT_CHECK(a.k && a.v && a.dout && a.lse && a.delta && a.dq && a.dk && a.dv,
                  "attention_block_backward: null k, v, dout, lse, delta, dq, dk or dv");
    cpu::attention_block_backward(to_cpu(a), threads_);
  }
  void attention_block_delta(const AttentionBlockArgs& a) override {
    check_attention_block(a, "attention_block_delta");
    TRIDENT_CHECK(a.out && a.dout && a.delta, "attention_block_delta: null out, dout or delta");
    cpu::attention_block_delta(to_cpu(a), threads_);
  }
  void attention_block_reset(const AttentionBlockArgs& a) override {
    check_attention_block(a, "attention_block_reset");
    TRIDENT_CHECK(a.lse, "attention_block_reset: null lse");
    cpu::attention_block_reset(to_cpu(a), threads_);
  }

  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C,
                       float eps) override {
    TRIDENT_CHECK(C > 0 && eps >= 0.0f, "rmsnorm: need C > 0 and eps >= 0, got C = {}, eps = {}", C,
                  eps);
    cpu::rmsnorm_forward(out, rstd, inp, w, N, C, eps, threads_);
  }
  void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                        const float* rstd, int N, int C) override {
    cpu::rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C, threads_);
  }

  void rope_forward(float* qkv, const float* cos, const float* sin, int N, int T, int NH, int KVH,
                    int hs, int rot) override {
    check_rope(T, NH, KVH, hs, rot);
    cpu::rope_forward(qkv, cos, sin, N, T, NH, KVH, hs, rot, threads_);
  }
  void rope_backward(float* dqkv, const float* cos, const float* sin, int N, int T, int NH, int KVH,
                     int hs, int rot) override {
    check_rope(T, NH, KVH, hs, rot);
    cpu::rope_backward(dqkv, cos, sin, N, T, NH, KVH, hs, rot, threads_);
  }

  void swiglu_forward(float* out, const float* inp, int N, int F) override {
    cpu::swiglu_forward(out, inp, N, F, threads_);
  }
  void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) override {
    cpu::swiglu_backward(dinp, inp, dout, N, F, threads_);
  }

  void gelu_erf_forward(float* out, const float* inp, size_t n) override {
    cpu::gelu_erf_forward(out, inp, n, threads_);
  }
  void gelu_erf_backward(float* dinp, const float* inp, const float* dout, size_t n) override {
    cpu::gelu_erf_backward(dinp, inp, dout, n, threads_);
  }

  void gelu_forward(float* out, const float* inp, size_t n) override {
    cpu::gelu_forward(out, inp, n, threads_);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) override {
    cpu::gelu_backward(dinp, inp, dout, n, threads_);
  }
  void add(float* out, const float* a, const float* b, size_t n) override {
    cpu::add(out, a, b, n, threads_);
  }

  void crossentropy_forward(float* losses, float* logits_to_probs, const int32_t* targets, int N,
                            int V, int Vp) override {
    TRIDENT_CHECK(0 < V && V <= Vp, "need 0 < V <= Vp, got V = {}, Vp = {}", V, Vp);
    cpu::crossentropy_forward(losses, logits_to_probs, targets, N, V, Vp, threads_);
  }
  void crossentropy_backward(float* probs_to_dlogits, const int32_t* targets, float dloss, int N,
                             int V, int Vp) override {
    TRIDENT_CHECK(0 < V && V <= Vp, "need 0 < V <= Vp, got V = {}, Vp = {}", V, Vp);
    cpu::crossentropy_backward(probs_to_dlogits, targets, dloss, N, V, Vp, threads_);
  }

  double sum_squares(const float* x, size_t n) override { return cpu::sum_squares(x, n, threads_); }
  void adamw_update(float* params, float* m, float* v, const float* grads, size_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, int t,
                    float grad_scale) override {
    TRIDENT_CHECK(t >= 1, "AdamW step t is 1-based, got {}", t);
    cpu::adamw_update(params, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale,
                      threads_);
  }

  // The same product (2048³) in both, so train's and bench's peaks compare. Careful: best of
  // 5-10 runs (~1-2 s with the right kernel); brief: best of 2 after the warm-up (~0.3 s at
  // 2 threads, ~0.6 s at 1).
  double measure_gemm_peak_flops() override {
    return cpu::measure_sgemm_flops(threads_, 2048, /*budget_s=*/2.0, /*min_runs=*/5);
  }
  double measure_gemm_peak_flops_brief() override {
    return cpu::measure_sgemm_flops(threads_, 2048, /*budget_s=*/0.2, /*min_runs=*/2);
  }

 private:
  static void check_heads(int NH, int KVH, int hs) {
    TRIDENT_CHECK(KVH > 0 && NH % KVH == 0 && hs > 0,
                  "attention: kv heads {} must divide heads {}, head size {} > 0", KVH, NH, hs);
  }
  static cpu::AttentionBlockArgs<float> to_cpu(const AttentionBlockArgs& a) {
    cpu::AttentionBlockArgs<float> c;
    c.B = a.B, c.NH = a.NH, c.KVH = a.KVH, c.hs = a.hs, c.Tq = a.Tq, c.Tk = a.Tk;
    c.q_pos = a.q_pos, c.k_pos = a.k_pos;
    c.q = a.q, c.q_bstride = a.q_bstride, c.q_rstride = a.q_rstride;
    c.k = a.k, c.v = a.v, c.kv_bstride = a.kv_bstride, c.kv_rstride = a.kv_rstride;
    c.out = a.out, c.dout = a.dout, c.o_bstride = a.o_bstride, c.o_rstride = a.o_rstride;
    c.lse = a.lse, c.delta = a.delta, c.s_bstride = a.s_bstride, c.s_hstride = a.s_hstride;
    c.dq = a.dq, c.dk = a.dk, c.dv = a.dv;
    return c;
  }
  static void check_rope(int T, int NH, int KVH, int hs, int rot) {
    check_heads(NH, KVH, hs);
    TRIDENT_CHECK(T > 0 && rot >= 0 && rot % 2 == 0 && rot <= hs,
                  "rope: need T > 0 and an even rot in [0, hs], got T = {}, rot = {}, hs = {}", T,
                  rot, hs);
  }

  int threads_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) {
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace trident
