// NcclComm over every GPU of the machine, one rank per GPU in one process (a thread per rank,
// NcclComm's id constructor), checked against the definitions of the collectives computed on
// the host from every rank's input. The inputs are small integers, so every sum is exact in
// fp32 and in bf16 and the comparisons are exact.
//
// With one GPU this runs one rank, where the in-place results equal the inputs whatever NCCL
// did; only the out-of-place ones (into NaN-poisoned buffers) can fail then, and
// test_nccl_comm.cpp's call log covers the rest (Note [Recording NCCL calls]). The checker
// itself is tested without a GPU below: it must pass a correct communicator and catch a
// no-op one and wrong layouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test_util.h"
#include "trident/nccl_comm.h"

namespace trident {
namespace {

using testing::DeviceBuffer;

// Rank r's inputs; m elements per rank (reduce_scatter's input holds ranks × m).
struct RankInputs {
  std::vector<float> reduce, scatter, gather, bcast;
};
RankInputs rank_inputs(int r, int ranks, size_t m) {
  RankInputs in;
  in.reduce.resize(m);
  in.scatter.resize(size_t(ranks) * m);
  in.gather.resize(m);
  in.bcast.resize(m);
  // Integers in [-16, 16]: a sum over up to 8 ranks stays within ±128, exact in bf16 (8
  // significant bits hold every integer up to 256).
  for (size_t i = 0; i < m; ++i) in.reduce[i] = float(int((i * 7 + 3 * size_t(r)) % 33) - 16);
  for (size_t i = 0; i < in.scatter.size(); ++i)
    in.scatter[i] = float(int((i * 5 + 11 * size_t(r)) % 29) - 14);
  for (size_t i = 0; i < m; ++i) in.gather[i] = float(64 * r + int(i % 61));
  for (size_t i = 0; i < m; ++i) in.bcast[i] = float(1000 * r + int(i % 97));
  return in;
}

// What one rank read back after each operation.
struct RankResults {
  std::vector<float> sum, scattered, gathered, broadcast, bf16_sum;
};

constexpr int kMaxRanks = 8;  // the bf16 exactness bound above

// The first element (per rank and operation) that differs from the definition, as text.
std::vector<std::string> collective_mismatches(int ranks, size_t m,
                                               const std::vector<RankResults>& got) {
  std::vector<RankInputs> in;
  for (int r = 0; r < ranks; ++r) in.push_back(rank_inputs(r, ranks, m));
  std::vector<std::string> bad;
  auto compare = [&](int r, const char* op, const std::vector<float>& have, size_t i, double want,
                     double tol) {
    if (i >= have.size()) {
      bad.push_back("rank " + std::to_string(r) + " " + op + ": " + std::to_string(have.size()) +
                    " elements");
      return false;
    }
    if (std::abs(double(have[i]) - want) <= tol * (1.0 + std::abs(want))) return true;
    bad.push_back("rank " + std::to_string(r) + " " + op + ": element " + std::to_string(i) +
                  " is " + std::to_string(have[i]) + ", want " + std::to_string(want));
    return false;
  };
  const int root = ranks - 1;
  for (int r = 0; r < ranks; ++r) {
    const RankResults& g = got[size_t(r)];
    bool sum = true, rs = true, ag = true, bc = true, b16 = true;
    for (size_t i = 0; i < m; ++i) {
      double total = 0, scattered = 0;
      for (int q = 0; q < ranks; ++q) {
        total += in[size_t(q)].reduce[i];
        scattered += in[size_t(q)].scatter[size_t(r) * m + i];
      }
      sum = sum && compare(r, "all_reduce sum", g.sum, i, total, 0);
      rs = rs && compare(r, "reduce_scatter", g.scattered, i, scattered, 0);
      bc = bc && compare(r, "broadcast", g.broadcast, i, in[size_t(root)].bcast[i], 0);
      b16 = b16 && compare(r, "bf16 all_reduce sum", g.bf16_sum, i, total, 0);
      for (int q = 0; q < ranks && ag; ++q)
        ag = compare(r, "all_gather", g.gathered, size_t(q) * m + i, in[size_t(q)].gather[i], 0);
      if (!(sum || rs || ag || bc || b16)) break;
    }
  }
  return bad;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += "\n  " + l;
  return out;
}

// ---- the checker, without a GPU ----

// The collectives' definitions, written independently of the checker's loops.
std::vector<RankResults> simulate_correct(int ranks, size_t m) {
  std::vector<RankInputs> in;
  for (int r = 0; r < ranks; ++r) in.push_back(rank_inputs(r, ranks, m));
  std::vector<float> sum(m, 0.0f), scatter_sum(size_t(ranks) * m, 0.0f), gathered;
  for (const RankInputs& x : in) {
    for (size_t i = 0; i < m; ++i) sum[i] += x.reduce[i];
    for (size_t i = 0; i < scatter_sum.size(); ++i) scatter_sum[i] += x.scatter[i];
    gathered.insert(gathered.end(), x.gather.begin(), x.gather.end());
  }
  std::vector<RankResults> out(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    RankResults& g = out[size_t(r)];
    g.sum = g.bf16_sum = sum;
    g.scattered.assign(scatter_sum.begin() + long(r) * long(m),
                       scatter_sum.begin() + long(r + 1) * long(m));
    g.gathered = gathered;
    g.broadcast = in.back().bcast;
  }
  return out;
}

// A communicator that enqueues nothing: in-place buffers keep the rank's input, out-of-place
// ones the poison.
std::vector<RankResults> simulate_no_op(int ranks, size_t m) {
  std::vector<RankResults> out(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    const RankInputs x = rank_inputs(r, ranks, m);
    RankResults& g = out[size_t(r)];
    g.sum = g.bf16_sum = x.reduce;
    g.scattered.assign(m, NAN);
    g.gathered.assign(size_t(ranks) * m, NAN);
    g.broadcast = x.bcast;
  }
  return out;
}

bool names(const std::vector<std::string>& bad, const std::string& op) {
  return std::any_of(bad.begin(), bad.end(),
                     [&](const std::string& b) { return b.find(" " + op + ":") != b.npos; });
}

TEST(CollectiveChecks, PassACorrectCommunicator) {
  for (int ranks : {1, 2, 3, 8}) {
    const auto bad = collective_mismatches(ranks, 1001, simulate_correct(ranks, 1001));
    EXPECT_TRUE(bad.empty()) << ranks << " ranks:" << joined(bad);
  }
}

TEST(CollectiveChecks, CatchANoOpCommunicator) {
  for (int ranks : {2, 4}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const auto bad = collective_mismatches(ranks, 1001, simulate_no_op(ranks, 1001));
    for (const char* op :
         {"all_reduce sum", "reduce_scatter", "all_gather", "broadcast", "bf16 all_reduce sum"})
      EXPECT_TRUE(names(bad, op)) << op << " not caught:" << joined(bad);
  }
  // One rank: only the out-of-place operations can show a no-op (the call log covers the rest).
  const auto bad = collective_mismatches(1, 1001, simulate_no_op(1, 1001));
  EXPECT_TRUE(names(bad, "reduce_scatter")) << joined(bad);
  EXPECT_TRUE(names(bad, "all_gather")) << joined(bad);
  EXPECT_FALSE(names(bad, "all_reduce sum")) << joined(bad);
}

TEST(CollectiveChecks, CatchWrongLayouts) {
  const int ranks = 3;
  const size_t m = 1001;
  auto got = simulate_correct(ranks, m);
  got[1].scattered = got[0].scattered;  // rank 1 got rank 0's block
  std::reverse(got[2].gathered.begin(), got[2].gathered.end());
  got[0].broadcast = rank_inputs(0, ranks, m).bcast;  // rank 0 kept its own
  got[2].sum[5] += 0.125f;                            // one wrong sum
  const auto bad = collective_mismatches(ranks, m, got);
  EXPECT_TRUE(names(bad, "reduce_scatter")) << joined(bad);
  EXPECT_TRUE(names(bad, "all_gather")) << joined(bad);
  EXPECT_TRUE(names(bad, "broadcast")) << joined(bad);
  EXPECT_TRUE(names(bad, "all_reduce sum")) << joined(bad);
  EXPECT_EQ(bad.size(), 4u) << joined(bad);
}

// ---- on the GPUs ----

RankResults run_rank(int r, int ranks, const ncclUniqueId& plain_id, const ncclUniqueId& bf16_id,
                     size_t m) {
  TRIDENT_CUDA(cudaSetDevice(r));
  cudaStream_t compute = nullptr;
  TRIDENT_CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  RankResults g;
  {
    NcclCommOptions o;
    o.timeout_s = 60;
    NcclComm plain(plain_id, r, ranks, "every-gpu", compute, o);
    o.grad_bf16 = true;
    NcclComm bf16(bf16_id, r, ranks, "every-gpu bf16", compute, o);
    const RankInputs in = rank_inputs(r, ranks, m);
    DeviceBuffer<float> x(in.reduce);
    plain.all_reduce(x.get(), m).wait();
    g.sum = x.download();
    x.upload(in.reduce);
    bf16.all_reduce(x.get(), m).wait();
    g.bf16_sum = x.download();
    DeviceBuffer<float> scatter(in.scatter), scattered(m);  // scattered: NaN
    plain.reduce_scatter(scatter.get(), scattered.get(), m).wait();
    g.scattered = scattered.download();
    DeviceBuffer<float> gather(in.gather), gathered(size_t(ranks) * m);  // gathered: NaN
    plain.all_gather(gather.get(), gathered.get(), m).wait();
    g.gathered = gathered.download();
    DeviceBuffer<float> bcast(in.bcast);
    plain.broadcast(bcast.get(), m, ranks - 1).wait();
    g.broadcast = bcast.download();
  }
  cudaStreamDestroy(compute);
  return g;
}

// Every GPU here, one rank each (at most kMaxRanks): never a skip for want of a second GPU.
TEST(NcclCollectives, OneRankPerGpu) {
  TRIDENT_REQUIRE_GPU();
  int devices = 0;
  TRIDENT_CUDA(cudaGetDeviceCount(&devices));
  const int ranks = std::min(devices, kMaxRanks);
  const size_t m = 262147;  // odd: every kernel's tail path
  std::cout << "NCCL collectives over " << ranks << " rank(s), one per GPU (" << devices
            << " GPU(s) here)\n";
  ncclUniqueId plain_id, bf16_id;
  TRIDENT_NCCL(ncclGetUniqueId(&plain_id));
  TRIDENT_NCCL(ncclGetUniqueId(&bf16_id));
  std::vector<RankResults> results(static_cast<size_t>(ranks));
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        results[size_t(r)] = run_rank(r, ranks, plain_id, bf16_id, m);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;
  const auto bad = collective_mismatches(ranks, m, results);
  EXPECT_TRUE(bad.empty()) << joined(bad);
}

}  // namespace
}  // namespace trident
