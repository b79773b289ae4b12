// The link, overlap and core-sharing figures, collective over MPI (Note [Calibration] in
// bench/calibrate.h).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "bench/calibrate.h"
#include "trident/check.h"

namespace trident::calibration {
namespace {

using Clock = std::chrono::steady_clock;

// Square operands in backend memory, filled with small varied values (no denormals).
struct GemmOperands {
  GemmOperands(Backend& be, int d)
      : inp(be, size_t(d) * d), w(be, size_t(d) * d), out(be, size_t(d) * d) {
    std::vector<float> host(size_t(d) * d);
    for (size_t i = 0; i < host.size(); ++i) host[i] = float(i % 13) * 0.01f - 0.06f;
    be.copy(inp.data(), host.data(), host.size() * sizeof(float));
    for (size_t i = 0; i < host.size(); ++i) host[i] = float(i % 7) * 0.02f - 0.06f;
    be.copy(w.data(), host.data(), host.size() * sizeof(float));
  }
  BackendBuffer<float> inp, w, out;
};

// The slowest rank's time of `body` (every rank runs it; it issues the same collectives).
template <typename Body>
double timed_on_all(MPI_Comm world, Body&& body) {
  TRIDENT_MPI(MPI_Barrier(world));
  const auto t0 = Clock::now();
  body();
  double s = seconds_since(t0), slowest = 0;
  TRIDENT_MPI(MPI_Allreduce(&s, &slowest, 1, MPI_DOUBLE, MPI_MAX, world));
  return slowest;
}

// Every rank contributes rank+1; the sum must be n(n+1)/2 everywhere.
void validate_all_reduce(MpiComm& comm) {
  std::vector<float> v(1000, float(comm.rank() + 1));
  comm.all_reduce(v.data(), v.size()).wait();
  const float want = float(comm.size()) * float(comm.size() + 1) / 2;
  for (float x : v)
    TRIDENT_CHECK(x == want, "calibration: all-reduce over {} gave {} instead of {}", comm.name(),
                  x, want);
}

// GEMM FLOP/s of 512³ products on this thread for about `seconds`.
double gemm_window(Backend& be, GemmOperands& ops, double seconds) {
  const int d = 512;
  int count = 0;
  const auto t0 = Clock::now();
  while (seconds_since(t0) < seconds) {
    be.matmul_forward(ops.out.data(), ops.inp.data(), ops.w.data(), nullptr, d, d, d);
    ++count;
  }
  return 2.0 * d * double(d) * d * count / seconds_since(t0);
}

// All-reduces of 16 MiB until rank 0 asks to stop; the flag travels in the last element, so
// every rank runs the same number of operations.
void all_reduce_until_stopped(MpiComm& comm, const std::atomic<bool>& stop) {
  std::vector<float> buffer((16u << 20) / sizeof(float) + 1, 0.5f);
  for (;;) {
    buffer.back() = comm.rank() == 0 && stop.load() ? 1.0f : 0.0f;
    comm.all_reduce(buffer.data(), buffer.size()).wait();
    if (buffer.back() > 0) return;
  }
}

}  // namespace

void quiet_barrier(MPI_Comm comm) {
  MPI_Request request;
  TRIDENT_MPI(MPI_Ibarrier(comm, &request));
  for (int polls = 0;; ++polls) {
    int done = 0;
    TRIDENT_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    const auto pause = progress_backoff(polls);
    if (pause.count() == 0) std::this_thread::yield();
    else std::this_thread::sleep_for(pause);
  }
}

// Note [Calibration]: timed as nccl-tests times (the slowest rank; busbw = algbw · 2(n−1)/n),
// so that the planner's formula (Note [Hardware files]) reproduces both measured times.
LinkSpec measure_link(MpiComm& comm, MPI_Comm world, size_t large_bytes, int reps) {
  validate_all_reduce(comm);
  const int n = comm.size();
  const double hops = 2.0 * (n - 1);
  float one = 1;
  double small = 1e30;
  for (int batch = 0; batch < 5; ++batch) {
    const int ops = 40;
    small = std::min(small, timed_on_all(world, [&] {
                              for (int i = 0; i < ops; ++i) comm.all_reduce(&one, 1).wait();
                            }) / ops);
  }
  std::vector<float> big(large_bytes / sizeof(float), 1.0f);
  comm.all_reduce(big.data(), big.size()).wait();  // warm-up: buffers, registration
  double large = 1e30;
  for (int r = 0; r < reps; ++r)
    large = std::min(large,
                     timed_on_all(world, [&] { comm.all_reduce(big.data(), big.size()).wait(); }));
  LinkSpec link;
  link.latency_us = round_sig(small / hops * 1e6);
  const double wire_s = std::max(large - small, large * 0.5);  // small = all its hops' latency
  link.gbytes_per_s = round_sig(hops / n * double(big.size() * sizeof(float)) / wire_s / 1e9);
  return link;
}

double OverlapRates::slowdown() const {
  return alone > 0 ? std::clamp(1 - with_comm / alone, 0.0, 0.99) : 0;
}

// Windows alternated, the best of each kept, inside rank 0's binding (mpirun's default: one
// core, shared by both threads, as in training).
OverlapRates measure_overlap(Backend& be, MpiComm* comm, MPI_Comm world) {
  const bool lead = comm == nullptr || comm->rank() == 0;
  OverlapRates rates;
  std::unique_ptr<GemmOperands> ops;
  if (lead) ops = std::make_unique<GemmOperands>(be, 512);
  for (int round = 0; round < 2; ++round) {
    if (lead) rates.alone = std::max(rates.alone, gemm_window(be, *ops, 0.4));
    quiet_barrier(world);
    std::atomic<bool> stop{false};
    std::thread communication([&] {
      if (comm) {
        all_reduce_until_stopped(*comm, stop);
      } else {
        std::vector<char> src(16u << 20, 1), dst(16u << 20);
        while (!stop.load()) std::memcpy(dst.data(), src.data(), src.size());
      }
    });
    if (lead) {
      rates.with_comm = std::max(rates.with_comm, gemm_window(be, *ops, 0.4));
      stop = true;
    }
    communication.join();
  }
  return rates;
}

double measure_core_scaling(Backend& be, MPI_Comm world, int size, double alone) {
  GemmOperands ops(be, 512);
  double best = 0;
  for (int round = 0; round < 2; ++round) {
    TRIDENT_MPI(MPI_Barrier(world));
    double rate = gemm_window(be, ops, 0.4), sum = 0;
    TRIDENT_MPI(MPI_Allreduce(&rate, &sum, 1, MPI_DOUBLE, MPI_SUM, world));
    best = std::max(best, sum / size);
  }
  return std::clamp(best / alone, 0.01, 1.0);
}

}  // namespace trident::calibration
