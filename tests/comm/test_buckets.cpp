// assign_buckets: exact assignments worked out by hand.
#include <gtest/gtest.h>

#include "trident/buckets.h"

namespace trident {
namespace {

using Buckets = std::vector<Bucket>;

TEST(AssignBuckets, FillsEachBucketUpToItsLimit) {
  // 4 params of 10 floats = 40 bytes each; an 80-byte limit holds exactly two.
  EXPECT_EQ(assign_buckets({10, 10, 10, 10}, 4, 80, 80), (Buckets{{0, 2, 0, 20}, {2, 2, 20, 20}}));
}

TEST(AssignBuckets, ExactlyAtTheLimitStillFits) {
  // 4 + 4 bytes = 8 = limit: fits; the third would make 9 > 8.
  EXPECT_EQ(assign_buckets({4, 4, 1}, 1, 8, 8), (Buckets{{0, 2, 0, 8}, {2, 1, 8, 1}}));
}

TEST(AssignBuckets, SmallFirstBucketThenLargerOnes) {
  // 20 bytes each; first bucket 20 bytes (one param), then 60 bytes (three params).
  EXPECT_EQ(assign_buckets({5, 5, 5, 5, 5, 5}, 4, 20, 60),
            (Buckets{{0, 1, 0, 5}, {1, 3, 5, 15}, {4, 2, 20, 10}}));
}

TEST(AssignBuckets, FirstBucketLimitAppliesOnlyToTheFirst) {
  // A generous first bucket takes everything that fits: 4 × 8 bytes = 32 ≤ 1000.
  EXPECT_EQ(assign_buckets({4, 4, 4, 4}, 2, 1000, 8), (Buckets{{0, 4, 0, 16}}));
  // After the first bucket closes, 8-byte buckets: one 4×2-byte param each.
  EXPECT_EQ(assign_buckets({4, 4, 4, 4}, 2, 16, 8),
            (Buckets{{0, 2, 0, 8}, {2, 1, 8, 4}, {3, 1, 12, 4}}));
}

TEST(AssignBuckets, ParameterLargerThanTheLimitGetsItsOwnBucket) {
  // Limit 40 bytes = 10 floats. 2 | 100 (alone, over the limit) | 3 + 3.
  EXPECT_EQ(assign_buckets({2, 100, 3, 3}, 4, 40, 40),
            (Buckets{{0, 1, 0, 2}, {1, 1, 2, 100}, {2, 2, 102, 6}}));
  // The oversized one first: it opens bucket 0 and closes it on the next parameter.
  EXPECT_EQ(assign_buckets({100, 3, 3}, 4, 40, 40), (Buckets{{0, 1, 0, 100}, {1, 2, 100, 6}}));
}

TEST(AssignBuckets, ZeroLimitGivesOneBucketPerParameter) {
  EXPECT_EQ(assign_buckets({3, 4, 5}, 4, kOneBucketPerParam, kOneBucketPerParam),
            (Buckets{{0, 1, 0, 3}, {1, 1, 3, 4}, {2, 1, 7, 5}}));
}

TEST(AssignBuckets, HugeLimitGivesOneBucket) {
  EXPECT_EQ(assign_buckets({3, 4, 5}, 4, kOneBucket, kOneBucket), (Buckets{{0, 3, 0, 12}}));
}

TEST(AssignBuckets, EmptyParameterListGivesNoBuckets) {
  EXPECT_TRUE(assign_buckets({}, 4, 100, 100).empty());
}

TEST(AssignBuckets, EmptyParametersJoinTheOpenBucket) {
  // Zero bytes never exceed a limit, so a 0-element parameter rides along; with a 0-byte
  // limit the next non-empty one still closes the bucket.
  EXPECT_EQ(assign_buckets({3, 0, 3}, 4, 12, 12), (Buckets{{0, 2, 0, 3}, {2, 1, 3, 3}}));
  EXPECT_EQ(assign_buckets({0, 3, 0}, 4, 0, 0),
            (Buckets{{0, 1, 0, 0}, {1, 1, 0, 3}, {2, 1, 3, 0}}));
}

TEST(AssignBuckets, DefaultsOnAGpt2LikeStack) {
  // Ready order of a tiny block, floats: lm-side params first. Limits: first 1 MiB, then 25 MiB.
  // 300000 floats = 1.2 MB > 1 MiB: closes bucket 0 after the first two (4 + 400000 bytes),
  // then everything else (≈ 14 MB) fits in one 25 MiB bucket.
  const std::vector<size_t> counts = {1000, 100000, 300000, 1000, 3000000, 768};
  EXPECT_EQ(assign_buckets(counts, 4, kDefaultFirstBucketBytes, kDefaultBucketBytes),
            (Buckets{{0, 2, 0, 101000}, {2, 4, 101000, 3301768}}));
}

// padded_bucket_layout (Note [Padded buckets]): worked by hand. multiple 2 pads every bucket to
// a multiple of 2·16 = 32 floats.
TEST(PaddedBucketLayout, PadsEachBucketAndMovesTheParametersAfterIt) {
  // 80-byte buckets of 4-byte floats: {10, 10} | {10, 10}; each bucket of 20 is padded to 32.
  const BucketLayout l = padded_bucket_layout({10, 10, 10, 10}, 4, 80, 80, 2);
  EXPECT_EQ(l.buckets, (Buckets{{0, 2, 0, 32}, {2, 2, 32, 32}}));
  EXPECT_EQ(l.param_offsets, (std::vector<size_t>{0, 10, 32, 42}));
  EXPECT_EQ(l.total, 64u);
  EXPECT_EQ(l.shard_count(1, 2), 16u);  // rank 1 owns [48, 64) of bucket 1
}

TEST(PaddedBucketLayout, MultipleOneIsTheUnpaddedAssignment) {
  const std::vector<size_t> counts{5, 5, 5, 5, 5, 5};
  const BucketLayout l = padded_bucket_layout(counts, 4, 20, 60, 1);
  EXPECT_EQ(l.buckets, assign_buckets(counts, 4, 20, 60));
  EXPECT_EQ(l.param_offsets, (std::vector<size_t>{0, 5, 10, 15, 20, 25}));
  EXPECT_EQ(l.total, 30u);
}

TEST(PaddedBucketLayout, AloneParameterGetsABucketOfItsOwn) {
  // One bucket would hold all three (kOneBucket); marking the middle one alone splits them
  // into three, each padded to 4·16 = 64.
  const BucketLayout l = padded_bucket_layout({3, 4, 5}, 4, kOneBucket, kOneBucket, 4, {0, 1, 0});
  EXPECT_EQ(l.buckets, (Buckets{{0, 1, 0, 64}, {1, 1, 64, 64}, {2, 1, 128, 64}}));
  EXPECT_EQ(l.param_offsets, (std::vector<size_t>{0, 64, 128}));
  EXPECT_EQ(l.total, 192u);
  // Alone last, after a run of two: the run keeps the first-bucket limit (12 bytes: 3 floats).
  const BucketLayout m = padded_bucket_layout({3, 3, 100}, 4, 12, 40, 1, {0, 0, 1});
  EXPECT_EQ(m.buckets, (Buckets{{0, 1, 0, 3}, {1, 1, 3, 3}, {2, 1, 6, 100}}));
}

}  // namespace
}  // namespace trident
