// MpiComm: every operation's result, timeouts, and the emulated link's timing.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <numeric>
#include <thread>

#include "trident/check.h"
#include "trident/comm.h"

namespace trident {
namespace {

std::unique_ptr<MpiComm> world_comm(const char* name = "test-world") {
  return MpiComm::duplicate(MPI_COMM_WORLD, name);
}

double seconds_since(CommClock::time_point t) {
  return std::chrono::duration<double>(CommClock::now() - t).count();
}

TEST(MpiComm, RankAndSizeMatchTheWorld) {
  auto comm = world_comm();
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(comm->rank(), rank);
  EXPECT_EQ(comm->size(), size);
  EXPECT_EQ(comm->name(), "test-world");
}

TEST(MpiComm, AllReduceSumsInPlace) {
  auto comm = world_comm();
  const int n = comm->size(), r = comm->rank();
  const size_t count = 100003;  // odd, so ring chunks are uneven
  std::vector<float> f(count);
  std::vector<double> d(count);
  std::vector<int64_t> i64(count);
  for (size_t i = 0; i < count; ++i) {
    f[i] = static_cast<float>(r + 1) + static_cast<float>(i % 1000);
    d[i] = 0.5 * (r + 1) + static_cast<double>(i);
    i64[i] = (int64_t{1} << 40) * r + static_cast<int64_t>(i);
  }
  Work wf = comm->all_reduce(f.data(), count);
  wf.wait();
  comm->all_reduce(d.data(), count).wait();
  comm->all_reduce(i64.data(), count).wait();
  const double rank_sum = n * (n + 1) / 2.0;
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(f[i], static_cast<float>(rank_sum + n * static_cast<double>(i % 1000))) << i;
    ASSERT_EQ(d[i], 0.5 * rank_sum + n * static_cast<double>(i)) << i;
    ASSERT_EQ(i64[i], (int64_t{1} << 40) * (n * (n - 1) / 2) + n * static_cast<int64_t>(i)) << i;
  }
  EXPECT_STREQ(wf.record().op, "all_reduce");
  EXPECT_EQ(wf.record().bytes, count * sizeof(float));
  EXPECT_GE(wf.record().end, wf.record().start);
}

TEST(MpiComm, HostCommunicatorsHaveNoComputeMarks) {
  auto comm = world_comm();
  EXPECT_EQ(comm->mark_compute_ready(), nullptr);
  comm->order_after(nullptr);
  comm->compute_waits_for_comm();
  SoloComm solo;
  EXPECT_EQ(solo.mark_compute_ready(), nullptr);
  std::vector<float> x = {3.0f, -1.5f};
  solo.all_reduce(x.data(), x.size()).wait();  // one rank: unchanged
  EXPECT_EQ(x[0], 3.0f);
  EXPECT_EQ(x[1], -1.5f);
}

TEST(MpiComm, TestPollsToCompletion) {
  auto comm = world_comm();
  std::vector<float> x(1 << 16, 1.0f);
  Work w = comm->all_reduce(x.data(), x.size());
  while (!w.test()) std::this_thread::yield();
  EXPECT_TRUE(w.test());  // stays complete
  EXPECT_EQ(x[123], static_cast<float>(comm->size()));
}

TEST(MpiComm, ReduceScatterGivesEachRankItsBlockSum) {
  auto comm = world_comm();
  const int n = comm->size(), r = comm->rank();
  const size_t block = 1001;
  std::vector<float> send(block * n), recv(block, -1.0f);
  for (size_t j = 0; j < send.size(); ++j) send[j] = static_cast<float>(r * 1000 + j % 997);
  comm->reduce_scatter(send.data(), recv.data(), block).wait();
  const float rank_sum = static_cast<float>(1000 * n * (n - 1) / 2);
  for (size_t i = 0; i < block; ++i)
    ASSERT_EQ(recv[i], rank_sum + static_cast<float>(n * ((r * block + i) % 997))) << i;
}

// Note [Reduce-scatter as reduces]: a block larger than one reduce piece (4 Mi floats) is
// reduced in pieces; every element of every piece lands at its place in the owner's block.
TEST(MpiComm, ReduceScatterOfBlocksLargerThanOnePiece) {
  auto comm = world_comm();
  const int n = comm->size(), r = comm->rank();
  const size_t block = (size_t(4) << 20) + 5;
  std::vector<float> send(block * n), recv(block, -1.0f);
  for (size_t j = 0; j < send.size(); ++j) send[j] = static_cast<float>((r + 1) * (j % 1009));
  comm->reduce_scatter(send.data(), recv.data(), block).wait();
  const float ranks = static_cast<float>(n * (n + 1) / 2);  // Σ (r + 1)
  for (size_t i = 0; i < block; ++i)
    ASSERT_EQ(recv[i], ranks * static_cast<float>((r * block + i) % 1009)) << i;
}

TEST(MpiComm, AllGatherConcatenatesInRankOrder) {
  auto comm = world_comm();
  const int n = comm->size(), r = comm->rank();
  const size_t block = 777;
  std::vector<double> send(block), recv(block * n, -1.0);
  for (size_t i = 0; i < block; ++i) send[i] = r * 10000.0 + i;
  comm->all_gather(send.data(), recv.data(), block).wait();
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < block; ++i) ASSERT_EQ(recv[q * block + i], q * 10000.0 + i);
  // In place: this rank's block already sits in the output.
  std::vector<double> inplace(block * n, -1.0);
  std::copy(send.begin(), send.end(), inplace.begin() + r * block);
  comm->all_gather(inplace.data() + r * block, inplace.data(), block).wait();
  EXPECT_EQ(inplace, recv);
}

TEST(MpiComm, BroadcastFromEveryRoot) {
  auto comm = world_comm();
  for (int root = 0; root < comm->size(); ++root) {
    std::vector<int32_t> x(5000, comm->rank() == root ? root + 7 : -1);
    comm->broadcast(x.data(), x.size(), root).wait();
    for (int32_t v : x) ASSERT_EQ(v, root + 7);
  }
  std::string text = comm->rank() == 0 ? "resolved deck" : "_____________";
  comm->broadcast(text.data(), text.size(), 0).wait();
  EXPECT_EQ(text, "resolved deck");
}

TEST(MpiComm, SendRecvAroundARing) {
  auto comm = world_comm();
  const int n = comm->size(), r = comm->rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<float> out(3000), in(3000, -1.0f), in_tag9(10, -1.0f), out_tag9(10, 9.0f + r);
  std::iota(out.begin(), out.end(), static_cast<float>(r * 100000));
  // Receives posted first, in the opposite tag order from the sends: tags keep them apart.
  Work r9 = comm->recv(in_tag9.data(), in_tag9.size(), prev, 9);
  Work r0 = comm->recv(in.data(), in.size(), prev, 0);
  Work s0 = comm->send(out.data(), out.size(), next, 0);
  Work s9 = comm->send(out_tag9.data(), out_tag9.size(), next, 9);
  s0.wait();
  s9.wait();
  r0.wait();
  r9.wait();
  for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(in[i], static_cast<float>(prev * 100000 + i));
  for (float v : in_tag9) ASSERT_EQ(v, 9.0f + prev);
}

TEST(MpiComm, RecordingKeepsCompletedOperations) {
  auto comm = world_comm();
  comm->set_recording(true);
  float x[4] = {1, 2, 3, 4};
  comm->all_reduce(x, 4).wait();
  comm->broadcast(x, 4, 0).wait();
  const auto records = comm->take_records();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_STREQ(records[0].op, "all_reduce");
  EXPECT_STREQ(records[1].op, "broadcast");
  EXPECT_EQ(records[1].bytes, 16u);
  EXPECT_LE(records[0].start, records[0].end);
  EXPECT_TRUE(comm->take_records().empty());
}

// An operation the other ranks never join ends after the timeout with an Error naming the
// operation, the communicator and the rank. The others then join late, so nothing stays pending.
TEST(MpiComm, TimeoutNamesOperationCommunicatorAndRank) {
  auto comm = world_comm("lonely");
  std::vector<float> x(1000, 1.0f);
  if (comm->rank() == 0) {
    comm->set_timeout(0.3);
    Work w = comm->all_reduce(x.data(), x.size());
    const auto t0 = CommClock::now();
    try {
      w.wait();
      ADD_FAILURE() << "no timeout";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("all_reduce of 4000 bytes"), std::string::npos) << what;
      EXPECT_NE(what.find("communicator 'lonely' (rank 0 of"), std::string::npos) << what;
      EXPECT_NE(what.find("(rank 0)"), std::string::npos) << what;  // world rank, from check.h
    }
    EXPECT_GE(seconds_since(t0), 0.25);
    EXPECT_LT(seconds_since(t0), 5.0);
    MPI_Barrier(MPI_COMM_WORLD);
    comm->set_timeout(60);  // now the others join: the same request completes
    w.wait();
  } else {
    MPI_Barrier(MPI_COMM_WORLD);
    comm->all_reduce(x.data(), x.size()).wait();
  }
  EXPECT_EQ(x[0], static_cast<float>(comm->size()));
}

// The emulated link: an all-reduce takes at least the ring model's time, and not much more.
TEST(MpiComm, EmulatedLinkMakesAllReduceTakeTheModelTime) {
  auto comm = world_comm("slow");
  const double gbps = 1.0, latency_us = 50;  // 125 MB/s
  comm->set_emulated_link(gbps, latency_us);
  std::vector<float> x(1 << 20, 1.0f);  // 4 MiB
  const size_t bytes = x.size() * sizeof(float);
  const double model =
      emulated_link_seconds(LinkOp::kAllReduce, bytes, comm->size(), gbps, latency_us);
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = CommClock::now();
  Work w = comm->all_reduce(x.data(), x.size());
  w.wait();
  const double took = seconds_since(t0);
  EXPECT_GE(took, model);
  EXPECT_LT(took, model + 1.0);
  EXPECT_GE(w.record().ms(), model * 1e3);
  EXPECT_EQ(x[7], static_cast<float>(comm->size()));

  // Two at once share the link: the second ends no earlier than two model times.
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t1 = CommClock::now();
  Work a = comm->all_reduce(x.data(), x.size() / 2);
  Work b = comm->all_reduce(x.data() + x.size() / 2, x.size() / 2);
  a.wait();
  b.wait();
  EXPECT_GE(seconds_since(t1), model * (1 - 1e-9) - 2 * (comm->size() - 1) * latency_us * 1e-6);
  // Back to the real link.
  comm->set_emulated_link(0, 0);
  EXPECT_FALSE(comm->link_emulated());
  Work c = comm->all_reduce(x.data(), 16);
  c.wait();
  EXPECT_LT(c.record().ms(), 250.0);

  if (comm->rank() == 0)
    std::printf("[ emulated ] all_reduce 4 MiB, %d ranks, 1 Gbit/s + 50 us: model %.2f ms, took "
                "%.2f ms\n",
                comm->size(), model * 1e3, took * 1e3);
}

// Note [Paced link]: an operation queued behind another on the emulated link is not posted to
// MPI (its buffer stays untouched, however much progress is driven) until its turn; and
// operations are posted in start order whichever is waited for first, so ranks that wait in
// different orders still pair the same collectives (distinct sizes and values would show a
// wrong pairing as wrong sums or an MPI error).
TEST(MpiComm, PacedLinkPostsEachOperationAtItsTurnInStartOrder) {
  auto comm = world_comm("paced");
  comm->set_timeout(30);
  const double gbps = 1.0, latency_us = 50;
  comm->set_emulated_link(gbps, latency_us);
  const int n = comm->size();
  std::vector<float> a(1 << 20, 1.0f), b(1 << 19, 2.0f), c(1 << 18, 3.0f);
  const double model_a =
      emulated_link_seconds(LinkOp::kAllReduce, a.size() * 4, n, gbps, latency_us);
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = CommClock::now();
  Work wa = comm->all_reduce(a.data(), a.size());
  Work wb = comm->all_reduce(b.data(), b.size());
  Work wc = comm->all_reduce(c.data(), c.size());
  EXPECT_GT(wb.idle_until(), CommClock::now());  // waiting for its turn, not for progress
  // Drive progress for half of a's turn: a's bytes move, b's must not.
  while (seconds_since(t0) < 0.5 * model_a) {
    wa.test();
    wb.test();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  EXPECT_EQ(b[12345], 2.0f) << "b was posted before a's turn on the link ended";
  if (comm->rank() == 0) {
    wc.wait();
    wb.wait();
    wa.wait();
  } else {
    wa.wait();
    wb.wait();
    wc.wait();
  }
  EXPECT_EQ(a[777], 1.0f * n);
  EXPECT_EQ(b[777], 2.0f * n);
  EXPECT_EQ(c[777], 3.0f * n);
  // c's turn came after a's and b's: the three took at least the three model times.
  const double model_all =
      model_a + emulated_link_seconds(LinkOp::kAllReduce, b.size() * 4, n, gbps, latency_us) +
      emulated_link_seconds(LinkOp::kAllReduce, c.size() * 4, n, gbps, latency_us);
  EXPECT_GE(seconds_since(t0), model_all * (1 - 1e-9));
  comm->set_emulated_link(0, 0);
}

// Not a check, a measurement (printed by rank 0): the real all-reduce on this machine, next to
// the blocking MPI_Allreduce, reported like nccl-tests (algbw = bytes / time,
// busbw = algbw · 2(n−1)/n).
TEST(MpiComm, AllReduceBandwidthReport) {
  auto comm = world_comm("bench");
  const int n = comm->size();
  for (size_t bytes : {size_t{1} << 20, size_t{16} << 20}) {
    std::vector<float> x(bytes / sizeof(float), 1.0f);
    comm->all_reduce(x.data(), x.size()).wait();  // warm-up
    MPI_Barrier(MPI_COMM_WORLD);
    const int reps = 3;
    auto t0 = CommClock::now();
    for (int i = 0; i < reps; ++i) comm->all_reduce(x.data(), x.size()).wait();
    const double ours = seconds_since(t0) / reps;
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = CommClock::now();
    for (int i = 0; i < reps; ++i)
      MPI_Allreduce(MPI_IN_PLACE, x.data(), static_cast<int>(x.size()), MPI_FLOAT, MPI_SUM,
                    comm->raw());
    const double blocking = seconds_since(t0) / reps;
    if (comm->rank() == 0)
      std::printf("[ measured ] all_reduce %5.1f MiB, %d ranks: Iallreduce+test %.2f ms "
                  "(algbw %.2f GB/s, busbw %.2f GB/s), MPI_Allreduce %.2f ms\n",
                  bytes / 1048576.0, n, ours * 1e3, bytes / ours / 1e9,
                  bytes / ours / 1e9 * 2 * (n - 1) / n, blocking * 1e3);
  }
}

}  // namespace
}  // namespace trident
