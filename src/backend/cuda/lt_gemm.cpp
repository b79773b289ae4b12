// Note [Row-major GEMMs in cuBLASLt]: cuBLASLt is column-major. A row-major matrix X[r,c] is
// the column-major matrix Xᵀ[c,r] with leading dimension c, so the row-major product
// D[M,N] = op(A)·op(B) is computed as the column-major Dᵀ[N,M] = op(B)ᵀ·op(A)ᵀ: cuBLASLt's
// "A" is our B and its "B" our A, with the same transpose flags, and the bias (one value per
// column of row-major D) is cuBLASLt's per-row bias of Dᵀ (CUBLASLT_EPILOGUE_BIAS).
#include "lt_gemm.h"

#include <fmt/format.h>

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
  cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

const LtGemm::Plan& LtGemm::plan_for(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  const auto [M, N, K, trans_a, trans_b, has_bias, accumulate, align_a, align_b, align_d] = key;
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
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_32F;
    TRIDENT_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                  &epilogue, sizeof(epilogue)));
    TRIDENT_CUBLAS(cublasLtMatmulDescSetAttribute(
        plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  }
  // Column-major shapes (rows, cols, leading dimension) of cuBLASLt's A, B and D.
  const uint64_t a_rows = trans_b ? K : N, a_cols = trans_b ? N : K;
  const uint64_t b_rows = trans_a ? M : K, b_cols = trans_a ? K : M;
  TRIDENT_CUBLAS(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, a_rows, a_cols, a_rows));
  TRIDENT_CUBLAS(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, b_rows, b_cols, b_rows));
  TRIDENT_CUBLAS(cublasLtMatrixLayoutCreate(&plan->d, CUDA_R_32F, N, M, N));

  cublasLtMatmulPreference_t pref;
  TRIDENT_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  TRIDENT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_, sizeof(workspace_bytes_)));
  // cuBLASLt's A is our B and its B our A (Note [Row-major GEMMs in cuBLASLt]); C is D.
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}};
  for (const auto& [attr, bytes] : alignments)
    TRIDENT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof(bytes)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  TRIDENT_CUBLAS(cublasLtMatmulAlgoGetHeuristic(handle_, plan->op, plan->a, plan->b, plan->d,
                                                plan->d, pref, 1, &result, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  if (found == 0)
    internal_error(__FILE__, __LINE__,
                   fmt::format("cuBLASLt has no algorithm for a bf16 GEMM M={} N={} K={} "
                               "(trans_a {}, trans_b {}, bias {})",
                               M, N, K, trans_a, trans_b, has_bias));
  plan->algo = result.algo;
  return *plan;
}

void LtGemm::matmul(float* D, const bf16* A, const bf16* B, const float* bias, int M, int N,
                    int K, bool trans_a, bool trans_b, float beta, cudaStream_t stream) {
  // The bias epilogue has no alignment preference; kernels may read it 16 bytes at a time.
  TRIDENT_CHECK(!bias || alignment_of(bias) >= 16,
                "LtGemm: the bias must be 16-byte aligned (N={})", N);
  const Plan& plan = plan_for({M, N, K, trans_a, trans_b, bias != nullptr, beta != 0.0f,
                               alignment_of(A), alignment_of(B), alignment_of(D)});
  if (bias)
    TRIDENT_CUBLAS(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                  &bias, sizeof(bias)));
  const float alpha = 1.0f;
  TRIDENT_CUBLAS(cublasLtMatmul(handle_, plan.op, &alpha, B, plan.a, A, plan.b, &beta, D,
                                plan.d, D, plan.d, &plan.algo, workspace_, workspace_bytes_,
                                stream));
}

}  // namespace trident::cuda
