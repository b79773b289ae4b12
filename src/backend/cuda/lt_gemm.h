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

// What runs after a GEMM's product: cuBLASLt's epilogue, in our row-major terms
// (Note [cuBLASLt epilogues] in src/backend/cuda/lt_gemm.cpp).
enum class LtEpilogue : uint8_t {
  kNone,
  kBias,
  kGeluAux,
  kGeluAuxBias,
  kDGelu,
  kDGeluBgrad,
  kBgradA
};

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
  void matmul_add(float* D, const float* C, const bf16* A, const bf16* B, const float* bias, int M,
                  int N, int K, bool trans_a, bool trans_b, cudaStream_t stream);
  // D[M,N] (bf16) = bf16(op(A)·op(B) + bias): fp32 accumulation and bias, one rounding (the
  // bias rounded to bf16 first where cuBLASLt takes no fp32 one: Note [cuBLASLt epilogues]).
  void matmul_bf16(bf16* D, const bf16* A, const bf16* B, const float* bias, int M, int N, int K,
                   bool trans_a, bool trans_b, cudaStream_t stream);
  // The fusions below return false, having run nothing, where this cuBLASLt has no algorithm
  // for them, refuses the call, or an operand breaks their alignment rules; the caller then
  // runs the unfused ops (Note [cuBLASLt epilogues]).
  //
  // D (bf16) = bf16(gelu(op(A)·op(B) + bias)) and aux (bf16, D's shape) = bf16(op(A)·op(B) +
  // bias), the GELU's input that backward reads; bias fp32 or null.
  bool matmul_gelu_bf16(bf16* D, bf16* aux, const bf16* A, const bf16* B, const float* bias, int M,
                        int N, int K, bool trans_a, bool trans_b, cudaStream_t stream);
  // D (bf16) = bf16(gelu'(aux) ⊙ op(A)·op(B)), aux (bf16, D's shape) being the GELU's input;
  // bias_grad[N] (fp32, when non-null) = the column sums of gelu'(aux) ⊙ op(A)·op(B) before
  // D's rounding, written (not added).
  bool matmul_dgelu_bf16(bf16* D, float* bias_grad, const bf16* A, const bf16* B, const bf16* aux,
                         int M, int N, int K, bool trans_a, bool trans_b, cudaStream_t stream);
  // As matmul (fp32 D, beta·D +), and bias_grad[M] (fp32) = the row sums of op(A), written
  // (not added): a weight gradient doutᵀ·inp and its bias gradient Σ dout in one pass over dout.
  bool matmul_bgrad_a(float* D, float* bias_grad, const bf16* A, const bf16* B, int M, int N, int K,
                      bool trans_a, bool trans_b, float beta, cudaStream_t stream);
  // Whether bf16-output GEMMs with a bias run through the fp32-output fallback (this cuBLASLt
  // took neither an fp32 nor a bf16 bias with a bf16 D): for tests and the report, once one ran.
  bool bf16_bias_fallback_used() const { return bf16_bias_fallback_used_; }
  // The rate of matmul (bf16 inputs, fp32 accumulation and output: every model GEMM's
  // configuration) at 8192³ on nonzero data, in FLOP/s: the MFU denominator. Its 768 MiB of
  // operands are allocated for the measurement and freed after it (cudaFree waits for the device:
  // call it before the steps, with no collective in flight).
  double measure_peak_flops(cudaStream_t stream);

 private:
  struct Plan;
  using Epilogue = LtEpilogue;
  // The epilogue's operands: the bias (kBias, kGeluAuxBias) or the bias gradient it writes
  // (kDGeluBgrad, kBgradA), and the aux matrix (the kGelu* and kDGelu* kinds) of D's shape.
  struct EpilogueArgs {
    Epilogue kind = Epilogue::kNone;
    const void* bias = nullptr;
    const void* aux = nullptr;
    bool bias_bf16 = false;  // the bias vector is bf16 (else fp32)
  };
  // M N K ta tb epilogue, beta≠0, D bf16 (else fp32), C a separate input (else C is D), the
  // alignments (bytes, at most 256) of A, B, C, D, the bias vector and the aux matrix (the
  // heuristic reads the epilogue's pointers for theirs), and the bias vector bf16.
  using Key = std::tuple<int, int, int, bool, bool, Epilogue, bool, bool, bool, uint32_t, uint32_t,
                         uint32_t, uint32_t, uint32_t, uint32_t, bool>;
  // The cached plan; null when cuBLASLt has none and `may_refuse` (else that is an error).
  // `ep`'s pointers are set on the plan before the heuristic is asked.
  const Plan* plan_for(const Key& key, const EpilogueArgs& ep, bool may_refuse);
  // D = beta·C + op(A)·op(B), then the epilogue; false (nothing run) when there is no plan and
  // may_refuse.
  bool run(void* D, const void* C, const bf16* A, const bf16* B, const EpilogueArgs& epilogue,
           int M, int N, int K, bool trans_a, bool trans_b, float beta, bool d_bf16,
           bool may_refuse, cudaStream_t stream);
  // run() for a fused op (may refuse); the first refusal of each epilogue kind is printed.
  bool run_fused(void* D, const bf16* A, const bf16* B, const EpilogueArgs& ep, int M, int N, int K,
                 bool trans_a, bool trans_b, float beta, bool d_bf16, cudaStream_t stream);
  // run() for an epilogue that adds an fp32 bias[N] to a bf16 D (kBias, kGeluAuxBias), which
  // may refuse: with the fp32 bias, else with it rounded to bf16 (Note [cuBLASLt epilogues]).
  bool run_bf16_bias(void* D, const bf16* A, const bf16* B, EpilogueArgs ep, int M, int N, int K,
                     bool trans_a, bool trans_b, cudaStream_t stream);
  void note_refusal(Epilogue kind, int M, int N, int K);
  static EpilogueArgs bias_only(const float* bias) {
    return {bias ? Epilogue::kBias : Epilogue::kNone, bias, nullptr};
  }

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Plan*> plans_;
  // fp32 staging of matmul_bf16's fallback (grow-only).
  float* fallback_ = nullptr;
  size_t fallback_floats_ = 0;
  bool bf16_bias_fallback_used_ = false;
  uint32_t refusals_noted_ = 0;  // bit k: epilogue kind k was refused and said so
  // run_bf16_bias's bf16 copy of a bias (grow-only), and whether it was used and said so.
  bf16* bias16_ = nullptr;
  size_t bias16_elems_ = 0;
  bool bias16_noted_ = false;
};

}  // namespace trident::cuda
