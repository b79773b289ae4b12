// GPT-2 forward and backward as a sequence of Backend layer calls, tensor-parallel in the
// Megatron way (Note [Tensor-parallel shards] in trident/model.h) and split into pipeline
// stages (Note [Pipeline stages]):
//   - qkv and fc are column-parallel (each tp rank computes its heads / its slice of 4C);
//     attproj and fcproj are row-parallel (partial sums, reduced over tp, bias added once);
//   - the residual stream is replicated, or split along the sequence with sequence
//     parallelism (LayerNorm outputs are gathered before the column-parallel linears, the
//     row-parallel outputs reduce-scattered after);
//   - the embedding and the LM head are vocab-parallel, the loss a vocab-parallel softmax.
// The conjugate pair "identity forward / all-reduce backward" sits in layernorm_gathered*,
// "all-reduce forward / identity backward" in reduce_rows / gather_rows (gpt_tp.cpp): written
// once, used by attention, MLP, embedding and head alike. With tp = 1 they are plain copies.
// Activations live in slots, one per micro-batch in flight (gpt_slots.cpp); pp = 1 is one
// stage holding everything, run by the same code.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "trident/check.h"
#include "trident/model.h"

namespace trident {
namespace {

// One phase of forward or backward ("forward block 3"): a profiling range on the backend (NVTX
// on CUDA), and a report to the recorder (if any) when it goes out of scope. The name is the
// parameter table's (Note [Parameter table]), so a phase formats and copies nothing.
class Phase {
 public:
  Phase(Backend& be, const PhaseFn& fn, const std::string& name) : be_(be), fn_(fn), name_(name) {
    be_.push_range(name_.c_str());
    if (fn_) begin_ = std::chrono::steady_clock::now();
  }
  ~Phase() {
    if (fn_) fn_(name_, begin_, std::chrono::steady_clock::now());
    be_.pop_range();
  }

 private:
  Backend& be_;
  const PhaseFn& fn_;
  const std::string& name_;
  std::chrono::steady_clock::time_point begin_;
};

}  // namespace

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
  ParamTable& t = table_;
  t.wte_index = param_index("wte");
  t.wpe_index = param_index("wpe");
  t.lnfb_index = param_index("lnfb");
  if (t.wte_index >= 0) t.wte = infos_[size_t(t.wte_index)].offset;
  if (t.wpe_index >= 0) t.wpe = infos_[size_t(t.wpe_index)].offset;
  if (stage_.has_head) {
    t.lnfw = param("lnfw").offset;
    t.lnfb = param("lnfb").offset;
  }
  t.embedding_uses.clear();
  t.head_uses.clear();
  if (stage_.has_embedding) t.embedding_uses = {t.wte_index, t.wpe_index};
  if (stage_.has_head) t.head_uses = {param_index("lnfw"), t.lnfb_index, t.wte_index};
  t.layers.clear();
  for (int i = 0; i < stage_.num_layers; ++i) {
    const int l = stage_.first_layer + i;
    auto name = [l](const char* s) { return fmt::format("h{}.{}", l, s); };
    auto off = [&](const char* s) { return param(name(s)).offset; };
    auto ready = [&](const char* s) { return int(&param(name(s)) - infos_.data()); };
    LayerTable lt;
    lt.offset = {off("ln1w"), off("ln1b"),     off("qkvw"),     off("qkvb"),
                 off("attprojw"), off("attprojb"), off("ln2w"), off("ln2b"),
                 off("fcw"),  off("fcb"),      off("fcprojw"),  off("fcprojb")};
    lt.ready_fcproj = ready("fcprojb");
    lt.ready_fc = ready("fcb");
    lt.ready_ln2 = ready("ln2b");
    lt.ready_attproj = ready("attprojb");
    lt.ready_qkv = ready("qkvb");
    lt.ready_ln1 = ready("ln1b");
    for (int k = ready("fcprojw"); k <= lt.ready_ln1; ++k) lt.uses.push_back(k);
    lt.forward_phase = fmt::format("forward block {}", l);
    lt.backward_phase = fmt::format("backward block {}", l);
    t.layers.push_back(std::move(lt));
  }
}

GPT::BlockWeights GPT::block(float* base, int local_layer) const {
  const BlockOffsets& o = table_.layers[size_t(local_layer)].offset;
  return {base + o.ln1w,     base + o.ln1b, base + o.qkvw, base + o.qkvb,
          base + o.attprojw, base + o.attprojb, base + o.ln2w, base + o.ln2b,
          base + o.fcw,      base + o.fcb,  base + o.fcprojw, base + o.fcprojb};
}

void GPT::zero_grads() { be_.fill_zero(grads_.data(), grads_.size() * sizeof(float)); }

void GPT::block_forward(const BlockWeights& w, const BlockActs& a, const float* residual_in,
                        int B, int T) {
  const int C = cfg_.channels, tps = tp_.size;
  const int NHl = cfg_.heads / tps, Cl = C / tps;
  const int N = B * T, Nr = N / rows_divisor_;
  // The row-parallel outputs are partial sums to reduce over tp; with tp = 1 they are final,
  // so they go straight where reduce_rows would copy them (which then copies nothing).
  float* attn_partial = tp_.size == 1 ? a.residual2 : scratch_.full_c.data();
  float* mlp_partial = tp_.size == 1 ? a.residual3 : scratch_.full_c.data();
  // Row-parallel biases are added by tp rank 0 only, before the sum over tp.
  const bool add_row_bias = tp_.rank == 0;
  layernorm_gathered(a.ln1, a.ln1_mean, a.ln1_rstd, residual_in, w.ln1w, w.ln1b, B, T, C);
  be_.matmul_forward(a.qkv, a.ln1, w.qkvw, w.qkvb, N, C, 3 * Cl);
  be_.attention_forward(a.atty, a.att, a.qkv, B, T, Cl, NHl);
  be_.matmul_forward(attn_partial, a.atty, w.attprojw, add_row_bias ? w.attprojb : nullptr, N, Cl,
                     C);
  reduce_rows(a.residual2, attn_partial, B, T, C);
  be_.add(a.residual2, a.residual2, residual_in, size_t(Nr) * C);
  layernorm_gathered(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, w.ln2w, w.ln2b, B, T, C);
  be_.matmul_forward(a.fch, a.ln2, w.fcw, w.fcb, N, C, 4 * Cl);
  be_.gelu_forward(a.fch_gelu, a.fch, size_t(N) * 4 * Cl);
  be_.matmul_forward(mlp_partial, a.fch_gelu, w.fcprojw, add_row_bias ? w.fcprojb : nullptr, N,
                     4 * Cl, C);
  reduce_rows(a.residual3, mlp_partial, B, T, C);
  be_.add(a.residual3, a.residual3, a.residual2, size_t(Nr) * C);
}

float GPT::forward(int slot, const int32_t* inputs, const int32_t* targets, int B, int T) {
  TRIDENT_CHECK(B <= maxB_ && T <= maxT_, "micro-batch {}x{} exceeds {}x{}", B, T, maxB_, maxT_);
  TRIDENT_CHECK(slot >= 0 && slot < int(slots_.size()), "slot {} of {}", slot, slots_.size());
  const int C = cfg_.channels, Vl = cfg_.padded_vocab / tp_.size;
  const int N = B * T;
  Slot& s = slots_[slot];
  s.B = B;
  s.T = T;
  float* P = params_.data();

  if (stage_.has_embedding) {
    TRIDENT_CHECK(inputs != nullptr, "the first stage needs the input tokens");
    be_.copy(s.inputs.data(), inputs, size_t(N) * sizeof(int32_t));
    if (param_use_) param_use_(table_.embedding_uses);
    Phase ph(be_, phases_, table_.forward_embedding);
    embedding_forward(s.encoded.data(), s.inputs.data(), B, T);
  }
  const float* residual = s.encoded.data();
  for (int i = 0; i < stage_.num_layers; ++i) {
    if (param_use_) param_use_(table_.layers[size_t(i)].uses);
    Phase ph(be_, phases_, table_.layers[size_t(i)].forward_phase);
    const BlockActs a = block_acts(slot, i);
    block_forward(block(P, i), a, residual, B, T);
    residual = a.residual3;
  }
  if (!stage_.has_head) return 0.0f;
  if (param_use_) param_use_(table_.head_uses);
  Phase ph(be_, phases_, table_.forward_head);
  layernorm_gathered(s.lnf.data(), s.lnf_mean.data(), s.lnf_rstd.data(), residual,
                     P + table_.lnfw, P + table_.lnfb, B, T, C);
  be_.matmul_forward(s.logits.data(), s.lnf.data(), P + table_.wte, nullptr, N, C, Vl);
  s.has_targets = targets != nullptr;
  if (!targets) return 0.0f;
  be_.copy(s.targets.data(), targets, size_t(N) * sizeof(int32_t));
  return crossentropy_forward(s, s.targets.data(), N);
}

void GPT::backward(int slot, float dloss_scale, const float* dstage_output, float* dstage_input,
                   const GradReadyFn& on_ready, const EmbeddingRowSink* sink,
                   bool last_micro_batch) {
  Slot& s = slots_[slot];
  const int B = s.B, T = s.T, N = B * T, Nr = N / rows_divisor_;
  const int C = cfg_.channels, tps = tp_.size;
  const int NHl = cfg_.heads / tps, Cl = C / tps, Vl = cfg_.padded_vocab / tps;
  Scratch& a = scratch_;
  float* P = params_.data();
  float* G = grads_.data();
  // Parameters are listed in ready order, so "ready" walks the list front to back, through
  // the indices of the parameter table (Note [Parameter table]). wte is reported on its own:
  // right after the LM head when that is its only contribution on this stage (or the sparse
  // part goes to a sink), else after the embedding.
  const int wte_index = table_.wte_index;
  const bool wte_after_head = stage_.has_head && (!stage_.has_embedding || sink);
  int next_ready = 0;
  auto ready_through = [&](int last) {
    if (!on_ready) return;
    for (; next_ready <= last; ++next_ready)
      if (next_ready != wte_index) on_ready(next_ready);
  };
  // The gradient w.r.t. the residual stream on all N rows (gathered with sequence parallelism).
  auto dresidual_all_rows = [&]() -> const float* {
    if (rows_divisor_ == 1) return a.dresidual.data();
    gather_rows(a.dfull.data(), a.dresidual.data(), B, T, C);
    return a.dfull.data();
  };

  const int L = stage_.num_layers;
  const float* last_residual =
      L > 0 ? block_acts(slot, L - 1).residual3 : s.encoded.data();
  if (stage_.has_head) {
    TRIDENT_CHECK(s.has_targets, "backward() needs a forward() with targets first");
    Phase ph(be_, phases_, table_.backward_head);
    // Mean over the N tokens of this micro-batch, times the caller's scale (1/accum).
    crossentropy_backward(s, s.targets.data(), dloss_scale / float(N), N);
    // dwte first, so that when it is final it can be reduced while the head's input gradient
    // (the rest of backward's critical path) is computed.
    be_.matmul_backward(nullptr, G + table_.wte, nullptr, s.logits.data(), s.lnf.data(),
                        P + table_.wte, N, C, Vl);
    if (wte_after_head && on_ready) on_ready(wte_index);
    be_.matmul_backward(a.dbuf_c.data(), nullptr, nullptr, s.logits.data(), s.lnf.data(),
                        P + table_.wte, N, C, Vl);
    layernorm_gathered_backward(a.dresidual.data(), G + table_.lnfw, G + table_.lnfb,
                                a.dbuf_c.data(), last_residual, P + table_.lnfw,
                                s.lnf_mean.data(), s.lnf_rstd.data(), B, T, C, 2 * L,
                                last_micro_batch);
    ready_through(table_.lnfb_index);
  } else {
    TRIDENT_CHECK(dstage_output != nullptr, "a stage before the last needs its output gradient");
    be_.copy(a.dresidual.data(), dstage_output, size_t(Nr) * C * sizeof(float));
  }

  for (int i = L - 1; i >= 0; --i) {
    const LayerTable& lt = table_.layers[size_t(i)];
    Phase ph(be_, phases_, lt.backward_phase);
    const float* residual_in = i == 0 ? s.encoded.data() : block_acts(slot, i - 1).residual3;
    recompute_block(slot, i, residual_in);
    const BlockActs act = block_acts(slot, i);
    const BlockWeights w = block(P, i);
    const BlockWeights dw = block(G, i);
    float* dres = a.dresidual.data();  // gradient w.r.t. this block's output (this rank's rows)

    const float* dout = dresidual_all_rows();
    be_.matmul_backward(a.dbuf_4c.data(), dw.fcprojw, dw.fcprojb, dout, act.fch_gelu, w.fcprojw,
                        N, 4 * Cl, C);
    ready_through(lt.ready_fcproj);
    be_.gelu_backward(a.dbuf_4c2.data(), act.fch, a.dbuf_4c.data(), size_t(N) * 4 * Cl);
    be_.matmul_backward(a.dbuf_c.data(), dw.fcw, dw.fcb, a.dbuf_4c2.data(), act.ln2, w.fcw, N, C,
                        4 * Cl);
    ready_through(lt.ready_fc);
    layernorm_gathered_backward(a.dbuf_c2.data(), dw.ln2w, dw.ln2b, a.dbuf_c.data(),
                                act.residual2, w.ln2w, act.ln2_mean, act.ln2_rstd, B, T, C,
                                2 * i + 1, last_micro_batch);
    ready_through(lt.ready_ln2);
    be_.add(dres, dres, a.dbuf_c2.data(), size_t(Nr) * C);  // now w.r.t. residual2

    dout = dresidual_all_rows();
    be_.matmul_backward(a.dbuf_c.data(), dw.attprojw, dw.attprojb, dout, act.atty, w.attprojw, N,
                        Cl, C);
    ready_through(lt.ready_attproj);
    be_.attention_backward(a.dbuf_3c.data(), a.datt.data(), a.dbuf_c.data(), act.qkv, act.atty,
                           act.att, B,
                           T, Cl, NHl);
    be_.matmul_backward(a.dbuf_c.data(), dw.qkvw, dw.qkvb, a.dbuf_3c.data(), act.ln1, w.qkvw, N,
                        C, 3 * Cl);
    ready_through(lt.ready_qkv);
    layernorm_gathered_backward(a.dbuf_c2.data(), dw.ln1w, dw.ln1b, a.dbuf_c.data(), residual_in,
                                w.ln1w, act.ln1_mean, act.ln1_rstd, B, T, C, 2 * i,
                                last_micro_batch);
    ready_through(lt.ready_ln1);
    be_.add(dres, dres, a.dbuf_c2.data(), size_t(Nr) * C);  // now w.r.t. the block's input
  }
  if (!stage_.has_embedding) {
    TRIDENT_CHECK(dstage_input != nullptr, "a stage after the first must return its input gradient");
    be_.copy(dstage_input, a.dresidual.data(), size_t(Nr) * C * sizeof(float));
    ready_through(int(infos_.size()) - 1);  // the rest of this stage's list
    return;
  }
  // The token embedding's second (sparse) contribution comes last (Note [Tied embedding
  // gradient]): into the sink's compact rows, or into wte's gradient, which is final only now.
  Phase ph(be_, phases_, table_.backward_embedding);
  embedding_backward(dresidual_all_rows(), s.inputs.data(), sink, B, T);
  ready_through(table_.wpe_index);
  if (!wte_after_head && on_ready) on_ready(wte_index);
}

}  // namespace trident
