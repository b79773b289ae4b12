// Pipeline parallelism: the schedules (GPipe, 1F1B, zero-bubble ZB-H1), stage-boundary
// messages of several named tensors, and a runner that drives one stage through a schedule.
//
// A model (trident's GPT, or your own) implements PipelineStage; run_pipeline() calls it in
// the schedule's order and moves the boundary tensors between neighbouring stages over the
// pp communicator (whose rank is the stage index: ProcessGrid::pp()).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "trident/comm.h"

namespace trident {

enum class PipeSchedule { kGPipe, kOneFOneB, kZeroBubbleH1, kInterleaved };
// "gpipe" | "1f1b" | "zb-h1" | "interleaved"; input_error naming `key` otherwise.
PipeSchedule parse_pipe_schedule(const std::string& text, const std::string& key);
const char* pipe_schedule_name(PipeSchedule s);

// kBackward is the whole backward, except in a schedule that splits it (splits_backward):
// there it is the input-gradient part ("B") and kWeight the weight-gradient part ("W").
struct PipeAction {
  enum class Kind { kForward, kBackward, kWeight };
  Kind kind;
  int micro;      // micro-batch index, 0-based
  int chunk = 0;  // the model chunk (interleaved: virtual stage chunk·stages + stage), else 0
  bool operator==(const PipeAction&) const = default;
};

bool splits_backward(PipeSchedule schedule);  // zb-h1

// Interleaved 1F1B (Megatron's virtual stages, Note [Interleaved 1F1B]): each stage holds
// `chunks` model chunks, chunk c of stage s being virtual stage c·stages + s. The other
// schedules have one chunk. Every function below takes `chunks` (1 unless interleaved).

// What stage `stage` (0-based) of `stages` does, in order, for `micro_batches` micro-batches.
// GPipe: every forward, then every backward. 1F1B (PipeDream-flush): a warm-up of
// min(stages − stage − 1, micro_batches) forwards, then alternating one forward / one
// backward, then the remaining backwards. ZB-H1: 1F1B's order of F and B, each W(i) delayed
// until after B(i + stage) (Note [ZB-H1] in train/pipeline_schedule.cpp). Backwards, and weight
// passes, run in micro-batch order in all three.
std::vector<PipeAction> pipeline_actions(PipeSchedule schedule, int stages, int stage,
                                         int micro_batches, int chunks = 1);
// The most micro-batches whose activations are alive at once on this stage (forwarded, not
// yet through their whole backward): micro_batches for GPipe, min(stages − stage,
// micro_batches) for 1F1B, min(stages, micro_batches) for ZB-H1.
// Interleaved: per chunk, replaying the actions.
int max_in_flight(PipeSchedule schedule, int stages, int stage, int micro_batches, int chunks = 1,
                  int chunk = 0);
// ZB-H1: the most micro-batches between their B and their W at once, min(stage + 1,
// micro_batches) (what a model keeps the weight pass's inputs for); 0 for the others.
int max_awaiting_weight(PipeSchedule schedule, int stages, int stage, int micro_batches);
// The model's idle fraction of a stage's time in the schedule, with forward, input-gradient
// and weight-gradient passes of equal cost and free transfers: (p−1)/(m+p−1) for GPipe and
// 1F1B; for ZB-H1, 1 − 3m/T with T = 3m + p − 1 (m ≥ p; Note [ZB-H1]) or 2m + 2p − 1 (m < p).
// Interleaved: (p−1)/(v·m + p − 1) (Narayanan et al. 2021, the bubble divided by v).
// weight_share: ZB-H1's W as a share of F + B + W (F a third), at most and by default a third;
// a mixture's B holds its weight gradients (Note [Mixtures in B]), so less. At 0, 1F1B's.
double bubble_model(PipeSchedule schedule, int stages, int micro_batches, int chunks = 1,
                    double weight_share = 1.0 / 3);
// Input errors (exit 2, naming the deck keys) for a schedule the shape cannot run:
// virtual_stages > 1 without interleaved, interleaved with pp < 2 or accum % pp != 0, or
// fewer layers than virtual stages.
void check_pipe_schedule(PipeSchedule schedule, int stages, int micro_batches, int chunks,
                         int layers);

// One tensor crossing a stage boundary: fp32, contiguous. A message holds at most
// kMaxStageTensors tensors of at most kMaxStageDims dimensions (its header has a fixed size).
constexpr int kMaxStageTensors = 16;
constexpr int kMaxStageDims = 6;
struct StageTensor {
  std::string name;
  std::vector<int64_t> shape;
  float* data = nullptr;
  size_t count() const;
};

// A model's part on one stage: one model chunk, or (interleaved) `chunks` of them, each call
// naming the chunk (0 for the other schedules). "Stage" below means the virtual stage
// chunk·stages + stage: the first has no inputs, the last no outputs. The tensor lists describe
// buffers the stage owns; they must stay valid until the runner moves on to the next action
// of that micro-batch and chunk. Backward outputs have no next action: theirs stay in use until
// the runner starts forward(m + k) of that chunk, k = max_in_flight(..., chunk), the first
// action that may reuse micro-batch m's buffers when a model keeps micro-batch m of chunk c in
// slot m mod k of that chunk (or until run_pipeline returns).
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  // Buffers to receive micro-batch `micro`'s inputs from the previous stage (empty on the
  // first stage, which reads its own data).
  virtual std::vector<StageTensor> forward_inputs(int micro, int chunk) = 0;
  virtual void forward(int micro, int chunk) = 0;
  // Sent to the next stage after forward(micro) (empty on the last stage).
  virtual std::vector<StageTensor> forward_outputs(int micro, int chunk) = 0;
  // Buffers to receive the gradients of forward_outputs(micro) from the next stage (empty on
  // the last stage, whose backward starts from the loss).
  virtual std::vector<StageTensor> backward_inputs(int micro, int chunk) = 0;
  virtual void backward(int micro, int chunk) = 0;
  // Gradients of forward_inputs(micro), sent to the previous stage (empty on the first).
  virtual std::vector<StageTensor> backward_outputs(int micro, int chunk) = 0;

  // A split backward, for schedules that split it (zb-h1): backward_input computes what
  // backward_outputs returns (and everything else but the weight gradients that can wait);
  // backward_weight, later, the rest. Together they must give backward's gradients, bit for
  // bit. A model without them cannot run zb-h1 (run_pipeline refuses it).
  virtual bool can_split_backward() const { return false; }
  virtual void backward_input(int micro, int chunk);
  virtual void backward_weight(int micro, int chunk);
  // How many chunks this stage holds (run_pipeline checks it against the schedule's).
  virtual int chunks() const { return 1; }

  // Note [Progress during compute]
  // The runner sets this before the schedule. A model that calls it now and then inside
  // forward/backward (GPTStage: between layers) keeps this stage's boundary transfers moving
  // while it computes: MPI libraries without a progress thread move a large message only while
  // some call is inside MPI.
  void set_transfer_progress(std::function<void()> fn) { progress_ = std::move(fn); }
  void progress_transfers() const {
    if (progress_) progress_();
  }

 private:
  std::function<void()> progress_;
};

// Note [Stage transfers on a device]
// NCCL pairs transfers by order, not tag, and runs a communicator's in order: one over pp
// could queue a send behind a receive its neighbour matches only after that send (1F1B). So
// each directed link (s → s+1 activations, s → s−1 gradients) is a two-rank communicator of its
// own, sender rank 0. Headers stay on pp (host MPI, tagged) and carry the sender's count, which
// the receiver checks: a mismatched order is an Error, not data in the wrong buffer. A link
// operation starts after a mark recorded just before on the compute stream; compute waits for
// a receive before reading it.
struct StageLinks {
  // By direction (0 forward: activations to the next stage; 1 backward: gradients to the
  // previous one): this stage's link for sending (it is rank 0) and for receiving (rank 1).
  // Null where a pipeline of one stage has none.
  Communicator* send[2] = {nullptr, nullptr};
  Communicator* recv[2] = {nullptr, nullptr};
};

// The two-rank MPI groups of the links of this rank's stage in `pp` (collective over pp: every
// rank calls it). Links are numbered forward s → s+1 as s, backward s → s−1 as stages + s
// (around the ring: interleaved schedules use the wrap), and returned in that order, which is
// the order every rank must make its device communicators in (each making is collective over
// its two ranks; in one global order none waits for a rank that waits for it). Empty for one
// stage. The caller frees the groups (MPI_Comm_free) once its communicators are made.
struct StageLinkGroup {
  MPI_Comm group = MPI_COMM_NULL;
  int direction = 0;  // 0 forward, 1 backward
  bool sending = false;
};
std::vector<StageLinkGroup> split_stage_links(MPI_Comm pp);

struct PipelineStats {
  double total_ms = 0;    // the whole schedule on this stage
  double compute_ms = 0;  // inside forward()/backward()
  double wait_ms = 0;     // waiting for a neighbour's message (the bubble, plus skew)
  size_t bytes_sent = 0;  // tensor payload, headers not counted
  size_t bytes_received = 0;
  int messages_sent = 0;  // boundary messages (one header + its tensors each)
};

// Runs `stage`'s actions of the schedule. Every stage of the pp communicator must call it with
// the same schedule and micro_batches. Messages carry a small header (tensor count, names,
// shapes) that the receiver checks against the buffers it expects: a mismatch throws
// trident::Error naming both shapes. Sends are nonblocking and all complete before it returns.
//
// What the runner asks of the model, per action (Note [Pipeline messages] in
// train/pipeline_runner.cpp has the wire format and the tags; Note [Pre-posted receives] when
// the receive buffers are written):
//   forward(m):  wait until backward(m − k)'s send completed (k = max_in_flight; see above);
//                wait for the receive into forward_inputs(m) (not on the first stage);
//                forward(m); forward_outputs(m) and start sending it (not on the last stage).
//   backward(m): wait until forward(m)'s send completed (its buffers may be reused from now);
//                wait for the receive into backward_inputs(m) (not on the last stage);
//                backward(m), or backward_input(m) in a split schedule; backward_outputs(m)
//                and start sending it (not on the first stage).
//   weight(m):   backward_weight(m) (split schedules only).
// forward_inputs(m) is asked for, and received into, from when micro-batch m − k has been
// through its whole backward and its backward send completed (from the start for m < k);
// backward_inputs(m) from when forward(m) returned. The tensor lists a stage never has (first
// stage's inputs, last stage's outputs) are not asked for. With stages == 1 nothing is sent
// and pp is not used. After an Error the pp communicator may hold unmatched messages (a
// neighbour then ends at the comm timeout): end the program, as the app does on any error.
//
// `links` null: the tensors travel over pp with the headers (host memory). Otherwise
// Note [Stage transfers on a device]: the tensors are device memory and travel over the links.
PipelineStats run_pipeline(PipeSchedule schedule, Communicator& pp, int stages, int stage,
                           int micro_batches, PipelineStage& model, int chunks = 1,
                           const StageLinks* links = nullptr);
// Forward only (validation): forward(m) for m = 0 .. micro_batches − 1 on every chunk, with the
// same messages, header checks and errors as run_pipeline; nothing goes backward. Every stage
// of pp calls it with the same micro_batches.
PipelineStats run_pipeline_forward(Communicator& pp, int stages, int stage, int micro_batches,
                                   PipelineStage& model, int chunks = 1,
                                   const StageLinks* links = nullptr);

}  // namespace trident
