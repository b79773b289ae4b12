// The GPT model's memory: parameters, and activations in slots (one per micro-batch in flight
// on this pipeline stage), with activation recomputation.
//
// Per block a slot keeps the buffers of BlockActs that the recompute mode does not drop:
//   none  every buffer (13 per block);
//   mlp   all but the MLP's hidden activations fch and fch_gelu (8·N·C/tp floats per block),
//         recomputed from ln2 in backward;
//   full  only the block's output (its successor's input); backward re-runs the block.
// Dropped buffers live once, in recompute_, shared by all blocks and slots: forward writes
// them and moves on, backward recomputes them right before the block's backward (full also
// needs one block output to recompute into). Only those are allocated: mlp has no copy of the
// B·NH·T·T attention buffer. The recomputation runs the same ops on the same inputs, so
// results are bitwise those of none.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/cp_attention.h"
#include "model/gpt_state.h"
#include "model/moe.h"
#include "model/tp_overlap.h"
#include "trident/check.h"
#include "trident/model.h"

namespace trident {

GPT::GPT(const GPTConfig& cfg, Backend& backend, int B, int T, GPTOptions options)
    : cfg_(cfg), be_(backend), maxB_(B), maxT_(T),
      infos_(gpt_param_layout(cfg, options.tp.size, options.tp.rank, options.stage,
                              options.wte_after_head, options.ep.size, options.ep.rank)),
      table_(std::make_unique<ParamTable>()), scratch_(std::make_unique<Scratch>()),
      tp_(options.tp), cp_(options.cp), ep_(options.ep), stage_(options.stage),
      recompute_mode_(options.recompute), precision_(options.precision),
      dloss_scale_(options.dloss_scale) {
  TRIDENT_CHECK(T <= cfg.max_seq_len, "T {} > max_seq_len {}", T, cfg.max_seq_len);
  check_model_config(cfg);
  // Note [Families on the GPT-2 paths]
  // The bf16 path (run.precision bf16) runs every family where the backend has the families'
  // bf16 ops (Backend::has_bf16_family_ops: the CPU's host definitions, the CUDA backend's
  // kernels). A device backend without them is refused here, before any allocation, rather
  // than at the first op it lacks; it runs another block with fp32 activations.
  if (!cfg.is_gpt2_block() && options.precision == Precision::kBf16 &&
      !backend.has_bf16_family_ops())
    input_error("run.precision bf16 on the {} backend runs GPT-2's block only; this model is {} "
                "(use run.precision fp32)",
                backend.name(), describe_block(cfg));
  TRIDENT_CHECK(tp_.size == 1 || tp_.comm != nullptr, "tp {} without a communicator", tp_.size);
  TRIDENT_CHECK(options.slots >= 1, "slots {}", options.slots);
  check_tensor_parallel(cfg, tp_.size, tp_.sequence_parallel, T);
  // Note [Mixtures in the layouts] in src/model/gpt_moe.cpp.
  if (cfg.has_moe()) {
    if (tp_.size > 1 && !tp_.sequence_parallel)
      input_error("model.moe with parallel.tp {} needs parallel.sequence_parallel: each tp rank "
                  "routes its own rows (Note [Mixtures and tp] in src/model/gpt_moe.cpp)",
                  tp_.size);
    TRIDENT_CHECK(ep_.size == 1 || ep_.comm != nullptr, "ep {} without a communicator", ep_.size);
    if (cfg.moe.experts % ep_.size != 0)
      input_error("parallel.ep {} does not divide model.moe.experts {}", ep_.size, cfg.moe.experts);
  }
  // Note [Context parallelism] (cp_attention.h): T is this rank's two chunks of each sequence.
  if (cp_.size > 1) {
    TRIDENT_CHECK(cp_.comm != nullptr && T % 2 == 0,
                  "cp {} needs its communicator and two chunks "
                  "per rank (T {})",
                  cp_.size, T);
    cp_positions_ = cp_positions(T, cp_.size, cp_.rank);
  }
  const bool bf16 = precision_ == Precision::kBf16;
  // Note [bf16 with tp]: cp and mixtures widen in the tp block as in tp 1's
  // (Note [Widening under tp]).
  if (bf16 && !options.wte_piece_rows.empty())
    internal_error(__FILE__, __LINE__, "bf16 with the head's gradient in pieces");
  if (stage_.num_layers < 0) stage_.num_layers = cfg.layers - stage_.first_layer;
  // Slots by chunk (StageSpec): one chunk holds them all unless the options divide them.
  std::vector<int> chunk_slots = options.chunk_slots;
  if (chunk_slots.empty()) chunk_slots = {options.slots};
  TRIDENT_CHECK(int(chunk_slots.size()) == stage_.chunks(), "{} chunk slot counts for {} chunks",
                chunk_slots.size(), stage_.chunks());
  chunk_slot_base_ = {0};
  for (int n : chunk_slots) {
    TRIDENT_CHECK(n >= 1, "a chunk with {} slots", n);
    chunk_slot_base_.push_back(chunk_slot_base_.back() + n);
  }
  TRIDENT_CHECK(chunk_slot_base_.back() == options.slots, "chunk slots add up to {}, not {}",
                chunk_slot_base_.back(), options.slots);
  TRIDENT_CHECK(!options.shared_head || stage_.chunks() == 1, "shared head buffers with chunks");
  if (tp_.size == 1) tp_.sequence_parallel = false;
  rows_divisor_ = tp_.sequence_parallel ? tp_.size : 1;
  size_t total = infos_.back().offset + infos_.back().count;
  if (!options.param_offsets.empty()) {  // Note [Padded buckets]
    TRIDENT_CHECK(options.param_offsets.size() == infos_.size(),
                  "{} parameter offsets for {} parameters", options.param_offsets.size(),
                  infos_.size());
    for (size_t i = 0; i < infos_.size(); ++i) {
      infos_[i].offset = options.param_offsets[i];
      TRIDENT_CHECK(infos_[i].offset + infos_[i].count <= options.param_total &&
                        (i == 0 || infos_[i].offset >= infos_[i - 1].offset + infos_[i - 1].count),
                    "parameter offsets overlap or exceed the buffer at '{}'", infos_[i].name);
    }
    total = options.param_total;
  }
  build_param_table();
  auto floats = [&](size_t n) { return BackendBuffer<float>(be_, n); };     // zeroed
  auto halves = [&](size_t n) { return BackendBuffer<bfloat16>(be_, n); };  // zeroed
  if (!options.no_full_params) params_ = floats(total);  // Note [No full weights on a device]
  if (!options.pooled_grads) grads_ = floats(total);
  num_params_ = total;
  weight_base_.assign(table_->layers.size() + 3, params_.data());  // Note [Weights in unit slots]
  grad_base_.assign(weight_base_.size(), grads_.data());           // Note [Gradients in unit slots]
  if (bf16) {
    if (!options.no_full_params) params16_ = halves(total);  // Note [bf16 unit gathers]
    cast_version_.assign(table_->layers.size() + 1, 0);      // nothing cast yet
  }

  const size_t C = cfg.channels, tps = tp_.size;
  const size_t NHl = cfg.heads / tps, Ql = NHl * cfg.head_size(), Vl = cfg.padded_vocab / tps;
  const size_t QKVl = cfg.qkv_rows() / tps, FCl = cfg.fc_rows() / tps, Fl = cfg.hidden() / tps;
  const size_t N = size_t(B) * T, Nr = N / rows_divisor_;
  block_sizes_ = block_sizes();
  const std::array<size_t, kBlockBuffers>& sizes = block_sizes_;
  const std::array<bool, kBlockBuffers> kept = block_kept();
  // Note [Mixture memory]: fch and fch_gelu hold the chunk's dense layers only.
  mlp_place_.assign(size_t(stage_.num_layers), -1);
  std::vector<int> chunk_mlps(size_t(stage_.chunks()), 0);
  for (int c = 0; c < stage_.chunks(); ++c)
    for (int i = stage_.chunk_begin(c); i < stage_.chunk_begin(c) + stage_.chunk_size(c); ++i)
      if (!cfg.is_moe(stage_.global_layer(i))) mlp_place_[size_t(i)] = chunk_mlps[size_t(c)]++;
  slots_.resize(options.slots);
  shared_head_ = options.shared_head;
  wte_piece_rows_ = options.wte_piece_rows;  // Note [Head gradient in pieces]
  if (!wte_piece_rows_.empty())
    TRIDENT_CHECK(stage_.has_head && wte_piece_rows_.size() >= 2 && wte_piece_rows_.front() == 0 &&
                      wte_piece_rows_.back() == int(Vl) &&
                      std::is_sorted(wte_piece_rows_.begin(), wte_piece_rows_.end()),
                  "wte pieces must be increasing row bounds from 0 to {} on a stage with the head",
                  Vl);
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    while (int(i) >= chunk_slot_base_[size_t(s.chunk) + 1]) ++s.chunk;
    const size_t L = size_t(stage_.chunk_size(s.chunk));  // the chunk's blocks only
    s.encoded = floats(Nr * C);
    s.blocks.resize(sizes.size());
    s.blocks16.resize(sizes.size());
    for (size_t k = 0; k < sizes.size(); ++k) {
      if (!kept[k]) continue;
      const size_t n = (is_mlp_buffer(k) ? size_t(chunk_mlps[size_t(s.chunk)]) : L) * sizes[k];
      if (bf16 && kBf16Buffer[k]) s.blocks16[k] = halves(n);
      else s.blocks[k] = floats(n);
    }
    s.inputs = BackendBuffer<int32_t>(be_, N);
    s.targets = BackendBuffer<int32_t>(be_, N);
    if (head_chunk(s) && (!shared_head_ || i == 0)) {
      if (bf16) s.lnf16 = halves(N * C), s.logits16 = halves(N * Vl);
      else s.lnf = floats(N * C), s.logits = floats(N * Vl);
      s.lnf_mean = floats(Nr);
      s.lnf_rstd = floats(Nr);
      s.losses = floats(N);
    }
  }
  if (stage_.has_head && be_.is_device()) {
    losses_host_.resize(N);
    loss_sum_device_ = BackendBuffer<double>(be_, 1);  // zeroed
  }
  recompute_.resize(sizes.size());
  recompute16_.resize(sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k) {
    const bool full_output = k == 12 && recompute_mode_ == Recompute::kFull;  // recompute_block
    if (kept[k] && !full_output) continue;
    if (bf16 && kBf16Buffer[k]) recompute16_[k] = halves(sizes[k]);
    else recompute_[k] = floats(sizes[k]);
  }
  Scratch& a = *scratch_;
  // Only sequence parallelism uses these: the partial sums before a reduce-scatter (tp alone
  // reduces in place, Note [Reduce in place] in src/model/gpt_tp.cpp), the collectives'
  // staging and the gathered gradient (at GPT-2 1.5B, B 16 × 1024, 100 MB each).
  if (tp_.sequence_parallel) {
    a.full_c = floats(N * C), a.stage = floats(N * C), a.dfull = floats(N * C);
  }
  // Note [Tensor-parallel overlap] (tp_overlap.h); on a device in grouped exchanges on tp's ring
  // communicator (Note [Tensor-parallel ring on a device]).
  if (tps > 1 && tp_.overlap) {
    const bool sp = tp_.sequence_parallel;
    const size_t widest = sp ? std::max({size_t(QKVl), size_t(FCl), size_t(Fl), size_t(Ql)}) : 0;
    tp_overlap_ =
        std::make_unique<TpOverlap>(be_, tp_, int(N), widest, sp ? a.stage.data() : nullptr,
                                    sp ? a.full_c.data() : nullptr, tp_times_);
  }
  a.dresidual = floats(Nr * C);
  if (bf16) {  // the gradients between ops are bf16
    a.dresidual16 = halves(Nr * C);
    a.d16_c = halves(N * C);
    a.d16_3c = halves(N * QKVl);
    a.d16_4c = halves(N * FCl);  // the GELU's input gradient (DGELU in fcproj's GEMM)
    if (cfg.activation != Activation::kGeluTanh) a.d16_act = halves(N * Fl);
    if (tps > 1) {  // Note [bf16 with tp]: the fp32 partial input gradients and their sum
      a.dbuf_c = floats(N * C);
      if (tp_.sequence_parallel) {
        a.ln_out = floats(Nr * C);
        a.ln16_local = halves(Nr * C), a.stage16 = halves(N * C), a.dfull16 = halves(N * C);
        if (tp_overlap_) tp_overlap_->set_stage16(a.stage16.data());  // its bf16 ring
      }
      if (stage_.has_head) a.logits32 = floats(N * Vl);
    }
  } else {
    a.ln_out = floats(Nr * C);
    a.dbuf_c = floats(N * C);
    a.dbuf_c2 = floats(Nr * C);
    a.dbuf_3c = floats(N * QKVl);
    a.dbuf_4c = floats(N * Fl);
    a.dbuf_4c2 = floats(N * FCl);
    if (cfg.parallel_residual) a.dparallel = floats(Nr * C);
  }
  // cp: the delta of the blocks' backward (B·NH·T), the backend's attention being unused.
  a.datt = floats(cp_.size > 1
                      ? N * NHl
                      : std::max(be_.attention_scratch_floats(B, T, int(Ql), int(NHl)), N * NHl));
  if (cp_.size > 1) {
    cp_attention_ = std::make_unique<CpAttention>(be_, cp_, B, T, int(NHl),
                                                  cfg.kv_head_count() / int(tps), cfg.head_size());
    if (table_->wpe != kNoTensor && stage_.has_embedding)  // learned positions: this rank's rows
      a.cp_wpe = floats(size_t(T) * C), a.cp_dwpe = floats(size_t(T) * C);
  }
  if (cfg.rotary_dims() > 0) make_rope_tables();
  make_moe_layers(B, T, options.slots);
  make_widen_buffers(B, T);  // bf16 with cp or a mixture (Note [Widening at the bf16 boundary])
  // Zero now and after every reduction (Note [Sequence-parallel LayerNorm gradients]).
  a.dln_partials = floats((2 * size_t(stage_.num_layers) + 1) * 2 * C);
  be_.fill_zero(a.dln_partials.data(), a.dln_partials.size() * sizeof(float));
  if (stage_.has_head && tps > 1) {
    a.ce_stats = floats(N * 3);
    a.ce_all = floats(tps * N * 3);
  }
}

// In BlockActs order: ln1 ln1_mean ln1_rstd qkv att atty residual2 ln2 ln2_mean ln2_rstd fch
// fch_gelu residual3.
std::array<size_t, GPT::kBlockBuffers> GPT::block_sizes() const {
  const size_t C = cfg_.channels, tps = tp_.size, NHl = cfg_.heads / tps;
  const size_t Ql = NHl * cfg_.head_size(), QKVl = cfg_.qkv_rows() / tps;
  const size_t FCl = cfg_.fc_rows() / tps, Fl = cfg_.hidden() / tps;
  const size_t N = size_t(maxB_) * maxT_, Nr = N / rows_divisor_;
  // cp: the blocks' log-sum-exp, B·NH·T floats (Note [Attention blocks]).
  const size_t att =
      cp_.size > 1 ? N * NHl : be_.attention_saved_floats(maxB_, maxT_, int(Ql), int(NHl));
  return {N * C, Nr, Nr, N * QKVl, att, N * Ql, Nr * C, N * C, Nr, Nr, N * FCl, N * Fl, Nr * C};
}

std::array<bool, GPT::kBlockBuffers> GPT::block_kept() const {
  std::array<bool, kBlockBuffers> k;
  k.fill(recompute_mode_ != Recompute::kFull);
  if (recompute_mode_ == Recompute::kMlp)  // the MLP's hidden rows, fch and fch_gelu
    for (size_t i = 0; i < kBlockBuffers; ++i) k[i] = k[i] && !is_mlp_buffer(i);
  if (recompute_mode_ == Recompute::kFull) k[12] = true;  // residual3: the next block's input
  return k;
}

// Where buffer k of a block is: in the slot, from the chunk's first local layer (fch and
// fch_gelu from its first dense one; none for a mixture), or in the shared recompute buffer.
template <typename Elem>
Elem* GPT::block_buffer(std::vector<BackendBuffer<Elem>>& kept,
                        std::vector<BackendBuffer<Elem>>& dropped, int chunk, int local_layer,
                        size_t k) const {
  if (kept[k].empty()) return dropped[k].data();
  const int place =
      is_mlp_buffer(k) ? mlp_place_[size_t(local_layer)] : local_layer - stage_.chunk_begin(chunk);
  return place < 0 ? nullptr : kept[k].data() + size_t(place) * block_sizes_[k];
}

GPT::BlockActs GPT::block_acts(int slot, int local_layer) {
  Slot& s = slots_[slot];
  float* p[kBlockBuffers];
  for (size_t k = 0; k < kBlockBuffers; ++k)
    p[k] = block_buffer(s.blocks, recompute_, s.chunk, local_layer, k);
  return {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12]};
}

GPT::BlockActs16 GPT::block_acts16(int slot, int local_layer) {
  Slot& s = slots_[slot];
  float* f[kBlockBuffers] = {};
  bfloat16* h[kBlockBuffers] = {};
  for (size_t k = 0; k < kBlockBuffers; ++k) {
    if (kBf16Buffer[k]) h[k] = block_buffer(s.blocks16, recompute16_, s.chunk, local_layer, k);
    else f[k] = block_buffer(s.blocks, recompute_, s.chunk, local_layer, k);
  }
  return {h[0], f[1], f[2], h[3], f[4], h[5], f[6], h[7], f[8], f[9], h[10], h[11], f[12]};
}

void GPT::recompute_block(int slot, int local_layer, const float* residual_in) {
  if (recompute_mode_ == Recompute::kNone) return;
  if (precision_ == Precision::kBf16) {
    recompute_block_bf16(slot, local_layer, residual_in);
    return;
  }
  const Slot& s = slots_[slot];
  const int B = s.B, T = s.T, N = B * T;
  const BlockWeights w = block(layer_weights(local_layer), local_layer);
  BlockActs a = block_acts(slot, local_layer);
  if (recompute_mode_ == Recompute::kMlp) {
    if (moe_[size_t(local_layer)]) return;  // a mixture keeps its own (src/model/moe.h)
    be_.matmul_forward(a.fch, a.ln2, w.fcw, w.fcb, N, cfg_.channels, cfg_.fc_rows() / tp_.size);
    activation_forward(a.fch_gelu, a.fch, N);
    return;
  }
  a.residual3 = recompute_[12].data();  // the kept output is already there; do not rewrite it
  recomputing_ = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{recomputing_};
  block_forward(slot, local_layer, w, a, residual_in, B, T);
}

const float* GPT::stage_output(int slot) const {
  const Slot& s = slots_[slot];
  const int layers = stage_.chunk_size(s.chunk);
  const size_t per_layer = s.blocks[12].size() / std::max(1, layers);
  return s.blocks[12].data() + size_t(layers - 1) * per_layer;
}

size_t GPT::activation_bytes() const {
  size_t floats = 0, halves = 0;  // (inputs and targets: int32, as many bytes as floats)
  for (const Slot& s : slots_) {
    floats += s.encoded.size() + s.lnf.size() + s.lnf_mean.size() + s.lnf_rstd.size() +
              s.logits.size() + s.losses.size() + s.inputs.size() + s.targets.size();
    halves += s.lnf16.size() + s.logits16.size();
    for (const auto& b : s.blocks) floats += b.size();
    for (const auto& b : s.blocks16) halves += b.size();
  }
  for (const auto& b : recompute_) floats += b.size();
  for (const auto& b : recompute16_) halves += b.size();
  const Scratch& a = *scratch_;
  for (const auto* v :
       {&a.full_c,   &a.stage,   &a.ln_out,   &a.dresidual, &a.dfull,     &a.dbuf_c,
        &a.dbuf_c2,  &a.dbuf_3c, &a.dbuf_4c,  &a.dbuf_4c2,  &a.datt,      &a.dln_partials,
        &a.ce_stats, &a.ce_all,  &a.rope_cos, &a.rope_sin,  &a.dparallel, &a.cp_wpe,
        &a.cp_dwpe,  &a.wide_in, &a.wide_out, &a.wide_dout, &a.wide_dinp, &a.logits32})
    floats += v->size();
  for (const auto* v : {&a.dresidual16, &a.d16_c, &a.d16_3c, &a.d16_4c, &a.d16_act, &a.ln16_local,
                        &a.stage16, &a.dfull16})
    halves += v->size();
  const size_t cp_buffers = cp_attention_ ? cp_attention_->buffer_bytes() : 0;
  const size_t tp_buffers = tp_overlap_ ? tp_overlap_->buffer_bytes() : 0;
  size_t moe_buffers = 0;
  for (const auto& m : moe_)
    if (m) moe_buffers += m->bytes();
  if (moe_hf_) moe_buffers += moe_hf_->count_device.size() * sizeof(int32_t);
  moe_buffers += moe_bias_step_device_.size() * sizeof(float);
  return floats * sizeof(float) + halves * sizeof(bfloat16) + cp_buffers + tp_buffers + moe_buffers;
}

// Note [RoPE tables]
// cos and sin of every (position, frequency) are computed once, in fp32 as transformers
// computes them: inv_freq[i] = 1 / base^(2i/rot), angle = t · inv_freq[i], so that the same
// weights give the same rotations as transformers' Llama and GPT-NeoX.
void GPT::make_rope_tables() {
  // With cp the table's rows are this rank's (global) positions (Note [Context parallelism]).
  const int rot = cfg_.rotary_dims(), half = rot / 2;
  const int T = cp_positions_.empty() ? cfg_.max_seq_len : int(cp_positions_.size());
  std::vector<float> cos(size_t(T) * half), sin(cos.size());
  for (int i = 0; i < half; ++i) {
    const float inv_freq = 1.0f / std::pow(cfg_.rope_base, float(2 * i) / float(rot));
    for (int t = 0; t < T; ++t) {
      const int position = cp_positions_.empty() ? t : cp_positions_[size_t(t)];
      const float angle = float(position) * inv_freq;
      cos[size_t(t) * half + i] = std::cos(angle);
      sin[size_t(t) * half + i] = std::sin(angle);
    }
  }
  Scratch& a = *scratch_;
  a.rope_cos = BackendBuffer<float>(be_, cos.size());
  a.rope_sin = BackendBuffer<float>(be_, sin.size());
  be_.copy(a.rope_cos.data(), cos.data(), cos.size() * sizeof(float));
  be_.copy(a.rope_sin.data(), sin.data(), sin.size() * sizeof(float));
}

GPT::~GPT() = default;

float* GPT::stage_input(int slot) { return slots_[size_t(slot)].encoded.data(); }
int GPT::num_slots() const { return int(slots_.size()); }
GPT::Slot& GPT::head(Slot& s) { return shared_head_ ? slots_[0] : s; }
bool GPT::head_chunk(const Slot& s) const {
  return stage_.has_head && s.chunk == stage_.chunks() - 1;
}
bool GPT::embedding_chunk(const Slot& s) const { return stage_.has_embedding && s.chunk == 0; }

}  // namespace trident
