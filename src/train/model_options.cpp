// The model a deck asks for, and this rank's part of it.
#include <numeric>
#include <sstream>

#include "train/trainer_parts.h"
#include "trident/check.h"
#include "trident/grid.h"

namespace trident {
namespace {

std::vector<int> parse_stage_layers(const std::string& text) {
  std::vector<int> out;
  if (text.empty()) return out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      out.push_back(std::stoi(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      input_error("parallel.stage_layers: expected comma-separated integers like \"3,1\", got "
                  "\"{}\"",
                  text);
    }
  }
  return out;
}

// The family's defaults, then each key that says otherwise (deck.h: "auto" and 0 keep them).
void apply_block_keys(const ModelConfig& m, GPTConfig& cfg) {
  cfg.apply_family(m.family == "neox"                             ? Family::kNeoX
                   : m.family == "llama" || m.family == "mixtral" ? Family::kLlama
                                                                  : Family::kGPT2);
  if (m.norm != "auto") cfg.norm = m.norm == "rmsnorm" ? Norm::kRMSNorm : Norm::kLayerNorm;
  if (m.norm_eps > 0) cfg.norm_eps = float(m.norm_eps);
  if (m.position != "auto")
    cfg.position = m.position == "rotary" ? Position::kRotary : Position::kLearned;
  if (m.rope_base > 0) cfg.rope_base = float(m.rope_base);
  if (m.rotary_pct > 0) cfg.rotary_pct = float(m.rotary_pct);
  if (m.mlp != "auto")
    cfg.activation = m.mlp == "swiglu"     ? Activation::kSwiGLU
                     : m.mlp == "gelu_erf" ? Activation::kGeluErf
                                           : Activation::kGeluTanh;
  cfg.mlp_hidden = m.mlp_hidden;
  // Llama's rule for SwiGLU's width: two thirds of 4·C (the three matrices cost what GELU's
  // two do), rounded up to a multiple of 256.
  if (m.mlp_hidden == 0 && cfg.activation == Activation::kSwiGLU)
    cfg.mlp_hidden = (8 * cfg.channels / 3 + 255) / 256 * 256;
  cfg.kv_heads = m.kv_heads;
  if (m.bias != "auto") cfg.bias = m.bias == "true";
  if (m.tied_head != "auto") cfg.tied_head = m.tied_head == "true";
  if (m.residual != "auto") cfg.parallel_residual = m.residual == "parallel";
  MoeConfig& e = cfg.moe;
  e.experts = m.moe_experts > 0 ? m.moe_experts : m.family == "mixtral" ? 8 : 0;
  e.top_k = m.moe_top_k;
  e.ffn_width = m.moe_ffn_width;
  e.every = m.moe_every;
  e.router = m.moe_router == "sigmoid" ? MoeRouter::kSigmoid : MoeRouter::kSoftmax;
  e.norm_topk = m.moe_norm_topk;
  e.bias_update_rate = float(m.moe_bias_update_rate);
  e.aux_loss = m.moe_aux_loss == "switch" ? MoeAux::kSwitch
               : m.moe_aux_loss == "hf"   ? MoeAux::kHF
                                          : MoeAux::kNone;
  e.aux_coeff = float(m.moe_aux_loss_coeff);
  e.z_coeff = float(m.moe_z_loss);
  e.capacity_factor = float(m.moe_capacity_factor);
  e.shared_experts = m.moe_shared_experts;
  e.shared_gate = m.moe_shared_gate;
}

}  // namespace

GPTConfig model_config_from_deck(const Deck& deck, std::string* note) {
  const ModelConfig& m = deck.model;
  GPTConfig cfg;
  if (!m.init_from.empty()) {
    cfg = read_llmc_config(m.init_from);
    if (note)
      *note = fmt::format(
          "model.init_from {}: its shape replaces the deck's: layers={} d_model={} heads={} "
          "vocab={} (padded {}) max_seq_len={}; its block too: {}",
          m.init_from, cfg.layers, cfg.channels, cfg.heads, cfg.vocab, cfg.padded_vocab,
          cfg.max_seq_len, describe_block(cfg));
    // The file's padding may not split evenly over tp: pad again (the loader maps rows).
    if (cfg.padded_vocab % (128 * deck.parallel.tp) != 0)
      cfg.padded_vocab = GPTConfig::pad_vocab(cfg.vocab, deck.parallel.tp);
    if (m.seq_len > cfg.max_seq_len)
      input_error("model.seq_len: {} exceeds model.init_from's max sequence length {}", m.seq_len,
                  cfg.max_seq_len);
    return cfg;
  }
  cfg.layers = m.layers;
  cfg.channels = m.d_model;
  cfg.heads = m.heads;
  cfg.vocab = m.vocab;
  cfg.padded_vocab = GPTConfig::pad_vocab(m.vocab, deck.parallel.tp);
  cfg.max_seq_len = m.seq_len;
  apply_block_keys(m, cfg);
  check_model_config(cfg);
  if (note && !cfg.is_gpt2_block()) *note = "model: " + describe_block(cfg);
  return cfg;
}

void check_context_parallel(const Deck& deck, int cp) {
  if (cp == 1) return;
  const int T = deck.model.seq_len;
  if (T % (2 * cp) != 0)
    input_error("model.seq_len {} must be a multiple of 2 * parallel.cp = {}: each sequence is "
                "split into 2 * cp chunks, two per cp rank (Note [Context parallelism])",
                T, 2 * cp);
}

void check_moe_deck(const Deck& deck, const GPTConfig& cfg, int dp_cp) {
  const ParallelConfig& p = deck.parallel;
  const int ep = p.ep;
  if (!cfg.has_moe()) {
    if (ep > 1)
      input_error("parallel.ep {} needs a mixture of experts (model.moe.experts > 0)", ep);
    return;
  }
  const int E = cfg.moe.experts;
  if (E % ep != 0 || dp_cp % ep != 0)
    input_error("parallel.ep {} must divide model.moe.experts {} and dp × cp = {} (the experts "
                "are divided over ep ranks taken from dp × cp)",
                ep, E, dp_cp);
  // Note [Mixtures on a device]
  // A device runs the mixture through its ops (Note [Mixture ops]) in fp32; the sigmoid
  // router's loads are host numbers, summed over the host's dp × cp and tp groups
  // (GPT::update_router_biases), not the device's communicators.
  if (p.tp > 1 && !p.sequence_parallel)
    input_error("model.moe with parallel.tp {} needs parallel.sequence_parallel true: each tp "
                "rank routes its own rows, as Megatron-Core's experts with tp do",
                p.tp);
  // Note [Experts with HSDP] (train/zero3.h): the ep groups are taken within a replica.
  if (ep > 1 && p.zero > 0 && p.dp_replicate > 1 && (dp_cp / p.dp_replicate) % ep != 0)
    input_error("parallel.ep {} with HSDP (parallel.zero {}, parallel.dp_replicate {}) must divide "
                "dp_shard × cp = {}: the experts are sharded within a replica and replicated over "
                "the replicas, as the dense weights are",
                ep, p.zero, p.dp_replicate, dp_cp / p.dp_replicate);
  // Every rank of an ep group must run the same forwards (each one an all-to-all).
  const int dp = dp_cp / std::max(1, p.cp);
  if (ep > 1 && deck.train.val_every > 0 && !deck.data.valid.empty() &&
      deck.train.val_batches % dp != 0)
    input_error("parallel.ep {}: train.val_batches {} must be a multiple of dp {} so that every "
                "rank validates as many micro-batches (each runs the experts' all-to-all)",
                ep, deck.train.val_batches, dp);
}

// Note [Chunks on the host] (model/tp_overlap.h): parallel.tp_overlap auto turns the overlap on
// where it wins on a host, when the tp ranks do not share one node's memory (the bytes then take
// time on a wire) or the emulated link slows tp; on one node the bytes move only while compute
// waits, and the chunks would only cost their copies and smaller GEMMs (docs/perf.md). On a
// device auto is off: its rings (Note [Tensor-parallel ring on a device]) never ran on one, so
// no measurement says where they win; true runs them. MPI_Comm_split_type is collective over
// tp: every tp rank resolves it at the same point. bf16 by the same rule:
// Note [Tensor-parallel overlap in bf16].
bool tp_overlap_on(const Deck& deck, MpiComm& tp, bool device) {
  const std::string& mode = deck.parallel.tp_overlap;
  if (mode == "false" || tp.size() == 1) return false;
  if (mode == "true") return true;
  if (device) return false;
  MPI_Comm node = MPI_COMM_NULL;
  TRIDENT_MPI(MPI_Comm_split_type(tp.raw(), MPI_COMM_TYPE_SHARED, tp.rank(), MPI_INFO_NULL, &node));
  int on_node = 0;
  TRIDENT_MPI(MPI_Comm_size(node, &on_node));
  TRIDENT_MPI(MPI_Comm_free(&node));
  int split = on_node < tp.size() ? 1 : 0, any = 0;  // the same answer on every tp rank
  TRIDENT_MPI(MPI_Allreduce(&split, &any, 1, MPI_INT, MPI_MAX, tp.raw()));
  return any != 0 || link_emulated_for(deck.comm, "tp");
}

// Note [Tensor-parallel overlap] (model/tp_overlap.h): the pieces are whole rows of every
// micro-batch size: k divides a rank's sequence shard T/tp (with sequence parallelism, each
// ring chunk in k pieces) or its T rows (without, the all-reduce in k pieces). Left at 0, k is
// 2 with sequence parallelism (a received chunk's GEMM starts on its first half; docs/perf.md
// compares 1, 2 and 4), tp without, or the most of those that divides; a count that does not
// divide exits 2 with the numbers.
int tp_overlap_chunks(const Deck& deck, int tp, int T, bool overlap) {
  const ParallelConfig& p = deck.parallel;
  if (!overlap || tp == 1) return 0;
  const bool sp = p.sequence_parallel;
  const int rows = sp ? T / tp : T;
  int k = p.tp_overlap_chunks;
  if (k == 0) return sp ? std::gcd(2, rows) : std::gcd(tp, rows);
  if (rows % k != 0)
    input_error("parallel.tp_overlap_chunks {} does not divide the sequence shard: {} rows of each "
                "sequence on a rank (model.seq_len {}{}{}), so its pieces would not be whole rows",
                k, rows, deck.model.seq_len, p.cp > 1 ? fmt::format(" / parallel.cp {}", p.cp) : "",
                sp ? fmt::format(" / parallel.tp {} with sequence parallelism", tp) : "");
  return k;
}

GPTOptions stage_options(const Deck& deck, const GPTConfig& cfg, const TrainContext& ctx,
                         PipeSchedule schedule, int pp_size, int pp_rank, int dp_size) {
  GPTOptions options;
  // Note [Context parallelism] (model/cp_attention.h): the model holds T / cp rows of each
  // sequence, two chunks of T / (2·cp).
  const int cp = ctx.grid ? ctx.grid->layout().cp : 1;
  check_context_parallel(deck, cp);
  const int T = deck.model.seq_len / cp;
  if (cp > 1) {
    MpiComm& comm = ctx.grid->cp();
    // The emulated link (comm.emulate_gbps, when comm.emulate_groups names cp) carries cp's K/V,
    // both ways at once (host communicators only, as tp's).
    if (!ctx.cp_device && link_emulated_for(deck.comm, "cp")) {
      comm.set_emulated_link(deck.comm.emulate_gbps, deck.comm.emulate_latency_us);
      comm.set_duplex_link(true);
    }
    if (ctx.backend->is_device() && !ctx.cp_device)
      internal_error(__FILE__, __LINE__,
                     "a device backend with cp > 1 needs a device communicator");
    options.cp = {ctx.cp_device ? ctx.cp_device : &comm, cp, ctx.grid->coord().cp,
                  parse_cp_comm(deck.parallel.cp_comm)};
  }
  if (ctx.grid && ctx.grid->layout().tp > 1) {
    Communicator* tp = ctx.tp_device ? ctx.tp_device : &ctx.grid->tp();
    // The emulated link (comm.emulate_groups naming tp) carries every tp collective, and a
    // ring step's send and receive at once (Note [Tensor-parallel overlap]).
    if (!ctx.tp_device && link_emulated_for(deck.comm, "tp")) {
      ctx.grid->tp().set_emulated_link(deck.comm.emulate_gbps, deck.comm.emulate_latency_us);
      ctx.grid->tp().set_duplex_link(true);
    }
    options.tp = {tp, ctx.grid->layout().tp, ctx.grid->coord().tp, deck.parallel.sequence_parallel};
    options.tp.overlap = tp_overlap_on(deck, ctx.grid->tp(), ctx.backend->is_device());
    options.tp.chunks = tp_overlap_chunks(deck, options.tp.size, T, options.tp.overlap);
    options.tp.ring = ctx.tp_ring;
    if (ctx.backend->is_device() && options.tp.overlap && !ctx.tp_ring)
      internal_error(__FILE__, __LINE__,
                     "a device backend with parallel.tp_overlap needs the tp ring's communicator");
  }
  if (ctx.backend->is_device() && options.tp.size > 1 && !ctx.tp_device)
    internal_error(__FILE__, __LINE__, "a device backend with tp > 1 needs a device communicator");
  check_tensor_parallel(cfg, options.tp.size, options.tp.sequence_parallel, T);
  const int chunks = deck.parallel.virtual_stages;
  check_pipe_schedule(schedule, pp_size, deck.train.accum, chunks, cfg.layers);
  options.stage = pipeline_stage(cfg.layers, pp_size, pp_rank,
                                 parse_stage_layers(deck.parallel.stage_layers), chunks);
  options.slots = 0;
  for (int c = 0; c < chunks; ++c) {
    options.chunk_slots.push_back(
        max_in_flight(schedule, pp_size, pp_rank, deck.train.accum, chunks, c));
    options.slots += options.chunk_slots.back();
  }
  options.recompute = parse_recompute(deck.train.recompute);
  options.precision = parse_precision(deck.run.precision);
  // The seed every backward of this run gets (GPTStage::dloss_scale), which the bf16 fused
  // classifier applies in forward (Note [bf16 activations]).
  options.dloss_scale = 1.0f / (float(deck.train.accum) * float(dp_size) * float(cp));
  // Note [Split backward] (model/gpt_backward.cpp): the last stage of zb-h1 holds p slots but
  // runs each micro-batch's B right after its F, so one set of head buffers serves them all.
  options.shared_head = splits_backward(schedule);
  if (splits_backward(schedule) && options.recompute != Recompute::kNone)
    input_error("parallel.schedule: {} keeps each micro-batch's activations until its weight "
                "pass, which train.recompute: {} drops; use train.recompute: none with {}, or "
                "parallel.schedule: 1f1b",
                deck.parallel.schedule, deck.train.recompute, deck.parallel.schedule);
  return options;
}

}  // namespace trident
