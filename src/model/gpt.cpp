// GPT-2 forward (backward: gpt_backward.cpp) as a sequence of Backend layer calls,
// tensor-parallel in the Megatron way (Note [Tensor-parallel shards] in trident/model.h) and
// split into pipeline stages (Note [Pipeline stages]):
//   - qkv and fc are column-parallel (each tp rank computes its heads / its slice of 4C);
//     attproj and fcproj are row-parallel (partial sums, reduced over tp, bias added once);
//   - the residual stream is replicated, or split along the sequence with sequence
//     parallelism (LayerNorm outputs are gathered before the column-parallel linears, the
//     row-parallel outputs reduce-scattered after);
//   - the embedding and the LM head are vocab-parallel, the loss a vocab-parallel softmax.
// The conjugate pair "identity forward / all-reduce backward" sits in norm_gathered*,
// "all-reduce forward / identity backward" in reduce_rows / gather_rows (gpt_tp.cpp): written
// once, used by attention, MLP, embedding and head alike. With tp = 1 they are plain copies.
// Activations live in slots, one per micro-batch in flight (gpt_slots.cpp); pp = 1 is one
// stage holding everything, run by the same code.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "model/activation.h"
#include "model/cp_attention.h"
#include "model/gpt_phase.h"
#include "model/gpt_state.h"
#include "model/moe.h"
#include "model/tp_overlap.h"
#include "trident/check.h"
#include "trident/model.h"

namespace trident {

int GPT::param_index(const std::string& name) const {
  const auto it = index_by_name_.find(name);
  return it == index_by_name_.end() ? -1 : it->second;
}

const ParamInfo& GPT::param(const std::string& name) const {
  const int i = param_index(name);
  if (i < 0) internal_error(__FILE__, __LINE__, "no parameter named " + name);
  return infos_[size_t(i)];
}

void GPT::build_param_table() {
  // A map, not a scan: the table looks up 12 names per block (a search per name made building
  // a 10^5-layer model quadratic, too slow even to be refused for its size).
  index_by_name_.clear();
  for (size_t i = 0; i < infos_.size(); ++i) index_by_name_.emplace(infos_[i].name, int(i));
  auto offset_of = [&](const std::string& name) {
    const int i = param_index(name);
    return i < 0 ? kNoTensor : infos_[size_t(i)].offset;
  };
  ParamTable& t = *table_;
  t.wte_index = param_index("wte");
  t.tied_wte_index = cfg_.tied_head ? t.wte_index : -1;
  t.head_w_index = param_index("lmw");
  if (t.wte_index >= 0) t.wte = infos_[size_t(t.wte_index)].offset;
  t.wpe = offset_of("wpe");
  const int wpe_index = param_index("wpe");
  t.embedding_uses.clear();
  t.head_uses.clear();
  t.embedding_last_index = -1;
  if (stage_.has_embedding) {
    t.embedding_uses = {t.wte_index};
    if (wpe_index >= 0) t.embedding_uses.push_back(wpe_index);
    t.embedding_last_index = std::max(t.wte_index, wpe_index);
  }
  if (stage_.has_head) {
    t.lnfw = param("lnfw").offset;
    t.lnfb = offset_of("lnfb");
    t.head_w = cfg_.tied_head ? t.wte : param("lmw").offset;
    t.head_last_index = std::max(param_index("lnfw"), param_index("lnfb"));
    t.head_uses = {param_index("lnfw")};
    if (param_index("lnfb") >= 0) t.head_uses.push_back(param_index("lnfb"));
    t.head_uses.push_back(cfg_.tied_head ? t.wte_index : t.head_w_index);
  }
  t.layers.clear();
  for (int i = 0; i < stage_.num_layers; ++i) {
    const int l = stage_.global_layer(i);
    auto name = [l](const char* s) { return fmt::format("h{}.{}", l, s); };
    auto off = [&](const char* s) { return offset_of(name(s)); };
    // The last of a group present (a weight, then maybe its bias).
    auto ready = [&](const char* w, const char* b) {
      return std::max(int(&param(name(w)) - infos_.data()), param_index(name(b)));
    };
    LayerTable lt;
    lt.offset = {off("ln1w"),     off("ln1b"),     off("qkvw"),    off("qkvb"),
                 off("attprojw"), off("attprojb"), off("ln2w"),    off("ln2b"),
                 off("fcw"),      off("fcb"),      off("fcprojw"), off("fcprojb")};
    lt.moe = cfg_.is_moe(l);
    if (lt.moe) {
      const char* names[7] = {"expfcw", "expfcprojw", "router", "routerbias",
                              "shfcw",  "shfcprojw",  "shgate"};
      for (int k = 0; k < 7; ++k) {
        lt.moe_offset[size_t(k)] = off(names[k]);
        lt.ready_moe = std::max(lt.ready_moe, param_index(name(names[k])));
      }
      lt.router_bias = param_index(name("routerbias"));
      lt.ready_fcproj = lt.ready_fc = lt.ready_moe;
    } else {
      lt.ready_fcproj = ready("fcprojw", "fcprojb");
      lt.ready_fc = ready("fcw", "fcb");
    }
    lt.ready_ln2 = ready("ln2w", "ln2b");
    lt.ready_attproj = ready("attprojw", "attprojb");
    lt.ready_qkv = ready("qkvw", "qkvb");
    lt.ready_ln1 = ready("ln1w", "ln1b");
    const int first = param_index(name(lt.moe ? "expfcprojw" : "fcprojw"));
    for (int k = first; k <= lt.ready_ln1; ++k) lt.uses.push_back(k);
    lt.span_begin = infos_[size_t(lt.uses.front())].offset;  // ready order = buffer order
    lt.span_end = infos_[size_t(lt.ready_ln1)].offset + infos_[size_t(lt.ready_ln1)].count;
    lt.forward_phase = fmt::format("forward block {}", l);
    lt.backward_phase = fmt::format("backward block {}", l);
    lt.weight_phase = fmt::format("weight block {}", l);
    t.layers.push_back(std::move(lt));
  }
}

GPT::BlockWeights GPT::block(float* base, int local_layer) const {
  const BlockOffsets& o = table_->layers[size_t(local_layer)].offset;
  return {at(base, o.ln1w),     at(base, o.ln1b),     at(base, o.qkvw),    at(base, o.qkvb),
          at(base, o.attprojw), at(base, o.attprojb), at(base, o.ln2w),    at(base, o.ln2b),
          at(base, o.fcw),      at(base, o.fcb),      at(base, o.fcprojw), at(base, o.fcprojb)};
}

void GPT::forward_accumulate(int slot, const int32_t* inputs, const int32_t* targets, int B,
                             int T) {
  struct Deferred {  // reset even when forward throws
    explicit Deferred(bool& flag, bool on) : flag_(flag) { flag_ = on; }
    ~Deferred() { flag_ = false; }
    bool& flag_;
  } deferred(defer_loss_, be_.is_device() && stage_.has_head);
  loss_sum_host_ += forward(slot, inputs, targets, B, T);
}

double GPT::take_loss_sum() {
  double sum = loss_sum_host_;
  loss_sum_host_ = 0.0;
  if (!loss_sum_device_.empty()) {
    double device = 0.0;
    be_.copy(&device, loss_sum_device_.data(), sizeof(double));  // waits (Note [Backend memory])
    be_.fill_zero(loss_sum_device_.data(), sizeof(double));
    sum += device;
  }
  return sum;
}

const float* GPT::logits() const {
  TRIDENT_CHECK(precision_ == Precision::kFp32,
                "logits() on the bf16 path (its logits become the loss gradient in forward)");
  return slots_[0].logits.data();
}

// Note [Weights in unit slots] (train/zero3_pool.h): the homes follow ZeRO-3's units.
int GPT::weight_home(size_t param) const {
  TRIDENT_CHECK(param < infos_.size(), "weight_home({}) of {} parameters", param, infos_.size());
  const ParamInfo& p = infos_[param];
  const int layers = int(table_->layers.size());
  if (p.layer >= 0) {
    for (int l = 0; l < layers; ++l)
      if (stage_.global_layer(l) == p.layer) return l;
    internal_error(__FILE__, __LINE__,
                   fmt::format("'{}': layer {} not on this stage", p.name, p.layer));
  }
  if (p.name == "wte") return layers;
  if (p.name == "wpe") return layers + 1;
  return layers + 2;  // the final norm, an untied LM head
}

void GPT::release_full_params() {
  params_ = BackendBuffer<float>();
  std::fill(weight_base_.begin(), weight_base_.end(), nullptr);
  if (precision_ != Precision::kBf16) return;
  params16_ = BackendBuffer<bfloat16>();  // Note [bf16 unit gathers]
  if (cfg_.tied_head && stage_.has_head && tied_head16_.empty())
    tied_head16_ =
        BackendBuffer<bfloat16>(be_, size_t(cfg_.padded_vocab / tp_.size) * cfg_.channels);
}

void GPT::zero_grads() {
  if (!grads_.empty()) be_.fill_zero(grads_.data(), grads_.size() * sizeof(float));
}

void GPT::rope(float* qkv, int N, int T, bool backward) {
  const int rot = cfg_.rotary_dims();
  if (rot == 0) return;
  const int NHl = cfg_.heads / tp_.size, KVHl = cfg_.kv_head_count() / tp_.size;
  const float *cos = scratch_->rope_cos.data(), *sin = scratch_->rope_sin.data();
  if (backward) be_.rope_backward(qkv, cos, sin, N, T, NHl, KVHl, cfg_.head_size(), rot);
  else be_.rope_forward(qkv, cos, sin, N, T, NHl, KVHl, cfg_.head_size(), rot);
}

void GPT::attention_forward(float* out, float* att, const float* qkv, int B, int T) {
  if (cp_attention_) {
    cp_attention_->forward(out, att, qkv, B, T);
    return;
  }
  const int NHl = cfg_.heads / tp_.size, KVHl = cfg_.kv_head_count() / tp_.size;
  be_.attention_forward_gqa(out, att, qkv, B, T, NHl, KVHl, cfg_.head_size());
}

void GPT::attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                             const float* att, int B, int T) {
  if (cp_attention_) {
    cp_attention_->backward(dqkv, scratch_->datt.data(), dout, qkv, out, att, B, T);
    return;
  }
  const int NHl = cfg_.heads / tp_.size, KVHl = cfg_.kv_head_count() / tp_.size;
  be_.attention_backward_gqa(dqkv, scratch_->datt.data(), dout, qkv, out, att, B, T, NHl, KVHl,
                             cfg_.head_size());
}

double GPT::take_cp_comm_ms() { return cp_attention_ ? cp_attention_->take_comm_ms() : 0.0; }
double GPT::take_cp_exposed_ms() { return cp_attention_ ? cp_attention_->take_exposed_ms() : 0.0; }

void GPT::activation_forward(float* out, const float* pre, int N) {
  trident::activation_forward(be_, cfg_.activation, out, pre, N, cfg_.hidden() / tp_.size);
}

void GPT::activation_backward(float* dpre, const float* pre, const float* dout, int N) {
  trident::activation_backward(be_, cfg_.activation, dpre, pre, dout, N, cfg_.hidden() / tp_.size);
}

// A column-parallel linear after a norm: out [N, OC] = norm(inp) · wᵀ + b, the norm's output
// gathered to all N rows into normed (sequence parallelism), chunk by chunk beside the GEMM
// where the collectives overlap (Note [Tensor-parallel overlap]).
void GPT::norm_matmul(float* out, float* normed, float* mean, float* rstd, const float* inp,
                      const float* nw, const float* nb, const float* w, const float* b, int B,
                      int T, int OC) {
  const int C = cfg_.channels;
  if (tp_overlap_ && tp_.sequence_parallel) {
    float* local = scratch_->ln_out.data();
    norm_forward(local, mean, rstd, inp, nw, nb, B * T / tp_.size, C);
    tp_overlap_->gather_matmul(out, normed, local, {w, b, OC, false}, B, T, C);
    return;
  }
  norm_gathered(normed, mean, rstd, inp, nw, nb, B, T, C);
  be_.matmul_forward(out, normed, w, b, B * T, C, OC);
}

// A row-parallel linear: out (this rank's rows) = the tp sum of inp [N, K] · wᵀ (+ bias: tp rank
// 0 passes it), through `partial` [N, C] where the collectives do not overlap; partial == out
// without sequence parallelism (Note [Reduce in place]).
void GPT::matmul_reduce(float* out, float* partial, const float* inp, const float* w,
                        const float* bias, int B, int T, int K) {
  const int C = cfg_.channels;
  if (tp_overlap_) {
    if (tp_.sequence_parallel) tp_overlap_->matmul_reduce_scatter(out, inp, w, bias, B, T, K, C);
    else tp_overlap_->matmul_all_reduce(out, inp, w, bias, B * T, K, C);
    return;
  }
  be_.matmul_forward(partial, inp, w, bias, B * T, K, C);
  reduce_rows(out, partial, B, T, C);
}

void GPT::block_forward(int slot, int local_layer, const BlockWeights& w, const BlockActs& a,
                        const float* residual_in, int B, int T) {
  const int C = cfg_.channels, tps = tp_.size, hs = cfg_.head_size();
  const int NHl = cfg_.heads / tps;
  const int Ql = NHl * hs, QKVl = cfg_.qkv_rows() / tps;
  const int FCl = cfg_.fc_rows() / tps, Fl = cfg_.hidden() / tps;
  const int N = B * T, Nr = N / rows_divisor_;
  // The row-parallel outputs are partial sums to reduce over tp, in place unless sequence
  // parallelism reduce-scatters them (Note [Reduce in place]); with tp = 1 they are final.
  float* attn_partial = tp_.sequence_parallel ? scratch_->full_c.data() : a.residual2;
  float* mlp_partial = tp_.sequence_parallel ? scratch_->full_c.data() : a.residual3;
  // Row-parallel biases are added by tp rank 0 only, before the sum over tp.
  const bool add_row_bias = tp_.rank == 0;
  norm_matmul(a.qkv, a.ln1, a.ln1_mean, a.ln1_rstd, residual_in, w.ln1w, w.ln1b, w.qkvw, w.qkvb, B,
              T, QKVl);
  rope(a.qkv, N, T, false);
  attention_forward(a.atty, a.att, a.qkv, B, T);
  matmul_reduce(a.residual2, attn_partial, a.atty, w.attprojw, add_row_bias ? w.attprojb : nullptr,
                B, T, Ql);
  be_.add(a.residual2, a.residual2, residual_in, size_t(Nr) * C);
  // A parallel residual's MLP reads the block's input, as its attention does.
  const float* mlp_in = cfg_.parallel_residual ? residual_in : a.residual2;
  if (moe_[size_t(local_layer)]) {  // this rank's rows, output final (Note [Mixtures and tp])
    norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, mlp_in, w.ln2w, w.ln2b, Nr, C);
    moe_forward(slot, local_layer, a.residual3, a.ln2, Nr);
    be_.add(a.residual3, a.residual3, a.residual2, size_t(Nr) * C);
    return;
  }
  norm_matmul(a.fch, a.ln2, a.ln2_mean, a.ln2_rstd, mlp_in, w.ln2w, w.ln2b, w.fcw, w.fcb, B, T,
              FCl);
  activation_forward(a.fch_gelu, a.fch, N);
  matmul_reduce(a.residual3, mlp_partial, a.fch_gelu, w.fcprojw, add_row_bias ? w.fcprojb : nullptr,
                B, T, Fl);
  be_.add(a.residual3, a.residual3, a.residual2, size_t(Nr) * C);
}

std::vector<std::vector<int>> GPT::param_use_sequence(int chunk, ParamPass pass) const {
  TRIDENT_CHECK(chunk >= 0 && chunk < stage_.chunks(), "chunk {} of {}", chunk, stage_.chunks());
  const bool embedding = stage_.has_embedding && chunk == 0;
  const bool head = stage_.has_head && chunk == stage_.chunks() - 1;
  const int begin = stage_.chunk_begin(chunk), end = begin + stage_.chunk_size(chunk);
  std::vector<std::vector<int>> seq;
  if (pass == ParamPass::kForward) {
    if (embedding) seq.push_back(table_->embedding_uses);
    for (int i = begin; i < end; ++i) seq.push_back(table_->layers[size_t(i)].uses);
    if (head) seq.push_back(table_->head_uses);
    return seq;
  }
  if (head) seq.push_back(table_->head_uses);
  for (int i = end - 1; i >= begin; --i) seq.push_back(table_->layers[size_t(i)].uses);
  return seq;
}

float GPT::forward(int slot, const int32_t* inputs, const int32_t* targets, int B, int T) {
  TRIDENT_CHECK(B <= maxB_ && T <= maxT_, "micro-batch {}x{} exceeds {}x{}", B, T, maxB_, maxT_);
  // cp: the positions and the ring's buffers are those of the T the model was built for.
  TRIDENT_CHECK(cp_.size == 1 || T == maxT_, "cp {} with {} rows per sequence, built for {}",
                cp_.size, T, maxT_);
  TRIDENT_CHECK(slot >= 0 && slot < int(slots_.size()), "slot {} of {}", slot, slots_.size());
  const int C = cfg_.channels, Vl = cfg_.padded_vocab / tp_.size;
  const int N = B * T;
  Slot& s = slots_[slot];
  s.B = B;
  s.T = T;

  // The slot's chunk (StageSpec): its blocks, and the embedding or the head if it has them.
  const int begin = stage_.chunk_begin(s.chunk), end = begin + stage_.chunk_size(s.chunk);
  if (embedding_chunk(s)) {
    TRIDENT_CHECK(inputs != nullptr, "the first stage needs the input tokens");
    be_.copy(s.inputs.data(), inputs, size_t(N) * sizeof(int32_t));
    if (param_use_) param_use_(ParamPass::kForward, table_->embedding_uses);
    Phase ph(be_, phases_, table_->forward_embedding);
    embedding_forward(s.encoded.data(), s.inputs.data(), B, T);
  }
  const float* residual = s.encoded.data();
  moe_begin_forward(slot);
  for (int i = begin; i < end; ++i) {
    progress();
    if (param_use_) param_use_(ParamPass::kForward, table_->layers[size_t(i)].uses);
    const LayerTable& lt = table_->layers[size_t(i)];
    Phase ph(be_, phases_, lt.forward_phase);
    if (precision_ == Precision::kBf16) {
      cast_weights(size_t(i), lt.span_begin, lt.span_end);  // after param_use_ (ZeRO's gather)
      const BlockActs16 a = block_acts16(slot, i);
      block_forward_bf16(slot, i, block(layer_weights(i), i), block16(i), a, residual, B, T);
      residual = a.residual3;
      continue;
    }
    const BlockActs a = block_acts(slot, i);
    block_forward(slot, i, block(layer_weights(i), i), a, residual, B, T);
    residual = a.residual3;
  }
  moe_end_forward(slot, N / rows_divisor_);  // the rows each layer routed (Note [Mixtures and tp])
  if (!head_chunk(s)) return 0.0f;
  if (param_use_) param_use_(ParamPass::kForward, table_->head_uses);
  Phase ph(be_, phases_, table_->forward_head);
  if (precision_ == Precision::kBf16)  // Note [bf16 with tp] (gpt_bf16_tp.cpp) for tp > 1
    return tp_.size > 1 ? head_forward_bf16_tp(s, residual, targets, B, T)
                        : head_forward_bf16(s, residual, targets, B, T);
  Slot& h = head(s);
  norm_gathered(h.lnf.data(), h.lnf_mean.data(), h.lnf_rstd.data(), residual,
                head_weights() + table_->lnfw, at(head_weights(), table_->lnfb), B, T, C);
  be_.matmul_forward(h.logits.data(), h.lnf.data(), head_w_weights() + table_->head_w, nullptr, N,
                     C, Vl);
  s.has_targets = targets != nullptr;
  if (!targets) return 0.0f;
  be_.copy(s.targets.data(), targets, size_t(N) * sizeof(int32_t));
  return crossentropy_forward(s, s.targets.data(), N);
}

}  // namespace trident
