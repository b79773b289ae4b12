// `trident plan`: a performance model of one training step, per rank, for any layout, and the
// hardware descriptions it runs against (inputs/hardware/*.yaml).
//
// The model (Note [Plan model] in src/plan/model.cpp) is written once: the command, the docs
// (docs/plan.md) and the tests all call predict(). Every term has a name and is printed.
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "trident/deck.h"
#include "trident/model_config.h"

namespace trident {

// ---- Hardware (src/plan/hardware.cpp, Note [Hardware files]) -------------------------------

// Achieved GEMM rate for GEMMs whose smallest dimension (M, N or K) is min_dim. Between points
// the rate is interpolated in log(min_dim); outside, the nearest point's rate holds.
struct GemmPoint {
  int min_dim = 0;
  double tflops = 0;  // per device (cpu: per core), achieved
};

struct LinkSpec {
  double gbytes_per_s = 0;  // achieved bus bandwidth per device, one direction (GB = 1e9 B)
  double latency_us = 0;    // per message / per ring hop
};

struct Hardware {
  std::string name;                // the file's `name:`
  std::string path;                // where it was read from
  std::string kind = "gpu";        // gpu | cpu
  int devices_per_node = 8;        // gpu: GPUs per node; cpu: cores per node (one device = a core)
  std::string dtype = "bf16";      // what trident computes in there: bf16 (mixed) | fp32
  double peak_tflops = 0;          // per device at dtype, dense: MFU's denominator (vendor's)
  std::vector<GemmPoint> gemm;     // ascending min_dim, at least one point
  double attention_tflops = 0;     // fused attention's achieved rate; 0: as GEMMs + memory traffic
  double memory_gbytes_per_s = 0;  // achieved device (cpu: node) memory bandwidth
  // The elementwise kernels' rate (LayerNorm, GELU: cpu per core, measured); 0: they run at
  // memory_gbytes_per_s.
  double elementwise_gbytes_per_s = 0;
  // AdamW's rate at 32 B per parameter (cpu: per core, measured); 0: memory_gbytes_per_s.
  double optimizer_gbytes_per_s = 0;
  // The sum of a model's per-op terms / its measured forward + backward (cpu: calibrated on a
  // small GPT), in (0, 2]; compute terms are divided by it. 1: the terms are the whole story.
  double compute_efficiency = 1;
  // The cross-entropy's memory traffic per logit, bytes, forward and backward, where the software
  // a description stands for moves more than trident does (Megatron-Core 2024's fp32 upcast);
  // 0: trident's own, 3 and 2 elements at dtype (Note [Plan cross-entropy traffic]).
  double cross_entropy_forward_bytes = 0;
  double cross_entropy_backward_bytes = 0;
  double memory_gb = 0;  // capacity per device (cpu: per node), GB = 1e9 B
  LinkSpec intra_node;   // NVLink / shared memory
  LinkSpec inter_node;   // InfiniBand / TCP, per device
  // Fraction by which compute slows while a collective overlaps it (cpu: the communication
  // thread's work runs on the compute cores; gpu: SMs the collective kernels take).
  double overlap_slowdown = 0;
  // The same while tensor-parallel collectives overlap it, where their kernels take another share
  // of the device than the dp collectives' (Megatron's userbuffers); < 0: overlap_slowdown.
  double tp_overlap_slowdown = -1;
  // cpu: a core's share of its single-thread GEMM rate when every core of the node computes at
  // once (shared vector units or memory, lower turbo); 1: cores scale linearly.
  double core_scaling = 1;
  // cpu: one rank's GEMM rate with a thread on every core / (cores × its single-thread rate).
  double thread_scaling = 1;
  // A checkpoint snapshot's copy into host memory (checkpoint.async,
  // Note [Plan checkpoint snapshot] in src/plan/memory.cpp), GB/s of bytes copied: gpu: one
  // device's pinned device-to-host rate while the node's devices copy at once; cpu: one
  // thread's memcpy into a touched buffer. 0: unknown (gpu: no time is given), half of
  // memory_gbytes_per_s (cpu: a copy reads and writes every byte).
  double host_copy_gbytes_per_s = 0;
  std::string host_copy_path;  // what that copy crosses, as printed ("PCIe Gen5 x16"); optional
  double host_memory_gb = 0;   // gpu: host memory per node (where pinned snapshots sit); 0: unknown
  std::vector<std::string> sources;  // where each figure comes from (cited, or "measured ...")
};

// Reads and checks a hardware file; bad input throws trident::Error (exit 2) naming the key.
Hardware load_hardware(const std::string& path);
// NAME or a path: a path that exists is read; otherwise NAME.yaml, looked up in the user's
// directory (user_hardware_dir), then beside the executable (../inputs/hardware), then in the
// source tree the binary was built from; a name that begins exactly one description's name up
// to a dash (dgx-a100 for dgx-a100-80gb) reads that one. Unknown names list the files there.
Hardware find_hardware(const std::string& name_or_path);
// Where `trident plan --calibrate` writes and --hardware NAME looks first:
// $TRIDENT_HARDWARE_DIR, else ${XDG_DATA_HOME:-~/.local/share}/trident/hardware; "" when
// neither it nor HOME is set (Note [User hardware files] in src/plan/hardware.cpp).
std::string user_hardware_dir();
// `sub` (e.g. "tools/plot_plan.py") beside the executable (<exe>/../sub), then in the source
// tree; the first that exists, or "" if neither does.
std::string find_in_tree(const std::string& sub);
// The YAML text of a description (what --calibrate writes; reads back with load_hardware).
std::string hardware_to_yaml(const Hardware& hw);
// host_copy_gbytes_per_s in B/s, with the cpu's default; 0 where a gpu's is unknown.
double host_copy_bytes_per_s(const Hardware& hw);
// The achieved GEMM rate (FLOP/s per device) for an M×N×K GEMM (interpolated, see GemmPoint).
double gemm_flops_per_s(const Hardware& hw, double m, double n, double k);

// ---- Layouts and predictions (src/plan/model.cpp) -----------------------------------------

struct PlanLayout {
  int dp = 1, tp = 1, pp = 1;
  // Context parallelism (parallel.cp, Note [Plan context parallelism] in src/plan/model.cpp):
  // each sequence split over cp ranks; ring | allgather (parallel.cp_comm).
  int cp = 1;
  std::string cp_comm = "ring";
  // Expert parallelism (Note [Plan mixture of experts] in src/plan/model.cpp): a mixture layer's
  // experts split over ep consecutive ranks of dp·cp; their gradients reduce, and ZeRO shards
  // them, over the dp·cp/ep expert-data-parallel ranks. 1 for a dense model.
  int ep = 1;
  int v = 1;  // virtual stages per pipeline stage (interleaved)
  int micro_batch = 1;
  int accum = 1;  // micro-batches per step per dp rank (global / (dp·micro))
  int zero = 0;   // 0 | 1 | 2 | 3 (Note [Plan ZeRO-3] in src/plan/memory.cpp)
  // ZeRO-3 only: the ranks a unit's parameters, gradients and optimizer state are sharded over
  // (parallel.dp_shard; 0: all of dp). dp / dp_shard replicas (parallel.dp_replicate) make HSDP.
  int dp_shard = 0;
  bool reshard_after_forward = true;         // false: units stay gathered from forward to backward
  std::string zero3_gather = "micro_batch";  // micro_batch | step: gathers under pp or accum
  // parallel.zero_reduce, ZeRO-2/3 under accumulation: step (the gradients summed whole over
  // the micro-batches, reduced once) | micro_batch (a reduction per micro-batch into the shard,
  // gradient memory bounded: Note [Plan reductions per micro-batch] in src/plan/memory.cpp).
  std::string zero_reduce = "step";
  std::string recompute = "none";  // none | mlp | full
  std::string schedule = "1f1b";   // gpipe | 1f1b | zb-h1 | interleaved
  bool sequence_parallel = false;
  int threads = 1;         // cpu: threads per rank (run.threads)
  int ranks_per_node = 0;  // 0: devices_per_node (gpu), devices_per_node/threads (cpu)
  int world() const { return dp * cp * tp * pp; }
  int shard() const { return zero == 3 && dp_shard > 0 ? dp_shard : dp; }  // dp ranks of a shard
  int replicas() const { return dp / std::max(1, shard()); }               // HSDP's replicas
  // cp ranks hold the same parameters: gradients reduce over dp·cp (the grid's dp_cp group)
  // and ZeRO shards over dp_shard·cp (dp_shard_cp).
  int reduce_ranks() const { return dp * cp; }
  int shard_ranks() const { return shard() * cp; }
  int expert_reduce_ranks() const { return reduce_ranks() / std::max(1, ep); }
  int expert_shard_ranks() const { return shard_ranks() / std::max(1, ep); }
  int seq_local(int seq_len) const { return seq_len / cp; }  // tokens of a sequence per rank
};

// The model's shape and what the deck says about the run (emulated link, overlap, buckets).
struct PlanModel {
  int layers = 0, d_model = 0, heads = 0, vocab = 0, seq_len = 0;
  // The block's architecture (family, norm, position, MLP and its width, kv_heads, biases,
  // head, residual) as the trainer resolves the deck's keys; its shape fields are not read
  // (the ones above are). Default: GPT-2's block.
  GPTConfig block;
  bool overlap = true;  // comm.overlap
  // parallel.tp_overlap: tp collectives hidden behind the GEMMs
  // (Note [Plan tensor-parallel overlap] in src/plan/model.cpp); tp_overlap_chunks: the
  // all-reduce's pieces without sequence parallelism (0: tp).
  bool tp_overlap = true;
  bool tp_overlap_auto =
      false;  // parallel.tp_overlap auto: on a CPU, only across nodes or emulated
  int tp_overlap_chunks = 0;
  double bucket_mb = 25, first_bucket_mb = 1;
  // comm.emulate_*: the link that replaces the named groups' own (comm.emulate_groups).
  double emulate_gbps = 0, emulate_latency_us = 0;
  bool emulate_dp = true, emulate_tp = false;
  int grad_comm_bytes = 4;  // comm.grad_dtype: fp32 4, bf16 2
  // checkpoint.async (trident plan --async-checkpoint): a cpu rank's memory holds the snapshot
  // (Note [Plan checkpoint snapshot] in src/plan/memory.cpp).
  bool async_checkpoint = false;
  static PlanModel from_deck(const Deck& deck);
};

// One named term of a prediction: seconds of the step, or bytes per rank.
struct PlanTerm {
  std::string name;
  double value = 0;
};

// What an asynchronous checkpoint save copies before the step goes on
// (Note [Plan checkpoint snapshot] in src/plan/memory.cpp); predicted for every layout, counted
// in memory only with PlanModel::async_checkpoint.
struct CheckpointSnapshot {
  double bytes_per_rank = 0;       // the rank that saves the most: fp32 params + Adam m and v
  int node_ranks = 1;              // the layout's ranks on one node
  double host_bytes_per_node = 0;  // bytes_per_rank × node_ranks
  double copy_s = 0;               // one save's copy at host_copy_bytes_per_s; 0: rate unknown
};

struct Prediction {
  PlanLayout layout;
  CheckpointSnapshot snapshot;
  std::vector<PlanTerm> time;    // seconds per step on the slowest rank; sum = step_s
  std::vector<PlanTerm> memory;  // bytes on the rank that holds the most; sum = memory_bytes
  std::vector<PlanTerm> info;    // not part of the sums: whole collectives, bubble fraction
  double step_s = 0;
  double tokens_per_s = 0;
  double model_flops_per_step = 0;  // 6·N·tokens + attention, no recompute (bench's FLOP count)
  double tflops_per_gpu = 0;        // model_flops_per_step / step_s / world / 1e12
  double mfu = 0;                   // tflops_per_gpu / the rank's peak; NaN if above 1 (a bug)
  double memory_bytes = 0;
  bool fits = false;
  std::string why_not;                         // empty when the layout is valid and fits
  double term(const std::string& name) const;  // a time or memory term by name (0 if absent)
};

// Predicts one layout. A layout the trainer would refuse (heads not divisible by tp, more
// stages than layers, ...) comes back with fits = false and why_not saying so.
Prediction predict(const PlanModel& model, const PlanLayout& layout, const Hardware& hw);

// Every layout of `gpus` ranks for global_batch sequences per step, predicted, best first
// (fitting ones by tokens/s, then the rest).
struct PlanSearch {
  int gpus = 1;
  int global_batch = 0;  // sequences per step
  std::vector<int> micro_batches = {1, 2, 4, 8};
  std::vector<std::string> recompute = {"none", "mlp", "full"};
  std::vector<int> zero = {0, 1, 2, 3};
  // ZeRO-3's shard sizes: every divisor of dp that keeps tp·dp_shard inside a node, and dp
  // itself (empty: those); only these otherwise.
  std::vector<int> dp_shard;
  std::vector<std::string> schedules = {"1f1b", "interleaved", "zb-h1"};
  int max_v = 4;
  int threads = 1;                              // cpu
  std::vector<int> tp, pp;                      // only these sizes (empty: every divisor)
  std::vector<int> sequence_parallel = {0, 1};  // with tp > 1
  // Context-parallel sizes (empty: every divisor where seq_len % (2·cp) = 0 and each chunk
  // keeps at least kMinCpChunkTokens) and exchanges.
  std::vector<int> cp;
  std::vector<std::string> cp_comm = {"ring", "allgather"};
  // Expert-parallel sizes of a mixture (empty: every divisor of the experts that divides dp·cp).
  std::vector<int> ep;
};
// The shortest chunk (T / (2·cp) tokens) the search tries cp at: below it a flash kernel's
// blocks are too short to run at its rate (FlashAttention-3 at 512 tokens reaches 0.76 of its
// 2k figure) and the ring's per-step latency is not hidden; docs/plan.md, "Context parallelism".
inline constexpr int kMinCpChunkTokens = 2048;
std::vector<Prediction> rank_layouts(const PlanModel& model, const Hardware& hw,
                                     const PlanSearch& search);

// The largest model that fits, by ZeRO stage and device count (the ZeRO paper's Figure 1 and
// Table 1): the model's family and width with its layers scaled, at plain data parallelism
// over `devices` (dp = devices, tp = pp = 1), counting the model states the plan counts
// (params, grads, optimizer; ZeRO-3's gathered pool) and no activations.
struct ZeroCapacity {
  int zero = 0, devices = 1;
  int layers = 0;             // the most blocks that fit (0: not even one)
  double params = 0;          // that model's parameters
  double state_bytes = 0;     // its model states per rank
  double capacity_bytes = 0;  // one rank's memory (hw.memory_gb)
};
ZeroCapacity zero_capacity(const PlanModel& model, const Hardware& hw, int zero, int devices);

// "dp=2,tp=1,pp=2,v=1,micro=4,zero=1,recompute=none[,schedule=..,sp=..,accum=..,threads=..]";
// cp=C (and cp_comm=allgather, where not ring) when cp > 1; ep=E when ep > 1;
// zero=3 adds dp_replicate=R,dp_shard=S (R·S = dp) and, where not the default,
// reshard_after_forward=false and zero3_gather=step.
// missing keys take the defaults (accum from global_batch when given). Bad keys throw (exit 2).
// Keys not in `text` keep their value in `defaults` (the deck's layout, for trident plan).
PlanLayout parse_layout(const std::string& text, int global_batch, const PlanLayout& defaults = {});
std::string format_layout(const PlanLayout& layout);

}  // namespace trident
