// The blockwise attention (src/backend/attention_blockwise.cpp) against today's T×T op, by finite
// differences, split into chunk pairs as context parallelism will call it, across thread counts,
// and behind the CPU backend's attention ops (Note [Blockwise attention threshold]).
//
// Tolerances: in double both ops compute the same sums in another order (tiles, online softmax),
// so they agree to a few ulps of O(1) values; 1e-12 scale-relative leaves ~1000× margin while any
// wrong term (a missed key, a wrong mask, a lost rescale) is O(1e-3) or more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "backend/kernels.h"
#include "backend_test_util.h"
#include "trident/backend.h"

namespace trident {
namespace {

using namespace trident::testing;
constexpr double kExact = 1e-12;

struct Shape {
  int B, T, NH, KVH, hs;
  size_t qkv() const { return size_t(B) * T * (NH + 2 * KVH) * hs; }
  size_t out() const { return size_t(B) * T * NH * hs; }
  size_t rows() const { return size_t(B) * NH * T; }  // lse, delta
};

// T 70 and 150: a partial last tile (the tile is 64), B > 1, multi-head, GQA and multi-query.
const Shape kShapes[] = {{2, 70, 4, 4, 8}, {2, 150, 4, 2, 8}, {3, 70, 4, 1, 16}};

template <typename Real>
struct Result {
  std::vector<Real> out, lse, dqkv;
};

template <typename Real>
Result<Real> blockwise(const std::vector<Real>& qkv, const std::vector<Real>& dout, const Shape& s,
                       int threads) {
  Result<Real> r{std::vector<Real>(s.out()), std::vector<Real>(s.rows()),
                 std::vector<Real>(s.qkv())};
  std::vector<Real> delta(s.rows());
  cpu::attention_forward_blockwise(r.out.data(), r.lse.data(), qkv.data(), s.B, s.T, s.NH, s.KVH,
                                   s.hs, threads);
  cpu::attention_backward_blockwise(r.dqkv.data(), delta.data(), dout.data(), qkv.data(),
                                    r.out.data(), r.lse.data(), s.B, s.T, s.NH, s.KVH, s.hs,
                                    threads);
  return r;
}

// Today's op in double: out and dqkv.
std::pair<std::vector<double>, std::vector<double>> txt_op(const std::vector<double>& qkv,
                                                           const std::vector<double>& dout,
                                                           const Shape& s) {
  std::vector<double> out(s.out()), att(s.rows() * s.T), scratch(att.size()), dqkv(s.qkv());
  cpu::attention_forward_gqa(out.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.KVH, s.hs, 2);
  cpu::attention_backward_gqa(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), s.B,
                              s.T, s.NH, s.KVH, s.hs, 2);
  return {out, dqkv};
}

TEST(AttentionBlockwise, EqualsTheTxTOpInDouble) {
  std::mt19937 rng(1);
  for (const Shape& s : kShapes) {
    const auto qkv = uniform(s.qkv(), rng, -2.0, 2.0), dout = uniform(s.out(), rng);
    const auto [out, dqkv] = txt_op(qkv, dout, s);
    const Result<double> r = blockwise(qkv, dout, s, 2);
    EXPECT_LT(rel_err(r.out, out), kExact) << "T " << s.T << " KVH " << s.KVH;
    EXPECT_LT(rel_err(r.dqkv, dqkv), kExact) << "T " << s.T << " KVH " << s.KVH;
  }
}

// Central differences as tests/backend/test_gradcheck.cpp: step 1e-5 in double, truncation and
// rounding errors ~1e-10 for these O(1) objectives, tolerance 1e-6 (a wrong term is O(1)).
// T 67 puts the diagonal in a full and a partial tile and makes queries cross key tiles.
TEST(AttentionBlockwise, GradientsMatchFiniteDifferences) {
  const Shape s{2, 67, 2, 1, 2};
  std::mt19937 rng(2);
  auto qkv = uniform(s.qkv(), rng, -2.0, 2.0);
  const auto dout = uniform(s.out(), rng);
  std::vector<double> out(s.out()), lse(s.rows());
  auto loss = [&] {
    cpu::attention_forward_blockwise(out.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.KVH,
                                     s.hs, 1);
    return weighted_sum(out, dout);
  };
  const Result<double> r = blockwise(qkv, dout, s, 2);
  EXPECT_LT(rel_err(r.dqkv, numeric_grad(qkv, loss, 1e-5)), 1e-6);
}

// Context parallelism's calls: queries of chunk [q0, q1) against the keys of chunk [k0, k1), at
// global positions, the pairs in a shuffled order; forward merges, backward adds. Keys and values
// come from their own buffer, packed per row as k | v (other strides than q's), and their
// gradients go to one of the same layout, as a ring's received chunk would.
class ChunkedAttention {
 public:
  ChunkedAttention(const Shape& s, std::vector<int> q_cuts, std::vector<int> k_cuts,
                   const std::vector<double>& qkv)
      : s_(s), q_cuts_(std::move(q_cuts)), k_cuts_(std::move(k_cuts)), qkv_(qkv) {
    const int kv_row = 2 * s.KVH * s.hs;
    for (size_t j = 0; j + 1 < k_cuts_.size(); ++j) {
      const int k0 = k_cuts_[j], Tk = k_cuts_[j + 1] - k0;
      std::vector<double> kv(size_t(s.B) * Tk * kv_row);
      for (int b = 0; b < s.B; ++b)
        for (int t = 0; t < Tk; ++t)
          std::copy_n(&qkv[(size_t(b) * s.T + k0 + t) * row() + s.NH * s.hs], kv_row,
                      &kv[(size_t(b) * Tk + t) * kv_row]);
      kv_.push_back(kv);
      dkv_.emplace_back(kv.size(), 0.0);
    }
  }

  size_t row() const { return size_t(s_.NH + 2 * s_.KVH) * s_.hs; }
  size_t q_chunks() const { return q_cuts_.size() - 1; }
  size_t k_chunks() const { return k_cuts_.size() - 1; }

  // Row `off` of a buffer; null while it is empty (the gradients before backward): an offset
  // from a null pointer is undefined (clang's UBSan reports it).
  static double* at(std::vector<double>& v, size_t off) {
    return v.empty() ? nullptr : v.data() + off;
  }

  cpu::AttentionBlockArgs<double> args(size_t i, size_t j) {
    const size_t C = size_t(s_.NH) * s_.hs, q0 = q_cuts_[i], k0 = k_cuts_[j];
    cpu::AttentionBlockArgs<double> a;
    a.B = s_.B, a.NH = s_.NH, a.KVH = s_.KVH, a.hs = s_.hs;
    a.Tq = q_cuts_[i + 1] - int(q0), a.Tk = k_cuts_[j + 1] - int(k0);
    a.q_pos = long(q0), a.k_pos = long(k0);
    a.q = qkv_.data() + q0 * row(), a.q_bstride = s_.T * row(), a.q_rstride = row();
    a.k = kv_[j].data(), a.v = kv_[j].data() + s_.KVH * s_.hs;
    a.kv_rstride = 2 * size_t(s_.KVH) * s_.hs, a.kv_bstride = a.Tk * a.kv_rstride;
    a.out = at(out, q0 * C), a.dout = at(dout, q0 * C);
    a.o_bstride = s_.T * C, a.o_rstride = C;
    a.lse = at(lse, q0), a.delta = at(delta, q0);
    a.s_bstride = size_t(s_.NH) * s_.T, a.s_hstride = s_.T;
    a.dq = at(dqkv, q0 * row());
    a.dk = dkv_[j].data(), a.dv = dkv_[j].data() + s_.KVH * s_.hs;
    return a;
  }

  // Every (query chunk, key chunk) pair in a shuffled order; pairs that see nothing included.
  std::vector<std::pair<size_t, size_t>> shuffled_pairs(std::mt19937& rng) const {
    std::vector<std::pair<size_t, size_t>> pairs;
    for (size_t i = 0; i < q_chunks(); ++i)
      for (size_t j = 0; j < k_chunks(); ++j) pairs.emplace_back(i, j);
    std::shuffle(pairs.begin(), pairs.end(), rng);
    return pairs;
  }

  void forward(std::mt19937& rng) {
    out.assign(s_.out(), std::numeric_limits<double>::quiet_NaN());  // reset must not read it
    lse.assign(s_.rows(), 0.0);
    for (size_t i = 0; i < q_chunks(); ++i) cpu::attention_block_reset(args(i, 0), 2);
    for (auto [i, j] : shuffled_pairs(rng)) cpu::attention_block_forward(args(i, j), 2);
  }

  void backward(const std::vector<double>& dout_, std::mt19937& rng) {
    dout = dout_;
    delta.assign(s_.rows(), 0.0);
    dqkv.assign(s_.qkv(), 0.0);
    for (auto& d : dkv_) std::fill(d.begin(), d.end(), 0.0);
    for (size_t i = 0; i < q_chunks(); ++i) cpu::attention_block_delta(args(i, 0), 2);
    for (auto [i, j] : shuffled_pairs(rng)) cpu::attention_block_backward(args(i, j), 2);
  }

  // dqkv with the key chunks' dk | dv added in place.
  std::vector<double> gathered_dqkv() const {
    std::vector<double> d = dqkv;
    const int kv_row = 2 * s_.KVH * s_.hs;
    for (size_t j = 0; j < k_chunks(); ++j) {
      const int k0 = k_cuts_[j], Tk = k_cuts_[j + 1] - k0;
      for (int b = 0; b < s_.B; ++b)
        for (int t = 0; t < Tk; ++t)
          for (int c = 0; c < kv_row; ++c)
            d[(size_t(b) * s_.T + k0 + t) * row() + s_.NH * s_.hs + c] +=
                dkv_[j][(size_t(b) * Tk + t) * kv_row + c];
    }
    return d;
  }

  std::vector<double> out, lse, dout, delta, dqkv;

 private:
  Shape s_;
  std::vector<int> q_cuts_, k_cuts_;
  const std::vector<double>& qkv_;
  std::vector<std::vector<double>> kv_, dkv_;
};

void expect_chunks_equal_one_call(const Shape& s, std::vector<int> q_cuts, std::vector<int> k_cuts,
                                  unsigned seed) {
  std::mt19937 rng(seed);
  const auto qkv = uniform(s.qkv(), rng, -2.0, 2.0), dout = uniform(s.out(), rng);
  const Result<double> whole = blockwise(qkv, dout, s, 2);
  ChunkedAttention c(s, std::move(q_cuts), std::move(k_cuts), qkv);
  c.forward(rng);
  c.backward(dout, rng);
  EXPECT_LT(rel_err(c.out, whole.out), kExact);
  EXPECT_LT(rel_err(c.lse, whole.lse), kExact);
  EXPECT_LT(rel_err(c.gathered_dqkv(), whole.dqkv), kExact);
}

// The ring's pairs: T 96 in 4 chunks of 24, query chunk i against key chunks j <= i (the j > i
// pairs are called too and must do nothing).
TEST(AttentionBlockwise, RingChunkPairsEqualOneCall) {
  expect_chunks_equal_one_call({2, 96, 4, 2, 8}, {0, 24, 48, 72, 96}, {0, 24, 48, 72, 96}, 3);
}

// Query and key chunks cut differently (Tq != Tk, q_pos < k_pos with partial overlaps, chunks
// longer than a tile and not aligned to it).
TEST(AttentionBlockwise, UnevenChunkPairsEqualOneCall) {
  expect_chunks_equal_one_call({2, 96, 4, 4, 8}, {0, 37, 96}, {0, 20, 61, 96}, 4);
  expect_chunks_equal_one_call({1, 200, 2, 1, 16}, {0, 130, 131, 200}, {0, 10, 75, 200}, 5);
}

// A block whose keys all come after its queries changes nothing, bit for bit.
TEST(AttentionBlockwise, HiddenBlockChangesNothing) {
  const Shape s{2, 96, 4, 2, 8};
  std::mt19937 rng(6);
  const auto qkv = uniform(s.qkv(), rng, -2.0, 2.0), dout = uniform(s.out(), rng);
  ChunkedAttention c(s, {0, 24, 48, 72, 96}, {0, 24, 48, 72, 96}, qkv);
  c.forward(rng);
  c.backward(dout, rng);
  const auto out = c.out, lse = c.lse, dqkv = c.gathered_dqkv();
  ASSERT_GT(rel_err(dqkv, std::vector<double>(dqkv.size(), 0.0)), 0.0);  // not all zero
  for (auto [i, j] : {std::pair<size_t, size_t>{1, 3}, {0, 1}, {2, 3}}) {
    cpu::attention_block_forward(c.args(i, j), 2);
    cpu::attention_block_backward(c.args(i, j), 2);
  }
  EXPECT_EQ(0, std::memcmp(out.data(), c.out.data(), out.size() * sizeof(double)));
  EXPECT_EQ(0, std::memcmp(lse.data(), c.lse.data(), lse.size() * sizeof(double)));
  const auto after = c.gathered_dqkv();
  EXPECT_EQ(0, std::memcmp(dqkv.data(), after.data(), dqkv.size() * sizeof(double)));
}

// Note [Blockwise backward order]: bitwise the same at 1 and 2 threads, multi-query included.
TEST(AttentionBlockwise, BitwiseEqualAtOneAndTwoThreads) {
  for (const Shape& s : {Shape{2, 150, 4, 2, 16}, Shape{1, 130, 4, 1, 32}}) {
    std::mt19937 rng(7);
    const auto qkv = to_float(uniform(s.qkv(), rng, -2.0, 2.0));
    const auto dout = to_float(uniform(s.out(), rng));
    const Result<float> one = blockwise(qkv, dout, s, 1), two = blockwise(qkv, dout, s, 2);
    EXPECT_EQ(0, std::memcmp(one.out.data(), two.out.data(), one.out.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(one.lse.data(), two.lse.data(), one.lse.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(one.dqkv.data(), two.dqkv.data(), one.dqkv.size() * sizeof(float)));
  }
}

// The backend's attention at T on either side of cpu::kTxTAttentionMaxT: the T×T op up to it
// (bit for bit the kernel it always ran), the blockwise op beyond, both within kFloat of the
// double T×T op on the same fp32 inputs. kFloat 1e-5: as test_family_ops.cpp's attention, a
// softmax over ≤ T terms and two T×hs products in fp32 (≤ ~1e-6 observed); a wrong term is O(1e-2).
TEST(AttentionBlockwise, BackendSwitchesOpsByLength) {
  constexpr double kFloat = 1e-5;
  auto be = make_cpu_backend(2);
  const int Tb = cpu::kTxTAttentionMaxT;
  for (int T : {Tb, Tb + 1, 2 * Tb + 37}) {
    for (int KVH : {4, 2}) {
      SCOPED_TRACE(::testing::Message() << "T " << T << " KVH " << KVH);
      const Shape s{2, T, 4, KVH, 16};
      std::mt19937 rng(8);
      const auto qkv = to_float(uniform(s.qkv(), rng, -2.0, 2.0));
      const auto dout = to_float(uniform(s.out(), rng));
      const auto [out_ref, dqkv_ref] = txt_op(to_double(qkv), to_double(dout), s);
      const int C = s.NH * s.hs;
      std::vector<float> out = nans(s.out()), dqkv = nans(s.qkv());
      std::vector<float> att = nans(be->attention_saved_floats(s.B, T, C, s.NH));
      std::vector<float> scratch = nans(be->attention_scratch_floats(s.B, T, C, s.NH));
      be->attention_forward_gqa(out.data(), att.data(), qkv.data(), s.B, T, s.NH, KVH, s.hs);
      be->attention_backward_gqa(dqkv.data(), scratch.data(), dout.data(), qkv.data(), out.data(),
                                 att.data(), s.B, T, s.NH, KVH, s.hs);
      EXPECT_LT(rel_err(out, out_ref), kFloat);
      EXPECT_LT(rel_err(dqkv, dqkv_ref), kFloat);

      // Which kernel ran: bit for bit the one the rule names.
      std::vector<float> out_k(s.out()), dqkv_k(s.qkv()), att_k(s.rows() * T), s_k(att_k.size());
      if (T <= Tb) {
        cpu::attention_forward_gqa(out_k.data(), att_k.data(), qkv.data(), s.B, T, s.NH, KVH, s.hs,
                                   2);
        cpu::attention_backward_gqa(dqkv_k.data(), s_k.data(), dout.data(), qkv.data(),
                                    att_k.data(), s.B, T, s.NH, KVH, s.hs, 2);
      } else {
        const Result<float> r = blockwise(qkv, dout, s, 2);
        out_k = r.out, dqkv_k = r.dqkv;
      }
      EXPECT_EQ(0, std::memcmp(out.data(), out_k.data(), out.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(dqkv.data(), dqkv_k.data(), dqkv.size() * sizeof(float)));
    }
  }
  // The multi-head form takes the same path.
  const Shape s{2, 2 * Tb + 37, 4, 4, 16};
  std::mt19937 rng(9);
  const auto qkv = to_float(uniform(s.qkv(), rng, -2.0, 2.0));
  const auto dout = to_float(uniform(s.out(), rng));
  const auto [out_ref, dqkv_ref] = txt_op(to_double(qkv), to_double(dout), s);
  const int C = s.NH * s.hs;
  std::vector<float> out = nans(s.out()), dqkv = nans(s.qkv());
  std::vector<float> att = nans(be->attention_saved_floats(s.B, s.T, C, s.NH));
  std::vector<float> scratch = nans(be->attention_scratch_floats(s.B, s.T, C, s.NH));
  be->attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, C, s.NH);
  be->attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), out.data(),
                         att.data(), s.B, s.T, C, s.NH);
  EXPECT_LT(rel_err(out, out_ref), kFloat);
  EXPECT_LT(rel_err(dqkv, dqkv_ref), kFloat);
}

// Buffers are sized for the longest T, and a shorter forward must fit in them: the sizes never
// fall as T grows, and each holds what the op at that T uses (T×T probabilities or lse/delta).
TEST(AttentionBlockwise, SavedAndScratchSizesCoverEveryShorterT) {
  auto be = make_cpu_backend(1);
  const int B = 3, NH = 4, C = 64, Tb = cpu::kTxTAttentionMaxT;
  size_t last_saved = 0, last_scratch = 0;
  for (int T = 1; T <= 4 * Tb + 70; ++T) {
    const size_t saved = be->attention_saved_floats(B, T, C, NH);
    const size_t scratch = be->attention_scratch_floats(B, T, C, NH);
    const size_t used = size_t(B) * NH * (T <= Tb ? size_t(T) * T : size_t(T));
    ASSERT_GE(saved, last_saved) << "T " << T;
    ASSERT_GE(scratch, last_scratch) << "T " << T;
    ASSERT_GE(saved, used) << "T " << T;
    ASSERT_GE(scratch, used) << "T " << T;
    last_saved = saved, last_scratch = scratch;
  }
}

}  // namespace
}  // namespace trident
