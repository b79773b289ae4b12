// Note [Row-major GEMMs in cuBLASLt]
// cuBLASLt is column-major. A row-major X[r,c] is the column-major Xᵀ[c,r] with leading
// dimension c, so D[M,N] = op(A)·op(B) is computed as the column-major Dᵀ[N,M] = op(B)ᵀ·op(A)ᵀ:
// cuBLASLt's "A" is our B and its "B" our A, with the same transpose flags, and the bias (one
// value per column of row-major D) is cuBLASLt's per-row bias of Dᵀ (CUBLASLT_EPILOGUE_BIAS).
//
// Note [cuBLASLt epilogues]
// A fused epilogue runs where this cuBLASLt accepts it; where it refuses, the fused op returns
// false having run nothing and the caller runs the unfused ops. cuBLASLt may refuse an fp32
// bias with a bf16 D (cublasLt.h, BIAS_DATA_TYPE): the bias is then rounded to bf16 for the
// call (the sum moves by at most half a bf16 ulp of the bias), and a refused DGELU_BGRAD runs
// as DGELU plus the backend's own bias-gradient sum (CudaBackend::matmul_dgelu_backward_bf16).
// Fused and unfused agree to about a bf16 rounding (tests/cuda/kernel_checks_bf16.h).
//
// In the terms of Note [Row-major GEMMs in cuBLASLt], GELU_AUX(_BIAS) and DGELU(_BGRAD) act on
// Dᵀ element by element, their aux matrix has Dᵀ's layout (leading dimension = our N, which
// cuBLASLt wants divisible by 8), and DGELU_BGRAD's bias gradient, one value per row of Dᵀ, is
// our column sums. Our A is cuBLASLt's B, so the row sums of our op(A) (a weight gradient's
// Σ dout) are BGRADB's. Biases and bias gradients are fp32; bias gradients are written, not
// added. The fused ops take the GELU (or its derivative) of the fp32 product, as the epilogue
// does; the unfused GELU reads the product already rounded to bf16. The first GPU run says
// which path ran (the once-printed "LtGemm:" lines; gpu-check's table counts them).
#include "lt_gemm.h"

#include <fmt/format.h>

#include <vector>

#include "backend/cuda/device_resources.h"
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

// Grows a grow-only device buffer `p` of `have` elements to at least n. cudaFree waits for the
// device, so kernels still using the old buffer finish first.
template <typename T>
void grow(T*& p, size_t& have, size_t n) {
  if (n <= have) return;
  TRIDENT_CUDA(cudaFree(p));
  p = nullptr;
  have = 0;  // stays empty if the allocation below fails
  check_malloc(cudaMalloc(&p, n * sizeof(T)), n * sizeof(T), "of GEMM staging", {});
  have = n;
}

// cuBLASLt's epilogue for ours (Note [cuBLASLt epilogues]).
cublasLtEpilogue_t lt_epilogue(LtEpilogue kind) {
  switch (kind) {
    case LtEpilogue::kNone: return CUBLASLT_EPILOGUE_DEFAULT;
    case LtEpilogue::kBias: return CUBLASLT_EPILOGUE_BIAS;
    case LtEpilogue::kGeluAux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case LtEpilogue::kGeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case LtEpilogue::kDGelu: return CUBLASLT_EPILOGUE_DGELU;
    case LtEpilogue::kDGeluBgrad: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case LtEpilogue::kBgradA: return CUBLASLT_EPILOGUE_BGRADB;  // our A is cuBLASLt's B
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}
bool has_bias_vector(LtEpilogue k) {  // a bias, or a bias gradient, at BIAS_POINTER
  return k == LtEpilogue::kBias || k == LtEpilogue::kGeluAuxBias || k == LtEpilogue::kDGeluBgrad ||
         k == LtEpilogue::kBgradA;
}
bool has_aux(LtEpilogue k) {
  return k == LtEpilogue::kGeluAux || k == LtEpilogue::kGeluAuxBias || k == LtEpilogue::kDGelu ||
         k == LtEpilogue::kDGeluBgrad;
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
  check_malloc(cudaMalloc(&workspace_, workspace_bytes_), workspace_bytes_, "of cuBLASLt workspace",
               {});
}

double LtGemm::measure_peak_flops(cudaStream_t stream) {
  const int n = 8192;
  const size_t nn = size_t(n) * n;
  Scratch a_mem, b_mem, d_mem, staging_mem;  // freed on return
  bf16* a = a_mem.of<bf16>(nn);
  bf16* b = b_mem.of<bf16>(nn);
  float* d = d_mem.of<float>(nn);
  // Nonzero data: on zeros the tensor cores run ~10% faster (less power), which would inflate
  // the peak. Values in [-0.5, 0.5), rounded to bf16.
  {
    std::vector<float> host(nn);
    for (size_t i = 0; i < nn; ++i) host[i] = float((i * 2654435761u) % 1000u) / 1000.0f - 0.5f;
    float* staging = staging_mem.of<float>(nn);
    TRIDENT_CUDA(
        cudaMemcpyAsync(staging, host.data(), nn * sizeof(float), cudaMemcpyHostToDevice, stream));
    cast_f32_to_bf16_cuda(a, staging, nn, stream);
    cast_f32_to_bf16_cuda(b, staging, nn, stream);
    TRIDENT_CUDA(cudaStreamSynchronize(stream));  // before `host` goes
  }
  auto run = [&] { matmul(d, a, b, nullptr, n, n, n, false, true, 0.0f, stream); };
  for (int i = 0; i < 3; ++i) run();
  cudaEvent_t start, stop;
  TRIDENT_CUDA(cudaEventCreate(&start));
  TRIDENT_CUDA(cudaEventCreate(&stop));
  const int reps = 20;
  TRIDENT_CUDA(cudaEventRecord(start, stream));
  for (int i = 0; i < reps; ++i) run();
  TRIDENT_CUDA(cudaEventRecord(stop, stream));
  TRIDENT_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  TRIDENT_CUDA(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 2.0 * double(n) * n * n * reps / (double(ms) * 1e-3);
}

LtGemm::~LtGemm() {
  for (auto& [key, plan] : plans_) delete plan;
  cudaFree(fallback_);
  cudaFree(bias16_);
  cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

const LtGemm::Plan* LtGemm::plan_for(const Key& key, const EpilogueArgs& ep, bool may_refuse) {
  auto it = plans_.find(key);
  if (it != plans_.end()) {
    TRIDENT_CHECK(it->second || may_refuse, "LtGemm: a refused plan asked for without refusal");
    return it->second;
  }
  const auto [M, N, K, trans_a, trans_b, epilogue, accumulate, d_bf16, c_separate, align_a, align_b,
              align_c, align_d, align_bias, align_aux, bias_bf16] = key;
  // They change the call, not the plan (the alignments of the epilogue's pointers are the
  // heuristic's from the pointers themselves); keyed to be safe.
  (void)accumulate, (void)c_separate, (void)align_bias, (void)align_aux;
  auto plan = new Plan();
  plans_[key] = plan;
  // cuBLASLt's operands (Note [Row-major GEMMs in cuBLASLt]): its A is our B, stored
  // column-major as [N,K] (op N) or [K,N] (op T); its B is our A: [K,M] (N) or [M,K] (T).
  const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  TRIDENT_CUBLAS(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  TRIDENT_CUBLAS(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  TRIDENT_CUBLAS(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (epilogue != Epilogue::kNone) {
    const cublasLtEpilogue_t lt = lt_epilogue(epilogue);
    TRIDENT_CUBLAS(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &lt, sizeof(lt)));
  }
  if (has_bias_vector(epilogue)) {
    // An fp32 bias also with a bf16 D: the bf16 op adds the fp32 bias before its one rounding
    // (Note [bf16 activations]); bias gradients are fp32 too. cuBLASLt's default bias type is
    // D's; whether it takes fp32 with a bf16 D is the heuristic's answer (run_bf16_bias then
    // tries a bf16 bias, and the callers fall back where neither is taken).
    const cudaDataType_t bias_type = bias_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    TRIDENT_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                  &bias_type, sizeof(bias_type)));
    TRIDENT_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                  &ep.bias, sizeof(ep.bias)));
  }
  if (has_aux(epilogue)) {
    // Dᵀ's layout; its type is D's by default (bf16: every aux epilogue here has a bf16 D).
    TRIDENT_CHECK(d_bf16, "LtGemm: an aux epilogue with an fp32 D");
    const int64_t aux_ld = N;
    TRIDENT_CUBLAS(cublasLtMatmulDescSetAttribute(
        plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ep.aux, sizeof(ep.aux)));
    TRIDENT_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                  &aux_ld, sizeof(aux_ld)));
  }
  // Column-major shapes (rows, cols, leading dimension) of cuBLASLt's A, B and D. C has D's
  // layout and type (cuBLASLt wants Ctype = Dtype outside fp8), so one descriptor serves both.
  const uint64_t a_rows = trans_b ? K : N, a_cols = trans_b ? N : K;
  const uint64_t b_rows = trans_a ? M : K, b_cols = trans_a ? K : M;
  TRIDENT_CUBLAS(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, a_rows, a_cols, a_rows));
  TRIDENT_CUBLAS(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, b_rows, b_cols, b_rows));
  TRIDENT_CUBLAS(cublasLtMatrixLayoutCreate(&plan->d, d_bf16 ? CUDA_R_16BF : CUDA_R_32F, N, M, N));

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
                               "(trans_a {}, trans_b {}, epilogue {}, D {})",
                               M, N, K, trans_a, trans_b, int(epilogue), d_bf16 ? "bf16" : "fp32"));
  }
  plan->algo = result.algo;
  return plan;
}

bool LtGemm::run(void* D, const void* C, const bf16* A, const bf16* B, const EpilogueArgs& ep,
                 int M, int N, int K, bool trans_a, bool trans_b, float beta, bool d_bf16,
                 bool may_refuse, cudaStream_t stream) {
  // The epilogue's vectors and aux have no alignment preference: kernels may read them 16
  // bytes at a time, and the aux's leading dimension (our N) must be divisible by 8.
  const bool with_bias = has_bias_vector(ep.kind), with_aux = has_aux(ep.kind);
  TRIDENT_CHECK(!with_bias || ep.bias, "LtGemm: a bias epilogue without its vector");
  if (with_bias && alignment_of(ep.bias) < 16) {
    TRIDENT_CHECK(may_refuse,
                  "LtGemm: the bias (or bias gradient) must be 16-byte aligned "
                  "(N={})",
                  N);
    return false;  // run_bf16_bias's aligned bf16 copy, or the caller's fallback
  }
  if (with_aux) {
    TRIDENT_CHECK(ep.aux != nullptr, "LtGemm: an aux epilogue without its matrix");
    if (alignment_of(ep.aux) < 16 || N % 8 != 0) {
      TRIDENT_CHECK(may_refuse, "LtGemm: the aux matrix must be 16-byte aligned, N={} % 8 = 0", N);
      return false;
    }
  }
  const Key key{M,
                N,
                K,
                trans_a,
                trans_b,
                ep.kind,
                beta != 0.0f,
                d_bf16,
                C != D,
                alignment_of(A),
                alignment_of(B),
                alignment_of(C),
                alignment_of(D),
                with_bias ? alignment_of(ep.bias) : 0u,
                with_aux ? alignment_of(ep.aux) : 0u,
                with_bias && ep.bias_bf16};
  const Plan* plan = plan_for(key, ep, may_refuse);
  if (!plan) return false;
  if (with_bias)
    TRIDENT_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                  &ep.bias, sizeof(ep.bias)));
  if (with_aux)
    TRIDENT_CUBLAS(cublasLtMatmulDescSetAttribute(
        plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ep.aux, sizeof(ep.aux)));
  const float alpha = 1.0f;
  const cublasStatus_t rc =
      cublasLtMatmul(handle_, plan->op, &alpha, B, plan->a, A, plan->b, &beta, C, plan->d, D,
                     plan->d, &plan->algo, workspace_, workspace_bytes_, stream);
  if (may_refuse && (rc == CUBLAS_STATUS_NOT_SUPPORTED || rc == CUBLAS_STATUS_INVALID_VALUE)) {
    // cuBLASLt checks some combinations only here (an epilogue's data types: "INVALID_VALUE"),
    // before it launches anything: refuse the key for good, and the caller runs its fallback.
    // Any other failure (an execution or allocation error) is an error, not a refusal.
    delete plans_[key];
    plans_[key] = nullptr;
    return false;
  }
  TRIDENT_CUBLAS(rc);
  return true;
}

void LtGemm::matmul(float* D, const bf16* A, const bf16* B, const float* bias, int M, int N, int K,
                    bool trans_a, bool trans_b, float beta, cudaStream_t stream) {
  TRIDENT_CHECK(M >= 0 && N >= 0 && K >= 0, "LtGemm::matmul: M={} N={} K={}", M, N, K);
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum: only "D += nothing" (a weight gradient over no rows) is defined
    TRIDENT_CHECK(beta == 1.0f && !bias, "LtGemm::matmul: K = 0 with beta {} or a bias", beta);
    return;
  }
  run(D, D, A, B, bias_only(bias), M, N, K, trans_a, trans_b, beta, false, false, stream);
}

// C as cuBLASLt's C with beta = 1, rather than a copy of C into D and then beta = 1: one pass
// over C fewer. C and D share one layout; C == D is cuBLASLt's in-place case.
void LtGemm::matmul_add(float* D, const float* C, const bf16* A, const bf16* B, const float* bias,
                        int M, int N, int K, bool trans_a, bool trans_b, cudaStream_t stream) {
  TRIDENT_CHECK(M >= 0 && N >= 0 && K > 0, "LtGemm::matmul_add: M={} N={} K={}", M, N, K);
  if (M == 0 || N == 0) return;
  TRIDENT_CHECK(D && C && A && B, "LtGemm::matmul_add: null pointer");
  run(D, C, A, B, bias_only(bias), M, N, K, trans_a, trans_b, 1.0f, false, false, stream);
}

void LtGemm::matmul_bf16(bf16* D, const bf16* A, const bf16* B, const float* bias, int M, int N,
                         int K, bool trans_a, bool trans_b, cudaStream_t stream) {
  TRIDENT_CHECK(M >= 0 && N >= 0 && K > 0, "LtGemm::matmul_bf16: M={} N={} K={}", M, N, K);
  if (M == 0 || N == 0) return;
  TRIDENT_CHECK(D && A && B, "LtGemm::matmul_bf16: null pointer");
  if (!bias) {
    run(D, D, A, B, bias_only(nullptr), M, N, K, trans_a, trans_b, 0.0f, true, false, stream);
    return;
  }
  if (run_bf16_bias(D, A, B, bias_only(bias), M, N, K, trans_a, trans_b, stream)) return;
  // No algorithm for a bias with a bf16 D at all: the fp32 GEMM with its bias into staging,
  // then one rounding — the op's definition, one more pass.
  const size_t n = size_t(M) * N;
  grow(fallback_, fallback_floats_, n);
  if (!bf16_bias_fallback_used_)  // once per LtGemm: it costs a pass, so say so
    fmt::print(stderr,
               "LtGemm: cuBLASLt has no bf16-output GEMM with a bias (M={} N={} "
               "K={}); such GEMMs run with an fp32 output and a cast\n",
               M, N, K);
  bf16_bias_fallback_used_ = true;
  run(fallback_, fallback_, A, B, bias_only(bias), M, N, K, trans_a, trans_b, 0.0f, false, false,
      stream);
  cast_f32_to_bf16_cuda(D, fallback_, n, stream);
}

void LtGemm::note_refusal(Epilogue kind, int M, int N, int K) {
  const uint32_t bit = 1u << unsigned(kind);
  if (!(refusals_noted_ & bit))  // once per kind: a fallback costs passes, so say so
    fmt::print(stderr,
               "LtGemm: no cuBLASLt algorithm for epilogue {} at M={} N={} K={} (or the "
               "aux's leading dimension is not a multiple of 8); running a fallback without it\n",
               int(lt_epilogue(kind)), M, N, K);
  refusals_noted_ |= bit;
}

bool LtGemm::run_fused(void* D, const bf16* A, const bf16* B, const EpilogueArgs& ep, int M, int N,
                       int K, bool trans_a, bool trans_b, float beta, bool d_bf16,
                       cudaStream_t stream) {
  if (run(D, D, A, B, ep, M, N, K, trans_a, trans_b, beta, d_bf16, true, stream)) return true;
  note_refusal(ep.kind, M, N, K);
  return false;
}

bool LtGemm::run_bf16_bias(void* D, const bf16* A, const bf16* B, EpilogueArgs ep, int M, int N,
                           int K, bool trans_a, bool trans_b, cudaStream_t stream) {
  if (run(D, D, A, B, ep, M, N, K, trans_a, trans_b, 0.0f, true, true, stream)) return true;
  // The bias in D's type, as cuBLASLt documents it: bias[N] rounded into bias16_ on the stream
  // (the GEMM that reads it runs after, in stream order; the next cast after that GEMM).
  grow(bias16_, bias16_elems_, size_t(N));
  cast_f32_to_bf16_cuda(bias16_, static_cast<const float*>(ep.bias), size_t(N), stream);
  ep.bias = bias16_;
  ep.bias_bf16 = true;
  if (!run(D, D, A, B, ep, M, N, K, trans_a, trans_b, 0.0f, true, true, stream)) return false;
  if (!bias16_noted_)
    fmt::print(stderr,
               "LtGemm: cuBLASLt takes no fp32 bias with a bf16 output (epilogue {} at "
               "M={} N={} K={}); its bias is rounded to bf16 for such GEMMs\n",
               int(lt_epilogue(ep.kind)), M, N, K);
  bias16_noted_ = true;
  return true;
}

bool LtGemm::matmul_gelu_bf16(bf16* D, bf16* aux, const bf16* A, const bf16* B, const float* bias,
                              int M, int N, int K, bool trans_a, bool trans_b,
                              cudaStream_t stream) {
  TRIDENT_CHECK(M > 0 && N > 0 && K > 0, "LtGemm::matmul_gelu_bf16: M={} N={} K={}", M, N, K);
  TRIDENT_CHECK(D && aux && A && B, "LtGemm::matmul_gelu_bf16: null pointer");
  if (!bias) {
    const EpilogueArgs ep{Epilogue::kGeluAux, nullptr, aux};
    return run_fused(D, A, B, ep, M, N, K, trans_a, trans_b, 0.0f, true, stream);
  }
  if (run_bf16_bias(D, A, B, {Epilogue::kGeluAuxBias, bias, aux}, M, N, K, trans_a, trans_b,
                    stream))
    return true;
  note_refusal(Epilogue::kGeluAuxBias, M, N, K);
  return false;
}

bool LtGemm::matmul_dgelu_bf16(bf16* D, float* bias_grad, const bf16* A, const bf16* B,
                               const bf16* aux, int M, int N, int K, bool trans_a, bool trans_b,
                               cudaStream_t stream) {
  TRIDENT_CHECK(M > 0 && N > 0 && K > 0, "LtGemm::matmul_dgelu_bf16: M={} N={} K={}", M, N, K);
  TRIDENT_CHECK(D && aux && A && B, "LtGemm::matmul_dgelu_bf16: null pointer");
  const EpilogueArgs ep{bias_grad ? Epilogue::kDGeluBgrad : Epilogue::kDGelu, bias_grad, aux};
  return run_fused(D, A, B, ep, M, N, K, trans_a, trans_b, 0.0f, true, stream);
}

bool LtGemm::matmul_bgrad_a(float* D, float* bias_grad, const bf16* A, const bf16* B, int M, int N,
                            int K, bool trans_a, bool trans_b, float beta, cudaStream_t stream) {
  TRIDENT_CHECK(M > 0 && N > 0 && K > 0, "LtGemm::matmul_bgrad_a: M={} N={} K={}", M, N, K);
  TRIDENT_CHECK(D && bias_grad && A && B, "LtGemm::matmul_bgrad_a: null pointer");
  const EpilogueArgs ep{Epilogue::kBgradA, bias_grad, nullptr};
  return run_fused(D, A, B, ep, M, N, K, trans_a, trans_b, beta, false, stream);
}

}  // namespace trident::cuda
