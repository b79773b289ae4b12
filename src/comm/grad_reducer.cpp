// GradReducer: bucketed data-parallel gradient averaging on a communication thread.
//
// The communication thread's contract (who calls MPI, in what order, why a thread, how
// progress is driven, how errors travel) is in trident/grad_reducer.h.
#include "trident/grad_reducer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include <time.h>

#include "comm/host_pages.h"
#include "trident/check.h"

namespace trident {

namespace {

enum class EventKind { kBegin, kReady, kExtra, kFinish, kGather };

struct Event {
  explicit Event(EventKind k) : kind(k), time(CommClock::now()) {}
  EventKind kind;
  CommClock::time_point time;  // when the compute thread posted it
  size_t param = 0;            // kReady
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

constexpr std::chrono::microseconds kPollBesideCompute{200};  // Note [Polling beside compute]

// CPU time the calling thread has used, in ms (its own clock, not the wall).
double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) * 1e3 + double(t.tv_nsec) * 1e-6;
}

// Union of [start, end] intervals, in ms.
double union_ms(std::vector<std::pair<double, double>> intervals) {
  std::sort(intervals.begin(), intervals.end());
  double total = 0, open_start = 0, open_end = 0;
  bool open = false;
  for (auto [s, e] : intervals) {
    if (open && s <= open_end) {
      open_end = std::max(open_end, e);
      continue;
    }
    if (open) total += open_end - open_start;
    open = true;
    open_start = s;
    open_end = e;
  }
  if (open) total += open_end - open_start;
  return total;
}

}  // namespace

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
  ReduceOp reduce_op;  // kAvg, or kSum of gradients divided by dp already
  CommClock::time_point origin;
  // Note [ZeRO-1]: with shard_grads, bucket b is reduce-scattered into
  // shard_grads + shard_offset[b] (shard_count[b] elements) and all-gathered after the update.
  float* shard_grads = nullptr;
  std::vector<size_t> shard_count, shard_offset;
  size_t shard_total = 0;
  std::vector<size_t> gather_order;
  bool release_reduced = false;  // ZeRO-2 on the host
  bool accumulate_shards = false;  // this round adds to the shard (begin_step's accumulate)
  size_t grads_total = 0;        // elements of the flat gradient buffer
  std::vector<unsigned char> page_scratch;  // resident_bytes's, this thread's

  // Compute thread only.
  bool step_open = false;
  bool step_reduces = false;
  std::vector<char> marked;
  std::vector<size_t> unmarked;  // per bucket: its parameters not yet marked ready this step
  double held_wait_ms = 0;       // Note [Bounded gradient memory]
  ReduceStats finished_stats;
  double gather_wait_ms = 0;  // waiting in wait_gathered since the last take_gather_stats

  // Shared, under `mutex`.
  std::mutex mutex;
  std::condition_variable wake_thread;
  std::condition_variable step_done_cv;
  std::deque<Event> events;
  bool shutdown = false;
  bool step_done = false;
  std::exception_ptr error;
  ReduceStats published_stats;
  std::atomic<bool> failed{false};  // error != nullptr, readable without the lock
  std::condition_variable gather_cv;  // a bucket was gathered, or the thread failed
  std::vector<char> gathered;         // per bucket: its parameters are complete here
  GatherStats published_gather;       // the last completed round, until taken
  std::atomic<bool> compute_waiting{false};  // the compute thread waits for a gather
  // Note [Bounded gradient memory]: bytes of complete buckets not yet released; the compute
  // thread adds, the thread subtracts on release (and clears on failure), under `mutex`.
  size_t max_held_bytes = 0;
  size_t held_bytes = 0;
  std::condition_variable released_cv;

  // Communication thread only.
  struct InFlight {
    Work work;
    size_t record;          // index into building.records (gathers: gather_building.records)
    int gather_bucket = -1;  // >= 0: the all-gather of this bucket's parameters
  };
  bool active = false;     // a reducing step is running and has not ended
  bool finishing = false;  // finish() was called
  CommClock::time_point finish_time;
  std::vector<size_t> pending;
  std::vector<char> seen;
  std::vector<double> ready_ms;
  std::vector<std::shared_ptr<const ComputeMark>> ready_mark;  // of the bucket's last ready param
  size_t next_bucket = 0;
  std::vector<ExtraBuffer> extras;
  size_t next_extra = 0;
  std::vector<InFlight> in_flight;
  ReduceStats building;
  double step_cpu_start_ms = 0;  // this thread's CPU clock at the step's begin event
  bool gathering = false;        // a parameter all-gather round is in flight
  size_t gathers_left = 0;
  GatherStats gather_building;

  std::thread thread;

  State(Communicator& dp_, float* grads_, std::vector<GradParam> params_, bool overlap_,
        size_t max_message_, ReduceOp reduce_op_, CommClock::time_point origin_)
      : dp(dp_), grads(grads_), params(std::move(params_)), overlap(overlap_),
        max_message(max_message_), reduce_op(reduce_op_), origin(origin_) {}

  double ms(CommClock::time_point t) const {
    return std::chrono::duration<double, std::milli>(t - origin).count();
  }

  void post(Event event) {
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

  // ---- the communication thread ----

  void run() {
    std::vector<Event> batch;
    int idle_polls = 0;
    for (;;) {
      CommClock::time_point poll_at = CommClock::time_point::max();
      if (!in_flight.empty()) {
        poll_at = next_poll(idle_polls);
        if (poll_at == CommClock::time_point::min()) std::this_thread::yield();
      }
      {
        std::unique_lock lock(mutex);
        auto news = [&] { return shutdown || !events.empty(); };
        if (in_flight.empty()) wake_thread.wait(lock, news);
        else if (poll_at != CommClock::time_point::min()) wake_thread.wait_until(lock, poll_at, news);
        if (shutdown) return;  // anything in flight is abandoned (see ~GradReducer)
        batch.assign(std::make_move_iterator(events.begin()), std::make_move_iterator(events.end()));
        events.clear();
      }
      try {
        for (Event& e : batch) handle(e);
        batch.clear();
        if (active || gathering) {
          // A newly started all-reduce needs prompt tests for its first rounds: reset the backoff.
          const bool launched = active && launch_ready();
          const bool completed = poll_in_flight();
          idle_polls = launched || completed ? 0 : idle_polls + 1;
          if (active) end_step_if_done();
        }
      } catch (...) {
        batch.clear();
        fail_step(std::current_exception());
      }
    }
  }

  // When to test the in-flight work again: min() = right away (after a yield).
  CommClock::time_point next_poll(int idle_polls) const {
    const auto now = CommClock::now();
    auto idle_until = CommClock::time_point::max();
    for (const InFlight& f : in_flight) idle_until = std::min(idle_until, f.work.idle_until());
    if (idle_until > now) return idle_until;  // only emulated links left: sleep to the first end
    // Note [Polling beside compute]: before finish() the compute thread is running backward on
    // the same cores, and every wake-up of this thread preempts it; so it tests every 200 µs at
    // most (a 16 MiB piece takes >= 1.3 ms even at 100 Gbit/s, so this delays a completion by
    // a small fraction of it). Once finish() was called the compute thread sleeps, and eager
    // polling costs it nothing.
    if (!finishing && !compute_waiting.load(std::memory_order_relaxed))
      return now + kPollBesideCompute;
    const auto pause = progress_backoff(idle_polls);
    return pause.count() == 0 ? CommClock::time_point::min() : now + pause;
  }

  void handle(Event& e) {
    if (e.kind == EventKind::kBegin) {
      active = true;
      accumulate_shards = e.param != 0;
      finishing = false;
      pending.assign(buckets.size(), 0);
      for (size_t b = 0; b < buckets.size(); ++b) pending[b] = buckets[b].num_params;
      seen.assign(params.size(), 0);
      ready_ms.assign(buckets.size(), 0);
      ready_mark.assign(buckets.size(), nullptr);
      next_bucket = 0;
      extras.clear();
      next_extra = 0;
      in_flight.clear();
      building = ReduceStats{};
      building.reduced = true;
      step_cpu_start_ms = thread_cpu_ms();
      return;
    }
    if (e.kind == EventKind::kGather) {
      start_gathers(e.data, e.mark.get());
      return;
    }
    if (!active) return;  // leftovers of a step that already failed
    switch (e.kind) {
      case EventKind::kReady: {
        seen[e.param] = 1;
        const size_t b = bucket_of_param[e.param];
        TRIDENT_CHECK(pending[b] > 0, "bucket {} counted more ready parameters than it has", b);
        if (--pending[b] == 0) {
          // Events arrive in the order grad_ready was called, which is the compute stream's
          // order, so this last mark covers every earlier parameter of the bucket.
          ready_ms[b] = ms(e.time);
          ready_mark[b] = std::move(e.mark);
        }
        break;
      }
      case EventKind::kExtra:
        extras.push_back({e.data, e.count, std::move(e.name), ms(e.time), std::move(e.mark)});
        break;
      case EventKind::kFinish:
        finishing = true;
        finish_time = e.time;
        break;
      case EventKind::kBegin:
      case EventKind::kGather: break;
    }
  }

  // Note [Gathers before use]: every bucket's all-gather, in forward order, all in flight at
  // once (MPI pairs them by start order, identical on every rank).
  // `after`: the compute stream's mark taken after the optimizer was enqueued (null on the host):
  // on a device the communication stream waits for it, so the gathers send updated shards.
  void start_gathers(float* params, const ComputeMark* after) {
    dp.order_after(after);
    gather_building = GatherStats{};
    gathering = true;
    gathers_left = gather_order.size();
    const auto r = size_t(dp.rank());
    for (size_t b : gather_order) {
      BucketRecord rec;
      rec.name = bucket_names[b];
      rec.bucket = static_cast<int>(b);
      rec.bytes = buckets[b].count * sizeof(float);
      rec.start_ms = ms(CommClock::now());
      rec.ready_ms = rec.start_ms;
      float* bucket = params + buckets[b].offset;
      in_flight.push_back({dp.all_gather(bucket + r * shard_count[b], bucket, shard_count[b]),
                           gather_building.records.size(), static_cast<int>(b)});
      gather_building.records.push_back(std::move(rec));
    }
    if (gathers_left == 0) end_gather_round(SIZE_MAX);
  }

  // The round's figures are published before its last bucket is marked gathered, so a compute
  // thread that saw every bucket gathered also finds them.
  void end_gather_round(size_t last_bucket) {
    std::vector<std::pair<double, double>> busy;
    for (const BucketRecord& r : gather_building.records) {
      busy.emplace_back(r.start_ms, r.end_ms);
      gather_building.bytes += r.bytes;
    }
    gather_building.comm_ms = union_ms(std::move(busy));
    gather_building.gathered = true;
    gathering = false;
    std::lock_guard lock(mutex);
    published_gather = std::move(gather_building);
    if (last_bucket < gathered.size()) gathered[last_bucket] = 1;
  }

  // Note [ZeRO-2 on the host]: the bucket's reduce-scatter no longer reads its slice.
  void release_bucket(size_t b) {
    building.grad_resident_peak_bytes =
        std::max(building.grad_resident_peak_bytes,
                 resident_bytes(grads, grads_total * sizeof(float), page_scratch));
    release_host_floats(grads + buckets[b].offset, buckets[b].count);
    if (max_held_bytes > 0) {
      {
        std::lock_guard lock(mutex);
        held_bytes -= std::min(held_bytes, buckets[b].count * sizeof(float));
      }
      released_cv.notify_all();
    }
  }

  size_t reduces_in_flight() const {
    return size_t(std::count_if(in_flight.begin(), in_flight.end(),
                                [](const InFlight& f) { return f.gather_bucket < 0; }));
  }

  void start(float* data, size_t count, std::string name, int bucket, double ready,
             const ComputeMark* mark) {
    BucketRecord r;
    r.name = std::move(name);
    r.bucket = bucket;
    r.bytes = count * sizeof(float);
    r.ready_ms = ready;
    r.start_ms = ms(CommClock::now());
    dp.order_after(mark);  // Note [Gradient-ready events]; nothing on a host communicator
    if (shard_grads && bucket >= 0) {
      // Note [ZeRO-1]: one reduce-scatter per bucket, not split (Note [Message size] would cut
      // the bucket into pieces whose shards are no longer one slice per rank).
      const auto b = size_t(bucket);
      if (accumulate_shards) {
        // Note [ZeRO-2 and accumulation] (train/zero.h): the shard's sum so far joins this
        // rank's own block of the bucket before the reduce-scatter (host memory: ZeRO-2).
        float* own = data + size_t(dp.rank()) * shard_count[b];
        const float* sum = shard_grads + shard_offset[b];
        for (size_t k = 0; k < shard_count[b]; ++k) own[k] += sum[k];
      }
      in_flight.push_back({dp.reduce_scatter(data, shard_grads + shard_offset[b], shard_count[b]),
                           building.records.size()});
      building.records.push_back(std::move(r));
      return;
    }
    // Note [Message size]: pieces of at most max_message floats, one record for all of them.
    size_t done = 0;
    do {
      const size_t n = std::min(count - done, max_message);
      in_flight.push_back({dp.all_reduce(data + done, n, reduce_op, r.name),
                           building.records.size()});
      done += n;
    } while (done < count);
    building.records.push_back(std::move(r));
  }

  // Starts every bucket (then extra) whose turn has come. True if it started any.
  bool launch_ready() {
    if (!overlap && !finishing) return false;
    const size_t launched_before = next_bucket + next_extra;
    while (next_bucket < buckets.size() && pending[next_bucket] == 0) {
      const Bucket& b = buckets[next_bucket];
      start(grads + b.offset, b.count, bucket_names[next_bucket], static_cast<int>(next_bucket),
            ready_ms[next_bucket], ready_mark[next_bucket].get());
      ready_mark[next_bucket] = nullptr;  // its event is no longer needed
      ++next_bucket;
    }
    if (next_bucket == buckets.size())
      for (; next_extra < extras.size(); ++next_extra) {
        ExtraBuffer& x = extras[next_extra];
        start(x.data, x.count, x.name, -1, x.added_ms, x.mark.get());
        x.mark = nullptr;
      }
    return next_bucket + next_extra > launched_before;
  }

  // Tests the in-flight work (a completed all-reduce is already averaged). True if any ended.
  // Note [One progress call per poll]: every test of an in-flight operation is an MPI_Test,
  // and every MPI_Test runs Open MPI's whole progress engine (all sockets, all of libnbc's
  // schedules), whatever request it names. Testing each of k operations in flight ran it k
  // times per wake-up (on 2 emulated nodes at 1 Gbit/s, with a dozen buckets queued behind the
  // slow link, 3500–3900 tests per step). One run of the engine advances them all, so the
  // thread tests in start order and stops at the first one still running: one progress call
  // per wake-up while the oldest is unfinished, one more per completion (970–1070 per step
  // there). The thread's CPU time stayed ~100–110 ms per step: it is the sockets' copying and
  // the kernel's TCP work, not the calls (docs/scaling.md). Operations on one communicator
  // finish about in start order (they share its links and libnbc advances them in turn), so
  // a later one that finished first is seen when those before it are: a delay in its stats and its ZeRO-2 release, never a missed
  // completion; the timeout is checked on the oldest, which has waited longest. An operation
  // whose transfer is done and that waits only for its emulated link does not stop the walk:
  // stopping there left the later ones untested, so the thread saw no link end to sleep to
  // and polled through the whole step (bench-overlap: 260 ms of its CPU per step, not 130).
  bool poll_in_flight() {
    bool any = false;
    for (size_t i = 0; i < in_flight.size();) {
      InFlight& f = in_flight[i];
      bool done = false;
      try {
        ++building.progress_polls;
        done = f.work.test();
      } catch (const Error& e) {
        const BucketRecord& r = f.gather_bucket >= 0 ? gather_building.records[f.record]
                                                     : building.records[f.record];
        throw Error(fmt::format("GradReducer: {} ({} bytes) on dp rank {} of {}: {}", r.name,
                                r.bytes, dp.rank(), dp.size(), e.what()),
                    e.code());
      }
      if (!done) {
        // Note [One progress call per poll]: stop at the first whose transfer is unfinished. One
        // whose bytes have arrived and that only waits out an emulated link (idle_until) needs
        // no progress: go on, so the later ones' transfers are seen to end too and the thread
        // can sleep to the first link's end (next_poll) instead of polling.
        if (f.work.idle_until() == CommClock::time_point::min()) break;
        ++i;
        continue;
      }
      any = true;
      if (f.gather_bucket >= 0) {
        gather_building.records[f.record].end_ms = ms(CommClock::now());
        const auto b = size_t(f.gather_bucket);
        in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(i));
        if (--gathers_left == 0) {
          end_gather_round(b);  // published with the last bucket's flag, under one lock
        } else {
          std::lock_guard lock(mutex);
          gathered[b] = 1;
        }
        gather_cv.notify_all();
        continue;
      }
      // Of a record's pieces, the last to complete sets its end.
      building.records[f.record].end_ms = ms(CommClock::now());
      const int bucket = building.records[f.record].bucket;
      in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(i));
      if (release_reduced && bucket >= 0) release_bucket(size_t(bucket));
    }
    return any;
  }

  void end_step_if_done() {
    if (!finishing) return;
    if (next_bucket < buckets.size()) {
      // Every event up to finish() was handled, so this bucket can no longer become ready.
      // Wait for the buckets already started (every rank started the same ones), then fail.
      if (reduces_in_flight() == 0) throw_never_ready();
      return;
    }
    if (next_extra < extras.size() || reduces_in_flight() > 0) return;

    std::vector<std::pair<double, double>> busy;
    double last_end = ms(finish_time);
    for (const BucketRecord& r : building.records) {
      busy.emplace_back(r.start_ms, r.end_ms);
      building.bytes += r.bytes;
      last_end = std::max(last_end, r.end_ms);
    }
    building.comm_ms = union_ms(std::move(busy));
    building.finish_called_ms = ms(finish_time);
    building.exposed_comm_ms = last_end - building.finish_called_ms;
    building.thread_cpu_ms = thread_cpu_ms() - step_cpu_start_ms;
    active = false;
    finishing = false;
    {
      std::lock_guard lock(mutex);
      published_stats = std::move(building);
      step_done = true;
    }
    step_done_cv.notify_all();
  }

  [[noreturn]] void throw_never_ready() {
    std::vector<std::string> missing;
    size_t first = params.size();
    for (size_t i = 0; i < params.size(); ++i) {
      if (seen[i]) continue;
      if (first == params.size()) first = i;
      if (missing.size() < 8) missing.push_back(fmt::format("'{}'", params[i].name));
    }
    const size_t num_missing =
        static_cast<size_t>(std::count(seen.begin(), seen.end(), char{0}));
    TRIDENT_CHECK(first < params.size(), "bucket {} pending but every parameter was ready",
                  next_bucket);
    internal_error(
        __FILE__, __LINE__,
        fmt::format("GradReducer: parameter '{}' (ready index {}) never became ready in this "
                    "step, so {} of {} could not be reduced (dp rank {} of {}); {} parameter(s) "
                    "missing: {}{}",
                    params[first].name, first, bucket_names[bucket_of_param[first]],
                    buckets.size(), dp.rank(), dp.size(), num_missing,
                    fmt::join(missing, ", "), num_missing > missing.size() ? ", ..." : ""));
  }

  void fail_step(std::exception_ptr e) {
    active = false;
    gathering = false;
    in_flight.clear();  // abandoned: an MPI collective cannot be cancelled
    {
      std::lock_guard lock(mutex);
      if (!error) error = e;
      failed.store(true, std::memory_order_release);
      step_done = true;
    }
    step_done_cv.notify_all();
    gather_cv.notify_all();
    released_cv.notify_all();
  }
};

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
  return *this;
}

// ---- the compute thread's side ----

GradReducer::GradReducer(Communicator& dp, float* grads,
                         std::vector<GradParam> params_in_ready_order,
                         GradReducerOptions options)
    : state_(std::make_unique<State>(
          dp, grads, std::move(params_in_ready_order), options.overlap,
          std::max<size_t>(1, options.max_message_bytes / sizeof(float)),
          options.average ? ReduceOp::kAvg : ReduceOp::kSum,
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
    internal_error(__FILE__, __LINE__,
                   fmt::format("GradReducer: parameters must be contiguous in the gradient "
                               "buffer in ready order; '{}' [{}, +{}) is followed by '{}' [{}, +{})",
                               p[i].name, p[i].offset, p[i].count, p[i + 1].name,
                               p[i + 1].offset, p[i + 1].count));
  }
  TRIDENT_CHECK(grads != nullptr || total == 0, "GradReducer: null gradient buffer");

  std::vector<size_t> counts;
  for (const GradParam& q : p) counts.push_back(q.count);
  s.buckets = assign_buckets(counts, sizeof(float), options.first_bucket_bytes,
                             options.bucket_bytes);
  for (Bucket& bucket : s.buckets) {
    const size_t first = bucket.first_param, last = first + bucket.num_params - 1;
    bucket.offset = descending && !ascending ? p[last].offset : p[first].offset;
  }
  name_buckets();
  s.marked.assign(p.size(), 0);
  s.thread = std::thread([&s] { s.run(); });
}

void GradReducer::name_buckets() {
  State& s = *state_;
  const auto& p = s.params;
  s.bucket_of_param.resize(p.size());
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    const Bucket& bucket = s.buckets[b];
    const size_t first = bucket.first_param, last = first + bucket.num_params - 1;
    for (size_t i = first; i <= last; ++i) s.bucket_of_param[i] = b;
    s.bucket_names.push_back(first == last ? fmt::format("bucket {} ({})", b, p[first].name)
                                           : fmt::format("bucket {} ({} .. {})", b,
                                                         p[first].name, p[last].name));
  }
  s.gathered.assign(s.buckets.size(), 1);
}

// Note [ZeRO-1]: the buckets of the padded layout; the parameters must already sit there.
void GradReducer::init_sharded(const GradReducerOptions& options) {
  State& s = *state_;
  const auto& p = s.params;
  TRIDENT_CHECK(s.reduce_op == ReduceOp::kSum,
                "GradReducer: a sharded reducer sums (the gradients are divided by dp already)");
  std::vector<size_t> counts;
  for (const GradParam& q : p) counts.push_back(q.count);
  const auto ranks = size_t(s.dp.size());
  const BucketLayout layout = padded_bucket_layout(counts, sizeof(float), options.first_bucket_bytes,
                                                   options.bucket_bytes, ranks, options.alone);
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i].offset != layout.param_offsets[i])
      internal_error(__FILE__, __LINE__,
                     fmt::format("GradReducer: parameter '{}' is at offset {}, but the padded "
                                 "bucket layout puts it at {} (Note [Padded buckets])",
                                 p[i].name, p[i].offset, layout.param_offsets[i]));
  s.buckets = layout.buckets;
  s.shard_grads = options.shard_grads;
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
    s.shard_count.push_back(layout.shard_count(b, ranks));
    s.shard_total += s.shard_count.back();
  }
  s.gather_order = options.gather_order;
  if (s.gather_order.empty())
    for (size_t b = s.buckets.size(); b-- > 0;) s.gather_order.push_back(b);
  std::vector<char> listed(s.buckets.size(), 0);
  for (size_t b : s.gather_order) {
    TRIDENT_CHECK(b < listed.size() && !listed[b], "GradReducer: gather order lists bucket {} "
                  "twice or out of range ({} buckets)", b, listed.size());
    listed[b] = 1;
  }
  TRIDENT_CHECK(s.gather_order.size() == s.buckets.size(),
                "GradReducer: gather order has {} of {} buckets", s.gather_order.size(),
                s.buckets.size());
  name_buckets();
  s.marked.assign(p.size(), 0);
  s.thread = std::thread([&s] { s.run(); });
}

GradReducer::~GradReducer() {
  {
    std::lock_guard lock(state_->mutex);
    state_->shutdown = true;
  }
  state_->wake_thread.notify_one();
  state_->thread.join();
}

void GradReducer::begin_step(bool reduce, bool accumulate_shards) {
  State& s = *state_;
  TRIDENT_CHECK(!(s.step_open && s.step_reduces) || s.failed.load(std::memory_order_acquire),
                "GradReducer::begin_step({}) while a reducing step is open: call finish() first",
                reduce);
  s.step_open = true;
  s.step_reduces = reduce;
  if (!reduce) return;
  if (s.shard_grads) wait_all_gathered();  // the thread is done with the last round
  std::fill(s.marked.begin(), s.marked.end(), 0);
  s.unmarked.resize(s.buckets.size());
  for (size_t b = 0; b < s.buckets.size(); ++b) s.unmarked[b] = s.buckets[b].num_params;
  s.held_wait_ms = 0;
  {
    std::lock_guard lock(s.mutex);
    s.held_bytes = 0;  // every bucket of the last step was released (or the step failed)
    s.error = nullptr;
    s.failed.store(false, std::memory_order_release);
    s.step_done = false;
    TRIDENT_CHECK(!accumulate_shards || (s.shard_grads && s.release_reduced),
                  "GradReducer: accumulating into the shards needs ZeRO-2 on the host");
    Event e(EventKind::kBegin);
    e.param = accumulate_shards ? 1 : 0;
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
  TRIDENT_CHECK(!s.marked[i], "GradReducer: parameter '{}' (ready index {}) marked ready twice "
                "in one step", s.params[i].name, i);
  s.marked[i] = 1;
  Event e(EventKind::kReady);
  e.param = i;
  e.mark = s.dp.mark_compute_ready();  // after the gradient's kernels were enqueued
  const size_t b = s.bucket_of_param[i];
  const bool completes = --s.unmarked[b] == 0;
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
  e.mark = s.dp.mark_compute_ready();
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
  s.post(Event(EventKind::kFinish));
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
    e.mark = s.dp.mark_compute_ready();  // after the optimizer's kernels (device communicators)
    s.events.push_back(std::move(e));
  }
  s.wake_thread.notify_one();
}

void GradReducer::wait_gathered(size_t bucket) {
  State& s = *state_;
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

GatherStats GradReducer::take_gather_stats() {
  State& s = *state_;
  GatherStats out;
  {
    std::lock_guard lock(s.mutex);
    out = std::move(s.published_gather);
    s.published_gather = GatherStats{};
  }
  out.exposed_ms = s.gather_wait_ms;
  s.gather_wait_ms = 0;
  return out;
}

bool GradReducer::sharded() const { return state_->shard_grads != nullptr; }
size_t GradReducer::shard_count(size_t b) const { return state_->shard_count.at(b); }
size_t GradReducer::shard_offset(size_t b) const { return state_->shard_offset.at(b); }
size_t GradReducer::shard_total() const { return state_->shard_total; }
size_t GradReducer::bucket_of_param(size_t param) const { return state_->bucket_of_param.at(param); }

const ReduceStats& GradReducer::stats() const { return state_->finished_stats; }
const std::vector<Bucket>& GradReducer::buckets() const { return state_->buckets; }
const std::vector<GradParam>& GradReducer::params() const { return state_->params; }
const std::string& GradReducer::bucket_name(size_t bucket) const {
  TRIDENT_CHECK(bucket < state_->bucket_names.size(), "bucket {} of {}", bucket,
                state_->bucket_names.size());
  return state_->bucket_names[bucket];
}

}  // namespace trident
