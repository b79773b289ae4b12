// CudaBackend's bf16 ops (the class: cuda_backend.h; Note [bf16 activations] in
// src/backend/bf16_ops.cpp, whose host definitions are these ops' reference). Native: every GEMM
// reads its bf16 operands as they are (no cast pass) and writes a bf16 D or adds into fp32; the
// row and elementwise kernels read and write bf16 directly. The op kinds are the fp32 ops'
// names, so the op-time table compares the two paths.
#include <cstddef>
#include <cstdint>

#include "attention_flash.h"
#include "backend/cuda/cuda_backend.h"
#include "bias_grad.h"
#include "crossentropy.h"
#include "elementwise.h"
#include "layernorm.h"
#include "optimizer.h"
#include "rmsnorm.h"
#include "rope.h"
#include "swiglu.h"

namespace trident {

using cuda::bf16;

void CudaBackend::into_bf16(bf16* out, const float* x, size_t n) {
  CastSpan span(*this);
  cuda::cast_f32_to_bf16_cuda(out, x, n, stream_);
}

void CudaBackend::cast_to_bf16(bfloat16* out, const float* inp, size_t n) {
  Op op(*this, "cast bf16");
  cuda::cast_f32_to_bf16_cuda(dev(out), inp, n, stream_);
}

void CudaBackend::cast_to_fp32(float* out, const bfloat16* inp, size_t n) {
  Op op(*this, "cast fp32");
  cuda::cast_bf16_to_f32_cuda(out, dev(inp), 1.0f, n, stream_);
}

void CudaBackend::adamw_update_bf16(float* params, bfloat16* params16, float* m, float* v,
                                    const float* grads, size_t n, float lr, float beta1,
                                    float beta2, float eps, float weight_decay, int t,
                                    float grad_scale) {
  Op op(*this, "adamw");
  cuda::adamw_update_cuda(params, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, t,
                          grad_scale, dev(params16), stream_);
}

void CudaBackend::layernorm_forward_bf16(bfloat16* out, float* mean, float* rstd, const float* inp,
                                         const float* w, const float* b, int N, int C) {
  Op op(*this, "layernorm fwd");
  cuda::layernorm_forward_bf16_cuda(dev(out), mean, rstd, inp, w, b, N, C, stream_);
}

void CudaBackend::layernorm_backward_add_bf16(float* dresidual, bfloat16* dresidual16, float* dw,
                                              float* db, const bfloat16* dout, const float* inp,
                                              const float* w, const float* mean, const float* rstd,
                                              int N, int C) {
  Op op(*this, "layernorm bwd");
  float* scratch = reduce_scratch_.of<float>(cuda::layernorm_backward_scratch_floats(N, C));
  cuda::layernorm_backward_add_bf16_cuda(dresidual, dev(dresidual16), dw, db, scratch, dev(dout),
                                         inp, w, mean, rstd, N, C, stream_);
}

void CudaBackend::matmul_forward_bf16(bfloat16* out, const bfloat16* inp, const bfloat16* w,
                                      const float* bias, int N, int C, int OC) {
  Op op(*this, "matmul fwd");
  // out[N,OC] = bf16(inp[N,C] · w[OC,C]ᵀ + bias)
  gemm_->matmul_bf16(dev(out), dev(inp), dev(w), bias, N, OC, C, false, true, stream_);
}

void CudaBackend::matmul_forward_add_bf16(float* out, const float* residual, const bfloat16* inp,
                                          const bfloat16* w, const float* bias, int N, int C,
                                          int OC) {
  Op op(*this, "matmul fwd");
  // out[N,OC] = residual + inp[N,C] · w[OC,C]ᵀ + bias: the residual is cuBLASLt's C; without
  // one, beta 0 and an fp32 D (a row-parallel partial sum: Note [bf16 with tp])
  if (!residual) gemm_->matmul(out, dev(inp), dev(w), bias, N, OC, C, false, true, 0.0f, stream_);
  else gemm_->matmul_add(out, residual, dev(inp), dev(w), bias, N, OC, C, false, true, stream_);
}

void CudaBackend::matmul_backward_input_fp32_bf16(float* dinp, const bfloat16* dout,
                                                  const bfloat16* w, int N, int C, int OC) {
  Op op(*this, "matmul bwd");
  if (N == 0) return;  // dinp[N,C] = dout[N,OC] · w[OC,C], fp32 D (D's layout type)
  gemm_->matmul(dinp, dev(dout), dev(w), nullptr, N, C, OC, false, false, 0.0f, stream_);
}

void CudaBackend::matmul_backward_bf16(bfloat16* dinp, float* dw, float* dbias,
                                       const bfloat16* dout, const bfloat16* inp, const bfloat16* w,
                                       int N, int C, int OC) {
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

void CudaBackend::matmul_gelu_forward_bf16(bfloat16* out, bfloat16* pre, const bfloat16* inp,
                                           const bfloat16* w, const float* bias, int N, int C,
                                           int OC) {
  Op op(*this, "matmul fwd");
  if (N == 0) return;
  // out, pre [N,OC] from inp[N,C] · w[OC,C]ᵀ + bias
  if (gemm_->matmul_gelu_bf16(dev(out), dev(pre), dev(inp), dev(w), bias, N, OC, C, false, true,
                              stream_))
    return;
  gemm_->matmul_bf16(dev(pre), dev(inp), dev(w), bias, N, OC, C, false, true, stream_);
  cuda::gelu_forward_bf16_cuda(dev(out), dev(pre), size_t(N) * OC, stream_);
}

void CudaBackend::matmul_dgelu_backward_bf16(bfloat16* dpre, float* dbias, const bfloat16* dout,
                                             const bfloat16* w, const bfloat16* pre, int N, int C,
                                             int OC) {
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

void CudaBackend::attention_forward_bf16(bfloat16* out, float* att, const bfloat16* qkv, int B,
                                         int T, int C, int NH) {
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

void CudaBackend::attention_backward_bf16(bfloat16* dqkv, float* scratch, const bfloat16* dout,
                                          const bfloat16* qkv, const bfloat16* out,
                                          const float* att, int B, int T, int C, int NH) {
  Op op(*this, "attention bwd");
  if (use_cudnn(B, T, C, NH)) {
    cudnn_attention_->backward(dev(dqkv), dev(dout), dev(qkv), dev(out), att, B, T, C, NH, stream_);
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

void CudaBackend::gelu_forward_bf16(bfloat16* out, const bfloat16* inp, size_t n) {
  Op op(*this, "gelu fwd");
  cuda::gelu_forward_bf16_cuda(dev(out), dev(inp), n, stream_);
}

void CudaBackend::gelu_backward_bf16(bfloat16* dinp, const bfloat16* inp, const bfloat16* dout,
                                     size_t n) {
  Op op(*this, "gelu bwd");
  cuda::gelu_backward_bf16_cuda(dev(dinp), dev(inp), dev(dout), n, stream_);
}

bool CudaBackend::has_bf16_family_ops() const { return true; }

void CudaBackend::rmsnorm_forward_bf16(bfloat16* out, float* rstd, const float* inp, const float* w,
                                       int N, int C, float eps) {
  Op op(*this, "rmsnorm fwd");
  cuda::rmsnorm_forward_bf16_cuda(dev(out), rstd, inp, w, N, C, eps, stream_);
}

void CudaBackend::rmsnorm_backward_add_bf16(float* dresidual, bfloat16* dresidual16, float* dw,
                                            const bfloat16* dout, const float* inp, const float* w,
                                            const float* rstd, int N, int C) {
  Op op(*this, "rmsnorm bwd");
  float* scratch = reduce_scratch_.of<float>(cuda::rmsnorm_backward_scratch_floats(N, C));
  cuda::rmsnorm_backward_add_bf16_cuda(dresidual, dev(dresidual16), dw, scratch, dev(dout), inp, w,
                                       rstd, N, C, stream_);
}

void CudaBackend::rope_forward_bf16(bfloat16* qkv, const float* cos, const float* sin, int N, int T,
                                    int NH, int KVH, int hs, int rot) {
  Op op(*this, "rope fwd");
  cuda::rope_forward_bf16_cuda(dev(qkv), cos, sin, N, T, NH, KVH, hs, rot, stream_);
}

void CudaBackend::rope_backward_bf16(bfloat16* dqkv, const float* cos, const float* sin, int N,
                                     int T, int NH, int KVH, int hs, int rot) {
  Op op(*this, "rope bwd");
  cuda::rope_backward_bf16_cuda(dev(dqkv), cos, sin, N, T, NH, KVH, hs, rot, stream_);
}

void CudaBackend::swiglu_forward_bf16(bfloat16* out, const bfloat16* inp, int N, int F) {
  Op op(*this, "swiglu fwd");
  cuda::swiglu_forward_bf16_cuda(dev(out), dev(inp), N, F, stream_);
}

void CudaBackend::swiglu_backward_bf16(bfloat16* dinp, const bfloat16* inp, const bfloat16* dout,
                                       int N, int F) {
  Op op(*this, "swiglu bwd");
  cuda::swiglu_backward_bf16_cuda(dev(dinp), dev(inp), dev(dout), N, F, stream_);
}

void CudaBackend::gelu_erf_forward_bf16(bfloat16* out, const bfloat16* inp, size_t n) {
  Op op(*this, "gelu erf fwd");
  cuda::gelu_erf_forward_bf16_cuda(dev(out), dev(inp), n, stream_);
}

void CudaBackend::gelu_erf_backward_bf16(bfloat16* dinp, const bfloat16* inp, const bfloat16* dout,
                                         size_t n) {
  Op op(*this, "gelu erf bwd");
  cuda::gelu_erf_backward_bf16_cuda(dev(dinp), dev(inp), dev(dout), n, stream_);
}

void CudaBackend::attention_forward_gqa_bf16(bfloat16* out, float* att, const bfloat16* qkv, int B,
                                             int T, int NH, int KVH, int hs) {
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

void CudaBackend::attention_backward_gqa_bf16(bfloat16* dqkv, float* scratch, const bfloat16* dout,
                                              const bfloat16* qkv, const bfloat16* out,
                                              const float* att, int B, int T, int NH, int KVH,
                                              int hs) {
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
  cuda::flash_attention_backward_gqa_cuda(dqkv32, scratch, dout32, qkv32, out32, att, B, T, NH, KVH,
                                          hs, stream_);
  into_bf16(dev(dqkv), dqkv32, n3);
}

void CudaBackend::crossentropy_fused_bf16(float* losses, bfloat16* logits_to_dlogits,
                                          const int32_t* targets, float dloss, int N, int V,
                                          int Vp) {
  Op op(*this, "crossentropy fwd");
  cuda::crossentropy_fused_bf16_cuda(losses, dev(logits_to_dlogits), targets, dloss, N, V, Vp,
                                     stream_);
}

}  // namespace trident
