// The bf16 path (GPTOptions::precision, Note [bf16 activations] in src/backend/bf16_ops.cpp):
// the same model and the same gradients as gpt.cpp and gpt_backward.cpp, every family's block
// (Note [Block shapes]), in the ops that read bf16 without a cast pass, at any tp (the tp
// collectives between them: Note [bf16 with tp] in gpt_bf16_tp.cpp). The residual stream and
// its gradient stay fp32; at tp 1 the row-parallel linears add into the residual in their own
// op (matmul_forward_add_bf16) and the norm's backward adds into the residual gradient
// (layernorm_backward_add_bf16), which also writes the bf16 copy the next GEMMs read. The loss
// and its logit gradient are one pass in forward (crossentropy_fused_bf16 at tp 1), so backward
// starts at the LM head's GEMMs. GPT-2's tanh GELU is in fc's GEMM (forward) and fcproj's
// input-gradient GEMM (backward); exact GELU and SwiGLU are ops of their own after and before them.
// Gradient-ready events and the ready order are the fp32 path's.
//
// Note [Split backward in bf16]
// zb-h1's B on this path (backward_bf16's kInput part) is backward less the four linears'
// weight GEMMs, and keeps what those read: fcproj's and attproj's bf16 output gradients (this
// rank's rows) in the first half of residual3 and residual2 (fp32), fc's in fch, qkv's in qkv,
// the embedding's fp32 one in encoded: buffers B read for the last time, so nothing beyond the
// slot (the plan counts nothing more). W (weight_gemm_bf16) makes the unsplit calls' dW part on
// them; neither backend's dW depends on whether the call also made dinp, so B then W is
// backward bit for bit. GPT-2's fused dGELU GEMM sums fc's bias gradient from fp32 values it
// does not round to bf16, so that one stays in B. Ready events and ZeRO-3: Note [Split backward].
#include "model/gpt_phase.h"
#include "model/gpt_state.h"
#include "model/ready_walk.h"
#include "trident/check.h"
#include "trident/model.h"

namespace trident {

GPT::BlockWeights16 GPT::block16(int local_layer) const {
  const BlockOffsets& o = table_->layers[size_t(local_layer)].offset;
  return {weights16(local_layer, o.qkvw), weights16(local_layer, o.attprojw),
          weights16(local_layer, o.fcw), weights16(local_layer, o.fcprojw)};
}

// Note [bf16 unit gathers] (train/zero3_pool.h): without params16_, a GEMM weight's bucket was
// gathered in bf16 into the first half of its fp32 place in the unit's slot.
const bfloat16* GPT::weights16(int home, size_t offset) const {
  if (offset == kNoTensor) return nullptr;  // a mixture layer's dense MLP
  if (!params16_.empty()) return params16_.data() + offset;
  return reinterpret_cast<const bfloat16*>(weight_base_[size_t(home)] + offset);
}

const bfloat16* GPT::head_w16() {
  if (!params16_.empty()) return params16_.data() + table_->head_w;
  if (!cfg_.tied_head) return weights16(int(weight_base_.size()) - 1, table_->head_w);
  // wte is read in fp32 by the embedding, so gathered in fp32; the head's GEMM reads a cast of
  // it, made after each gather (ZeRO-1's rule for this one tensor).
  if (tied_head16_stale_) {
    be_.cast_to_bf16(tied_head16_.data(), wte_weights() + table_->head_w, tied_head16_.size());
    tied_head16_stale_ = false;
  }
  return tied_head16_.data();
}

void GPT::cast_weights(size_t span, size_t begin, size_t end) {
  if (params16_.empty()) return;  // the units' slots hold the bf16 weights (head_w16)
  if (cast_version_[span] == weights_version_) return;  // cast this step, or written by AdamW
  be_.cast_to_bf16(params16_.data() + begin, params_.data() + begin, end - begin);
  cast_version_[span] = weights_version_;
}

void GPT::norm_forward_bf16(bfloat16* out, float* mean, float* rstd, const float* inp,
                            const float* w, const float* b, int N, int C) {
  if (cfg_.norm == Norm::kRMSNorm) be_.rmsnorm_forward_bf16(out, rstd, inp, w, N, C, cfg_.norm_eps);
  else be_.layernorm_forward_bf16(out, mean, rstd, inp, w, b, N, C);
}

void GPT::norm_backward_add_bf16(float* dresidual, bfloat16* dresidual16, float* dw, float* db,
                                 const bfloat16* dout, const float* inp, const float* w,
                                 const float* mean, const float* rstd, int N, int C) {
  if (cfg_.norm == Norm::kRMSNorm)
    be_.rmsnorm_backward_add_bf16(dresidual, dresidual16, dw, dout, inp, w, rstd, N, C);
  else
    be_.layernorm_backward_add_bf16(dresidual, dresidual16, dw, db, dout, inp, w, mean, rstd, N, C);
}

void GPT::rope_bf16(bfloat16* qkv, int N, int T, bool backward) {
  const int rot = cfg_.rotary_dims();
  if (rot == 0) return;
  // This rank's heads (Note [bf16 with tp] in gpt_bf16_tp.cpp).
  const int NH = cfg_.heads / tp_.size, KVH = cfg_.kv_head_count() / tp_.size;
  const int hs = cfg_.head_size();
  const float *cos = scratch_->rope_cos.data(), *sin = scratch_->rope_sin.data();
  if (backward) be_.rope_backward_bf16(qkv, cos, sin, N, T, NH, KVH, hs, rot);
  else be_.rope_forward_bf16(qkv, cos, sin, N, T, NH, KVH, hs, rot);
}

// fc and its activation: fch = fc's output, fch_gelu = the activation's.
void GPT::mlp_up_forward_bf16(const BlockWeights& w, const BlockWeights16& w16,
                              const BlockActs16& a, int N) {
  const int C = cfg_.channels, F = cfg_.hidden() / tp_.size, FC = cfg_.fc_rows() / tp_.size;
  if (cfg_.activation == Activation::kGeluTanh) {
    be_.matmul_gelu_forward_bf16(a.fch_gelu, a.fch, a.ln2, w16.fcw, w.fcb, N, C, FC);
    return;
  }
  be_.matmul_forward_bf16(a.fch, a.ln2, w16.fcw, w.fcb, N, C, FC);
  if (cfg_.activation == Activation::kSwiGLU) be_.swiglu_forward_bf16(a.fch_gelu, a.fch, N, F);
  else be_.gelu_erf_forward_bf16(a.fch_gelu, a.fch, size_t(N) * F);
}

// Any tp (Note [bf16 with tp] in gpt_bf16_tp.cpp): the linears' tp helpers are tp 1's ops at
// tp 1, as norm_matmul and matmul_reduce are on the fp32 path.
void GPT::block_forward_bf16(int slot, int local_layer, const BlockWeights& w,
                             const BlockWeights16& w16, const BlockActs16& a,
                             const float* residual_in, int B, int T) {
  const int tps = tp_.size, Ql = cfg_.heads / tps * cfg_.head_size();
  const int QKVl = cfg_.qkv_rows() / tps, Fl = cfg_.hidden() / tps;
  // The row-parallel partial sums (tp > 1): in place without SP (Note [Reduce in place]).
  float* attn_partial = tp_.sequence_parallel ? scratch_->full_c.data() : a.residual2;
  float* mlp_partial = tp_.sequence_parallel ? scratch_->full_c.data() : a.residual3;
  norm_matmul_bf16(a.qkv, a.ln1, a.ln1_mean, a.ln1_rstd, residual_in, w.ln1w, w.ln1b, w16.qkvw,
                   w.qkvb, B, T, QKVl);
  rope_bf16(a.qkv, B * T, T, false);
  block_attention_forward_bf16(a, B, T);  // by blocks with cp (gpt_bf16_widen.cpp)
  row_forward_add_bf16(a.residual2, attn_partial, residual_in, a.atty, w16.attprojw, w.attprojb, B,
                       T, Ql);
  // A parallel residual's MLP reads the block's input, as its attention does; either way the
  // block's output is residual2 plus the MLP's.
  const float* mlp_in = cfg_.parallel_residual ? residual_in : a.residual2;
  if (moe_[size_t(local_layer)]) {  // in fp32 (Note [Widening at the bf16 boundary])
    moe_block_forward_bf16(slot, local_layer, w, a, mlp_in, B * T / rows_divisor_);
    return;
  }
  norm_mlp_up_forward_bf16(w, w16, a, mlp_in, B, T);
  row_forward_add_bf16(a.residual3, mlp_partial, a.residual2, a.fch_gelu, w16.fcprojw, w.fcprojb, B,
                       T, Fl);
}

// As recompute_block: the same ops on the same inputs (and the bf16 weights forward cast,
// unchanged since), so the recomputed values are forward's bits.
void GPT::recompute_block_bf16(int slot, int local_layer, const float* residual_in) {
  const Slot& s = slots_[slot];
  const int B = s.B, T = s.T, N = B * T;
  const BlockWeights w = block(layer_weights(local_layer), local_layer);
  const BlockWeights16 w16 = block16(local_layer);
  BlockActs16 a = block_acts16(slot, local_layer);
  if (recompute_mode_ == Recompute::kMlp) {
    if (!moe_[size_t(local_layer)]) mlp_up_forward_bf16(w, w16, a, N);  // a mixture keeps its own
    return;
  }
  a.residual3 = recompute_[12].data();  // the kept output is already there; do not rewrite it
  recomputing_ = true;                  // a mixture's statistics were taken in forward
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{recomputing_};
  block_forward_bf16(slot, local_layer, w, w16, a, residual_in, B, T);
}

float GPT::head_forward_bf16(Slot& s, const float* residual, const int32_t* targets, int B, int T) {
  const int C = cfg_.channels, V = cfg_.vocab, Vp = cfg_.padded_vocab, N = B * T;
  float* P = head_weights();
  Slot& h = head(s);
  cast_weights(table_->layers.size(), table_->head_w, table_->head_w + size_t(Vp) * C);
  norm_forward_bf16(h.lnf16.data(), h.lnf_mean.data(), h.lnf_rstd.data(), residual,
                    P + table_->lnfw, at(P, table_->lnfb), N, C);
  be_.matmul_forward_bf16(h.logits16.data(), h.lnf16.data(), head_w16(), nullptr, N, C, Vp);
  s.has_targets = targets != nullptr;
  if (!targets) return 0.0f;  // bf16 logits stay for the caller (none reads them yet)
  be_.copy(s.targets.data(), targets, size_t(N) * sizeof(int32_t));
  // Backward's seed, applied here: the mean over the N tokens times the run's scale.
  s.dloss = dloss_scale_ / float(N);
  be_.crossentropy_fused_bf16(h.losses.data(), h.logits16.data(), s.targets.data(), s.dloss, N, V,
                              Vp);
  return mean_loss(s, N);
}

// Any tp, as backward_pass: this rank's shards, with the collectives of Note [bf16 with tp]
// in the linears' helpers (row_backward_bf16, column_backward_bf16,
// norm_gathered_backward_bf16), which are tp 1's ops at tp 1.
void GPT::backward_bf16(BackwardPart part, int slot, float dloss_scale, const float* dstage_output,
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
  // Each home's gradients at its base (Note [Gradients in unit slots] in train/grad_pool.h).
  float* dres = a.dresidual.data();         // w.r.t. the current block's output, this rank's rows
  bfloat16* dres16 = a.dresidual16.data();  // its bf16 copy, for the GEMMs
  float* dpartial = a.dbuf_c.data();  // tp > 1: a column-parallel input gradient, partial over tp
  // As backward_pass: a tied wte right after the head where that is its only contribution here
  // (or the sparse part goes to a sink), else after the embedding. One piece (check in GPT()).
  const bool wte_after_head = tied && stage_.has_head && (!stage_.has_embedding || sink);
  const int begin = stage_.chunk_begin(s.chunk), end = begin + stage_.chunk_size(s.chunk);
  const bool has_head = head_chunk(s), has_embedding = embedding_chunk(s);
  ReadyWalk ready(on_ready, first_ready(s), table_->tied_wte_index, 1);
  const int L = stage_.num_layers;  // norm partial sums: 2 per local block, then lnf's
  // B leaves the linears' weight GEMMs to W and keeps what they read instead: a bf16 output
  // gradient into a buffer B has read for the last time (Note [Split backward in bf16]).
  const bool keep = part == BackwardPart::kInput;
  auto grad = [&](float* g) { return keep ? nullptr : g; };
  auto keep16 = [&](void* dst, const bfloat16* src, size_t n) {
    if (keep) be_.copy(dst, src, n * sizeof(bfloat16));
  };

  const float* last_residual =
      end > begin ? block_acts16(slot, end - 1).residual3 : s.encoded.data();
  if (has_head) {
    TRIDENT_CHECK(s.has_targets, "backward() needs a forward() with targets first");
    // The loss already wrote the logit gradient, with forward's seed.
    TRIDENT_CHECK(dloss_scale / float(N) == s.dloss,
                  "bf16: backward's dloss_scale {} is not the {} forward applied "
                  "(GPT::set_dloss_scale before forward)",
                  dloss_scale, s.dloss * float(N));
    if (param_use_) param_use_(ParamPass::kBackward, table_->head_uses);  // ZeRO-3's gathers
    Phase ph(be_, phases_, table_->backward_head);
    Slot& h = head(s);
    float* P = head_weights();
    const bfloat16* head_w16 = this->head_w16();
    const bfloat16* dlogits = h.logits16.data();
    // The head's dW first where it is final here (an untied lmw, or wte reported here); else a
    // tied wte the embedding adds to later, beside the input gradient: at tp 1 one call rounds
    // that into d16_c, at tp > 1 it is an fp32 partial (column_backward_bf16 without overlap).
    if (wte_after_head || !tied) {
      be_.matmul_backward_bf16(nullptr, head_w_grads() + table_->head_w, nullptr, dlogits,
                               h.lnf16.data(), head_w16, N, C, Vl);
      if (tied) ready.wte();
      else ready.through(table_->head_w_index);
    }
    float* dwte = tied && !wte_after_head ? wte_grads() + table_->wte : nullptr;
    if (tps == 1) {
      be_.matmul_backward_bf16(a.d16_c.data(), dwte, nullptr, dlogits, h.lnf16.data(), head_w16, N,
                               C, Vl);
    } else {
      if (dwte)
        be_.matmul_backward_bf16(nullptr, dwte, nullptr, dlogits, h.lnf16.data(), head_w16, N, C,
                                 Vl);
      be_.matmul_backward_input_fp32_bf16(dpartial, dlogits, head_w16, N, C, Vl);
    }
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
    if (lt.moe) {  // this rank's rows, from the fp32 dres (Note [Widening at the bf16 boundary])
      moe_block_backward_bf16(slot, i, dres, parallel ? nullptr : dres16, w, dw, act,
                              parallel ? residual_in : act.residual2, Nr, dloss_scale,
                              last_micro_batch);
      ready.through(lt.ready_moe);
    } else {
      // The block output's gradient on all N rows (gathered in bf16 with SP), and fcproj's
      // input gradient (through GPT-2's tanh GELU in the same GEMM).
      dout = row_backward_bf16(gelu_in_gemm ? a.d16_4c.data() : a.d16_act.data(),
                               gelu_in_gemm ? dw.fcb : nullptr, dres16, w16.fcprojw,
                               gelu_in_gemm ? act.fch : nullptr, B, T, Fl);
      keep16(act.residual3, dres16, size_t(Nr) * C);
      if (!keep)
        be_.matmul_backward_bf16(nullptr, dw.fcprojw, dw.fcprojb, dout, act.fch_gelu, nullptr, N,
                                 Fl, C);
      ready.through(lt.ready_fcproj);
      if (!gelu_in_gemm) {
        if (cfg_.activation == Activation::kSwiGLU)
          be_.swiglu_backward_bf16(a.d16_4c.data(), act.fch, a.d16_act.data(), N, Fl);
        else be_.gelu_erf_backward_bf16(a.d16_4c.data(), act.fch, a.d16_act.data(), size_t(N) * Fl);
      }
      keep16(act.fch, a.d16_4c.data(), size_t(N) * FCl);
      Work sum = column_backward_bf16(dpartial, grad(dw.fcw), gelu_in_gemm ? nullptr : grad(dw.fcb),
                                      a.d16_4c.data(), act.ln2, w16.fcw, B, T, FCl);
      ready.through(lt.ready_fc);
      // Sequential: dres and dres16 become residual2's (the residual path's gradient plus the
      // MLP branch's). Parallel: the MLP read the block's input, so its gradient collects into
      // dres for the block's input while `dout` stays the block output's, which attproj needs.
      norm_gathered_backward_bf16(std::move(sum), dres, parallel ? nullptr : dres16, dw.ln2w,
                                  dw.ln2b, dpartial, parallel ? residual_in : act.residual2, w.ln2w,
                                  act.ln2_mean, act.ln2_rstd, B, T, 2 * i + 1, last_micro_batch);
    }
    ready.through(lt.ready_ln2);

    // dres16 is attproj's output gradient here (this rank's rows): residual2's when sequential,
    // the block output's when parallel (the MLP's norm left it).
    keep16(act.residual2, dres16, size_t(Nr) * C);
    if (parallel && !lt.moe) {
      be_.matmul_backward_bf16(a.d16_c.data(), grad(dw.attprojw), grad(dw.attprojb), dout, act.atty,
                               w16.attprojw, N, Ql, C);
    } else {
      dout = row_backward_bf16(a.d16_c.data(), nullptr, dres16, w16.attprojw, nullptr, B, T, Ql);
      if (!keep)
        be_.matmul_backward_bf16(nullptr, dw.attprojw, dw.attprojb, dout, act.atty, nullptr, N, Ql,
                                 C);
    }
    ready.through(lt.ready_attproj);
    block_attention_backward_bf16(a.d16_3c.data(), a.d16_c.data(), act, B, T);
    rope_bf16(a.d16_3c.data(), N, T, true);
    keep16(act.qkv, a.d16_3c.data(), size_t(N) * QKVl);
    Work sum = column_backward_bf16(dpartial, grad(dw.qkvw), grad(dw.qkvb), a.d16_3c.data(),
                                    act.ln1, w16.qkvw, B, T, QKVl);
    ready.through(lt.ready_qkv);
    // Now w.r.t. the block's input. The bf16 copy is for the next block's GEMMs; the stage's
    // input gradient (embedding, previous stage) is the fp32 one.
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
  if (keep) {  // the embedding's output gradient, for W (fp32, as backward_pass keeps it)
    be_.copy(s.encoded.data(), dres, size_t(Nr) * C * sizeof(float));
    return;
  }
  Phase ph(be_, phases_, table_->backward_embedding);
  embedding_backward(kept_rows(dres, B, T), s.inputs.data(), sink, B, T);
  ready.through(table_->embedding_last_index);
  if (tied && !wte_after_head) ready.wte();
}

// W's GEMM on what B kept (Note [Split backward in bf16]): the row-parallel linears' bf16
// output gradients of this rank's rows in the first half of residual3 and residual2 (gathered to
// all N again with SP, in bf16 as B gathered them), fc's and qkv's in fch and qkv.
void GPT::weight_gemm_bf16(int slot, int local_layer, WeightGemm which) {
  const Slot& s = slots_[slot];
  const int B = s.B, T = s.T, N = B * T, C = cfg_.channels, tps = tp_.size;
  const BlockActs16 act = block_acts16(slot, local_layer);
  const BlockWeights dw = block(layer_grads(local_layer), local_layer);  // Note [ZeRO-3 and W]
  auto all_rows = [&](const float* kept) {
    const bfloat16* local = reinterpret_cast<const bfloat16*>(kept);
    if (rows_divisor_ == 1) return local;
    gather_rows_bf16(scratch_->dfull16.data(), local, B, T, C);
    return static_cast<const bfloat16*>(scratch_->dfull16.data());
  };
  switch (which) {
    case WeightGemm::kFcproj:
      be_.matmul_backward_bf16(nullptr, dw.fcprojw, dw.fcprojb, all_rows(act.residual3),
                               act.fch_gelu, nullptr, N, cfg_.hidden() / tps, C);
      return;
    case WeightGemm::kFc:  // GPT-2's tanh GELU: fc's bias gradient came with B's dGELU GEMM
      be_.matmul_backward_bf16(nullptr, dw.fcw,
                               cfg_.activation == Activation::kGeluTanh ? nullptr : dw.fcb, act.fch,
                               act.ln2, nullptr, N, C, cfg_.fc_rows() / tps);
      return;
    case WeightGemm::kAttproj:
      be_.matmul_backward_bf16(nullptr, dw.attprojw, dw.attprojb, all_rows(act.residual2), act.atty,
                               nullptr, N, cfg_.heads / tps * cfg_.head_size(), C);
      return;
    case WeightGemm::kQkv:
      be_.matmul_backward_bf16(nullptr, dw.qkvw, dw.qkvb, act.qkv, act.ln1, nullptr, N, C,
                               cfg_.qkv_rows() / tps);
      return;
  }
}

bool read_as_bf16(const ParamInfo& p) {
  if (p.layer < 0) return p.name == "lmw";
  const std::string_view suffix = std::string_view(p.name).substr(p.name.find('.') + 1);
  return suffix == "qkvw" || suffix == "attprojw" || suffix == "fcw" || suffix == "fcprojw";
}

}  // namespace trident
