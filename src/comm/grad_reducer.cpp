// GradReducer: bucketed data-parallel gradient reduction on a communication thread. This file
// is the compute thread's side (construction, begin_step, grad_ready, finish, ZeRO's gathers'
// waits and accessors); the thread's side is grad_reducer_thread.cpp.
//
// The communication thread's contract
//
// 1. Who calls MPI (or NCCL). Between begin_step(true) and the end of finish() only the
//    reducer's thread touches the dp communicator (Note [One thread per communicator] in
//    trident/comm.h). The compute thread's grad_ready, add_extra and finish only push events
//    into a queue under a mutex; finish() then sleeps on a condition variable. Its one dp call
//    is record_mark (Note [Gradient-ready events] in trident/comm.h). Tensor-parallel
//    collectives run on the compute thread meanwhile, on other communicators: hence
//    MPI_THREAD_MULTIPLE.
// 2. In what order: Note [Same buckets, same order]. Several operations may be in flight.
// 3. Why a thread: the reduction of late layers overlaps the backward of early ones. With
//    overlap = false it makes the same calls on the same slices after finish(), so the
//    gradients are bitwise equal either way.
// 4. Where the average is taken: by the caller, in backward's seed
//    (Note [Average in the loss seed] in train/gpt_stage.cpp). The thread only sums, so it
//    never makes a pass over the gradients of its own and never touches device memory.
// 5. On a device it only enqueues. Before starting a bucket the thread calls order_after(the
//    mark of its last ready parameter); the compute stream is in order, so that mark covers the
//    bucket. Polls are event queries; finish() ends with compute_waits_for_comm, so the
//    optimizer enqueued next reads reduced gradients and the host never waits on the GPU.
// 6. Who drives progress. A nonblocking MPI operation advances only while some thread is inside
//    MPI, so while anything is in flight the thread tests it (Note [One progress call per poll]
//    in src/comm/grad_reducer_thread.cpp), then pauses on its condition variable, woken early
//    by an event (Note [Polling beside compute] there; progress_backoff after finish(); until
//    the first link's end when only emulated links are left). With nothing in flight it sleeps
//    until an event comes, taking no core from compute.
// 7. How errors travel. Anything thrown on the thread ends the step: work in flight is
//    abandoned and the error is rethrown by the next grad_ready, add_extra or finish. A
//    parameter that never became ready is found at finish(), after the buckets before it have
//    completed, so every rank names it; where it is missing on one rank only, the others'
//    bucket times out (comm.timeout_s), naming the bucket. No rank hangs.
//
// Note [Same buckets, same order]
// MPI pairs a communicator's collectives by the order they are started, so every rank must
// start the same operations in the same order, or they pair wrongly (wrong sums or a hang).
// The buckets are a pure function of parameter sizes and byte limits; bucket b starts once its
// parameters are all ready and buckets 0..b-1 have started, whatever order the events came in;
// extras follow the last bucket in the order they were added.
#include "trident/grad_reducer.h"

#include <fmt/format.h>

#include <algorithm>

#include "comm/grad_reducer_state.h"
#include "comm/host_pages.h"
#include "trident/check.h"

namespace trident {

using reducer::Event;
using reducer::EventKind;
using reducer::thread_cpu_ms;

ReduceStats& ReduceStats::operator+=(const ReduceStats& later) {
  reduced = reduced || later.reduced;
  comm_ms += later.comm_ms;
  exposed_comm_ms += later.exposed_comm_ms;
  finish_called_ms = later.finish_called_ms;
  bytes += later.bytes;
  thread_cpu_ms += later.thread_cpu_ms;
  progress_polls += later.progress_polls;
  grad_resident_peak_bytes = std::max(grad_resident_peak_bytes, later.grad_resident_peak_bytes);
  held_wait_ms += later.held_wait_ms;
  records.insert(records.end(), later.records.begin(), later.records.end());
  device_timed = device_timed && later.device_timed;
  if (ahead_bucket < 0) ahead_bucket = later.ahead_bucket, late_bucket = later.late_bucket;
  return *this;
}

// ---- the compute thread's side ----

GradReducer::GradReducer(Communicator& dp, float* grads,
                         std::vector<GradParam> params_in_ready_order, GradReducerOptions options)
    : state_(std::make_unique<State>(dp, grads, std::move(params_in_ready_order), options.overlap,
                                     std::max<size_t>(1, options.max_message_bytes / sizeof(float)),
                                     options.trace_origin)) {
  State& s = *state_;
  const auto& p = s.params;
  if (options.shard_grads) {
    init_sharded(options);
    return;
  }
  bool ascending = true, descending = true;
  size_t total = 0;
  for (size_t i = 0; i + 1 < p.size(); ++i) {
    ascending = ascending && p[i + 1].offset == p[i].offset + p[i].count;
    descending = descending && p[i + 1].offset + p[i + 1].count == p[i].offset;
  }
  for (const GradParam& q : p) total += q.count;
  if (p.size() > 1 && !ascending && !descending) {
    size_t i = 0;
    while (i + 2 < p.size() && p[i + 1].offset == p[i].offset + p[i].count) ++i;
    internal_error(
        __FILE__, __LINE__,
        fmt::format("GradReducer: parameters must be contiguous in the gradient "
                    "buffer in ready order; '{}' [{}, +{}) is followed by '{}' [{}, +{})",
                    p[i].name, p[i].offset, p[i].count, p[i + 1].name, p[i + 1].offset,
                    p[i + 1].count));
  }
  TRIDENT_CHECK(grads != nullptr || total == 0, "GradReducer: null gradient buffer");

  std::vector<size_t> counts;
  for (const GradParam& q : p) counts.push_back(q.count);
  if (options.expert_comm) {  // the experts' buckets apart (multiple 1: no padding)
    TRIDENT_CHECK(options.expert.size() == p.size(), "{} expert flags for {} parameters",
                  options.expert.size(), p.size());
    s.buckets = padded_bucket_layout(counts, sizeof(float), options.first_bucket_bytes,
                                     options.bucket_bytes, 1, options.expert)
                    .buckets;
    s.expert_comm = options.expert_comm;
    for (const Bucket& b : s.buckets) s.expert_bucket.push_back(options.expert[b.first_param]);
  } else {
    s.buckets =
        assign_buckets(counts, sizeof(float), options.first_bucket_bytes, options.bucket_bytes);
  }
  for (Bucket& bucket : s.buckets) {
    const size_t first = bucket.first_param, last = first + bucket.num_params - 1;
    bucket.offset = descending && !ascending ? p[last].offset : p[first].offset;
  }
  name_buckets();
  start();
}

void GradReducer::name_buckets() {
  State& s = *state_;
  const auto& p = s.params;
  s.bucket_of_param.resize(p.size());
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    const Bucket& bucket = s.buckets[b];
    const size_t first = bucket.first_param, last = first + bucket.num_params - 1;
    for (size_t i = first; i <= last; ++i) s.bucket_of_param[i] = b;
    s.bucket_names.push_back(
        first == last ? fmt::format("bucket {} ({})", b, p[first].name)
                      : fmt::format("bucket {} ({} .. {})", b, p[first].name, p[last].name));
  }
  s.gathered.assign(s.buckets.size(), 1);
  s.bucket_grads.assign(s.buckets.size(), nullptr);  // pooled: set_grad_base's
  for (size_t b = 0; b < s.buckets.size() && s.grads; ++b)
    s.bucket_grads[b] = s.grads + s.buckets[b].offset;
  s.grads_pending.assign(s.buckets.size(), 0);
}

// Note [ZeRO-1]: the buckets of the padded layout; the parameters must already sit there.
void GradReducer::init_sharded(const GradReducerOptions& options) {
  State& s = *state_;
  const auto& p = s.params;
  std::vector<size_t> counts;
  for (const GradParam& q : p) counts.push_back(q.count);
  const auto ranks = size_t(s.dp.size());
  const BucketLayout layout =
      padded_bucket_layout(counts, sizeof(float), options.first_bucket_bytes, options.bucket_bytes,
                           ranks, options.alone, options.breaks);
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i].offset != layout.param_offsets[i])
      internal_error(__FILE__, __LINE__,
                     fmt::format("GradReducer: parameter '{}' is at offset {}, but the padded "
                                 "bucket layout puts it at {} (Note [Padded buckets])",
                                 p[i].name, p[i].offset, layout.param_offsets[i]));
  s.buckets = layout.buckets;
  // Note [Expert parallelism]: an expert's bucket (alone) is sharded over its own replicas;
  // with HSDP over those within a replica, its shard then summed over the replicas as dense
  // buckets' are (Note [Experts with HSDP] in train/zero3.h).
  if (options.expert_comm) {
    TRIDENT_CHECK(options.expert.size() == p.size(),
                  "GradReducer: expert flags for {} of {} parameters", options.expert.size(),
                  p.size());
    s.expert_comm = options.expert_comm;
    for (const Bucket& b : s.buckets) {
      const bool expert = options.expert[b.first_param];
      TRIDENT_CHECK(!expert || b.num_params == 1, "GradReducer: an expert bucket of {} tensors",
                    b.num_params);
      s.expert_bucket.push_back(expert);
    }
  }
  s.shard_grads = options.shard_grads;
  // Note [Gradients in unit slots] (train/grad_pool.h): no buffer; each bucket's place is set.
  s.pooled_grads = options.pooled_grads;
  TRIDENT_CHECK(!s.pooled_grads || (!s.grads && !options.release_reduced),
                "GradReducer: pooled gradients with a flat buffer or released host pages");
  s.add_shard = options.add_shard;
  TRIDENT_CHECK(!s.add_shard || s.pooled_grads,
                "GradReducer: add_shard is for pooled gradients (Note [Shard sums on a device])");
  s.replicate = options.replicate_comm;
  s.release_reduced = options.release_reduced;
  // Note [Bounded gradient memory]: without overlap nothing is released before finish(), so a
  // bound would wait forever; it applies with overlap only.
  s.max_held_bytes = s.release_reduced && s.overlap ? options.max_held_bytes : 0;
  s.grads_total = layout.total;
  // Note [ZeRO-2 on the host]: the released buckets are written again every step; and the
  // buffer starts released (its allocation zeroed, so touched, every page), or the first step's
  // peak would count pages no backward wrote.
  if (s.release_reduced) {
    prefer_huge_pages(s.grads, s.grads_total * sizeof(float));
    release_host_floats(s.grads, s.grads_total);
  }
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    s.shard_offset.push_back(s.shard_total);
    s.shard_count.push_back(layout.shard_count(b, size_t(s.comm_of(b).size())));
    s.shard_total += s.shard_count.back();
  }
  s.gather_order = options.gather_order;
  if (s.gather_order.empty())
    for (size_t b = s.buckets.size(); b-- > 0;) s.gather_order.push_back(b);
  std::vector<char> listed(s.buckets.size(), 0);
  for (size_t b : s.gather_order) {
    TRIDENT_CHECK(b < listed.size() && !listed[b],
                  "GradReducer: gather order lists bucket {} "
                  "twice or out of range ({} buckets)",
                  b, listed.size());
    listed[b] = 1;
  }
  TRIDENT_CHECK(s.gather_order.size() == s.buckets.size(),
                "GradReducer: gather order has {} of {} buckets", s.gather_order.size(),
                s.buckets.size());
  name_buckets();
  if (options.shard_params) init_zero3(options);
  start();
}

// Note [ZeRO-3 units] (train/zero3.h): nothing is gathered until a unit asks.
void GradReducer::init_zero3(const GradReducerOptions& options) {
  State& s = *state_;
  s.pooled = options.params == nullptr;  // Note [Weights in unit slots] in train/zero3_pool.h
  TRIDENT_CHECK(options.gather_comm && (s.pooled || s.release_reduced),
                "GradReducer: ZeRO-3 needs a gather communicator, and on the host released "
                "gradients");
  TRIDENT_CHECK(
      options.gather_comm->size() == s.dp.size() && options.gather_comm->rank() == s.dp.rank(),
      "GradReducer: the gather communicator (rank {} of {}) is not dp's (rank {} of {})",
      options.gather_comm->rank(), options.gather_comm->size(), s.dp.rank(), s.dp.size());
  s.full_params = options.params;
  s.shard_params = options.shard_params;
  s.gather_comm = options.gather_comm;
  if (s.expert_comm) {  // Note [Expert parallelism]: the experts' shards, over their replicas
    const Communicator* g = options.expert_gather_comm;
    TRIDENT_CHECK(g && g->size() == s.expert_comm->size() && g->rank() == s.expert_comm->rank(),
                  "GradReducer: ZeRO-3 with experts needs a gather communicator of expert_comm's "
                  "ranks");
    s.expert_gather_comm = options.expert_gather_comm;
  }
  s.gathered.assign(s.buckets.size(), 0);
  s.requested.assign(s.buckets.size(), 0);
  if (!options.gather_bf16.empty()) {  // Note [bf16 unit gathers]
    TRIDENT_CHECK(
        s.pooled && options.shard_params16 && options.gather_bf16.size() == s.params.size(),
        "GradReducer: bf16 gathers need a device pool, the bf16 shards and a flag per "
        "parameter");
    s.shard_params16 = options.shard_params16;
    for (const Bucket& b : s.buckets) {
      const bool bf16 = options.gather_bf16[b.first_param] != 0;
      TRIDENT_CHECK(!bf16 || b.num_params == 1, "GradReducer: bf16 gather of {} not alone",
                    s.params[b.first_param].name);
      s.gather_bf16.push_back(bf16);
    }
  }
  if (s.pooled) {
    for (size_t b = 0; b < s.buckets.size(); ++b)
      s.unit_marks.push_back(s.gather_comm->new_mark(false));  // Note [Marks made once]
    return;
  }
  prefer_huge_pages(s.full_params, s.grads_total * sizeof(float));  // Note [Huge pages released]
  release_host_floats(s.full_params, s.grads_total);
}

// Note [Marks made once]
// A device mark is an event, and making one is host work. Only the grad_ready that completes a
// bucket is waited on, so the reducer makes one mark per bucket (and for the gathers, the
// extras, the timed origin and end of backward) here, and records it again each step. finish()
// and the gathers' waits come after the thread's order_after of the last round, so no mark is
// recorded again while the thread may still read it.
void GradReducer::start() {
  State& s = *state_;
  for (size_t b = 0; b < s.buckets.size(); ++b) s.bucket_marks.push_back(s.dp.new_mark(false));
  s.gather_mark = s.dp.new_mark(false);
  s.origin_mark = s.dp.new_mark(true);  // Note [Device time of an operation]; null untimed
  s.end_mark = s.dp.new_mark(true);
  s.marked.assign(s.params.size(), 0);
  s.thread = std::thread([&s] { s.run(); });
}

// A made-once mark recorded now, as shared with the thread (null on a host communicator).
std::shared_ptr<const ComputeMark> GradReducer::State::record(
    const std::shared_ptr<ComputeMark>& mark) {
  if (mark) dp.record_mark(*mark);
  return mark;
}

GradReducer::~GradReducer() {
  {
    std::lock_guard lock(state_->mutex);
    state_->shutdown = true;
  }
  state_->wake_thread.notify_one();
  state_->thread.join();
}

void GradReducer::begin_step(bool reduce, bool accumulate_shards, bool last_round) {
  State& s = *state_;
  TRIDENT_CHECK(!(s.step_open && s.step_reduces) || s.failed.load(std::memory_order_acquire),
                "GradReducer::begin_step({}) while a reducing step is open: call finish() first",
                reduce);
  s.step_open = true;
  s.step_reduces = reduce;
  s.step_accumulates = reduce && accumulate_shards;
  if (!reduce) return;
  // The thread is done with the last round (ZeRO-1/2). ZeRO-3's gathers go on through the step.
  if (s.shard_grads && !s.shard_params) wait_all_gathered();
  std::fill(s.marked.begin(), s.marked.end(), 0);
  s.unmarked.resize(s.buckets.size());
  for (size_t b = 0; b < s.buckets.size(); ++b) s.unmarked[b] = s.buckets[b].num_params;
  s.held_wait_ms = 0;
  s.extras_added = 0;
  {
    std::lock_guard lock(s.mutex);
    s.held_bytes = 0;  // every bucket of the last step was released (or the step failed)
    s.error = nullptr;
    s.failed.store(false, std::memory_order_release);
    s.step_done = false;
    TRIDENT_CHECK(!accumulate_shards || (s.shard_grads && (s.release_reduced || s.add_shard)),
                  "GradReducer: accumulating into the shards needs ZeRO-2 on the host or "
                  "add_shard (Note [Shard sums on a device])");
    Event e(EventKind::kBegin);
    e.param = (accumulate_shards ? 1 : 0) | (last_round ? 0 : 2);
    e.mark = s.record(s.origin_mark);  // Note [Device time of an operation]; null untimed
    s.events.push_back(std::move(e));
  }
  s.wake_thread.notify_one();
}

void GradReducer::grad_ready(int param_index) {
  State& s = *state_;
  TRIDENT_CHECK(s.step_open, "GradReducer::grad_ready({}) outside a step (begin_step first)",
                param_index);
  if (!s.step_reduces) return;
  if (s.failed.load(std::memory_order_acquire)) s.rethrow_error();
  TRIDENT_CHECK(param_index >= 0 && static_cast<size_t>(param_index) < s.params.size(),
                "GradReducer::grad_ready({}): there are {} parameters", param_index,
                s.params.size());
  const auto i = static_cast<size_t>(param_index);
  TRIDENT_CHECK(!s.marked[i],
                "GradReducer: parameter '{}' (ready index {}) marked ready twice "
                "in one step",
                s.params[i].name, i);
  s.marked[i] = 1;
  Event e(EventKind::kReady);
  e.param = i;
  const size_t b = s.bucket_of_param[i];
  const bool completes = --s.unmarked[b] == 0;
  // Note [Shard sums on a device]: before the mark the reduce-scatter is ordered after.
  if (completes && s.step_accumulates && s.add_shard) {
    const Communicator& comm = s.comm_of(b);
    s.add_shard(s.bucket_grads[b] + size_t(comm.rank()) * s.shard_count[b],
                s.shard_grads + s.shard_offset[b], s.shard_count[b]);
  }
  // Note [Marks made once]: after the gradient's kernels were enqueued, the bucket's last only.
  if (completes) e.mark = s.record(s.bucket_marks[b]);
  if (!completes || s.max_held_bytes == 0) {
    s.post(std::move(e));
    return;
  }
  // Note [Bounded gradient memory]: the bucket counts as held from now until its release; then
  // wait (the thread can always go on: every held bucket is complete, and the buckets before it
  // are too, so it can start and finish them without this thread).
  std::unique_lock lock(s.mutex);
  s.held_bytes += s.buckets[b].count * sizeof(float);
  s.events.push_back(std::move(e));
  s.wake_thread.notify_one();
  if (s.held_bytes <= s.max_held_bytes) return;
  const auto t0 = CommClock::now();
  s.released_cv.wait(lock, [&] { return s.held_bytes <= s.max_held_bytes || s.error; });
  s.held_wait_ms += std::chrono::duration<double, std::milli>(CommClock::now() - t0).count();
  if (s.error) std::rethrow_exception(s.error);
}

void GradReducer::add_extra(float* data, size_t count, std::string name) {
  State& s = *state_;
  TRIDENT_CHECK(s.step_open, "GradReducer::add_extra('{}') outside a step", name);
  if (!s.step_reduces) return;
  if (s.failed.load(std::memory_order_acquire)) s.rethrow_error();
  TRIDENT_CHECK(data != nullptr || count == 0, "GradReducer::add_extra('{}'): null data", name);
  Event e(EventKind::kExtra);
  e.data = data;
  e.count = count;
  e.name = std::move(name);
  if (s.extras_added == s.extra_marks.size()) s.extra_marks.push_back(s.dp.new_mark(false));
  e.mark = s.record(s.extra_marks[s.extras_added++]);  // Note [Marks made once]
  s.post(std::move(e));
}

void GradReducer::finish() {
  State& s = *state_;
  TRIDENT_CHECK(s.step_open, "GradReducer::finish() without begin_step");
  s.step_open = false;
  if (!s.step_reduces) {
    s.finished_stats = ReduceStats{};
    return;
  }
  Event e(EventKind::kFinish);
  e.mark = s.record(s.end_mark);  // the end of backward on the compute stream, if timed
  s.post(std::move(e));
  std::unique_lock lock(s.mutex);
  s.step_done_cv.wait(lock, [&] { return s.step_done; });
  if (s.error) std::rethrow_exception(s.error);
  s.finished_stats = s.published_stats;
  s.finished_stats.held_wait_ms = s.held_wait_ms;
  lock.unlock();
  // The thread is done with dp until the next begin_step, so this thread may use it: work
  // enqueued on the compute stream from now on (the optimizer) runs after the reductions.
  s.dp.compute_waits_for_comm();
}

void GradReducer::start_param_gather(float* params) {
  State& s = *state_;
  TRIDENT_CHECK(s.shard_grads, "GradReducer::start_param_gather on a reducer that is not sharded");
  TRIDENT_CHECK(!s.step_open || !s.step_reduces,
                "GradReducer::start_param_gather during a reducing step");
  wait_all_gathered();
  {
    std::lock_guard lock(s.mutex);
    std::fill(s.gathered.begin(), s.gathered.end(), 0);
    Event e(EventKind::kGather);
    e.data = params;
    e.mark = s.record(s.gather_mark);  // after the optimizer's kernels (device communicators)
    s.events.push_back(std::move(e));
  }
  s.wake_thread.notify_one();
}

void GradReducer::wait_gathered(size_t bucket) {
  State& s = *state_;
  TRIDENT_CHECK(!s.shard_params || s.requested.at(bucket),
                "GradReducer: waiting for {}, which no unit's gather asked for",
                s.bucket_names.at(bucket));
  std::unique_lock lock(s.mutex);
  if (s.gathered[bucket] && !s.error) return;
  const auto t0 = CommClock::now();
  s.compute_waiting.store(true, std::memory_order_relaxed);
  s.wake_thread.notify_one();  // so it polls without the pause kept beside compute
  s.gather_cv.wait(lock, [&] { return s.gathered[bucket] || s.error; });
  s.compute_waiting.store(false, std::memory_order_relaxed);
  s.gather_wait_ms += std::chrono::duration<double, std::milli>(CommClock::now() - t0).count();
  if (s.error) std::rethrow_exception(s.error);
}

void GradReducer::wait_all_gathered() {
  for (size_t b : state_->gather_order) wait_gathered(b);
}

void GradReducer::gather(size_t first, size_t end, const std::string& unit, float* base) {
  State& s = *state_;
  TRIDENT_CHECK(s.shard_params, "GradReducer::gather('{}') without ZeRO-3", unit);
  TRIDENT_CHECK((base != nullptr) == s.pooled,
                "GradReducer::gather('{}'): a destination is named {} a device pool", unit,
                s.pooled ? "only with" : "without");
  TRIDENT_CHECK(first < end && end <= s.buckets.size(),
                "GradReducer::gather('{}'): buckets [{}, {})"
                " of {}",
                unit, first, end, s.buckets.size());
  if (s.failed.load(std::memory_order_acquire)) s.rethrow_error();
  {
    std::lock_guard lock(s.mutex);
    for (size_t b = first; b < end; ++b) {
      TRIDENT_CHECK(!s.requested[b],
                    "GradReducer: unit '{}' gathered twice ({} is gathered or "
                    "in flight)",
                    unit, s.bucket_names[b]);
      s.requested[b] = 1;
      s.gathered[b] = 0;
    }
    Event e(EventKind::kUnitGather);
    e.param = first;
    e.count = end;
    e.name = unit;
    e.data = s.pooled ? base : s.full_params;
    // Recorded again only once the unit was released, after its gather was waited for.
    if (s.pooled && s.unit_marks[first]) {
      s.gather_comm->record_mark(*s.unit_marks[first]);
      e.mark = s.unit_marks[first];
    }
    s.events.push_back(std::move(e));
  }
  s.wake_thread.notify_one();
}

void GradReducer::set_grad_base(size_t first, size_t end, float* base) {
  State& s = *state_;
  TRIDENT_CHECK(s.pooled_grads && first < end && end <= s.buckets.size() && base,
                "GradReducer::set_grad_base [{}, {}) of {} buckets without pooled gradients", first,
                end, s.buckets.size());
  std::lock_guard lock(s.mutex);
  for (size_t b = first; b < end; ++b) {
    TRIDENT_CHECK(!s.grads_pending[b], "GradReducer: {} given a new place before it was reduced",
                  s.bucket_names[b]);
    s.bucket_grads[b] = base + s.buckets[b].offset;
    s.grads_pending[b] = 1;
  }
}

void GradReducer::wait_reduced(size_t first, size_t end) {
  State& s = *state_;
  TRIDENT_CHECK(s.pooled_grads && first < end && end <= s.buckets.size(),
                "GradReducer::wait_reduced [{}, {}) of {} buckets without pooled gradients", first,
                end, s.buckets.size());
  std::unique_lock lock(s.mutex);
  auto done = [&] {
    return s.error || std::none_of(s.grads_pending.begin() + std::ptrdiff_t(first),
                                   s.grads_pending.begin() + std::ptrdiff_t(end),
                                   [](char p) { return p != 0; });
  };
  if (!done()) {
    const auto t0 = CommClock::now();
    s.compute_waiting.store(true, std::memory_order_relaxed);
    s.wake_thread.notify_one();  // so it polls without the pause kept beside compute
    s.released_cv.wait(lock, done);
    s.compute_waiting.store(false, std::memory_order_relaxed);
    s.held_wait_ms += std::chrono::duration<double, std::milli>(CommClock::now() - t0).count();
  }
  if (s.error) std::rethrow_exception(s.error);
}

void GradReducer::release_gathered(size_t first, size_t end) {
  State& s = *state_;
  TRIDENT_CHECK(s.shard_params && first < end && end <= s.buckets.size(),
                "GradReducer::release_gathered [{}, {}) of {} buckets", first, end,
                s.buckets.size());
  if (!s.pooled)
    s.params_resident_peak = std::max(
        s.params_resident_peak,
        resident_bytes(s.full_params, s.grads_total * sizeof(float), s.params_page_scratch));
  {
    std::lock_guard lock(s.mutex);
    for (size_t b = first; b < end; ++b) {
      TRIDENT_CHECK(s.requested[b] && s.gathered[b],
                    "GradReducer: {} released before it was "
                    "gathered",
                    s.bucket_names[b]);
      s.requested[b] = 0;
      s.gathered[b] = 0;
    }
  }
  if (!s.pooled) s.release_full(first, end);
}

void GradReducer::take_shards(size_t first, size_t end) {
  State& s = *state_;
  TRIDENT_CHECK(s.shard_params && first < end && end <= s.buckets.size(),
                "GradReducer::take_shards [{}, {}) of {} buckets", first, end, s.buckets.size());
  TRIDENT_CHECK(!s.pooled, "GradReducer::take_shards: no full buffer (a device pool)");
  for (size_t b = first; b < end; ++b) {
    TRIDENT_CHECK(!s.requested[b], "GradReducer::take_shards: {} is gathered or in flight",
                  s.bucket_names[b]);
    const auto r = size_t(s.comm_of(b).rank());  // an expert's bucket: among its replicas
    std::copy_n(s.full_params + s.buckets[b].offset + r * s.shard_count[b], s.shard_count[b],
                s.shard_params + s.shard_offset[b]);
  }
  s.release_full(first, end);
}

void GradReducer::State::release_full(size_t first, size_t end) {
  const size_t begin = buckets[first].offset;
  release_host_floats(full_params + begin,
                      buckets[end - 1].offset + buckets[end - 1].count - begin);
}

GatherStats GradReducer::take_gather_stats() {
  State& s = *state_;
  GatherStats out;
  {
    std::lock_guard lock(s.mutex);
    out = std::move(s.published_gather);
    s.published_gather = GatherStats{};
  }
  std::vector<std::pair<double, double>> busy;
  for (const BucketRecord& r : out.records) {
    busy.emplace_back(r.start_ms, r.end_ms);
    out.bytes += r.bytes;
  }
  out.comm_ms = reducer::union_ms(std::move(busy));
  out.exposed_ms = s.gather_wait_ms;
  out.params_resident_peak_bytes = s.params_resident_peak;
  s.gather_wait_ms = 0;
  s.params_resident_peak = 0;
  return out;
}

bool GradReducer::sharded() const { return state_->shard_grads != nullptr; }
size_t GradReducer::shard_count(size_t b) const { return state_->shard_count.at(b); }
int GradReducer::shard_rank(size_t b) const { return state_->comm_of(b).rank(); }
size_t GradReducer::shard_offset(size_t b) const { return state_->shard_offset.at(b); }
size_t GradReducer::shard_total() const { return state_->shard_total; }
size_t GradReducer::bucket_of_param(size_t param) const {
  return state_->bucket_of_param.at(param);
}

const ReduceStats& GradReducer::stats() const { return state_->finished_stats; }
const std::vector<Bucket>& GradReducer::buckets() const { return state_->buckets; }
const std::vector<GradParam>& GradReducer::params() const { return state_->params; }
const std::string& GradReducer::bucket_name(size_t bucket) const {
  TRIDENT_CHECK(bucket < state_->bucket_names.size(), "bucket {} of {}", bucket,
                state_->bucket_names.size());
  return state_->bucket_names[bucket];
}

}  // namespace trident
