// Attention by blocks on the GPU against the CPU twin (Note [Attention blocks] in
// trident/backend.h; kernels/attention_block.cu against src/backend/attention_blockwise.cpp):
// the same sequence of calls — reset, a chain of blocks merged into (out, lse), delta, the
// blocks' backward — on both backends from the same inputs, with q read from q|k|v rows and K/V
// from packed k|v rows as context parallelism passes them.
//
// Tolerances: out and lse 1e-5 of the tensor's scale, as test_attention.cpp's fp32 flash kernel
// (exp approximations on both sides, and the CPU's tile-wise sums against the kernel's key by
// key). dq, dk, dv 3e-5: each entry sums up to NH/KVH · Tq terms (here ≤ 4 · 77) one by one in
// fp32, a few ulp each. A wrong mask, group index or missing term is an error of order 1e-2 to
// 1. Blocks that causality hides must leave every output bitwise as it was.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention_block.h"
#include "backend_test_util.h"
#include "gpu_test_util.h"
#include "trident/backend.h"

namespace trident::testing {
namespace {

constexpr double kForwardTol = 1e-5;
constexpr double kBackwardTol = 3e-5;

struct KeyBlock {
  long k_pos;
  int Tk;
};

// Query rows [q_pos, q_pos + Tq) of B sequences against key blocks, kept one after another in
// a packed k|v tensor. reset: start from an empty softmax (out poisoned with NaN, which must
// never be read); else from a random state (out and lse finite), as a later ring step sees.
struct BlockCase {
  std::string name;
  int B, NH, KVH, hs, Tq;
  long q_pos;
  std::vector<KeyBlock> keys;
  bool reset;

  int key_rows() const {
    int n = 0;
    for (const KeyBlock& k : keys) n += k.Tk;
    return n;
  }
  size_t q_row() const { return size_t(NH + 2 * KVH) * hs; }  // q|k|v rows: q is strided
  size_t kv_row() const { return 2 * size_t(KVH) * hs; }
  size_t qkv_floats() const { return size_t(B) * Tq * q_row(); }
  size_t kv_floats() const { return size_t(B) * key_rows() * kv_row(); }
  size_t out_floats() const { return size_t(B) * Tq * NH * hs; }
  size_t stat_floats() const { return size_t(B) * NH * Tq; }
};
void PrintTo(const BlockCase& c, std::ostream* os) { *os << c.name; }

// Everything one run reads and writes, host side.
struct BlockState {
  std::vector<float> qkv, kv, dout, out, lse, delta, dqkv, dkv;
};

BlockState initial_state(const BlockCase& c) {
  std::mt19937 rng(2718);
  BlockState s;
  s.qkv = to_float(uniform(c.qkv_floats(), rng));
  s.kv = to_float(uniform(c.kv_floats(), rng));
  s.dout = to_float(uniform(c.out_floats(), rng));
  s.out = c.reset ? nans(c.out_floats()) : to_float(uniform(c.out_floats(), rng));
  s.lse = to_float(uniform(c.stat_floats(), rng, 0.5, 2.0));
  s.delta = nans(c.stat_floats());
  s.dqkv = to_float(uniform(c.qkv_floats(), rng));  // backward adds: start from anything
  s.dkv = to_float(uniform(c.kv_floats(), rng));
  return s;
}

// The calls, on `be`, with the pointers of memory `be` can read (host or device).
struct BlockPointers {
  float *qkv, *kv, *dout, *out, *lse, *delta, *dqkv, *dkv;
};
void run_blocks(Backend& be, const BlockCase& c, const BlockPointers& p) {
  AttentionBlockArgs a;
  a.B = c.B, a.NH = c.NH, a.KVH = c.KVH, a.hs = c.hs, a.Tq = c.Tq, a.q_pos = c.q_pos;
  a.q = p.qkv, a.dq = p.dqkv;
  a.q_bstride = size_t(c.Tq) * c.q_row(), a.q_rstride = c.q_row();
  a.kv_bstride = size_t(c.key_rows()) * c.kv_row(), a.kv_rstride = c.kv_row();
  a.out = p.out, a.dout = p.dout, a.o_bstride = size_t(c.Tq) * c.NH * c.hs;
  a.o_rstride = size_t(c.NH) * c.hs;
  a.lse = p.lse, a.delta = p.delta;
  a.s_bstride = size_t(c.NH) * c.Tq, a.s_hstride = size_t(c.Tq);
  if (c.reset) be.attention_block_reset(a);
  auto each_block = [&](auto call) {
    size_t row = 0;
    for (const KeyBlock& k : c.keys) {
      const size_t at = row * c.kv_row(), v_at = at + size_t(c.KVH) * c.hs;
      a.k = p.kv + at, a.v = p.kv + v_at, a.dk = p.dkv + at, a.dv = p.dkv + v_at;
      a.k_pos = k.k_pos, a.Tk = k.Tk;
      call();
      row += size_t(k.Tk);
    }
  };
  each_block([&] { be.attention_block_forward(a); });
  be.attention_block_delta(a);
  each_block([&] { be.attention_block_backward(a); });
}

BlockState run_cpu(const BlockCase& c) {
  BlockState s = initial_state(c);
  auto cpu = make_cpu_backend(2);
  run_blocks(*cpu, c,
             {s.qkv.data(), s.kv.data(), s.dout.data(), s.out.data(), s.lse.data(), s.delta.data(),
              s.dqkv.data(), s.dkv.data()});
  return s;
}

BlockState run_gpu(Backend& gpu, const BlockCase& c) {
  const BlockState s = initial_state(c);
  DeviceBuffer<float> qkv(s.qkv), kv(s.kv), dout(s.dout), out(s.out), lse(s.lse), delta(s.delta),
      dqkv(s.dqkv), dkv(s.dkv);
  run_blocks(
      gpu, c,
      {qkv.get(), kv.get(), dout.get(), out.get(), lse.get(), delta.get(), dqkv.get(), dkv.get()});
  gpu.synchronize();
  return {s.qkv,           s.kv,          s.dout, out.download(), lse.download(), delta.download(),
          dqkv.download(), dkv.download()};
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class AttentionBlockTest : public ::testing::TestWithParam<BlockCase> {};

TEST_P(AttentionBlockTest, MatchesCpuTwin) {
  TRIDENT_REQUIRE_GPU();
  const BlockCase& c = GetParam();
  auto gpu = make_cuda_backend();
  const BlockState want = run_cpu(c), got = run_gpu(*gpu, c);
  EXPECT_LE(rel_err(got.out, to_double(want.out)), kForwardTol) << "out";
  EXPECT_LE(rel_err(got.lse, to_double(want.lse)), kForwardTol) << "lse";
  EXPECT_LE(rel_err(got.delta, to_double(want.delta)), kForwardTol) << "delta";
  EXPECT_LE(rel_err(got.dqkv, to_double(want.dqkv)), kBackwardTol) << "dq (and k|v untouched)";
  EXPECT_LE(rel_err(got.dkv, to_double(want.dkv)), kBackwardTol) << "dk, dv";
}

// One writer per output row, sums in a fixed order (Note [Attention block kernels]).
TEST_P(AttentionBlockTest, BitwiseRepeatable) {
  TRIDENT_REQUIRE_GPU();
  const BlockCase& c = GetParam();
  auto gpu = make_cuda_backend();
  const BlockState a = run_gpu(*gpu, c), b = run_gpu(*gpu, c);
  EXPECT_TRUE(bitwise_equal(a.out, b.out) && bitwise_equal(a.lse, b.lse));
  EXPECT_TRUE(bitwise_equal(a.dqkv, b.dqkv) && bitwise_equal(a.dkv, b.dkv));
}

// A block no query row sees changes nothing: (out, lse), dq, dk, dv keep their bits.
TEST(AttentionBlockHidden, LeavesEverythingAsItWas) {
  TRIDENT_REQUIRE_GPU();
  const BlockCase c{"hidden", 1, 4, 4, 128, 33, 0, {{33, 40}}, false};
  auto gpu = make_cuda_backend();
  const BlockState before = initial_state(c), after = run_gpu(*gpu, c);
  EXPECT_TRUE(bitwise_equal(after.out, before.out)) << "out";
  EXPECT_TRUE(bitwise_equal(after.lse, before.lse)) << "lse";
  EXPECT_TRUE(bitwise_equal(after.dqkv, before.dqkv)) << "dq";
  EXPECT_TRUE(bitwise_equal(after.dkv, before.dkv)) << "dk, dv";
}

// Checked on the host before any launch, so this runs without a GPU too.
TEST(AttentionBlockChecks, RefusesHeadsTooLarge) {
  AttentionBlockArgs a;
  a.B = 1, a.NH = 1, a.KVH = 1, a.hs = cuda::kAttentionBlockMaxHs + 1;
  a.q_rstride = a.o_rstride = a.kv_rstride = size_t(a.hs);  // all else in order
  try {
    cuda::attention_block_reset_cuda(a, nullptr);
    FAIL() << "head size " << a.hs << " was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("above the kernels'"), std::string::npos) << e.what();
  }
}

// T not a multiple of 32 or 64, grouped kv heads (KVH < NH, and multi-query), the diagonal
// block, off-diagonal blocks seen whole and in part, hidden blocks inside a chain, head sizes 16
// to the largest.
INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionBlockTest,
    ::testing::Values(
        BlockCase{"diagonal_T77_gqa", 2, 4, 2, 32, 77, 0, {{0, 77}}, true},
        BlockCase{"off_diagonal_seen_whole_into_a_state", 1, 6, 3, 64, 50, 130, {{0, 70}}, false},
        BlockCase{"off_diagonal_in_part_mqa", 2, 2, 1, 16, 65, 40, {{0, 100}}, true},
        BlockCase{
            "chain_merged", 2, 8, 2, 64, 48, 96, {{0, 48}, {48, 48}, {96, 48}, {144, 48}}, true},
        BlockCase{"chain_into_a_state_hidden_first",
                  1,
                  4,
                  4,
                  48,
                  37,
                  37,
                  {{74, 10}, {0, 37}, {37, 37}},
                  false},
        BlockCase{"largest_head", 1, 2, 1, 256, 20, 10, {{0, 31}}, true}),
    [](const ::testing::TestParamInfo<BlockCase>& info) { return info.param.name; });

}  // namespace
}  // namespace trident::testing
