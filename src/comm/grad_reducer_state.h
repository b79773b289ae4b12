// GradReducer's state, shared by its two sides (internal to src/comm/):
//   grad_reducer.cpp         the compute thread's calls (grad_ready, finish, the ZeRO gathers'
//                            waits), which only post events and wait on condition variables;
//   grad_reducer_thread.cpp  the communication thread: its loop, the buckets' launches, the
//                            polling, the ZeRO release and gathers, the step's end and errors.
// The contract between them is stated at the top of grad_reducer.cpp.
#pragma once
#include <time.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "trident/grad_reducer.h"

namespace trident {
namespace reducer {

enum class EventKind { kBegin, kReady, kExtra, kFinish, kGather, kUnitGather };

struct Event {
  explicit Event(EventKind k) : kind(k), time(CommClock::now()) {}
  EventKind kind;
  CommClock::time_point time;  // when the compute thread posted it
  size_t param = 0;            // kReady; kUnitGather: the first bucket (count: the end)
  float* data = nullptr;       // kExtra; kGather: the parameters
  size_t count = 0;
  std::string name;
  // kReady, kExtra: where the compute stream was (null on host communicators).
  std::shared_ptr<const ComputeMark> mark;
};

struct ExtraBuffer {
  float* data;
  size_t count;
  std::string name;
  double added_ms;
  std::shared_ptr<const ComputeMark> mark;
};

// CPU time the calling thread has used, in ms (its own clock, not the wall).
// Union of [start, end] intervals, in ms (grad_reducer_thread.cpp).
double union_ms(std::vector<std::pair<double, double>> intervals);

inline double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) * 1e3 + double(t.tv_nsec) * 1e-6;
}

}  // namespace reducer

struct GradReducer::State {
  // Fixed at construction; read by both threads.
  Communicator& dp;
  float* grads;
  std::vector<GradParam> params;
  std::vector<Bucket> buckets;  // offsets into grads
  std::vector<std::string> bucket_names;
  std::vector<size_t> bucket_of_param;
  bool overlap;
  size_t max_message;  // floats per all-reduce call (Note [Message size])
  CommClock::time_point origin;
  // Note [ZeRO-1]: with shard_grads, bucket b is reduce-scattered into
  // shard_grads + shard_offset[b] (shard_count[b] elements) and all-gathered after the update.
  float* shard_grads = nullptr;
  std::vector<size_t> shard_count, shard_offset;
  size_t shard_total = 0;
  std::vector<size_t> gather_order;
  // ZeRO-3: the full parameter buffer, the shards, the gathers' communicator (null otherwise).
  float* full_params = nullptr;
  float* shard_params = nullptr;
  Communicator* gather_comm = nullptr;
  // ZeRO-3 on a device (Note [Weights in unit slots] in train/zero3_pool.h): no full buffer;
  // each gather names where its unit goes, and is ordered after the compute stream's mark
  // recorded when it was asked for (one made-once mark per bucket, the unit's first).
  bool pooled = false;
  std::vector<std::shared_ptr<ComputeMark>> unit_marks;
  // Note [Gradients in unit slots] in train/grad_pool.h: per bucket, where its gradients are
  // (set by the compute thread before it writes them), and whether its reduce-scatter since
  // then is still to complete (under `mutex`; released_cv tells).
  bool pooled_grads = false;
  std::vector<float*> bucket_grads;
  std::vector<char> grads_pending;
  std::function<void(float*, const float*, size_t)> add_shard;  // Note [Shard sums on a device]
  // Note [bf16 unit gathers] (train/zero3_pool.h): per bucket, gathered from shard_params16 as
  // bf16 into the first half of its place (empty: none).
  const bfloat16* shard_params16 = nullptr;
  std::vector<char> gather_bf16;
  Communicator* replicate = nullptr;    // HSDP: the second hop's communicator (null: none)
  Communicator* expert_comm = nullptr;  // the experts' buckets' (null: none)
  std::vector<char> expert_bucket;      // per bucket: reduced on expert_comm
  Communicator& comm_of(size_t bucket) const {
    return !expert_bucket.empty() && expert_bucket[bucket] ? *expert_comm : dp;
  }
  // ZeRO-3: the experts' buckets gather over their replicas too, on a duplicate of expert_comm.
  Communicator* expert_gather_comm = nullptr;
  Communicator& gathers_on(size_t bucket) const {
    return !expert_bucket.empty() && expert_bucket[bucket] ? *expert_gather_comm : *gather_comm;
  }
  std::vector<char> requested;  // compute thread: per bucket, gathered or in flight
  std::vector<unsigned char> params_page_scratch;  // compute thread's, for resident_bytes
  size_t params_resident_peak = 0;                 // compute thread's, until taken
  bool release_reduced = false;                    // ZeRO-2 on the host
  bool accumulate_shards = false;  // this round adds to the shard (begin_step's accumulate)
  bool replicate_shards = true;    // HSDP: this round sums the shards over the replicas
  size_t grads_total = 0;          // elements of the flat gradient buffer
  std::vector<unsigned char> page_scratch;  // resident_bytes's, this thread's

  // Compute thread only.
  bool step_open = false;
  bool step_reduces = false;
  bool step_accumulates = false;  // begin_step's accumulate_shards, for grad_ready
  std::vector<char> marked;
  std::vector<size_t> unmarked;  // per bucket: its parameters not yet marked ready this step
  double held_wait_ms = 0;       // Note [Bounded gradient memory]
  ReduceStats finished_stats;
  double gather_wait_ms = 0;  // waiting in wait_gathered since the last take_gather_stats
  // Note [Marks made once]: null on a host communicator (timed ones: where it does not time).
  std::vector<std::shared_ptr<ComputeMark>> bucket_marks, extra_marks;
  std::shared_ptr<ComputeMark> gather_mark, origin_mark, end_mark;
  size_t extras_added = 0;  // add_extra calls this step
  std::shared_ptr<const ComputeMark> record(const std::shared_ptr<ComputeMark>& mark);

  // Shared, under `mutex`.
  std::mutex mutex;
  std::condition_variable wake_thread;
  std::condition_variable step_done_cv;
  std::deque<reducer::Event> events;
  bool shutdown = false;
  bool step_done = false;
  std::exception_ptr error;
  ReduceStats published_stats;
  std::atomic<bool> failed{false};           // error != nullptr, readable without the lock
  std::condition_variable gather_cv;         // a bucket was gathered, or the thread failed
  std::vector<char> gathered;                // per bucket: its parameters are complete here
  GatherStats published_gather;              // the last completed round, until taken
  std::atomic<bool> compute_waiting{false};  // the compute thread waits for a gather
  // Note [Bounded gradient memory]: bytes of complete buckets not yet released; the compute
  // thread adds, the thread subtracts on release (and clears on failure), under `mutex`.
  size_t max_held_bytes = 0;
  size_t held_bytes = 0;
  std::condition_variable released_cv;

  // Communication thread only.
  struct InFlight {
    Work work;
    size_t record;            // index into building.records (gathers: gather_building.records)
    int gather_bucket = -1;   // >= 0: the all-gather of this bucket's parameters
    bool second_hop = false;  // HSDP: the all-reduce over the replicas
  };
  // HSDP, per record of the step: first-hop pieces still in flight, and what the second hop
  // sums over the replicas; the next record whose second hop starts (in record order).
  std::vector<size_t> hop1_left;
  std::vector<std::pair<float*, size_t>> hop2;
  size_t next_hop2 = 0;
  bool active = false;     // a reducing step is running and has not ended
  bool finishing = false;  // finish() was called
  CommClock::time_point finish_time;
  // Note [Device time of an operation]: the step's origin and its end of backward on the
  // compute stream (null on a host communicator).
  std::shared_ptr<const ComputeMark> step_origin, backward_end;
  std::vector<size_t> pending;
  std::vector<char> seen;
  std::vector<double> ready_ms;
  std::vector<std::shared_ptr<const ComputeMark>> ready_mark;  // of the bucket's last ready param
  size_t next_bucket = 0;
  size_t first_incomplete = 0;  // the lowest bucket with a parameter not yet ready
  std::vector<reducer::ExtraBuffer> extras;
  size_t next_extra = 0;
  std::vector<InFlight> in_flight;
  ReduceStats building;
  double step_cpu_start_ms = 0;  // this thread's CPU clock at the step's begin event
  bool gathering = false;        // a parameter all-gather round is in flight
  size_t gathers_left = 0;
  GatherStats gather_building;

  std::thread thread;

  State(Communicator& dp_, float* grads_, std::vector<GradParam> params_, bool overlap_,
        size_t max_message_, CommClock::time_point origin_)
      : dp(dp_), grads(grads_), params(std::move(params_)), overlap(overlap_),
        max_message(max_message_), origin(origin_) {}

  double ms(CommClock::time_point t) const {
    return std::chrono::duration<double, std::milli>(t - origin).count();
  }

  void post(reducer::Event event) {
    {
      std::lock_guard lock(mutex);
      events.push_back(std::move(event));
    }
    wake_thread.notify_one();
  }

  [[noreturn]] void rethrow_error() {
    std::exception_ptr e;
    {
      std::lock_guard lock(mutex);
      e = error;
    }
    std::rethrow_exception(e);
  }

  // ---- the communication thread (grad_reducer_thread.cpp) ----
  void run();
  CommClock::time_point next_poll(int idle_polls) const;
  void handle(reducer::Event& e);
  void start_gathers(float* params, const ComputeMark* after);
  void start_unit_gathers(size_t first, size_t end, const std::string& unit, float* base,
                          const ComputeMark* after);
  void push_gather(size_t bucket, Work work, std::string name, size_t elem_bytes = sizeof(float));
  // ZeRO-3, compute thread: the full buffer's pages of buckets [first, end) go back.
  void release_full(size_t first, size_t end);
  void end_gather_round(size_t last_bucket);
  void release_bucket(size_t b);
  size_t reduces_in_flight() const;
  void start(float* data, size_t count, std::string name, int bucket, double ready,
             const ComputeMark* mark);
  bool launch_ready();
  void launch_second_hops();  // HSDP
  bool poll_in_flight();
  void end_step_if_done();
  void time_on_device();  // Note [Device time of an operation]
  [[noreturn]] void throw_never_ready();
  void fail_step(std::exception_ptr e);
};

}  // namespace trident
