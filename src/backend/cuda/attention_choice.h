// Which attention the CUDA backend runs for a shape (run.attention: auto, cudnn or flash), and
// what it says about that: src/backend/cuda/cuda_backend.cpp is the one user.
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <tuple>
#include <utility>

namespace trident::cuda {

class CudnnAttention;

// cuDNN's fused attention where it has a plan for the shape, else the fp32 flash kernel; a
// refusal under auto is said once per shape on stderr, one that no path can run is an input
// error. note() names the path of the largest shape asked (training's).
class AttentionChoice {
 public:
  explicit AttentionChoice(std::string mode) : mode_(std::move(mode)) {}

  // Whether `cudnn` runs this shape (input_error where neither path can).
  bool use_cudnn(CudnnAttention& cudnn, int B, int T, int NH, int KVH, int HS);
  const std::string& note() const { return note_; }

 private:
  std::string mode_;  // run.attention
  std::string note_;
  size_t largest_tokens_ = 0;                           // B·T of the note
  std::set<std::tuple<int, int, int, int, int>> said_;  // (B, T, NH, KVH, HS) refusals said
};

}  // namespace trident::cuda
