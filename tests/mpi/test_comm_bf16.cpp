// comm.grad_dtype bf16 on the CPU (Note [bf16 gradient compression]): the float32 <-> bf16
// rounding against hand-worked values, and MpiComm's compressed all-reduce: exact where bf16 is
// exact, visibly rounded where it is not (so a communicator that silently sent fp32 fails),
// half the bytes, other types untouched.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "comm/bf16_sum.h"
#include "trident/comm.h"

namespace trident {
namespace {

uint16_t to_bf16(float f) {
  uint16_t h = 0;
  bf16::from_float(&f, &h, 1);
  return h;
}

float bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// bf16 keeps the top 16 bits of a float32: 1.0f is 0x3F800000 -> 0x3F80. One bf16 step at 1.0
// is 2^-7, so 1 + 2^-8 is exactly half way between 0x3F80 and 0x3F81.
TEST(Bf16, RoundsToNearestTiesToEven) {
  EXPECT_EQ(to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(to_bf16(bits(0x3F808000u)), 0x3F80);  // 1 + 2^-8: a tie, 0x3F80 is even
  EXPECT_EQ(to_bf16(bits(0x3F818000u)), 0x3F82);  // 1 + 3·2^-8: a tie, 0x3F82 is even
  EXPECT_EQ(to_bf16(bits(0x3F808001u)), 0x3F81);  // just above the tie: up
  EXPECT_EQ(to_bf16(bits(0x3F807FFFu)), 0x3F80);  // just below: down
  EXPECT_EQ(to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(to_bf16(bits(0x7F7FFFFFu)), 0x7F80);  // the largest float rounds up to infinity
  const uint16_t nan = to_bf16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7F80, 0x7F80);
  EXPECT_NE(nan & 0x007F, 0) << "a NaN must not become infinity";
  const uint16_t sig = to_bf16(bits(0x7F800001u));  // a NaN whose payload is in the low bits
  EXPECT_NE(sig & 0x007F, 0);
}

TEST(Bf16, WidensExactly) {
  const uint16_t h[] = {0x3F80, 0xC000, 0x3F81, 0x0001};
  float f[4];
  bf16::to_float(h, f, 4);
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[1], -2.0f);
  EXPECT_EQ(f[2], 1.0f + 0x1p-7f);
  EXPECT_EQ(f[3], bits(0x00010000u));
}

std::unique_ptr<MpiComm> bf16_comm() {
  auto comm = MpiComm::duplicate(MPI_COMM_WORLD, "test-bf16");
  comm->set_bf16_sums(true);
  return comm;
}

// Quarter-integers below 64 have at most 8 significant bits: bf16 holds them and every partial
// sum of them exactly, whatever order the ring adds them in.
TEST(MpiCommBf16, ExactWhereBf16IsExact) {
  auto comm = bf16_comm();
  ASSERT_TRUE(comm->bf16_sums());
  const int n = comm->size(), r = comm->rank();
  const size_t count = 100003;  // odd: uneven ring chunks
  std::vector<float> f(count);
  for (size_t i = 0; i < count; ++i) f[i] = 0.25f * float((r + 1) * int(i % 7));
  Work w = comm->all_reduce(f.data(), count);
  w.wait();
  for (size_t i = 0; i < count; ++i)
    ASSERT_EQ(f[i], 0.25f * float(n * (n + 1) / 2 * int(i % 7))) << i;
  EXPECT_EQ(w.record().bytes, count * 2) << "bf16 sends half the bytes of float32";
}

// 1 + 2^-10 is not a bf16: each rank's contribution rounds to 1, so the sum is exactly n. In
// float32 it would be n·(1 + 2^-10): a communicator that did not compress fails here.
TEST(MpiCommBf16, RoundsEachContribution) {
  auto comm = bf16_comm();
  const int n = comm->size();
  std::vector<float> f(1000, 1.0f + 0x1p-10f);
  comm->all_reduce(f.data(), f.size()).wait();
  for (float x : f) ASSERT_EQ(x, float(n));
}

// ZeRO's reduce-scatter (Note [Reduce-scatter as reduces]) travels as bf16 too: each rank's
// block is exact where bf16 is (quarter-integers, in pieces over the 4 Mi-element limit of one
// reduce at the last block), each contribution rounded where it is not (1 + 2^-10 sums to n,
// not n·(1 + 2^-10)), at half the bytes; the send buffer is left as it was.
TEST(MpiCommBf16, ReduceScatterSumsInBf16) {
  auto comm = bf16_comm();
  const int n = comm->size(), r = comm->rank();
  const size_t count = 3001;  // per rank: odd
  std::vector<float> send(count * size_t(n)), recv(count, -1.0f);
  for (size_t i = 0; i < send.size(); ++i) send[i] = 0.25f * float((r + 1) * int(i % 7));
  const std::vector<float> before = send;
  Work w = comm->reduce_scatter(send.data(), recv.data(), count);
  w.wait();
  for (size_t i = 0; i < count; ++i)
    ASSERT_EQ(recv[i], 0.25f * float(n * (n + 1) / 2 * int((size_t(r) * count + i) % 7))) << i;
  EXPECT_EQ(w.record().bytes, count * size_t(n) * 2) << "bf16 sends half the bytes of float32";
  EXPECT_EQ(send, before);
  std::vector<float> inexact(count * size_t(n), 1.0f + 0x1p-10f);
  comm->reduce_scatter(inexact.data(), recv.data(), count).wait();
  for (float x : recv) ASSERT_EQ(x, float(n));
}

TEST(MpiCommBf16, OtherTypesAndLaterOperationsAreUntouched) {
  auto comm = bf16_comm();
  const int n = comm->size();
  std::vector<double> d(10, 1.0 + 0x1p-30);
  std::vector<int64_t> i(10, (int64_t{1} << 40) + 1);
  comm->all_reduce(d.data(), d.size()).wait();
  comm->all_reduce(i.data(), i.size()).wait();
  for (double x : d) ASSERT_EQ(x, n * (1.0 + 0x1p-30));
  for (int64_t x : i) ASSERT_EQ(x, n * ((int64_t{1} << 40) + 1));
  // Several operations in flight at once, each with its own staging buffer, then reused.
  for (int round = 0; round < 3; ++round) {
    std::vector<std::vector<float>> bufs(4, std::vector<float>(5000, 0.5f));
    std::vector<Work> works;
    for (auto& b : bufs) works.push_back(comm->all_reduce(b.data(), b.size()));
    for (Work& w : works) w.wait();
    for (auto& b : bufs)
      for (float x : b) ASSERT_EQ(x, 0.5f * float(n));
  }
  comm->set_bf16_sums(false);
  std::vector<float> f(10, 1.0f + 0x1p-10f);
  comm->all_reduce(f.data(), f.size()).wait();
  for (float x : f) ASSERT_EQ(x, float(n) * (1.0f + 0x1p-10f)) << "off again: float32";
}

TEST(MpiCommBf16, NanPropagates) {
  auto comm = bf16_comm();
  std::vector<float> f(8, 1.0f);
  if (comm->rank() == 0) f[3] = std::numeric_limits<float>::quiet_NaN();
  comm->all_reduce(f.data(), f.size()).wait();
  EXPECT_TRUE(std::isnan(f[3]));
  EXPECT_EQ(f[2], float(comm->size()));
}

}  // namespace
}  // namespace trident
