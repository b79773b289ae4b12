// Causal multi-head attention through cuDNN's fused scaled-dot-product attention, built with
// the backend graph C API (cudnn_graph.h; cudnn_frontend is not used). bf16 in and out, fp32
// softmax statistics. The packed qkv layout [B,T,3,NH,HS] is described to cuDNN by strides, so
// nothing is permuted. Plans are built once per shape and cached.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "cuda_check.h"

namespace trident::cuda {

class CudnnAttention {
 public:
  explicit CudnnAttention(cudnnHandle_t handle);  // the caller owns the handle
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Whether cuDNN builds a plan for this shape (forward and backward) on this GPU; `why` gets
  // cuDNN's reason when not. Cached per shape.
  bool supported(int B, int T, int C, int NH, std::string* why = nullptr);
  // Which backward graph (Note [cuDNN SDPA graph]) was planned for the shape, with the
  // refusals of those tried before it; "" if the shape has no plan.
  std::string backward_graph(int B, int T, int C, int NH);
  // out [B,T,C] bf16; stats [B,NH,T] fp32 (log-sum-exp per row, saved for backward).
  void forward(bf16* out, float* stats, const bf16* qkv, int B, int T, int C, int NH,
               cudaStream_t stream);
  // dqkv [B,T,3C] bf16 (assign).
  void backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* stats,
                int B, int T, int C, int NH, cudaStream_t stream);

  // Grouped-query attention, as the calls above with KVH key/value heads (NH % KVH == 0): qkv
  // rows [(NH + 2·KVH)·HS] are q | k | v, query head h reads kv head h / (NH/KVH); out and dout
  // [B,T,NH·HS]; dqkv's dK, dV are the sums over each kv head's query heads. KVH = NH and
  // HS = C/NH are the calls above (the same plans).
  bool supported_gqa(int B, int T, int NH, int KVH, int HS, std::string* why = nullptr);
  std::string backward_graph_gqa(int B, int T, int NH, int KVH, int HS);
  void forward_gqa(bf16* out, float* stats, const bf16* qkv, int B, int T, int NH, int KVH, int HS,
                   cudaStream_t stream);
  void backward_gqa(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                    const float* stats, int B, int T, int NH, int KVH, int HS, cudaStream_t stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trident::cuda
