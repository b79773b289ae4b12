// NcclComm on one GPU: a one-rank communicator (a machine with one GPU can run no more: NCCL
// refuses two ranks on one device), so collectives are copies and the sums equal the input;
// what is checked is the plumbing — enqueue on the comm stream, events, ordering with the
// compute stream, the bf16 path, ReduceOp::kAvg, the GradReducer over device gradients, and
// the timeout. Multi-rank results are covered by the same code paths as MpiComm's tests once
// run under mpirun on a multi-GPU node.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu_test_util.h"
#include "trident/grad_reducer.h"
#include "trident/nccl_comm.h"

namespace trident {
namespace {

using testing::DeviceBuffer;

// test_cuda's main does not initialise MPI; the test that needs it does so lazily (only on a
// machine with a GPU), and this environment finalises it at the end.
class MpiFinalizer : public ::testing::Environment {
 public:
  void TearDown() override {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Finalize();
  }
};
[[maybe_unused]] auto* const kMpiFinalizer =
    ::testing::AddGlobalTestEnvironment(new MpiFinalizer);

void ensure_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
}

// One compute stream and a one-rank NcclComm over a fresh id, without MPI.
struct OneRank {
  explicit OneRank(NcclCommOptions options = {}, const char* name = "nccl-test") {
    TRIDENT_CUDA(cudaSetDevice(0));
    TRIDENT_CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    ncclUniqueId id;
    TRIDENT_NCCL(ncclGetUniqueId(&id));
    comm = std::make_unique<NcclComm>(id, 0, 1, name, compute, options);
  }
  ~OneRank() {
    comm.reset();
    cudaStreamDestroy(compute);
  }
  cudaStream_t compute = nullptr;
  std::unique_ptr<NcclComm> comm;
};

std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * (static_cast<float>(i % 977) - 488.0f) / 7.0f;
  return v;
}

// True if x is exactly a bf16 value (its low 16 bits are zero): what a bf16 round trip gives.
bool is_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return (bits & 0xFFFFu) == 0;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(NcclComm, AllReduceSumAndAverageOnOneRank) {
  TRIDENT_REQUIRE_GPU();
  OneRank r;
  EXPECT_EQ(r.comm->rank(), 0);
  EXPECT_EQ(r.comm->size(), 1);
  const size_t n = 100003;
  const auto host = ramp(n, 1.0f);
  DeviceBuffer<float> x(host);
  Work w = r.comm->all_reduce(x.get(), n);
  while (!w.test()) {
  }
  EXPECT_TRUE(bitwise_equal(x.download(), host));  // one rank: the sum is the input
  EXPECT_STREQ(w.record().op, "all_reduce");
  EXPECT_EQ(w.record().bytes, n * sizeof(float));
  EXPECT_GE(w.record().end, w.record().start);
  r.comm->all_reduce(x.get(), n, ReduceOp::kAvg, "bucket 0 (test)").wait();
  EXPECT_TRUE(bitwise_equal(x.download(), host));
  DeviceBuffer<int64_t> ints(std::vector<int64_t>{1, -2, int64_t{1} << 40});
  r.comm->all_reduce(ints.get(), 3).wait();
  EXPECT_EQ(ints.download()[2], int64_t{1} << 40);
}

TEST(NcclComm, Bf16AllReduceIsWithinBf16Precision) {
  TRIDENT_REQUIRE_GPU();
  NcclCommOptions o;
  o.grad_bf16 = true;
  OneRank r(o);
  const size_t n = 65537;
  const auto host = ramp(n, 0.01f);
  DeviceBuffer<float> x(host);
  r.comm->all_reduce(x.get(), n, ReduceOp::kAvg).wait();
  const auto got = x.download();
  bool any_rounded = false;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(got[i], host[i], 1e-2 * std::abs(host[i]) + 1e-6) << i;
    any_rounded = any_rounded || got[i] != host[i];
  }
  EXPECT_TRUE(any_rounded) << "the values did not travel as bf16";
  // A bigger buffer next grows the staging buffer on the stream.
  DeviceBuffer<float> y(ramp(3 * n, 1.0f));
  r.comm->all_reduce(y.get(), 3 * n).wait();
  EXPECT_NEAR(y.download()[12345], ramp(3 * n, 1.0f)[12345], 1e-2 * 70);
}

TEST(NcclComm, ReduceScatterAllGatherBroadcastOnOneRank) {
  TRIDENT_REQUIRE_GPU();
  OneRank r;
  const size_t n = 4099;
  const auto host = ramp(n, 2.0f);
  DeviceBuffer<float> send(host), recv(n), gathered(n);
  r.comm->reduce_scatter(send.get(), recv.get(), n).wait();
  EXPECT_TRUE(bitwise_equal(recv.download(), host));
  r.comm->all_gather(recv.get(), gathered.get(), n).wait();
  EXPECT_TRUE(bitwise_equal(gathered.download(), host));
  r.comm->all_gather(gathered.get(), gathered.get(), n).wait();  // in place
  EXPECT_TRUE(bitwise_equal(gathered.download(), host));
  r.comm->broadcast(gathered.get(), n, 0).wait();
  EXPECT_TRUE(bitwise_equal(gathered.download(), host));
  EXPECT_THROW(r.comm->send(send.get(), n, 0, /*tag=*/3), Error);
}

// The operation must see what the compute stream wrote before the mark, and the compute
// stream must see the operation's result after compute_waits_for_comm, with no host sync in
// between (Note [Gradient-ready events]). bf16 makes the operation visible on one rank.
TEST(NcclComm, OrdersWithTheComputeStream) {
  TRIDENT_REQUIRE_GPU();
  NcclCommOptions o;
  o.grad_bf16 = true;
  OneRank r(o);
  const size_t n = 1 << 22;
  const auto host = ramp(n, 0.01f);
  float* pinned = nullptr;
  TRIDENT_CUDA(cudaMallocHost(&pinned, n * sizeof(float)));
  std::memcpy(pinned, host.data(), n * sizeof(float));
  DeviceBuffer<float> x(n);
  x.zero();
  TRIDENT_CUDA(cudaMemcpyAsync(x.get(), pinned, n * sizeof(float), cudaMemcpyHostToDevice,
                               r.compute));
  auto mark = r.comm->mark_compute_ready();
  ASSERT_NE(mark, nullptr);
  r.comm->order_after(mark.get());
  Work w = r.comm->all_reduce(x.get(), n);
  r.comm->compute_waits_for_comm();
  TRIDENT_CUDA(cudaMemcpyAsync(pinned, x.get(), n * sizeof(float), cudaMemcpyDeviceToHost,
                               r.compute));
  TRIDENT_CUDA(cudaStreamSynchronize(r.compute));
  w.wait();
  // Near the input (the copy in came first) and bf16-rounded (the copy out came after the
  // cast back); a wrong order on either side gives zeros or the exact input.
  for (size_t i = 0; i < n; i += 997) {
    ASSERT_NEAR(pinned[i], host[i], 1e-2 * std::abs(host[i]) + 1e-6) << i;
    ASSERT_TRUE(is_bf16(pinned[i])) << i << ": " << pinned[i];
  }
  cudaFreeHost(pinned);
}

TEST(NcclComm, GradReducerAveragesDeviceGradients) {
  TRIDENT_REQUIRE_GPU();
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    NcclCommOptions o;
    o.grad_bf16 = bf16;
    OneRank r(o, "dp-nccl");
    const size_t counts[] = {1000, 3, 70000, 257, 4096, 1, 50000};
    std::vector<GradParam> params;
    size_t total = 0;
    for (size_t i = 0; i < std::size(counts); ++i) {
      params.push_back({"p" + std::to_string(i), total, counts[i]});
      total += counts[i];
    }
    const auto host = ramp(total, 0.01f);
    DeviceBuffer<float> grads(total), extra(std::vector<float>(9, 0.5f));
    GradReducerOptions ro;
    ro.first_bucket_bytes = 4 << 10;
    ro.bucket_bytes = 64 << 10;
    GradReducer reducer(*r.comm, grads.get(), params, ro);
    reducer.begin_step(true);
    // "Backward": each parameter's gradient is written on the compute stream, then marked.
    for (size_t i = 0; i < params.size(); ++i) {
      TRIDENT_CUDA(cudaMemcpyAsync(grads.get() + params[i].offset, host.data() + params[i].offset,
                                   params[i].count * sizeof(float), cudaMemcpyHostToDevice,
                                   r.compute));
      reducer.grad_ready(static_cast<int>(i));
    }
    reducer.add_extra(extra.get(), extra.size(), "extra");
    reducer.finish();
    // The host average over one rank is the input itself.
    std::vector<float> got(total);
    TRIDENT_CUDA(cudaMemcpyAsync(got.data(), grads.get(), total * sizeof(float),
                                 cudaMemcpyDeviceToHost, r.compute));
    TRIDENT_CUDA(cudaStreamSynchronize(r.compute));
    if (bf16) {
      for (size_t i = 0; i < total; ++i) {
        ASSERT_NEAR(got[i], host[i], 1e-2 * std::abs(host[i]) + 1e-6) << i;
        ASSERT_TRUE(is_bf16(got[i])) << i;
      }
    } else {
      EXPECT_TRUE(bitwise_equal(got, host));
    }
    EXPECT_EQ(extra.download()[8], 0.5f);
    const ReduceStats& s = reducer.stats();
    EXPECT_EQ(s.records.size(), reducer.buckets().size() + 1);
    EXPECT_EQ(s.bytes, (total + 9) * sizeof(float));
  }
}

TEST(NcclComm, ConstructedOverMpiCommSelf) {
  TRIDENT_REQUIRE_GPU();
  ensure_mpi();
  TRIDENT_CUDA(cudaSetDevice(0));
  cudaStream_t compute = nullptr;
  TRIDENT_CUDA(cudaStreamCreate(&compute));
  {
    NcclComm comm(MPI_COMM_SELF, "self-nccl", compute);
    EXPECT_EQ(comm.size(), 1);
    DeviceBuffer<double> x(std::vector<double>{1.5, -2.25});
    comm.all_reduce(x.get(), 2, ReduceOp::kAvg).wait();
    EXPECT_EQ(x.download()[1], -2.25);
  }
  cudaStreamDestroy(compute);
}

// A receive nobody sends to can only end at the timeout: an Error naming the operation, the
// communicator and the rank, and an aborted communicator that refuses further work.
TEST(NcclComm, StuckOperationTimesOutAndAborts) {
  TRIDENT_REQUIRE_GPU();
  NcclCommOptions o;
  o.timeout_s = 2;
  OneRank r(o, "stuck-nccl");
  DeviceBuffer<float> x(16);
  try {
    r.comm->recv(x.get(), 16, 0).wait();
    ADD_FAILURE() << "a receive without a send completed";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'stuck-nccl'"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 0 of 1"), std::string::npos) << what;
  }
  EXPECT_TRUE(r.comm->aborted());
  EXPECT_THROW(r.comm->all_reduce(x.get(), 16), Error);
}

}  // namespace
}  // namespace trident
