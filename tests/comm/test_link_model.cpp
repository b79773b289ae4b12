// The emulated link's time model and the progress backoff (no MPI).
#include <gtest/gtest.h>

#include "trident/comm.h"

namespace trident {
namespace {

TEST(EmulatedLink, RingAllReduceTime) {
  // 8 Gbit/s = 1 GB/s. 1 GB over 2 ranks: 2·1/2·1 s = 1 s; over 4 ranks: 2·3/4 = 1.5 s.
  EXPECT_DOUBLE_EQ(emulated_link_seconds(LinkOp::kAllReduce, 1'000'000'000, 2, 8, 0), 1.0);
  EXPECT_DOUBLE_EQ(emulated_link_seconds(LinkOp::kAllReduce, 1'000'000'000, 4, 8, 0), 1.5);
  // Latency: 2(n−1) hops of 10 µs.
  EXPECT_NEAR(emulated_link_seconds(LinkOp::kAllReduce, 0, 4, 8, 10), 60e-6, 1e-12);
}

TEST(EmulatedLink, OtherOperations) {
  const size_t gb = 1'000'000'000;
  EXPECT_NEAR(emulated_link_seconds(LinkOp::kReduceScatter, gb, 4, 8, 10), 0.75 + 30e-6, 1e-12);
  EXPECT_NEAR(emulated_link_seconds(LinkOp::kAllGather, gb, 4, 8, 10), 0.75 + 30e-6, 1e-12);
  EXPECT_NEAR(emulated_link_seconds(LinkOp::kBroadcast, gb, 4, 8, 10), 1.0 + 30e-6, 1e-12);
  EXPECT_NEAR(emulated_link_seconds(LinkOp::kSendRecv, gb, 4, 8, 10), 1.0 + 10e-6, 1e-12);
  // All-to-all: bytes are what one rank sends to the others, n−1 hops of latency.
  EXPECT_NEAR(emulated_link_seconds(LinkOp::kAllToAll, gb, 4, 8, 10), 1.0 + 30e-6, 1e-12);
  EXPECT_EQ(emulated_link_seconds(LinkOp::kAllToAll, gb, 1, 8, 10), 0.0);
}

TEST(EmulatedLink, OneRankOrNoLinkTakesNoTime) {
  EXPECT_EQ(emulated_link_seconds(LinkOp::kAllReduce, 1 << 20, 1, 8, 10), 0.0);
  EXPECT_EQ(emulated_link_seconds(LinkOp::kAllReduce, 1 << 20, 4, 0, 10), 0.0);
}

TEST(ProgressBackoff, YieldsFirstThenSleepsLongerUpToACap) {
  EXPECT_EQ(progress_backoff(0).count(), 0);
  long previous = 0;
  for (int polls = 0; polls < 100; ++polls) {
    const long us = progress_backoff(polls).count();
    EXPECT_GE(us, previous);
    EXPECT_LE(us, 200);
    previous = us;
  }
  EXPECT_EQ(previous, 200);
}

TEST(ElemType, SizesAndNames) {
  EXPECT_EQ(elem_bytes(elem_type_of<float>()), 4u);
  EXPECT_EQ(elem_bytes(elem_type_of<double>()), 8u);
  EXPECT_EQ(elem_bytes(elem_type_of<int64_t>()), 8u);
  EXPECT_STREQ(elem_type_name(ElemType::kInt32), "int32");
}

TEST(Work, EmptyWorkIsComplete) {
  Work w;
  EXPECT_TRUE(w.test());
  w.wait();
}

}  // namespace
}  // namespace trident
