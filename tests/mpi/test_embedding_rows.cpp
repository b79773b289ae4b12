// The step's row set over several ranks (Note [Step row set]): ranks mark different tokens and
// every rank ends with the same rows, the union computed here by hand; and MpiComm's bitwise-OR
// all-reduce that carries it. Runs under mpirun with 2 and 4 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <set>

#include "train/embedding_rows.h"
#include "trident/check.h"
#include "trident/comm.h"

namespace trident {
namespace {

std::unique_ptr<MpiComm> world_comm() { return MpiComm::duplicate(MPI_COMM_WORLD, "test-rows"); }

// Rank r's tokens: some only it has, one every rank has, some shared with its neighbour, and
// some outside the slice [40, 400).
std::vector<int32_t> tokens_of_rank(int r, int n) {
  std::vector<int32_t> t = {41 + 7 * r, 300 - r, 200, 41 + 7 * ((r + 1) % n), 39 - r, 400 + r};
  if (r == n - 1) t.push_back(399);  // the slice's last row, on one rank only
  return t;
}

TEST(StepRowSetUnion, EveryRankGetsTheUnionOfAllRanksTokens) {
  auto comm = world_comm();
  const int n = comm->size(), r = comm->rank();
  StepRowSet set(40, 400);
  for (int step = 0; step < 2; ++step) {  // the second step: other tokens, the same rule
    set.clear();
    std::vector<int32_t> mine = tokens_of_rank(r, n);
    for (int32_t& t : mine) t += step;
    set.mark(mine.data(), mine.size());
    set.unite(*comm);

    std::set<int32_t> expected;
    for (int q = 0; q < n; ++q)
      for (int32_t t : tokens_of_rank(q, n))
        if (t + step >= 40 && t + step < 400) expected.insert(t + step);
    EXPECT_EQ(set.rows(), std::vector<int32_t>(expected.begin(), expected.end()))
        << "rank " << r << " step " << step;
    // The index covers the other ranks' tokens too.
    int32_t k = 0;
    for (int32_t t : expected) EXPECT_EQ(set.index_of(t), k++) << t;
  }
}

TEST(MpiCommBitOr, OrsIntegersOfEveryWidth) {
  auto comm = world_comm();
  const int n = comm->size(), r = comm->rank();
  std::vector<int64_t> w64 = {int64_t(1) << r, int64_t(uint64_t(1) << 63), 0};
  if (r == 0) w64[2] = 5;
  std::vector<int32_t> w32 = {1 << (r + 8)};
  std::vector<uint8_t> w8 = {uint8_t(1u << (r % 8))};
  comm->all_reduce(w64.data(), w64.size(), ReduceOp::kBitOr).wait();
  comm->all_reduce(w32.data(), w32.size(), ReduceOp::kBitOr).wait();
  comm->all_reduce(w8.data(), w8.size(), ReduceOp::kBitOr).wait();
  EXPECT_EQ(w64[0], (int64_t(1) << n) - 1);
  EXPECT_EQ(w64[1], int64_t(uint64_t(1) << 63));  // the sign bit, not a sum
  EXPECT_EQ(w64[2], 5);
  EXPECT_EQ(w32[0], ((1 << n) - 1) << 8);
  EXPECT_EQ(w8[0], uint8_t((1u << n) - 1));
  std::vector<float> f = {1.0f};
  EXPECT_THROW(comm->all_reduce(f.data(), f.size(), ReduceOp::kBitOr), Error);
}

}  // namespace
}  // namespace trident
