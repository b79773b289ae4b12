// bf16 GEMMs through cuBLASLt with fp32 accumulation and fp32 output, in the row-major terms
// of the Backend interface. Algorithms are chosen once per shape (heuristics) and cached.
#pragma once

#include <cstdint>
#include <map>
#include <tuple>
#include <utility>

#include "cuda_check.h"

namespace trident::cuda {

class LtGemm {
 public:
  LtGemm();
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Row-major D[M,N] (fp32) = beta·D + op(A)·op(B) (+ bias[N] when bias is non-null, fp32),
  // with A, B bf16: op(A) is [M,K] (A stored [M,K], or [K,M] when trans_a), op(B) is [K,N]
  // (B stored [K,N], or [N,K] when trans_b).
  void matmul(float* D, const bf16* A, const bf16* B, const float* bias, int M, int N, int K,
              bool trans_a, bool trans_b, float beta, cudaStream_t stream);

 private:
  struct Plan;
  // M N K ta tb bias beta≠0, and the alignments (bytes, at most 256) of A, B and D.
  using Key = std::tuple<int, int, int, bool, bool, bool, bool, uint32_t, uint32_t, uint32_t>;
  const Plan& plan_for(const Key& key);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Plan*> plans_;
};

}  // namespace trident::cuda
