#include "io/deck_schema.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <type_traits>

#include "core/text.h"
#include "trident/check.h"

namespace trident::deck_schema {
namespace {

// A Field for `deck.*Section.*Member`; the unary + turns the captureless lambda into a pointer.
template <auto Section, auto Member>
Field at() {
  // clang-format 14 reads this unary + as a binary one and would write `Deck & d`.
  // clang-format off
  return +[](Deck& d) -> auto& { return (d.*Section).*Member; };
  // clang-format on
}

constexpr Bound ge(double v) { return {v, false}; }
constexpr Bound gt(double v) { return {v, true}; }
constexpr Bound le(double v) { return {v, false}; }
constexpr Bound lt(double v) { return {v, true}; }

// The schema. Defaults are not repeated here: they are the initializers in trident/deck.h, read
// through `field` from a default-constructed Deck.
const std::vector<Key>& table() {
  // One key to a row: clang-format would give each designated initializer a line of its own.
  // clang-format off
  static const std::vector<Key> rows = {
      {.name = "model.layers", .field = at<&Deck::model, &ModelConfig::layers>(), .min = ge(1),
       .help = "transformer blocks"},
      {.name = "model.d_model", .field = at<&Deck::model, &ModelConfig::d_model>(), .min = ge(1),
       .help = "embedding width; a multiple of model.heads"},
      {.name = "model.heads", .field = at<&Deck::model, &ModelConfig::heads>(), .min = ge(1),
       .help = "attention heads per block"},
      {.name = "model.vocab", .field = at<&Deck::model, &ModelConfig::vocab>(), .min = ge(2),
       .help = "real vocabulary size; the model pads it to a multiple of 128"},
      {.name = "model.seq_len", .field = at<&Deck::model, &ModelConfig::seq_len>(), .min = ge(1),
       .help = "context length in tokens"},
      {.name = "model.init_from", .field = at<&Deck::model, &ModelConfig::init_from>(),
       .text = Text::kPath,
       .help = "GPT-2 weights to start from: llm.c's checkpoint or Hugging Face safetensors "
               "(its shape replaces model.*); empty: random"},
      {.name = "model.family", .field = at<&Deck::model, &ModelConfig::family>(),
       .text = Text::kEnum, .choices = {"gpt2", "neox", "llama", "mixtral"},
       .help = "the block's family; sets the defaults of the keys below"},
      {.name = "model.norm", .field = at<&Deck::model, &ModelConfig::norm>(),
       .text = Text::kEnum, .choices = {"auto", "layernorm", "rmsnorm"},
       .help = "normalisation (auto: the family's)"},
      {.name = "model.norm_eps", .field = at<&Deck::model, &ModelConfig::norm_eps>(), .min = ge(0),
       .help = "the norm's epsilon (0: 1e-5; LayerNorm takes 1e-5 only)"},
      {.name = "model.position", .field = at<&Deck::model, &ModelConfig::position>(),
       .text = Text::kEnum, .choices = {"auto", "learned", "rotary"},
       .help = "position embedding (auto: the family's)"},
      {.name = "model.rope_base", .field = at<&Deck::model, &ModelConfig::rope_base>(),
       .min = ge(0), .help = "RoPE's base (0: 10000)"},
      {.name = "model.rotary_pct", .field = at<&Deck::model, &ModelConfig::rotary_pct>(),
       .min = ge(0), .max = le(1),
       .help = "the fraction of each head that RoPE rotates (0: the family's)"},
      {.name = "model.mlp", .field = at<&Deck::model, &ModelConfig::mlp>(),
       .text = Text::kEnum, .choices = {"auto", "gelu_tanh", "gelu_erf", "swiglu"},
       .help = "the MLP's activation (auto: the family's)"},
      {.name = "model.mlp_hidden", .field = at<&Deck::model, &ModelConfig::mlp_hidden>(),
       .min = ge(0), .help = "the MLP's hidden width (0: 4·d_model; swiglu: 8·d_model/3 rounded "
                             "up to a multiple of 256)"},
      {.name = "model.kv_heads", .field = at<&Deck::model, &ModelConfig::kv_heads>(), .min = ge(0),
       .help = "key/value heads, dividing model.heads (0: model.heads; 1: multi-query)"},
      {.name = "model.bias", .field = at<&Deck::model, &ModelConfig::bias>(),
       .text = Text::kEnum, .choices = {"auto", "true", "false"},
       .help = "biases on the linear layers and LayerNorm (auto: the family's)"},
      {.name = "model.tied_head", .field = at<&Deck::model, &ModelConfig::tied_head>(),
       .text = Text::kEnum, .choices = {"auto", "true", "false"},
       .help = "the LM head's weight is the token embedding (auto: the family's)"},
      {.name = "model.residual", .field = at<&Deck::model, &ModelConfig::residual>(),
       .text = Text::kEnum, .choices = {"auto", "sequential", "parallel"},
       .help = "parallel: attention and MLP read the same input (auto: the family's)"},
      {.name = "model.moe.experts", .field = at<&Deck::model, &ModelConfig::moe_experts>(),
       .min = ge(0), .help = "experts per mixture layer; 0: dense (family mixtral: 8)"},
      {.name = "model.moe.top_k", .field = at<&Deck::model, &ModelConfig::moe_top_k>(),
       .min = ge(1), .help = "experts each token runs"},
      {.name = "model.moe.ffn_width", .field = at<&Deck::model, &ModelConfig::moe_ffn_width>(),
       .min = ge(0), .help = "an expert's hidden width (0: model.mlp_hidden's)"},
      {.name = "model.moe.every", .field = at<&Deck::model, &ModelConfig::moe_every>(),
       .min = ge(1), .help = "layer l is a mixture when l % every == 0; the rest stay dense"},
      {.name = "model.moe.router", .field = at<&Deck::model, &ModelConfig::moe_router>(),
       .text = Text::kEnum, .choices = {"softmax", "sigmoid"},
       .help = "softmax (Mixtral) or sigmoid scores with a choice bias (DeepSeek-V3)"},
      {.name = "model.moe.norm_topk", .field = at<&Deck::model, &ModelConfig::moe_norm_topk>(),
       .help = "renormalise the k weights to sum 1 (false: Qwen2-MoE, OLMoE)"},
      {.name = "model.moe.bias_update_rate",
       .field = at<&Deck::model, &ModelConfig::moe_bias_update_rate>(), .min = ge(0),
       .help = "sigmoid: the choice bias moves by this times sign(mean load - load) a step"},
      {.name = "model.moe.aux_loss", .field = at<&Deck::model, &ModelConfig::moe_aux_loss>(),
       .text = Text::kEnum, .choices = {"none", "switch", "hf"},
       .help = "load-balancing loss: Megatron-Core's per layer, or transformers' over layers"},
      {.name = "model.moe.aux_loss_coeff",
       .field = at<&Deck::model, &ModelConfig::moe_aux_loss_coeff>(), .min = ge(0),
       .help = "the load-balancing loss's coefficient"},
      {.name = "model.moe.z_loss", .field = at<&Deck::model, &ModelConfig::moe_z_loss>(),
       .min = ge(0), .help = "the router z-loss's coefficient (0: off)"},
      {.name = "model.moe.capacity_factor",
       .field = at<&Deck::model, &ModelConfig::moe_capacity_factor>(), .min = ge(0),
       .help = "0: dropless; else each expert takes ceil(f·tokens·k/experts), later ones drop"},
      {.name = "model.moe.shared_experts",
       .field = at<&Deck::model, &ModelConfig::moe_shared_experts>(), .min = ge(0),
       .help = "shared experts every token runs (one MLP of this many times ffn_width)"},
      {.name = "model.moe.shared_gate", .field = at<&Deck::model, &ModelConfig::moe_shared_gate>(),
       .help = "scale the shared experts' output by sigmoid(x·w) (Qwen2-MoE)"},

      {.name = "train.micro_batch", .field = at<&Deck::train, &TrainConfig::micro_batch>(),
       .min = ge(1), .help = "sequences per micro-batch on each data-parallel rank"},
      {.name = "train.accum", .field = at<&Deck::train, &TrainConfig::accum>(), .min = ge(1),
       .help = "micro-batches accumulated per optimizer step"},
      {.name = "train.steps", .field = at<&Deck::train, &TrainConfig::steps>(), .min = ge(1),
       .help = "optimizer steps"},
      {.name = "train.lr", .field = at<&Deck::train, &TrainConfig::lr>(), .min = gt(0),
       .help = "peak learning rate"},
      {.name = "train.lr_schedule", .field = at<&Deck::train, &TrainConfig::lr_schedule>(),
       .text = Text::kEnum, .choices = {"cosine", "constant"},
       .help = "learning-rate schedule after warm-up"},
      {.name = "train.recompute", .field = at<&Deck::train, &TrainConfig::recompute>(),
       .text = Text::kEnum, .choices = {"none", "mlp", "full"},
       .help = "activation recomputation in backward: none, the MLP's hidden activations, or "
               "full blocks"},
      {.name = "train.nonfinite", .field = at<&Deck::train, &TrainConfig::nonfinite>(),
       .text = Text::kEnum, .choices = {"stop", "skip"},
       .help = "a step whose loss or gradient norm is not finite: stop the run, or skip its "
               "update"},
      {.name = "train.max_skips", .field = at<&Deck::train, &TrainConfig::max_skips>(),
       .min = ge(1),
       .help = "with train.nonfinite skip: stop after this many skipped steps in a row"},
      {.name = "train.stop_at", .field = at<&Deck::train, &TrainConfig::stop_at>(), .min = ge(0),
       .help = "end after this step with a checkpoint, schedule unchanged (a time limit); 0: no"},
      {.name = "train.warmup_steps", .field = at<&Deck::train, &TrainConfig::warmup_steps>(),
       .min = ge(0), .help = "steps of linear warm-up from 0 to train.lr"},
      {.name = "train.min_lr_ratio", .field = at<&Deck::train, &TrainConfig::min_lr_ratio>(),
       .min = ge(0), .max = le(1), .help = "cosine decays to train.lr * min_lr_ratio"},
      {.name = "train.weight_decay", .field = at<&Deck::train, &TrainConfig::weight_decay>(),
       .min = ge(0), .help = "AdamW decoupled weight decay"},
      {.name = "train.grad_clip", .field = at<&Deck::train, &TrainConfig::grad_clip>(),
       .min = ge(0), .help = "clip the global gradient norm to this; 0 turns clipping off"},
      {.name = "train.beta1", .field = at<&Deck::train, &TrainConfig::beta1>(), .min = ge(0),
       .max = lt(1), .help = "AdamW first-moment decay"},
      {.name = "train.beta2", .field = at<&Deck::train, &TrainConfig::beta2>(), .min = ge(0),
       .max = lt(1), .help = "AdamW second-moment decay"},
      {.name = "train.eps", .field = at<&Deck::train, &TrainConfig::eps>(), .min = gt(0),
       .help = "AdamW denominator epsilon"},
      {.name = "train.seed", .field = at<&Deck::train, &TrainConfig::seed>(),
       .help = "seed for initialisation and data order"},
      {.name = "train.val_every", .field = at<&Deck::train, &TrainConfig::val_every>(),
       .min = ge(0), .help = "validate every N steps; 0: never"},
      {.name = "train.val_batches", .field = at<&Deck::train, &TrainConfig::val_batches>(),
       .min = ge(1), .help = "micro-batches per validation"},

      {.name = "data.train", .field = at<&Deck::data, &DataConfig::train>(), .text = Text::kPath,
       .help = "training data: token file, llm.c shard or Megatron indexed dataset (required)"},
      {.name = "data.valid", .field = at<&Deck::data, &DataConfig::valid>(), .text = Text::kPath,
       .help = "validation data, as data.train; empty: no validation"},
      {.name = "data.shuffle", .field = at<&Deck::data, &DataConfig::shuffle>(),
       .help = "shuffle the order of training sequences"},

      {.name = "log.every", .field = at<&Deck::log, &LogConfig::every>(), .min = ge(1),
       .help = "print every N steps (the metrics file gets every step)"},
      {.name = "log.jsonl", .field = at<&Deck::log, &LogConfig::jsonl>(),
       .help = "metrics file, relative to run.out_dir"},
      {.name = "log.trace", .field = at<&Deck::log, &LogConfig::trace>(), .text = Text::kPath,
       .help = "Chrome-trace JSON per rank; empty: none"},
      {.name = "log.tensorboard", .field = at<&Deck::log, &LogConfig::tensorboard>(),
       .help = "TensorBoard event files (rank 0): a directory relative to run.out_dir, true for "
               "run.out_dir/tensorboard; empty or false: none"},

      {.name = "run.threads", .field = at<&Deck::run, &RunConfig::threads>(), .min = ge(1),
       .help = "CPU threads per rank"},
      {.name = "run.out_dir", .field = at<&Deck::run, &RunConfig::out_dir>(), .text = Text::kPath,
       .help = "output directory; empty: runs/<deck file stem>"},
      {.name = "run.backend", .field = at<&Deck::run, &RunConfig::backend>(),
       .text = Text::kEnum, .choices = {"cpu", "cuda"},
       .help = "where the layers run: cpu (OpenBLAS, OpenMP) or cuda (one GPU per rank)"},
      {.name = "run.attention", .field = at<&Deck::run, &RunConfig::attention>(),
       .text = Text::kEnum, .choices = {"auto", "cudnn", "flash"},
       .help = "cuda attention: cuDNN fused attention where it has a plan (auto), or force one"},
      {.name = "run.precision", .field = at<&Deck::run, &RunConfig::precision>(),
       .text = Text::kEnum, .choices = {"fp32", "bf16"},
       .help = "activations: fp32, or bf16 for what the GEMMs read (cuda; with tp, no "
               "parallel.tp_overlap)"},

      {.name = "parallel.dp", .field = at<&Deck::parallel, &ParallelConfig::dp>(), .min = ge(0),
       .help = "data-parallel ranks; 0: world size / (tp * pp * cp)"},
      {.name = "parallel.tp", .field = at<&Deck::parallel, &ParallelConfig::tp>(), .min = ge(1),
       .help = "tensor-parallel ranks; must divide model.heads"},
      {.name = "parallel.pp", .field = at<&Deck::parallel, &ParallelConfig::pp>(), .min = ge(1),
       .help = "pipeline stages; at most model.layers"},
      {.name = "parallel.dp_replicate",
       .field = at<&Deck::parallel, &ParallelConfig::dp_replicate>(), .min = ge(1),
       .help = "HSDP: dp = dp_replicate * dp_shard; replicas of the sharded group, the outer "
               "data-parallel dimension (the grid only: gradients still reduce over all of dp)"},
      {.name = "parallel.dp_shard", .field = at<&Deck::parallel, &ParallelConfig::dp_shard>(),
       .min = ge(0),
       .help = "data-parallel ranks inside one replica (the inner dimension); 0: dp / "
               "dp_replicate"},
      {.name = "parallel.cp", .field = at<&Deck::parallel, &ParallelConfig::cp>(), .min = ge(1),
       .help = "context-parallel ranks (between dp and tp in the rank order): each sequence is "
               "split into 2*cp chunks, rank r holding chunks r and 2*cp-1-r; seq_len must be "
               "a multiple of 2*cp (Note [Context parallelism] in src/model/cp_attention.h)"},
      {.name = "parallel.cp_comm", .field = at<&Deck::parallel, &ParallelConfig::cp_comm>(),
       .text = Text::kEnum, .choices = {"ring", "allgather"},
       .help = "context parallelism's K/V exchange: ring (each block sent on while the "
               "previous one is computed on) or allgather (gathered before attention, their "
               "gradients reduce-scattered after)"},
      {.name = "parallel.ep", .field = at<&Deck::parallel, &ParallelConfig::ep>(), .min = ge(1),
       .help = "expert-parallel ranks, consecutive within dp × cp: each holds experts/ep of every "
               "mixture layer, and tokens travel to them by all-to-all"},
      {.name = "parallel.sequence_parallel",
       .field = at<&Deck::parallel, &ParallelConfig::sequence_parallel>(),
       .help = "split LayerNorm and residual regions along the sequence over tp ranks"},
      {.name = "parallel.tp_overlap", .field = at<&Deck::parallel, &ParallelConfig::tp_overlap>(),
       .text = Text::kEnum, .choices = {"auto", "true", "false"},
       .help = "hide the tensor-parallel collectives behind the GEMMs: the all-gather and "
               "reduce-scatter of sequence parallelism ride a ring piece by piece beside the "
               "chunked GEMMs, the all-reduce without it goes in pieces, and backward's "
               "input-gradient sums travel while the weight gradients are computed (Note "
               "[Tensor-parallel overlap] in src/model/tp_overlap.h); CPU backend. auto: where it "
               "wins, when the tp group spans nodes or comm.emulate_groups names tp (on one "
               "node's shared memory the bytes move only while compute waits); run.precision bf16 "
               "too, its gathers in bf16 and its sums in fp32"},
      {.name = "parallel.tp_overlap_chunks",
       .field = at<&Deck::parallel, &ParallelConfig::tp_overlap_chunks>(), .min = ge(0),
       .help = "with parallel.tp_overlap: the pieces each rank's ring chunk is cut into with "
               "sequence parallelism (a GEMM starts on a chunk's first piece), or each "
               "row-parallel all-reduce without it; must divide a rank's rows of a sequence "
               "(seq_len / cp, / tp with sequence parallelism); 0: 2 with sequence parallelism, "
               "tp without (or the most of those that divides)"},
      {.name = "parallel.schedule", .field = at<&Deck::parallel, &ParallelConfig::schedule>(),
       .text = Text::kEnum, .choices = {"gpipe", "1f1b", "zb-h1", "interleaved"},
       .help = "pipeline schedule (zb-h1: zero-bubble, split backward, train.recompute none; "
               "interleaved: parallel.virtual_stages chunks per stage, train.accum a multiple "
               "of parallel.pp); train.accum micro-batches are the pipeline's micro-batches"},
      {.name = "parallel.virtual_stages",
       .field = at<&Deck::parallel, &ParallelConfig::virtual_stages>(), .min = ge(1),
       .help = "model chunks per pipeline stage (parallel.schedule interleaved); 1 otherwise"},
      {.name = "parallel.stage_layers",
       .field = at<&Deck::parallel, &ParallelConfig::stage_layers>(),
       .help = "blocks per pipeline stage, comma-separated (e.g. \"3,1\"); with "
               "parallel.virtual_stages, per virtual stage (chunk·pp + stage); empty: balanced"},
      {.name = "parallel.zero", .field = at<&Deck::parallel, &ParallelConfig::zero>(), .min = ge(0),
       .max = le(3),
       .help = "ZeRO stage: 0 replicates AdamW's state; 1 shards it over dp (reduce-scatter, "
               "then all-gather of the parameters); 2 also releases each reduced bucket's "
               "gradients; 3 also shards the parameters, gathered unit by unit (a block, wte, "
               "wpe, the head) while they run (run.backend cpu)"},
      {.name = "parallel.reshard_after_forward",
       .field = at<&Deck::parallel, &ParallelConfig::reshard_after_forward>(),
       .help = "with parallel.zero 3: release each unit after its forward and gather it again "
               "for backward (true), or keep it gathered from forward to backward, at ZeRO-2's "
               "parameter memory (false)"},
      {.name = "parallel.zero3_gather",
       .field = at<&Deck::parallel, &ParallelConfig::zero3_gather>(), .text = Text::kEnum,
       .choices = {"micro_batch", "step"},
       .help = "with parallel.zero 3 and several micro-batches (train.accum, pipelines): gather "
               "the units again for every micro-batch (micro_batch), or once per step, keeping "
               "the stage's units gathered to the step's end (step)"},
      {.name = "parallel.zero_reduce",
       .field = at<&Deck::parallel, &ParallelConfig::zero_reduce>(), .text = Text::kEnum,
       .choices = {"step", "micro_batch"},
       .help = "with parallel.zero 2 and train.accum > 1: reduce-scatter the gradients once per "
               "step, accumulated over the micro-batches (Megatron), or after every micro-batch "
               "into the shard, holding less (DeepSpeed)"},

      {.name = "comm.overlap", .field = at<&Deck::comm, &CommConfig::overlap>(),
       .help = "overlap the gradient all-reduce with the backward pass"},
      {.name = "comm.bucket_mb", .field = at<&Deck::comm, &CommConfig::bucket_mb>(),
       .min = gt(0), .help = "gradient bucket size in MiB"},
      {.name = "comm.first_bucket_mb", .field = at<&Deck::comm, &CommConfig::first_bucket_mb>(),
       .min = gt(0), .help = "first bucket's size in MiB (small, so communication starts early)"},
      {.name = "comm.emulate_gbps", .field = at<&Deck::comm, &CommConfig::emulate_gbps>(),
       .min = ge(0), .help = "emulated link bandwidth in Gbit/s; 0: no emulation"},
      {.name = "comm.emulate_latency_us",
       .field = at<&Deck::comm, &CommConfig::emulate_latency_us>(), .min = ge(0),
       .help = "emulated per-message latency in microseconds"},
      {.name = "comm.emulate_groups", .field = at<&Deck::comm, &CommConfig::emulate_groups>(),
       .help = "the groups whose communicators the emulated link slows, comma-separated from "
               "dp (the gradients' and ZeRO's), tp, cp and ep; e.g. \"dp,tp\""},
      {.name = "comm.timeout_s", .field = at<&Deck::comm, &CommConfig::timeout_s>(),
       .min = gt(0), .help = "seconds a collective may wait before the run aborts"},
      {.name = "comm.grad_dtype", .field = at<&Deck::comm, &CommConfig::grad_dtype>(),
       .text = Text::kEnum, .choices = {"fp32", "bf16"},
       .help = "element type of the data-parallel gradient all-reduce: bf16 halves the bytes "
               "sent (rounded to bf16, summed in bf16, widened back to fp32), on the GPU (NCCL) "
               "and on the CPU (MPI)"},

      {.name = "checkpoint.dir", .field = at<&Deck::checkpoint, &CheckpointConfig::dir>(),
       .text = Text::kPath,
       .help = "checkpoint directory (step_NNNNNNNN/ and latest); empty: none"},
      {.name = "checkpoint.every", .field = at<&Deck::checkpoint, &CheckpointConfig::every>(),
       .min = ge(0), .help = "save every N steps; 0: only at the end"},
      {.name = "checkpoint.keep", .field = at<&Deck::checkpoint, &CheckpointConfig::keep>(),
       .min = ge(1), .help = "newest complete checkpoints kept"},
      {.name = "checkpoint.resume", .field = at<&Deck::checkpoint, &CheckpointConfig::resume>(),
       .text = Text::kEnum, .choices = {"false", "true", "auto"},
       .help = "continue from checkpoint.dir/latest: true (refuse if none), auto (if any)"},
      {.name = "checkpoint.async", .field = at<&Deck::checkpoint, &CheckpointConfig::async>(),
       .help = "save in the background: the step waits only for a host snapshot of what is "
               "saved, a writer thread writes it; latest moves when every shard is durable"},
      {.name = "checkpoint.write_share",
       .field = at<&Deck::checkpoint, &CheckpointConfig::write_share>(), .min = ge(0),
       .max = le(1),
       .help = "the share of one core an async save's writer may use while training goes on "
               "(paced by its CPU time); 0: auto, 0.1 on a CPU backend, 1 on a GPU's; saves at "
               "a stop, and a write someone waits for, run unpaced"},
      {.name = "checkpoint.on_error", .field = at<&Deck::checkpoint, &CheckpointConfig::on_error>(),
       .text = Text::kEnum, .choices = {"stop", "continue"},
       .help = "a save that failed (full disk, I/O error, damaged shard): stop the run (exit 2) "
               "or report it and continue; latest stays at the previous checkpoint either way"},
  };
  // clang-format on
  return rows;
}

template <class... Fs>
struct overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
overloaded(Fs...) -> overloaded<Fs...>;  // C++20 deduces this; clang 14 (the fuzz build) needs it

// The value a key holds in `deck`, as a double (numbers only; ranges are checked on it).
double as_double(const Key& key, const Deck& deck) {
  Deck& d = const_cast<Deck&>(deck);  // Field is a read-write accessor; this only reads
  return std::visit(
      overloaded{[&](int& (*get)(Deck&)) { return double(get(d)); },
                 [&](double& (*get)(Deck&)) { return get(d); }, [&](auto) { return 0.0; }},
      key.field);
}

// from_chars over the whole text, after an optional '+' (YAML allows one; from_chars does not).
template <class T>
std::errc parse_number(std::string_view text, T& out) {
  if (text.size() > 1 && text[0] == '+' && text[1] != '-') text.remove_prefix(1);
  if (text.empty()) return std::errc::invalid_argument;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (ec == std::errc() && end != text.data() + text.size()) return std::errc::invalid_argument;
  return ec;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string got(const Scalar& v) {
  return v.non_scalar.empty() ? yaml_quote(v.text) : std::string(v.non_scalar);
}

std::string number(double v) { return fmt::format("{}", v); }

}  // namespace

const std::vector<Key>& keys() { return table(); }

const std::vector<std::string_view>& sections() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> out;
    for (const Key& k : table())
      if (std::find(out.begin(), out.end(), k.section()) == out.end()) out.push_back(k.section());
    return out;
  }();
  return names;
}

bool is_group(std::string_view name) {
  for (const Key& k : keys())
    if (k.name.size() > name.size() + 1 && k.name.substr(0, name.size()) == name &&
        k.name[name.size()] == '.')
      return true;
  return false;
}

const Key* find(std::string_view name) {
  for (const Key& k : table())
    if (k.name == name) return &k;
  return nullptr;
}

int index_of(const Key& key) { return int(&key - table().data()); }

std::string subject(std::string_view where, std::string_view key) {
  if (where.starts_with("--set")) return fmt::format("{} {}", where, key);
  return fmt::format("{}: {}", where, key);
}

void assign(const Key& key, Deck& deck, const Scalar& value, std::string_view where,
            const std::string& base_dir) {
  auto wrong_type = [&] {
    input_error("{}: expected {}, got {}", subject(where, key.name), type_text(key), got(value));
  };
  if (!value.non_scalar.empty() && !(value.non_scalar == "nothing" && key.text != Text::kEnum &&
                                     std::holds_alternative<std::string& (*)(Deck&)>(key.field)))
    wrong_type();  // only plain strings and paths may be left empty
  const std::string& text = value.text;

  std::visit(overloaded{
                 [&](int& (*get)(Deck&)) {
                   int64_t v = 0;
                   std::errc ec = parse_number(text, v);
                   if (ec == std::errc::invalid_argument) wrong_type();
                   if (ec != std::errc() || v < std::numeric_limits<int>::min() ||
                       v > std::numeric_limits<int>::max())
                     input_error("{}: {} does not fit in a 32-bit integer",
                                 subject(where, key.name), text);
                   get(deck) = int(v);
                 },
                 [&](uint64_t& (*get)(Deck&)) {
                   uint64_t v = 0;
                   std::errc ec = parse_number(text, v);
                   if (ec == std::errc::invalid_argument) wrong_type();
                   if (ec != std::errc())
                     input_error("{}: {} does not fit in a 64-bit unsigned integer",
                                 subject(where, key.name), text);
                   get(deck) = v;
                 },
                 [&](double& (*get)(Deck&)) {
                   double v = 0;
                   std::errc ec = parse_number(text, v);
                   if (ec != std::errc() || !std::isfinite(v)) wrong_type();
                   get(deck) = v;
                 },
                 [&](bool& (*get)(Deck&)) {
                   std::string t = lower(text);  // YAML 1.1 spellings, as yaml-cpp accepts them
                   if (t == "true" || t == "yes" || t == "on") {
                     get(deck) = true;
                   } else if (t == "false" || t == "no" || t == "off") {
                     get(deck) = false;
                   } else {
                     wrong_type();
                   }
                 },
                 [&](std::string& (*get)(Deck&)) {
                   if (key.text == Text::kEnum &&
                       std::find(key.choices.begin(), key.choices.end(), text) == key.choices.end())
                     input_error("{}: must be {}, got {}", subject(where, key.name), type_text(key),
                                 yaml_quote(text));
                   std::string v = text;
                   if (key.text == Text::kPath && !v.empty())
                     v = (std::filesystem::path(base_dir) / v).lexically_normal().string();
                   get(deck) = v;
                 },
             },
             key.field);
}

void check_range(const Key& key, const Deck& deck, std::string_view where) {
  if (!key.min && !key.max) return;
  double v = as_double(key, deck);
  bool below = key.min && (key.min->strict ? v <= key.min->value : v < key.min->value);
  bool above = key.max && (key.max->strict ? v >= key.max->value : v > key.max->value);
  if (below || above)
    input_error("{}: must be {}, got {}", subject(where, key.name), range_text(key),
                format_value(key, deck));
}

std::string format_value(const Key& key, const Deck& deck) {
  Deck& d = const_cast<Deck&>(deck);  // read only
  return std::visit(overloaded{
                        [&](int& (*get)(Deck&)) { return fmt::format("{}", get(d)); },
                        [&](uint64_t& (*get)(Deck&)) { return fmt::format("{}", get(d)); },
                        // fmt's "{}" is the shortest text that reads back to the same double.
                        [&](double& (*get)(Deck&)) { return fmt::format("{}", get(d)); },
                        [&](bool& (*get)(Deck&)) { return std::string(get(d) ? "true" : "false"); },
                        [&](std::string& (*get)(Deck&)) { return yaml_quote(get(d)); },
                    },
                    key.field);
}

std::string type_text(const Key& key) {
  if (key.text == Text::kEnum) return fmt::format("one of {}", fmt::join(key.choices, "|"));
  return std::visit(overloaded{[](int& (*)(Deck&)) { return "an integer"; },
                               [](uint64_t& (*)(Deck&)) { return "a non-negative integer"; },
                               [](double& (*)(Deck&)) { return "a number"; },
                               [](bool& (*)(Deck&)) { return "true or false"; },
                               [&](std::string& (*)(Deck&)) {
                                 return key.text == Text::kPath ? "a path" : "a string";
                               }},
                    key.field);
}

std::string range_text(const Key& key) {
  if (key.min && key.max)
    return fmt::format("in {}{}, {}{}", key.min->strict ? '(' : '[', number(key.min->value),
                       number(key.max->value), key.max->strict ? ')' : ']');
  if (key.min) return fmt::format("{} {}", key.min->strict ? ">" : ">=", number(key.min->value));
  if (key.max) return fmt::format("{} {}", key.max->strict ? "<" : "<=", number(key.max->value));
  return "";
}

}  // namespace trident::deck_schema

namespace trident {

std::string deck_reference() {
  using namespace deck_schema;
  struct Line {
    std::string key, type, range, value, help;
  };
  const Deck defaults;
  std::vector<Line> lines = {{"key", "type", "range", "default", "description"}};
  for (const Key& k : keys()) {
    std::string type = type_text(k);
    if (type.starts_with("an ")) type.erase(0, 3);
    if (type.starts_with("a ")) type.erase(0, 2);
    lines.push_back(
        {std::string(k.name), type, range_text(k), format_value(k, defaults), std::string(k.help)});
  }
  size_t w[4] = {0, 0, 0, 0};
  for (const Line& l : lines) {
    w[0] = std::max(w[0], l.key.size());
    w[1] = std::max(w[1], l.type.size());
    w[2] = std::max(w[2], l.range.size());
    w[3] = std::max(w[3], l.value.size());
  }
  std::string out;
  for (const Line& l : lines)
    out += fmt::format("{:<{}}  {:<{}}  {:<{}}  {:<{}}  {}\n", l.key, w[0], l.type, w[1], l.range,
                       w[2], l.value, w[3], l.help);
  return out;
}

}  // namespace trident
