// GPT-2 backward, whole (backward) or split in two for the zero-bubble schedule
// (backward_input, then backward_weight later). The tensor-parallel and sequence-parallel
// plumbing is gpt.cpp's (see its header comment); this file only orders the layer calls.
//
// Note [Split backward]
// backward_input ("B") computes what the previous stage waits for, the input gradients through
// the stage (and the LayerNorm gradients on the way); backward_weight ("W") computes the blocks'
// linear and the embedding's weight gradients later, from output gradients that B keeps in slot
// activations it was the last to read: no memory beyond the slot. W runs the same calls on the
// same values in the same order per parameter, so B then W is backward bit for bit. The bf16
// path keeps its bf16 output gradients: Note [Split backward in bf16] in src/model/gpt_bf16.cpp.
//
// Where B keeps the output gradients (the schedule keeps the slot until W):
//     fcproj's output gradient (this rank's rows)  → residual3 (the block's output)
//     fc's output gradient                         → fch (the pre-GELU activation)
//     attproj's output gradient (this rank's rows) → residual2
//     qkv's output gradient                        → qkv
//     the embedding's output gradient              → encoded (the stage input)
// The LM head's dwte stays in B: its input, dlogits, is the largest buffer of all (B·T·V), and
// computing dwte at once lets the last stage keep one set of head buffers (final LayerNorm,
// logits, losses) for all its slots (GPTOptions::shared_head), where ZB-H1 gives it p slots. On
// a stage with both ends (pp 1) wte's two contributions still come in backward's order: the
// head's in B(i), the embedding's in W(i), and W(i) precedes B(i + 1) there. With sequence
// parallelism W gathers the kept rows to all N again (an all-gather per row-parallel layer, in
// the same order on every tp rank). Gradient-ready events come from W (test_pp_training checks
// zb-h1 against 1f1b). Recomputation is refused: what it drops, W would need again.
//
// Note [Mixtures in B]
// A mixture layer computes all its gradients (router, experts, shared experts) in B, as the
// whole backward does; W only reports them ready, in the list's order, before ln2's. Deferring
// the experts' to W would keep, per slot (zb-h1 keeps p on every stage), the permuted rows, the
// experts' hidden activations and the all-to-all's returned output gradients, which live in the
// backward scratch that every mixture layer shares (Note [Mixture memory]). The same calls in the
// same micro-batch order, so zb-h1 still equals 1f1b bit for bit; with tp B's last micro-batch
// sums the span (Note [Mixtures and tp]) before W reports it.
#include <algorithm>
#include <utility>

#include "model/gpt_phase.h"
#include "model/gpt_state.h"
#include "model/ready_walk.h"
#include "model/tp_overlap.h"
#include "trident/check.h"
#include "trident/model.h"

namespace trident {

// A chunk's parameters are a run of the ready list (gpt_param_layout): from the head's (last
// chunk) or its last block's first, through its first block's last (or the list's end on chunk
// 0, which ends it: the embedding's).
int GPT::first_ready(const Slot& s) const {
  const int end = stage_.chunk_begin(s.chunk) + stage_.chunk_size(s.chunk);
  return head_chunk(s) || end == 0 ? 0 : table_->layers[size_t(end) - 1].uses.front();
}

int GPT::last_ready(const Slot& s) const {
  if (s.chunk == 0) return int(infos_.size()) - 1;
  return table_->layers[size_t(stage_.chunk_begin(s.chunk))].ready_ln1;
}

// A row-parallel linear's input gradient dinp [N, K] = dout · w from this rank's rows of its
// output gradient; returns that gradient on all N rows (gathered into dfull with sequence
// parallelism, chunk by chunk beside the GEMM where the collectives overlap).
const float* GPT::row_backward(float* dinp, const float* dlocal, const float* w, int B, int T,
                               int K) {
  const int C = cfg_.channels;
  float* full = scratch_->dfull.data();
  if (tp_overlap_ && tp_.sequence_parallel) {
    tp_overlap_->gather_matmul(dinp, full, dlocal, {w, nullptr, K, true}, B, T, C);
    return full;
  }
  const float* dout = dlocal;
  if (rows_divisor_ > 1) {
    gather_rows(full, dlocal, B, T, C);
    dout = full;
  }
  be_.matmul_backward(dinp, nullptr, nullptr, dout, nullptr, w, B * T, K, C);
  return dout;
}

// A column-parallel linear's backward: dinp [N, C] (partial over tp), then its sum over tp
// started (finish_norm_gathered_backward waits); dw and db (+=, null: skipped) before the sum
// starts, or while it travels where the collectives overlap (Megatron's bulk overlap).
Work GPT::column_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, int B, int T, int OC) {
  const int C = cfg_.channels, N = B * T;
  if (!tp_overlap_) {
    be_.matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC);
    return start_norm_gathered_backward(dinp, B, T, C);
  }
  be_.matmul_backward(dinp, nullptr, nullptr, dout, inp, w, N, C, OC);
  Work sum = start_norm_gathered_backward(dinp, B, T, C);
  if (dw || db) be_.matmul_backward(nullptr, dw, db, dout, inp, w, N, C, OC);
  return sum;
}

void GPT::backward(int slot, float dloss_scale, const float* dstage_output, float* dstage_input,
                   const GradReadyFn& on_ready, const EmbeddingRowSink* sink,
                   bool last_micro_batch) {
  moe_begin_backward(slot);
  if (precision_ == Precision::kBf16) {  // at every tp (Note [bf16 with tp])
    backward_bf16(BackwardPart::kWhole, slot, dloss_scale, dstage_output, dstage_input, on_ready,
                  sink, last_micro_batch);
    return;
  }
  backward_pass(BackwardPart::kWhole, slot, dloss_scale, dstage_output, dstage_input, on_ready,
                sink, last_micro_batch);
}

void GPT::backward_input(int slot, float dloss_scale, const float* dstage_output,
                         float* dstage_input, bool last_micro_batch) {
  TRIDENT_CHECK(recompute_mode_ == Recompute::kNone,
                "a split backward with recomputation (Note [Split backward])");
  moe_begin_backward(slot);
  if (precision_ == Precision::kBf16) {  // Note [Split backward in bf16]
    backward_bf16(BackwardPart::kInput, slot, dloss_scale, dstage_output, dstage_input, {}, nullptr,
                  last_micro_batch);
    return;
  }
  backward_pass(BackwardPart::kInput, slot, dloss_scale, dstage_output, dstage_input, {}, nullptr,
                last_micro_batch);
}

void GPT::backward_pass(BackwardPart part, int slot, float dloss_scale, const float* dstage_output,
                        float* dstage_input, const GradReadyFn& on_ready,
                        const EmbeddingRowSink* sink, bool last_micro_batch) {
  Slot& s = slots_[slot];
  const int B = s.B, T = s.T, N = B * T, Nr = N / rows_divisor_;
  const int C = cfg_.channels, tps = tp_.size, hs = cfg_.head_size();
  const int NHl = cfg_.heads / tps, Vl = cfg_.padded_vocab / tps;
  const int Ql = NHl * hs, QKVl = cfg_.qkv_rows() / tps;
  const int FCl = cfg_.fc_rows() / tps, Fl = cfg_.hidden() / tps;
  const bool tied = cfg_.tied_head, parallel = cfg_.parallel_residual;
  Scratch& a = *scratch_;
  // The whole backward computes weight gradients as it goes; B leaves them to W and keeps
  // the output gradients instead (Note [Split backward]).
  const bool weights = part == BackwardPart::kWhole;
  const bool keep = part == BackwardPart::kInput;
  auto keep_copy = [&](float* dst, const float* src, size_t n) {
    if (keep) be_.copy(dst, src, n * sizeof(float));
  };
  auto grad = [&](float* g) { return weights ? g : nullptr; };
  // Parameters are listed in ready order, so "ready" walks the list front to back, through
  // the indices of the parameter table (Note [Parameter table]). A tied wte is reported on its
  // own: right after the LM head when that is its only contribution on this stage (or the
  // sparse part goes to a sink), else after the embedding.
  const bool wte_after_head = tied && stage_.has_head && (!stage_.has_embedding || sink);
  // The slot's chunk (StageSpec): its blocks, and its run of the ready list.
  const int begin = stage_.chunk_begin(s.chunk), end = begin + stage_.chunk_size(s.chunk);
  const bool has_head = head_chunk(s), has_embedding = embedding_chunk(s);
  ReadyWalk ready(on_ready, first_ready(s), table_->tied_wte_index,
                  std::max(1, int(wte_piece_rows_.size()) - 1));
  // The gradient w.r.t. the residual stream on all N rows (gathered with sequence parallelism).
  auto dresidual_all_rows = [&]() -> const float* {
    if (rows_divisor_ == 1) return a.dresidual.data();
    gather_rows(a.dfull.data(), a.dresidual.data(), B, T, C);
    return a.dfull.data();
  };

  const int L = stage_.num_layers;  // norm partial sums: 2 per local block, then lnf's
  const float* last_residual = end > begin ? block_acts(slot, end - 1).residual3 : s.encoded.data();
  if (has_head) {
    TRIDENT_CHECK(s.has_targets, "backward() needs a forward() with targets first");
    if (param_use_) param_use_(ParamPass::kBackward, table_->head_uses);
    Phase ph(be_, phases_, table_->backward_head);
    // Mean over the N tokens of this micro-batch, times the caller's scale (1/accum).
    crossentropy_backward(s, s.targets.data(), dloss_scale / float(N), N);
    // The head's weight gradient first, so that when it is final it can be reduced while the
    // head's input gradient (the rest of backward's critical path) is computed. B computes it
    // too: the logits buffer may be shared by all slots (Note [Split backward]).
    Slot& h = head(s);
    if (wte_after_head && !wte_piece_rows_.empty()) {
      // The same GEMM, a slice of its rows at a time, each reported (and so reduced) as soon
      // as it is computed (Note [Head gradient in pieces]).
      for (size_t k = 0; k + 1 < wte_piece_rows_.size(); ++k) {
        const int r0 = wte_piece_rows_[k], rows = wte_piece_rows_[k + 1] - r0;
        float* dwte_rows = wte_grads() + table_->wte + size_t(r0) * C;
        be_.matmul_backward_weight_rows(dwte_rows, h.logits.data() + r0, Vl, h.lnf.data(), N, C,
                                        rows);
        ready.wte_piece(int(k));
      }
    } else if (wte_after_head || !tied) {
      be_.matmul_backward(nullptr, head_w_grads() + table_->head_w, nullptr, h.logits.data(),
                          h.lnf.data(), head_w_weights() + table_->head_w, N, C, Vl);
      if (tied) ready.wte();
      else ready.through(table_->head_w_index);
    }
    // The head's input gradient. Where a tied wte is not reported here (final only after the
    // embedding), the same call computes its dW: one GEMM call, so a device casts the [N, V]
    // logit gradient to bf16 once rather than twice (the same GEMMs, the same bits).
    const bool dw_here = tied && !wte_after_head;
    be_.matmul_backward(a.dbuf_c.data(), dw_here ? wte_grads() + table_->wte : nullptr, nullptr,
                        h.logits.data(), h.lnf.data(), head_w_weights() + table_->head_w, N, C, Vl);
    float* H = head_grads();
    norm_gathered_backward(a.dresidual.data(), H + table_->lnfw, at(H, table_->lnfb),
                           a.dbuf_c.data(), last_residual, head_weights() + table_->lnfw,
                           h.lnf_mean.data(), h.lnf_rstd.data(), B, T, C, 2 * L, last_micro_batch);
    ready.through(table_->head_last_index);
  } else {
    TRIDENT_CHECK(dstage_output != nullptr, "a stage before the last needs its output gradient");
    be_.copy(a.dresidual.data(), dstage_output, size_t(Nr) * C * sizeof(float));
  }

  for (int i = end - 1; i >= begin; --i) {
    progress();
    const LayerTable& lt = table_->layers[size_t(i)];
    if (param_use_) param_use_(ParamPass::kBackward, lt.uses);  // before the recomputation
    Phase ph(be_, phases_, lt.backward_phase);
    const float* residual_in = i == begin ? s.encoded.data() : block_acts(slot, i - 1).residual3;
    recompute_block(slot, i, residual_in);
    const BlockActs act = block_acts(slot, i);
    const BlockWeights w = block(layer_weights(i), i);
    const BlockWeights dw = block(layer_grads(i), i);
    float* dres = a.dresidual.data();  // gradient w.r.t. this block's output (this rank's rows)

    const float* dout = dres;  // a mixture: this rank's rows
    Work dln2_sum;             // the MLP input gradient's sum over tp (column_backward)
    // A mixture computes its weight gradients here, in B too (Note [Mixtures in B]).
    if (lt.moe) {
      moe_backward(slot, i, a.dbuf_c.data(), dout, act.ln2, Nr, dloss_scale, last_micro_batch);
      ready.through(lt.ready_moe);
    } else {
      keep_copy(act.residual3, dres, size_t(Nr) * C);
      dout = row_backward(a.dbuf_4c.data(), dres, w.fcprojw, B, T, Fl);
      if (weights)
        be_.matmul_backward(nullptr, dw.fcprojw, dw.fcprojb, dout, act.fch_gelu, w.fcprojw, N, Fl,
                            C);
      ready.through(lt.ready_fcproj);
      activation_backward(a.dbuf_4c2.data(), act.fch, a.dbuf_4c.data(), N);
      keep_copy(act.fch, a.dbuf_4c2.data(), size_t(N) * FCl);
      dln2_sum = column_backward(a.dbuf_c.data(), grad(dw.fcw), grad(dw.fcb), a.dbuf_4c2.data(),
                                 act.ln2, w.fcw, B, T, FCl);
      ready.through(lt.ready_fc);
    }
    // Sequential: the MLP read residual2, whose gradient gets the MLP input's. Parallel: it
    // read the block's input, whose gradient collects it at the end (dparallel); residual2's
    // gradient is the block output's, already gathered in dout.
    if (lt.moe)  // its input gradient is on this rank's rows already (Note [Mixtures and tp])
      norm_local_backward(parallel ? a.dparallel.data() : a.dbuf_c2.data(), dw.ln2w, dw.ln2b,
                          a.dbuf_c.data(), parallel ? residual_in : act.residual2, w.ln2w,
                          act.ln2_mean, act.ln2_rstd, Nr, C, 2 * i + 1, last_micro_batch);
    else
      finish_norm_gathered_backward(
          std::move(dln2_sum), parallel ? a.dparallel.data() : a.dbuf_c2.data(), dw.ln2w, dw.ln2b,
          a.dbuf_c.data(), parallel ? residual_in : act.residual2, w.ln2w, act.ln2_mean,
          act.ln2_rstd, B, T, C, 2 * i + 1, last_micro_batch);
    ready.through(lt.ready_ln2);
    // attproj's output gradient is residual2's: sequential, the block output's plus the MLP
    // input's (gathered on the way); parallel, the block output's (a dense MLP gathered it).
    if (!parallel) {
      be_.add(dres, dres, a.dbuf_c2.data(), size_t(Nr) * C);  // now w.r.t. residual2
      keep_copy(act.residual2, dres, size_t(Nr) * C);
      dout = row_backward(a.dbuf_c.data(), dres, w.attprojw, B, T, Ql);
    } else {
      keep_copy(act.residual2, dres, size_t(Nr) * C);
      if (lt.moe) dout = dresidual_all_rows();
      be_.matmul_backward(a.dbuf_c.data(), nullptr, nullptr, dout, act.atty, w.attprojw, N, Ql, C);
    }
    if (weights)
      be_.matmul_backward(nullptr, dw.attprojw, dw.attprojb, dout, act.atty, w.attprojw, N, Ql, C);
    ready.through(lt.ready_attproj);
    attention_backward(a.dbuf_3c.data(), a.dbuf_c.data(), act.qkv, act.atty, act.att, B, T);
    rope(a.dbuf_3c.data(), N, T, true);
    keep_copy(act.qkv, a.dbuf_3c.data(), size_t(N) * QKVl);
    Work dln1_sum = column_backward(a.dbuf_c.data(), grad(dw.qkvw), grad(dw.qkvb), a.dbuf_3c.data(),
                                    act.ln1, w.qkvw, B, T, QKVl);
    ready.through(lt.ready_qkv);
    finish_norm_gathered_backward(std::move(dln1_sum), a.dbuf_c2.data(), dw.ln1w, dw.ln1b,
                                  a.dbuf_c.data(), residual_in, w.ln1w, act.ln1_mean, act.ln1_rstd,
                                  B, T, C, 2 * i, last_micro_batch);
    ready.through(lt.ready_ln1);
    be_.add(dres, dres, a.dbuf_c2.data(), size_t(Nr) * C);  // now w.r.t. the block's input
    if (parallel) be_.add(dres, dres, a.dparallel.data(), size_t(Nr) * C);
  }
  if (!has_embedding) {
    TRIDENT_CHECK(dstage_input != nullptr,
                  "a stage after the first must return its input gradient");
    be_.copy(dstage_input, a.dresidual.data(), size_t(Nr) * C * sizeof(float));
    ready.through(last_ready(s));  // the rest of this chunk's run of the list
    return;
  }
  keep_copy(s.encoded.data(), a.dresidual.data(), size_t(Nr) * C);
  if (!weights) return;
  // The token embedding's gradient comes last (a tied wte's second, sparse contribution:
  // Note [Tied embedding gradient]): into the sink's compact rows, or into wte's gradient.
  Phase ph(be_, phases_, table_->backward_embedding);
  embedding_backward(dresidual_all_rows(), s.inputs.data(), sink, B, T);
  ready.through(table_->embedding_last_index);
  if (tied && !wte_after_head) ready.wte();
}

void GPT::backward_weight(int slot, const GradReadyFn& on_ready, const EmbeddingRowSink* sink) {
  Slot& s = slots_[slot];
  const bool tied = cfg_.tied_head;
  // As in backward_pass: the same ready order, and a tied wte reported on its own.
  const bool wte_after_head = tied && stage_.has_head && (!stage_.has_embedding || sink);
  const int begin = stage_.chunk_begin(s.chunk), end = begin + stage_.chunk_size(s.chunk);
  const bool has_head = head_chunk(s), has_embedding = embedding_chunk(s);
  ReadyWalk ready(on_ready, first_ready(s), table_->tied_wte_index,
                  std::max(1, int(wte_piece_rows_.size()) - 1));

  if (has_head) {  // the head's gradients are final since B
    if (wte_after_head) ready.wte();
    ready.through(table_->head_last_index);
  }
  for (int i = end - 1; i >= begin; --i) {
    progress();
    const LayerTable& lt = table_->layers[size_t(i)];
    Phase ph(be_, phases_, lt.weight_phase);
    if (!lt.moe) {  // a mixture's gradients were final after B (Note [Mixtures in B])
      weight_gemm(slot, i, WeightGemm::kFcproj);
      ready.through(lt.ready_fcproj);
      weight_gemm(slot, i, WeightGemm::kFc);
    }
    ready.through(lt.ready_ln2);  // ln2's gradients were final after B
    weight_gemm(slot, i, WeightGemm::kAttproj);
    ready.through(lt.ready_attproj);
    weight_gemm(slot, i, WeightGemm::kQkv);
    ready.through(lt.ready_ln1);
  }
  if (!has_embedding) {
    ready.through(last_ready(s));
    return;
  }
  Phase ph(be_, phases_, table_->weight_embedding);
  embedding_backward(kept_rows(s.encoded.data(), s.B, s.T), s.inputs.data(), sink, s.B, s.T);
  ready.through(table_->embedding_last_index);
  if (tied && !wte_after_head) ready.wte();
}

// A kept output gradient of this rank's rows, on all N rows (Note [Split backward]).
const float* GPT::kept_rows(const float* local, int B, int T) {
  if (rows_divisor_ == 1) return local;
  gather_rows(scratch_->dfull.data(), local, B, T, cfg_.channels);
  return scratch_->dfull.data();
}

void GPT::weight_gemm(int slot, int local_layer, WeightGemm which) {
  if (precision_ == Precision::kBf16) {
    weight_gemm_bf16(slot, local_layer, which);
    return;
  }
  const Slot& s = slots_[slot];
  const int B = s.B, T = s.T, N = B * T;
  const int C = cfg_.channels, tps = tp_.size;
  const BlockActs act = block_acts(slot, local_layer);
  const BlockWeights dw = block(layer_grads(local_layer), local_layer);  // Note [ZeRO-3 and W]
  switch (which) {
    case WeightGemm::kFcproj:
      be_.matmul_backward(nullptr, dw.fcprojw, dw.fcprojb, kept_rows(act.residual3, B, T),
                          act.fch_gelu, nullptr, N, cfg_.hidden() / tps, C);
      return;
    case WeightGemm::kFc:
      be_.matmul_backward(nullptr, dw.fcw, dw.fcb, act.fch, act.ln2, nullptr, N, C,
                          cfg_.fc_rows() / tps);
      return;
    case WeightGemm::kAttproj:
      be_.matmul_backward(nullptr, dw.attprojw, dw.attprojb, kept_rows(act.residual2, B, T),
                          act.atty, nullptr, N, cfg_.heads / tps * cfg_.head_size(), C);
      return;
    case WeightGemm::kQkv:
      be_.matmul_backward(nullptr, dw.qkvw, dw.qkvb, act.qkv, act.ln1, nullptr, N, C,
                          cfg_.qkv_rows() / tps);
      return;
  }
}

}  // namespace trident
