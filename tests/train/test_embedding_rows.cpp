// StepRowSet on one rank (Note [Step row set]): marked tokens → ascending rows of the slice and
// each row's index; the multi-rank union is tests/mpi/test_embedding_rows.cpp.
#include <gtest/gtest.h>

#include <set>

#include "train/embedding_rows.h"
#include "trident/check.h"

namespace trident {
namespace {

std::vector<int32_t> rows_of(StepRowSet& set, const std::vector<int32_t>& tokens) {
  SoloComm solo;
  set.clear();
  set.mark(tokens.data(), tokens.size());
  set.unite(solo);
  return set.rows();
}

TEST(StepRowSet, RowsAreTheDistinctTokensAscending) {
  StepRowSet set(0, 200);
  // Repeats, unsorted, and both sides of 64-bit word boundaries.
  const std::vector<int32_t> tokens = {130, 5, 63, 64, 5, 199, 0, 127, 128, 63};
  const std::vector<int32_t> rows = rows_of(set, tokens);
  const std::set<int32_t> expected(tokens.begin(), tokens.end());
  EXPECT_EQ(rows, std::vector<int32_t>(expected.begin(), expected.end()));
  for (size_t k = 0; k < rows.size(); ++k) EXPECT_EQ(set.index_of(rows[k]), int32_t(k));
  EXPECT_EQ(set.index_of(6), -1);
  EXPECT_EQ(set.num_words(), 4u);  // 200 rows: ceil(200/64)
}

// tp > 1: only the slice's tokens, indexed within it; the rest are another tp rank's.
TEST(StepRowSet, KeepsOnlyItsVocabularySlice) {
  StepRowSet set(100, 170);
  const std::vector<int32_t> rows = rows_of(set, {99, 100, 169, 170, 3, 150, 100, 250});
  EXPECT_EQ(rows, (std::vector<int32_t>{100, 150, 169}));
  EXPECT_EQ(set.index_of(100), 0);
  EXPECT_EQ(set.index_of(150), 1);
  EXPECT_EQ(set.index_of(169), 2);
  for (int32_t t : {0, 99, 170, 250, -1}) EXPECT_EQ(set.index_of(t), -1) << t;
}

// A new step forgets the last one's rows, bits and index alike.
TEST(StepRowSet, ANewStepStartsEmpty) {
  StepRowSet set(0, 300);
  rows_of(set, {1, 2, 290});
  const std::vector<int32_t> rows = rows_of(set, {2, 7});
  EXPECT_EQ(rows, (std::vector<int32_t>{2, 7}));
  EXPECT_EQ(set.index_of(1), -1);
  EXPECT_EQ(set.index_of(290), -1);
  EXPECT_EQ(set.index_of(2), 0);
  EXPECT_EQ(set.index_of(7), 1);
  EXPECT_TRUE(rows_of(set, {}).empty());
  EXPECT_EQ(set.index_of(2), -1);
}

// The compact rows stay where they were reserved: no step allocates.
TEST(StepRowSet, NoStepReallocatesItsRows) {
  StepRowSet set(0, 1000);
  std::vector<int32_t> all(1000);
  for (int32_t i = 0; i < 1000; ++i) all[size_t(i)] = 999 - i;
  rows_of(set, {3});
  const int32_t* before = set.rows().data();
  rows_of(set, all);
  EXPECT_EQ(set.rows().size(), 1000u);
  EXPECT_EQ(set.rows().data(), before);
}

TEST(StepRowSet, OneRankRefusesToOrFloats) {
  SoloComm solo;
  float x = 1.0f;
  EXPECT_THROW(solo.all_reduce(&x, 1, ReduceOp::kBitOr), Error);
}

}  // namespace
}  // namespace trident
