// The bf16 path with tensor parallelism (tp > 1), with and without sequence parallelism: the
// ops of gpt_bf16.cpp on this rank's heads and hidden slice, with the tp collectives of
// gpt_tp.cpp between them. A file of its own because the collectives sit between ops that the
// tp = 1 path fuses (the residual add into the row-parallel GEMM, the loss into the head).
//
// Note [bf16 with tp]
// What a GEMM reads is bf16; what is summed over tp is fp32, summed before its one rounding.
// Forward: with SP the norm's bf16 output is all-gathered in bf16; a row-parallel GEMM writes
// an fp32 partial (bias on tp rank 0), all-reduced (SP: reduce-scattered), then added to the
// residual. Backward: a column-parallel input gradient is an fp32 partial, reduced, then rounded
// for the norm's bf16 backward; with SP the row-parallel GEMMs' bf16 dout is gathered in bf16.
// Head: fp32 logits of this rank's vocabulary in one [N, V/tp] scratch for all slots (4 B a
// logit beyond tp 1's path) feed the fp32 vocab-parallel loss; its gradient is rounded once.
//
// parallel.tp_overlap chunks these collectives as in fp32:
// Note [Tensor-parallel overlap in bf16] in tp_overlap.h.
#include <algorithm>

#include "model/gpt_phase.h"
#include "model/gpt_state.h"
#include "model/ready_walk.h"
#include "trident/check.h"
#include "trident/model.h"

namespace trident {

// As gather_rows (Note [Sequence-parallel rows]), on bf16 rows through stage16.
void GPT::gather_rows_bf16(bfloat16* full, const bfloat16* local, int B, int T, int C) {
  bfloat16* stage = scratch_->stage16.data();
  tp_wait(tp_.comm->all_gather(local, stage, size_t(B) * (T / tp_.size) * C));
  place_gathered_rows(full, stage, size_t(C) * sizeof(bfloat16), B, T);
}

// The norm of this rank's rows of inp, out_full on all N rows (gathered with SP).
void GPT::norm_gathered_bf16(bfloat16* out_full, float* mean, float* rstd, const float* inp,
                             const float* w, const float* b, int B, int T) {
  const int C = cfg_.channels, N = B * T;
  if (!tp_.sequence_parallel) {
    norm_forward_bf16(out_full, mean, rstd, inp, w, b, N, C);
    return;
  }
  bfloat16* local = scratch_->ln16_local.data();
  norm_forward_bf16(local, mean, rstd, inp, w, b, N / tp_.size, C);
  gather_rows_bf16(out_full, local, B, T, C);
}

// Backward of norm_gathered_bf16 from dout_partial [N, C], this rank's fp32 partial sum: reduced
// over tp (to this rank's rows with SP), rounded once, then the norm's backward adds into dres
// (and writes dres16 when non-null). With SP the norm's weight gradients are partial too
// (Note [Sequence-parallel LayerNorm gradients]): `ln` is its partial buffer, `reduce` the
// step's last micro-batch.
void GPT::norm_gathered_backward_bf16(Work sum, float* dres, bfloat16* dres16, float* dw, float* db,
                                      float* dout_partial, const float* inp, const float* w,
                                      const float* mean, const float* rstd, int B, int T, int ln,
                                      bool reduce) {
  const int C = cfg_.channels, Nr = B * T / rows_divisor_;
  Scratch& a = *scratch_;
  float* dout = tp_.sequence_parallel ? a.ln_out.data() : dout_partial;
  finish_reduce_rows(std::move(sum), dout, dout_partial, B, T, C);
  bfloat16* dout16 = a.d16_c.data();
  be_.cast_to_bf16(dout16, dout, size_t(Nr) * C);
  norm_local_backward_bf16(dres, dres16, dw, db, dout16, inp, w, mean, rstd, Nr, ln, reduce);
}

void GPT::norm_local_backward_bf16(float* dres, bfloat16* dres16, float* dw, float* db,
                                   const bfloat16* dout16, const float* inp, const float* w,
                                   const float* mean, const float* rstd, int Nr, int ln,
                                   bool reduce) {
  const int C = cfg_.channels;
  if (!tp_.sequence_parallel) {  // every rank normalised all rows: dw, db are already whole
    norm_backward_add_bf16(dres, dres16, dw, db, dout16, inp, w, mean, rstd, Nr, C);
    return;
  }
  float* partial = scratch_->dln_partials.data() + size_t(ln) * 2 * C;
  norm_backward_add_bf16(dres, dres16, partial, db ? partial + C : nullptr, dout16, inp, w, mean,
                         rstd, Nr, C);
  if (!reduce) return;
  tp_wait(tp_.comm->all_reduce(partial, 2 * size_t(C)));
  be_.add(dw, dw, partial, size_t(C));
  if (db) be_.add(db, db, partial + C, size_t(C));
  be_.fill_zero(partial, 2 * size_t(C) * sizeof(float));
}

void GPT::block_forward_bf16_tp(int slot, int local_layer, const BlockWeights& w,
                                const BlockWeights16& w16, const BlockActs16& a,
                                const float* residual_in, int B, int T) {
  const int C = cfg_.channels, tps = tp_.size, hs = cfg_.head_size();
  const int NHl = cfg_.heads / tps, Ql = NHl * hs;
  const int QKVl = cfg_.qkv_rows() / tps, Fl = cfg_.hidden() / tps;
  const int N = B * T, Nr = N / rows_divisor_;
  // The row-parallel partial sums: in place without SP (Note [Reduce in place]).
  float* attn_partial = tp_.sequence_parallel ? scratch_->full_c.data() : a.residual2;
  float* mlp_partial = tp_.sequence_parallel ? scratch_->full_c.data() : a.residual3;
  const bool add_row_bias = tp_.rank == 0;
  norm_matmul_bf16(a.qkv, a.ln1, a.ln1_mean, a.ln1_rstd, residual_in, w.ln1w, w.ln1b, w16.qkvw,
                   w.qkvb, B, T, QKVl);
  rope_bf16(a.qkv, N, T, false);
  block_attention_forward_bf16(a, B, T);  // by blocks with cp (Note [Widening under tp])
  matmul_reduce_bf16(a.residual2, attn_partial, a.atty, w16.attprojw,
                     add_row_bias ? w.attprojb : nullptr, B, T, Ql);
  be_.add(a.residual2, a.residual2, residual_in, size_t(Nr) * C);
  const float* mlp_in = cfg_.parallel_residual ? residual_in : a.residual2;
  if (moe_[size_t(local_layer)]) {  // this rank's rows (Note [Widening under tp])
    moe_block_forward_bf16_tp(slot, local_layer, w, a, mlp_in, Nr);
    return;
  }
  mlp_up_forward_bf16_tp(w, w16, a, mlp_in, B, T);
  matmul_reduce_bf16(a.residual3, mlp_partial, a.fch_gelu, w16.fcprojw,
                     add_row_bias ? w.fcprojb : nullptr, B, T, Fl);
  be_.add(a.residual3, a.residual3, a.residual2, size_t(Nr) * C);
}

float GPT::head_forward_bf16_tp(Slot& s, const float* residual, const int32_t* targets, int B,
                                int T) {
  const int C = cfg_.channels, V = cfg_.vocab, tps = tp_.size, Vl = cfg_.padded_vocab / tps;
  const int N = B * T;
  float* P = head_weights();
  Slot& h = head(s);
  cast_weights(table_->layers.size(), table_->head_w, table_->head_w + size_t(Vl) * C);
  norm_gathered_bf16(h.lnf16.data(), h.lnf_mean.data(), h.lnf_rstd.data(), residual,
                     P + table_->lnfw, at(P, table_->lnfb), B, T);
  float* logits = scratch_->logits32.data();
  be_.matmul_forward_add_bf16(logits, nullptr, h.lnf16.data(), head_w16(), nullptr, N, C, Vl);
  s.has_targets = targets != nullptr;
  if (!targets) return 0.0f;
  be_.copy(s.targets.data(), targets, size_t(N) * sizeof(int32_t));
  s.dloss = dloss_scale_ / float(N);  // backward's seed, applied here as on tp 1's path
  // The vocab-parallel loss (gpt_vocab_parallel.cpp), then its logit gradient, rounded once.
  const int v0 = vocab_begin(), live = std::max(0, std::min(Vl, V - v0));
  float* mine = scratch_->ce_stats.data();
  float* all = scratch_->ce_all.data();
  be_.crossentropy_slice_stats(mine, logits, s.targets.data(), v0, live, N, Vl);
  tp_wait(tp_.comm->all_gather(mine, all, size_t(N) * 3));
  be_.crossentropy_slice_combine(h.losses.data(), logits, all, tps, live, N, Vl);
  be_.crossentropy_slice_backward(logits, s.targets.data(), s.dloss, v0, N, Vl);
  be_.cast_to_bf16(h.logits16.data(), logits, size_t(N) * Vl);
  return mean_loss(s, N);
}

// As backward_bf16, on this rank's shards, with the collectives of Note [bf16 with tp].
void GPT::backward_bf16_tp(int slot, float dloss_scale, const float* dstage_output,
                           float* dstage_input, const GradReadyFn& on_ready,
                           const EmbeddingRowSink* sink, bool last_micro_batch) {
  Slot& s = slots_[slot];
  const int B = s.B, T = s.T, N = B * T, Nr = N / rows_divisor_;
  const int C = cfg_.channels, tps = tp_.size, hs = cfg_.head_size();
  const int NHl = cfg_.heads / tps, Ql = NHl * hs;
  const int QKVl = cfg_.qkv_rows() / tps, FCl = cfg_.fc_rows() / tps, Fl = cfg_.hidden() / tps;
  const int Vl = cfg_.padded_vocab / tps;
  const bool tied = cfg_.tied_head, parallel = cfg_.parallel_residual;
  const bool gelu_in_gemm = cfg_.activation == Activation::kGeluTanh;
  Scratch& a = *scratch_;
  float* dres = a.dresidual.data();         // w.r.t. the current block's output, this rank's rows
  bfloat16* dres16 = a.dresidual16.data();  // its bf16 copy
  float* dpartial = a.dbuf_c.data();        // a column-parallel input gradient, partial over tp
  const bool wte_after_head = tied && stage_.has_head && (!stage_.has_embedding || sink);
  const int begin = stage_.chunk_begin(s.chunk), end = begin + stage_.chunk_size(s.chunk);
  const bool has_head = head_chunk(s), has_embedding = embedding_chunk(s);
  ReadyWalk ready(on_ready, first_ready(s), table_->tied_wte_index, 1);
  const int L = stage_.num_layers;  // norm partial sums: 2 per local block, then lnf's

  const float* last_residual =
      end > begin ? block_acts16(slot, end - 1).residual3 : s.encoded.data();
  if (has_head) {
    TRIDENT_CHECK(s.has_targets, "backward() needs a forward() with targets first");
    TRIDENT_CHECK(dloss_scale / float(N) == s.dloss,
                  "bf16: backward's dloss_scale {} is not the {} forward applied "
                  "(GPT::set_dloss_scale before forward)",
                  dloss_scale, s.dloss * float(N));
    if (param_use_) param_use_(ParamPass::kBackward, table_->head_uses);
    Phase ph(be_, phases_, table_->backward_head);
    Slot& h = head(s);
    float* P = head_weights();
    const bfloat16* head_w16 = this->head_w16();
    const bfloat16* dlogits = h.logits16.data();
    if (wte_after_head || !tied) {
      be_.matmul_backward_bf16(nullptr, head_w_grads() + table_->head_w, nullptr, dlogits,
                               h.lnf16.data(), head_w16, N, C, Vl);
      if (tied) ready.wte();
      else ready.through(table_->head_w_index);
    } else {  // a tied wte the embedding adds to later
      be_.matmul_backward_bf16(nullptr, wte_grads() + table_->wte, nullptr, dlogits, h.lnf16.data(),
                               head_w16, N, C, Vl);
    }
    be_.matmul_backward_input_fp32_bf16(dpartial, dlogits, head_w16, N, C, Vl);
    be_.fill_zero(dres, size_t(Nr) * C * sizeof(float));
    float* H = head_grads();
    norm_gathered_backward_bf16(start_norm_gathered_backward(dpartial, B, T, C), dres, dres16,
                                H + table_->lnfw, at(H, table_->lnfb), dpartial, last_residual,
                                P + table_->lnfw, h.lnf_mean.data(), h.lnf_rstd.data(), B, T, 2 * L,
                                last_micro_batch);
    ready.through(table_->head_last_index);
  } else {
    TRIDENT_CHECK(dstage_output != nullptr, "a stage before the last needs its output gradient");
    be_.copy(dres, dstage_output, size_t(Nr) * C * sizeof(float));
    be_.cast_to_bf16(dres16, dres, size_t(Nr) * C);
  }

  for (int i = end - 1; i >= begin; --i) {
    progress();
    const LayerTable& lt = table_->layers[size_t(i)];
    if (param_use_) param_use_(ParamPass::kBackward, lt.uses);  // before the recomputation
    Phase ph(be_, phases_, lt.backward_phase);
    const float* residual_in = i == begin ? s.encoded.data() : block_acts16(slot, i - 1).residual3;
    recompute_block(slot, i, residual_in);
    const BlockActs16 act = block_acts16(slot, i);
    const BlockWeights w = block(layer_weights(i), i);
    const BlockWeights16 w16 = block16(i);
    const BlockWeights dw = block(layer_grads(i), i);

    const bfloat16* dout = nullptr;  // the block output's gradient, all N rows
    if (lt.moe) {  // this rank's rows, from the fp32 dres (Note [Widening under tp])
      moe_block_backward_bf16_tp(slot, i, dres, parallel ? nullptr : dres16, w, dw, act,
                                 parallel ? residual_in : act.residual2, Nr, dloss_scale,
                                 last_micro_batch);
      ready.through(lt.ready_moe);
    } else {
      // The block output's gradient on all N rows (gathered in bf16 with SP), and fcproj's
      // input gradient (through the GELU in the GEMM, as on tp 1's path).
      dout = row_backward_bf16(gelu_in_gemm ? a.d16_4c.data() : a.d16_act.data(),
                               gelu_in_gemm ? dw.fcb : nullptr, dres16, w16.fcprojw,
                               gelu_in_gemm ? act.fch : nullptr, B, T, Fl);
      be_.matmul_backward_bf16(nullptr, dw.fcprojw, dw.fcprojb, dout, act.fch_gelu, nullptr, N, Fl,
                               C);
      ready.through(lt.ready_fcproj);
      if (!gelu_in_gemm) {
        if (cfg_.activation == Activation::kSwiGLU)
          be_.swiglu_backward_bf16(a.d16_4c.data(), act.fch, a.d16_act.data(), N, Fl);
        else be_.gelu_erf_backward_bf16(a.d16_4c.data(), act.fch, a.d16_act.data(), size_t(N) * Fl);
      }
      Work sum = column_backward_bf16(dpartial, dw.fcw, gelu_in_gemm ? nullptr : dw.fcb,
                                      a.d16_4c.data(), act.ln2, w16.fcw, B, T, FCl);
      ready.through(lt.ready_fc);
      // As on tp 1's path: sequential, dres and dres16 become residual2's; parallel, dres
      // collects the block input's and `dout` stays the block output's, which attproj needs.
      norm_gathered_backward_bf16(std::move(sum), dres, parallel ? nullptr : dres16, dw.ln2w,
                                  dw.ln2b, dpartial, parallel ? residual_in : act.residual2, w.ln2w,
                                  act.ln2_mean, act.ln2_rstd, B, T, 2 * i + 1, last_micro_batch);
    }
    ready.through(lt.ready_ln2);

    if (parallel && !lt.moe) {
      be_.matmul_backward_bf16(a.d16_c.data(), dw.attprojw, dw.attprojb, dout, act.atty,
                               w16.attprojw, N, Ql, C);
    } else {
      dout = row_backward_bf16(a.d16_c.data(), nullptr, dres16, w16.attprojw, nullptr, B, T, Ql);
      be_.matmul_backward_bf16(nullptr, dw.attprojw, dw.attprojb, dout, act.atty, nullptr, N, Ql,
                               C);
    }
    ready.through(lt.ready_attproj);
    block_attention_backward_bf16(a.d16_3c.data(), a.d16_c.data(), act, B, T);
    rope_bf16(a.d16_3c.data(), N, T, true);
    Work sum = column_backward_bf16(dpartial, dw.qkvw, dw.qkvb, a.d16_3c.data(), act.ln1, w16.qkvw,
                                    B, T, QKVl);
    ready.through(lt.ready_qkv);
    norm_gathered_backward_bf16(std::move(sum), dres, i > begin ? dres16 : nullptr, dw.ln1w,
                                dw.ln1b, dpartial, residual_in, w.ln1w, act.ln1_mean, act.ln1_rstd,
                                B, T, 2 * i, last_micro_batch);
    ready.through(lt.ready_ln1);
  }
  if (!has_embedding) {
    TRIDENT_CHECK(dstage_input != nullptr,
                  "a stage after the first must return its input gradient");
    be_.copy(dstage_input, dres, size_t(Nr) * C * sizeof(float));
    ready.through(last_ready(s));
    return;
  }
  Phase ph(be_, phases_, table_->backward_embedding);
  const float* demb = dres;  // the embedding's output gradient on all N rows
  if (rows_divisor_ > 1) {
    gather_rows(a.dfull.data(), dres, B, T, C);
    demb = a.dfull.data();
  }
  embedding_backward(demb, s.inputs.data(), sink, B, T);
  ready.through(table_->embedding_last_index);
  if (tied && !wte_after_head) ready.wte();
}

}  // namespace trident
