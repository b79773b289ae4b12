// The input deck: a YAML file that describes a run completely, plus `--set a.b=v` overrides.
//
//   model:                     # the file form: one map per section
//     layers: 8
//   train: {steps: 500, lr: 3e-4}
//
//   trident run deck.yaml --set train.lr=1e-3 --set data.shuffle=true   # the override form
//
// Every key has a type, a default and an allowed range; the schema table in
// src/io/deck_schema.cpp is the single source of truth (deck_reference() prints it). An override
// value is read as a YAML scalar, then typed by the schema; overrides apply in order after the
// file, so the last one wins. Unknown keys (with a "did you mean" hint), wrong types,
// out-of-range values, malformed YAML and a missing file throw trident::Error with
// ExitCode::kBadInput; the message starts with the deck path (and line:column where known) or
// with `--set`, and names the key and what is allowed.
//
// Paths. Relative paths (data.train, data.valid, model.init_from, run.out_dir, log.trace) are
// resolved when the deck is read: those written in the deck file against the deck file's
// directory, those given with --set against the working directory. Resolved paths are absolute
// and normalised, so the resolved deck that is saved with the run reads back (from anywhere) to
// the same files. log.jsonl is the exception: it stays as written and is relative to
// run.out_dir. An empty run.out_dir becomes "runs/<deck file stem>" under the working directory
// ("runs/deck" for parse_deck, which has no file). An empty data.valid / log.trace /
// model.init_from means "none" and stays empty.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace trident {

struct ModelConfig {
  int layers = 4;
  int d_model = 128;
  int heads = 4;
  int vocab = 256;  // real vocabulary; the model pads it to a multiple of 128
  int seq_len = 64;
  std::string init_from;  // weights (llm.c or Hugging Face); its config replaces the deck's
  // The block (trident/model_config.h): a family sets the defaults, each key below overrides
  // one choice; "auto" and 0 mean the family's.
  std::string family = "gpt2";     // gpt2 | neox | llama | mixtral (llama + 8 experts top 2)
  std::string norm = "auto";       // layernorm | rmsnorm
  double norm_eps = 0;             // 1e-5
  std::string position = "auto";   // learned | rotary
  double rope_base = 0;            // 10000
  double rotary_pct = 0;           // neox 0.25, llama 1
  std::string mlp = "auto";        // gelu_tanh | gelu_erf | swiglu
  int mlp_hidden = 0;              // 4·d_model; swiglu: 256·ceil(8·d_model/3/256)
  int kv_heads = 0;                // model.heads
  std::string bias = "auto";       // true | false
  std::string tied_head = "auto";  // true | false
  std::string residual = "auto";   // sequential | parallel
  // Mixtures of experts (model.moe.*; Note [Mixture of experts] in trident/model_config.h).
  int moe_experts = 0;
  int moe_top_k = 2;
  int moe_ffn_width = 0;
  int moe_every = 1;
  std::string moe_router = "softmax";  // softmax | sigmoid
  bool moe_norm_topk = true;
  double moe_bias_update_rate = 1e-3;
  std::string moe_aux_loss = "none";  // none | switch | hf
  double moe_aux_loss_coeff = 0.01;
  double moe_z_loss = 0;
  double moe_capacity_factor = 0;
  int moe_shared_experts = 0;
  bool moe_shared_gate = false;

  bool operator==(const ModelConfig&) const = default;
};

struct TrainConfig {
  int micro_batch = 4;
  int accum = 1;
  int steps = 100;
  double lr = 1e-3;
  std::string lr_schedule = "cosine";  // cosine | constant
  int warmup_steps = 10;
  double min_lr_ratio = 0.1;  // cosine decays to lr * min_lr_ratio
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // 0 turns clipping off
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  uint64_t seed = 1337;
  int val_every = 50;              // 0: no validation
  int val_batches = 4;             // micro-batches per validation
  std::string recompute = "none";  // activation recomputation: none | mlp | full
  int stop_at = 0;                 // end after this step with a checkpoint (0: run all steps)
  std::string nonfinite = "stop";  // a step with a non-finite loss or norm: stop | skip
  int max_skips = 10;              // with skip: stop after this many skipped in a row

  bool operator==(const TrainConfig&) const = default;
};

struct DataConfig {
  std::string train;
  std::string valid;  // empty: no validation
  bool shuffle = false;

  bool operator==(const DataConfig&) const = default;
};

struct LogConfig {
  int every = 1;                        // print every N steps (metrics file gets every step)
  std::string jsonl = "metrics.jsonl";  // relative to run.out_dir
  std::string trace;                    // Chrome-trace JSON per rank; empty: none
  // TensorBoard event files' directory (rank 0); empty: none; resolved by the deck reader:
  // true/on/yes is run.out_dir/tensorboard, a relative path is under run.out_dir.
  std::string tensorboard;

  bool operator==(const LogConfig&) const = default;
};

struct RunConfig {
  int threads = 2;
  std::string out_dir;             // default: runs/<deck file stem>
  std::string backend = "cpu";     // cpu | cuda
  std::string attention = "auto";  // cuda: auto | cudnn | flash
  std::string precision = "fp32";  // activations: fp32 | bf16 (cuda; Note [bf16 activations])

  bool operator==(const RunConfig&) const = default;
};

struct CheckpointConfig {
  std::string dir;               // empty: no checkpoints
  int every = 0;                 // save every N steps (0: only at the end)
  int keep = 2;                  // newest complete checkpoints kept
  std::string resume = "false";  // false | true (refuse if none) | auto
  // Note [Asynchronous checkpoints] (src/train/checkpoint_saver.h): snapshot, then write in
  // the background.
  bool async = false;
  std::string on_error = "stop";  // a save that failed: stop | continue
  // Note [Paced background writes] (src/io/checkpoint_format.h): the share of one core the
  // background writer may use; 0: auto (0.1 on a host backend, 1 on a device's).
  double write_share = 0.0;

  bool operator==(const CheckpointConfig&) const = default;
};

struct ParallelConfig {
  int dp = 0;  // 0: derived from the world size
  int tp = 1;
  int pp = 1;
  int dp_replicate = 1;          // dp = dp_replicate × dp_shard (HSDP: replicas of sharded groups)
  int dp_shard = 0;              // 0: dp / dp_replicate
  int cp = 1;                    // context parallelism: each sequence split over cp ranks
  std::string cp_comm = "ring";  // how K/V reach the cp ranks: ring | allgather
  int ep = 1;                    // expert parallelism over dp × cp (model.moe)
  bool sequence_parallel = false;  // Megatron's sequence parallelism (needs tp > 1)
  // Note [Tensor-parallel overlap] (src/model/tp_overlap.h): tp collectives split into pieces
  // that travel while the GEMMs compute: of each ring chunk with sequence parallelism, of the
  // all-reduce without (0: 2 and tp).
  std::string tp_overlap = "auto";  // auto | true | false (auto: where it wins)
  int tp_overlap_chunks = 0;
  std::string schedule = "1f1b";  // pipeline schedule: gpipe | 1f1b | zb-h1 | interleaved
  int virtual_stages = 1;         // model chunks per stage (interleaved)
  std::string stage_layers;       // blocks per (virtual) stage, e.g. "3,1"; empty: balanced
  int zero = 0;                   // ZeRO stage (Note [ZeRO-1] in train/zero.h)
  // ZeRO-2 with train.accum > 1 (Note [ZeRO-2 and accumulation] in train/zero.h): "step"
  // reduce-scatters once, on the last micro-batch; "micro_batch" after every one.
  std::string zero_reduce = "step";
  // ZeRO-3 (Note [ZeRO-3 units] in train/zero3.h): release a unit after its forward, and
  // gather per micro-batch or once per step.
  bool reshard_after_forward = true;
  std::string zero3_gather = "micro_batch";

  bool operator==(const ParallelConfig&) const = default;
};

struct CommConfig {
  bool overlap = true;
  double bucket_mb = 25.0;
  double first_bucket_mb = 1.0;
  double emulate_gbps = 0.0;  // 0: no emulation
  double emulate_latency_us = 0.0;
  std::string emulate_groups = "dp";  // the groups the emulated link slows: dp, tp, cp, ep
  double timeout_s = 300.0;
  std::string grad_dtype = "fp32";  // gradient all-reduce on the GPU: fp32 | bf16

  bool operator==(const CommConfig&) const = default;
};

struct Deck {
  ModelConfig model;
  TrainConfig train;
  DataConfig data;
  LogConfig log;
  RunConfig run;
  ParallelConfig parallel;
  CommConfig comm;
  CheckpointConfig checkpoint;
  std::string source;  // the deck file's absolute path; empty from parse_deck

  // The resolved deck (every key, defaults filled in) as YAML: printed and saved with the run.
  std::string to_yaml() const;

  bool operator==(const Deck&) const = default;
};

// Reads `path`, applies each "a.b=value" override in order, validates. Throws on bad input.
Deck load_deck(const std::string& path, const std::vector<std::string>& overrides = {});
// The same from YAML text (tests; `source_dir` resolves relative paths).
Deck parse_deck(const std::string& yaml_text, const std::string& source_dir,
                const std::vector<std::string>& overrides = {});

// Every key with its type, allowed range, default and a one-line description (for --help).
std::string deck_reference();

// comm.emulate_groups: whether the emulated link slows `group` ("dp", "tp", "cp" or "ep").
bool link_emulated_for(const CommConfig& comm, std::string_view group);

}  // namespace trident
