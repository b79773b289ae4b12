// Shared by the attention tests and benchmarks: random inputs with the CPU twin's outputs
// (Backend::attention_forward/backward), and the host bf16 conversions cuDNN's inputs need.
#pragma once

#include <bit>
#include <cstdint>
#include <random>
#include <vector>

#include "kernel_checks.h"

namespace trident::testing {

// bf16 bit patterns, rounded to nearest even like __float2bfloat16 (bf16_round), and back.
inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out[i] = uint16_t(std::bit_cast<uint32_t>(bf16_round(v[i])) >> 16);
  return out;
}
inline std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = std::bit_cast<float>(uint32_t(v[i]) << 16);
  return out;
}
inline cuda::bf16* as_bf16(DeviceBuffer<uint16_t>& b) {
  return reinterpret_cast<cuda::bf16*>(b.get());
}

// A cuDNN handle for the lifetime of a test or benchmark.
class CudnnHandle {
 public:
  CudnnHandle() { TRIDENT_CUDNN(cudnnCreate(&handle_)); }
  ~CudnnHandle() { cudnnDestroy(handle_); }
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;
  cudnnHandle_t get() const { return handle_; }

 private:
  cudnnHandle_t handle_ = nullptr;
};

// qkv [B,T,3C] and dout [B,T,C] uniform in [-1, 1] (rounded to bf16 first when `bf16_inputs`,
// so that the CPU twin sees exactly what cuDNN sees), and the CPU twin's out and dqkv.
struct AttentionReference {
  std::vector<float> qkv, dout, out, dqkv;
};
inline AttentionReference attention_reference(int B, int T, int C, int NH, bool bf16_inputs,
                                              uint32_t seed) {
  std::mt19937 rng(seed);
  AttentionReference r;
  r.qkv = to_float(uniform(size_t(B) * T * 3 * C, rng));
  r.dout = to_float(uniform(size_t(B) * T * C, rng));
  if (bf16_inputs) {
    r.qkv = from_bf16(to_bf16(r.qkv));
    r.dout = from_bf16(to_bf16(r.dout));
  }
  auto cpu = make_cpu_backend(1);
  std::vector<float> att(size_t(B) * NH * T * T), scratch(att.size());
  r.out.resize(size_t(B) * T * C);
  r.dqkv.resize(r.qkv.size());
  cpu->attention_forward(r.out.data(), att.data(), r.qkv.data(), B, T, C, NH);
  cpu->attention_backward(r.dqkv.data(), scratch.data(), r.dout.data(), r.qkv.data(), r.out.data(),
                          att.data(), B, T, C, NH);
  return r;
}

}  // namespace trident::testing
