// The parameter layout (Note [Parameter layout] and Note [Tensor-parallel shards] in
// trident/model.h) and the FLOP count.
#include <fmt/format.h>

#include <algorithm>

#include "trident/check.h"
#include "trident/model.h"

namespace trident {

double GPTConfig::matmul_params() const {
  double C = channels, L = layers;
  return 12.0 * L * C * C + C * vocab;
}

double GPTConfig::train_flops_per_token(int T) const {
  return 6.0 * matmul_params() + 12.0 * layers * double(T) * channels;
}

void check_tensor_parallel(const GPTConfig& cfg, int tp, bool sequence_parallel, int seq_len) {
  if (tp == 1) return;
  if (cfg.heads % tp != 0)
    input_error("parallel.tp={}: model.heads {} is not divisible by tp (attention heads are "
                "split whole over tensor-parallel ranks)", tp, cfg.heads);
  if (cfg.channels % tp != 0)
    input_error("parallel.tp={}: model.d_model {} is not divisible by tp", tp, cfg.channels);
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
    case Shard::kRows:
      return (size_t(tp_rank) * rows + r) * cols + c;
    case Shard::kQkvRows: {
      // Local rows are q|k|v blocks of rows/3 each; globally each block has global_rows/3.
      const size_t block = rows / 3, global_block = size_t(global_shape[0]) / 3;
      const size_t part = r / block, within = r % block;
      return (part * global_block + size_t(tp_rank) * block + within) * cols + c;
    }
    case Shard::kColumns:
      return r * size_t(global_shape[1]) + size_t(tp_rank) * cols + c;
    case Shard::kReplicated:
      break;
  }
  return local;
}

StageSpec pipeline_stage(int layers, int stages, int stage, const std::vector<int>& stage_layers) {
  StageSpec s;
  s.has_embedding = stage == 0;
  s.has_head = stage == stages - 1;
  if (stages > layers)
    input_error("parallel.pp={}: more pipeline stages than model.layers {}", stages, layers);
  if (stage_layers.empty()) {
    const int base = layers / stages, extra = layers % stages;
    s.first_layer = stage * base + std::min(stage, extra);
    s.num_layers = base + (stage < extra ? 1 : 0);
    return s;
  }
  if (int(stage_layers.size()) != stages)
    input_error("parallel.stage_layers: {} entries for parallel.pp={} stages",
                stage_layers.size(), stages);
  int64_t total = 0;  // wide: "2147483647,1" must be refused, not overflow
  for (int n : stage_layers) {
    if (n < 1) input_error("parallel.stage_layers: every stage needs at least one layer, got {}", n);
    total += n;
  }
  if (total != layers)
    input_error("parallel.stage_layers: the stages hold {} layers but model.layers is {}", total,
                layers);
  for (int i = 0; i < stage; ++i) s.first_layer += stage_layers[i];
  s.num_layers = stage_layers[stage];
  return s;
}

Recompute parse_recompute(const std::string& text) {
  if (text == "none") return Recompute::kNone;
  if (text == "mlp") return Recompute::kMlp;
  if (text == "full") return Recompute::kFull;
  input_error("train.recompute: must be one of none|mlp|full, got \"{}\"", text);
}

std::vector<ParamInfo> gpt_param_layout(const GPTConfig& cfg, int tp, int tp_rank,
                                        StageSpec stage) {
  const int C = cfg.channels;
  const int first = stage.first_layer;
  const int last = stage.num_layers < 0 ? cfg.layers : first + stage.num_layers;
  std::vector<ParamInfo> out;
  size_t offset = 0;
  auto add = [&](std::string name, std::vector<int> global, Shard shard, bool decay, int layer) {
    std::vector<int> local = global;
    if (tp > 1 && (shard == Shard::kRows || shard == Shard::kQkvRows)) local[0] /= tp;
    if (tp > 1 && shard == Shard::kColumns) local[1] /= tp;
    size_t count = 1;
    for (int d : local) count *= size_t(d);
    ParamInfo p;
    p.name = std::move(name);
    p.shape = local;
    p.global_shape = global;
    p.shard = tp > 1 ? shard : Shard::kReplicated;
    p.tp_rank = tp_rank;
    p.tp_size = tp;
    p.offset = offset;
    p.count = count;
    p.decay = decay;
    p.layer = layer;
    out.push_back(std::move(p));
    offset += count;
  };
  // Ready order: the LM head's dense wte gradient, the final LayerNorm, blocks last to first
  // (each in its own backward order), the position embedding — and wte there instead on a
  // first stage without the head, where its (sparse) gradient is final only at the very end.
  if (stage.has_head) {
    add("wte", {cfg.padded_vocab, C}, Shard::kRows, true, -1);
    add("lnfw", {C}, Shard::kReplicated, false, -1);
    add("lnfb", {C}, Shard::kReplicated, false, -1);
  }
  for (int l = last - 1; l >= first; --l) {
    auto n = [l](const char* s) { return fmt::format("h{}.{}", l, s); };
    add(n("fcprojw"), {C, 4 * C}, Shard::kColumns, true, l);
    add(n("fcprojb"), {C}, Shard::kReplicated, false, l);
    add(n("fcw"), {4 * C, C}, Shard::kRows, true, l);
    add(n("fcb"), {4 * C}, Shard::kRows, false, l);
    add(n("ln2w"), {C}, Shard::kReplicated, false, l);
    add(n("ln2b"), {C}, Shard::kReplicated, false, l);
    add(n("attprojw"), {C, C}, Shard::kColumns, true, l);
    add(n("attprojb"), {C}, Shard::kReplicated, false, l);
    add(n("qkvw"), {3 * C, C}, Shard::kQkvRows, true, l);
    add(n("qkvb"), {3 * C}, Shard::kQkvRows, false, l);
    add(n("ln1w"), {C}, Shard::kReplicated, false, l);
    add(n("ln1b"), {C}, Shard::kReplicated, false, l);
  }
  if (stage.has_embedding) {
    add("wpe", {cfg.max_seq_len, C}, Shard::kReplicated, true, -1);
    if (!stage.has_head) add("wte", {cfg.padded_vocab, C}, Shard::kRows, true, -1);
  }
  return out;
}

}  // namespace trident
