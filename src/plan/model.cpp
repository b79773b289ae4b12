// The plan model: the time of one training step and the memory of one rank, for a layout on a
// hardware description (trident/plan.h).
//
// Note [Plan model]
// One micro-batch of one pipeline stage is costed op by op, as trident runs it (src/model/), and
// a step is built from it with the functions the trainer and bench use (bubble_model and
// max_in_flight, trident/pipeline.h), so the prediction follows the code it predicts. Every term
// is named and the time terms add up to step_s exactly, so a printed split cannot hide a
// remainder.
//
// The terms of one micro-batch:
//   gemm          every linear layer's forward GEMM and backward's two (dX, dW), each at the
//                 hardware's achieved rate for its smallest dimension (Hardware::gemm);
//   attention     fused (attention_tflops > 0: the causal half of QKᵀ and PV, forward 1×,
//                 backward 2.5× — dQ, dK, dV and the recomputed scores); or unfused
//                 (attention_tflops = 0: the full square products as GEMMs of min dimension
//                 head_dim, plus the score matrix through memory: written, read, written by
//                 the softmax, twice more in backward);
//   memory_bound  norms, GELU/SwiGLU, RoPE, residual adds, embedding, cross-entropy: bytes read and
//                 written / the rank's memory bandwidth (a CPU node's bandwidth is shared by its
//                 ranks);
//   tp_comm_exposed  Megatron's two all-reduces per block in forward and two in backward (with
//                 sequence parallelism an all-gather and a reduce-scatter each: the same ring
//                 volume), on the link the tp group sits on (or the emulated one, where
//                 comm.emulate_groups names tp); what the GEMMs do not hide
//                 (Note [Plan tensor-parallel overlap]; all of it without parallel.tp_overlap);
//   pp_p2p        one activation send per chunk boundary forward, one gradient back;
//   recompute     mlp: fc and its activation again in backward; full: the block's forward again.
// A step is accum micro-batches through the pipeline: busy = m·t_mb on the slowest stage,
// and the schedule's idle share (bubble_model in trident/pipeline.h, the same function bench
// prints) adds bubble = m·t̄·f/(1−f), t̄ the other stages' mean micro-batch time (the fill and
// drain run through them; for equal stages this is busy·f/(1−f)). Then what the data-parallel
// reduction leaves exposed: the all-reduce (ZeRO: reduce-scatter) hides under the last
// micro-batch's backward, the bucket that becomes ready last never hides, and compute under it
// runs overlap_slowdown slower; ZeRO's parameter all-gather hides under the next step's first
// forward. A tied head with pp > 1 then sums wte's gradient over the first and last stages,
// blocking (TiedEmbedding::sum_over_stages; an untied head has none). Last the optimizer,
// memory-bound over the rank's (ZeRO: shard's) parameters.
//
//
// ZeRO-3 (Note [Plan ZeRO-3] in src/plan/memory.cpp) gathers each unit's parameters before it
// runs, over the dp_shard group: per step Ψ·E forward and Ψ·E again in backward (units are
// freed after use), then reduce-scatters Ψ of gradients: 3Ψ where ZeRO-0 all-reduces 2Ψ, each
// at the ring's (n−1)/n. reshard_after_forward false drops the backward gathers (2Ψ). Under pp
// or accumulation zero3_gather micro_batch gathers per micro-batch (2·m·Ψ + Ψ for m
// micro-batches per stage), step once per step (Ψ + Ψ). The thread gathers one unit ahead, so a
// pass's gathers hide under its compute except the first unit's (wte forward, the stage's last
// unit backward) or all beyond the compute; the last backward's gathers come before its
// reduction in the thread's queue, so the reduction hides only in what of that backward they
// leave.
// HSDP then all-reduces each rank's gradient shard across the dp_replicate replicas (the
// inter-node link when the shard group fills a node): 2·(Ψ/S)·(R−1)/R, after its bucket's
// reduce-scatter, in the same chain; the chain's exposed time is split between the two terms
// by their shares. Stage 0 stands for every stage here, as for ZeRO-1/2.
//
// Note [Plan context parallelism]
// cp ranks split each sequence into 2·cp chunks, rank r holding r and 2·cp−1−r, so every
// per-token term runs on N = B·T/cp rows and each rank does 1/cp of the causal attention.
// ring: cp−1 forward steps each send the rank's K/V block (2·N·KVH/tp·hd floats: bf16 widens
// q|k|v, so 4 B in both) to the next rank while a block computes, att_f/cp; a step exposes
// max(0, transfer − compute). Backward: cp steps carrying K/V and dK/dV (twice the bytes)
// against att_b/cp.
// allgather: K/V gathered before forward and again before backward, dK/dV reduce-scattered
// after it, all exposed. Gradients reduce over dp·cp ranks, ZeRO shards over dp_shard·cp.
//
// Note [Plan mixture of experts]
// A mixture layer (model.moe.*) runs the router's GEMM [Nr, E, C] and top_k experts per token
// (the active parameters of the FLOP count): E/ep experts per rank on k·Nr·ep/E rows each,
// routing taken as balanced, whole over tp (Megatron's expert tensor parallel 1: tp needs
// sequence parallelism, Nr = N/tp, and the layer keeps attention's tp exchange only). With
// ep > 1, per layer and micro-batch, 4 all-to-alls of k·Nr·C elements (tokens out, outputs
// back; backward the same), (ep−1)/ep leaving the rank over the ep group's link, and a count
// exchange: none overlapped (moe_all_to_all_exposed). Experts reduce over dp·cp/ep ranks; with
// HSDP over dp_shard·cp/ep, their shard then all-reduced over the replicas with the dense ones'.
//
// Note [Plan weight pass]
// ZB-H1's bubble, (p−1)(F+B) less the W's that fill it (bubble_model), takes W as a third of a
// micro-batch. With experts, a mixture's weight GEMMs run in B (Note [Mixtures in B]), so W is
// the slowest stage's StageCost::weight_pass (attention's and dense layers' deferred weight
// GEMMs, the embedding's scatter) over its micro-batch time, at most a third. Dense models
// keep the third (their figures as before); the cores' busy share (rank_place) keeps it too.
//
// Memory: Note [Plan memory] in src/plan/memory.cpp. Not modelled: routing imbalance (the
// busiest expert sets the pace), capacity drops, grouped-GEMM and permutation kernels' own
// rates, an all-to-all's bus bandwidth below the ring's.
//
// Approximations, stated: layers are costed alike (no per-layer imbalance beyond the
// embedding and head); the bubble uses the slowest stage's micro-batch time for every stage;
// kernel launch overheads and the CPU's thread scaling (taken as linear) are not modelled.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <utility>

#include "plan/plan_parts.h"
#include "trident/check.h"
#include "trident/comm.h"
#include "trident/model.h"
#include "trident/peak_check.h"
#include "trident/pipeline.h"
#include "trident/train.h"

namespace trident {
namespace {

// Note [Flash attention rate]
// attention_tflops is a flash kernel's rate at head dim 128 and 2k keys (the hardware files'
// sources). Per score it does 4·hd FLOPs on tensor cores and a fixed softmax on the others, so
// time ∝ (1−s)·hd/128 + s: s = 0.205 fits FlashAttention-3's forward at hd 64 (514 TFLOP/s,
// 1×8×32768, flash-attention#1438) against hd 128 (621, 1×16×16384, pytorch/benchmark#2391).
// Longer key spans amortise each tile loop's start: kFlashKeys, that benchmark's forward rate
// by sequence length relative to 2k. A context-parallel block's span is T/(2·cp).
constexpr double kFlashSoftmaxShare = 0.205;
constexpr std::pair<double, double> kFlashKeys[] = {{512, 0.761},  {1024, 0.915}, {2048, 1.0},
                                                    {4096, 1.044}, {8192, 1.086}, {16384, 1.098}};

double flash_rate_factor(double head_dim, double keys) {
  const double hd = head_dim / 128;
  const double by_head = hd / ((1 - kFlashSoftmaxShare) * hd + kFlashSoftmaxShare);
  const auto* first = std::begin(kFlashKeys);
  const auto* last = std::end(kFlashKeys) - 1;
  double by_keys = keys <= first->first ? first->second : last->second;
  for (const auto* p = first; p < last; ++p)
    if (keys > p->first && keys <= (p + 1)->first) {  // interpolated in log(keys)
      const double f = std::log(keys / p->first) / std::log((p + 1)->first / p->first);
      by_keys = p->second + f * ((p + 1)->second - p->second);
    }
  return by_head * by_keys;
}

// Note [Plan cross-entropy traffic]
// trident's loss reads the logits once and writes the probabilities forward, and writes their
// gradient backward: 3 and 2 elements per logit at the activation dtype. Megatron-Core in 2024
// (tensor_parallel/cross_entropy.py at 937571cf, the default without --cross-entropy-loss-fusion)
// casts the bf16 logits to fp32 and then runs max, subtract, exp, sum and divide as separate
// kernels over them: 6 + 4 + 8 + 8 + 4 + 8 = 38 B forward; backward multiplies the saved fp32
// softmax in place (8 B) and autograd casts the gradient back to bf16 (6 B): 14 B. A hardware
// description of such a stack gives cross_entropy_forward_bytes / _backward_bytes, so that a
// check against its published runs prices the loss it ran (docs/plan.md, "Issue 45").

// Note [Plan tensor-parallel overlap]
// With parallel.tp_overlap and tp > 1, a block's collective of time t hides behind a GEMM of
// time g as trident runs them: on a ring of tp chunks of k pieces (sequence parallel: the
// all-gathers before qkv and fc, the reduce-scatters after attproj and fcproj, backward's
// output-gradient all-gathers before fcproj's and attproj's input-gradient GEMMs) a piece's
// GEMM runs while the next travels; without sequence parallelism the row-parallel all-reduce goes
// in k pieces, each beside the next piece's GEMM; qkv's and fc's input-gradient sums ride under
// their weight-gradient GEMM (on a host; a device's ring steps are whole chunks and these sums
// wait). What hides slows the compute under it by tp_overlap_slowdown (default overlap_slowdown).

// The ring's (tp−1)·k pieces travel back to back; the rank's own chunk (g/tp) computes first,
// each arrived piece (g/(tp·k)) after it: the GEMMs end at max(g, t + g/(tp·k), the first piece
// + (tp−1)·g/tp), of which g is compute.
double ring_exposed(double t, double g, double tp, double k) {
  return std::max({0.0, t + g / (tp * k) - g, t / ((tp - 1) * k) - g / tp});
}
double pieces_exposed(double t, double g, double k) {
  return t / k + (k - 1) * std::max(0.0, t / k - g / k);
}
double bulk_exposed(double t, double g) { return std::max(0.0, t - g); }

// Ring collectives over n ranks: bytes of the whole buffer, the link's bus bandwidth.
double ring_seconds(LinkOp op, double bytes, int n, const LinkSpec& link) {
  if (n <= 1 || bytes <= 0) return 0;
  const double bw = link.gbytes_per_s * 1e9, lat = link.latency_us * 1e-6;
  switch (op) {
    case LinkOp::kAllReduce: return 2.0 * (n - 1) / n * bytes / bw + 2.0 * (n - 1) * lat;
    case LinkOp::kReduceScatter:
    case LinkOp::kAllGather: return double(n - 1) / n * bytes / bw + (n - 1) * lat;
    default: return bytes / bw + lat;
  }
}

}  // namespace

PlanModel PlanModel::from_deck(const Deck& deck) {
  PlanModel m;
  m.async_checkpoint = deck.checkpoint.async;  // or plan's --async-checkpoint
  m.layers = deck.model.layers;
  m.d_model = deck.model.d_model;
  m.heads = deck.model.heads;
  m.vocab = deck.model.vocab;
  m.seq_len = deck.model.seq_len;
  // The deck's block keys resolved as the trainer resolves them (refusing what it refuses), on
  // the deck's own shape: the plan never reads model.init_from.
  Deck shape = deck;
  shape.model.init_from.clear();
  shape.parallel.tp = 1;
  m.block = model_config_from_deck(shape, nullptr);
  m.overlap = deck.comm.overlap;
  m.bucket_mb = deck.comm.bucket_mb;
  m.first_bucket_mb = deck.comm.first_bucket_mb;
  m.tp_overlap = deck.parallel.tp_overlap != "false";
  m.tp_overlap_auto = deck.parallel.tp_overlap == "auto";
  m.tp_overlap_chunks = deck.parallel.tp_overlap_chunks;
  m.emulate_gbps = deck.comm.emulate_gbps;
  m.emulate_latency_us = deck.comm.emulate_latency_us;
  m.emulate_dp = link_emulated_for(deck.comm, "dp");
  m.emulate_tp = link_emulated_for(deck.comm, "tp");
  m.grad_comm_bytes = deck.comm.grad_dtype == "bf16" ? 2 : 4;
  return m;
}

double Prediction::term(const std::string& name) const {
  for (const auto* list : {&time, &memory, &info})
    for (const PlanTerm& t : *list)
      if (t.name == name) return t.value;
  return 0;
}

RankPlace rank_place(const PlanLayout& l, const Hardware& hw, double busy_fraction) {
  RankPlace r;
  const bool cpu = hw.kind == "cpu";
  const int per_node = l.ranks_per_node > 0 ? l.ranks_per_node
                       : cpu                ? std::max(1, hw.devices_per_node / l.threads)
                                            : hw.devices_per_node;
  r.ranks_per_node = per_node;
  r.local_ranks = std::min(l.world(), per_node);
  // A CPU rank computes on its threads, fewer when the node's ranks ask for more cores than
  // it has (they then share them); a GPU rank on its device.
  // With b of its c cores busy, each core gives 1 − (1 − core_scaling)·(b − 1)/(c − 1) of its
  // rate alone (core_scaling when all compute).
  // A rank's own threads scale by thread_scaling instead (same interpolation over its threads).
  r.cores = 1.0;
  if (cpu) {
    const double c = hw.devices_per_node, asked = double(r.local_ranks) * l.threads;
    const double busy = std::min(asked, c);
    auto share = [&](double scaling, double n) {
      return c > 1 ? 1 - (1 - scaling) * (n - 1) / (c - 1) : 1.0;
    };
    const double threads = std::min<double>(l.threads, c);
    const double per_core =
        share(hw.core_scaling, busy / threads) * share(hw.thread_scaling, threads);
    // More threads than cores: the ranks time-share them, and a rank idle in the pipeline's
    // bubble yields its core (mpi_yield_when_idle), so only the busy share competes.
    const double competing =
        asked * std::max(std::min(busy_fraction, 1.0), std::min(1.0, c / asked));
    r.cores = l.threads * std::min(1.0, c / competing) * per_core;
  }
  r.memory_bw = hw.memory_gbytes_per_s * 1e9 / (cpu ? r.local_ranks : 1);
  r.peak_flops = hw.peak_tflops * 1e12 * r.cores;
  // Rank order: tp fastest, then cp, then dp, then pp (trident/grid.h). A group of consecutive
  // ranks stays inside a node only when its size divides the node's ranks (or the whole job is one
  // node): tp = 6 on 8-GPU nodes puts ranks 6..11 on two nodes, so that ring runs at the
  // inter-node link's pace. A dp group is tp-strided: inside a node when tp·dp is.
  auto inside = [&](int span) { return l.world() <= per_node || per_node % span == 0; };
  r.tp_link = inside(l.tp) ? hw.intra_node : hw.inter_node;
  // The cp group is tp-strided inside a node when tp·cp is; dp (with cp: the dp·cp group the
  // gradients reduce over) when tp·cp·dp is.
  r.cp_link = inside(l.tp * l.cp) ? hw.intra_node : hw.inter_node;
  // ep consecutive ranks of dp·cp (Note [Expert parallelism] in src/model/moe.h): tp·ep ranks.
  r.ep_link = inside(l.tp * l.ep) ? hw.intra_node : hw.inter_node;
  r.dp_link = inside(l.tp * l.cp * l.dp) ? hw.intra_node : hw.inter_node;
  // HSDP orders the dp index shard-fastest (torchtitan's dp_replicate × dp_shard mesh), so a
  // shard group of tp·dp_shard consecutive ranks fits a node when that divides it.
  r.shard_link = inside(l.tp * l.shard_ranks()) ? hw.intra_node : hw.inter_node;
  r.replicate_link = r.dp_link;
  r.pp_link = l.world() <= per_node ? hw.intra_node : hw.inter_node;
  return r;
}

double kernel_bandwidth(const Hardware& hw, const RankPlace& place, double gbytes_per_s) {
  if (gbytes_per_s <= 0) return place.memory_bw;
  return std::min(place.memory_bw, gbytes_per_s * 1e9 * (hw.kind == "cpu" ? place.cores : 1.0));
}

// auto, as the trainer resolves it (Note [Chunks on the host]): on a host, on where the tp group
// crosses nodes or its link is emulated; on a device, off (its rings never ran on one).
bool tp_overlap_runs(const PlanModel& m, const PlanLayout& l, const Hardware& hw,
                     const RankPlace& place) {
  const bool device = hw.kind != "cpu";
  return l.tp > 1 && m.tp_overlap &&
         (!m.tp_overlap_auto ||
          (!device && (place.tp_link.gbytes_per_s != hw.intra_node.gbytes_per_s ||
                       (m.emulate_gbps > 0 && m.emulate_tp))));
}

StageCost stage_cost(const PlanModel& m, const PlanLayout& l, const Hardware& hw,
                     const RankPlace& place, const StageSpec& stage) {
  StageCost c;
  // A rank holds T/cp tokens of each sequence (Note [Plan context parallelism]).
  const double B = l.micro_batch, T = m.seq_len, C = m.d_model, NH = m.heads, cp = l.cp;
  const double tp = l.tp, N = B * T / cp, hd = C / NH;
  const double rows = l.sequence_parallel && l.tp > 1 ? N / tp : N;  // LayerNorm/residual rows
  const double E = hw.dtype == "fp32" ? 4 : 2;                       // activation bytes
  const double Vl = double(padded_vocab(m, l)) / tp;
  const double eff = hw.compute_efficiency;  // measured / per-op terms (Hardware)
  // A rate scaled by compute_efficiency stays at or below the peak: nothing runs faster.
  const double peak = hw.peak_tflops * 1e12;
  auto gemm = [&](double M, double Nn, double K) {
    return 2 * M * Nn * K / (std::min(gemm_flops_per_s(hw, M, Nn, K) * eff, peak) * place.cores);
  };
  // Forward y[M×out] = x[M×in]·Wᵀ; backward dx = dy·W and dW = dyᵀ·x.
  auto linear_f = [&](double out, double in) { return gemm(N, out, in); };
  auto linear_b = [&](double out, double in) { return gemm(N, in, out) + gemm(out, in, N); };
  const double elementwise_bw = kernel_bandwidth(hw, place, hw.elementwise_gbytes_per_s);
  auto mem = [&](double elements) { return elements * E / (elementwise_bw * eff); };

  // One block, forward and backward, per part, at the family's widths (Note [Block shapes] in
  // trident/model_config.h): qkv's rows shrink with kv_heads, SwiGLU's fc is gate | up.
  const GPTConfig cfg = gpt_config(m, l);
  const double qkv = cfg.qkv_rows() / tp, proj_in = C / tp;
  const double fc = cfg.fc_rows() / tp, hidden = cfg.hidden() / tp;
  const double block_gemm_f =
      linear_f(qkv, C) + linear_f(C, proj_in) + linear_f(fc, C) + linear_f(C, hidden);
  const double block_gemm_b =
      linear_b(qkv, C) + linear_b(C, proj_in) + linear_b(fc, C) + linear_b(C, hidden);
  // A mixture layer (Note [Plan mixture of experts]) swaps the MLP's GEMMs for the router's on
  // its Nr rows and E/ep experts' on k·Nr·ep/E rows each (balanced), whole over tp; the shared
  // experts run on the Nr rows.
  int moe_layers = 0;
  for (int i = 0; i < stage.num_layers; ++i) moe_layers += cfg.is_moe(stage.global_layer(i));
  const double Ex = cfg.moe.experts, k = cfg.moe.top_k, ep = l.ep, kNr = k * rows;
  const double Fe = cfg.expert_width(), FCe = cfg.fc_rows_of(int(Fe));
  const double Fs = cfg.shared_width(), FCs = cfg.fc_rows_of(int(Fs));
  double moe_gemm_f = 0, moe_gemm_b = 0, moe_fc_f = 0, a2a_f = 0, a2a_b = 0;
  if (moe_layers > 0) {
    auto lin_f = [&](double M, double out, double in) { return M > 0 ? gemm(M, out, in) : 0.0; };
    auto lin_b = [&](double M, double out, double in) {
      return M > 0 ? gemm(M, in, out) + gemm(out, in, M) : 0.0;
    };
    const double local = Ex / ep, per_expert = kNr * ep / Ex;
    moe_fc_f = local * lin_f(per_expert, FCe, C) + lin_f(Fs > 0 ? rows : 0, FCs, C);
    moe_gemm_f = lin_f(rows, Ex, C) + moe_fc_f + local * lin_f(per_expert, C, Fe) +
                 lin_f(Fs > 0 ? rows : 0, C, Fs);
    moe_gemm_b = lin_b(rows, Ex, C) +
                 local * (lin_b(per_expert, FCe, C) + lin_b(per_expert, C, Fe)) +
                 lin_b(Fs > 0 ? rows : 0, FCs, C) + lin_b(Fs > 0 ? rows : 0, C, Fs);
    if (l.ep > 1) {  // rows out and outputs back; backward the same; the counts first
      const double one = (ep - 1) / ep * kNr * C * E / (place.ep_link.gbytes_per_s * 1e9) +
                         (ep - 1) * place.ep_link.latency_us * 1e-6;
      const double counts = (ep - 1) * place.ep_link.latency_us * 1e-6;
      a2a_f = counts + 2 * one;
      a2a_b = 2 * one;
    }
  }
  const double attn_gemm_f = linear_f(qkv, C) + linear_f(C, proj_in);
  const double attn_gemm_b = linear_b(qkv, C) + linear_b(C, proj_in);
  const double heads_local = NH / tp;
  double att_f = 0, att_b = 0, att_mem_f = 0, att_mem_b = 0;
  if (hw.attention_tflops > 0) {  // Note [Flash attention rate]
    const double flops = 2 * 2 * B * heads_local * T * T * hd / 2 / cp;  // causal half, 1/cp
    const double rate =
        hw.attention_tflops * 1e12 * flash_rate_factor(hd, T / (cp > 1 ? 2 * cp : 1));
    att_f = flops / (std::min(rate * eff, peak) * place.cores);
    att_b = 2.5 * att_f;
  } else {
    const double per_head = gemm(T, T, hd) + gemm(T, hd, T);  // QKᵀ, PV
    att_f = B * heads_local * per_head / cp;
    att_b = 2 * att_f;
    const double scores = B * heads_local * T * T / cp;
    att_mem_f = mem(3 * scores);
    att_mem_b = mem(6 * scores);
  }
  // Context parallelism's K/V exchange per block (Note [Plan context parallelism]).
  double cp_f = 0, cp_b = 0, cp_hidden_f = 0, cp_hidden_b = 0;
  if (l.cp > 1) {
    // fp32 in both precisions: bf16 widens q|k|v first (Note [Widening at the bf16 boundary]).
    const double kv = 2 * N * cfg.kv_head_count() / tp * cfg.head_size() * 4;
    if (l.cp_comm == "ring") {
      const double step_f = ring_seconds(LinkOp::kSendRecv, kv, 2, place.cp_link);
      const double step_b = ring_seconds(LinkOp::kSendRecv, 2 * kv, 2, place.cp_link);
      cp_f = (cp - 1) * std::max(0.0, step_f - att_f / cp);
      cp_b = cp * std::max(0.0, step_b - att_b / cp);
      cp_hidden_f = (cp - 1) * std::min(step_f, att_f / cp);
      cp_hidden_b = cp * std::min(step_b, att_b / cp);
    } else {
      const double gather = ring_seconds(LinkOp::kAllGather, cp * kv, l.cp, place.cp_link);
      cp_f = gather;
      cp_b = gather + ring_seconds(LinkOp::kReduceScatter, cp * kv, l.cp, place.cp_link);
    }
  }
  // Elementwise traffic per block (elements read + written): each norm 2× in, 1× out (RMSNorm
  // reads twice too: the sum of squares, then the scaling); two residual adds 2 in, 1 out (a
  // parallel residual adds twice as well, src/model/gpt.cpp); the activation over the local
  // hidden width: GELU 1 in, 1 out, SwiGLU gate and up in, 1 out; RoPE reads and writes the
  // rotated dimensions of the local q and k heads. Backward about twice that.
  const double act = (cfg.activation == Activation::kSwiGLU ? 3 : 2) * N * hidden;
  const double rope = 2 * N * double(cfg.heads + cfg.kv_head_count()) / tp * cfg.rotary_dims();
  const double block_elems = 2 * 3 * rows * C + 2 * 3 * rows * C + act + rope;
  const double block_mem_f = mem(block_elems) + att_mem_f;
  const double block_mem_b = mem(2 * block_elems) + att_mem_b;
  // A mixture's activation runs on the k·Nr routed rows (and the shared experts' Nr); the
  // permutation reads Nr rows and writes k·Nr, the weighted sum reads k·Nr and writes Nr.
  const double moe_act = (cfg.activation == Activation::kSwiGLU ? 3 : 2) * (kNr * Fe + rows * Fs);
  const double moe_elems =
      block_elems - act + moe_act + 2 * (k + 1) * rows * C + 2 * rows * Ex;  // + the router's
  const double moe_mem_f = mem(moe_elems) + att_mem_f;
  const double moe_mem_b = mem(2 * moe_elems) + att_mem_b;
  // Two all-reduces of the block's [N, C] activations forward, two backward; a mixture's
  // experts are replicated over tp, so only attention's (sequence parallel: one all-gather and
  // one reduce-scatter, the volume of one all-reduce).
  auto tp_seconds = [&](LinkOp op, double bytes) {
    if (l.tp <= 1) return 0.0;
    if (m.emulate_gbps > 0 && m.emulate_tp)
      return emulated_link_seconds(op, size_t(bytes), l.tp, m.emulate_gbps, m.emulate_latency_us);
    return ring_seconds(op, bytes, l.tp, place.tp_link);
  };
  const double tp_one = tp_seconds(LinkOp::kAllReduce, N * C * E);
  const double block_tp = 2 * tp_one, moe_tp = tp_one;
  // What of them the GEMMs leave exposed, per pass: attention's half (qkv, attproj) and the
  // MLP's (fc, fcproj); all of it without overlap (Note [Plan tensor-parallel overlap]).
  double attn_tp_f = tp_one, attn_tp_b = tp_one, mlp_tp_f = tp_one, mlp_tp_b = tp_one;
  const bool device = hw.kind != "cpu";
  const bool tp_overlap = tp_overlap_runs(m, l, hw, place);
  // A device's rings move whole chunks and leave backward's bulk sums exposed:
  // Note [Tensor-parallel ring on a device].
  auto bulk = [&](double t, double g) { return device ? t : bulk_exposed(t, g); };
  auto wgrad = [&](double out, double in) { return gemm(out, in, N); };
  if (tp_overlap && l.tp > 1) {
    auto dgrad = [&](double out, double in) { return gemm(N, in, out); };
    if (l.sequence_parallel) {
      const double t = tp_one / 2;  // one all-gather or reduce-scatter: half an all-reduce
      // Pieces per ring chunk: the deck's, or trident's default of 2 (model_options.cpp); one on
      // a device.
      const double k = device ? 1 : m.tp_overlap_chunks > 0 ? m.tp_overlap_chunks : 2;
      auto ring = [&](double g) { return ring_exposed(t, g, tp, k); };
      attn_tp_f = ring(linear_f(qkv, C)) + ring(linear_f(C, proj_in));
      mlp_tp_f = ring(linear_f(fc, C)) + ring(linear_f(C, hidden));
      attn_tp_b = ring(dgrad(C, proj_in)) + bulk(t, wgrad(qkv, C));
      mlp_tp_b = ring(dgrad(C, hidden)) + bulk(t, wgrad(fc, C));
    } else {
      const double k = m.tp_overlap_chunks > 0 ? m.tp_overlap_chunks : tp;
      attn_tp_f = pieces_exposed(tp_one, linear_f(C, proj_in), k);
      mlp_tp_f = pieces_exposed(tp_one, linear_f(C, hidden), k);
      attn_tp_b = bulk(tp_one, wgrad(qkv, C));
      mlp_tp_b = bulk(tp_one, wgrad(fc, C));
    }
  }
  const double block_tp_f = attn_tp_f + mlp_tp_f, block_tp_b = attn_tp_b + mlp_tp_b;

  const double dense = stage.num_layers - moe_layers, mixed = moe_layers;
  const double layers = stage.num_layers;
  c.gemm = dense * (block_gemm_f + block_gemm_b) +
           mixed * (attn_gemm_f + attn_gemm_b + moe_gemm_f + moe_gemm_b);
  c.attention = layers * (att_f + att_b);
  c.memory_bound = dense * (block_mem_f + block_mem_b) + mixed * (moe_mem_f + moe_mem_b);
  c.tp_total = dense * 2 * block_tp + mixed * 2 * moe_tp;
  c.tp_comm = dense * (block_tp_f + block_tp_b) + mixed * (attn_tp_f + attn_tp_b);
  c.tp_hidden = c.tp_total - c.tp_comm;
  c.cp_comm = layers * (cp_f + cp_b);
  c.cp_hidden = layers * (cp_hidden_f + cp_hidden_b);
  c.a2a = mixed * (a2a_f + a2a_b);
  const double moe_f = attn_gemm_f + moe_gemm_f + att_f + moe_mem_f + attn_tp_f + cp_f + a2a_f;
  c.backward = dense * (block_gemm_b + att_b + block_mem_b + block_tp_b + cp_b) +
               mixed * (attn_gemm_b + moe_gemm_b + att_b + moe_mem_b + attn_tp_b + cp_b + a2a_b);
  c.forward = dense * (block_gemm_f + att_f + block_mem_f + block_tp_f + cp_f) + mixed * moe_f;
  const double attn_wgrad = wgrad(qkv, C) + wgrad(C, proj_in);
  c.weight_pass = dense * (attn_wgrad + wgrad(fc, C) + wgrad(C, hidden)) + mixed * attn_wgrad;
  if (l.recompute == "mlp") {  // a mixture's routed rows are kept: its experts' fc again
    c.recompute = dense * (linear_f(fc, C) + mem(act)) + mixed * (moe_fc_f + mem(moe_act));
  } else if (l.recompute == "full") {  // the forward again, its K/V and tp exchanges included
    c.recompute =
        dense * (block_gemm_f + att_f + block_mem_f + block_tp_f + cp_f) + mixed * (moe_f - a2a_f);
    c.cp_hidden += layers * cp_hidden_f;
    c.tp_hidden += dense * (block_tp - block_tp_f) + mixed * (moe_tp - attn_tp_f);
    c.a2a += mixed * a2a_f;  // the tokens travel again: counted with the all-to-alls
    c.backward += mixed * a2a_f;
  }
  c.backward += c.recompute;
  if (stage.has_embedding) {  // token (+ learned position) rows summed; backward scatters them
    const double rows_read = cfg.has_wpe() ? 3 : 2;
    const double e = mem(rows_read * N * C), eb = mem(rows_read * N * C);
    c.memory_bound += e + eb;
    c.forward += e;
    c.backward += eb;
    c.weight_pass += eb;
  }
  if (stage.has_head) {  // final LayerNorm, logits, vocab-parallel cross-entropy
    const double g_f = linear_f(Vl, C), g_b = linear_b(Vl, C);
    // Note [Plan cross-entropy traffic]: trident's logits read, probabilities, gradients, or
    // the description's bytes per logit.
    const bool own_ce = hw.cross_entropy_forward_bytes == 0 && hw.cross_entropy_backward_bytes == 0;
    const double ce_f = own_ce ? 3 : hw.cross_entropy_forward_bytes / E;  // elements per logit
    const double ce_b = own_ce ? 2 : hw.cross_entropy_backward_bytes / E;
    const double ce = mem(2 * 3 * rows * C) + mem(ce_f * N * Vl);  // the final LayerNorm, the loss
    const double ceb = mem(2 * 3 * rows * C) + mem(ce_b * N * Vl);
    const double tp_ce = 2 * tp_seconds(LinkOp::kAllReduce, N * 3 * 4);  // never overlapped
    c.gemm += g_f + g_b;
    c.memory_bound += ce + ceb;
    c.tp_comm += tp_ce;
    c.tp_total += tp_ce;
    c.forward += g_f + ce + tp_ce;
    c.backward += g_b + ceb;
  }
  // Per micro-batch and chunk, the activation arrives from the previous stage and its gradient
  // from the next: one transfer each on this stage's path (trident sends fp32 StageTensors).
  if (l.pp > 1) {
    const double one = ring_seconds(LinkOp::kSendRecv, rows * C * 4, 2, place.pp_link);
    c.pp_p2p = 2.0 * stage.chunks() * one;
    c.forward += c.pp_p2p / 2;
    c.backward += c.pp_p2p / 2;
  }
  return c;
}

Prediction predict(const PlanModel& m, const PlanLayout& l, const Hardware& hw) {
  Prediction p;
  p.layout = l;
  p.why_not = layout_problem(m, l);
  if (p.why_not.empty() && hw.kind == "gpu" && l.zero_reduce == "micro_batch" && !m.overlap)
    p.why_not = "zero_reduce=micro_batch on a GPU needs comm.overlap (the gradient pool)";
  if (!p.why_not.empty()) return p;  // not a layout trident can run: fits = false, no times
  const int chunks = l.schedule == "interleaved" ? l.v : 1;
  double f = l.pp > 1
                 ? bubble_model(parse_pipe_schedule(l.schedule, "schedule"), l.pp, l.accum, chunks)
                 : 0.0;
  const RankPlace place = rank_place(l, hw, 1 - f);  // its peak_flops counts the same cores
  p.memory = memory_terms(m, l, hw);
  for (const PlanTerm& t : p.memory) p.memory_bytes += t.value;
  const double capacity = hw.memory_gb * 1e9 / (hw.kind == "cpu" ? place.local_ranks : 1);
  if (p.memory_bytes > capacity)
    p.why_not = fmt::format("needs {:.1f} GB per rank, has {:.1f} GB", p.memory_bytes / 1e9,
                            capacity / 1e9);
  // Note [Plan checkpoint snapshot]: the stage that saves the most; a node's ranks each hold one
  // (an upper bound under pp, where a node's stages differ).
  for (int s = 0; s < l.pp; ++s)
    p.snapshot.bytes_per_rank = std::max(p.snapshot.bytes_per_rank, snapshot_bytes(m, l, s));
  p.snapshot.node_ranks = place.local_ranks;
  p.snapshot.host_bytes_per_node = p.snapshot.bytes_per_rank * place.local_ranks;
  const double copy_rate = host_copy_bytes_per_s(hw);
  p.snapshot.copy_s = copy_rate > 0 ? p.snapshot.bytes_per_rank / copy_rate : 0;
  if (m.async_checkpoint && hw.kind == "gpu" && hw.host_memory_gb > 0 && p.why_not.empty() &&
      p.snapshot.host_bytes_per_node > hw.host_memory_gb * 1e9)
    p.why_not = fmt::format("the checkpoint snapshot needs {:.1f} GB of pinned host memory per "
                            "node, the node has {:.1f} GB",
                            p.snapshot.host_bytes_per_node / 1e9, hw.host_memory_gb);
  p.fits = p.why_not.empty();  // a layout that does not fit is still timed

  // The slowest stage sets the pace (embedding on the first, head on the last). The bubble is
  // the schedule's idle share for equal stages, f/(1−f)·m micro-batch times, taken of the
  // OTHER stages' mean: the fill and drain pass once through each of them while the slowest
  // stage runs its m micro-batches (1F1B on 2 stages: t₀ + m·t₁ when stage 1 is slower).
  StageCost slow;
  double slow_mb = -1, first_backward = 0, first_forward = 0, sum_mb = 0;
  const std::vector<int> probes = l.pp > 2    ? std::vector<int>{0, 1, l.pp - 1}
                                  : l.pp == 2 ? std::vector<int>{0, 1}
                                              : std::vector<int>{0};
  for (int s : probes) {
    const StageSpec spec = pipeline_stage(m.layers, l.pp, s, {}, chunks);
    const StageCost c = stage_cost(m, l, hw, place, spec);
    const double t = c.forward + c.backward;
    sum_mb += s == 1 && l.pp > 2 ? (l.pp - 2) * t : t;  // stage 1 stands for the middle ones
    if (t > slow_mb) slow_mb = t, slow = c;
    if (s == 0) first_backward = c.backward, first_forward = c.forward;
  }
  // Note [Plan weight pass]: a mixture's zb-h1 W pass is lighter than a third of the stage.
  if (l.pp > 1 && m.block.moe.experts > 0 && l.schedule == "zb-h1")
    f = bubble_model(PipeSchedule::kZeroBubbleH1, l.pp, l.accum, 1,
                     std::min(1.0 / 3, slow.weight_pass / slow_mb));
  const double micro = l.accum;
  const double others_mb = l.pp > 1 ? (sum_mb - slow_mb) / (l.pp - 1) : 0;
  const double bubble = f < 1 ? micro * others_mb * f / (1 - f) : 0;

  // Data parallelism over the rank's gradients.
  // A mixture's routed experts reduce and shard over the dp·cp/ep expert-dp ranks, the rest
  // over dp·cp: one collective per group (Note [Plan mixture of experts]).
  const double params_local = stage_params(m, l, 0);
  const double expert_local = stage_expert_params(m, l, 0);
  const double dense_local = params_local - expert_local;
  const double grad_bytes = params_local * m.grad_comm_bytes;
  const double dense_grad = dense_local * m.grad_comm_bytes;
  const double expert_grad = expert_local * m.grad_comm_bytes;
  const double param_bytes = hw.dtype == "fp32" ? 4 : 2;
  auto group_seconds = [&](LinkOp op, double bytes, int n, const LinkSpec& link) {
    if (n <= 1 || bytes <= 0) return 0.0;  // a dense model's expert group sends nothing
    if (m.emulate_gbps > 0 && m.emulate_dp)
      return emulated_link_seconds(op, size_t(bytes), n, m.emulate_gbps, m.emulate_latency_us);
    return ring_seconds(op, bytes, n, link);
  };
  auto dp_seconds = [&](LinkOp op, double bytes) {  // over dp·cp: cp ranks share parameters
    return group_seconds(op, bytes, l.reduce_ranks(), place.dp_link);
  };
  auto both_seconds = [&](LinkOp op, double dense_bytes, double expert_bytes) {
    return dp_seconds(op, dense_bytes) +
           group_seconds(op, expert_bytes, l.expert_reduce_ranks(), place.dp_link);
  };
  // trident lays its buckets out in fp32 elements (padded_bucket_layout): the first holds
  // first_bucket_mb MiB / 4 parameters, which the reduction moves at grad_comm_bytes each and
  // ZeRO's gather at param_bytes (the last bucket to reduce, the first to gather).
  const double first_bucket_params = std::min(params_local, m.first_bucket_mb * 1024 * 1024 / 4);
  const double first_bucket = first_bucket_params * m.grad_comm_bytes;
  // Note [Plan reductions per micro-batch] (src/plan/memory.cpp): a round per micro-batch.
  const double rounds = l.zero >= 2 && l.zero_reduce == "micro_batch" ? micro : 1;
  double reduce = 0, gather = 0, reduce_exposed = 0, gather_exposed = 0, slowdown = 0;
  double replicate_reduce = 0, replicate_exposed = 0, gathers_per_step = 0;
  if (l.zero < 3) {
    const LinkOp reduce_op = l.zero > 0 ? LinkOp::kReduceScatter : LinkOp::kAllReduce;
    const double round = both_seconds(reduce_op, dense_grad, expert_grad);
    reduce = rounds * round;
    const double last_bucket = dp_seconds(reduce_op, first_bucket);
    gather = l.zero > 0 ? both_seconds(LinkOp::kAllGather, dense_local * param_bytes,
                                       expert_local * param_bytes)
                        : 0.0;
    gathers_per_step = l.zero > 0 ? 1 : 0;
    reduce_exposed = reduce, gather_exposed = gather;
    if (m.overlap && l.reduce_ranks() > 1) {
      const double window = first_backward;  // stage 0's last backward: the step's last compute
      // Earlier rounds hide behind their backward and the next micro-batch's forward.
      const double earlier = first_backward + first_forward;
      reduce_exposed =
          std::max(last_bucket, round - window) + (rounds - 1) * std::max(0.0, round - earlier);
      slowdown =
          hw.overlap_slowdown * (std::min(round, window) + (rounds - 1) * std::min(round, earlier));
      if (l.zero > 0) {
        const double first_gather =
            dp_seconds(LinkOp::kAllGather, first_bucket_params * param_bytes);
        gather_exposed = std::max(std::min(first_gather, gather), gather - first_forward);
        slowdown += hw.overlap_slowdown * std::min(gather, first_forward);
      }
    }
  } else {  // ZeRO-3 and HSDP (Note [Plan model], Note [Plan ZeRO-3])
    const int S = l.shard_ranks(), R = l.replicas();
    auto shard_seconds = [&](LinkOp op, double bytes) {
      return group_seconds(op, bytes, S, place.shard_link);
    };
    auto both_shard_seconds = [&](LinkOp op, double dense_bytes, double expert_bytes) {
      return shard_seconds(op, dense_bytes) +
             group_seconds(op, expert_bytes, l.expert_shard_ranks(), place.shard_link);
    };
    auto replicate_seconds = [&](double bytes) {
      return group_seconds(LinkOp::kAllReduce, bytes, R, place.replicate_link);
    };
    const std::vector<double> units = stage_units(m, l, 0);
    const double stage_gather = both_shard_seconds(LinkOp::kAllGather, dense_local * param_bytes,
                                                   expert_local * param_bytes);
    const double first_f = shard_seconds(LinkOp::kAllGather, units.front() * param_bytes);
    const double first_b = shard_seconds(LinkOp::kAllGather, units.back() * param_bytes);
    const bool kept_for_step = l.zero3_gather == "step" && (l.pp > 1 || l.accum > 1);
    const double forward_gathers = kept_for_step ? 1 : micro;
    const double backward_gathers = kept_for_step || !l.reshard_after_forward ? 0 : micro;
    gathers_per_step = forward_gathers + backward_gathers;
    gather = gathers_per_step * stage_gather;
    const double scatter_round =
        both_shard_seconds(LinkOp::kReduceScatter, dense_grad, expert_grad);
    const double scatter = rounds * scatter_round;  // HSDP's replicas: the last round only
    replicate_reduce = replicate_seconds(dense_grad / S + expert_grad / l.expert_shard_ranks());
    reduce = scatter + replicate_reduce;
    double chain_exposed = reduce;  // reduce-scatter, then the shard's all-reduce over replicas
    gather_exposed = gather;
    if (m.overlap && l.reduce_ranks() > 1) {
      const double F = first_forward, B = first_backward;
      // The last backward's thread gathers and reduces: the reduction hides in what is left.
      const double backward_gather = backward_gathers > 0 ? stage_gather : 0;
      const double window = std::max(0.0, B - backward_gather);
      gather_exposed =
          forward_gathers * std::max(std::min(first_f, stage_gather), stage_gather - F) +
          backward_gathers * std::max(std::min(first_b, stage_gather), stage_gather - B);
      const double last_bucket =
          shard_seconds(LinkOp::kReduceScatter, first_bucket) + replicate_seconds(first_bucket / S);
      // Earlier rounds (zero_reduce micro_batch) hide behind what their backward and the next
      // forward leave after that micro-batch's gathers.
      const double earlier = std::max(0.0, B + F - stage_gather * gathers_per_step / micro);
      const double last_round = reduce - (rounds - 1) * scatter_round;
      chain_exposed = std::max(last_bucket, last_round - window) +
                      (rounds - 1) * std::max(0.0, scatter_round - earlier);
      slowdown = hw.overlap_slowdown *
                 (forward_gathers * std::min(stage_gather, F) +
                  backward_gathers * std::min(stage_gather, B) + std::min(last_round, window) +
                  (rounds - 1) * std::min(scatter_round, earlier));
    }
    // The chain's exposed time split by the two collectives' shares of it.
    reduce_exposed = reduce > 0 ? chain_exposed * scatter / reduce : 0;
    replicate_exposed = reduce > 0 ? chain_exposed * replicate_reduce / reduce : 0;
  }
  // AdamW over the rank's (ZeRO: its shard's) parameters: fp32 reads p, g, m, v and writes p,
  // m, v (28 B/param); mixed precision also reads the fp32 master and writes the bf16 copy
  // (34 B). The global norm reads the gradients once more (4 B).
  const double opt_params =
      l.zero > 0 ? dense_local / l.shard_ranks() + expert_local / l.expert_shard_ranks()
                 : params_local;
  const double opt_bw = kernel_bandwidth(hw, place, hw.optimizer_gbytes_per_s);
  const double optimizer = opt_params * (hw.dtype == "fp32" ? 32.0 : 38.0) / opt_bw;
  // The tied wte's fp32 gradient (ZeRO: this rank's shard of its own bucket) all-reduced
  // between the first and the last stage, after the data-parallel reduction.
  double tied = 0;
  if (m.block.tied_head && l.pp > 1) {
    const double wte = double(padded_vocab(m, l)) / l.tp * m.d_model;
    const double bytes = (l.zero > 0 ? wte / l.shard_ranks() : wte) * 4;
    tied = ring_seconds(LinkOp::kAllReduce, bytes, 2, place.pp_link);
  }

  p.time = {{"gemm", micro * slow.gemm},
            {"attention", micro * slow.attention},
            {"memory_bound", micro * slow.memory_bound},
            {"tp_comm_exposed", micro * slow.tp_comm},
            {"cp_comm_exposed", micro * slow.cp_comm},
            {"moe_all_to_all_exposed", micro * slow.a2a},
            {"pp_p2p", micro * slow.pp_p2p},
            {"recompute", micro * slow.recompute},
            {"bubble", bubble},
            {l.zero > 0 ? "reduce_scatter_exposed" : "dp_allreduce_exposed", reduce_exposed},
            {"hsdp_allreduce_exposed", replicate_exposed},
            {"all_gather_exposed", gather_exposed},
            {"overlap_slowdown",
             slowdown + hw.overlap_slowdown * micro * slow.cp_hidden +
                 (hw.tp_overlap_slowdown >= 0 ? hw.tp_overlap_slowdown : hw.overlap_slowdown) *
                     micro * slow.tp_hidden},
            {"tied_embedding_allreduce", tied},
            {"optimizer", optimizer}};
  if (!m.block.has_moe())  // a dense model's split stays as it was
    p.time.erase(std::find_if(p.time.begin(), p.time.end(), [](const PlanTerm& t) {
      return t.name == "moe_all_to_all_exposed";
    }));
  for (const PlanTerm& t : p.time) p.step_s += t.value;
  p.info = {{"dp_reduce_s", reduce},
            {"dp_all_gather_s", gather},
            {"hsdp_allreduce_s", replicate_reduce},
            {"all_gathers_per_step", gathers_per_step},
            {"cp_comm_hidden_s", micro * slow.cp_hidden},
            {"tp_comm_s", micro * slow.tp_total},
            {"tp_comm_hidden_s", micro * slow.tp_hidden},
            {"bubble_fraction", f},
            {"micro_batch_s", slow_mb},
            {"forward_s", micro * slow.forward},
            {"backward_s", micro * slow.backward},
            {"rank_cores", place.cores}};
  const double tokens = double(l.micro_batch) * l.accum * l.dp * m.seq_len;
  // Attention's causal half, as its time is counted (llm.c's count): the full square
  // (train_flops_per_token, PaLM's and train's) would credit a flash kernel with twice the
  // FLOPs it runs, which at long sequences reads as an MFU no kernel reaches (docs/plan.md,
  // "Context parallelism").
  p.model_flops_per_step = gpt_config(m, l).llmc_flops_per_token(m.seq_len) * tokens;
  p.tokens_per_s = tokens / p.step_s;
  p.tflops_per_gpu = p.model_flops_per_step / p.step_s / l.world() / 1e12;
  // MFU as train and bench report it: never above 1 (NaN, printed n/a, if it came out so).
  p.mfu = mfu_or_nan(p.tflops_per_gpu * 1e12, place.peak_flops);
  return p;
}

}  // namespace trident
