// Context parallelism's attention alone (src/model/cp_attention.h): at cp 2, 3 and 4, ring,
// allgather and the ring in grouped exchanges (the device's, Note [Ring on a device]), each
// rank's output and every gradient (dQ of its rows, dK and dV of its own chunks, which travel
// home) equal the one-rank attention over the whole sequence at those positions; this is where
// users of other trainers found dK/dV wrong. And the ring posts step k+1's receive before step
// k's compute begins, which a ring that posts late fails.
// Runs under mpirun with 2 and 4 ranks (cp 3 on three of the four).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <ostream>
#include <random>
#include <vector>

#include "model/cp_attention.h"
#include "ring_test_util.h"
#include "trident/backend.h"
#include "trident/comm.h"
#include "trident/model.h"

namespace trident {
namespace {

using testing::first_ranks;
using testing::random_values;

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

struct Shape {
  int B = 2, NH = 4, KVH = 2, hs = 8, c = 7;  // c: rows per chunk, not a multiple of a tile
};

// Rows of [B, T, width] at the given positions of each sequence: [B, positions, width].
std::vector<float> rows_at(const std::vector<float>& full, int B, int T, size_t width,
                           const std::vector<int>& positions) {
  std::vector<float> out;
  for (int b = 0; b < B; ++b)
    for (int p : positions) {
      const float* row = full.data() + (size_t(b) * T + size_t(p)) * width;
      out.insert(out.end(), row, row + width);
    }
  return out;
}

// Largest |a - b| relative to max(1, max |b|).
double max_rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double err = 0, scale = 1;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    err = std::max(err, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return err / scale;
}

// A way of moving K/V: ring or allgather, and the ring's grouped exchanges, which a device
// always takes, run here on the host (Note [Ring on a device] in src/model/cp_ring_grouped.cpp).
struct CpMode {
  CpComm comm;
  bool grouped;
};
void PrintTo(const CpMode& m, std::ostream* os) {
  *os << (m.comm == CpComm::kAllGather ? "allgather" : m.grouped ? "ring, grouped" : "ring");
}

void check_against_one_rank(int cp, CpMode mode, const Shape& s) {
  auto comm = first_ranks(cp, "cp (test)");
  if (!comm) return;
  auto be = make_cpu_backend(1);
  const int T = 2 * cp * s.c, Tl = T / cp, row = (s.NH + 2 * s.KVH) * s.hs, C = s.NH * s.hs;
  const std::vector<float> qkv = random_values(size_t(s.B) * T * row, 7);
  const std::vector<float> dout = random_values(size_t(s.B) * T * C, 8);

  // The reference: the one-rank op over all T rows (T×T at this size).
  std::vector<float> out(size_t(s.B) * T * C), dqkv(qkv.size());
  std::vector<float> att(be->attention_saved_floats(s.B, T, C, s.NH)),
      scratch(be->attention_scratch_floats(s.B, T, C, s.NH));
  be->attention_forward_gqa(out.data(), att.data(), qkv.data(), s.B, T, s.NH, s.KVH, s.hs);
  be->attention_backward_gqa(dqkv.data(), scratch.data(), dout.data(), qkv.data(), out.data(),
                             att.data(), s.B, T, s.NH, s.KVH, s.hs);

  const std::vector<int> pos = cp_positions(Tl, cp, comm->rank());
  const std::vector<float> my_qkv = rows_at(qkv, s.B, T, size_t(row), pos);
  const std::vector<float> my_dout = rows_at(dout, s.B, T, size_t(C), pos);
  CpAttention attention(*be, {comm.get(), cp, comm->rank(), mode.comm}, s.B, Tl, s.NH, s.KVH, s.hs,
                        mode.grouped);
  std::vector<float> my_out(size_t(s.B) * Tl * C), lse(size_t(s.B) * s.NH * Tl), delta(lse.size()),
      my_dqkv(my_qkv.size());
  attention.forward(my_out.data(), lse.data(), my_qkv.data(), s.B, Tl);
  attention.backward(my_dqkv.data(), delta.data(), my_dout.data(), my_qkv.data(), my_out.data(),
                     lse.data(), s.B, Tl);

  // fp32 sums over at most T = 56 keys in another order than the reference's: a few ulps of
  // values of order 1; 1e-5 relative is ~100 ulps, and a wrong block or a missing partial sum
  // is off by O(1).
  const std::vector<float> want_dqkv = rows_at(dqkv, s.B, T, size_t(row), pos);
  EXPECT_LT(max_rel_error(my_out, rows_at(out, s.B, T, size_t(C), pos)), 1e-5)
      << "out at cp " << cp << ", rank " << comm->rank();
  // q, k and v columns of each row separately, so a failure names the gradient.
  const char* names[3] = {"dQ", "dK", "dV"};
  const int begin[4] = {0, s.NH * s.hs, (s.NH + s.KVH) * s.hs, row};
  for (int part = 0; part < 3; ++part) {
    std::vector<float> got, want;
    for (size_t r = 0; r < my_dqkv.size() / size_t(row); ++r) {
      got.insert(got.end(), my_dqkv.begin() + long(r * row + begin[part]),
                 my_dqkv.begin() + long(r * row + begin[part + 1]));
      want.insert(want.end(), want_dqkv.begin() + long(r * row + begin[part]),
                  want_dqkv.begin() + long(r * row + begin[part + 1]));
    }
    EXPECT_LT(max_rel_error(got, want), 1e-5)
        << names[part] << " at cp " << cp << ", rank " << comm->rank();
  }
}

class CpAttentionModes : public ::testing::TestWithParam<CpMode> {};

TEST_P(CpAttentionModes, EqualsOneRankAtCp2) { check_against_one_rank(2, GetParam(), Shape{}); }

TEST_P(CpAttentionModes, EqualsOneRankAtCp3) {
  if (world_size() < 3) GTEST_SKIP() << "needs 3 ranks";
  check_against_one_rank(3, GetParam(), Shape{});
}

TEST_P(CpAttentionModes, EqualsOneRankAtCp4) {
  if (world_size() < 4) GTEST_SKIP() << "needs 4 ranks";
  check_against_one_rank(4, GetParam(), Shape{});
}

// One kv head for four query heads, fewer kv heads than cp ranks; one sequence of one head.
TEST_P(CpAttentionModes, MultiQueryAndOneHead) {
  const int cp = std::min(world_size(), 4);
  check_against_one_rank(cp, GetParam(), Shape{.B = 1, .NH = 4, .KVH = 1, .hs = 4, .c = 3});
  check_against_one_rank(cp, GetParam(), Shape{.B = 1, .NH = 1, .KVH = 1, .hs = 16, .c = 1});
}

INSTANTIATE_TEST_SUITE_P(Modes, CpAttentionModes,
                         ::testing::Values(CpMode{CpComm::kRing, false},
                                           CpMode{CpComm::kAllGather, false},
                                           CpMode{CpComm::kRing, true}),
                         [](const auto& info) {
                           return info.param.comm == CpComm::kAllGather ? std::string("AllGather")
                                  : info.param.grouped                  ? std::string("RingGrouped")
                                                                        : std::string("Ring");
                         });

// Forward's and backward's ring, point to point and in the device's grouped exchanges, and the
// same rings told to post after computing (which must fail the check: the check can tell).
TEST(CpRing, PostsTheNextReceiveBeforeComputing) {
  const int cp = std::min(world_size(), 4);
  auto comm = first_ranks(cp, "cp (test)");
  if (!comm) return;
  auto be = make_cpu_backend(1);
  const Shape s;
  const int Tl = 2 * s.c, row = (s.NH + 2 * s.KVH) * s.hs, C = s.NH * s.hs;
  const std::vector<float> qkv = random_values(size_t(s.B) * Tl * row, 3 + comm->rank());
  const std::vector<float> dout = random_values(size_t(s.B) * Tl * C, 5 + comm->rank());
  for (int variant = 0; variant < 4; ++variant) {
    const bool late = variant % 2 == 1, grouped = variant >= 2;  // grouped: the device's ring
    CpAttention attention(*be, {comm.get(), cp, comm->rank(), CpComm::kRing}, s.B, Tl, s.NH, s.KVH,
                          s.hs, grouped);
    attention.post_after_compute(late);
    std::vector<float> out(size_t(s.B) * Tl * C), lse(size_t(s.B) * s.NH * Tl), delta(lse.size()),
        dqkv(qkv.size());
    attention.record_events(true);
    attention.forward(out.data(), lse.data(), qkv.data(), s.B, Tl);
    const std::vector<CpAttention::EventRecord> forward = attention.events();
    attention.backward(dqkv.data(), delta.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                       s.B, Tl);
    std::vector<CpAttention::EventRecord> backward(
        attention.events().begin() + long(forward.size()), attention.events().end());
    EXPECT_EQ(RingEvents::receives_posted_ahead(forward, 1, cp - 1), !late)
        << "forward, late: " << late << ", grouped: " << grouped;
    EXPECT_EQ(RingEvents::receives_posted_ahead(backward, 1, cp - 1), !late)
        << "backward, late: " << late << ", grouped: " << grouped;
    EXPECT_GT(attention.take_comm_ms(), 0.0);
  }
}

}  // namespace
}  // namespace trident
