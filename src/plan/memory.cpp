// The plan model's memory per rank and its parameter count (Note [Plan memory]).
//
// Note [Plan memory]
// Memory is counted on the pipeline stage that holds the most (the first: most micro-batches in
// flight and the embedding; or the last: the head's logits), buffer by buffer as trident
// allocates (src/model/gpt_slots.cpp, src/train/trainer.cpp), so a test can build a GPT and
// compare bytes. Slots come from max_in_flight (trident/pipeline.h) and bf16 sizes from
// GPT::kBf16Buffer: the functions the model and trainer allocate by, so the two cannot drift.
//
// The terms:
//   params      the stage's parameters of one tp rank: fp32 4 B; bf16 2 B (the master copy is
//               optimizer state);
//   grads       fp32 4 B per parameter (mixed precision keeps fp32 main gradients too); ZeRO-1
//               adds the reduced shard (1/dp); ZeRO-2 keeps only the shard plus two buckets in
//               flight (Megatron's and DeepSpeed's accounting, Rajbhandari et al. 2020 §5);
//   optimizer   AdamW's m and v, 8 B per parameter, plus the 4 B fp32 master with bf16;
//               ZeRO-1 and -2 keep 1/dp of it;
//   activations per micro-batch slot, as GPT's constructor allocates them: the 13 buffers of
//               each block that the recompute mode keeps (block_sizes, block_kept), the
//               block input, token ids, and on the head's chunk the final LayerNorm, logits
//               and losses; slots = max_in_flight of the schedule (trident/pipeline.h), the
//               same function the trainer sizes them with;
//   scratch     buffers shared by all slots: the recomputed block's dropped buffers, the
//               backward's gradient buffers and the attention scratch.
// A mixture (Note [Plan mixture of experts] in src/plan/model.cpp) shows its routed experts'
// expert_params, expert_grads, expert_optimizer: E/ep experts per layer, sharded by ZeRO over
// dp_shard·cp/ep (all of dp·cp/ep without HSDP); a mixture layer keeps the block's buffers but
// the dense MLP's fch and fch_gelu, and its own, per slot in activations, shared in scratch
// (Note [Plan mixture memory]). With
// parallel.tp_overlap on and SP, the rings' piece buffer, [N/tp, widest local row] fp32
// (TpOverlap's rows_), is scratch too.
// Sizes are elements × 4 B for fp32. The bf16 path holds in 2 B what GEMMs, attention and GELU
// read (GPT::kBf16Buffer) and keeps the residual stream, the stage input, LayerNorm statistics,
// the attention state and the scratch between them in 4 B (docs/plan.md compares the bytes per
// layer with Korthikanti et al. 2022). With tp > 1 the bf16 terms are the same buffers at the
// tp sizes, plus Note [bf16 with tp]'s scratch (tests/mpi/test_tp_bf16.cpp compares).
//
// Note [Plan ZeRO-3]
// ZeRO-3 (parallel.zero: 3, Rajbhandari et al. 2020's P_os+g+p; PyTorch FSDP's FULL_SHARD)
// shards a unit's parameters, gradients and AdamW state over dp_shard ranks (all of dp, or the
// HSDP split dp_replicate × dp_shard). A unit is one block, or wte (with the tied head), wpe,
// or the head (final norm + untied LM head): stage_units. Per rank and stage, Ψ its parameters
// (of its tp rank), S = dp_shard, E the bytes the GEMMs read a parameter in (bf16 2, fp32 4).
//
//   sharded     16·Ψ/S: the fp32 master (fp32: the parameter itself), m and v, and the fp32
//               gradient shard; counted in params (fp32), optimizer (master, m, v) and grads;
//
//   pool        full parameters only while a unit runs: one group ahead, so the largest two
//               neighbouring groups (zero3_pool); with reshard_after_forward false, or
//               zero3_gather step under pp or accumulation, the whole stage's, ZeRO-2's;
//               a unit's full fp32 gradient from its backward until its reduce-scatter is done:
//               two buckets held plus the largest gradient written whole, at most 4·Ψ
//               (Note [Bounded gradient memory] in src/train/zero.h, as ZeRO-2).
//
// So per rank ≈ 16·Ψ/S + E·(two groups) + 2·bucket_bytes + 4·U + activations; HSDP's
// replicas keep the same shard (optimizer state is not sharded over dp_replicate). Traffic and
// its overlap: Note [Plan model].
//
// Assumed, where the trainer's ZeRO-3 was not yet there to read: a tied wte is one unit
// (gathered once per pass, also serving the head).
//
// Note [Plan reductions per micro-batch]
// Under accumulation (m micro-batches) the micro-batches' gradients must sum somewhere, as the
// trainer's parallel.zero_reduce says (Note [ZeRO-2 and accumulation] in src/train/zero.h):
// step sums them in the whole buffer (4·Ψ resident, one reduce-scatter of Ψ per step);
// micro_batch reduce-scatters each micro-batch's into the shard (ZeRO-2/3's bounded gradients,
// on a GPU the pool; m reduce-scatters, each hidden behind its own backward and the next
// forward, the last behind its backward alone). The search tries both where accum > 1.
//
// Note [Plan ZeRO-3 on a device]
// A GPU holds what the trainer allocates there (Note [Unit slots] in src/train/zero3_pool.h,
// zero3_device_pool_bytes in src/train/memory_plan.cpp): device memory is sized once, so the
// pool is a slot of its own for each of wte, wpe and the head, and three block slots of the
// largest block, not the two groups the host's pages hold at most (Llama-3-8B: 1.70 G
// parameters against 0.74 G); everything where units stay gathered. The slots are 4 B a
// parameter in bf16 too, beside the shard's bf16 copy and a tied head's cast. ZeRO-2/3's
// gradients: the device pool (Note [When gradients are pooled]) where it applies, else whole.
//
// Note [Plan checkpoint snapshot]
// An asynchronous save (checkpoint.async) first copies what a synchronous save writes from
// this rank: its fp32 parameters (ZeRO-3: its shard) and Adam's m and v (ZeRO-1/2/3: its
// piece), 4 B each: 12·Ψ at ZeRO-0, 4·Ψ + 8·Ψ/S at ZeRO-1/2, 12·Ψ/S at ZeRO-3 (Ψ the stage's
// parameters of one tp rank, S = dp_shard·cp; experts over their own shard ranks). The copy
// sits in host memory allocated once: on a cpu that is the rank's own memory, so it joins the
// memory terms and the fit; on a gpu it is pinned host memory, reported per node apart from
// the device's. One save blocks for bytes / host_copy_bytes_per_s; the write is background.

// Note [Plan attention state]
// What attention saves per layer for backward: a fused kernel (attention_tflops > 0) or a
// blockwise one saves the output and one log-sum-exp per row and head, B·NH·T/cp floats
// (fused_attention_saved_floats); the CPU's T×T op saves the B·NH·T² probabilities. The CPU
// runs blockwise under context parallelism and from kBlockwiseAttentionFromT tokens on, a copy
// of the CPU backend's threshold (that one decides), saving B·NH·max(T, 64²) so that buffers
// stay monotone in T; its scratch is as large (delta). A fused backward's scratch is the dq
// accumulators, 4·N·C/tp floats, but under cp only delta.
#include <fmt/format.h>

#include <algorithm>

#include "plan/plan_parts.h"
#include "trident/check.h"
#include "trident/pipeline.h"

namespace trident {

bool blockwise_attention(const PlanModel& m, const PlanLayout& l, const Hardware& hw) {
  return hw.attention_tflops > 0 || l.cp > 1 || m.seq_len >= kBlockwiseAttentionFromT;
}

int padded_vocab(const PlanModel& m, const PlanLayout& l) {
  return GPTConfig::pad_vocab(m.vocab, l.tp);
}

GPTConfig gpt_config(const PlanModel& m, const PlanLayout& l) {
  GPTConfig cfg = m.block;
  cfg.layers = m.layers;
  cfg.channels = m.d_model;
  cfg.heads = m.heads;
  cfg.vocab = m.vocab;
  cfg.padded_vocab = padded_vocab(m, l);
  cfg.max_seq_len = m.seq_len;
  return cfg;
}

namespace {

// Parameters of block `layer` on one rank, and of them the routed experts'.
struct BlockParams {
  double all = 0, experts = 0;
};
BlockParams block_params(const GPTConfig& cfg, const PlanLayout& l, int layer) {
  const double C = cfg.channels, tp = l.tp, QKV = cfg.qkv_rows(), FC = cfg.fc_rows();
  const double F = cfg.hidden(), bias = cfg.bias ? 1 : 0, norm = cfg.norm_has_bias() ? 2 : 1;
  // Per block (gpt_param_layout): qkv [QKV, C] (q | k | v, kv_heads of them), attproj [C, C],
  // fc [FC, C] (SwiGLU: gate | up), fcproj [C, F], split over tp; biases QKV/tp, C, FC/tp, C;
  // two norms of C weights (+ C shifts with LayerNorm and biases).
  const double attention = (QKV * C + C * C) / tp + bias * (QKV / tp + C) + 2 * norm * C;
  if (!cfg.is_moe(layer)) return {attention + (FC * C + F * C) / tp + bias * (FC / tp + C), 0};
  // A mixture (Note [Expert tensors]): E/ep experts of [fc_rows(Fe), C] and [C, Fe], whole over
  // tp (replicated, Megatron's expert tensor parallel 1); the router [E, C], the sigmoid's
  // choice bias [E], the shared experts and their gate, replicated.
  const double E = cfg.moe.experts, Fe = cfg.expert_width(), Fs = cfg.shared_width();
  const double experts = E / l.ep * (cfg.fc_rows_of(int(Fe)) + Fe) * C;
  const double router = E * C + (cfg.moe.router == MoeRouter::kSigmoid ? E : 0);
  const double shared = Fs > 0 ? (cfg.fc_rows_of(int(Fs)) + Fs) * C : 0;
  const double gate = cfg.moe.shared_gate && Fs > 0 ? C : 0;
  return {attention + experts + router + shared + gate, experts};
}

// Note [Plan mixture memory]
// What a mixture layer allocates (Note [Mixture memory] in src/model/moe.cpp), 4 B an element in
// both precisions (it runs in fp32). Per slot: the router's [N, E] logits and scores, [N]
// log-sum-exp, k·N choices' expert, row, weight and token, the summary, k·N rows of C in and
// out, at ep > 1 R = ep·N·min(k, E/ep) rows of C received, with recompute none R rows of
// fc_rows(Fe) and Fe, the shared experts' N rows. Once for the model: backward's gradients,
// ep's staging and outputs, under mlp or full the R rows of h and act, under full the slots. N:
// this rank's rows.
struct MoeLayerBytes {
  double slot = 0, shared = 0;  // one mixture layer's per slot; what every mixture layer shares
  double model_slot = 0;        // the GPT's per slot: the choice counts on the device [E]
  double model_layer = 0;       // the GPT's per mixture layer: the sigmoid's bias steps [E]
};
MoeLayerBytes moe_layer_bytes(const GPTConfig& cfg, double N, int ep, bool keep_hidden) {
  MoeLayerBytes b;
  if (!cfg.has_moe()) return b;
  const MoeConfig& moe = cfg.moe;
  const double E = moe.experts, C = cfg.channels, M = N * moe.top_k;
  const double R = N * ep * std::min(moe.top_k, moe.experts / ep);
  const double Fe = cfg.expert_width(), FCe = cfg.fc_rows_of(cfg.expert_width());
  const double Fs = cfg.shared_width(), FCs = cfg.fc_rows_of(cfg.shared_width());
  const double wide = ep > 1 ? 1 : 0, shared = Fs > 0 ? 1 : 0;
  const double hidden = R * (FCe + Fe);  // h, act
  // logits, probs, lse; topw, top, pos, send_token; the summary's 3(E+1) doubles; xs, ys; xr;
  // h, act (none); sh_h, sh_act, sh_y, sh_g.
  b.slot = 2 * N * E + N + 4 * M + 6 * (E + 1) + 2 * M * C + wide * R * C +
           (keep_hidden ? hidden : 0) + shared * (N * (FCs + Fs + C) + (moe.shared_gate ? N : 0));
  // h, act (mlp, full); yr; dys, dact, dh, dxr; dyr, peer, dxs; dlogits, dtopw, dx2; dsh_y,
  // dsh_act, dsh_h, dgate.
  b.shared = (keep_hidden ? 0 : hidden) + wide * R * C + M * C + R * (Fe + FCe + C) +
             wide * (2 * R * C + M * C) + N * E + M + N * C + shared * N * (C + Fs + FCs + 1);
  b.slot *= 4, b.shared *= 4;
  b.model_slot = 4 * E;
  b.model_layer = moe.router == MoeRouter::kSigmoid ? 4 * E : 0;
  return b;
}

}  // namespace

std::vector<double> stage_units(const PlanModel& m, const PlanLayout& l, int s) {
  const int chunks = l.schedule == "interleaved" ? l.v : 1;
  const StageSpec stage = pipeline_stage(m.layers, l.pp, s, {}, chunks);
  const GPTConfig cfg = gpt_config(m, l);
  const double C = m.d_model, tp = l.tp, norm = cfg.norm_has_bias() ? 2 : 1;
  const double wte = double(padded_vocab(m, l)) / tp * C;
  std::vector<double> units;
  if (stage.has_embedding) {
    units.push_back(wte);
    if (cfg.has_wpe()) units.push_back(double(m.seq_len) * C);
  }
  for (int b = 0; b < stage.num_layers; ++b)
    units.push_back(block_params(cfg, l, stage.global_layer(b)).all);
  // The head: the final norm and the LM head's weight: the tied wte (a copy on a last stage
  // without the embedding; on the embedding's stage it is wte's unit), or an untied one.
  if (stage.has_head) units.push_back(norm * C + (cfg.tied_head && stage.has_embedding ? 0 : wte));
  return units;
}

double stage_expert_params(const PlanModel& m, const PlanLayout& l, int s) {
  const int chunks = l.schedule == "interleaved" ? l.v : 1;
  const StageSpec stage = pipeline_stage(m.layers, l.pp, s, {}, chunks);
  const GPTConfig cfg = gpt_config(m, l);
  double n = 0;
  for (int b = 0; b < stage.num_layers; ++b)
    n += block_params(cfg, l, stage.global_layer(b)).experts;
  return n;
}

// What ZeRO-3's pool holds at most on stage s, as the trainer schedules it (zero3_pool_bytes in
// src/train/memory_plan.cpp, measured in docs/perf.md): the parameters of two neighbouring
// groups of forward (the embedding {wte, wpe}, each block, the head with a tied wte), the one
// running and the one gathered ahead, and a tied wte kept from the embedding to the head; and
// the largest gradient written whole (a tied wte on a stage with both ends reports its gradient
// in bucket-sized row pieces, so the buckets bound it: Note [Head gradient in pieces] in
// src/train/tied_embedding.h).
Zero3Pool zero3_pool(const PlanModel& m, const PlanLayout& l, int s) {
  const int chunks = l.schedule == "interleaved" ? l.v : 1;
  const StageSpec stage = pipeline_stage(m.layers, l.pp, s, {}, chunks);
  const GPTConfig cfg = gpt_config(m, l);
  const std::vector<double> units = stage_units(m, l, s);
  const bool both = stage.has_embedding && stage.has_head;
  std::vector<double> groups;
  size_t k = 0;
  if (stage.has_embedding) {
    groups.push_back(units[k++]);
    if (cfg.has_wpe()) groups.back() += units[k++];
  }
  for (int b = 0; b < stage.num_layers; ++b) groups.push_back(units[k++]);
  if (stage.has_head) groups.push_back(units[k] + (cfg.tied_head && both ? units[0] : 0));
  // A tied wte on a stage with both ends stays gathered from the embedding to the head, beside
  // every pair of blocks (the trainer keeps a unit a later group of the pass reads).
  const double kept = cfg.tied_head && both ? units[0] : 0;
  Zero3Pool pool;
  for (size_t g = 0; g < groups.size(); ++g) {
    const bool blocks = both && g > 0 && g + 2 < groups.size();
    pool.params = std::max(
        pool.params, groups[g] + (g + 1 < groups.size() ? groups[g + 1] : 0) + (blocks ? kept : 0));
  }
  for (size_t u = 0; u < units.size(); ++u)
    if (!(u == 0 && stage.has_embedding && cfg.tied_head && both))
      pool.whole_grad = std::max(pool.whole_grad, units[u]);
  // Note [Plan ZeRO-3 on a device]: the units before the blocks and after them have slots of
  // their own, the blocks share three; the gradient pool's (grad_pool_floats in
  // src/train/grad_pool.cpp) the same own slots and two of a block.
  const size_t first_block = stage.has_embedding ? (cfg.has_wpe() ? 2 : 1) : 0;
  double block = 0, own = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    const bool is_block = u >= first_block && u < first_block + size_t(stage.num_layers);
    if (is_block) block = std::max(block, units[u]);
    else own += units[u];
  }
  pool.device_params = own + std::min(stage.num_layers, 3) * block;
  pool.device_grads = own + std::min(stage.num_layers, 2) * block;
  if (cfg.tied_head && stage.has_head)
    pool.tied_cast = double(padded_vocab(m, l)) / l.tp * m.d_model;
  return pool;
}

double stage_params(const PlanModel& m, const PlanLayout& l, int s) {
  double n = 0;
  for (double u : stage_units(m, l, s)) n += u;  // integers below 2^53: the sum is exact
  return n;
}

double snapshot_bytes(const PlanModel& m, const PlanLayout& l, int s) {
  const double params = stage_params(m, l, s), experts = stage_expert_params(m, l, s);
  const double piece =
      l.zero > 0 ? (params - experts) / l.shard_ranks() + experts / l.expert_shard_ranks() : params;
  return 4 * ((l.zero == 3 ? piece : params) + 2 * piece);  // params, m, v
}

std::string layout_problem(const PlanModel& m, const PlanLayout& l) {
  if (l.dp < 1 || l.tp < 1 || l.pp < 1 || l.v < 1 || l.micro_batch < 1 || l.accum < 1)
    return "sizes must be at least 1";
  if (l.zero < 0 || l.zero > 3) return fmt::format("zero={}: must be 0, 1, 2 or 3", l.zero);
  if (l.dp_shard < 0 || (l.dp_shard > 0 && l.dp % l.dp_shard != 0))
    return fmt::format("dp_shard={} must divide dp={}", l.dp_shard, l.dp);
  if (l.zero != 3 && l.dp_shard > 0 && l.dp_shard != l.dp)
    return fmt::format("dp_shard={} < dp={} (HSDP) needs zero=3", l.dp_shard, l.dp);
  if (l.zero3_gather != "micro_batch" && l.zero3_gather != "step")
    return fmt::format("zero3_gather={}: must be micro_batch or step", l.zero3_gather);
  if (l.zero_reduce != "step" && l.zero_reduce != "micro_batch")
    return fmt::format("zero_reduce={}: must be step or micro_batch", l.zero_reduce);
  // As the trainer refuses (DataParallel::check_deck).
  if (l.zero_reduce == "micro_batch" && (l.zero < 2 || l.v > 1 || l.schedule == "zb-h1"))
    return fmt::format("zero_reduce=micro_batch needs zero 2 or 3 (zero={}), one chunk per stage "
                       "(v={}) and a one-pass backward (schedule={})",
                       l.zero, l.v, l.schedule);
  if (l.cp < 1) return fmt::format("cp={}: must be at least 1", l.cp);
  if (l.cp_comm != "ring" && l.cp_comm != "allgather")
    return fmt::format("cp_comm={}: must be ring or allgather", l.cp_comm);
  if (m.seq_len % (2 * l.cp) != 0)  // Note [Plan context parallelism] in src/plan/model.cpp
    return fmt::format("cp={}: model.seq_len {} is not a multiple of 2·cp = {} (each rank holds "
                       "chunks r and 2·cp−1−r of every sequence)",
                       l.cp, m.seq_len, 2 * l.cp);
  if (l.cp > 1 && l.sequence_parallel && l.tp > 1 && m.seq_len / (2 * l.cp) % l.tp != 0)
    return fmt::format("cp={} with sequence parallelism over tp={}: a chunk of seq_len/(2·cp) = "
                       "{} tokens is not divisible by tp",
                       l.cp, l.tp, m.seq_len / (2 * l.cp));
  // Note [Plan mixture of experts] in src/plan/model.cpp.
  const int experts = m.block.moe.experts;
  if (l.ep < 1) return fmt::format("ep={}: must be at least 1", l.ep);
  if (l.ep > 1 && experts == 0) return fmt::format("ep={}: the model has no experts", l.ep);
  if (l.ep > 1 && experts % l.ep != 0)
    return fmt::format("ep={} does not divide model.moe.experts {}", l.ep, experts);
  if (l.reduce_ranks() % l.ep != 0)
    return fmt::format("ep={} does not divide dp·cp = {} (ep ranks are taken from dp × cp)", l.ep,
                       l.reduce_ranks());
  // Note [Experts with HSDP] (src/train/zero3.h): with HSDP ep is taken within a replica.
  if (l.ep > 1 && l.replicas() > 1 && l.shard_ranks() % l.ep != 0)  // as check_moe_deck
    return fmt::format("ep={} with HSDP does not divide dp_shard·cp = {} (the experts are sharded "
                       "within a replica)",
                       l.ep, l.shard_ranks());
  if (experts > 0 && l.tp > 1 && !l.sequence_parallel)
    return fmt::format("tp={} with experts needs sequence parallelism (sp=1): the experts are "
                       "replicated over tp and each tp rank routes its own tokens",
                       l.tp);
  try {
    check_tensor_parallel(gpt_config(m, l), l.tp, l.sequence_parallel, m.seq_len);
    const PipeSchedule schedule = parse_pipe_schedule(l.schedule, "schedule");
    check_pipe_schedule(schedule, l.pp, l.accum, l.v, m.layers);
    if (l.pp > 1 || l.v > 1) (void)pipeline_stage(m.layers, l.pp, 0, {}, l.v);
    parse_recompute(l.recompute);
    if (splits_backward(schedule) && l.recompute != "none")
      return fmt::format("schedule {} needs recompute=none", l.schedule);
    // As check_moe_deck refuses them (src/train/model_options.cpp).
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

ModelStates model_state_bytes(const PlanModel& m, const PlanLayout& l, const Hardware& hw, int s) {
  const bool fp32 = hw.dtype == "fp32";
  const double E = fp32 ? 4 : 2;  // a parameter as the GEMMs read it
  const double params = stage_params(m, l, s);
  // The routed experts' shard over the expert-dp ranks, the rest over dp·cp (dp_shard·cp).
  const double experts = stage_expert_params(m, l, s), dense = params - experts;
  const double shard = l.zero > 0 ? dense / l.shard_ranks() : 0;
  const double expert_shard = l.zero > 0 ? experts / l.expert_shard_ranks() : 0;
  const double bucket = m.bucket_mb * 1024 * 1024;
  ModelStates st;
  // Note [Plan reductions per micro-batch]: whether backward's gradients are reduced as it goes
  // (one micro-batch, or a round per micro-batch), or summed whole over the micro-batches.
  const bool rounds = l.accum == 1 || l.zero_reduce == "micro_batch";
  st.params = dense * E;
  st.grads = dense * 4 + shard * 4;
  if (l.zero == 2) st.grads = shard * 4 + (rounds ? std::min(params * 4, 2 * bucket) : dense * 4);
  // Note [Plan ZeRO-3 on a device]: a GPU's ZeRO-2/3 gradients, pooled or whole.
  const bool gpu = hw.kind == "gpu";
  const bool pooled =
      m.overlap && rounds && !splits_backward(parse_pipe_schedule(l.schedule, "schedule"));
  st.optimizer = (l.zero > 0 ? shard : dense) * (fp32 ? 8 : 12);
  st.expert_params = experts * E;
  st.expert_grads = experts * 4 + expert_shard * 4;
  if (l.zero == 2) st.expert_grads = expert_shard * 4;  // the buckets in flight are in grads
  if (l.zero == 2 && gpu) {  // the pool's block slots hold a block's experts too
    st.grads = shard * 4 + (pooled ? zero3_pool(m, l, s).device_grads : dense) * 4;
    st.expert_grads = expert_shard * 4 + (pooled ? 0 : experts * 4);
  }
  st.expert_optimizer = (l.zero > 0 ? expert_shard : experts) * (fp32 ? 8 : 12);
  if (l.zero == 3) {  // Note [Plan ZeRO-3]; the gathered pool (experts included) is in params
    const Zero3Pool pool = zero3_pool(m, l, s);
    const bool kept =
        !l.reshard_after_forward || (l.zero3_gather == "step" && (l.pp > 1 || l.accum > 1));
    st.params = (fp32 ? shard * 4 : 0) + (kept ? params : std::min(params, pool.params)) * E;
    st.grads =
        shard * 4 + (rounds ? std::min(params * 4, 2 * bucket + pool.whole_grad * 4) : params * 4);
    if (gpu) {  // Note [Plan ZeRO-3 on a device]
      st.params = (fp32 ? shard * 4 : shard * 2 + pool.tied_cast * 2) +
                  (kept ? params : std::min(params, pool.device_params)) * 4;
      st.grads = shard * 4 + (pooled ? pool.device_grads : params) * 4;
    }
    // The experts' shard: fp32 is the master; a GPU's bf16 copy of the shards holds them too.
    st.expert_params = fp32 ? expert_shard * 4 : gpu ? expert_shard * 2 : 0;
    st.expert_grads = expert_shard * 4;
  }
  return st;
}

ZeroCapacity zero_capacity(const PlanModel& model, const Hardware& hw, int zero, int devices) {
  ZeroCapacity c;
  c.zero = zero, c.devices = devices;
  const int sharing = hw.kind == "cpu" ? std::min(devices, hw.devices_per_node) : 1;
  c.capacity_bytes = hw.memory_gb * 1e9 / sharing;
  PlanModel m = model;
  PlanLayout l;
  l.dp = devices, l.zero = zero;
  auto states = [&](int layers) {
    m.layers = layers;
    return model_state_bytes(m, l, hw, 0).total();
  };
  if (states(1) > c.capacity_bytes) return c;  // not even one block
  // The bytes grow with the layers: double until they do not fit, then bisect.
  int lo = 1, hi = 2;
  while (hi < (1 << 28) && states(hi) <= c.capacity_bytes) lo = hi, hi *= 2;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (states(mid) <= c.capacity_bytes ? lo : hi) = mid;
  }
  c.layers = lo;
  c.state_bytes = states(lo);
  c.params = stage_params(m, l, 0);
  return c;
}

std::vector<PlanTerm> stage_memory_terms(const PlanModel& m, const PlanLayout& l,
                                         const Hardware& hw, int s) {
  if (!layout_problem(m, l).empty() || s < 0 || s >= l.pp) return {};
  const bool fp32 = hw.dtype == "fp32";
  const double E = fp32 ? 4 : 2;
  // A rank holds T/cp tokens of each sequence: every per-token buffer is that many rows.
  const double B = l.micro_batch, T = m.seq_len, Tl = l.seq_local(m.seq_len), C = m.d_model;
  const double tp = l.tp, N = B * Tl, Cl = C / tp, NHl = double(m.heads) / tp;
  const GPTConfig cfg = gpt_config(m, l);  // the family's widths (GPT::block_sizes)
  const double QKVl = cfg.qkv_rows() / tp, FCl = cfg.fc_rows() / tp, Fl = cfg.hidden() / tp;
  const bool sp = l.sequence_parallel && l.tp > 1;
  const double Nr = sp ? N / tp : N, Vl = double(padded_vocab(m, l)) / tp;
  const bool blockwise = blockwise_attention(m, l, hw);  // Note [Plan attention state]
  const double txt = kBlockwiseAttentionFromT - 1;       // the CPU's T×T op up to this T
  const double att_saved =
      !blockwise ? B * NHl * T * T
      : hw.attention_tflops > 0 || l.cp > 1
          ? double(fused_attention_saved_floats(int(B), int(Tl), int(NHl)))
          : B * NHl * std::max(T, txt * txt);  // the CPU's: never below the T×T op's size
  // dq; delta (with cp the blocks' backward needs only delta: GPT::make_scratch)
  const double att_scratch = hw.attention_tflops > 0 && l.cp == 1 ? 4 * N * Cl : att_saved;
  // Context parallelism's exchange buffers (Note [Plan context parallelism]), CpAttention's, in
  // fp32 in both precisions (bf16 widens: Note [Widening at the bf16 boundary]), in K/V blocks
  // of this rank's rows: the host ring's two K/V, two dK/dV and the received dK/dV; a device's
  // grouped ring two of K/V pairs, one dK/dV and the received; allgather this rank's K/V, the
  // received dK/dV and the whole sequence of K/V and of dK/dV.
  const double kv_block = 2 * N * cfg.kv_head_count() / tp * cfg.head_size();
  const double ring_blocks = hw.kind == "gpu" ? 6 : 5;
  const double cp_buffers = l.cp == 1             ? 0
                            : l.cp_comm == "ring" ? 4 * ring_blocks * kv_block
                                                  : 4 * (2 + 2 * l.cp) * kv_block;
  // block_sizes() in element counts; bf16 runs hold GPT::kBf16Buffer's in 2 B, the rest
  // (residual stream, LayerNorm statistics, attention state) in 4 B.
  const double sizes[GPT::kBlockBuffers] = {N * C, Nr, Nr, N * QKVl, att_saved, N * Cl, Nr * C,
                                            N * C, Nr, Nr, N * FCl,  N * Fl,    Nr * C};
  constexpr int kBuffers = int(GPT::kBlockBuffers);
  bool kept[kBuffers];
  std::fill(kept, kept + kBuffers, l.recompute != "full");
  if (l.recompute == "mlp")  // the MLP's hidden rows, as GPT::block_kept
    for (int k = 0; k < kBuffers; ++k) kept[k] = kept[k] && !GPT::is_mlp_buffer(size_t(k));
  if (l.recompute == "full") kept[12] = true;
  auto bytes = [&](int k) { return sizes[k] * (!fp32 && GPT::kBf16Buffer[size_t(k)] ? 2 : 4); };
  // Note [Plan mixture memory]: a mixture layer's own buffers, per slot and shared.
  const MoeLayerBytes moe_bytes = moe_layer_bytes(cfg, Nr, l.ep, l.recompute == "none");
  // parallel.tp_overlap's rings with SP (Note [Tensor-parallel overlap]): one chunk's GEMM input
  // or output, [N/tp, widest local row of qkv, fc, the hidden, attention's output], fp32 in
  // both precisions (bf16 reads it as two halves); nothing without SP.
  const double Ql = NHl * cfg.head_size();
  const double tp_rings = sp && tp_overlap_runs(m, l, hw, rank_place(l, hw))
                              ? 4 * (N / tp) * std::max({QKVl, FCl, Fl, Ql})
                              : 0;

  const PipeSchedule schedule = parse_pipe_schedule(l.schedule, "schedule");
  const int chunks = schedule == PipeSchedule::kInterleaved ? l.v : 1;
  const StageSpec stage = pipeline_stage(m.layers, l.pp, s, {}, chunks);
  double acts = 0;
  int slots_total = 0;
  for (int c = 0; c < chunks; ++c) {
    const int slots = max_in_flight(schedule, l.pp, s, l.accum, chunks, c);
    slots_total += slots;
    double per_slot = Nr * C * 4 + 2 * N * 4;  // encoded input (fp32); inputs, targets
    int mlps = 0;  // the chunk's dense layers: a mixture layer keeps no fc/act rows
    for (int i = stage.chunk_begin(c); i < stage.chunk_begin(c) + stage.chunk_size(c); ++i)
      mlps += !cfg.is_moe(stage.global_layer(i));
    for (int k = 0; k < kBuffers; ++k)
      if (kept[k])
        per_slot += (GPT::is_mlp_buffer(size_t(k)) ? mlps : stage.chunk_size(c)) * bytes(k);
    acts += slots * per_slot;
    const bool head = stage.has_head && c == chunks - 1;
    if (head) {
      const int head_slots = splits_backward(schedule) ? 1 : slots;
      acts += head_slots * (N * C * E + 2 * Nr * 4 + N * Vl * E + N * 4);
    }
  }
  double scratch = 0;
  for (int k = 0; k < kBuffers; ++k)
    if (!kept[k] || (k == 12 && l.recompute == "full")) scratch += bytes(k);
  // GPT's Scratch (gpt_slots.cpp), fp32 unless said: full_c, stage and dfull with sequence
  // parallelism; dresidual; the attention scratch; the LayerNorm partials.
  const double tp_bufs = l.tp > 1 && l.sequence_parallel ? 3 : 0;
  scratch += 4 * (tp_bufs * N * C + Nr * C + att_scratch + (2.0 * stage.num_layers + 1) * 2 * C);
  scratch += 4 * Tl * cfg.rotary_dims();  // RoPE's cos and sin, this rank's T × rot/2 each
  scratch += cp_buffers + tp_rings;
  if (fp32)  // ln_out, dbuf_c, dbuf_c2, dbuf_3c, dbuf_4c, dbuf_4c2
    scratch += 4 * (2 * Nr * C + N * C + N * QKVl + N * Fl + N * FCl +
                    (cfg.parallel_residual ? Nr * C : 0));  // + dparallel
  else  // bf16 gradients between ops: dresidual16 (this rank's rows), d16_c, d16_3c, d16_4c
    // (DGELU in the GEMM), and d16_act where the activation is its own op (exact GELU, SwiGLU)
    scratch += 2 * (Nr * C + N * C + N * QKVl + N * FCl +
                    (cfg.activation == Activation::kGeluTanh ? 0 : N * Fl));
  if (stage.has_head && l.tp > 1) scratch += 4 * (N * 3 + tp * N * 3);
  int moe_layers = 0;
  for (int i = 0; i < stage.num_layers; ++i) moe_layers += cfg.is_moe(stage.global_layer(i));
  const bool stage_moe = moe_layers > 0;
  if (!fp32 && l.tp > 1) {
    // Note [bf16 with tp] (src/model/gpt_bf16_tp.cpp): the fp32 partial input gradient, the
    // head's fp32 logits of this rank's vocabulary; with SP the reduce-scatter target, a
    // norm's local output and the bf16 gathers' staging and gathered gradient.
    scratch += 4 * N * C + (stage.has_head ? 4 * N * Vl : 0);
    if (sp) scratch += 4 * Nr * C + 2 * (Nr * C + 2 * N * C);
  }
  if (!fp32 && (l.cp > 1 || stage_moe)) {
    // Note [Widening at the bf16 boundary] (src/model/gpt_bf16_widen.cpp): one fp32 set, the
    // widened input and its gradient (q|k|v, or a mixture's ln2), with cp the output and its;
    // this tp rank's heads, a mixture's rows Nr (Note [Widening under tp]).
    const double in = std::max(l.cp > 1 ? N * QKVl : 0.0, stage_moe ? Nr * C : 0.0);
    scratch += 4 * (2 * in + (l.cp > 1 ? 2 * N * Ql : 0.0));
  }
  // Note [Plan mixture memory]: each mixture layer holds every slot of the stage (interleaved:
  // the other chunks' too); the GPT's counts are there with a mixture anywhere in the model.
  // Under full the mixture layers share one set of slots (Note [Mixture memory]).
  const double slot_sets = l.recompute == "full" ? std::min(moe_layers, 1) : moe_layers;
  acts += slots_total * (slot_sets * moe_bytes.slot + moe_bytes.model_slot);
  scratch += (moe_layers > 0 ? moe_bytes.shared : 0) + moe_layers * moe_bytes.model_layer;
  const ModelStates states = model_state_bytes(m, l, hw, s);
  std::vector<PlanTerm> terms = {
      {"params", states.params}, {"grads", states.grads}, {"optimizer", states.optimizer}};
  if (cfg.has_moe())
    terms.insert(terms.end(), {{"expert_params", states.expert_params},
                               {"expert_grads", states.expert_grads},
                               {"expert_optimizer", states.expert_optimizer}});
  terms.insert(terms.end(), {{"activations", acts}, {"scratch", scratch}});
  // Note [Plan stage buffers]
  // GPTStage (src/train/gpt_stage.cpp) holds, per slot, the boundary gradient it receives (not
  // on the first stage) and the one it sends (not on the last; interleaved: both everywhere),
  // Nr·C fp32 each: on a GPU in device memory (the links' buffers, which check_memory_plan
  // counts with the activations), on a CPU host memory of the same size. GPT::activation_bytes
  // and bench leave them out. Not counted: the load totals of moe.aux_loss hf, 2·(2E + 1) floats
  // twice per slot, and the host's token copies.
  if (l.pp > 1) {
    const int ends = (!stage.has_embedding || chunks > 1) + (!stage.has_head || chunks > 1);
    terms.push_back({"stage_buffers", 4 * slots_total * ends * Nr * C});
  }
  if (m.async_checkpoint && hw.kind == "cpu")  // Note [Plan checkpoint snapshot]
    terms.push_back({"checkpoint_snapshot", snapshot_bytes(m, l, s)});
  return terms;
}

std::vector<PlanTerm> memory_terms(const PlanModel& m, const PlanLayout& l, const Hardware& hw) {
  std::vector<PlanTerm> best;
  double best_total = -1;
  for (int s : l.pp > 1 ? std::vector<int>{0, l.pp - 1} : std::vector<int>{0}) {
    std::vector<PlanTerm> terms = stage_memory_terms(m, l, hw, s);
    double total = 0;
    for (const PlanTerm& t : terms) total += t.value;
    if (total > best_total) best_total = total, best = std::move(terms);
  }
  return best;
}

}  // namespace trident
