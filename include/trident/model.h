// A GPT-style decoder: token embedding (+ learned positions or RoPE), L pre-norm blocks of the
// configured family (Note [Block shapes] in trident/model_config.h), final norm, LM head tied to
// wte or its own.
//
// Note [Parameter layout]
// All parameters live in ONE flat buffer, laid out in the order their gradients become final
// during backward (the reverse of the forward/declaration order, as Megatron lays out its grad
// buffer): the head's weight (tied wte's dense head gradient, or lmw), the final norm, then
// blocks L-1 … 0 (within a block: fcproj, fc, ln2, attproj, qkv, ln1 — again backward order),
// then wpe and an untied wte. Gradients mirror the buffer: a gradient bucket is an (offset,
// count) slice.
//
// The vocabulary is padded to a multiple of 128 (Vp); padded rows of wte and lmw start at
// zero, their logits are excluded from the softmax, so they never get a gradient and stay zero.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "trident/backend.h"
#include "trident/comm.h"
#include "trident/model_config.h"

namespace trident {

// Note [Tensor-parallel shards]
// Each parameter is split over the tp ranks (Megatron-style) by the rule of its Shard, chosen
// so that a rank's matmuls read only its own slice and attention runs on whole local heads;
// the global tensor is recovered by ParamInfo::global_index.
//
//   kReplicated  every rank holds all of it (norms, row-parallel biases, wpe)
//   kRows        rank r holds rows [r·R/tp, (r+1)·R/tp) (column-parallel fcw/fcb; vocab-parallel
//                wte and lmw)
//   kPartRows    the rows are consecutive parts (ParamInfo::parts: qkv's q | k | v, SwiGLU's
//                gate | up); rank r holds its rows of each part, laid out part after part, so
//                attention runs on whole local heads and SwiGLU on matching gate and up columns
//   kColumns     row-parallel weights (attprojw, fcprojw): rank r holds columns
//                [r·K/tp, (r+1)·K/tp) of every row
enum class Shard { kReplicated, kRows, kPartRows, kColumns };

struct ParamInfo {
  std::string name;        // llm.c name with block index, e.g. "h3.qkvw", "wte"
  std::vector<int> shape;  // this rank's shard
  std::vector<int> global_shape;
  Shard shard = Shard::kReplicated;
  std::vector<int> parts;  // kPartRows: the global row count of each part
  int tp_rank = 0, tp_size = 1;
  size_t offset = 0;  // in floats, into the flat buffer
  size_t count = 0;
  bool decay = false;  // weight decay applies (matrices only; not biases or LayerNorm)
  int layer = -1;      // block index, -1 for embeddings and final LayerNorm
  // A mixture's routed experts (Note [Expert tensors]): rows split over ep as kRows splits
  // over tp (tp_rank, tp_size then say ep's), reduced over the expert-data-parallel group.
  bool expert = false;
  bool trained = true;  // false: changed by a rule, not by AdamW (the sigmoid router's bias)

  // Index into the global (unsplit, row-major) tensor of this shard's element `local`.
  size_t global_index(size_t local) const;
};

// Note [Pipeline stages]
// A pipeline stage holds a contiguous range of blocks; the first stage also the embeddings
// (wte, and wpe with learned positions), the last the final norm and the LM head, whose weight
// is the tied wte or its own lmw. Tied, with pp > 1 the first and the last stage each hold a
// copy of wte, and their gradients are summed over the embedding group (docs/design.md, "The
// grid") before the update.
struct StageSpec {
  int first_layer = 0;
  int num_layers = -1;        // -1: all layers from first_layer
  bool has_embedding = true;  // first stage
  bool has_head = true;       // last stage
  // Interleaved 1F1B (Note [Interleaved 1F1B] in train/pipeline_schedule.cpp): the stage's
  // blocks as model chunks, chunk c holding chunk_layers[c] consecutive layers from global
  // layer chunk_first[c]; the embedding belongs to chunk 0, the head to the last chunk; local
  // layer indices run over the chunks in order, and num_layers is their total. Empty: one
  // chunk, first_layer .. first_layer + num_layers − 1.
  std::vector<int> chunk_first, chunk_layers;
  int chunks() const { return chunk_layers.empty() ? 1 : int(chunk_layers.size()); }
  int chunk_begin(int chunk) const;  // the chunk's first local layer
  int chunk_size(int chunk) const;
  int global_layer(int local) const;
};
// Stage `stage` of `stages`, holding `chunks` model chunks (virtual stages chunk·stages +
// stage): `stage_layers` gives each (virtual) stage's block count, in virtual stage order
// (empty: balanced, the first taking one more when layers % (stages·chunks) != 0).
// input_error if they do not add up to `layers` or a stage would have none.
StageSpec pipeline_stage(int layers, int stages, int stage, const std::vector<int>& stage_layers,
                         int chunks = 1);

// The parameter list in ready (= buffer) order for one tp rank and pipeline stage.
// wte_after_head matters only on a stage with both the embedding and the head
// (Note [Tied embedding gradient]): true puts wte first, where its gradient is final when the
// sparse rows go to an EmbeddingRowSink; false puts it last, after wpe, where it is final when
// the embedding's backward adds the rows into it (a device backend, which has no sink).
std::vector<ParamInfo> gpt_param_layout(const GPTConfig& cfg, int tp_size = 1, int tp_rank = 0,
                                        StageSpec stage = {}, bool wte_after_head = true,
                                        int ep_size = 1, int ep_rank = 0);

// The bf16 path reads this parameter only through its bf16 copy: a dense block's GEMM weights
// (qkvw, attprojw, fcw, fcprojw) and an untied LM head. Norms, biases and the embedding tables
// (a tied wte too: the embedding reads it) are read in fp32 (Note [bf16 unit gathers] in
// src/train/zero3_pool.h).
bool read_as_bf16(const ParamInfo& p);

// Activation recomputation: keep everything (none), recompute the MLP's hidden activations
// in backward (mlp), or keep only each block's input and recompute the whole block (full).
enum class Recompute { kNone, kMlp, kFull };
Recompute parse_recompute(const std::string& text);  // "none" | "mlp" | "full"

// The activations' storage type (run.precision): fp32 everywhere, or bf16 for what the GEMMs,
// attention and GELU read (Note [bf16 activations] in src/backend/bf16_ops.cpp). bf16 runs with
// any tp (Note [bf16 with tp] in src/model/gpt_bf16_tp.cpp) but without tp's overlap, with an
// unsplit backward and the head's gradient in one piece (checked when the GPT is built, and for
// decks by the deck reader).
enum class Precision { kFp32, kBf16 };
Precision parse_precision(const std::string& text);  // "fp32" | "bf16"

// Tensor parallelism for one model replica: the tp communicator (null for tp = 1) and whether
// the LayerNorm/residual regions are split along the sequence (Megatron's sequence parallelism).
struct TensorParallel {
  Communicator* comm = nullptr;
  int size = 1;
  int rank = 0;
  bool sequence_parallel = false;
  // Note [Tensor-parallel overlap] (src/model/tp_overlap.h): chunked collectives beside the
  // GEMMs (host backends), and the pieces of a row-parallel all-reduce without sequence
  // parallelism (0: size).
  bool overlap = false;
  int chunks = 0;
  // The overlap's rings in grouped exchanges on this communicator
  // (Note [Tensor-parallel ring on a device] in src/model/tp_ring_grouped.cpp): on a device an
  // NcclComm over the tp ranks on its own stream; on a host, tests only. Null: the host's rings
  // on `comm`.
  Communicator* ring = nullptr;
};

// Context parallelism for one model replica (Note [Context parallelism] in
// src/model/cp_attention.h): the cp communicator (null for cp = 1), this rank's place, and how
// K/V travel. The model is given this rank's T/cp tokens of each sequence: chunks `rank` and
// 2·size − 1 − rank of 2·size, back to back (cp_positions).
enum class CpComm { kRing, kAllGather };
CpComm parse_cp_comm(const std::string& text);  // "ring" | "allgather"
struct ContextParallel {
  Communicator* comm = nullptr;
  int size = 1;
  int rank = 0;
  CpComm mode = CpComm::kRing;
};
// The global position of each of a cp rank's T_local rows (T_local = T / cp, two chunks).
std::vector<int> cp_positions(int T_local, int cp, int cp_rank);

// Expert parallelism (Note [Expert parallelism] in src/model/moe.h): the mixture layers'
// experts divided over `size` ranks of dp × cp; tokens travel by all-to-all on `comm`.
struct ExpertParallel {
  Communicator* comm = nullptr;  // the tokens' all-to-all (a device communicator on a device)
  int size = 1;
  int rank = 0;
  // The same group over host memory, for the row counts' exchange (src/model/moe.cpp,
  // Note [Expert counts on the host]); null: comm.
  Communicator* counts = nullptr;
};

// Refuses (input_error, before any allocation) a shape that tp cannot split: heads % tp,
// d_model % tp, and with sequence parallelism seq_len % tp.
void check_tensor_parallel(const GPTConfig& cfg, int tp, bool sequence_parallel, int seq_len);

// Called by backward() with a parameter's index once its gradient is final, and the piece:
// 0, except for wte's head gradient in pieces (GPTOptions::wte_piece_rows), which reports
// pieces 0..K-1 of wte, each once its rows are final.
using GradReadyFn = std::function<void(int param_index, int piece)>;
// Adds p.count floats of backend memory to parameter p wherever it is held.
using ParamAddFn = std::function<void(const ParamInfo& p, const float* values)>;

// Note [Tied embedding gradient]
// wte gets a dense gradient from the LM head at the start of backward and a sparse one (the
// rows of the batch's tokens) at the end. With an EmbeddingRowSink the sparse part goes into a
// compact [R, C] buffer instead, so wte's large dense gradient is final, and reported ready,
// right after the LM head: the reducer sends it while backward runs, and the small row buffer
// at the end. The caller adds the rows into wte's gradient afterwards.
//
// rows[k] is the gradient of token row_ids[k]; row_of_input[i] is the k of input i.
struct EmbeddingRowSink {
  const int32_t* row_of_input = nullptr;  // [B*T]; -1: not in this tp rank's vocab slice
  float* rows = nullptr;                  // [R, C], accumulated (+=)
};

// Receives the model's compute phases for a timeline: "forward block 3", "backward head", ...
using PhaseFn =
    std::function<void(const std::string& phase, std::chrono::steady_clock::time_point begin,
                       std::chrono::steady_clock::time_point end)>;

// Called by forward() right before it first reads a group of parameters (the embedding's, one
// block's, the head's), and by backward() before the head's and each block's, with the pass and
// their indices: ZeRO's parameter all-gather waits there for the buckets that hold them, and for
// nothing else (Note [Gathers before use] in train/zero.h); ZeRO-3 also gathers the next group
// ahead and releases the last (Note [ZeRO-3 units] in train/zero3.h). The embedding's backward
// reads no weights and announces nothing.
enum class ParamPass { kForward, kBackward };
using ParamUseFn = std::function<void(ParamPass pass, const std::vector<int>& param_indices)>;

struct GPTOptions {
  TensorParallel tp;
  ContextParallel cp;
  ExpertParallel ep;
  StageSpec stage;
  int slots = 1;  // micro-batches whose activations are alive at once (pipeline in-flight)
  // With several chunks (StageSpec): the slots of each chunk, which sum to `slots`; slot
  // indices run over the chunks in order (slot_for). Empty: all slots for the one chunk.
  std::vector<int> chunk_slots;
  Recompute recompute = Recompute::kNone;
  // One set of the head's buffers (final LayerNorm, logits, losses) for all slots instead of
  // one per slot: for a last stage that runs each micro-batch's backward right after its
  // forward (1F1B and ZB-H1 do) while holding several slots (ZB-H1: Note [Split backward]).
  bool shared_head = false;
  // Note [Padded buckets] (trident/buckets.h): each parameter's offset in the flat buffer, in
  // ready order, and the buffer's size with the padding. Empty: contiguous, unpadded.
  std::vector<size_t> param_offsets;
  size_t param_total = 0;
  // ZeRO-3 on a device (Note [No full weights on a device], train/zero3_pool.h): no full
  // parameter buffer is made; params() is null.
  bool no_full_params = false;
  // Note [Gradients in unit slots] (train/grad_pool.h): no flat gradient buffer; backward
  // writes each home's gradients at the base set_grad_base gave it (null until then).
  bool pooled_grads = false;
  // Note [Head gradient in pieces] (train/tied_embedding.h): row boundaries of wte's local slice
  // [0, ..., padded_vocab / tp] in which the LM head computes and reports its gradient, when
  // that is final after the head (no embedding on this stage, or an EmbeddingRowSink). Empty:
  // one piece.
  std::vector<int> wte_piece_rows;
  // gpt_param_layout's wte_after_head: where wte sits in the ready list on a stage with both
  // the embedding and the head. The Trainer sets it false when it reduces over dp without an
  // EmbeddingRowSink, so that the buckets are in the order their gradients become final.
  bool wte_after_head = true;
  Precision precision = Precision::kFp32;
  // bf16: the loss seed backward will be given (its dloss_scale), which the fused classifier
  // needs already in forward (Note [bf16 activations]); GPT::set_dloss_scale changes it.
  float dloss_scale = 1.0f;
};

class CpAttention;
class TpOverlap;
class MoeLayer;

// What tp collectives cost: all their time on the wire (a transfer's emulated link time, or else
// the time a wait took to move it: Note [Chunks on the host] in src/model/tp_overlap.h) and the
// part of it the compute thread waited for.
struct TpTimes {
  double comm_ms = 0, exposed_ms = 0;
};
struct MoeHfTotals;

// The mixture layers' figures since the last take (GPT::take_moe_stats; src/model/moe.h).
struct MoeStats {
  double aux_loss = 0, z_loss = 0;  // the terms as they enter the objective (coefficient in)
  int64_t dropped = 0;              // (token, expert) choices dropped by the capacity
  int64_t choices = 0;              // all choices
  double load_max_over_mean = 0;    // tokens per expert, max / mean, summed over layer forwards
  int layers_seen = 0;              // mixture layer forwards counted
  // Per global layer (empty for a dense one's place): the same sum, and its forwards.
  std::vector<double> layer_load, layer_forwards;
  double a2a_ms = 0, a2a_exposed_ms = 0;
  // Wall time in the mixture layers (forward and backward, all-to-alls included), and of it
  // the routing's: router, top-k, permutation, combine and their backward (the router's GEMMs
  // included; the experts' GEMMs, activations and all-to-alls not).
  double layer_ms = 0, route_ms = 0;
};

class GPT {
 public:
  // B, T: the largest micro-batch this instance will run (activations are sized for it).
  GPT(const GPTConfig& cfg, Backend& backend, int B, int T, GPTOptions options = {});
  ~GPT();
  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;

  const GPTConfig& config() const { return cfg_; }
  const std::vector<ParamInfo>& params_info() const { return infos_; }
  // Writable weights. Whoever asks may write them, so the bf16 copy (below) counts as stale
  // from here on: each block's is cast again before its next forward.
  float* params() {
    ++weights_version_;
    return params_.data();
  }
  // The bf16 path's copy of the weights (null in fp32), at params()'s offsets. AdamW writes it
  // in its own pass (Backend::adamw_update_bf16), after its last params() call, and then says
  // so with params16_written(): until the weights change again, forward casts nothing.
  bfloat16* params16() { return params16_.size() ? params16_.data() : nullptr; }
  void params16_written() {
    std::fill(cast_version_.begin(), cast_version_.end(), weights_version_);
  }
  float* grads() { return grads_.data(); }
  size_t num_params() const { return num_params_; }
  const ParamInfo& param(const std::string& name) const;

  // GPT-2 initialisation: N(0, 0.02); residual projections (attproj, fcproj) N(0, 0.02/√(2L));
  // norm weights 1; biases and padded vocabulary rows 0. A counter-based generator keyed by
  // (seed, parameter name, element index) makes it independent of thread count and layout.
  void init_weights(uint64_t seed);

  // Forward of micro-batch `slot` over inputs [B,T] (used by the first stage; later stages
  // read stage_input(slot)). On the last stage with targets it returns the mean cross-entropy
  // loss over B·T tokens; without targets it returns 0 and leaves logits. Keeps what backward
  // needs in the slot.
  float forward(int slot, const int32_t* inputs, const int32_t* targets, int B, int T);
  float forward(const int32_t* inputs, const int32_t* targets, int B, int T) {
    return forward(0, inputs, targets, B, T);
  }
  // The same forward, its loss added to the model's loss sum instead of returned: on a device
  // the mean stays in device memory (Backend::add_mean), so a micro-batch's forward does not
  // wait for the device; take_loss_sum() reads the sum once, waiting then, and zeroes it. On a
  // host it sums forward's returns (the bits a caller summing them in double gets).
  void forward_accumulate(int slot, const int32_t* inputs, const int32_t* targets, int B, int T);
  double take_loss_sum();
  // Backward of slot's last forward: of (dloss_scale × mean loss) on the last stage, of
  // dstage_output [Nr,C] (the next stage's gradient of stage_output) elsewhere. Writes
  // dstage_input [Nr,C] (=) on stages after the first. Gradients are ACCUMULATED into grads()
  // (so micro-batches add up); on_ready may be empty. With `sink`:
  // Note [Tied embedding gradient]. `last_micro_batch` false: with sequence parallelism the
  // LayerNorm gradients of this micro-batch stay in per-rank partial sums until a backward with
  // it true (Note [Sequence-parallel LayerNorm gradients]); without, it changes nothing.
  void backward(int slot, float dloss_scale, const float* dstage_output, float* dstage_input,
                const GradReadyFn& on_ready = {}, const EmbeddingRowSink* sink = nullptr,
                bool last_micro_batch = true);
  void backward(float dloss_scale, const GradReadyFn& on_ready = {},
                const EmbeddingRowSink* sink = nullptr) {
    backward(0, dloss_scale, nullptr, nullptr, on_ready, sink);
  }
  // The same backward in two parts (Note [Split backward] in model/gpt_backward.cpp), for the
  // zero-bubble schedule: backward_input writes dstage_input and the LayerNorm gradients;
  // backward_weight, later and before the slot's next forward, adds the linear layers' and the
  // embedding's gradients and reports every parameter ready. Together: backward's bits.
  // Not with recomputation.
  void backward_input(int slot, float dloss_scale, const float* dstage_output, float* dstage_input,
                      bool last_micro_batch = true);
  void backward_weight(int slot, const GradReadyFn& on_ready = {},
                       const EmbeddingRowSink* sink = nullptr);
  // Stage boundary buffers [Nr,C] (Nr = B·T, or B·T/tp with sequence parallelism).
  float* stage_input(int slot);
  const float* stage_output(int slot) const;
  size_t boundary_rows(int B, int T) const { return size_t(B) * T / rows_divisor_; }
  const StageSpec& stage() const { return stage_; }
  int num_slots() const;
  // The slot of micro-batch `micro` of `chunk`: micro-batches use their chunk's slots in turn.
  int slot_for(int chunk, int micro) const {
    return chunk_slot_base_[size_t(chunk)] +
           micro % (chunk_slot_base_[size_t(chunk) + 1] - chunk_slot_base_[size_t(chunk)]);
  }
  // Bytes of activation memory this instance allocated (all slots, kept and scratch).
  size_t activation_bytes() const;
  // Optional timeline of forward/backward phases (empty: none).
  void set_phase_recorder(PhaseFn fn) { phases_ = std::move(fn); }
  // Optional hook before each group of parameters is first read in forward and backward
  // (empty: none).
  void set_param_use(ParamUseFn fn) { param_use_ = std::move(fn); }
  // The groups of parameter indices a pass over `chunk` announces to that hook, in order: what
  // ZeRO-3 prefetches by.
  std::vector<std::vector<int>> param_use_sequence(int chunk, ParamPass pass) const;
  // init_weights for parameters [first, end) of params_info() only (the same values), so that
  // ZeRO-3 can initialise its shards a unit at a time, never holding the whole model.
  // `base` (ZeRO-3 on a device: a pool slot, Note [Weights in unit slots]): the values are
  // written at base + offset instead of params() + offset.
  void init_params(uint64_t seed, size_t first, size_t end, float* base = nullptr);
  // Note [Weights in unit slots] (train/zero3_pool.h): forward and backward read each unit's
  // weights at weight base + offset, one base per home (a local block 0..L-1, wte L, wpe L+1,
  // the head's final norm and untied LM head L+2); every base is params() unless set.
  int weight_home(size_t param) const;
  void set_weight_base(int home, float* base) {
    weight_base_[size_t(home)] = base;
    if (size_t(home) == weight_base_.size() - 3) tied_head16_stale_ = true;  // wte's
  }
  // The same for gradients (Note [Gradients in unit slots] in train/grad_pool.h): backward
  // writes a home's gradients at its grad base + offset; every base is grads() unless set.
  void set_grad_base(int home, float* base) { grad_base_[size_t(home)] = base; }
  // Gives the full parameter buffer back (ZeRO-3 on a device, after its shards were taken):
  // params() is null from then on, and every weight is read through a set base. On the bf16
  // path the whole bf16 copy goes too: the units' slots hold the GEMMs' bf16 weights
  // (Note [bf16 unit gathers] in train/zero3_pool.h), and a tied head's is cast from wte's slot.
  void release_full_params();
  // Optional hook called between layers in forward and backward (the pipeline's transfer
  // progress: Note [Progress during compute] in trident/pipeline.h; empty: none).
  void set_progress(std::function<void()> fn) { progress_ = std::move(fn); }
  void zero_grads();

  // Logits [B,T,Vp/tp] (this rank's vocab slice) of slot 0's last forward without targets, in
  // backend memory (synchronize the backend before reading them on the host).
  const float* logits() const;
  Precision precision() const { return precision_; }
  // bf16: the dloss_scale the next backwards will be given (GPTOptions::dloss_scale).
  void set_dloss_scale(float s) { dloss_scale_ = s; }
  Backend& backend() { return be_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  // This rank's vocabulary slice [begin, end) of the padded vocabulary.
  int vocab_begin() const { return tp_.rank * (cfg_.padded_vocab / tp_.size); }
  int vocab_end() const { return vocab_begin() + cfg_.padded_vocab / tp_.size; }
  // Milliseconds spent waiting in tp collectives since the last call (then reset).
  // The tp collectives since the last call: their time on the wire, and what compute waited
  // (Note [Tensor-parallel overlap]).
  double take_tp_comm_ms();
  double take_tp_exposed_ms();
  // Tests: the chunked collectives (null unless tp > 1 with TensorParallel::overlap).
  TpOverlap* tp_overlap() { return tp_overlap_.get(); }
  const ContextParallel& context_parallel() const { return cp_; }
  // Context parallelism's K/V transfers since the last call (then reset), in ms: their time on
  // the wire (start to completion), and the part of it attention waited for.
  double take_cp_comm_ms();
  double take_cp_exposed_ms();
  // Mixtures of experts (src/model/moe.h): the figures since the last take; and the sigmoid
  // router's choice bias stepped by the step's loads summed over `group` (dp × cp) and `tp`,
  // both host communicators (the loads are host numbers, on a device too).
  bool has_moe() const { return moe_count_ > 0; }
  MoeStats take_moe_stats();
  void discard_moe_stats();  // and the step's loads (validation's forwards)
  // `add`: where the steps go instead of the parameter buffer (ZeRO-3's shards,
  // DataParallel::shard_adder); its values are in backend memory.
  void update_router_biases(Communicator* group, Communicator* tp, const ParamAddFn& add = {});
  // Note [Transformers' totals across stages] (gpt_moe.cpp): with model.moe.aux_loss hf a
  // micro-batch's routing totals travel with its activations and with their gradients. A
  // message is moe_totals_floats() floats (0: none travel), host or backend memory.
  size_t moe_totals_floats() const;
  // Before forward(slot) on a chunk after the first: the earlier chunks' totals; before
  // backward(slot) on a chunk before the last: the whole micro-batch's.
  void receive_moe_totals(int slot, const float* message);
  // After forward(slot): the totals so far, for the next chunk; after backward(slot): the
  // whole micro-batch's, for the previous one.
  void send_moe_totals(int slot, float* message);

  // One block's activation buffers, in BlockActs order: ln1 ln1_mean ln1_rstd qkv att atty
  // residual2 ln2 ln2_mean ln2_rstd fch fch_gelu residual3; and which of them the bf16 path
  // holds in bf16 (BlockActs16: what GEMMs, attention and GELU read). The residual stream,
  // LayerNorm statistics and the attention state stay fp32. The planner's memory model
  // (src/plan/memory.cpp) counts bytes by this table.
  static constexpr size_t kBlockBuffers = 13;
  static constexpr std::array<bool, kBlockBuffers> kBf16Buffer = {
      true, false, false, true, false, true, false, true, false, false, true, true, false};
  // fch and fch_gelu: the dense MLP's rows, which a mixture layer does not hold.
  static constexpr bool is_mlp_buffer(size_t k) { return k == 10 || k == 11; }

 private:
  // Defined in src/model/gpt_state.h (the model's files only).
  struct BlockActs;
  struct BlockActs16;
  struct Slot;
  struct Scratch;
  struct BlockWeights;
  struct BlockWeights16;
  struct BlockOffsets;
  struct LayerTable;
  struct ParamTable;
  // Row counts: N = B·T tokens; the residual stream holds Nr rows (N/tp with sequence
  // parallelism). ln1/ln2/lnf hold the LayerNorm outputs gathered to all N rows (the inputs
  // of the column-parallel linears).
  // Element counts of one block's buffers at the largest micro-batch, in BlockActs order.
  std::array<size_t, kBlockBuffers> block_sizes() const;
  // Which of them a slot keeps per block under the recompute mode.
  std::array<bool, kBlockBuffers> block_kept() const;
  BlockActs block_acts(int slot, int local_layer);
  BlockActs16 block_acts16(int slot, int local_layer);
  template <typename Elem>
  Elem* block_buffer(std::vector<BackendBuffer<Elem>>& kept,
                     std::vector<BackendBuffer<Elem>>& dropped, int chunk, int local_layer,
                     size_t k) const;
  // The slot holding `s`'s head buffers: itself, or slot 0 (GPTOptions::shared_head).
  Slot& head(Slot& s);
  void build_param_table();
  void make_rope_tables();                         // Note [RoPE tables] in src/model/gpt_slots.cpp
  int param_index(const std::string& name) const;  // -1 if this stage has no such parameter
  // Block `local_layer`'s tensors in `base` (params_ or grads_).
  BlockWeights block(float* base, int local_layer) const;
  // Where forward and backward read weights (Note [Weights in unit slots]).
  float* layer_weights(int local_layer) const { return weight_base_[size_t(local_layer)]; }
  float* wte_weights() const { return weight_base_[weight_base_.size() - 3]; }
  float* wpe_weights() const { return weight_base_[weight_base_.size() - 2]; }
  float* head_weights() const { return weight_base_.back(); }
  float* head_w_weights() const { return cfg_.tied_head ? wte_weights() : head_weights(); }
  // Where backward writes gradients, by the same homes (Note [Gradients in unit slots]).
  float* layer_grads(int local_layer) const { return grad_base_[size_t(local_layer)]; }
  float* wte_grads() const { return grad_base_[grad_base_.size() - 3]; }
  float* wpe_grads() const { return grad_base_[grad_base_.size() - 2]; }
  float* head_grads() const { return grad_base_.back(); }
  float* head_w_grads() const { return cfg_.tied_head ? wte_grads() : head_grads(); }
  // One block's forward from residual_in [Nr,C] into `a` (forward, and recomputation).
  void block_forward(int slot, int local_layer, const BlockWeights& w, const BlockActs& a,
                     const float* residual_in, int B, int T);
  // Recomputes what the recompute mode dropped for block `local_layer` of `slot`.
  void recompute_block(int slot, int local_layer, const float* residual_in);
  // The bf16 path (gpt_bf16.cpp; Note [bf16 activations]): a block's weights are cast to
  // params16_ right before its forward unless that copy is current, and backward reads it.
  BlockWeights16 block16(int local_layer) const;
  // A GEMM weight's bf16 copy at flat `offset`: in params16_, or without it in the first half
  // of its fp32 place at its home's weight base (Note [bf16 unit gathers]).
  const bfloat16* weights16(int home, size_t offset) const;
  // The LM head's bf16 weights (wte's if tied); without params16_, a tied head's cast from wte's
  // slot once per gather of it.
  const bfloat16* head_w16();
  // params16_[begin, end) = bf16(params_) unless span `span` (a local layer, or
  // table_.layers.size() for wte) was cast or written at the current weights_version_.
  void cast_weights(size_t span, size_t begin, size_t end);
  void block_forward_bf16(int slot, int local_layer, const BlockWeights& w,
                          const BlockWeights16& w16, const BlockActs16& a, const float* residual_in,
                          int B, int T);
  // Where the bf16 path hands a tensor to an fp32 op (gpt_bf16_widen.cpp,
  // Note [Widening at the bf16 boundary]): the block's attention (by blocks over cp, else the
  // backend's bf16 op), and a mixture layer. Their fp32 scratch is sized once
  // (make_widen_buffers, after the mixtures).
  void make_widen_buffers(int B, int T);
  void block_attention_forward_bf16(const BlockActs16& a, int B, int T);
  void block_attention_backward_bf16(bfloat16* dqkv, const bfloat16* dout, const BlockActs16& a,
                                     int B, int T);
  // residual3 = residual2 + the mixture of ln2; dln2 = bf16(the mixture's input gradient) for
  // dout = the block output's fp32 gradient (weight gradients accumulated).
  void moe_forward_bf16(int slot, int local_layer, const BlockActs16& a, int N);
  void moe_backward_bf16(int slot, int local_layer, bfloat16* dln2, const float* dout,
                         const BlockActs16& a, int N, float dloss_scale, bool last_micro_batch);
  void recompute_block_bf16(int slot, int local_layer, const float* residual_in);
  // The family's norm, RoPE and MLP up-projection with its activation on the bf16 path.
  void norm_forward_bf16(bfloat16* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N, int C);
  void norm_backward_add_bf16(float* dresidual, bfloat16* dresidual16, float* dw, float* db,
                              const bfloat16* dout, const float* inp, const float* w,
                              const float* mean, const float* rstd, int N, int C);
  void rope_bf16(bfloat16* qkv, int N, int T, bool backward);
  void mlp_up_forward_bf16(const BlockWeights& w, const BlockWeights16& w16, const BlockActs16& a,
                           int N);
  float head_forward_bf16(Slot& s, const float* residual, const int32_t* targets, int B, int T);
  // backward and backward_input (gpt_backward.cpp, gpt_bf16.cpp): the whole backward, or its B
  // part (Note [Split backward], Note [Split backward in bf16]).
  enum class BackwardPart { kWhole, kInput };
  // At any tp. last_micro_batch matters with tp alone: it ends the sums over tp of
  // Note [Sequence-parallel LayerNorm gradients] and Note [Mixtures and tp].
  void backward_bf16(BackwardPart part, int slot, float dloss_scale, const float* dstage_output,
                     float* dstage_input, const GradReadyFn& on_ready, const EmbeddingRowSink* sink,
                     bool last_micro_batch);
  // W's weight GEMMs of one block, from what B kept (Note [Split backward]): fcproj, fc,
  // attproj, qkv; fp32 (gpt_backward.cpp) or bf16 (gpt_bf16.cpp). No weight is read.
  enum class WeightGemm { kFcproj, kFc, kAttproj, kQkv };
  void weight_gemm(int slot, int local_layer, WeightGemm which);
  const float* kept_rows(const float* local, int B, int T);  // all N rows again (SP)
  void weight_gemm_bf16(int slot, int local_layer, WeightGemm which);
  // The bf16 path's tp collectives (gpt_bf16_tp.cpp; Note [bf16 with tp]), tp 1's ops at tp 1.
  void gather_rows_bf16(bfloat16* full, const bfloat16* local, int B, int T, int C);
  void norm_gathered_bf16(bfloat16* out_full, float* mean, float* rstd, const float* inp,
                          const float* w, const float* b, int B, int T);
  // `sum`: start_norm_gathered_backward(dout_partial, ...), waited for here.
  void norm_gathered_backward_bf16(Work sum, float* dres, bfloat16* dres16, float* dw, float* db,
                                   float* dout_partial, const float* inp, const float* w,
                                   const float* mean, const float* rstd, int B, int T, int ln,
                                   bool reduce);
  // The bf16 block's linears, chunked beside their tp collectives where parallel.tp_overlap is
  // on (tp_overlap_bf16.cpp; Note [Tensor-parallel overlap in bf16]), as norm_matmul,
  // matmul_reduce, row_backward and column_backward do in fp32.
  void norm_matmul_bf16(bfloat16* out, bfloat16* normed, float* mean, float* rstd, const float* inp,
                        const float* nw, const float* nb, const bfloat16* w, const float* b, int B,
                        int T, int OC);
  void norm_mlp_up_forward_bf16(const BlockWeights& w, const BlockWeights16& w16,
                                const BlockActs16& a, const float* mlp_in, int B, int T);
  void matmul_reduce_bf16(float* out, float* partial, const bfloat16* inp, const bfloat16* w,
                          const float* bias, int B, int T, int K);
  const bfloat16* row_backward_bf16(bfloat16* dinp, float* dbias, const bfloat16* dlocal,
                                    const bfloat16* w, const bfloat16* pre, int B, int T, int K);
  Work column_backward_bf16(float* dinp, float* dw, float* db, const bfloat16* dout,
                            const bfloat16* inp, const bfloat16* w, int B, int T, int OC);
  // Its part after the sum over tp: the norm's backward of this rank's Nr rows from dout16.
  void norm_local_backward_bf16(float* dres, bfloat16* dres16, float* dw, float* db,
                                const bfloat16* dout16, const float* inp, const float* w,
                                const float* mean, const float* rstd, int Nr, int ln, bool reduce);
  void row_forward_add_bf16(float* out, float* partial, const float* residual, const bfloat16* inp,
                            const bfloat16* w, const float* bias, int B, int T, int K);
  // A mixture layer in the bf16 block (gpt_bf16_widen.cpp, Note [Widening under tp]): ln2 and
  // the mixture on this rank's rows; backward from dres, adding ln2's input gradient.
  void moe_block_forward_bf16(int slot, int local_layer, const BlockWeights& w,
                              const BlockActs16& a, const float* mlp_in, int Nr);
  void moe_block_backward_bf16(int slot, int local_layer, float* dres, bfloat16* dres16,
                               const BlockWeights& w, const BlockWeights& dw, const BlockActs16& a,
                               const float* mlp_in, int Nr, float dloss_scale,
                               bool last_micro_batch);
  float head_forward_bf16_tp(Slot& s, const float* residual, const int32_t* targets, int B, int T);
  // The mean of the slot's per-token losses, read on the host.
  float mean_loss(Slot& s, int N);
  void backward_pass(BackwardPart part, int slot, float dloss_scale, const float* dstage_output,
                     float* dstage_input, const GradReadyFn& on_ready, const EmbeddingRowSink* sink,
                     bool last_micro_batch);
  void progress() const {
    if (progress_) progress_();
  }

  // Tensor-parallel plumbing (gpt_tp.cpp). All are no-ops or plain copies when tp = 1.
  void tp_wait(Work w);
  // reduce_rows in two halves, so that work runs while the sum travels: start returns the
  // collective (an empty Work when there is none), finish waits and places the result.
  Work start_reduce_rows(float* out, float* partial, int B, int T, int C);
  void finish_reduce_rows(Work w, float* out, float* partial, int B, int T, int C);
  // out[Nr,C] = the tp sum of partial[N,C], reduced to this rank's rows (all-reduce, or
  // reduce-scatter with sequence parallelism); partial is clobbered.
  void reduce_rows(float* out, float* partial, int B, int T, int C);
  // full[N,C] = all ranks' rows of local[Nr,C] (a copy without sequence parallelism).
  void gather_rows(float* full, const float* local, int B, int T, int C);
  void place_gathered_rows(void* full, const void* stage, size_t row, int B, int T);
  // The block's norm (LayerNorm or RMSNorm, GPTConfig::norm) over N rows; mean is unused by
  // RMSNorm, b and db are null without a shift.
  void norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                    const float* b, int N, int C);
  void norm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                     const float* w, const float* mean, const float* rstd, int N, int C);
  // RoPE in place on qkv [N, local q|k|v] (no-op with learned positions); backward: its
  // transpose on dqkv.
  void rope(float* qkv, int N, int T, bool backward);
  // cp: this rank's rows [0, T) as runs of consecutive global positions (its two chunks).
  struct CpRun {
    int row, position, rows;
  };
  std::array<CpRun, 2> cp_runs(int T) const {
    return {CpRun{0, cp_positions_[0], T / 2}, CpRun{T / 2, cp_positions_[size_t(T) / 2], T / 2}};
  }
  // Causal attention of a block: this rank's heads, and with cp > 1 its chunks against every
  // rank's keys (CpAttention); att holds what backward needs.
  void attention_forward(float* out, float* att, const float* qkv, int B, int T);
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* att, int B, int T);
  // The MLP's activation: out [N, hidden/tp] from fch [N, fc_rows/tp]; backward dpre = (assign).
  void activation_forward(float* out, const float* pre, int N);
  void activation_backward(float* dpre, const float* pre, const float* dout, int N);
  // The block's linears with their tp collectives (gpt.cpp): a norm then a column-parallel GEMM,
  // and a row-parallel GEMM then the sum over tp (Note [Tensor-parallel overlap]).
  void norm_matmul(float* out, float* normed, float* mean, float* rstd, const float* inp,
                   const float* nw, const float* nb, const float* w, const float* b, int B, int T,
                   int OC);
  void matmul_reduce(float* out, float* partial, const float* inp, const float* w,
                     const float* bias, int B, int T, int K);
  // Their backward (gpt_backward.cpp): a row-parallel input gradient from this rank's rows of
  // the output gradient (returned on all rows), and a column-parallel one with its sum started.
  const float* row_backward(float* dinp, const float* dlocal, const float* w, int B, int T, int K);
  Work column_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                       const float* w, int B, int T, int OC);
  // A norm whose output is needed on all N rows: normalises this rank's rows, gathers.
  void norm_gathered(float* out_full, float* mean, float* rstd, const float* inp, const float* w,
                     const float* b, int B, int T, int C);
  // Backward of norm_gathered given d(out_full) as a per-rank partial sum: reduces it to
  // this rank's rows, then dinp = ...; dw, db += (summed over tp with sequence parallelism:
  // this LayerNorm's `ln` partial sums, reduced and added when `reduce`).
  void norm_gathered_backward(float* dinp, float* dw, float* db, float* dout_full_partial,
                              const float* inp, const float* w, const float* mean,
                              const float* rstd, int B, int T, int C, int ln, bool reduce);
  // The same in two halves, so that a weight gradient is computed while the sum travels
  // (Note [Tensor-parallel overlap]).
  Work start_norm_gathered_backward(float* dout_full_partial, int B, int T, int C);
  void finish_norm_gathered_backward(Work sum, float* dinp, float* dw, float* db,
                                     float* dout_full_partial, const float* inp, const float* w,
                                     const float* mean, const float* rstd, int B, int T, int C,
                                     int ln, bool reduce);
  // The same for a norm whose output stayed on this rank's Nr rows (a mixture's input,
  // Note [Mixtures and tp] in src/model/gpt_moe.cpp): no reduction of dout first.
  void norm_local_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                           const float* w, const float* mean, const float* rstd, int Nr, int C,
                           int ln, bool reduce);
  // Vocab-parallel embedding and cross-entropy (gpt_vocab_parallel.cpp).
  void embedding_forward(float* out, const int32_t* tokens, int B, int T);
  void embedding_backward(const float* dout_full, const int32_t* tokens,
                          const EmbeddingRowSink* sink, int B, int T);
  float crossentropy_forward(Slot& s, const int32_t* targets, int N);
  void crossentropy_backward(Slot& s, const int32_t* targets, float dloss, int N);

  GPTConfig cfg_;
  Backend& be_;
  int maxB_, maxT_;
  std::vector<ParamInfo> infos_;
  std::unordered_map<std::string, int> index_by_name_;  // into infos_
  BackendBuffer<float> params_, grads_;                 // Note [Backend memory]
  size_t num_params_ = 0;                               // params_'s, kept past its release
  std::vector<float*> weight_base_;                     // Note [Weights in unit slots]
  std::vector<float*> grad_base_;                       // Note [Gradients in unit slots]
  BackendBuffer<bfloat16> params16_;                    // bf16: the GEMMs' copy of the weights
  // bf16 without params16_ (ZeRO-3 on a device): a tied head's bf16 weights, cast from wte's
  // slot when stale (wte was given a new base, so gathered again).
  BackendBuffer<bfloat16> tied_head16_;
  bool tied_head16_stale_ = true;
  // bf16: params() calls so far, and per cast span the count its params16_ copy was made at.
  uint64_t weights_version_ = 1;
  std::vector<uint64_t> cast_version_;
  std::vector<Slot> slots_;
  std::vector<BackendBuffer<float>> recompute_;       // one block's dropped buffers
  std::vector<BackendBuffer<bfloat16>> recompute16_;  // bf16: the kBf16Buffer ones
  std::array<size_t, kBlockBuffers> block_sizes_{};
  std::vector<int> mlp_place_;  // per local layer: its place among its chunk's dense ones, or -1
  std::unique_ptr<ParamTable> table_;
  std::vector<float> losses_host_;  // device backends: the per-token losses, read on the host
  // forward_accumulate: the device's sum of micro-batch mean losses, and the host's.
  BackendBuffer<double> loss_sum_device_;
  double loss_sum_host_ = 0.0;
  bool defer_loss_ = false;  // inside forward_accumulate on a device: mean_loss returns 0
  std::unique_ptr<Scratch> scratch_;
  PhaseFn phases_;
  ParamUseFn param_use_;
  std::function<void()> progress_;
  TensorParallel tp_;
  ContextParallel cp_;
  std::unique_ptr<CpAttention> cp_attention_;  // cp > 1
  ExpertParallel ep_;
  std::vector<std::unique_ptr<MoeLayer>> moe_;  // per local layer; null where the MLP is dense
  std::unique_ptr<MoeHfTotals> moe_hf_;
  int moe_count_ = 0;
  std::vector<double> moe_loads_;     // [mixture layers][E]: the bias step's sums (gpt_moe.cpp)
  std::vector<float> moe_bias_step_;  // [mixture layers][E]: sigmoid's bias step,
  BackendBuffer<float> moe_bias_step_device_;  // on the host, then in backend memory
  bool recomputing_ = false;  // inside recompute_block: the mixture's statistics are taken
  double moe_hf_aux_ = 0.0;   // transformers' aux form, summed over micro-batches
  void make_moe_layers(int B, int T, int slots);
  void moe_begin_forward(int slot);
  void moe_end_forward(int slot, int N);
  void moe_begin_backward(int slot);
  // The mixture MLP of block i (gpt_moe.cpp): out = moe(ln2) on N rows; backward dln2 (assign).
  void moe_forward(int slot, int local_layer, float* out, const float* ln2, int N);
  void moe_backward(int slot, int local_layer, float* dln2, const float* dout, const float* ln2,
                    int N, float loss_scale, bool last_micro_batch);
  std::vector<int> cp_positions_;  // cp > 1: the global position of each local row
  StageSpec stage_;
  Recompute recompute_mode_ = Recompute::kNone;
  Precision precision_ = Precision::kFp32;
  float dloss_scale_ = 1.0f;
  bool shared_head_ = false;
  std::vector<int> wte_piece_rows_;   // GPTOptions::wte_piece_rows; empty: one piece
  std::vector<int> chunk_slot_base_;  // [chunks + 1]: each chunk's first slot, then the total
  bool head_chunk(const Slot& s) const;
  bool embedding_chunk(const Slot& s) const;
  int first_ready(const Slot& s) const;  // the chunk's run of the ready list (gpt_backward.cpp)
  int last_ready(const Slot& s) const;
  int rows_divisor_ = 1;  // tp with sequence parallelism, else 1
  TpTimes tp_times_;
  std::unique_ptr<TpOverlap> tp_overlap_;  // tp > 1 with TensorParallel::overlap
};

// llm.c's GPT-2 checkpoint (int32[256] header: magic 20240326, version 3, maxT, V, L, NH, C, Vp;
// then fp32 tensors in llm.c's order). read_llmc_config checks the header (input_error on any
// mismatch); load_llmc_weights copies the tensors into the model (what its tp rank and pipeline
// stage holds), whose config must match. Both are model.init_from's readers: a file that
// is_safetensors() goes to the safetensors functions below instead.
//
// A loader reads one tensor at a time and gives this rank's piece of each (p.count floats, host
// memory) to `write`; empty, it writes the model's parameter buffer. ZeRO-3 on a device writes
// its shards instead, and never holds the full parameters (Note [No full weights on a device]).
using ParamWriteFn = std::function<void(const ParamInfo& p, const float* values)>;
GPTConfig read_llmc_config(const std::string& path);
void load_llmc_weights(GPT& model, const std::string& path, const ParamWriteFn& write = {});
// Writes the model in the same format (`trident export`, tests, handing weights to llm.c).
void save_llmc_weights(GPT& model, const std::string& path);

// Hugging Face weights (model/hf_checkpoint.cpp, Note [Hugging Face checkpoints]): transformers'
// gpt2, gpt_neox, llama and mixtral as save_pretrained writes them, in a directory (config.json and
// model.safetensors, or a sharded model.safetensors.index.json), an index file, or one
// .safetensors file (GPT-2 needs no config.json: names, [in, out] Conv1D weights, the heads in
// __metadata__). is_safetensors: such a directory, an index, or a file by its extension or a
// JSON header after the length. read_ takes the family, shape and options from config.json and
// checks every tensor against them (input_error naming the file, key or tensor); load_ fills the
// model (this rank and stage), whose config must be the file's; save_ writes the whole model
// (one rank) and, with_config or for a family other than GPT-2, config.json beside it; returns
// the bytes of the tensor file.
bool is_safetensors(const std::string& path);
GPTConfig read_safetensors_config(const std::string& path);
void load_safetensors_weights(GPT& model, const std::string& path, const ParamWriteFn& write = {});
size_t save_safetensors_weights(GPT& model, const std::string& path, bool with_config = false);
// Every trident global tensor of the checkpoint, by ParamInfo name (row-major, the vocabulary
// padded as read_safetensors_config pads it, padded rows zero), without building a model: what
// the loader converts, for tests and tools.
std::map<std::string, std::vector<float>> read_hf_global_tensors(const std::string& path,
                                                                 GPTConfig* cfg = nullptr);
// save_safetensors_weights' writer on such tensors (every name of `cfg`'s layout), without a
// model: export's file and config.json, for tests and tools.
size_t save_hf_global_tensors(const GPTConfig& cfg,
                              const std::map<std::string, std::vector<float>>& tensors,
                              const std::string& path, bool with_config);

}  // namespace trident
