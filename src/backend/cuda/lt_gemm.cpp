// Note [Row-major GEMMs in cuBLASLt]: cuBLASLt is column-major. A row-major matrix X[r,c] is
// the column-major matrix Xᵀ[c,r] with leading dimension c, so the row-major product
// D[M,N] = op(A)·op(B) is computed as the column-major Dᵀ[N,M] = op(B)ᵀ·op(A)ᵀ: cuBLASLt's
// "A" is our B and its "B" our A, with the same transpose flags, and the bias (one value per
// column of row-major D) is cuBLASLt's per-row bias of Dᵀ (CUBLASLT_EPILOGUE_BIAS).
#include "lt_gemm.h"

#include <fmt/format.h>

#include "elementwise.h"

namespace trident::cuda {
namespace {

// The largest power of two, at most 256, that divides the address. cuBLASLt's heuristic assumes
// 256-byte-aligned operands unless told otherwise (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES),
// and a kernel chosen for aligned operands may fault on a slice that is not.
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

}  // namespace

struct LtGemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (op) cublasLtMatmulDescDestroy(op);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};

LtGemm::LtGemm() {
  TRIDENT_CUBLAS(cublasLtCreate(&handle_));
  // 32 MiB: what NVIDIA recommends for Hopper so every kernel choice is available.
  workspace_bytes_ = size_t(32) << 20;
  TRIDENT_CUDA(cudaMalloc(&workspace_, workspace_bytes_));
}

LtGemm::~LtGemm() {
  for (auto& [key, plan] : plans_) delete plan;
  cudaFree(fallback_);
  cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

const LtGemm::Plan* LtGemm::plan_for(const Key& key, bool may_refuse) {
  auto it = plans_.find(key);
  if (it != plans_.end()) {
    TRIDENT_CHECK(it->second || may_refuse, "LtGemm: a refused plan asked for without refusal");
    return it->second;
  }
  const auto [M, N, K, trans_a, trans_b, has_bias, accumulate, d_bf16, c_separate, align_a,
              align_b, align_c, align_d] = key;
  (void)accumulate, (void)c_separate;  // they change the call, not the plan; keyed to be safe
  auto plan = new Plan();
  plans_[key] = plan;
  // cuBLASLt's operands (Note [Row-major GEMMs in cuBLASLt]): its A is our B, stored
  // column-major as [N,K] (op N) or [K,N] (op T); its B is our A: [K,M] (N) or [M,K] (T).
  const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  TRIDENT_CUBLAS(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  TRIDENT_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                                sizeof(op_a)));
  TRIDENT_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                                sizeof(op_b)));
  if (has_bias) {
    // An fp32 bias also with a bf16 D: the bf16 op adds the fp32 bias before its one rounding
    // (Note [bf16 activations]). cuBLASLt's default bias type is D's type; whether it takes fp32
    // with a bf16 D is the heuristic's answer (matmul_bf16 falls back when it has none).
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_32F;
    TRIDENT_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                  &epilogue, sizeof(epilogue)));
    TRIDENT_CUBLAS(cublasLtMatmulDescSetAttribute(
        plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  }
  // Column-major shapes (rows, cols, leading dimension) of cuBLASLt's A, B and D. C has D's
  // layout and type (cuBLASLt wants Ctype = Dtype outside fp8), so one descriptor serves both.
  const uint64_t a_rows = trans_b ? K : N, a_cols = trans_b ? N : K;
  const uint64_t b_rows = trans_a ? M : K, b_cols = trans_a ? K : M;
  TRIDENT_CUBLAS(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, a_rows, a_cols, a_rows));
  TRIDENT_CUBLAS(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, b_rows, b_cols, b_rows));
  TRIDENT_CUBLAS(
      cublasLtMatrixLayoutCreate(&plan->d, d_bf16 ? CUDA_R_16BF : CUDA_R_32F, N, M, N));

  cublasLtMatmulPreference_t pref;
  TRIDENT_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  TRIDENT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_, sizeof(workspace_bytes_)));
  // cuBLASLt's A is our B and its B our A (Note [Row-major GEMMs in cuBLASLt]).
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}};
  for (const auto& [attr, bytes] : alignments)
    TRIDENT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof(bytes)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t rc = cublasLtMatmulAlgoGetHeuristic(
      handle_, plan->op, plan->a, plan->b, plan->d, plan->d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  const bool none = rc != CUBLAS_STATUS_SUCCESS || found == 0;
  if (none && may_refuse) {  // any refusal: the caller has a path that needs no such plan
    delete plan;
    plans_[key] = nullptr;  // asked once per key
    return nullptr;
  }
  if (rc != CUBLAS_STATUS_NOT_SUPPORTED) TRIDENT_CUBLAS(rc);  // NOT_SUPPORTED: no algorithm
  if (none) {
    internal_error(__FILE__, __LINE__,
                   fmt::format("cuBLASLt has no algorithm for a bf16 GEMM M={} N={} K={} "
                               "(trans_a {}, trans_b {}, bias {}, D {})",
                               M, N, K, trans_a, trans_b, has_bias, d_bf16 ? "bf16" : "fp32"));
  }
  plan->algo = result.algo;
  return plan;
}

bool LtGemm::run(void* D, const void* C, const bf16* A, const bf16* B, const float* bias, int M,
                 int N, int K, bool trans_a, bool trans_b, float beta, bool d_bf16,
                 bool may_refuse, cudaStream_t stream) {
  // The bias epilogue has no alignment preference; kernels may read it 16 bytes at a time.
  TRIDENT_CHECK(!bias || alignment_of(bias) >= 16,
                "LtGemm: the bias must be 16-byte aligned (N={})", N);
  const Plan* plan = plan_for({M, N, K, trans_a, trans_b, bias != nullptr, beta != 0.0f, d_bf16,
                               C != D, alignment_of(A), alignment_of(B), alignment_of(C),
                               alignment_of(D)},
                              may_refuse);
  if (!plan) return false;
  if (bias)
    TRIDENT_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                  &bias, sizeof(bias)));
  const float alpha = 1.0f;
  TRIDENT_CUBLAS(cublasLtMatmul(handle_, plan->op, &alpha, B, plan->a, A, plan->b, &beta, C,
                                plan->d, D, plan->d, &plan->algo, workspace_, workspace_bytes_,
                                stream));
  return true;
}

void LtGemm::matmul(float* D, const bf16* A, const bf16* B, const float* bias, int M, int N,
                    int K, bool trans_a, bool trans_b, float beta, cudaStream_t stream) {
  run(D, D, A, B, bias, M, N, K, trans_a, trans_b, beta, false, false, stream);
}

// C as cuBLASLt's C with beta = 1, rather than a copy of C into D and then beta = 1: one pass
// over C fewer. C and D share one layout; C == D is cuBLASLt's in-place case.
void LtGemm::matmul_add(float* D, const float* C, const bf16* A, const bf16* B, const float* bias,
                        int M, int N, int K, bool trans_a, bool trans_b, cudaStream_t stream) {
  TRIDENT_CHECK(M >= 0 && N >= 0 && K > 0, "LtGemm::matmul_add: M={} N={} K={}", M, N, K);
  if (M == 0 || N == 0) return;
  TRIDENT_CHECK(D && C && A && B, "LtGemm::matmul_add: null pointer");
  run(D, C, A, B, bias, M, N, K, trans_a, trans_b, 1.0f, false, false, stream);
}

void LtGemm::matmul_bf16(bf16* D, const bf16* A, const bf16* B, const float* bias, int M, int N,
                         int K, bool trans_a, bool trans_b, cudaStream_t stream) {
  TRIDENT_CHECK(M >= 0 && N >= 0 && K > 0, "LtGemm::matmul_bf16: M={} N={} K={}", M, N, K);
  if (M == 0 || N == 0) return;
  TRIDENT_CHECK(D && A && B, "LtGemm::matmul_bf16: null pointer");
  if (run(D, D, A, B, bias, M, N, K, trans_a, trans_b, 0.0f, true, bias != nullptr, stream))
    return;
  // No algorithm for an fp32 bias with a bf16 D: the fp32 GEMM with its bias into staging,
  // then one rounding — the same result (a bf16 bias would round the bias too), one more pass.
  const size_t n = size_t(M) * N;
  if (n > fallback_floats_) {
    TRIDENT_CUDA(cudaFree(fallback_));  // waits for the device: kernels using it finish first
    fallback_ = nullptr;
    fallback_floats_ = 0;
    TRIDENT_CUDA(cudaMalloc(&fallback_, n * sizeof(float)));
    fallback_floats_ = n;
  }
  if (!bf16_bias_fallback_used_)  // once per LtGemm: it costs a pass, so say so
    fmt::print(stderr, "LtGemm: cuBLASLt has no bf16-output GEMM with an fp32 bias (M={} N={} "
               "K={}); such GEMMs run with an fp32 output and a cast\n", M, N, K);
  bf16_bias_fallback_used_ = true;
  run(fallback_, fallback_, A, B, bias, M, N, K, trans_a, trans_b, 0.0f, false, false, stream);
  cast_f32_to_bf16_cuda(D, fallback_, n, stream);
}

}  // namespace trident::cuda
