// The training step loop: micro-batches, gradient accumulation, clipping, AdamW, LR schedule,
// validation, metrics.
#pragma once

#include <array>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trident/backend.h"
#include "trident/checkpoint.h"
#include "trident/data.h"
#include "trident/deck.h"
#include "trident/model.h"
#include "trident/pipeline.h"
#include "trident/trace.h"

namespace trident {

class ProcessGrid;
class GradReducer;
class GPTStage;
class DataParallel;
class TiedEmbedding;
class GradNorm;
struct OwnedPiece;
struct Zero3Memory;

// Linear warmup over warmup_steps (step 0 gets lr/warmup), then cosine decay to
// lr·min_lr_ratio at the last step, or constant. `step` is 0-based.
double lr_at(const TrainConfig& t, int step);

// AdamW with decoupled weight decay; decay only where ParamInfo::decay (matrices).
class AdamW {
 public:
  // The moments live in the backend's memory, zeroed.
  // With ZeRO (Note [ZeRO-1] in train/zero.h) num_params is this rank's shard.
  AdamW(Backend& be, size_t num_params) : m_(be, num_params), v_(be, num_params) {}
  // One update of all parameters at (1-based) step t.
  // grad_scale: the gradients' global-norm clipping factor, applied inside the update's pass.
  void update(Backend& be, GPT& model, const TrainConfig& cfg, float lr, int t, float grad_scale);
  // ZeRO: updates only this rank's shard, one fused pass per run (merge_pieces): parameters at
  // run.flat in the flat buffer, moments and gradients at run.shard in the shard buffers.
  // params16 (ZeRO-3's bf16 gathers): the same pass writes bf16(params) there, at run.flat.
  void update_shard(Backend& be, float* params, const float* shard_grads,
                    const std::vector<OwnedPiece>& runs, const TrainConfig& cfg, float lr, int t,
                    float grad_scale, bfloat16* params16 = nullptr);
  float* m() { return m_.data(); }
  float* v() { return v_.data(); }
  size_t size() const { return m_.size(); }

 private:
  BackendBuffer<float> m_, v_;
};

struct StepStats {
  int step = 0;       // 1-based count of completed steps
  double loss = 0.0;  // mean over the step's global batch
  double lr = 0.0;
  double grad_norm = 0.0;  // before clipping
  double ms_per_step = 0.0;
  double tokens_per_s = 0.0;
  double mfu = 0.0;                // fraction of the measured GEMM peak
  double model_flops_per_s = 0.0;  // MFU's numerator: the step's model FLOPs (all ranks) per s
  double forward_ms = 0.0, backward_ms = 0.0, optimizer_ms = 0.0;
  // Data parallel (0 with dp = 1): time with an all-reduce in flight, the part of it after
  // the end of backward, and overlap = 1 − exposed/comm. Both include the step's first
  // collective, the tied embedding's row set (Note [Step row set]), which nothing overlaps.
  // With ZeRO these are the reduce-scatters'; the parameter all-gathers waited for in this step
  // (launched after the previous step's optimizer, Note [Gathers before use]) are apart.
  double comm_ms = 0.0, exposed_comm_ms = 0.0, overlap = 0.0;
  double gather_comm_ms = 0.0, gather_exposed_ms = 0.0;
  // ZeRO-3 (Note [ZeRO-3 units] in train/zero3.h): the units gathered in this step, and how many
  // of them were not asked for one group ahead of their use (beyond each pass's first group).
  int unit_gathers = 0, late_unit_gathers = 0;
  double comm_cpu_ms = 0.0;        // CPU time of the dp communication thread (ReduceStats)
  size_t grad_resident_bytes = 0;  // ZeRO-2: peak resident bytes of the full gradient buffer
  double held_wait_ms = 0.0;       // ZeRO-2: backward blocked by Note [Bounded gradient memory]
  long comm_polls = 0;             // its tests of in-flight all-reduces (each one enters MPI)
  // Tensor-parallel collectives (Note [Tensor-parallel overlap] in src/model/tp_overlap.h): their
  // time on the wire, and the part compute waited for (all of it without the overlap).
  double tp_comm_ms = 0.0, tp_exposed_ms = 0.0;
  // Context parallelism's K/V transfers (Note [Ring attention] in src/model/cp_attention.h):
  // their time on the wire, and the part attention waited for.
  double cp_comm_ms = 0.0, cp_exposed_ms = 0.0;
  MoeStats moe;  // mixtures of experts: summed over the step's micro-batches and layers
  // Pipeline (this stage): time in the schedule, and the part spent waiting for neighbours.
  double pipeline_ms = 0.0, pipeline_wait_ms = 0.0, pipeline_compute_ms = 0.0;
  // Note [Deferred host snapshot] (src/train/checkpoint_saver.h): the time the optimizer
  // waited for a checkpoint's copy of its buffers.
  double snapshot_wait_ms = 0.0;
  double val_loss = NAN;  // NaN when not validated this step
  // Note [Non-finite steps]: the loss or the norm was not finite and train.nonfinite is skip:
  // the update was dropped. skips_in_a_row counts this one.
  bool skipped = false;
  int skips_in_a_row = 0;
  // Something the run should say once (the first step it happens, on every rank of the dp
  // group alike): the gradient buckets did not become ready in order
  // (Note [Ready order check]). Empty on every other step.
  std::string warning;
};

// What a run needs besides the deck: the backend and the measured peak used for MFU.
struct TrainContext {
  Backend* backend = nullptr;
  double peak_flops = 0.0;       // FLOP/s; MFU is reported against it (per rank)
  ProcessGrid* grid = nullptr;   // null: one rank, no communication
  TraceWriter* trace = nullptr;  // null: no timeline
  // Communicators for device buffers (NcclComms over the grid's dp and tp ranks); null:
  // grid->dp() / grid->tp() (host memory). dp_device is the GradReducer's; tp_device the
  // model's tensor-parallel collectives.
  Communicator* dp_device = nullptr;
  Communicator* tp_device = nullptr;
  // Pipeline stages on a device (Note [Stage transfers on a device] in trident/pipeline.h):
  // the links the boundary tensors travel on in device memory, and the device communicator
  // of the embedding group (first and last stage) that sums the tied wte's gradient. Null:
  // host copies over grid->pp() and grid->embedding().
  const StageLinks* pp_links = nullptr;
  Communicator* embedding_device = nullptr;
  // Set by the Trainer with parallel.ep > 1: the experts' gradients' group
  // (Note [Expert parallelism] in src/model/moe.h; with HSDP, its ranks within this replica:
  // Note [Experts with HSDP] in src/train/zero3.h); null: they reduce with everything else.
  Communicator* expert_dp = nullptr;
  // With ZeRO-3 too: a duplicate of that group (host or device, as expert_dp) that the experts'
  // unit gathers run on, as dp's gathers run on their own (dp_gather_device on a device).
  Communicator* expert_gather = nullptr;
  // Context parallelism on a device: the NcclComm over the cp ranks that the ring's K/V travel
  // on (Note [Ring on a device] in src/model/cp_ring_grouped.cpp); null: grid->cp() (host).
  Communicator* cp_device = nullptr;
  // Tensor-parallel overlap on a device: an NcclComm over the tp ranks on its own stream that
  // the rings' chunks travel on (Note [Tensor-parallel ring on a device] in
  // src/model/tp_ring_grouped.cpp). On a host, tests only (the device's order over MPI); null:
  // the host's rings on grid->tp().
  Communicator* tp_ring = nullptr;
  // Expert parallelism on a device: a device communicator over a host group the Trainer split
  // (the ep group, on the compute stream; the expert-data-parallel group, as dp_device), or
  // null: the host groups carry the tokens and the experts' gradients.
  std::function<std::unique_ptr<Communicator>(MpiComm& group, const char* name, bool compute)>
      device_group = nullptr;
  // ZeRO-3 on a device (Note [Weights in unit slots] in src/train/zero3_pool.h): a second
  // NcclComm over dp's ranks (dp × cp), on its own stream, that the units' gathers run on, so
  // that they pair among themselves whatever order the reduce-scatters take on dp_device.
  // (With HSDP, over dp_shard's ranks, as the reduce-scatters.)
  Communicator* dp_gather_device = nullptr;
  // HSDP on a device (Note [HSDP] in src/train/data_parallel.h): NcclComms over dp_shard (× cp)
  // for the reduce-scatters and over dp_replicate for the shards' sum across replicas.
  Communicator* dp_shard_device = nullptr;
  Communicator* dp_replicate_device = nullptr;
};

// One rank's training run: assembles the model, the data, the data-parallel unit
// (DataParallel), the tied embedding (TiedEmbedding), the pipeline stage, the gradient norm and
// AdamW from the deck and the context, and runs steps (docs/design.md, "Who owns what").
class Trainer {
 public:
  // Builds the model (from the deck or model.init_from) and opens the datasets. Throws on bad
  // input before anything is written.
  Trainer(const Deck& deck, TrainContext ctx);
  ~Trainer();

  const GPTConfig& model_config() const { return model_->config(); }
  GPT& model() { return *model_; }
  AdamW& optimizer() { return *opt_; }
  // Runs one optimizer step (0-based index `step`): accum micro-batches, clip, AdamW.
  StepStats train_step(int step);
  // Mean loss over train.val_batches micro-batches of data.valid (NaN without data.valid).
  double validate();
  // Tokens a step consumes across all ranks.
  long tokens_per_step() const;
  // Checkpoints (trainer_checkpoint.cpp): the parameters and AdamW moments as global tensors
  // (wte without its vocabulary padding, so any layout can load them), pointing into host
  // copies of params, m and v (Note [Backend memory]: the model's own buffers on a host
  // backend), with this rank's part and whether it writes it (dp rank 0; tp rank 0 for
  // replicated tensors; wte on the last stage).
  std::vector<ShardTensor> checkpoint_tensors(float* params, float* m, float* v);
  // Collective over the world: saves after `steps_done` steps; returns the path.
  std::string save(const std::string& dir, int steps_done, const std::string& run_id, int keep);
  // What a save after `steps_done` steps records besides the tensors (step, run, deck, layout).
  CheckpointMeta checkpoint_meta(int steps_done, const std::string& run_id) const;
  // Note [Asynchronous checkpoints] (src/train/checkpoint_saver.h): floats a snapshot holds
  // (this rank's saved parameters, then m, then v), and the snapshot's plan: the tensors
  // save_checkpoint writes, pointing into `dst` (the same shards as save() writes), and the
  // copies that fill it from backend memory (Backend::start_host_snapshot). The caller makes
  // them before the next update, which first calls the gate (set_update_gate) and waits.
  size_t snapshot_floats() const;
  struct HostCopy {
    float* dst;
    const float* src;
    size_t count;
  };
  std::vector<ShardTensor> snapshot_plan(float* dst, std::vector<HostCopy>* copies);
  void set_update_gate(std::function<void()> gate) { update_gate_ = std::move(gate); }
  // Collective: loads a checkpoint saved in any layout; returns its meta (step, run id, ...).
  CheckpointMeta load(const std::string& path);
  // ZeRO: waits until the parameters of the last update are gathered on this rank (before
  // reading params() from outside a step: save, copies; forward waits by itself).
  void sync_params();
  // Bytes this rank holds for each: parameters, gradients (the flat buffer, and ZeRO's shard
  // buffer), optimizer state (m and v), activations.
  struct MemoryBytes {
    size_t params = 0, grads = 0, optimizer = 0, activations = 0;
    // Gradient memory actually held at its peak: with ZeRO-2 the most of the full buffer found
    // resident during the steps so far (Note [ZeRO-2 on the host]) plus the shard; else grads.
    size_t grads_resident = 0;
  };
  MemoryBytes memory_bytes() const;
  // The MFU denominator (per rank), raised when measured again (Note [Peak measured again]).
  double peak_flops() const { return ctx_.peak_flops; }
  void set_peak_flops(double flops) { ctx_.peak_flops = flops; }
  // s's MFU against the current peak: NaN for a skipped step, without a peak, or above 1.
  double mfu_of(const StepStats& s) const;
  int dp_size() const { return dp_size_; }
  int pp_size() const { return pp_size_; }
  const GradReducer* reducer() const;                  // null with dp = 1
  DataParallel* data_parallel() { return dp_.get(); }  // null with dp = 1 (tests, tools)
  // Whether this stage holds a TiedEmbedding: a tied head on a stage holding wte; never with
  // an untied head, whose stages run nothing of the tie.
  bool has_tied_embedding() const { return tied_ != nullptr; }

 private:
  void place_on_grid();
  Zero3Memory zero3_memory() const;  // what check_memory_plan needs of ZeRO-3
  void open_data(const GPTConfig& cfg);
  void skip_step(StepStats& s);  // Note [Non-finite steps]
  void poison_gradient();
  static std::vector<int> fault_nan_steps_from_env();

  Deck deck_;
  TrainContext ctx_;
  int dp_size_ = 1, dp_rank_ = 0, pp_size_ = 1, pp_rank_ = 0;
  int cp_size_ = 1, cp_rank_ = 0;  // Note [Context parallelism] (src/model/cp_attention.h)
  // Note [Expert parallelism] (src/model/moe.h): ep consecutive ranks of dp × cp, and the
  // expert-data-parallel replicas, ep apart, over which the experts' gradients reduce.
  int ep_size_ = 1, ep_rank_ = 0, expert_dp_rank_ = 0;
  std::unique_ptr<MpiComm> ep_comm_, expert_dp_comm_;
  std::unique_ptr<Communicator> ep_device_, expert_dp_device_;  // TrainContext::device_group
  std::unique_ptr<Communicator> expert_gather_;                 // TrainContext::expert_gather
  void make_expert_groups(GPTOptions& options);
  MoeStats moe_step_stats();
  std::unique_ptr<Communicator> solo_;  // the pp communicator when there is no grid
  Communicator* pp_comm_ = nullptr;
  PipeSchedule schedule_ = PipeSchedule::kOneFOneB;
  int chunks_ = 1;  // parallel.virtual_stages (Note [Interleaved 1F1B])
  std::unique_ptr<TokenDataset> train_data_, valid_data_;
  std::unique_ptr<SampleOrder> train_order_, valid_order_;
  // Destroyed in reverse: the parts before the model they hold (ZeRO's gathers in flight end
  // in ~DataParallel, while the parameters they write still exist).
  std::unique_ptr<GPT> model_;
  std::unique_ptr<TiedEmbedding> tied_;  // on a stage holding wte
  std::unique_ptr<DataParallel> dp_;     // with dp > 1
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<GPTStage> stage_;
  std::unique_ptr<GradNorm> norm_;
  std::function<void()> update_gate_;  // Note [Deferred host snapshot]
  int skips_in_a_row_ = 0;             // Note [Non-finite steps]
  std::vector<int> fault_nan_steps_;   // TRIDENT_FAULT_NAN_STEPS: 1-based steps to poison
};

// The model shape a deck asks for: the deck's model keys, or model.init_from's header (which
// replaces them; `note` then says so).
GPTConfig model_config_from_deck(const Deck& deck, std::string* note);

}  // namespace trident
