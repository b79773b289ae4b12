// cuDNN fused flash attention through the backend graph API (host code; a .cu file only because
// kernels/*.cu is what the build globs).
//
// Note [cuDNN SDPA graph]
// cuDNN has no single attention call in the C API we use: its fused flash-attention engine
// recognises a pattern of matmul / pointwise / reduction nodes and fuses it into one kernel.
// So the graphs below spell out that pattern node by node, as cuDNN's frontend builds it, and
// backward keeps a few variants of it (kBackwardVariants), tried in order until cuDNN accepts
// one, since which pattern an engine accepts depends on the GPU and the cuDNN version.
//
// The nodes (dims always [B, NH, rows, cols]):
//   forward:  S = Q·Kᵀ → ·scale → causal select(row ≥ col ? S : -huge) → softmax as
//             max, sub, exp, sum, log+max (= Stats, fp32 lse) and div (P, bf16) → O = P·V
//   backward: Dsum = 1 · Σ_d dO⊙O (an fp32 tensor in the workspace; the ·1 stands where the
//             dropout scale's inverse would); P = exp(mask(scale·Q·Kᵀ) − Stats); dV = Pᵀ·dO;
//             dS = scale · P ⊙ (dO·Vᵀ − Dsum); dK = dSᵀ·Q; dQ = dS·K (through an fp32
//             accumulator in the workspace, zeroed before each run, then cast).
// Grouped-query attention (KVH < NH key/value heads) is the same graph with K and V described
// as [B, KVH, ...]: the matmuls broadcast a kv head over its NH/KVH query heads. Backward then
// computes dK and dV per query head, [B, NH, T, HS], and a reduction node adds each group into
// the [B, KVH, T, HS] dK, dV, as cuDNN's frontend does (its per-head tensors are virtual, of the
// input type; the fallback graphs write them as fp32 tensors in the workspace).
// Kᵀ, Vᵀ, Pᵀ and dSᵀ are strided views (a transpose is a stride swap, or a reshape node for
// virtual tensors), so the packed [B,T,3,NH,HS] qkv buffer is used in place.
//
// Whether an engine accepts the graph depends on the GPU, the cuDNN version and the shape; plans
// are built once per shape and any failure becomes the reason supported() reports.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>
#include <vector>

#include "attention_cudnn.h"

namespace trident::cuda {
namespace {

using Dims = std::array<int64_t, 4>;

std::string last_cudnn_error() {
  char message[1024] = {0};
  cudnnGetLastErrorString(message, sizeof(message));
  return message;
}

// Owns every backend descriptor of one graph and its plan (descriptors reference each other, so
// they live and die together).
class Descriptors {
 public:
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    for (auto it = all_.rbegin(); it != all_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }
  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = nullptr;
    TRIDENT_CUDNN(cudnnBackendCreateDescriptor(type, &d));
    all_.push_back(d);
    return d;
  }

 private:
  std::vector<cudnnBackendDescriptor_t> all_;
};

void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
         cudnnBackendAttributeType_t type, int64_t count, const void* value) {
  TRIDENT_CUDNN(cudnnBackendSetAttribute(d, name, type, count, value));
}
void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
              cudnnBackendDescriptor_t value) {
  set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
}

Dims packed_strides(const Dims& dims) {
  return {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
}

// Builds one operation graph; tensors with a uid below kFirstVirtualUid are bound at execution.
class GraphBuilder {
 public:
  explicit GraphBuilder(Descriptors& descs) : descs_(descs) {}

  cudnnBackendDescriptor_t tensor(
      int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides,
      bool is_virtual = false, bool by_value = false,
      cudnnBackendTensorReordering_t reorder = CUDNN_TENSOR_REORDERING_NONE) {
    cudnnBackendDescriptor_t t = descs_.make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t alignment = 16;
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    if (reorder != CUDNN_TENSOR_REORDERING_NONE)
      set(t, CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, 1, &reorder);
    TRIDENT_CUDNN(cudnnBackendFinalize(t));
    return t;
  }
  // An intermediate the engine keeps on chip; packed strides unless given.
  cudnnBackendDescriptor_t virt(cudnnDataType_t type, const Dims& dims) {
    return virt(type, dims, packed_strides(dims));
  }
  cudnnBackendDescriptor_t virt(cudnnDataType_t type, const Dims& dims, const Dims& strides) {
    return tensor(next_virtual_uid_++, type, dims, strides, true);
  }
  // A float scalar passed by value at execution.
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  // y = mode(x[, b[, t]]); `axis` only for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                 cudnnDataType_t math = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = descs_.make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    TRIDENT_CUDNN(cudnnBackendFinalize(pw));
    cudnnBackendDescriptor_t op = descs_.make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    add(op);
  }
  // Convenience: a new virtual output of type `type` and dims `dims`.
  cudnnBackendDescriptor_t pointwise_new(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                         cudnnBackendDescriptor_t b, cudnnDataType_t type,
                                         const Dims& dims) {
    cudnnBackendDescriptor_t y = virt(type, dims);
    pointwise(mode, x, b, nullptr, y);
    return y;
  }

  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t mm = descs_.make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
    TRIDENT_CUDNN(cudnnBackendFinalize(mm));
    cudnnBackendDescriptor_t op = descs_.make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    add(op);
  }

  void reduction(cudnnReduceTensorOp_t reduce, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t red = descs_.make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    set(red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce);
    set(red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
    TRIDENT_CUDNN(cudnnBackendFinalize(red));
    cudnnBackendDescriptor_t op = descs_.make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, red);
    add(op);
  }

  // y is x seen with other dims/strides (a transpose of a virtual tensor).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = descs_.make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    add(op);
  }

  // Finalizes the graph; returns it.
  cudnnBackendDescriptor_t finish(cudnnHandle_t handle) {
    cudnnBackendDescriptor_t graph = descs_.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops_.size()),
        ops_.data());
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    TRIDENT_CUDNN(cudnnBackendFinalize(graph));
    return graph;
  }

 private:
  void add(cudnnBackendDescriptor_t op) {
    TRIDENT_CUDNN(cudnnBackendFinalize(op));
    ops_.push_back(op);
  }

  Descriptors& descs_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_uid_ = 1000;
};

// Tensor uids bound at execution.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kMaskValue,
  kOne,
  kdO,
  kdQ,
  kdK,
  kdV,
  kdQAccum,
  kDsum,
  kdKFull,
  kdVFull
};

int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

// An execution plan and the workspace it needs.
struct Plan {
  Descriptors descs;
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace = 0;       // cuDNN's own
  int64_t dq_accum_bytes = 0;  // backward: the fp32 dQ accumulator placed after it
  int64_t dsum_bytes = 0;      // backward: the fp32 row sums Σ dO⊙O, after the accumulator
  int64_t full_bytes = 0;      // backward with KVH < NH: each of the per-query-head fp32 dK, dV
  bool uses_one = false;       // backward: binds the ·1 scalar (kOne)
  std::string variant;         // backward: which of kBackwardVariants was planned
  // The workspace's layout: cuDNN's part, the accumulator, the row sums, then (KVH < NH) the
  // per-query-head dK and dV, each 256-aligned.
  int64_t accum_offset() const { return align_up(workspace, 256); }
  int64_t dsum_offset() const { return accum_offset() + align_up(dq_accum_bytes, 256); }
  int64_t dk_full_offset() const { return dsum_offset() + align_up(dsum_bytes, 256); }
  int64_t dv_full_offset() const { return dk_full_offset() + align_up(full_bytes, 256); }
  int64_t workspace_bytes() const {
    return full_bytes > 0 ? dv_full_offset() + full_bytes : dsum_offset() + dsum_bytes;
  }
};

// Tries the heuristics' engine configs in order; the first that finalizes becomes the plan.
void choose_plan(Plan& p, cudnnHandle_t handle, cudnnBackendDescriptor_t graph) {
  std::string reasons;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    cudnnBackendDescriptor_t heur = p.descs.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (cudnnBackendFinalize(heur) != CUDNN_STATUS_SUCCESS) {
      reasons += " heuristics: " + last_cudnn_error() + ";";
      continue;
    }
    constexpr int kMaxConfigs = 8;
    std::array<cudnnBackendDescriptor_t, kMaxConfigs> configs{};
    for (auto& c : configs) c = p.descs.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t count = 0;
    TRIDENT_CUDNN(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, kMaxConfigs, &count,
                                           configs.data()));
    // `count` is how many results the heuristic has, which may exceed the kMaxConfigs written.
    count = std::min<int64_t>(count, kMaxConfigs);
    for (int64_t i = 0; i < count; ++i) {
      cudnnBackendDescriptor_t plan = p.descs.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
      set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[i]);
      const cudnnStatus_t status = cudnnBackendFinalize(plan);  // "no" is an answer here
      if (status != CUDNN_STATUS_SUCCESS) {
        reasons +=
            fmt::format(" config {}: {} {};", i, cudnnGetErrorString(status), last_cudnn_error());
        continue;
      }
      TRIDENT_CUDNN(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                             CUDNN_TYPE_INT64, 1, nullptr, &p.workspace));
      p.plan = plan;
      return;
    }
    if (count == 0) reasons += " heuristics returned no engine config;";
  }
  throw Error("no cuDNN execution plan:" + reasons, ExitCode::kInternal);
}

// qkv rows are q | k | v of (NH + 2·KVH)·HS values (3C when KVH = NH); o, dO rows C = NH·HS.
struct Shape {
  int64_t B, T, NH, KVH, HS;
  int64_t C() const { return NH * HS; }
  int64_t row() const { return (NH + 2 * KVH) * HS; }
  bool grouped() const { return KVH != NH; }
  Dims qkv_dims() const { return {B, NH, T, HS}; }  // q, dq (and o, dO with out_strides)
  Dims qkv_strides() const { return {T * row(), HS, row(), 1}; }
  Dims kv_dims() const { return {B, KVH, T, HS}; }  // k, v, dk, dv: qkv_strides
  Dims kv_t_dims() const { return {B, KVH, HS, T}; }
  Dims qkv_t_strides() const { return {T * row(), HS, 1, row()}; }  // kᵀ, vᵀ
  Dims out_strides() const { return {T * C(), HS, C(), 1}; }        // o, do
  Dims scores() const { return {B, NH, T, T}; }
  Dims rows() const { return {B, NH, T, 1}; }
};

// scale·Q·Kᵀ with the causal mask applied (masked entries hold the lowest float, as cuDNN's
// own attention graphs do, so that exp gives 0 without inf arithmetic).
cudnnBackendDescriptor_t masked_scores(GraphBuilder& g, const Shape& s, cudnnBackendDescriptor_t q,
                                       cudnnBackendDescriptor_t kt, cudnnBackendDescriptor_t scale,
                                       cudnnBackendDescriptor_t mask_value) {
  cudnnBackendDescriptor_t raw = g.virt(CUDNN_DATA_FLOAT, s.scores());
  g.matmul(q, kt, raw);
  cudnnBackendDescriptor_t scaled =
      g.pointwise_new(CUDNN_POINTWISE_MUL, raw, scale, CUDNN_DATA_FLOAT, s.scores());
  cudnnBackendDescriptor_t row = g.virt(CUDNN_DATA_INT32, s.scores());
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, nullptr, nullptr, row, CUDNN_DATA_INT32, 2);
  cudnnBackendDescriptor_t col = g.virt(CUDNN_DATA_INT32, s.scores());
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, nullptr, nullptr, col, CUDNN_DATA_INT32, 3);
  cudnnBackendDescriptor_t keep = g.virt(CUDNN_DATA_BOOLEAN, s.scores());
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, keep, CUDNN_DATA_BOOLEAN);
  cudnnBackendDescriptor_t masked = g.virt(CUDNN_DATA_FLOAT, s.scores());
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scaled, mask_value, keep, masked);
  return masked;
}

void build_forward(Plan& p, cudnnHandle_t handle, const Shape& s) {
  GraphBuilder g(p.descs);
  auto q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, s.qkv_dims(), s.qkv_strides());
  auto kt = g.tensor(kK, CUDNN_DATA_BFLOAT16, s.kv_t_dims(), s.qkv_t_strides());
  auto v = g.tensor(kV, CUDNN_DATA_BFLOAT16, s.kv_dims(), s.qkv_strides());
  auto o = g.tensor(kO, CUDNN_DATA_BFLOAT16, s.qkv_dims(), s.out_strides());
  auto stats = g.tensor(kStats, CUDNN_DATA_FLOAT, s.rows(), packed_strides(s.rows()));
  auto scale = g.scalar(kScale);
  auto mask_value = g.scalar(kMaskValue);

  auto masked = masked_scores(g, s, q, kt, scale, mask_value);
  auto max = g.virt(CUDNN_DATA_FLOAT, s.rows());
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, max);
  auto shifted = g.pointwise_new(CUDNN_POINTWISE_SUB, masked, max, CUDNN_DATA_FLOAT, s.scores());
  auto e = g.pointwise_new(CUDNN_POINTWISE_EXP, shifted, nullptr, CUDNN_DATA_FLOAT, s.scores());
  auto sum = g.virt(CUDNN_DATA_FLOAT, s.rows());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  auto log_sum = g.pointwise_new(CUDNN_POINTWISE_LOG, sum, nullptr, CUDNN_DATA_FLOAT, s.rows());
  g.pointwise(CUDNN_POINTWISE_ADD, max, log_sum, nullptr, stats);
  auto probs = g.virt(CUDNN_DATA_BFLOAT16, s.scores());  // the second matmul's input type
  g.pointwise(CUDNN_POINTWISE_DIV, e, sum, nullptr, probs);
  g.matmul(probs, v, o);
  choose_plan(p, handle, g.finish(handle));
}

// The backward graphs tried, in order (Note [cuDNN SDPA graph]). The first is the pattern
// cuDNN's frontend builds for SDPA backward (its scaled_dot_product_flash_attention_backward):
// the row sums Σ dO⊙O reduced, multiplied by the dropout scale's inverse (by 1 without
// dropout: the frontend keeps that node, "needed for non-dropout graphs") into a real fp32
// tensor in the workspace, no ·1 after dO·Vᵀ, and dQ accumulated in fp32 (workspace) then
// cast; with KVH < NH, per-query-head dK and dV virtual in bf16, as the frontend has them for
// this layout. The second is the same without the ·1; the last two have a virtual row sum, ·1
// nodes, and an F16x16-reordered accumulator or dQ written directly; these three write the
// per-query-head dK, dV in fp32 to the workspace (docs/decisions.md, Note [cuDNN SDPA graph]).
struct BackwardVariant {
  const char* name;
  bool real_dsum;        // Σ dO⊙O in the workspace (else virtual)
  bool one_after_sum;    // a ·1 node between the row sum's reduction and its use
  bool one_after_dp;     // a ·1 node after dO·Vᵀ
  bool accumulator;      // dQ through an fp32 accumulator in the workspace
  bool reorder_f16x16;   // that accumulator with CUDNN_TENSOR_REORDERING_F16x16
  bool real_full_heads;  // KVH < NH: per-query-head dK, dV in the workspace (else virtual)
};
constexpr BackwardVariant kBackwardVariants[] = {
    {"frontend's (row sum ·1 into a real fp32 tensor, fp32 dQ accumulator)", true, true, false,
     true, false, false},
    {"real row sum, fp32 dQ accumulator", true, false, false, true, false, true},
    {"virtual row sum, ·1 nodes, F16x16 dQ accumulator", false, true, true, true, true, true},
    {"virtual row sum, ·1 nodes, dQ direct", false, true, true, false, false, true},
};

void build_backward(Plan& p, cudnnHandle_t handle, const Shape& s, const BackwardVariant& v) {
  GraphBuilder g(p.descs);
  p.variant = v.name;
  auto q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, s.qkv_dims(), s.qkv_strides());
  auto kt = g.tensor(kK, CUDNN_DATA_BFLOAT16, s.kv_t_dims(), s.qkv_t_strides());
  auto vt = g.tensor(kV, CUDNN_DATA_BFLOAT16, s.kv_t_dims(), s.qkv_t_strides());
  auto o = g.tensor(kO, CUDNN_DATA_BFLOAT16, s.qkv_dims(), s.out_strides());
  auto dout = g.tensor(kdO, CUDNN_DATA_BFLOAT16, s.qkv_dims(), s.out_strides());
  auto stats = g.tensor(kStats, CUDNN_DATA_FLOAT, s.rows(), packed_strides(s.rows()));
  auto dq = g.tensor(kdQ, CUDNN_DATA_BFLOAT16, s.qkv_dims(), s.qkv_strides());
  auto dk = g.tensor(kdK, CUDNN_DATA_BFLOAT16, s.kv_dims(), s.qkv_strides());
  auto dv = g.tensor(kdV, CUDNN_DATA_BFLOAT16, s.kv_dims(), s.qkv_strides());
  // KVH < NH: dK and dV per query head, then summed over each group.
  cudnnBackendDescriptor_t dk_full = dk, dv_full = dv;
  if (s.grouped() && v.real_full_heads) {
    const Dims packed = packed_strides(s.qkv_dims());
    dk_full = g.tensor(kdKFull, CUDNN_DATA_FLOAT, s.qkv_dims(), packed);
    dv_full = g.tensor(kdVFull, CUDNN_DATA_FLOAT, s.qkv_dims(), packed);
    p.full_bytes = s.B * s.NH * s.T * s.HS * int64_t(sizeof(float));
  } else if (s.grouped()) {
    dk_full = g.virt(CUDNN_DATA_BFLOAT16, s.qkv_dims());
    dv_full = g.virt(CUDNN_DATA_BFLOAT16, s.qkv_dims());
  }
  auto scale = g.scalar(kScale);
  auto mask_value = g.scalar(kMaskValue);
  cudnnBackendDescriptor_t one = nullptr;
  if (v.one_after_sum || v.one_after_dp) one = g.scalar(kOne);
  p.uses_one = one != nullptr;
  const Dims transposed_scores_strides = {s.NH * s.T * s.T, s.T * s.T, 1, s.T};

  // Dsum = rowsum(dO ⊙ O)
  auto do_o =
      g.virt(CUDNN_DATA_FLOAT, s.qkv_dims(), {s.NH * s.T * s.HS, s.T * s.HS, s.NH * s.HS, 1});
  g.pointwise(CUDNN_POINTWISE_MUL, dout, o, nullptr, do_o);
  cudnnBackendDescriptor_t dsum;
  if (v.real_dsum) {
    dsum = g.tensor(kDsum, CUDNN_DATA_FLOAT, s.rows(), packed_strides(s.rows()));
    if (v.one_after_sum) {
      auto row_dot = g.virt(CUDNN_DATA_FLOAT, s.rows());
      g.reduction(CUDNN_REDUCE_TENSOR_ADD, do_o, row_dot);
      g.pointwise(CUDNN_POINTWISE_MUL, row_dot, one, nullptr, dsum);
    } else {
      g.reduction(CUDNN_REDUCE_TENSOR_ADD, do_o, dsum);
    }
    p.dsum_bytes = s.B * s.NH * s.T * int64_t(sizeof(float));
  } else {
    auto row_dot = g.virt(CUDNN_DATA_FLOAT, s.rows());
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, do_o, row_dot);
    dsum = v.one_after_sum
               ? g.pointwise_new(CUDNN_POINTWISE_MUL, row_dot, one, CUDNN_DATA_FLOAT, s.rows())
               : row_dot;
  }

  // P = exp(masked scores − Stats); dV = Pᵀ·dO
  auto masked = masked_scores(g, s, q, kt, scale, mask_value);
  auto shifted = g.pointwise_new(CUDNN_POINTWISE_SUB, masked, stats, CUDNN_DATA_FLOAT, s.scores());
  auto probs = g.pointwise_new(CUDNN_POINTWISE_EXP, shifted, nullptr, CUDNN_DATA_FLOAT, s.scores());
  auto probs_t = g.virt(CUDNN_DATA_BFLOAT16, s.scores(), transposed_scores_strides);
  g.reshape(probs, probs_t);
  g.matmul(probs_t, dout, dv_full);
  if (s.grouped()) g.reduction(CUDNN_REDUCE_TENSOR_ADD, dv_full, dv);

  // dS = scale · P ⊙ (dO·Vᵀ − Dsum); dK = dSᵀ·Q
  auto dp = g.virt(CUDNN_DATA_FLOAT, s.scores());
  g.matmul(dout, vt, dp);
  if (v.one_after_dp)
    dp = g.pointwise_new(CUDNN_POINTWISE_MUL, dp, one, CUDNN_DATA_FLOAT, s.scores());
  auto dp2 = g.pointwise_new(CUDNN_POINTWISE_SUB, dp, dsum, CUDNN_DATA_FLOAT, s.scores());
  auto ds0 = g.pointwise_new(CUDNN_POINTWISE_MUL, dp2, probs, CUDNN_DATA_FLOAT, s.scores());
  auto ds = g.pointwise_new(CUDNN_POINTWISE_MUL, ds0, scale, CUDNN_DATA_FLOAT, s.scores());
  auto ds_t = g.virt(CUDNN_DATA_BFLOAT16, s.scores(), transposed_scores_strides);
  g.reshape(ds, ds_t);
  g.matmul(ds_t, q, dk_full);
  if (s.grouped()) g.reduction(CUDNN_REDUCE_TENSOR_ADD, dk_full, dk);

  // dQ = dS·K, K being Kᵀ seen back through a reshape
  auto k = g.virt(CUDNN_DATA_BFLOAT16, s.kv_dims(), s.qkv_strides());
  g.reshape(kt, k);
  if (v.accumulator) {
    auto accum = g.tensor(
        kdQAccum, CUDNN_DATA_FLOAT, s.qkv_dims(), packed_strides(s.qkv_dims()), false, false,
        v.reorder_f16x16 ? CUDNN_TENSOR_REORDERING_F16x16 : CUDNN_TENSOR_REORDERING_NONE);
    g.matmul(ds, k, accum);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, accum, nullptr, nullptr, dq);
    p.dq_accum_bytes = s.B * s.NH * s.T * s.HS * int64_t(sizeof(float));
  } else {
    g.matmul(ds, k, dq);
  }
  choose_plan(p, handle, g.finish(handle));
}

}  // namespace

struct CudnnAttention::Impl {
  cudnnHandle_t handle;
  struct Entry {
    bool ok = false;
    std::string why;
    std::unique_ptr<Plan> forward, backward;
    std::string backward_refusals;  // the backward graphs tried before the planned one
  };
  std::map<std::tuple<int, int, int, int, int>, Entry> plans;  // (B, T, NH, KVH, HS)
  void* workspace = nullptr;
  size_t workspace_bytes = 0;

  Entry& entry(int B, int T, int NH, int KVH, int HS) {
    auto [it, inserted] = plans.try_emplace({B, T, NH, KVH, HS});
    Entry& e = it->second;
    if (!inserted) return e;
    if (B <= 0 || T <= 0 || NH <= 0 || KVH <= 0 || NH % KVH != 0 || HS <= 0 || HS % 8 != 0) {
      e.why = fmt::format("cuDNN SDPA graph not built: shape B={} T={} NH={} KVH={} HS={} needs "
                          "kv heads dividing the heads and a head size that is a multiple of 8",
                          B, T, NH, KVH, HS);
      return e;
    }
    const Shape s{B, T, NH, KVH, HS};
    std::string step = "forward";
    try {
      e.forward = std::make_unique<Plan>();
      build_forward(*e.forward, handle, s);
      // Each backward graph in turn; the refusals of those before the one planned are kept
      // (backward_refusals), and all of them are the reason when none is planned.
      step = "backward";
      std::string refusals;
      for (const BackwardVariant& v : kBackwardVariants) {
        try {
          e.backward = std::make_unique<Plan>();
          build_backward(*e.backward, handle, s, v);
          break;
        } catch (const Error& refused) {
          e.backward.reset();
          refusals +=
              fmt::format("{}[{}: {}]", refusals.empty() ? "" : "; ", v.name, refused.what());
        }
      }
      if (!e.backward)
        throw Error("every backward graph refused: " + refusals, ExitCode::kInternal);
      e.backward_refusals = refusals;
      e.ok = true;
    } catch (const Error& err) {
      e.why = fmt::format("cuDNN SDPA graph not built ({}; cuDNN {} loaded): {}", step,
                          cudnnGetVersion(), err.what());
      e.forward.reset();
      e.backward.reset();
    }
    return e;
  }

  Entry& require(int B, int T, int NH, int KVH, int HS) {
    Entry& e = entry(B, T, NH, KVH, HS);
    TRIDENT_CHECK(e.ok, "{}", e.why);
    return e;
  }

  // Workspace for a plan: cuDNN's part, then (backward) the dQ accumulator and the row sums.
  void* workspace_for(const Plan& p) {
    const size_t need = size_t(p.workspace_bytes());
    if (need > workspace_bytes) {
      if (workspace) TRIDENT_CUDA(cudaFree(workspace));
      workspace = nullptr;
      TRIDENT_CUDA(cudaMalloc(&workspace, need));
      workspace_bytes = need;
    }
    return workspace;
  }

  void execute(const Plan& p, std::vector<int64_t> uids, std::vector<void*> ptrs,
               cudaStream_t stream) {
    TRIDENT_CUDNN(cudnnSetStream(handle, stream));
    void* ws = workspace_for(p);
    if (p.dq_accum_bytes > 0) {
      void* accum = static_cast<char*>(ws) + p.accum_offset();
      TRIDENT_CUDA(cudaMemsetAsync(accum, 0, size_t(p.dq_accum_bytes), stream));
      uids.push_back(kdQAccum);
      ptrs.push_back(accum);
    }
    if (p.dsum_bytes > 0) {  // written by the graph's reduction before it is read
      uids.push_back(kDsum);
      ptrs.push_back(static_cast<char*>(ws) + p.dsum_offset());
    }
    if (p.full_bytes > 0) {  // the graph's matmuls write them, its reductions read them
      // Zeroed like the dQ accumulator (cheap: two tensors of dQ's size), in case an engine
      // accumulates into them tile by tile.
      char* full = static_cast<char*>(ws) + p.dk_full_offset();
      const size_t full_span = size_t(p.dv_full_offset() - p.dk_full_offset() + p.full_bytes);
      TRIDENT_CUDA(cudaMemsetAsync(full, 0, full_span, stream));
      uids.push_back(kdKFull);
      ptrs.push_back(static_cast<char*>(ws) + p.dk_full_offset());
      uids.push_back(kdVFull);
      ptrs.push_back(static_cast<char*>(ws) + p.dv_full_offset());
    }
    Descriptors descs;
    cudnnBackendDescriptor_t pack = descs.make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()),
        uids.data());
    set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(ptrs.size()),
        ptrs.data());
    set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    TRIDENT_CUDNN(cudnnBackendFinalize(pack));
    TRIDENT_CUDNN(cudnnBackendExecute(handle, p.plan, pack));
  }
};

CudnnAttention::CudnnAttention(cudnnHandle_t handle) : impl_(std::make_unique<Impl>()) {
  impl_->handle = handle;
}

CudnnAttention::~CudnnAttention() {
  if (impl_->workspace) cudaFree(impl_->workspace);
}

std::string CudnnAttention::backward_graph_gqa(int B, int T, int NH, int KVH, int HS) {
  const Impl::Entry& e = impl_->entry(B, T, NH, KVH, HS);
  if (!e.ok) return {};
  return e.backward_refusals.empty()
             ? e.backward->variant
             : e.backward->variant + " (refused before it: " + e.backward_refusals + ")";
}

bool CudnnAttention::supported_gqa(int B, int T, int NH, int KVH, int HS, std::string* why) {
  const Impl::Entry& e = impl_->entry(B, T, NH, KVH, HS);
  if (!e.ok && why) *why = e.why;
  return e.ok;
}

void CudnnAttention::forward_gqa(bf16* out, float* stats, const bf16* qkv, int B, int T, int NH,
                                 int KVH, int HS, cudaStream_t stream) {
  const Impl::Entry& e = impl_->require(B, T, NH, KVH, HS);
  // By-value scalars are read from host memory when the call is enqueued.
  float scale = 1.0f / std::sqrt(float(HS)), mask_value = std::numeric_limits<float>::lowest();
  bf16* q = const_cast<bf16*>(qkv);
  bf16* k = q + size_t(NH) * HS;
  bf16* v = k + size_t(KVH) * HS;
  impl_->execute(*e.forward, {kQ, kK, kV, kO, kStats, kScale, kMaskValue},
                 {q, k, v, out, stats, &scale, &mask_value}, stream);
}

void CudnnAttention::backward_gqa(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                                  const float* stats, int B, int T, int NH, int KVH, int HS,
                                  cudaStream_t stream) {
  const Impl::Entry& e = impl_->require(B, T, NH, KVH, HS);
  float scale = 1.0f / std::sqrt(float(HS)), mask_value = std::numeric_limits<float>::lowest(),
        one = 1.0f;
  const size_t k_at = size_t(NH) * HS, v_at = size_t(NH + KVH) * HS;
  bf16* q = const_cast<bf16*>(qkv);
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kdO, kStats, kdQ, kdK, kdV, kScale, kMaskValue};
  std::vector<void*> ptrs = {q,
                             q + k_at,
                             q + v_at,
                             const_cast<bf16*>(out),
                             const_cast<bf16*>(dout),
                             const_cast<float*>(stats),
                             dqkv,
                             dqkv + k_at,
                             dqkv + v_at,
                             &scale,
                             &mask_value};
  if (e.backward->uses_one) uids.push_back(kOne), ptrs.push_back(&one);
  impl_->execute(*e.backward, std::move(uids), std::move(ptrs), stream);
}

// Multi-head attention: KVH = NH, HS = C/NH (a C that NH does not divide gets HS = 0, which
// entry() refuses with its reason).
std::string CudnnAttention::backward_graph(int B, int T, int C, int NH) {
  return backward_graph_gqa(B, T, NH, NH, NH > 0 && C % NH == 0 ? C / NH : 0);
}

bool CudnnAttention::supported(int B, int T, int C, int NH, std::string* why) {
  return supported_gqa(B, T, NH, NH, NH > 0 && C % NH == 0 ? C / NH : 0, why);
}

void CudnnAttention::forward(bf16* out, float* stats, const bf16* qkv, int B, int T, int C, int NH,
                             cudaStream_t stream) {
  forward_gqa(out, stats, qkv, B, T, NH, NH, NH > 0 && C % NH == 0 ? C / NH : 0, stream);
}

void CudnnAttention::backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                              const float* stats, int B, int T, int C, int NH,
                              cudaStream_t stream) {
  backward_gqa(dqkv, dout, qkv, out, stats, B, T, NH, NH, NH > 0 && C % NH == 0 ? C / NH : 0,
               stream);
}

}  // namespace trident::cuda
