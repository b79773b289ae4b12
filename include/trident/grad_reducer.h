// GradReducer: sums the gradients over the data-parallel group, in buckets, on its own
// communication thread, while backward is still running. The caller has divided them by dp
// already (Note [Average in the loss seed] in train/gpt_stage.cpp), so the sum is the average.
//
//     GradReducer reducer(grid.dp(), grads, params_in_ready_order, options);
//     for each step:
//       for each micro-batch m:
//         reducer.begin_step(/*reduce=*/m == last);   // only the last micro-batch reduces
//         backward ...  reducer.grad_ready(i);        // as each parameter's gradient is final
//         reducer.add_extra(rows, n, "rows");         // optional, after the last grad_ready
//       reducer.finish();                             // wait; grads now hold the dp sum
//
// What the caller must keep (the thread's whole contract: src/comm/grad_reducer.cpp):
//  - Between begin_step(true) and the end of finish() only the reducer's thread uses `dp`
//    (Note [One thread per communicator] in trident/comm.h). Other communicators may be used
//    meanwhile, so MPI must provide MPI_THREAD_MULTIPLE.
//  - Every rank gives the same parameters and options and adds the same extras in the same
//    order (Note [Same buckets, same order] in src/comm/grad_reducer.cpp).
//  - With a device communicator (NcclComm) and device gradients, call grad_ready right after
//    enqueueing the kernels that finish the gradient, on the communicator's compute stream
//    (Note [Gradient-ready events] in trident/comm.h); work enqueued on that stream after
//    finish() returns sees the reduced gradients.
//  - An error on the thread (an MPI error, a timeout after comm.timeout_s, a parameter that
//    never became ready) is rethrown by the next grad_ready, add_extra or finish.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trident/buckets.h"
#include "trident/comm.h"

namespace trident {

// One parameter's gradient: a slice of the flat gradient buffer. The list given to the
// reducer is in ready (backward) order and contiguous in the buffer: each slice starts where
// the previous one ends (ascending) or ends where the previous one starts (descending, e.g.
// a buffer in forward order walked backwards). Either way a bucket is one slice.
struct GradParam {
  std::string name;
  size_t offset = 0;  // elements into the flat gradient buffer
  size_t count = 0;
};

struct GradReducerOptions {
  size_t first_bucket_bytes = kDefaultFirstBucketBytes;
  size_t bucket_bytes = kDefaultBucketBytes;
  // true: a bucket is reduced as soon as it (and every earlier bucket) is ready, during
  // backward; false: all buckets are reduced after finish() is called. Same buckets, same
  // calls, so both give bitwise equal gradients.
  bool overlap = true;
  // An all-reduce is started in pieces of at most this many bytes (Note [Message size] in
  // src/comm/grad_reducer_thread.cpp); a parameter larger than bucket_bytes is a bucket of its
  // own, so this also bounds the pieces of a large parameter.
  size_t max_message_bytes = size_t(16) << 20;
  // Times in ReduceStats are milliseconds since this point (pass the run's trace origin).
  CommClock::time_point trace_origin = CommClock::now();
  // Note [ZeRO-1] (train/zero.h). Non-null: the reducer is sharded. Each bucket is
  // reduce-scattered (summed) into this rank's shard of it,
  // shard_grads + shard_offset(b), instead of all-reduced; extras are still all-reduced whole.
  // The parameters must then sit where padded_bucket_layout(counts, 4, first_bucket_bytes,
  // bucket_bytes, dp.size(), alone) puts them (the reducer builds the same layout and checks),
  // and the reducer also all-gathers the updated parameters (start_param_gather).
  float* shard_grads = nullptr;
  std::vector<char> alone;           // parameters in a bucket of their own (ready order)
  std::vector<char> breaks;          // parameters that start a bucket (ZeRO-3: each unit's first)
  std::vector<size_t> gather_order;  // buckets in the order forward first reads them
  // ZeRO-2 (Note [ZeRO-2 on the host] in train/zero.h; host gradients only): once a bucket's
  // reduce-scatter completed, its slice of the full gradient buffer is zeroed and its pages
  // handed back to the kernel, so the buffer is all zero again after the step and holds memory
  // only while backward writes it.
  bool release_reduced = false;
  // Note [Bounded gradient memory] (with release_reduced and overlap): grad_ready blocks the
  // compute thread while more than this many bytes of complete buckets wait for their
  // reduce-scatter's release, so backward writes no further gradients until the link has taken
  // some; 0: no bound. The full buffer then holds at most this plus the buckets being written.
  size_t max_held_bytes = 0;
  // ZeRO-3 (Note [ZeRO-3 units] in train/zero3.h; with shard_grads and release_reduced): the
  // parameters live in shard_params (this rank's shard of bucket b at shard_offset(b)); the
  // full buffer `params` (host memory, laid out like the gradients) holds a bucket only between
  // gather() and release_gathered(). The gathers run on gather_comm, a communicator of their
  // own with dp's ranks, so that they pair among themselves whatever the reduce-scatters do.
  // params null (a device): no full buffer; each gather() names its unit's place in a pool
  // (Note [Weights in unit slots] in train/zero3_pool.h), and nothing is released to the kernel.
  float* params = nullptr;
  float* shard_params = nullptr;
  Communicator* gather_comm = nullptr;
  // Note [bf16 unit gathers] in train/zero3_pool.h (a device pool only): parameters (ready
  // order) marked here each have a bucket of their own (alone), and it is gathered from this
  // bf16 copy of the shards, at shard_params's offsets, into the first half of its place.
  const bfloat16* shard_params16 = nullptr;
  std::vector<char> gather_bf16;
  // HSDP (Note [HSDP] in train/data_parallel.h; with shard_grads): `dp` is the shard group, and
  // each bucket's shard (and each extra) is then all-reduced over this communicator of the
  // replicas, in launch order, as soon as its reduce-scatter has completed.
  Communicator* replicate_comm = nullptr;
  // Note [Expert parallelism] (src/model/moe.h): parameters (ready order) marked here are a
  // mixture's experts, each in a bucket of its own, all-reduced on expert_comm (the
  // expert-data-parallel group) instead of dp; sharded, each over that group. With
  // replicate_comm (HSDP) expert_comm is that group within a replica, and each expert shard
  // takes the same second hop as a dense one (Note [Experts with HSDP] in train/zero3.h).
  std::vector<char> expert;
  Communicator* expert_comm = nullptr;
  // With ZeRO-3: the experts' gathers' communicator (expert_comm's ranks, as gather_comm has
  // dp's).
  Communicator* expert_gather_comm = nullptr;
  // Note [Gradients in unit slots] (train/grad_pool.h; with shard_grads, device memory): there
  // is no flat gradient buffer (`grads` null); each bucket is reduce-scattered from where the
  // last set_grad_base put it, and wait_reduced tells when that place may be written again.
  bool pooled_grads = false;
  // Note [Shard sums on a device] (with pooled_grads and zero_reduce micro_batch): how a round
  // that accumulates adds the shard's sum so far into this rank's block of a bucket, n floats
  // (own += sum), enqueued on the compute stream; the thread cannot touch device memory.
  std::function<void(float* own, const float* sum, size_t n)> add_shard;
};

// One all-reduce of a step: a bucket or an extra buffer.
struct BucketRecord {
  std::string name;  // "bucket 2 (h.11.mlp.proj.w .. h.10.ln2.b)" or the extra's name
  int bucket = -1;   // bucket index; -1 for an extra buffer
  size_t bytes = 0;
  double ready_ms = 0;  // its last parameter became ready (extra: it was added)
  double start_ms = 0;  // the all-reduce was started
  double end_ms = 0;    // it completed
  // Note [Device time of an operation]: its start and end on the device, in ms after the
  // step's begin_step on the compute stream; -1 on a host communicator.
  double device_start_ms = -1, device_end_ms = -1;
};

struct ReduceStats {
  bool reduced = false;  // false after a begin_step(false) step
  // comm_ms and exposed_comm_ms below are device times (Note [Device time of an operation]):
  // the union of the records' device spans, and how far the last ended after the compute
  // stream reached finish() (the end of backward). Else (host communicators) host times.
  bool device_timed = false;
  // Wall time during which at least one of this step's all-reduces was in flight: the union
  // of the [start, end] intervals (not their sum, which would count overlapping buckets twice).
  double comm_ms = 0;
  // From the moment finish() was called (the end of backward) until every all-reduce of the
  // step completed: the communication backward did not hide. 0 if all were done already.
  double exposed_comm_ms = 0;
  double finish_called_ms = 0;  // since the trace origin
  size_t bytes = 0;             // reduced by this rank in this step
  // CPU time the communication thread used from begin_step(true) to the step's end (its
  // thread clock): the compute cores' time that communication took — MPI progress and copies,
  // the reductions — which, with as many threads as cores, backward loses.
  double thread_cpu_ms = 0;
  long progress_polls = 0;  // Work::test calls on in-flight all-reduces (each one enters MPI)
  // With release_reduced: the most bytes of the full gradient buffer found resident (mincore)
  // right before a bucket was released; 0 without.
  size_t grad_resident_peak_bytes = 0;
  // Note [Bounded gradient memory]: the compute thread's time blocked in grad_ready.
  double held_wait_ms = 0;
  std::vector<BucketRecord> records;  // in launch order
  // Note [Ready order check]: the first bucket of the step whose parameters all became ready
  // while an earlier bucket still waited for one (-1: the buckets became ready in order), and
  // that earlier bucket. Buckets start in order, so every bucket from `ahead` on waited for
  // `late`: the parameters are not laid out in the order backward finishes them.
  int ahead_bucket = -1, late_bucket = -1;

  // A later reducing round of the same step joins this one (Note [ZeRO-2 and accumulation] in
  // train/zero.h: a round per micro-batch): times, bytes and polls add, the resident peak is
  // the larger, records follow; finish_called_ms is the later round's.
  ReduceStats& operator+=(const ReduceStats& later);
};

// The parameter all-gathers of one ZeRO round (launched after an optimizer step), and the
// compute thread's waiting for them. Reported by the step in which they were waited for.
struct GatherStats {
  bool gathered = false;  // a round completed since the last take_gather_stats
  double comm_ms = 0;     // union of the rounds' all-gather intervals
  double exposed_ms = 0;  // the compute thread waited this long (wait_gathered, begin_step)
  size_t bytes = 0;       // gathered (full buckets)
  std::vector<BucketRecord> records;
  // ZeRO-3: the most bytes of the full parameter buffer found resident, right before a
  // release_gathered; 0 otherwise.
  size_t params_resident_peak_bytes = 0;
};

class GradReducer {
 public:
  // `dp` is used only by the reducer's thread between begin_step(true) and finish() (apart
  // from dp.record_mark, called by grad_ready and add_extra); `grads` (host memory for a
  // host communicator, device memory for a device one) must stay valid for the reducer's
  // lifetime.
  GradReducer(Communicator& dp, float* grads, std::vector<GradParam> params_in_ready_order,
              GradReducerOptions options = {});
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;
  // Stops the thread. Reductions still in flight (only after an error) are abandoned.
  ~GradReducer();

  // Starts a step. reduce = false (an accumulation micro-batch): grad_ready, add_extra and
  // finish do nothing until the next begin_step. accumulate_shards (ZeRO-2 on the host,
  // Note [ZeRO-2 and accumulation] in train/zero.h): each bucket's reduce-scatter adds to what
  // its shard holds instead of replacing it — a step reduced one micro-batch at a time. With
  // HSDP (replicate_comm) only a step's last round (last_round) sums the shards over the
  // replicas: the earlier rounds' sums are in the shard by then (Note [HSDP] in
  // train/data_parallel.h); extras go over the replicas every round.
  void begin_step(bool reduce, bool accumulate_shards = false, bool last_round = true);
  // Called by the compute thread once parameter `param_index` (ready order) has its final
  // gradient for this step (on the GPU: its kernels were enqueued). Cheap: a queue push, plus
  // one event recorded on the compute stream with a device communicator. Rethrows an error the
  // thread already hit.
  void grad_ready(int param_index);
  // An extra buffer outside the flat buffer, all-reduced (summed) after every bucket has
  // been launched (e.g. a sparse gradient's rows). Every rank must add the same extras
  // in the same order; `data` must stay valid until finish() returns.
  void add_extra(float* data, size_t count, std::string name);
  // Waits until every bucket and extra is reduced (summed over dp), then
  // makes the compute stream wait for the communication (dp.compute_waits_for_comm; nothing on
  // the host). Throws the thread's error, or an Error naming a parameter that never became
  // ready.
  void finish();

  // ZeRO (options.shard_grads set): starts the all-gather of every bucket's parameters, in
  // options.gather_order, on the reducer's thread; each rank's own shard of `params` (updated
  // by its optimizer) is sent, and everyone's arrive in place. Call after the optimizer step;
  // `params` must stay valid. The next begin_step(true) waits for the round first.
  void start_param_gather(float* params);
  // Blocks until bucket b's parameters are gathered (at once if no round is open). Rethrows the
  // thread's error. wait_all_gathered: every bucket.
  void wait_gathered(size_t bucket);
  void wait_all_gathered();
  // ZeRO-3 (options.shard_params set): starts the all-gather of buckets [first, end) (one unit's)
  // from the shards into the full buffer, on the reducer's thread, in call order (the same on
  // every rank: Note [Same buckets, same order]); `unit` names them in records and errors. The
  // buckets must be released (not gathered, not in flight). Any time, in a step or between.
  // `base` (only without a full buffer): bucket b goes to base + buckets()[b].offset, and on a
  // device the gather is ordered after the compute stream's work enqueued so far.
  void gather(size_t first, size_t end, const std::string& unit, float* base = nullptr);
  // With options.pooled_grads: buckets [first, end)'s gradients are written at base + their
  // offsets, until their reduce-scatters (over the shard group: the first hop with replicas)
  // complete. Call before the compute stream writes them.
  void set_grad_base(size_t first, size_t end, float* base);
  // Blocks until the reduce-scatters of buckets [first, end) since their last set_grad_base
  // have completed (at once if none is pending). Rethrows the thread's error.
  void wait_reduced(size_t first, size_t end);
  // ZeRO-3: buckets [first, end) are no longer read: they count as not gathered again, and their
  // pages go back to the kernel. Each must have been waited for (wait_gathered).
  void release_gathered(size_t first, size_t end);
  // ZeRO-3: the full buffer's buckets [first, end) hold new values (initialisation, weights
  // loaded whole): this rank's shard of each is copied into shard_params, and their pages go
  // back. None of them may be gathered or in flight.
  void take_shards(size_t first, size_t end);
  // The completed rounds' figures and the waiting since the previous call; then reset.
  GatherStats take_gather_stats();
  bool sharded() const;
  // This rank's shard of bucket b: shard_count(b) elements at flat offset
  // buckets()[b].offset + shard_rank(b) · shard_count(b), stored at shard_offset(b) in the
  // shard buffers (shard_grads, and the optimizer's moments). shard_rank is the dp rank, or in
  // an expert's bucket the rank among its replicas (options.expert_comm).
  size_t shard_count(size_t b) const;
  int shard_rank(size_t b) const;
  size_t shard_offset(size_t b) const;
  size_t shard_total() const;  // elements of a shard buffer
  size_t bucket_of_param(size_t param) const;

  const ReduceStats& stats() const;  // of the last finish()ed step
  // Bucket offsets here are into the flat gradient buffer.
  const std::vector<Bucket>& buckets() const;
  const std::vector<GradParam>& params() const;
  const std::string& bucket_name(size_t bucket) const;

 private:
  void name_buckets();
  void init_sharded(const GradReducerOptions& options);
  void init_zero3(const GradReducerOptions& options);
  void start();  // the marks (Note [Marks made once]) and the thread
  struct State;  // shared with the communication thread; defined in grad_reducer.cpp
  std::unique_ptr<State> state_;
};

}  // namespace trident
