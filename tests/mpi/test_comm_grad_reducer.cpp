// GradReducer under MPI: bucketed, overlapped summing equals one MPI_Allreduce of the whole
// buffer; the launch order is the bucket order; errors name what went wrong.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "trident/check.h"
#include "trident/grad_reducer.h"

namespace trident {
namespace {

std::unique_ptr<MpiComm> dp_comm(const char* name = "dp") {
  return MpiComm::duplicate(MPI_COMM_WORLD, name);
}

// Sizes of a small model in ready order, odd on purpose; ascending offsets.
std::vector<GradParam> make_params(bool descending = false) {
  const size_t counts[] = {1000, 3, 70000, 257, 4096, 1, 50000, 300000, 17, 2048, 999, 65536};
  std::vector<GradParam> params;
  size_t total = 0;
  for (size_t c : counts) total += c;
  size_t offset = descending ? total : 0;
  for (size_t i = 0; i < std::size(counts); ++i) {
    if (descending) offset -= counts[i];
    params.push_back({"p" + std::to_string(i), offset, counts[i]});
    if (!descending) offset += counts[i];
  }
  return params;
}

size_t total_count(const std::vector<GradParam>& params) {
  size_t n = 0;
  for (const auto& p : params) n += p.count;
  return n;
}

// Per-rank gradients. exact = multiples of 1/8 below 2^10: every sum is exact in fp32, so any
// reduction order gives the same bits and the reference can be compared bitwise.
std::vector<float> make_grads(size_t n, int rank, bool exact, unsigned seed = 1) {
  std::mt19937 rng(seed * 7919 + rank);
  std::vector<float> g(n);
  if (exact) {
    std::uniform_int_distribution<int> d(-8000, 8000);
    for (float& x : g) x = static_cast<float>(d(rng)) / 8.0f;
  } else {
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (float& x : g) x = d(rng);
  }
  return g;
}

std::vector<float> reference_sum(std::vector<float> g, const MpiComm& comm) {
  TRIDENT_MPI(MPI_Allreduce(MPI_IN_PLACE, g.data(), static_cast<int>(g.size()), MPI_FLOAT, MPI_SUM,
                            comm.raw()));
  return g;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Limits {
  const char* name;
  size_t first, rest;
};
const Limits kLimits[] = {{"one bucket", kOneBucket, kOneBucket},
                          {"one per parameter", kOneBucketPerParam, kOneBucketPerParam},
                          {"default", kDefaultFirstBucketBytes, kDefaultBucketBytes},
                          {"small", 4 << 10, 64 << 10}};

GradReducerOptions options(const Limits& l, bool overlap) {
  GradReducerOptions o;
  o.first_bucket_bytes = l.first;
  o.bucket_bytes = l.rest;
  o.overlap = overlap;
  return o;
}

void run_step(GradReducer& reducer, size_t num_params) {
  reducer.begin_step(true);
  for (size_t i = 0; i < num_params; ++i) reducer.grad_ready(static_cast<int>(i));
  reducer.finish();
}

TEST(GradReducer, EqualsOneAllReduceOfTheWholeBuffer) {
  auto comm = dp_comm();
  for (bool descending : {false, true}) {
    const auto params = make_params(descending);
    const auto initial = make_grads(total_count(params), comm->rank(), /*exact=*/true);
    const auto expected = reference_sum(initial, *comm);
    for (const Limits& l : kLimits)
      for (bool overlap : {true, false}) {
        SCOPED_TRACE(fmt::format("{}, overlap {}, descending {}", l.name, overlap, descending));
        auto grads = initial;
        GradReducer reducer(*comm, grads.data(), params, options(l, overlap));
        run_step(reducer, params.size());
        EXPECT_TRUE(bitwise_equal(grads, expected));
        const ReduceStats& s = reducer.stats();
        EXPECT_TRUE(s.reduced);
        EXPECT_EQ(s.records.size(), reducer.buckets().size());
        EXPECT_EQ(s.bytes, grads.size() * sizeof(float));
        EXPECT_GE(s.exposed_comm_ms, 0.0);
        EXPECT_GT(s.comm_ms, 0.0);
      }
  }
}

TEST(GradReducer, BucketsAreSlicesOfTheBuffer) {
  auto comm = dp_comm();
  auto params = make_params();
  std::vector<float> grads(total_count(params));
  GradReducer one(*comm, grads.data(), params, options(kLimits[0], true));
  ASSERT_EQ(one.buckets().size(), 1u);
  EXPECT_EQ(one.bucket_name(0), "bucket 0 (p0 .. p11)");
  GradReducer each(*comm, grads.data(), params, options(kLimits[1], true));
  ASSERT_EQ(each.buckets().size(), params.size());
  for (size_t b = 0; b < params.size(); ++b) {
    EXPECT_EQ(each.buckets()[b].offset, params[b].offset);
    EXPECT_EQ(each.buckets()[b].count, params[b].count);
  }
  EXPECT_EQ(each.bucket_name(7), "bucket 7 (p7)");
  // Descending: a bucket starts at its last parameter's offset.
  auto down = make_params(true);
  GradReducer rev(*comm, grads.data(), down, options(kLimits[0], true));
  EXPECT_EQ(rev.buckets()[0].offset, 0u);
  EXPECT_EQ(rev.buckets()[0].count, grads.size());
}

TEST(GradReducer, OverlapOnAndOffAreBitwiseIdentical) {
  auto comm = dp_comm();
  const auto params = make_params();
  const auto initial = make_grads(total_count(params), comm->rank(), /*exact=*/false, 3);
  for (const Limits& l : kLimits) {
    SCOPED_TRACE(l.name);
    auto on = initial, off = initial;
    GradReducer a(*comm, on.data(), params, options(l, true));
    run_step(a, params.size());
    GradReducer b(*comm, off.data(), params, options(l, false));
    run_step(b, params.size());
    EXPECT_TRUE(bitwise_equal(on, off));
    // And close to the whole-buffer all-reduce (bitwise too for two ranks: a + b is exact
    // in any order).
    const auto expected = reference_sum(initial, *comm);
    double worst = 0;
    for (size_t i = 0; i < on.size(); ++i)
      worst = std::max(worst, double(std::abs(on[i] - expected[i])));
    EXPECT_LT(worst, 1e-5);
  }
}

TEST(GradReducer, NoReduceStepLeavesGradientsAlone) {
  auto comm = dp_comm();
  const auto params = make_params();
  const auto initial = make_grads(total_count(params), comm->rank(), true);
  auto grads = initial;
  std::vector<float> extra(10, 1.0f + comm->rank());
  GradReducer reducer(*comm, grads.data(), params, options(kLimits[2], true));
  // Gradient accumulation: two micro-batches that do not reduce, then one that does.
  for (int micro = 0; micro < 2; ++micro) {
    reducer.begin_step(false);
    for (size_t i = 0; i < params.size(); ++i) reducer.grad_ready(static_cast<int>(i));
    reducer.add_extra(extra.data(), extra.size(), "extra");
    EXPECT_TRUE(bitwise_equal(grads, initial));
  }
  reducer.finish();
  EXPECT_TRUE(bitwise_equal(grads, initial));
  EXPECT_EQ(extra[0], 1.0f + comm->rank());
  EXPECT_FALSE(reducer.stats().reduced);
  EXPECT_TRUE(reducer.stats().records.empty());
  run_step(reducer, params.size());
  EXPECT_TRUE(bitwise_equal(grads, reference_sum(initial, *comm)));
}

TEST(GradReducer, ExtraBuffersAreReducedAfterTheBuckets) {
  auto comm = dp_comm();
  const int n = comm->size(), r = comm->rank();
  const auto params = make_params();
  const auto initial = make_grads(total_count(params), r, true);
  for (bool overlap : {true, false}) {
    auto grads = initial;
    std::vector<float> rows(3000), norms(7);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(r * 8 + i % 5);
    for (size_t i = 0; i < norms.size(); ++i) norms[i] = static_cast<float>(r);
    GradReducer reducer(*comm, grads.data(), params, options(kLimits[3], overlap));
    reducer.begin_step(true);
    for (size_t i = 0; i + 1 < params.size(); ++i) reducer.grad_ready(static_cast<int>(i));
    reducer.add_extra(rows.data(), rows.size(), "wte rows");  // before the last grad_ready
    reducer.grad_ready(static_cast<int>(params.size() - 1));
    reducer.add_extra(norms.data(), norms.size(), "norms");  // after it
    reducer.finish();
    EXPECT_TRUE(bitwise_equal(grads, reference_sum(initial, *comm)));
    const float rank_sum = static_cast<float>(n * (n - 1) / 2);
    for (size_t i = 0; i < rows.size(); ++i)
      ASSERT_EQ(rows[i], 8 * rank_sum + n * static_cast<float>(i % 5)) << i;
    for (float v : norms) ASSERT_EQ(v, rank_sum);
    const auto& rec = reducer.stats().records;
    ASSERT_EQ(rec.size(), reducer.buckets().size() + 2);
    EXPECT_EQ(rec[rec.size() - 2].name, "wte rows");
    EXPECT_EQ(rec[rec.size() - 2].bucket, -1);
    EXPECT_EQ(rec.back().name, "norms");
    EXPECT_EQ(rec.back().bytes, 7 * sizeof(float));
  }
}

TEST(GradReducer, ShuffledReadyOrderStillLaunchesInBucketOrder) {
  auto comm = dp_comm();
  const auto params = make_params();
  const auto initial = make_grads(total_count(params), comm->rank(), true);
  const auto expected = reference_sum(initial, *comm);
  for (const Limits& l : {kLimits[1], kLimits[3]}) {
    auto grads = initial;
    GradReducer reducer(*comm, grads.data(), params, options(l, true));
    std::vector<int> order(params.size());
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 rng(100 + comm->rank());  // a different order on every rank
    std::shuffle(order.begin(), order.end(), rng);
    reducer.begin_step(true);
    for (int i : order) {
      reducer.grad_ready(i);
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // let the thread launch
    }
    reducer.finish();
    EXPECT_TRUE(bitwise_equal(grads, expected)) << l.name;
    const auto& rec = reducer.stats().records;
    ASSERT_EQ(rec.size(), reducer.buckets().size());
    for (size_t k = 0; k < rec.size(); ++k) {
      EXPECT_EQ(rec[k].bucket, static_cast<int>(k));
      EXPECT_GE(rec[k].start_ms, rec[k].ready_ms);
      if (k > 0) EXPECT_GE(rec[k].start_ms, rec[k - 1].start_ms);
    }
  }
}

// Note [Ready order check]: parameters marked in ready order leave the check quiet; the first
// one marked last holds every bucket back, and the step names it and the first bucket that
// waited (the events reach the thread in the order grad_ready was called, so this does not
// depend on timing). The reduction is still right.
TEST(GradReducer, ReadyOrderCheckNamesTheBucketThatHeldTheOthersBack) {
  auto comm = dp_comm();
  const auto params = make_params();
  const auto initial = make_grads(total_count(params), comm->rank(), true);
  const auto expected = reference_sum(initial, *comm);
  for (bool overlap : {true, false}) {
    auto grads = initial;
    GradReducer reducer(*comm, grads.data(), params, options(kLimits[1], overlap));
    run_step(reducer, params.size());
    EXPECT_EQ(reducer.stats().ahead_bucket, -1) << "in order, overlap " << overlap;
    EXPECT_EQ(reducer.stats().late_bucket, -1);
    grads = initial;
    reducer.begin_step(true);
    for (size_t i = 1; i < params.size(); ++i) reducer.grad_ready(static_cast<int>(i));
    reducer.grad_ready(0);  // as wte was on a device backend, laid out first, final last
    reducer.finish();
    EXPECT_EQ(reducer.stats().ahead_bucket, 1) << "overlap " << overlap;
    EXPECT_EQ(reducer.stats().late_bucket, 0);
    EXPECT_TRUE(bitwise_equal(grads, expected));
    grads = initial;
    run_step(reducer, params.size());  // each step is judged on its own
    EXPECT_EQ(reducer.stats().ahead_bucket, -1);
  }
}

// A host communicator whose marks, as a device communicator's (Note [Gradient-ready events]),
// hold the position the test set when they were last recorded, and which logs the ordering
// calls and counts the marks made and recorded (Note [Marks made once]).
class MarkingComm : public MpiComm {
 public:
  using MpiComm::MpiComm;
  struct Mark : ComputeMark {
    Mark(int s, bool t) : seq(s), timed(t) {}
    int seq;
    bool timed;  // timed marks keep the seq they were made with (DeviceTimedComm)
  };
  std::shared_ptr<ComputeMark> new_mark(bool timed) override {  // compute thread
    std::lock_guard lock(mutex_);
    ++made_;
    return std::make_shared<Mark>(-1, timed);
  }
  void record_mark(ComputeMark& mark) override {  // compute thread
    std::lock_guard lock(mutex_);
    ++recorded_;
    auto& m = static_cast<Mark&>(mark);
    if (!m.timed) m.seq = position;
  }
  void order_after(const ComputeMark* mark) override {  // communication thread
    std::lock_guard lock(mutex_);
    ordered_after_.push_back(mark ? static_cast<const Mark*>(mark)->seq : -2);
  }
  void compute_waits_for_comm() override { ++compute_waits_; }
  std::vector<int> ordered_after() {
    std::lock_guard lock(mutex_);
    return ordered_after_;
  }
  int compute_waits() const { return compute_waits_; }
  void reset_compute_waits() { compute_waits_ = 0; }
  int made() {
    std::lock_guard lock(mutex_);
    return made_;
  }
  int recorded() {
    std::lock_guard lock(mutex_);
    return recorded_;
  }
  std::atomic<int> position{0};  // set by the test before each grad_ready

 protected:
  std::mutex mutex_;

 private:
  int made_ = 0, recorded_ = 0;
  std::vector<int> ordered_after_;
  std::atomic<int> compute_waits_{0};
};

// Note [Device time of an operation]: a communicator that says when each operation ran on
// "the device" (here: operation k from 10·k to 10·k + 4 ms after the step's origin, the end of
// backward at 12 ms) has the step's comm_ms and exposed_comm_ms computed from those times, not
// the host's. n one-parameter buckets: comm_ms = 4·n (disjoint spans), exposed = 10·(n−1) + 4 −
// 12. A host communicator keeps host times (device_timed false), as every other test here.
class DeviceTimedComm : public MarkingComm {
 public:
  using MarkingComm::MarkingComm;
  std::shared_ptr<ComputeMark> new_mark(bool timed) override {  // compute thread
    if (!timed) return MarkingComm::new_mark(false);
    return std::make_shared<Mark>(timed_marks_++ == 0 ? 0 : 12, true);  // origin, then the end
  }
  bool device_span(const Work&, const ComputeMark& origin, double* start_ms,
                   double* end_ms) override {
    EXPECT_EQ(static_cast<const Mark&>(origin).seq, 0) << "spans are measured from the origin";
    *start_ms = 10.0 * ops_;
    *end_ms = 10.0 * ops_++ + 4.0;
    return true;
  }
  bool mark_elapsed_ms(const ComputeMark& origin, const ComputeMark& later, double* ms) override {
    *ms = static_cast<const Mark&>(later).seq - static_cast<const Mark&>(origin).seq;
    return true;
  }

 private:
  std::atomic<int> timed_marks_{0};
  int ops_ = 0;  // the reducer's thread only
};

TEST(GradReducer, DeviceTimesReplaceHostTimesWhereTheCommunicatorHasThem) {
  auto host = dp_comm();
  MPI_Comm raw = MPI_COMM_NULL;
  TRIDENT_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &raw));
  DeviceTimedComm comm(raw, "dp (device-timed)");
  const auto params = make_params();
  auto grads = make_grads(total_count(params), comm.rank(), true);
  const auto expected = reference_sum(grads, comm);
  GradReducer reducer(comm, grads.data(), params, options(kLimits[1], true));
  run_step(reducer, params.size());
  const ReduceStats& st = reducer.stats();
  const size_t n = reducer.buckets().size();
  ASSERT_EQ(st.records.size(), n);
  EXPECT_TRUE(st.device_timed);
  EXPECT_DOUBLE_EQ(st.comm_ms, 4.0 * n);
  EXPECT_DOUBLE_EQ(st.exposed_comm_ms, 10.0 * (n - 1) + 4.0 - 12.0);
  for (size_t k = 0; k < n; ++k) {
    EXPECT_DOUBLE_EQ(st.records[k].device_start_ms, 10.0 * k);
    EXPECT_DOUBLE_EQ(st.records[k].device_end_ms, 10.0 * k + 4.0);
  }
  EXPECT_TRUE(bitwise_equal(grads, expected));
  GradReducer on_host(*host, grads.data(), params, options(kLimits[1], true));
  run_step(on_host, params.size());
  EXPECT_FALSE(on_host.stats().device_timed);
  EXPECT_EQ(on_host.stats().records[0].device_start_ms, -1);
}

TEST(GradReducer, EachBucketWaitsForItsLastReadyMark) {
  MPI_Comm raw = MPI_COMM_NULL;
  TRIDENT_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &raw));
  MarkingComm comm(raw, "dp-marks");
  const auto params = make_params();
  const auto initial = make_grads(total_count(params), comm.rank(), true);
  for (const Limits& l : {kLimits[0], kLimits[1], kLimits[3]}) {
    SCOPED_TRACE(l.name);
    auto grads = initial;
    std::vector<float> extra(5, 1.0f);
    const int made_before = comm.made();
    GradReducer reducer(comm, grads.data(), params, options(l, true));
    const size_t n = reducer.buckets().size();
    // A no-reduce micro-batch records no marks and orders nothing.
    const int recorded_before = comm.recorded();
    reducer.begin_step(false);
    for (size_t i = 0; i < params.size(); ++i) reducer.grad_ready(static_cast<int>(i));
    reducer.finish();
    EXPECT_EQ(comm.compute_waits(), 0);
    EXPECT_EQ(comm.recorded(), recorded_before);

    for (int step = 0; step < 2; ++step) {
      std::vector<int> order(params.size());
      std::iota(order.begin(), order.end(), 0);
      std::mt19937 rng(7 + comm.rank() + step);
      std::shuffle(order.begin(), order.end(), rng);
      const size_t before = comm.ordered_after().size();
      const int recorded_at_begin = comm.recorded();
      grads = initial;
      reducer.begin_step(true);
      std::vector<int> seq_of_param(params.size());
      for (size_t k = 0; k < order.size(); ++k) {
        comm.position = static_cast<int>(k);
        reducer.grad_ready(order[k]);
        seq_of_param[static_cast<size_t>(order[k])] = static_cast<int>(k);
      }
      comm.position = 1000;
      reducer.add_extra(extra.data(), extra.size(), "extra");
      reducer.finish();
      EXPECT_TRUE(bitwise_equal(grads, reference_sum(initial, comm)));
      EXPECT_EQ(comm.compute_waits(), 1);
      comm.reset_compute_waits();
      // Note [Marks made once]: one record per bucket (its completing grad_ready), one for the
      // extra and the step's timed origin and end of backward, none for the other parameters;
      // no mark made after the first step.
      EXPECT_EQ(comm.recorded() - recorded_at_begin, static_cast<int>(n) + 3) << "step " << step;
      if (step == 1) EXPECT_EQ(comm.made() - made_before, static_cast<int>(n) + 4);

      const auto log = comm.ordered_after();
      const std::vector<int> got(log.begin() + static_cast<std::ptrdiff_t>(before), log.end());
      ASSERT_EQ(got.size(), n + 1);
      EXPECT_EQ(got.back(), 1000) << "the extra waits for its own mark";
      for (size_t b = 0; b < n; ++b) {
        const Bucket& bucket = reducer.buckets()[b];
        int last = -1;
        for (size_t i = bucket.first_param; i < bucket.first_param + bucket.num_params; ++i)
          last = std::max(last, seq_of_param[i]);
        EXPECT_EQ(got[b], last) << "bucket " << b << ", step " << step;
      }
    }
  }
}

TEST(GradReducer, NeverReadyParameterIsNamedOnEveryRank) {
  auto comm = dp_comm();
  const auto params = make_params();
  const auto initial = make_grads(total_count(params), comm->rank(), true);
  for (bool overlap : {true, false}) {
    auto grads = initial;
    GradReducer reducer(*comm, grads.data(), params, options(kLimits[3], overlap));
    reducer.begin_step(true);
    for (size_t i = 0; i < params.size(); ++i)
      if (i != 6 && i != 9) reducer.grad_ready(static_cast<int>(i));  // same on every rank
    try {
      reducer.finish();
      ADD_FAILURE() << "finish() did not throw";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("parameter 'p6' (ready index 6) never became ready"), std::string::npos)
          << what;
      EXPECT_NE(what.find("so bucket "), std::string::npos) << what;
      EXPECT_NE(what.find("2 parameter(s) missing: 'p6', 'p9'"), std::string::npos) << what;
    }
    // The step failed cleanly: nothing is left in flight, so the next one works.
    grads = initial;
    run_step(reducer, params.size());
    EXPECT_TRUE(bitwise_equal(grads, reference_sum(initial, *comm)));
  }
}

TEST(GradReducer, MisuseIsRefused) {
  auto comm = dp_comm();
  auto params = make_params();
  std::vector<float> grads(total_count(params));
  {
    GradReducer reducer(*comm, grads.data(), params, options(kLimits[2], true));
    EXPECT_THROW(reducer.grad_ready(0), Error);  // before begin_step
    reducer.begin_step(true);
    reducer.grad_ready(0);
    try {
      reducer.grad_ready(0);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'p0' (ready index 0) marked ready twice"),
                std::string::npos);
    }
    EXPECT_THROW(reducer.grad_ready(static_cast<int>(params.size())), Error);
    EXPECT_THROW(reducer.begin_step(true), Error);  // the step is still open
    for (size_t i = 1; i < params.size(); ++i) reducer.grad_ready(static_cast<int>(i));
    reducer.finish();
    EXPECT_THROW(reducer.finish(), Error);
  }
  std::swap(params[3], params[4]);  // not contiguous any more
  EXPECT_THROW(GradReducer(*comm, grads.data(), params, {}), Error);
}

TEST(GradReducer, SingleRankGroupLeavesTheAverageUnchanged) {
  auto self = MpiComm::duplicate(MPI_COMM_SELF, "dp-self");
  const auto params = make_params();
  const auto initial = make_grads(total_count(params), 0, false);
  auto grads = initial;
  GradReducer reducer(*self, grads.data(), params, options(kLimits[2], true));
  run_step(reducer, params.size());
  EXPECT_TRUE(bitwise_equal(grads, initial));
}

// With compute between grad_ready calls and an emulated slow link, overlap hides most of the
// communication: exposed_comm_ms drops well below the no-overlap run's.
TEST(GradReducer, OverlapHidesCommunicationBehindBackward) {
  auto comm = dp_comm();
  const double gbps = 0.5;  // 62.5 MB/s: the link, not the scheduler, sets the times
  comm->set_emulated_link(gbps, 20);
  const auto params = make_params();  // ≈ 2 MB
  const auto initial = make_grads(total_count(params), comm->rank(), true);
  // Buckets: p0..p6 (0.5 MB), p7 (1.2 MB), p8..p11 (0.27 MB). With 5 ms of "backward" per
  // parameter the big bucket is ready at 40 ms and its link time (≥ 19 ms) ends just before
  // backward does (60 ms), so only the last small bucket is exposed; without overlap, all.
  const Limits three_buckets = {"3 buckets", 600 << 10, 600 << 10};
  double exposed[2] = {0, 0}, comm_ms[2] = {0, 0};
  for (bool overlap : {true, false}) {
    auto grads = initial;
    GradReducer reducer(*comm, grads.data(), params, options(three_buckets, overlap));
    MPI_Barrier(MPI_COMM_WORLD);
    reducer.begin_step(true);
    for (size_t i = 0; i < params.size(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // "backward of layer i"
      reducer.grad_ready(static_cast<int>(i));
    }
    reducer.finish();
    EXPECT_TRUE(bitwise_equal(grads, reference_sum(initial, *comm)));
    exposed[overlap] = reducer.stats().exposed_comm_ms;
    comm_ms[overlap] = reducer.stats().comm_ms;
    for (const auto& r : reducer.stats().records) EXPECT_GE(r.end_ms, r.start_ms);
  }
  // Model: 2(n−1)/n · 2 MB at 62.5 MB/s ≥ 32 ms of link time in total.
  const double model_ms =
      1e3 * emulated_link_seconds(LinkOp::kAllReduce, total_count(params) * sizeof(float),
                                  comm->size(), gbps, 0);
  EXPECT_GE(comm_ms[false], model_ms);
  EXPECT_GE(exposed[false], model_ms);
  // Compare the minimum over ranks: on a loaded machine the ranks' backwards drift apart, and a
  // rank that finishes early also waits for the others — the rank that finished last sees only
  // the communication that was truly not hidden.
  double least[2] = {exposed[0], exposed[1]};
  MPI_Allreduce(MPI_IN_PLACE, least, 2, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_LT(least[true], 0.75 * least[false]);
  if (comm->rank() == 0)
    std::printf("[ overlap  ] %d ranks, link model %.1f ms: exposed %.1f ms with overlap, %.1f ms "
                "without (comm_ms %.1f / %.1f)\n",
                comm->size(), model_ms, exposed[true], exposed[false], comm_ms[true],
                comm_ms[false]);
}

// Rank 0 never marks parameter 0, so its bucket 0 all-reduce never starts there; the other
// ranks' bucket 0 cannot complete and ends at the timeout, naming the bucket and the rank.
TEST(GradReducer, StuckBucketTimesOutNamingRankAndBucket) {
  auto comm = dp_comm("dp-stuck");
  const auto params = make_params();
  // The abandoned all-reduce on ranks > 0 still writes here when rank 0 joins it at the end,
  // so this buffer must outlive the reducer.
  static std::vector<float> grads;
  grads = make_grads(total_count(params), comm->rank(), true);
  const int rank = comm->rank();
  {
    comm->set_timeout(0.5);
    GradReducer reducer(*comm, grads.data(), params, options(kLimits[1], true));
    reducer.begin_step(true);
    if (rank == 0) {
      for (size_t i = 1; i < params.size(); ++i) reducer.grad_ready(static_cast<int>(i));
      try {
        reducer.finish();
        ADD_FAILURE() << "no error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("parameter 'p0'"), std::string::npos) << e.what();
      }
    } else {
      reducer.grad_ready(0);
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // past the timeout
      try {
        reducer.grad_ready(1);  // the thread's error surfaces here...
        ADD_FAILURE() << "no error from grad_ready";
      } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("bucket 0 (p0)"), std::string::npos) << what;
        EXPECT_NE(what.find(fmt::format("dp rank {} of", rank)), std::string::npos) << what;
        EXPECT_NE(what.find("did not complete within the timeout of 0.5 s"), std::string::npos)
            << what;
        EXPECT_NE(what.find("communicator 'dp-stuck'"), std::string::npos) << what;
      }
      EXPECT_THROW(reducer.finish(), Error);  // ...and again from finish()
    }
  }
  // Let the abandoned bucket 0 complete: rank 0 joins it late (after the others timed out —
  // joining earlier would have let it complete).
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    std::vector<float> scratch(params[0].count, 0.0f);
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, scratch.data(), static_cast<int>(scratch.size()), MPI_FLOAT,
                   MPI_SUM, comm->raw(), &req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// ZeRO-3 (Note [ZeRO-3 units] in train/zero3.h): a unit's gather and a bucket's reduce-scatter
// on their two communicators over one emulated wire, started in opposite orders on even and odd
// ranks (the compute thread's calls reach the reducer's thread in batches, so starts across
// communicators need not agree). Each operation takes ~100 ms of wire, so the second one of each
// rank waits for its turn and is posted only when the thread tests it. A poll that stopped at
// the first unfinished operation whatever its communicator left each rank behind the one its
// peer had not posted: both timed out (Note [One progress call per poll]). Then the values: the
// gather brings every rank's shard, the reduce-scatter the sum of the ranks' gradients.
TEST(GradReducer, Zero3GathersAndReduceScattersPairPerCommunicator) {
  auto dp = dp_comm("dp-z3"), gathers = dp_comm("dp-z3-gathers");
  const int rank = dp->rank(), n = dp->size();
  const std::vector<size_t> counts = {65536, 65536};  // 256 KiB each: two units, a bucket each
  const std::vector<char> breaks = {0, 1};
  const BucketLayout layout =
      padded_bucket_layout(counts, 4, 1 << 20, 1 << 20, size_t(n), {}, breaks);
  ASSERT_EQ(layout.buckets.size(), 2u);
  std::vector<GradParam> params;
  for (size_t i = 0; i < counts.size(); ++i)
    params.push_back({"u" + std::to_string(i), layout.param_offsets[i], counts[i]});
  std::vector<float> grads(layout.total, 0.0f), full(layout.total, 0.0f);
  std::vector<float> shard_grads(layout.total / size_t(n)), shard_params(layout.total / size_t(n));
  dp->set_timeout(20);
  gathers->set_timeout(20);
  dp->set_emulated_link(0.01, 0);  // 256 KiB: (n-1)/n · 2 Mbit / 10 Mbit/s ≥ 100 ms
  gathers->share_emulated_link(*dp);
  GradReducerOptions o;
  o.first_bucket_bytes = o.bucket_bytes = 1 << 20;
  o.shard_grads = shard_grads.data();
  o.release_reduced = true;
  o.breaks = breaks;
  o.params = full.data();
  o.shard_params = shard_params.data();
  o.gather_comm = gathers.get();
  GradReducer reducer(*dp, grads.data(), params, o);
  for (size_t b = 0; b < 2; ++b)
    for (size_t k = 0; k < reducer.shard_count(b); ++k)
      shard_params[reducer.shard_offset(b) + k] = float(rank * 1000 + int(k % 1000));
  reducer.begin_step(true);
  std::fill_n(grads.data() + layout.param_offsets[0], counts[0], float(rank + 1));
  const auto pause = std::chrono::milliseconds(30);  // the thread starts the first alone
  if (rank % 2 == 0) {
    reducer.gather(1, 2, "u1");
    std::this_thread::sleep_for(pause);
    reducer.grad_ready(0);
  } else {
    reducer.grad_ready(0);
    std::this_thread::sleep_for(pause);
    reducer.gather(1, 2, "u1");
  }
  reducer.wait_gathered(1);
  reducer.grad_ready(1);
  reducer.finish();
  const Bucket& b1 = reducer.buckets()[1];
  const size_t per = reducer.shard_count(1);
  for (int r = 0; r < n; ++r)
    for (size_t k = 0; k < per; k += 997)
      ASSERT_EQ(full[b1.offset + size_t(r) * per + k], float(r * 1000 + int(k % 1000)))
          << "rank " << r << "'s shard, element " << k;
  const float sum = float(n * (n + 1) / 2);
  for (size_t k = 0; k < reducer.shard_count(0); ++k)
    ASSERT_EQ(shard_grads[reducer.shard_offset(0) + k], sum) << "element " << k;
  reducer.release_gathered(1, 2);
}

}  // namespace
}  // namespace trident
