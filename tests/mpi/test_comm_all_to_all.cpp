// Communicator::start_all_to_all_v: MpiComm with uneven counts (zeros, a rank receiving
// nothing), float and int32, the emulated link's pacing by the bytes sent to other ranks, the
// int-count check; and SoloComm's copy.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "trident/check.h"
#include "trident/comm.h"

namespace trident {
namespace {

using Counts = std::vector<std::vector<size_t>>;  // [src][dst]: elements src sends dst

// Every rank draws the same n×n matrix from the seed: counts[src][dst] elements go src → dst.
// About a third are zero; `silent` (if >= 0) receives nothing from anyone.
Counts draw_counts(int n, uint32_t seed, size_t most, int silent) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<size_t> count(0, most);
  Counts c(static_cast<size_t>(n), std::vector<size_t>(static_cast<size_t>(n)));
  for (int src = 0; src < n; ++src)
    for (int dst = 0; dst < n; ++dst) {
      const bool zero = rng() % 3 == 0;
      const size_t k = count(rng);
      c[size_t(src)][size_t(dst)] = zero || dst == silent ? 0 : k;
    }
  return c;
}

// Element i of the block src sends dst: distinct per (seed, src, dst, i), exact in float.
template <typename T>
T value(uint32_t seed, int src, int dst, size_t i) {
  const uint32_t h = (seed * 2654435761u) ^ (uint32_t(src) * 40503u + uint32_t(dst) * 977u);
  const int32_t v = int32_t((h + uint32_t(i) * 7919u) % (1u << 22)) - (1 << 21);
  return static_cast<T>(v);
}

struct Exchange {
  std::vector<size_t> send_counts, recv_counts;
  size_t bytes_to_others = 0;  // what this rank puts on the wire
};

Exchange plan_for(const Counts& c, int rank, size_t esize) {
  Exchange x;
  for (size_t p = 0; p < c.size(); ++p) {
    x.send_counts.push_back(c[size_t(rank)][p]);
    x.recv_counts.push_back(c[p][size_t(rank)]);
    if (int(p) != rank) x.bytes_to_others += c[size_t(rank)][p] * esize;
  }
  return x;
}

template <typename T>
std::vector<T> send_buffer(const Counts& c, int rank, uint32_t seed) {
  std::vector<T> out;
  for (size_t p = 0; p < c.size(); ++p)
    for (size_t i = 0; i < c[size_t(rank)][p]; ++i) out.push_back(value<T>(seed, rank, int(p), i));
  return out;
}

// What this rank must receive: each peer's block for it, in peer order.
template <typename T>
std::vector<T> expected_receive(const Counts& c, int rank, uint32_t seed) {
  std::vector<T> out;
  for (size_t p = 0; p < c.size(); ++p)
    for (size_t i = 0; i < c[p][size_t(rank)]; ++i) out.push_back(value<T>(seed, int(p), rank, i));
  return out;
}

template <typename T>
void exchange_and_check(MpiComm& comm, uint32_t seed, size_t most, int silent) {
  const int n = comm.size(), rank = comm.rank();
  const auto c = draw_counts(n, seed, most, silent);
  const Exchange x = plan_for(c, rank, sizeof(T));
  const std::vector<T> send = send_buffer<T>(c, rank, seed);
  const std::vector<T> want = expected_receive<T>(c, rank, seed);
  std::vector<T> recv(want.size() + 3, T(-7));  // the tail must stay untouched
  Work w = comm.start_all_to_all_v(send.data(), x.send_counts.data(), recv.data(),
                                   x.recv_counts.data(), elem_type_of<T>());
  w.wait();
  EXPECT_STREQ(w.record().op, "all_to_all");
  EXPECT_EQ(w.record().bytes, x.bytes_to_others);
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(recv[i], want[i]) << "seed " << seed << ", rank " << rank << ", element " << i;
  for (size_t i = want.size(); i < recv.size(); ++i) EXPECT_EQ(recv[i], T(-7));
  if (rank == silent) EXPECT_TRUE(want.empty());
}

TEST(AllToAllV, UnevenCountsFloat) {
  auto comm = MpiComm::duplicate(MPI_COMM_WORLD, "a2a");
  for (uint32_t seed = 1; seed <= 8; ++seed)
    exchange_and_check<float>(*comm, seed, 40, seed % 2 == 0 ? int(seed) % comm->size() : -1);
}

TEST(AllToAllV, UnevenCountsInt32) {
  auto comm = MpiComm::duplicate(MPI_COMM_WORLD, "a2a");
  for (uint32_t seed = 11; seed <= 18; ++seed)
    exchange_and_check<int32_t>(*comm, seed, 3000, seed % 3 == 0 ? comm->size() - 1 : -1);
}

TEST(AllToAllV, AllCountsZero) {
  auto comm = MpiComm::duplicate(MPI_COMM_WORLD, "a2a");
  const std::vector<size_t> zeros(size_t(comm->size()), 0);
  const float from = 3;
  float to = 5;
  comm->start_all_to_all_v(&from, zeros.data(), &to, zeros.data(), ElemType::kFloat32).wait();
  EXPECT_EQ(to, 5.0f);
}

// The link carries the bytes this rank sends to the other ranks: the exchange takes at least
// their time (loosely: 0.8×), and the OpRecord's link time is exactly the model's, self bytes
// not counted. The caller's count arrays are overwritten right after the call, before the
// operation is posted at its turn on the link: the operation keeps its own copy.
TEST(AllToAllV, EmulatedLinkPacesByBytesSentToOthers) {
  auto comm = MpiComm::duplicate(MPI_COMM_WORLD, "a2a-slow");
  const double gbps = 1.0, latency_us = 50;  // 125 MB/s
  comm->set_emulated_link(gbps, latency_us);
  const int n = comm->size(), rank = comm->rank();
  // rank r sends (r + 1) MiB to each other rank and 4 MiB to itself.
  Counts c(static_cast<size_t>(n), std::vector<size_t>(static_cast<size_t>(n)));
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d) c[size_t(s)][size_t(d)] = s == d ? 1 << 20 : size_t(s + 1) << 18;
  const uint32_t seed = 99;
  Exchange x = plan_for(c, rank, sizeof(float));
  const std::vector<float> send = send_buffer<float>(c, rank, seed);
  const std::vector<float> want = expected_receive<float>(c, rank, seed);
  std::vector<float> recv(want.size());
  const double model =
      emulated_link_seconds(LinkOp::kAllToAll, x.bytes_to_others, n, gbps, latency_us);

  // A small all-reduce first holds the link, so the all-to-all is posted at its turn, later.
  std::vector<float> one(1024, 1.0f);
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = CommClock::now();
  Work first = comm->all_reduce(one.data(), one.size());
  Work w = comm->start_all_to_all_v(send.data(), x.send_counts.data(), recv.data(),
                                    x.recv_counts.data(), ElemType::kFloat32);
  std::fill(x.send_counts.begin(), x.send_counts.end(), size_t(1) << 40);
  std::fill(x.recv_counts.begin(), x.recv_counts.end(), 0);
  first.wait();
  w.wait();
  const double took = std::chrono::duration<double>(CommClock::now() - t0).count();
  EXPECT_GE(took, 0.8 * model);
  EXPECT_NEAR(w.record().link_ms, model * 1e3, 1e-3);
  EXPECT_EQ(w.record().bytes, size_t(n - 1) * size_t(rank + 1) * (size_t(1) << 20));
  ASSERT_EQ(recv.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(recv[i], want[i]) << "element " << i;
  if (rank == 0)
    std::printf("[ emulated ] all_to_all, %d ranks, 1 Gbit/s + 50 us: rank 0 sends %.2f MB to "
                "others, model %.1f ms, took %.1f ms (after a small all-reduce)\n",
                n, double(x.bytes_to_others) / 1e6, model * 1e3, took * 1e3);
}

// A count beyond MPI's int is refused on the calling rank before anything starts (so every
// rank here throws, and no operation is left in flight).
TEST(AllToAllV, CountBeyondIntIsRefused) {
  auto comm = MpiComm::duplicate(MPI_COMM_WORLD, "a2a");
  std::vector<size_t> counts(size_t(comm->size()), 0);
  counts.back() = size_t(INT_MAX) + 1;
  std::vector<size_t> zeros(counts.size(), 0);
  uint8_t byte = 0;
  try {
    comm->start_all_to_all_v(&byte, counts.data(), &byte, zeros.data(), ElemType::kUint8);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("all_to_all on 'a2a'"), std::string::npos) << what;
    EXPECT_NE(what.find("MPI counts are int"), std::string::npos) << what;
  }
  // The communicator still works: nothing was started.
  exchange_and_check<float>(*comm, 5, 10, -1);
}

TEST(AllToAllV, SoloCommCopies) {
  SoloComm solo;
  const std::vector<int32_t> send = {4, -3, 2, 9, 1};
  std::vector<int32_t> recv(5, 0);
  const size_t count = send.size();
  Work w = solo.start_all_to_all_v(send.data(), &count, recv.data(), &count, ElemType::kInt32);
  w.wait();
  EXPECT_EQ(recv, send);
  const size_t none = 0;
  solo.start_all_to_all_v(send.data(), &none, recv.data(), &none, ElemType::kInt32).wait();
  EXPECT_EQ(recv, send);
  EXPECT_THROW(solo.start_all_to_all_v(send.data(), &count, recv.data(), &none, ElemType::kInt32),
               Error);
}

}  // namespace
}  // namespace trident
