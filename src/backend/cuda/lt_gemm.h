// bf16 GEMMs through cuBLASLt with fp32 accumulation, in the row-major terms of the Backend
// interface: fp32 output (optionally accumulated, or added to a separate fp32 C) or bf16 output
// (Note [bf16 activations]). Algorithms are chosen once per shape (heuristics) and cached.
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
  // D[M,N] (fp32) = C + op(A)·op(B) (+ bias): C fp32 [M,N], D may be C itself (in place).
  void matmul_add(float* D, const float* C, const bf16* A, const bf16* B, const float* bias,
                  int M, int N, int K, bool trans_a, bool trans_b, cudaStream_t stream);
  // D[M,N] (bf16) = bf16(op(A)·op(B) + bias): fp32 accumulation and bias, one rounding.
  void matmul_bf16(bf16* D, const bf16* A, const bf16* B, const float* bias, int M, int N, int K,
                   bool trans_a, bool trans_b, cudaStream_t stream);
  // Whether bf16-output GEMMs with a bias run through the fp32-output fallback (this cuBLASLt
  // had no algorithm for an fp32 bias with a bf16 D): for tests and the report, once one ran.
  bool bf16_bias_fallback_used() const { return bf16_bias_fallback_used_; }

 private:
  struct Plan;
  // M N K ta tb bias beta≠0, D bf16 (else fp32), C a separate input (else C is D), and the
  // alignments (bytes, at most 256) of A, B, C and D.
  using Key = std::tuple<int, int, int, bool, bool, bool, bool, bool, bool, uint32_t, uint32_t,
                         uint32_t, uint32_t>;
  // The cached plan; null when cuBLASLt has none and `may_refuse` (else that is an error).
  const Plan* plan_for(const Key& key, bool may_refuse);
  // D = beta·C + op(A)·op(B) + bias; false (nothing run) when there is no plan and may_refuse.
  bool run(void* D, const void* C, const bf16* A, const bf16* B, const float* bias, int M, int N,
           int K, bool trans_a, bool trans_b, float beta, bool d_bf16, bool may_refuse,
           cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Plan*> plans_;
  // fp32 staging of matmul_bf16's fallback (grow-only).
  float* fallback_ = nullptr;
  size_t fallback_floats_ = 0;
  bool bf16_bias_fallback_used_ = false;
};

}  // namespace trident::cuda
