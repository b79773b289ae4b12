// The CUDA backend's attention path per shape (attention_choice.h).
#include "backend/cuda/attention_choice.h"

#include <fmt/format.h>

#include "attention_cudnn.h"
#include "attention_flash.h"
#include "trident/check.h"

namespace trident::cuda {
namespace {

// The shape in words, for the messages and notes only (never per op).
std::string shape_words(int B, int T, int NH, int KVH, int HS) {
  return KVH == NH ? fmt::format("B={} T={} C={} NH={}", B, T, NH * HS, NH)
                   : fmt::format("B={} T={} C={} NH={} KVH={}", B, T, NH * HS, NH, KVH);
}

}  // namespace

bool AttentionChoice::use_cudnn(CudnnAttention& cudnn, int B, int T, int NH, int KVH, int HS) {
  if (mode_ == "flash") {
    if (note_.empty()) note_ = "flash kernel, fp32 (run.attention: flash)";
    return false;
  }
  std::string why;
  const bool ok = cudnn.supported_gqa(B, T, NH, KVH, HS, &why);
  if (mode_ == "cudnn" && !ok)
    input_error("run.attention is cudnn, but cuDNN has no fused-attention plan for {}: {}",
                shape_words(B, T, NH, KVH, HS), why);
  if (!ok && !flash_attention_supported(HS))
    input_error("attention with head size {} has neither a cuDNN plan ({}) nor a flash "
                "kernel (head sizes 32, 64, 128)",
                HS, why);
  // Said once per shape: a refusal under run.attention auto falls back to the fp32 flash
  // kernel in both directions, which costs a GPT-2 step a lot, so it must be visible. (A
  // tuple key and a note rewritten only for a larger shape: nothing is formatted per op.)
  if (!ok && said_.insert({B, T, NH, KVH, HS}).second)
    fmt::print(stderr,
               "cuda backend: cuDNN has no fused-attention plan for {} ({}); that attention "
               "runs on the fp32 flash kernel\n",
               shape_words(B, T, NH, KVH, HS), why);
  if (size_t(B) * T > largest_tokens_) {
    largest_tokens_ = size_t(B) * T;  // the note is the largest shape's (training's)
    note_ = ok ? fmt::format("cuDNN fused SDPA, bf16 ({}; backward graph: {})",
                             shape_words(B, T, NH, KVH, HS),
                             cudnn.backward_graph_gqa(B, T, NH, KVH, HS))
               : fmt::format("flash kernel, fp32 ({}): cuDNN refused: {}",
                             shape_words(B, T, NH, KVH, HS), why);
  }
  return ok;
}

}  // namespace trident::cuda
