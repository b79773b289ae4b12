// NcclComm on one GPU: a one-rank communicator (a machine with one GPU can run no more: NCCL
// refuses two ranks on one device). A one-rank sum is the identity, and NCCL does not even
// launch a kernel for an in-place one (it copies only when send != recv), so value checks
// alone cannot tell a working NcclComm from one that enqueued nothing. Two things make these
// tests able to fail (Note [Recording NCCL calls]): every NCCL collective NcclComm issues is
// recorded with its arguments (buffer, count, type, operation, stream), and while a test asks
// for it every sum is doubled inside NCCL, so an all-reduce that really went through NCCL,
// over the right elements, back into the right buffer, reads 2x where a no-op reads x.
// Out-of-place results land in NaN-poisoned buffers. Several ranks, one per GPU, are covered
// by test_nccl_collectives.cpp.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "gpu_test_util.h"
#include "kernel_checks.h"
#include "trident/grad_reducer.h"
#include "trident/nccl_comm.h"

// Note [Recording NCCL calls]
// This file defines NCCL's collective entry points itself: NCCL exports each as a weak ncclX
// and a strong pncclX (like MPI's PMPI), so these win for every call from this executable and
// forward to pncclX. While an NcclCallLog is alive each call is appended to it; otherwise calls
// pass straight through, so the other GPU tests are unaffected. The log is process-wide (an
// entry point has no other way to find it): one at a time, under a mutex, since the GradReducer
// calls NCCL from its communication thread.
//
// A log made with double_sums = true replaces ncclSum by a pre-multiplied sum with scalar 2
// (ncclRedOpCreatePreMulSum) for float, double and bf16 reductions: on one rank that is what a
// sum over two ranks holding the same data gives.
namespace trident {
namespace {

struct NcclCall {
  const char* op = "";  // "AllReduce", "ReduceScatter", "AllGather", "Broadcast"
  const void* send = nullptr;
  const void* recv = nullptr;
  size_t count = 0;  // as passed: ReduceScatter's per-rank recvcount, AllGather's sendcount
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t red_op = ncclSum;  // reductions only; as NcclComm asked, before any doubling
  int root = -1;                 // Broadcast only
  cudaStream_t stream = nullptr;
};

struct CallLogState {
  std::mutex mutex;
  bool active = false;
  bool double_sums = false;
  std::vector<NcclCall> calls;
};
CallLogState& call_log_state() {
  static CallLogState state;
  return state;
}

class NcclCallLog {
 public:
  explicit NcclCallLog(bool double_sums) {
    CallLogState& s = call_log_state();
    std::lock_guard lock(s.mutex);
    TRIDENT_CHECK(!s.active, "one NcclCallLog at a time");
    s.active = true;
    s.double_sums = double_sums;
    s.calls.clear();
  }
  ~NcclCallLog() {
    CallLogState& s = call_log_state();
    std::lock_guard lock(s.mutex);
    s.active = false;
  }
  NcclCallLog(const NcclCallLog&) = delete;
  NcclCallLog& operator=(const NcclCallLog&) = delete;
  std::vector<NcclCall> calls() const {
    CallLogState& s = call_log_state();
    std::lock_guard lock(s.mutex);
    return s.calls;
  }
};

// Records `call` if a log is active; true if its sum is to be doubled.
bool log_nccl_call(const NcclCall& call, bool reduction) {
  CallLogState& s = call_log_state();
  std::lock_guard lock(s.mutex);
  if (!s.active) return false;
  s.calls.push_back(call);
  const bool floating =
      call.type == ncclFloat32 || call.type == ncclFloat64 || call.type == ncclBfloat16;
  return reduction && s.double_sums && call.red_op == ncclSum && floating;
}

// The operator "2 × x, summed", its scalar read from the host during this call.
ncclResult_t create_times_two(ncclRedOp_t* op, ncclDataType_t type, ncclComm_t comm) {
  float f32 = 2.0f;
  double f64 = 2.0;
  uint16_t b16 = 0x4000;  // 2.0 in bf16
  void* scalar = type == ncclFloat32   ? static_cast<void*>(&f32)
                 : type == ncclFloat64 ? static_cast<void*>(&f64)
                                       : static_cast<void*>(&b16);
  return pncclRedOpCreatePreMulSum(op, scalar, type, ncclScalarHostImmediate, comm);
}

// An operator may be destroyed once the call using it has returned, which for a non-blocking
// communicator means once its state left ncclInProgress (Note [NCCL without hangs]).
ncclResult_t destroy_after_enqueue(ncclRedOp_t op, ncclComm_t comm, ncclResult_t rc) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress && std::chrono::steady_clock::now() < give_up)
    if (pncclCommGetAsyncError(comm, &state) != ncclSuccess) break;
  const ncclResult_t destroyed = pncclRedOpDestroy(op, comm);
  if (rc != ncclSuccess && rc != ncclInProgress) return rc;
  return destroyed != ncclSuccess ? destroyed : rc;
}

}  // namespace
}  // namespace trident

extern "C" ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count,
                                      ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                      cudaStream_t stream) {
  if (!trident::log_nccl_call({"AllReduce", send, recv, count, type, op, -1, stream}, true))
    return pncclAllReduce(send, recv, count, type, op, comm, stream);
  ncclRedOp_t times_two;
  const ncclResult_t rc = trident::create_times_two(&times_two, type, comm);
  if (rc != ncclSuccess) return rc;
  return trident::destroy_after_enqueue(
      times_two, comm, pncclAllReduce(send, recv, count, type, times_two, comm, stream));
}

extern "C" ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recv_count,
                                          ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                          cudaStream_t stream) {
  if (!trident::log_nccl_call({"ReduceScatter", send, recv, recv_count, type, op, -1, stream},
                              true))
    return pncclReduceScatter(send, recv, recv_count, type, op, comm, stream);
  ncclRedOp_t times_two;
  const ncclResult_t rc = trident::create_times_two(&times_two, type, comm);
  if (rc != ncclSuccess) return rc;
  return trident::destroy_after_enqueue(
      times_two, comm, pncclReduceScatter(send, recv, recv_count, type, times_two, comm, stream));
}

extern "C" ncclResult_t ncclAllGather(const void* send, void* recv, size_t send_count,
                                      ncclDataType_t type, ncclComm_t comm, cudaStream_t stream) {
  trident::log_nccl_call({"AllGather", send, recv, send_count, type, ncclSum, -1, stream}, false);
  return pncclAllGather(send, recv, send_count, type, comm, stream);
}

extern "C" ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count,
                                      ncclDataType_t type, int root, ncclComm_t comm,
                                      cudaStream_t stream) {
  trident::log_nccl_call({"Broadcast", send, recv, count, type, ncclSum, root, stream}, false);
  return pncclBroadcast(send, recv, count, type, root, comm, stream);
}

namespace trident {
namespace {

using testing::bf16_round;
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
[[maybe_unused]] auto* const kMpiFinalizer = ::testing::AddGlobalTestEnvironment(new MpiFinalizer);

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

// factor × x, or factor × bf16(x): exact, since doubling a float or a bf16 is.
std::vector<float> scaled(const std::vector<float>& x, float factor, bool through_bf16) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = factor * (through_bf16 ? bf16_round(x[i]) : x[i]);
  return out;
}

// Bitwise equality, reporting the first element that differs.
::testing::AssertionResult same_bits(const std::vector<float>& got,
                                     const std::vector<float>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " elements, want " << want.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure()
             << "element " << i << " is " << got[i] << ", want " << want[i];
  return ::testing::AssertionSuccess();
}

// Exactly one logged call, checked field by field.
void expect_one_call(const std::vector<NcclCall>& calls, const char* op, const void* send,
                     const void* recv, size_t count, ncclDataType_t type, ncclRedOp_t red_op,
                     cudaStream_t stream) {
  ASSERT_EQ(calls.size(), 1u) << "NCCL calls for one " << op;
  const NcclCall& c = calls[0];
  EXPECT_STREQ(c.op, op);
  if (send) EXPECT_EQ(c.send, send);
  if (recv) EXPECT_EQ(c.recv, recv);
  EXPECT_EQ(c.count, count);
  EXPECT_EQ(c.type, type);
  EXPECT_EQ(c.red_op, red_op);
  EXPECT_EQ(c.stream, stream) << "not on the communicator's stream";
}

TEST(NcclComm, AllReduceReachesNcclOnOneRank) {
  TRIDENT_REQUIRE_GPU();
  OneRank r;
  EXPECT_EQ(r.comm->rank(), 0);
  EXPECT_EQ(r.comm->size(), 1);
  const size_t n = 100003;
  const auto host = ramp(n, 1.0f);
  DeviceBuffer<float> x(host);
  {
    NcclCallLog log(/*double_sums=*/true);
    Work w = r.comm->all_reduce(x.get(), n);
    while (!w.test()) {
    }
    EXPECT_TRUE(same_bits(x.download(), scaled(host, 2, false)));
    expect_one_call(log.calls(), "AllReduce", x.get(), x.get(), n, ncclFloat32, ncclSum,
                    r.comm->stream());
    EXPECT_STREQ(w.record().op, "all_reduce");
    EXPECT_EQ(w.record().bytes, n * sizeof(float));
    EXPECT_GE(w.record().end, w.record().start);
  }
  {
    NcclCallLog log(true);  // integers are not doubled
    DeviceBuffer<int64_t> ints(std::vector<int64_t>{1, -2, int64_t{1} << 40});
    r.comm->all_reduce(ints.get(), 3).wait();
    EXPECT_EQ(ints.download()[2], int64_t{1} << 40);
    expect_one_call(log.calls(), "AllReduce", ints.get(), ints.get(), 3, ncclInt64, ncclSum,
                    r.comm->stream());
  }
}

// comm.grad_dtype bf16: cast on the communication stream, summed in bf16, cast back. With the
// sum doubled the result is exactly 2 × bf16(x): the cast, the NCCL call on the staging buffer
// and the cast back all happened, in that order, over every element.
TEST(NcclComm, Bf16AllReduceSumsInBf16) {
  TRIDENT_REQUIRE_GPU();
  NcclCommOptions o;
  o.grad_bf16 = true;
  OneRank r(o);
  const size_t n = 65537;
  const auto host = ramp(n, 0.01f);
  DeviceBuffer<float> x(host);
  {
    NcclCallLog log(true);
    r.comm->all_reduce(x.get(), n, ReduceOp::kSum, "bucket 0 (test)").wait();
    EXPECT_TRUE(same_bits(x.download(), scaled(host, 2, true)));
    const auto calls = log.calls();
    expect_one_call(calls, "AllReduce", nullptr, nullptr, n, ncclBfloat16, ncclSum,
                    r.comm->stream());
    if (!calls.empty()) {
      EXPECT_EQ(calls[0].send, calls[0].recv) << "in place in the staging buffer";
      EXPECT_NE(calls[0].recv, static_cast<const void*>(x.get())) << "not staged as bf16";
    }
  }
  // A bigger buffer next grows the staging buffer on the stream.
  const auto big = ramp(3 * n, 1.0f);
  DeviceBuffer<float> y(big);
  NcclCallLog log(true);
  r.comm->all_reduce(y.get(), 3 * n).wait();
  EXPECT_TRUE(same_bits(y.download(), scaled(big, 2, true)));
  expect_one_call(log.calls(), "AllReduce", nullptr, nullptr, 3 * n, ncclBfloat16, ncclSum,
                  r.comm->stream());
}

TEST(NcclComm, ReduceScatterAllGatherBroadcastOnOneRank) {
  TRIDENT_REQUIRE_GPU();
  OneRank r;
  const size_t n = 4099;
  const auto host = ramp(n, 2.0f);
  const auto doubled = scaled(host, 2, false);
  DeviceBuffer<float> send(host), recv(n), gathered(n);  // recv, gathered: NaN
  {
    NcclCallLog log(true);
    r.comm->reduce_scatter(send.get(), recv.get(), n).wait();
    EXPECT_TRUE(same_bits(recv.download(), doubled));
    expect_one_call(log.calls(), "ReduceScatter", send.get(), recv.get(), n, ncclFloat32, ncclSum,
                    r.comm->stream());
  }
  {
    NcclCallLog log(true);
    r.comm->all_gather(recv.get(), gathered.get(), n).wait();
    EXPECT_TRUE(same_bits(gathered.download(), doubled));
    expect_one_call(log.calls(), "AllGather", recv.get(), gathered.get(), n, ncclFloat32, ncclSum,
                    r.comm->stream());
  }
  {
    NcclCallLog log(true);
    r.comm->all_gather(gathered.get(), gathered.get(), n).wait();  // in place
    EXPECT_TRUE(same_bits(gathered.download(), doubled));
    expect_one_call(log.calls(), "AllGather", gathered.get(), gathered.get(), n, ncclFloat32,
                    ncclSum, r.comm->stream());
  }
  {
    NcclCallLog log(true);
    r.comm->broadcast(gathered.get(), n, 0).wait();
    EXPECT_TRUE(same_bits(gathered.download(), doubled));
    const auto calls = log.calls();
    expect_one_call(calls, "Broadcast", gathered.get(), gathered.get(), n, ncclFloat32, ncclSum,
                    r.comm->stream());
    if (!calls.empty()) EXPECT_EQ(calls[0].root, 0);
  }
  EXPECT_THROW(r.comm->send(send.get(), n, 0, /*tag=*/3), Error);
}

// The operation must see what the compute stream wrote before the mark, and the compute
// stream must see the operation's result after compute_waits_for_comm, with no host sync in
// between (Note [Gradient-ready events]). A wrong order before the operation gives 2 × 0, a
// wrong order after it the zeros or the input itself; only the right order gives 2 × bf16(x).
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
  NcclCallLog log(true);
  TRIDENT_CUDA(
      cudaMemcpyAsync(x.get(), pinned, n * sizeof(float), cudaMemcpyHostToDevice, r.compute));
  auto mark = r.comm->mark_compute_ready();
  ASSERT_NE(mark, nullptr);
  r.comm->order_after(mark.get());
  Work w = r.comm->all_reduce(x.get(), n);
  r.comm->compute_waits_for_comm();
  TRIDENT_CUDA(
      cudaMemcpyAsync(pinned, x.get(), n * sizeof(float), cudaMemcpyDeviceToHost, r.compute));
  TRIDENT_CUDA(cudaStreamSynchronize(r.compute));
  w.wait();
  std::vector<float> got(pinned, pinned + n);
  cudaFreeHost(pinned);
  EXPECT_TRUE(same_bits(got, scaled(host, 2, true)));
}

// The GradReducer over device gradients (it sums: Note [Average in the loss seed]), fp32 and
// bf16. With sums doubled, every gradient element must read exactly 2x: a bucket left out reads
// x, one reduced twice 4x. In fp32 the logged calls must also tile the gradient buffer exactly,
// bucket by bucket.
TEST(NcclComm, GradReducerReducesEveryGradientOnce) {
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
    NcclCallLog log(true);
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
    std::vector<float> got(total);
    TRIDENT_CUDA(cudaMemcpyAsync(got.data(), grads.get(), total * sizeof(float),
                                 cudaMemcpyDeviceToHost, r.compute));
    TRIDENT_CUDA(cudaStreamSynchronize(r.compute));
    EXPECT_TRUE(same_bits(got, scaled(host, 2, bf16)));
    EXPECT_EQ(extra.download()[8], 2 * 0.5f);

    const ReduceStats& s = reducer.stats();
    EXPECT_EQ(s.records.size(), reducer.buckets().size() + 1);
    EXPECT_EQ(s.bytes, (total + 9) * sizeof(float));
    auto calls = log.calls();
    ASSERT_EQ(calls.size(), reducer.buckets().size() + 1) << "one NCCL call per bucket";
    size_t logged = 0;
    for (const NcclCall& c : calls) {
      EXPECT_STREQ(c.op, "AllReduce");
      EXPECT_EQ(c.type, bf16 ? ncclBfloat16 : ncclFloat32);
      EXPECT_EQ(c.red_op, ncclSum);
      logged += c.count;
    }
    EXPECT_EQ(logged, total + 9);
    if (!bf16) {
      // Sorted by address, the gradient buffer's calls must tile [0, total) and the last
      // one be the extra buffer.
      std::sort(calls.begin(), calls.end(),
                [](const NcclCall& a, const NcclCall& b) { return a.recv < b.recv; });
      int extra_calls = 0;
      size_t next = 0;
      for (const NcclCall& c : calls) {
        if (c.recv == static_cast<const void*>(extra.get())) {
          ++extra_calls;
          EXPECT_EQ(c.count, 9u);
          continue;
        }
        const auto* start = static_cast<const float*>(c.recv);
        EXPECT_EQ(start, grads.get() + next) << "a gap or an overlap at element " << next;
        EXPECT_EQ(c.send, c.recv);
        next = static_cast<size_t>(start - grads.get()) + c.count;
      }
      EXPECT_EQ(next, total);
      EXPECT_EQ(extra_calls, 1);
    }
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
    NcclCallLog log(true);
    comm.all_reduce(x.get(), 2).wait();
    EXPECT_EQ(x.download()[1], -4.5);
    expect_one_call(log.calls(), "AllReduce", x.get(), x.get(), 2, ncclFloat64, ncclSum,
                    comm.stream());
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
