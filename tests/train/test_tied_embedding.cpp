// The tied embedding's pieces of the head gradient (Note [Head gradient in pieces]); its row set
// is tests/train/test_embedding_rows.cpp, its training results tests/mpi/test_dp_training.cpp.
#include <gtest/gtest.h>

#include "train/tied_embedding.h"
#include "trident/buckets.h"

namespace trident {
namespace {

// Note [Head gradient in pieces], worked by hand: 100 rows of 24 floats (9600 bytes) in
// 4000-byte buckets need K = 3 pieces; 34 rows each (ceil(100/3)) rounded up to a multiple of 4
// rows, since 4 rows = 96 floats is the first multiple of both 24 and the alignment, 32 floats.
TEST(HeadGradientPieces, BucketSizedPiecesOnAlignedRows) {
  EXPECT_EQ(head_gradient_pieces(100, 24, 4, 4000, 32), (std::vector<int>{0, 36, 72, 100}));
  // Alignment 1: 34 rows each.
  EXPECT_EQ(head_gradient_pieces(100, 24, 4, 4000, 1), (std::vector<int>{0, 34, 68, 100}));
  // One piece would do: none. One bucket for everything, or none at all: none.
  EXPECT_TRUE(head_gradient_pieces(100, 24, 4, 9600, 32).empty());
  EXPECT_TRUE(head_gradient_pieces(100, 24, 4, kOneBucket, 32).empty());
  EXPECT_TRUE(head_gradient_pieces(100, 24, 4, kOneBucketPerParam, 32).empty());
  // An alignment coarser than the rows leaves one piece.
  EXPECT_TRUE(head_gradient_pieces(3, 24, 4, 16, 1024).empty());
}

}  // namespace
}  // namespace trident
