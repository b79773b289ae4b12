// The parameter layout (Note [Parameter layout] and Note [Tensor-parallel shards] in
// trident/model.h) and the FLOP count.
#include <fmt/format.h>

#include <algorithm>

#include "trident/check.h"
#include "trident/model.h"

namespace trident {

void check_tensor_parallel(const GPTConfig& cfg, int tp, bool sequence_parallel, int seq_len) {
  if (tp == 1) return;
  if (cfg.heads % tp != 0)
    input_error("parallel.tp={}: model.heads {} is not divisible by tp (attention heads are "
                "split whole over tensor-parallel ranks)",
                tp, cfg.heads);
  if (cfg.kv_head_count() % tp != 0)
    input_error("parallel.tp={}: model.kv_heads {} is not divisible by tp (key/value heads are "
                "split whole, as Megatron splits query groups)",
                tp, cfg.kv_head_count());
  if (cfg.channels % tp != 0)
    input_error("parallel.tp={}: model.d_model {} is not divisible by tp", tp, cfg.channels);
  if (cfg.hidden() % tp != 0)
    input_error("parallel.tp={}: the MLP width {} (model.mlp_hidden) is not divisible by tp", tp,
                cfg.hidden());
  if (sequence_parallel && seq_len % tp != 0)
    input_error("parallel.sequence_parallel with tp={}: model.seq_len {} is not divisible by tp",
                tp, seq_len);
  if (cfg.padded_vocab % (128 * tp) != 0)
    input_error("parallel.tp={}: the padded vocabulary {} is not a multiple of 128·tp = {}", tp,
                cfg.padded_vocab, 128 * tp);
}

size_t ParamInfo::global_index(size_t local) const {
  if (shard == Shard::kReplicated || tp_size == 1) return local;
  const size_t rows = size_t(shape[0]);
  const size_t cols = shape.size() > 1 ? size_t(shape[1]) : 1;
  const size_t r = local / cols, c = local % cols;
  switch (shard) {
    case Shard::kRows: return (size_t(tp_rank) * rows + r) * cols + c;
    case Shard::kPartRows: {
      // Local rows are the parts' local rows, part after part; part k has parts[k] global rows.
      size_t local_begin = 0, global_begin = 0;
      for (int part : parts) {
        const size_t local_rows = size_t(part) / size_t(tp_size);
        if (r < local_begin + local_rows)
          return (global_begin + size_t(tp_rank) * local_rows + (r - local_begin)) * cols + c;
        local_begin += local_rows;
        global_begin += size_t(part);
      }
      internal_error(__FILE__, __LINE__, "global_index past the parts of " + name);
    }
    case Shard::kColumns: return r * size_t(global_shape[1]) + size_t(tp_rank) * cols + c;
    case Shard::kReplicated: break;
  }
  return local;
}

int StageSpec::chunk_begin(int chunk) const {
  int begin = 0;
  for (int c = 0; c < chunk; ++c) begin += chunk_layers[size_t(c)];
  return chunk_layers.empty() ? 0 : begin;
}

int StageSpec::chunk_size(int chunk) const {
  return chunk_layers.empty() ? num_layers : chunk_layers[size_t(chunk)];
}

int StageSpec::global_layer(int local) const {
  if (chunk_layers.empty()) return first_layer + local;
  for (size_t c = 0; c < chunk_layers.size(); ++c) {
    if (local < chunk_layers[c]) return chunk_first[c] + local;
    local -= chunk_layers[c];
  }
  internal_error(__FILE__, __LINE__, "StageSpec::global_layer past the stage's layers");
}

StageSpec pipeline_stage(int layers, int stages, int stage, const std::vector<int>& stage_layers,
                         int chunks) {
  StageSpec s;
  s.has_embedding = stage == 0;
  s.has_head = stage == stages - 1;
  const int parts = stages * chunks;  // virtual stages, c·stages + stage
  if (parts > layers) {
    if (chunks == 1)
      input_error("parallel.pp={}: more pipeline stages than model.layers {}", stages, layers);
    input_error("parallel.pp={} × parallel.virtual_stages={}: {} model chunks but model.layers "
                "is {}",
                stages, chunks, parts, layers);
  }
  std::vector<int> counts = stage_layers;
  if (counts.empty()) {
    const int base = layers / parts, extra = layers % parts;
    for (int v = 0; v < parts; ++v) counts.push_back(base + (v < extra ? 1 : 0));
  } else {
    if (int(counts.size()) != parts)
      input_error("parallel.stage_layers: {} entries for {} {}", counts.size(), parts,
                  chunks == 1 ? fmt::format("stages (parallel.pp={})", stages)
                              : fmt::format("virtual stages (parallel.pp={} × "
                                            "parallel.virtual_stages={})",
                                            stages, chunks));
    int64_t total = 0;  // wide: "2147483647,1" must be refused, not overflow
    for (int n : counts) {
      if (n < 1)
        input_error("parallel.stage_layers: every stage needs at least one layer, got {}", n);
      total += n;
    }
    if (total != layers)
      input_error("parallel.stage_layers: the stages hold {} layers but model.layers is {}", total,
                  layers);
  }
  std::vector<int> first(size_t(parts), 0);
  for (int v = 1; v < parts; ++v) first[size_t(v)] = first[size_t(v) - 1] + counts[size_t(v) - 1];
  s.first_layer = first[size_t(stage)];
  s.num_layers = 0;
  for (int c = 0; c < chunks; ++c) s.num_layers += counts[size_t(c * stages + stage)];
  if (chunks == 1) return s;
  for (int c = 0; c < chunks; ++c) {
    s.chunk_first.push_back(first[size_t(c * stages + stage)]);
    s.chunk_layers.push_back(counts[size_t(c * stages + stage)]);
  }
  return s;
}

Recompute parse_recompute(const std::string& text) {
  if (text == "none") return Recompute::kNone;
  if (text == "mlp") return Recompute::kMlp;
  if (text == "full") return Recompute::kFull;
  input_error("train.recompute: must be one of none|mlp|full, got \"{}\"", text);
}

Precision parse_precision(const std::string& text) {
  if (text == "fp32") return Precision::kFp32;
  if (text == "bf16") return Precision::kBf16;
  input_error("run.precision: must be one of fp32|bf16, got \"{}\"", text);
}

// Note [Expert tensors]
// A mixture layer's routed experts are two 2-D tensors, expert after expert: expfcw
// [E·fc_rows, C] (each expert's gate | up, or fc) and expfcprojw [E·C, F]. ep splits their rows
// as kRows splits over tp (rank r holds experts [r·E/ep, (r+1)·E/ep)), so checkpoints,
// global_index and ZeRO's pieces read them as any row-split tensor; the router [E, C] and the
// choice bias [E] are replicated. In ready order: experts, router, bias, shared experts, gate.
std::vector<ParamInfo> gpt_param_layout(const GPTConfig& cfg, int tp, int tp_rank, StageSpec stage,
                                        bool wte_after_head, int ep, int ep_rank) {
  const int C = cfg.channels, hs = cfg.head_size(), F = cfg.hidden();
  const int q_rows = cfg.heads * hs, kv_rows = cfg.kv_head_count() * hs;
  if (stage.num_layers < 0) stage.num_layers = cfg.layers - stage.first_layer;
  std::vector<ParamInfo> out;
  size_t offset = 0;
  auto add = [&](std::string name, std::vector<int> global, Shard shard, bool decay, int layer,
                 std::vector<int> parts = {}) {
    std::vector<int> local = global;
    if (tp > 1 && (shard == Shard::kRows || shard == Shard::kPartRows)) local[0] /= tp;
    if (tp > 1 && shard == Shard::kColumns) local[1] /= tp;
    size_t count = 1;
    for (int d : local) count *= size_t(d);
    ParamInfo p;
    p.name = std::move(name);
    p.shape = local;
    p.global_shape = global;
    p.shard = tp > 1 ? shard : Shard::kReplicated;
    if (p.shard == Shard::kPartRows) p.parts = std::move(parts);
    p.tp_rank = tp_rank;
    p.tp_size = tp;
    p.offset = offset;
    p.count = count;
    p.decay = decay;
    p.layer = layer;
    out.push_back(std::move(p));
    offset += count;
  };
  const bool bias = cfg.bias, norm_bias = cfg.norm_has_bias();
  const bool swiglu = cfg.activation == Activation::kSwiGLU;
  // Ready order: the head's weight (the tied wte's dense gradient, or lmw), the final norm,
  // blocks last to first (each in its own backward order), the position embedding, and an
  // untied wte — the tied one there instead on a first stage without the head, or with it but
  // without a sink (wte_after_head false), where its (sparse) gradient is final only at the end.
  const bool wte_first =
      cfg.tied_head && stage.has_head && (!stage.has_embedding || wte_after_head);
  if (wte_first) add("wte", {cfg.padded_vocab, C}, Shard::kRows, true, -1);
  if (stage.has_head && !cfg.tied_head) add("lmw", {cfg.padded_vocab, C}, Shard::kRows, true, -1);
  if (stage.has_head) {
    add("lnfw", {C}, Shard::kReplicated, false, -1);
    if (norm_bias) add("lnfb", {C}, Shard::kReplicated, false, -1);
  }
  const std::vector<int> qkv_parts = {q_rows, kv_rows, kv_rows};
  const std::vector<int> fc_parts = swiglu ? std::vector<int>{F, F} : std::vector<int>{F};
  // With chunks, the last chunk's blocks come first: its backward runs first.
  for (int i = stage.num_layers - 1; i >= 0; --i) {
    const int l = stage.global_layer(i);
    auto n = [l](const char* s) { return fmt::format("h{}.{}", l, s); };
    if (cfg.is_moe(l)) {
      const int E = cfg.moe.experts, Fe = cfg.expert_width(), Fs = cfg.shared_width();
      auto expert = [&](const char* s, std::vector<int> global) {
        add(n(s), global, Shard::kReplicated, true, l);
        ParamInfo& p = out.back();
        p.expert = true;
        if (ep > 1) {  // rows over ep (tp > 1 with experts is refused before this)
          p.shard = Shard::kRows;
          p.shape[0] = global[0] / ep;
          p.tp_rank = ep_rank;
          p.tp_size = ep;
          offset -= p.count;
          p.count /= size_t(ep);
          offset += p.count;
        }
      };
      expert("expfcprojw", {E * C, Fe});
      expert("expfcw", {E * cfg.fc_rows_of(Fe), C});
      add(n("router"), {E, C}, Shard::kReplicated, true, l);
      if (cfg.moe.router == MoeRouter::kSigmoid) {
        add(n("routerbias"), {E}, Shard::kReplicated, false, l);
        out.back().trained = false;
      }
      if (Fs > 0) {
        add(n("shfcprojw"), {C, Fs}, Shard::kReplicated, true, l);
        add(n("shfcw"), {cfg.fc_rows_of(Fs), C}, Shard::kReplicated, true, l);
        if (cfg.moe.shared_gate) add(n("shgate"), {1, C}, Shard::kReplicated, true, l);
      }
    } else {
      add(n("fcprojw"), {C, F}, Shard::kColumns, true, l);
      if (bias) add(n("fcprojb"), {C}, Shard::kReplicated, false, l);
      add(n("fcw"), {cfg.fc_rows(), C}, Shard::kPartRows, true, l, fc_parts);
      if (bias) add(n("fcb"), {cfg.fc_rows()}, Shard::kPartRows, false, l, fc_parts);
    }
    add(n("ln2w"), {C}, Shard::kReplicated, false, l);
    if (norm_bias) add(n("ln2b"), {C}, Shard::kReplicated, false, l);
    add(n("attprojw"), {C, q_rows}, Shard::kColumns, true, l);
    if (bias) add(n("attprojb"), {C}, Shard::kReplicated, false, l);
    add(n("qkvw"), {cfg.qkv_rows(), C}, Shard::kPartRows, true, l, qkv_parts);
    if (bias) add(n("qkvb"), {cfg.qkv_rows()}, Shard::kPartRows, false, l, qkv_parts);
    add(n("ln1w"), {C}, Shard::kReplicated, false, l);
    if (norm_bias) add(n("ln1b"), {C}, Shard::kReplicated, false, l);
  }
  if (stage.has_embedding) {
    if (cfg.has_wpe()) add("wpe", {cfg.max_seq_len, C}, Shard::kReplicated, true, -1);
    if (!wte_first) add("wte", {cfg.padded_vocab, C}, Shard::kRows, true, -1);
  }
  return out;
}

}  // namespace trident
