// Measurements of this machine for its hardware description (`trident plan --calibrate`,
// src/app/calibrate_cmd.cpp; the file: Note [Hardware files] in src/plan/hardware.cpp). Each
// measurement validates its result before it times (house rule 8). One rank's compute and
// memory figures: calibrate_node.cpp; the link, overlap and core-sharing figures over MPI:
// calibrate_link.cpp. What each one measures, in detail: docs/plan.md, "Calibration".
//
// Note [Calibration]
// Each figure is what a training step gets, not a best case: linear layers, elementwise ops,
// AdamW and a small GPT through trident's own CPU backend and model, operands from memory; a
// STREAM triad; MpiComm's ring all-reduce; a GEMM beside the communication thread. Compute
// figures are MEDIANS (of runs, then of rounds): a step sees the typical rate, and on a shared
// machine the best run overstated whole steps. Ranks other than 0 wait in quiet_barrier.
#pragma once

#include <mpi.h>
#include <sched.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <vector>

#include "trident/backend.h"
#include "trident/comm.h"
#include "trident/plan.h"

namespace trident::calibration {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// 4 significant digits: what the file needs, and equal values stay equal after rounding.
double round_sig(double x);

// A barrier that sleeps while it waits, so the waiting ranks leave the cores to rank 0.
void quiet_barrier(MPI_Comm comm);

// mpirun binds each rank to one core by default, and threads inherit their creator's mask;
// node figures (the triad, a thread per core) may use every online core while this lives.
class AllCoresWhileAlive {
 public:
  explicit AllCoresWhileAlive(int cores);
  ~AllCoresWhileAlive();
  AllCoresWhileAlive(const AllCoresWhileAlive&) = delete;
  AllCoresWhileAlive& operator=(const AllCoresWhileAlive&) = delete;

 private:
  cpu_set_t saved_;
  bool saved_ok_ = false;
};

// ---- One rank (calibrate_node.cpp) -----------------------------------------------------------

// matmul_forward against a naive loop on an odd shape; run before anything is timed.
void validate_matmul(Backend& be);

// One round of the compute figures: the linear-layer points, the elementwise and AdamW rates,
// and the small GPT's time on one thread and on a thread per core.
struct ComputeRound {
  std::vector<GemmPoint> gemm;
  double elementwise_gbytes_per_s = 0, optimizer_gbytes_per_s = 0;
  double small_gpt_s = 0, small_gpt_all_threads_s = 0;  // forward + backward, 1 / all threads
  double host_copy_gbytes_per_s = 0;                    // measure_snapshot_copy
};

constexpr int kComputeRounds = 3;

// kComputeRounds rounds on `single` (a one-thread backend), `after_round(round, figures)`
// after each; then hw's gemm points, peak_tflops, elementwise and optimizer rates,
// compute_efficiency, thread_scaling (cores > 1) and host_copy_gbytes_per_s (with its line in
// hw.sources) from the rounds' medians, 4 digits.
void measure_compute(Backend& single, int cores, Hardware& hw,
                     const std::function<void(int, const ComputeRound&)>& after_round);

// STREAM triad on `threads` threads over three arrays of n doubles: GB/s, best of 10, counted
// as 24 bytes per element.
double measure_triad(int threads, size_t n);

// A checkpoint snapshot's copy (Note [Plan checkpoint snapshot] in src/plan/memory.cpp): one
// thread's memcpy of `bytes` into a buffer touched beforehand, as a snapshot buffer allocated
// once is; GB/s of bytes copied, median of 5.
double measure_snapshot_copy(size_t bytes);

// One thread's memcpy rate (GB/s, bytes copied): the single-rank stand-in for a transport.
double measure_copy(size_t bytes);

// ---- Over MPI (calibrate_link.cpp) -----------------------------------------------------------

// Ring all-reduce figures of `comm` after a sum check: latency per hop from one-float
// all-reduces, bus bandwidth from `large_bytes` ones with that latency taken out (the slowest
// rank's time, best of `reps`). Collective over world and comm.
LinkSpec measure_link(MpiComm& comm, MPI_Comm world, size_t large_bytes, int reps);

struct OverlapRates {
  double alone = 0, with_comm = 0;  // FLOP/s
  double slowdown() const;
};

// Rank 0 times 512³ GEMM windows alone and with its communication thread running 16 MiB
// all-reduces; the other ranks only take part in the all-reduces. comm null: one rank, a thread
// copying 16 MiB buffers stands in. Collective over world.
OverlapRates measure_overlap(Backend& be, MpiComm* comm, MPI_Comm world);

// Every rank computes 512³ GEMMs on one thread at the same time: the mean rate over the ranks
// against rank 0's rate `alone` (Hardware::core_scaling). Best of two windows.
double measure_core_scaling(Backend& be, MPI_Comm world, int size, double alone);

}  // namespace trident::calibration
