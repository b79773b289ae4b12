// GradReducer's communication thread: the loop that turns the compute thread's events into
// bucketed all-reduces (or ZeRO's reduce-scatters and all-gathers) and drives their progress.
// The contract it keeps is stated at the top of grad_reducer.cpp; the state it shares with the
// compute thread is in grad_reducer_state.h.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "comm/grad_reducer_state.h"
#include "comm/host_pages.h"
#include "trident/check.h"

namespace trident {

namespace {

constexpr std::chrono::microseconds kPollBesideCompute{200};  // Note [Polling beside compute]

}  // namespace

namespace reducer {

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

}  // namespace reducer

using reducer::Event;
using reducer::EventKind;
using reducer::ExtraBuffer;
using reducer::thread_cpu_ms;
using reducer::union_ms;

void GradReducer::State::run() {
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
CommClock::time_point GradReducer::State::next_poll(int idle_polls) const {
  const auto now = CommClock::now();
  auto idle_until = CommClock::time_point::max();
  for (const InFlight& f : in_flight) idle_until = std::min(idle_until, f.work.idle_until());
  if (idle_until > now) return idle_until;  // only emulated links left: sleep to the first end
  // Note [Polling beside compute]
  // Before finish() the thread tests at most every kPollBesideCompute: backward runs on the
  // same cores and every wake-up preempts it, while a message piece takes far longer than the
  // pause (16 MiB needs 1.3 ms even at 100 Gbit/s). After finish() the compute thread sleeps,
  // so the thread polls eagerly (progress_backoff).
  if (!finishing && !compute_waiting.load(std::memory_order_relaxed))
    return now + kPollBesideCompute;
  const auto pause = progress_backoff(idle_polls);
  return pause.count() == 0 ? CommClock::time_point::min() : now + pause;
}

void GradReducer::State::handle(Event& e) {
  if (e.kind == EventKind::kBegin) {
    active = true;
    accumulate_shards = (e.param & 1) != 0;
    replicate_shards = (e.param & 2) == 0;
    finishing = false;
    pending.assign(buckets.size(), 0);
    for (size_t b = 0; b < buckets.size(); ++b) pending[b] = buckets[b].num_params;
    seen.assign(params.size(), 0);
    ready_ms.assign(buckets.size(), 0);
    ready_mark.assign(buckets.size(), nullptr);
    next_bucket = 0;
    first_incomplete = 0;
    extras.clear();
    next_extra = 0;
    // ZeRO-3's gathers in flight go on (Note [ZeRO-3 units] in train/zero3.h).
    std::erase_if(in_flight, [](const InFlight& f) { return f.gather_bucket < 0; });
    building = ReduceStats{};
    building.reduced = true;
    hop1_left.clear();
    hop2.clear();
    next_hop2 = 0;
    step_origin = std::move(e.mark);
    backward_end = nullptr;
    step_cpu_start_ms = thread_cpu_ms();
    return;
  }
  if (e.kind == EventKind::kGather) {
    start_gathers(e.data, e.mark.get());
    return;
  }
  if (e.kind == EventKind::kUnitGather) {
    start_unit_gathers(e.param, e.count, e.name, e.data, e.mark.get());
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
        // Note [Ready order check]
        // Buckets start in index order (Note [Same buckets, same order]), so a bucket that is
        // complete while an earlier one is not waits for it. The parameter layout should make
        // that impossible (parameters in the order backward finishes them); where it happens,
        // the step names the bucket that held the others back and the Trainer warns once.
        if (b > first_incomplete && building.ahead_bucket < 0)
          building.ahead_bucket = int(b), building.late_bucket = int(first_incomplete);
        while (first_incomplete < buckets.size() && pending[first_incomplete] == 0)
          ++first_incomplete;
      }
      break;
    }
    case EventKind::kExtra:
      extras.push_back({e.data, e.count, std::move(e.name), ms(e.time), std::move(e.mark)});
      break;
    case EventKind::kFinish:
      finishing = true;
      finish_time = e.time;
      backward_end = std::move(e.mark);
      break;
    case EventKind::kBegin:
    case EventKind::kGather:
    case EventKind::kUnitGather: break;
  }
}

// Note [Gathers before use]: every bucket's all-gather, in forward order, all in flight at
// once (MPI pairs them by start order, identical on every rank).
// `after`: the compute stream's mark taken after the optimizer was enqueued (null on the host):
// on a device the communication stream waits for it, so the gathers send updated shards.
void GradReducer::State::start_gathers(float* params, const ComputeMark* after) {
  dp.order_after(after);
  gather_building = GatherStats{};
  gathering = true;
  gathers_left = gather_order.size();
  for (size_t b : gather_order) {
    float* bucket = params + buckets[b].offset;
    Communicator& comm = comm_of(b);
    const auto r = size_t(comm.rank());
    push_gather(b, comm.all_gather(bucket + r * shard_count[b], bucket, shard_count[b]),
                bucket_names[b]);
  }
  if (gathers_left == 0) end_gather_round(SIZE_MAX);
}

// Bucket b's all-gather, started as `work`: in flight, with its record in the round.
void GradReducer::State::push_gather(size_t b, Work work, std::string name, size_t elem_bytes) {
  BucketRecord rec;
  rec.name = std::move(name);
  rec.bucket = static_cast<int>(b);
  rec.bytes = buckets[b].count * elem_bytes;
  rec.start_ms = ms(CommClock::now());
  rec.ready_ms = rec.start_ms;
  in_flight.push_back({std::move(work), gather_building.records.size(), static_cast<int>(b)});
  gather_building.records.push_back(std::move(rec));
}

// Note [ZeRO-3 units] (train/zero3.h): one unit's buckets, from the shards into the full
// buffer, in the order the compute thread asked (its program order, the same on every rank).
// A round is open while any gather is in flight; units asked for meanwhile join it.
// `base`: where the unit goes (bucket b at base + its offset); `after`: on a device, the compute
// stream's mark when it was asked for: the shards are updated and the slot's last reader done.
void GradReducer::State::start_unit_gathers(size_t first, size_t end, const std::string& unit,
                                            float* base, const ComputeMark* after) {
  gather_comm->order_after(after);
  if (expert_gather_comm) expert_gather_comm->order_after(after);
  if (!gathering) gather_building = GatherStats{};
  gathering = true;
  for (size_t b = first; b < end; ++b) {
    std::string name = fmt::format("unit {}: {}", unit, bucket_names[b]);
    if (!gather_bf16.empty() && gather_bf16[b]) {  // Note [bf16 unit gathers]
      push_gather(b,
                  gathers_on(b).all_gather(shard_params16 + shard_offset[b],
                                           reinterpret_cast<bfloat16*>(base + buckets[b].offset),
                                           shard_count[b]),
                  std::move(name), sizeof(bfloat16));
    } else {
      push_gather(b,
                  gathers_on(b).all_gather(shard_params + shard_offset[b], base + buckets[b].offset,
                                           shard_count[b]),
                  std::move(name));
    }
    ++gathers_left;
  }
}

// The round's records join those not yet taken (take_gather_stats sums them up) before its
// last bucket is marked gathered, so a compute thread that saw every bucket gathered also finds
// them.
void GradReducer::State::end_gather_round(size_t last_bucket) {
  gather_building.gathered = true;
  gathering = false;
  std::lock_guard lock(mutex);
  published_gather.gathered = true;
  for (BucketRecord& r : gather_building.records) published_gather.records.push_back(std::move(r));
  gather_building = GatherStats{};
  if (last_bucket < gathered.size()) gathered[last_bucket] = 1;
}

// Note [ZeRO-2 on the host]: the bucket's reduce-scatter no longer reads its slice.
void GradReducer::State::release_bucket(size_t b) {
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

size_t GradReducer::State::reduces_in_flight() const {
  return size_t(std::count_if(in_flight.begin(), in_flight.end(),
                              [](const InFlight& f) { return f.gather_bucket < 0; }));
}

void GradReducer::State::start(float* data, size_t count, std::string name, int bucket,
                               double ready, const ComputeMark* mark) {
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
    Communicator& comm = comm_of(b);
    if (accumulate_shards && !add_shard) {
      // Note [ZeRO-2 and accumulation] (train/zero.h): the shard's sum so far joins this
      // rank's own block of the bucket before the reduce-scatter (host memory: ZeRO-2; on a
      // device the compute stream did it, Note [Shard sums on a device]).
      float* own = data + size_t(comm.rank()) * shard_count[b];
      const float* sum = shard_grads + shard_offset[b];
      for (size_t k = 0; k < shard_count[b]; ++k) own[k] += sum[k];
    }
    in_flight.push_back({comm.reduce_scatter(data, shard_grads + shard_offset[b], shard_count[b]),
                         building.records.size()});
    if (replicate) {  // an earlier round's shard waits for the last (count 0: no second hop)
      hop1_left.push_back(1);
      hop2.emplace_back(shard_grads + shard_offset[b], replicate_shards ? shard_count[b] : 0);
    }
    building.records.push_back(std::move(r));
    return;
  }
  // Note [Message size]
  // An all-reduce is started in pieces of at most max_message floats, one record for all. MPI's
  // nonblocking all-reduce allocates a temporary buffer per call in proportion to the message;
  // kept under glibc's mmap threshold it comes from the heap and is reused, where a larger one
  // is a fresh mmap whose pages all fault, on the compute cores' time. Every rank splits the
  // same way, so the pieces pair up (Note [Same buckets, same order]).
  size_t done = 0, pieces = 0;
  Communicator& comm = bucket >= 0 ? comm_of(size_t(bucket)) : dp;
  do {
    const size_t n = std::min(count - done, max_message);
    in_flight.push_back(
        {comm.all_reduce(data + done, n, ReduceOp::kSum, r.name), building.records.size()});
    done += n;
    ++pieces;
  } while (done < count);
  if (replicate) {
    hop1_left.push_back(pieces);
    hop2.emplace_back(data, count);
  }
  building.records.push_back(std::move(r));
}

// Note [HSDP] (train/data_parallel.h): a record's sum over the shard group is complete, so its
// sum over the replicas may start; in record order, the same on every rank of the replicas.
void GradReducer::State::launch_second_hops() {
  while (next_hop2 < hop2.size() && hop1_left[next_hop2] == 0) {
    auto [data, count] = hop2[next_hop2];
    for (size_t done = 0; done < count;) {
      const size_t n = std::min(count - done, max_message);
      InFlight f{
          replicate->all_reduce(data + done, n, ReduceOp::kSum, building.records[next_hop2].name),
          next_hop2};
      f.second_hop = true;
      in_flight.push_back(std::move(f));
      done += n;
    }
    ++next_hop2;
  }
}

// Starts every bucket (then extra) whose turn has come. True if it started any.
bool GradReducer::State::launch_ready() {
  if (!overlap && !finishing) return false;
  const size_t launched_before = next_bucket + next_extra;
  while (next_bucket < buckets.size() && pending[next_bucket] == 0) {
    const Bucket& b = buckets[next_bucket];
    start(bucket_grads[next_bucket], b.count, bucket_names[next_bucket], int(next_bucket),
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

// Tests the in-flight work. True if any ended.
//
// Note [One progress call per poll]
// Every MPI_Test runs Open MPI's whole progress engine, whatever request it names. So a poll
// tests in start order and, per communicator, stops at the first operation still transferring:
// one communicator's operations finish about in start order, and its timeout is checked on the
// oldest. Per communicator, because the order of starts across them differs between ranks
// (ZeRO-3's gathers, HSDP's second hop) and a paced operation is posted only when tested: a
// rank stopped behind another communicator's operation would never post the one its peer waits
// for. One that only waits out its emulated link does not stop the walk.
bool GradReducer::State::poll_in_flight() {
  bool any = false;
  const Communicator* stopped[4] = {};  // dp, the gathers' (dense, experts'), the replicas'
  size_t num_stopped = 0;
  auto comm_of = [&](const InFlight& f) -> const Communicator* {
    if (f.second_hop) return replicate;
    if (f.gather_bucket >= 0 && shard_params) return &gathers_on(size_t(f.gather_bucket));
    return &dp;
  };
  for (size_t i = 0; i < in_flight.size();) {
    InFlight& f = in_flight[i];
    const Communicator* comm = comm_of(f);
    if (std::find(stopped, stopped + num_stopped, comm) != stopped + num_stopped) {
      ++i;
      continue;
    }
    bool done = false;
    try {
      ++building.progress_polls;
      done = f.work.test();
    } catch (const Error& e) {
      const BucketRecord& r =
          f.gather_bucket >= 0 ? gather_building.records[f.record] : building.records[f.record];
      throw Error(fmt::format("GradReducer: {} ({} bytes) on dp rank {} of {}: {}", r.name, r.bytes,
                              dp.rank(), dp.size(), e.what()),
                  e.code());
    }
    if (!done) {
      // Note [One progress call per poll]: stop at the first whose transfer is unfinished (on
      // its communicator); go on past one that only waits out an emulated link (idle_until).
      if (f.work.idle_until() == CommClock::time_point::min() && num_stopped < 4)
        stopped[num_stopped++] = comm;
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
    // Of a record's pieces, the last to complete sets its end (on the device: the first
    // piece's start, the last one's end).
    BucketRecord& rec = building.records[f.record];
    rec.end_ms = ms(CommClock::now());
    double d0 = 0, d1 = 0;
    if (step_origin && dp.device_span(f.work, *step_origin, &d0, &d1)) {
      rec.device_start_ms = rec.device_start_ms < 0 ? d0 : std::min(rec.device_start_ms, d0);
      rec.device_end_ms = std::max(rec.device_end_ms, d1);
    }
    const int bucket = building.records[f.record].bucket;
    const bool first_hop = !f.second_hop;
    const size_t record = f.record;
    in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(i));
    if (first_hop && release_reduced && bucket >= 0) release_bucket(size_t(bucket));
    if (first_hop && pooled_grads && bucket >= 0) {  // Note [Gradients in unit slots]
      {
        std::lock_guard lock(mutex);
        grads_pending[size_t(bucket)] = 0;
      }
      released_cv.notify_all();
    }
    if (first_hop && replicate) {
      --hop1_left[record];
      launch_second_hops();
    }
  }
  return any;
}

void GradReducer::State::end_step_if_done() {
  if (!finishing) return;
  if (next_bucket < buckets.size()) {
    // Every event up to finish() was handled, so this bucket can no longer become ready.
    // Wait for the buckets already started (every rank started the same ones), then fail.
    if (reduces_in_flight() == 0) throw_never_ready();
    return;
  }
  if (next_extra < extras.size() || reduces_in_flight() > 0) return;
  if (replicate && next_hop2 < hop2.size()) return;  // cannot happen: launched on completion

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
  time_on_device();
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

// Note [Device time of an operation]: with a timed origin and end of backward and a device
// span for every record, the step's comm_ms and exposed_comm_ms are the device's.
void GradReducer::State::time_on_device() {
  double backward_end_ms = 0;
  if (!step_origin || !backward_end ||
      !dp.mark_elapsed_ms(*step_origin, *backward_end, &backward_end_ms))
    return;
  std::vector<std::pair<double, double>> busy;
  double last_end = backward_end_ms;
  for (const BucketRecord& r : building.records) {
    if (r.device_start_ms < 0 || r.device_end_ms < 0) return;  // not all timed: keep host times
    busy.emplace_back(r.device_start_ms, r.device_end_ms);
    last_end = std::max(last_end, r.device_end_ms);
  }
  building.comm_ms = union_ms(std::move(busy));
  building.exposed_comm_ms = last_end - backward_end_ms;
  building.device_timed = true;
}

void GradReducer::State::throw_never_ready() {
  std::vector<std::string> missing;
  size_t first = params.size();
  for (size_t i = 0; i < params.size(); ++i) {
    if (seen[i]) continue;
    if (first == params.size()) first = i;
    if (missing.size() < 8) missing.push_back(fmt::format("'{}'", params[i].name));
  }
  const size_t num_missing = static_cast<size_t>(std::count(seen.begin(), seen.end(), char{0}));
  TRIDENT_CHECK(first < params.size(), "bucket {} pending but every parameter was ready",
                next_bucket);
  internal_error(
      __FILE__, __LINE__,
      fmt::format("GradReducer: parameter '{}' (ready index {}) never became ready in this "
                  "step, so {} of {} could not be reduced (dp rank {} of {}); {} parameter(s) "
                  "missing: {}{}",
                  params[first].name, first, bucket_names[bucket_of_param[first]], buckets.size(),
                  dp.rank(), dp.size(), num_missing, fmt::join(missing, ", "),
                  num_missing > missing.size() ? ", ..." : ""));
}

void GradReducer::State::fail_step(std::exception_ptr e) {
  active = false;
  gathering = false;
  gathers_left = 0;
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

}  // namespace trident
