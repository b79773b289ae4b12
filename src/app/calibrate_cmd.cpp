// `trident plan --calibrate`: measures this machine and writes its hardware description
// (kind: cpu, dtype: fp32; Note [Hardware files] in src/plan/hardware.cpp).
//
// Note [Calibration]
// What is measured, and how, so that the figures are what a training step gets:
//  - gemm points: one linear layer as training runs it, through the CPU backend's own
//    matmul_forward and matmul_backward (OpenBLAS as the backend drives it, Note [GEMM
//    threading]), [4d, d] → 4d at d = 32 … 1024 (d the smallest dimension), one thread; a run
//    repeats the layer until it lasts ≥ 20 ms and the MEDIAN run counts: the best run (the
//    first calibration's choice) was 1.5-2× what whole training steps got on a shared VM
//    (docs/plan.md). matmul_forward is checked against a naive loop before any timing.
//    peak_tflops is the best point (the MFU denominator per core).
//  - elementwise_gbytes_per_s: trident's LayerNorm and GELU kernels on one thread, counted as
//    the plan model counts their traffic (median).
//  - thread_scaling: the small GPT below on a thread per core against one thread (a lone large
//    GEMM scaled 0.7-0.9 here, whole training steps far less); core_scaling: a 512³ GEMM on one
//    thread in every rank at once against one rank alone.
//  - memory_gbytes_per_s: a STREAM triad a = b + s·c over three 64 MiB double arrays (far
//    beyond any cache) on all threads, counted as STREAM does (24 bytes per element), with
//    rank 0 let out of mpirun's one-core binding for it (a node figure).
//  - intra_node: trident's MpiComm ring all-reduce between the ranks (MPI_Iallreduce, libnbc's
//    ring as main selects it), timed as nccl-tests times: the slowest rank's time, busbw =
//    algbw · 2(n−1)/n. The latency is a one-float all-reduce's time / 2(n−1) (per ring hop);
//    the bandwidth comes from a 64 MiB all-reduce with that latency taken out, so the planner's
//    formula (Note [Hardware files]) reproduces both measured times.
//  - inter_node: the same through the emulated link (MpiComm::set_emulated_link) when
//    --emulate-gbps is given; otherwise a copy of intra_node (one node; sources says so).
//  - overlap_slowdown: 1 − (GEMM rate while this rank's communication thread runs all-reduces)
//    / (GEMM rate alone), windows alternated and the best of each kept, inside rank 0's binding
//    (mpirun's default: one core, shared by both threads, as in training). With one rank there is
//    no peer: a thread copying 16 MiB buffers stands in for the transport's copies.
// Ranks other than 0 wait in a barrier that sleeps (quiet_barrier), so rank 0's single-thread
// and all-thread figures see idle cores. Only rank 0 writes the file.
#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "app/commands.h"
#include "app/run_setup.h"
#include "trident/backend.h"
#include "trident/blas_core.h"
#include "trident/check.h"
#include "trident/comm.h"
#include "trident/peak_check.h"
#include "trident/model.h"
#include "trident/plan.h"

namespace trident {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// 4 significant digits: what the file needs, and equal values stay equal after rounding.
double round_sig(double x) {
  if (x == 0) return 0;
  const double scale = std::pow(10.0, 3 - std::floor(std::log10(std::fabs(x))));
  return std::round(x * scale) / scale;
}

template <typename... Args>
void progress(bool lead, fmt::format_string<Args...> f, Args&&... args) {
  if (!lead) return;
  std::fputs(("calibrate: " + fmt::format(f, std::forward<Args>(args)...) + "\n").c_str(), stdout);
  std::fflush(stdout);
}

// A barrier that sleeps while it waits, so the waiting ranks leave the cores to rank 0.
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

// ---- GEMM ------------------------------------------------------------------------------------

// Square operands in backend memory, filled with small varied values (no denormals).
struct GemmOperands {
  GemmOperands(Backend& be, int d) : inp(be, size_t(d) * d), w(be, size_t(d) * d), out(be, size_t(d) * d) {
    std::vector<float> host(size_t(d) * d);
    for (size_t i = 0; i < host.size(); ++i) host[i] = float(i % 13) * 0.01f - 0.06f;
    be.copy(inp.data(), host.data(), host.size() * sizeof(float));
    for (size_t i = 0; i < host.size(); ++i) host[i] = float(i % 7) * 0.02f - 0.06f;
    be.copy(w.data(), host.data(), host.size() * sizeof(float));
  }
  BackendBuffer<float> inp, w, out;
};

// matmul_forward against a naive loop on an odd shape, before anything is timed.
void validate_matmul(Backend& be) {
  const int N = 37, C = 29, OC = 43;
  std::vector<float> inp(size_t(N) * C), w(size_t(OC) * C), out(size_t(N) * OC);
  for (size_t i = 0; i < inp.size(); ++i) inp[i] = float(int(i % 11) - 5) * 0.125f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(int(i % 5) - 2) * 0.25f;
  BackendBuffer<float> d_inp(be, inp.size()), d_w(be, w.size()), d_out(be, out.size());
  be.copy(d_inp.data(), inp.data(), inp.size() * sizeof(float));
  be.copy(d_w.data(), w.data(), w.size() * sizeof(float));
  be.matmul_forward(d_out.data(), d_inp.data(), d_w.data(), nullptr, N, C, OC);
  be.copy(out.data(), d_out.data(), out.size() * sizeof(float));
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double ref = 0;
      for (int c = 0; c < C; ++c) ref += double(inp[size_t(n) * C + c]) * w[size_t(o) * C + c];
      const double got = out[size_t(n) * OC + o];
      TRIDENT_CHECK(std::fabs(got - ref) <= 1e-4 * (1 + std::fabs(ref)),
                    "calibration: matmul_forward[{}, {}] = {} but the naive product is {}", n, o,
                    got, ref);
    }
}

struct GemmRate {
  double flops = 0;  // FLOP/s (the median run)
  int runs = 0;
};

// A linear layer as training on a CPU runs it: forward y[N,8d] = x[N,2d]·Wᵀ (+ bias) and
// backward's dx and dW (matmul_backward), with N = d tokens the smallest dimension (CPU
// micro-batches are small; the MLP is 4× wider than the model). FLOP/s of
// the 6·N·d·4d operations, the MEDIAN of the runs (a training step sees the typical rate, not
// the best; Note [Calibration]).
GemmRate time_linear(Backend& be, int d, double budget_s) {
  const size_t N = size_t(d), C = size_t(2) * d, OC = size_t(8) * d;
  auto filled = [&](size_t n, float scale) {
    BackendBuffer<float> b(be, n);
    std::vector<float> host(n);
    for (size_t i = 0; i < n; ++i) host[i] = float(i % 11) * scale - 0.05f;
    be.copy(b.data(), host.data(), n * sizeof(float));
    return b;
  };
  // Training's operands come from memory, not from cache: a model's weights and activations
  // are far larger than it. The layer runs over enough copies to pass 128 MiB, in turn.
  struct Layer {
    BackendBuffer<float> x, w, bias, y, dy, dx, dw, db;
  };
  const size_t bytes = 4 * (2 * N * C + 2 * OC * C + 2 * N * OC + 2 * OC);
  const size_t copies = std::max<size_t>(1, (size_t(128) << 20) / bytes);
  std::vector<Layer> layers;
  for (size_t i = 0; i < copies; ++i)
    layers.push_back({filled(N * C, 0.01f), filled(OC * C, 0.02f), filled(OC, 0.01f),
                      filled(N * OC, 0.0f), filled(N * OC, 0.01f), filled(N * C, 0.0f),
                      filled(OC * C, 0.0f), filled(OC, 0.0f)});
  size_t next = 0;
  auto layer = [&] {
    Layer& l = layers[next++ % copies];
    be.matmul_forward(l.y.data(), l.x.data(), l.w.data(), l.bias.data(), int(N), int(C), int(OC));
    be.matmul_backward(l.dx.data(), l.dw.data(), l.db.data(), l.dy.data(), l.x.data(),
                       l.w.data(), int(N), int(C), int(OC));
  };
  auto t0 = Clock::now();
  for (size_t i = 0; i < copies; ++i) layer();  // first touch
  const double once = std::max(seconds_since(t0) / double(copies), 1e-7);
  const int reps = std::max(int(copies), int(std::ceil(0.02 / once)));
  std::vector<double> rates;
  const auto start = Clock::now();
  while (rates.size() < 3 || (seconds_since(start) < budget_s && rates.size() < 15)) {
    t0 = Clock::now();
    for (int r = 0; r < reps; ++r) layer();
    rates.push_back(6.0 * double(N) * C * OC * reps / seconds_since(t0));
  }
  std::sort(rates.begin(), rates.end());
  return {rates[rates.size() / 2], int(rates.size())};
}

// trident's own elementwise ops on one thread, as the plan model counts their traffic
// (Note [Plan model]): LayerNorm forward 3 values per element (2 passes in, 1 out), GELU
// forward 2 and backward 3, over [1024, 768] and its 4× MLP width. Median of 7 runs, GB/s.
double measure_elementwise(Backend& be) {
  const int N = 1024, C = 768;
  const size_t n = size_t(N) * C, n4 = 4 * n;
  BackendBuffer<float> x(be, n4), y(be, n4), dy(be, n4), w(be, C), b(be, C), mean(be, N), rstd(be, N);
  std::vector<float> host(n4);
  for (size_t i = 0; i < n4; ++i) host[i] = float(i % 17) * 0.05f - 0.4f;
  be.copy(x.data(), host.data(), n4 * sizeof(float));
  be.copy(dy.data(), host.data(), n4 * sizeof(float));
  be.copy(w.data(), host.data(), C * sizeof(float));
  be.copy(b.data(), host.data(), C * sizeof(float));
  const double bytes = 4.0 * (3.0 * n + 2.0 * n4 + 3.0 * n4);
  std::vector<double> rates;
  for (int run = 0; run < 8; ++run) {
    const auto t0 = Clock::now();
    be.layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    be.gelu_forward(y.data(), x.data(), n4);
    be.gelu_backward(y.data(), x.data(), dy.data(), n4);
    if (run > 0) rates.push_back(bytes / seconds_since(t0) / 1e9);  // the first warms up
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

// The whole model code against the per-op terms: forward and backward of a small GPT (4
// layers, d_model 512, 8 heads, vocabulary 8192, 4 × 128 tokens) through GPT, median of 5
// after a warm-up, seconds. What the per-op terms miss (calls between the ops, cache misses
// between them, the cross-entropy's exp) shows as compute_efficiency (Note [Plan model]).
constexpr int kSmallGptBatch = 4;
PlanModel small_gpt_shape() {
  PlanModel shape;
  shape.layers = 4, shape.d_model = 512, shape.heads = 8, shape.vocab = 8192, shape.seq_len = 128;
  return shape;
}

double time_small_gpt(Backend& be) {
  const PlanModel shape = small_gpt_shape();
  GPTConfig cfg;
  cfg.layers = shape.layers, cfg.channels = shape.d_model, cfg.heads = shape.heads;
  cfg.vocab = shape.vocab, cfg.padded_vocab = GPTConfig::pad_vocab(shape.vocab);
  cfg.max_seq_len = shape.seq_len;
  const int B = kSmallGptBatch, T = shape.seq_len;
  GPT gpt(cfg, be, B, T, GPTOptions{});
  gpt.init_weights(7);
  std::vector<int32_t> tokens(size_t(B) * T), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = int32_t(i * 2654435761u % uint32_t(shape.vocab));
    targets[i] = int32_t((i * 40503u + 11) % uint32_t(shape.vocab));
  }
  std::vector<double> times;
  for (int run = 0; run < 6; ++run) {
    const auto t0 = Clock::now();
    gpt.forward(tokens.data(), targets.data(), B, T);
    gpt.backward(1.0f);
    if (run > 0) times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// AdamW over 16 Mi parameters on one thread, as the plan model counts it (32 B per
// parameter), median of 5, GB/s.
double measure_optimizer(Backend& be) {
  const size_t n = size_t(16) << 20;
  BackendBuffer<float> p(be, n), m(be, n), v(be, n), g(be, n);
  std::vector<double> rates;
  for (int run = 0; run < 6; ++run) {
    const auto t0 = Clock::now();
    be.adamw_update(p.data(), m.data(), v.data(), g.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                    run + 1, 1.0f);
    if (run > 0) rates.push_back(32.0 * n / seconds_since(t0) / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

// ---- Memory ----------------------------------------------------------------------------------

// STREAM triad on `threads` threads, each on its own slice (first touched by that thread, so its
// pages sit where it runs). GB/s, best of 10, counted as 24 bytes per element.
double measure_triad(int threads, size_t n) {
  std::vector<double> a, b, c;
  a.reserve(n), b.reserve(n), c.reserve(n);
  a.resize(n), b.resize(n), c.resize(n);  // zero pages now; each thread fills its slice below
  const double s = 3.0;
  auto parallel = [&](auto&& body) {
    std::vector<std::thread> team;
    for (int t = 0; t < threads; ++t)
      team.emplace_back([&, t] { body(n * t / threads, n * (t + 1) / threads); });
    for (auto& th : team) th.join();
  };
  parallel([&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) a[i] = 0, b[i] = double(i % 17), c[i] = double(i % 5);
  });
  double best = 1e30;
  for (int rep = 0; rep < 10; ++rep) {
    const auto t0 = Clock::now();
    parallel([&](size_t lo, size_t hi) {
      double* __restrict pa = a.data();
      const double* __restrict pb = b.data();
      const double* __restrict pc = c.data();
      for (size_t i = lo; i < hi; ++i) pa[i] = pb[i] + s * pc[i];
    });
    best = std::min(best, seconds_since(t0));
  }
  for (size_t i = 0; i < n; i += n / 97 + 1)
    TRIDENT_CHECK(a[i] == b[i] + s * c[i], "calibration: triad element {} is wrong", i);
  return 24.0 * double(n) / best / 1e9;
}

// mpirun binds each rank to one core by default, and threads inherit their creator's mask; the
// triad is a node figure, so while it runs this thread may use every online core (restored after).
class AllCoresWhileAlive {
 public:
  explicit AllCoresWhileAlive(int cores) {
    saved_ok_ = sched_getaffinity(0, sizeof saved_, &saved_) == 0;
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int c = 0; c < cores && c < CPU_SETSIZE; ++c) CPU_SET(c, &all);
    sched_setaffinity(0, sizeof all, &all);  // refused (cgroup): the triad runs where allowed
  }
  ~AllCoresWhileAlive() {
    if (saved_ok_) sched_setaffinity(0, sizeof saved_, &saved_);
  }
  AllCoresWhileAlive(const AllCoresWhileAlive&) = delete;
  AllCoresWhileAlive& operator=(const AllCoresWhileAlive&) = delete;

 private:
  cpu_set_t saved_;
  bool saved_ok_ = false;
};

// One thread's memcpy rate (GB/s, bytes copied): the single-rank stand-in for a transport.
double measure_copy(size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    best = std::min(best, seconds_since(t0));
  }
  TRIDENT_CHECK(dst[bytes / 2] == 1, "calibration: memcpy did not copy");
  return double(bytes) / best / 1e9;
}

// One round of the compute figures (Note [Calibration]): the linear-layer points, the
// elementwise and AdamW rates, and the small GPT's time on one thread and on all of them
// (compute_efficiency and thread_scaling come from the rounds' medians).
struct ComputeRound {
  std::vector<GemmPoint> gemm;
  double elementwise_gbytes_per_s = 0, optimizer_gbytes_per_s = 0;
  double small_gpt_s = 0, small_gpt_all_threads_s = 0;  // forward + backward, 1 / all threads
};

void measure_compute_round(Backend& single, int cores, ComputeRound& hw) {
  hw.gemm.clear();
  for (int d : {32, 64, 128, 256, 512, 1024}) {
    const GemmRate r = time_linear(single, d, d >= 512 ? 0.5 : 0.2);
    hw.gemm.push_back({d, r.flops / 1e12});
  }
  hw.elementwise_gbytes_per_s = measure_elementwise(single);
  hw.optimizer_gbytes_per_s = measure_optimizer(single);
  hw.small_gpt_s = time_small_gpt(single);
  if (cores > 1) {  // the same model on a thread per core, in this one process
    std::unique_ptr<Backend> all = make_cpu_backend(cores);
    AllCoresWhileAlive widen(cores);
    hw.small_gpt_all_threads_s = time_small_gpt(*all);
  }
}

// compute_efficiency: the per-op terms of the small GPT with hw's (final) figures against its
// measured time (Note [Calibration]).
double compute_efficiency_of(const Hardware& hw, double measured_s) {
  Hardware probe = hw;
  probe.memory_gbytes_per_s = 1e6;  // the kernels' own rates hold
  probe.memory_gb = 1e6;
  probe.intra_node = probe.inter_node = {1, 0};
  probe.compute_efficiency = 1;
  PlanLayout one;
  one.micro_batch = kSmallGptBatch;
  const Prediction p = predict(small_gpt_shape(), one, probe);
  return std::clamp((p.term("forward_s") + p.term("backward_s")) / measured_s, 0.05, 2.0);
}

// ---- Link ------------------------------------------------------------------------------------

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

// Ring all-reduce figures of `comm` (Note [Calibration]); collective over world and comm.
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
    large = std::min(large, timed_on_all(world, [&] { comm.all_reduce(big.data(), big.size()).wait(); }));
  LinkSpec link;
  link.latency_us = round_sig(small / hops * 1e6);
  const double wire_s = std::max(large - small, large * 0.5);  // small = all its hops' latency
  link.gbytes_per_s = round_sig(hops / n * double(big.size() * sizeof(float)) / wire_s / 1e9);
  return link;
}

// ---- Overlap ---------------------------------------------------------------------------------

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

struct OverlapRates {
  double alone = 0, with_comm = 0;  // FLOP/s
  double slowdown() const { return alone > 0 ? std::clamp(1 - with_comm / alone, 0.0, 0.99) : 0; }
};

// Rank 0 times GEMM windows alone and with its communication thread busy; the other ranks
// only take part in the all-reduces. comm null: one rank, a copying thread stands in.
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

// Every rank computes 512³ GEMMs on one thread at the same time: the mean rate over the ranks
// against rank 0's rate alone (Hardware::core_scaling). Best of two windows.
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

// ---- The description -------------------------------------------------------------------------

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "unknown CPU";
}

double mem_total_gb() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("MemTotal:", 0) == 0) return std::stod(line.substr(9)) * 1024 / 1e9;
  input_error("/proc/meminfo: no MemTotal line");
}

// The 1-minute load average: other work on the cores lowers every figure, so the file says it.
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one;
  return in >> one ? one : "unknown";
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d", std::localtime(&now));
  return text;
}

std::string output_path(const CalibrateArgs& args, const std::string& name) {
  if (!args.out.empty()) return args.out;
  return (std::filesystem::path(source_hardware_dir()) / (name + ".yaml")).string();
}

}  // namespace

int run_calibrate(const CalibrateArgs& args, const BlasCoreCheck& blas) {
  MPI_Comm world = MPI_COMM_WORLD;
  int rank = 0, size = 1;
  TRIDENT_MPI(MPI_Comm_rank(world, &rank));
  TRIDENT_MPI(MPI_Comm_size(world, &size));
  const bool lead = rank == 0;
  const std::string name = args.name.empty() ? "this-machine" : args.name;
  const std::string path = output_path(args, name);
  const int cores = int(sysconf(_SC_NPROCESSORS_ONLN));
  const int threads = args.threads > 0 ? args.threads : cores;
  setup_step([&] {
    if (name.find('/') != std::string::npos)
      input_error("--name {}: a description's name cannot contain '/'", name);
    const auto dir = std::filesystem::absolute(path).parent_path();
    if (lead && !std::filesystem::is_directory(dir))
      input_error("--out {}: directory {} does not exist", path, dir.string());
  });

  const std::string load = load_average();
  // mpirun's binding of this rank: the overlap figure is measured inside it, as a training
  // rank's compute and communication threads run.
  const int bound = allowed_cores();
  progress(lead, "{}, {} cores online, {} rank(s), {} thread(s) for memory; OpenBLAS core {}; "
           "load average {} before measuring", cpu_model(), cores, size, threads,
           blas.chosen.empty() ? "unknown" : blas.chosen, load);
  Hardware hw;
  hw.name = name;
  hw.kind = "cpu";
  hw.dtype = "fp32";
  hw.devices_per_node = cores;
  hw.memory_gb = round_sig(mem_total_gb());

  std::unique_ptr<Backend> single = make_cpu_backend(1);
  if (lead) {
    validate_matmul(*single);
    // Three rounds, each measuring everything once; each figure is the median of its rounds:
    // on a shared VM one figure moved by ±25% from one minute to the next (docs/plan.md).
    constexpr int kRounds = 3;
    std::vector<ComputeRound> rounds(kRounds);
    for (int round = 0; round < kRounds; ++round) {
      measure_compute_round(*single, cores, rounds[size_t(round)]);
      const ComputeRound& r = rounds[size_t(round)];
      progress(lead, "round {}/{}: linear layers {:.1f} .. {:.1f} GFLOP/s (d = 32 .. 1024), "
               "elementwise {:.2f} GB/s, AdamW {:.2f} GB/s, small GPT {:.1f} ms on 1 thread, "
               "{:.1f} ms on {}", round + 1, kRounds, r.gemm.front().tflops * 1e3,
               r.gemm.back().tflops * 1e3, r.elementwise_gbytes_per_s, r.optimizer_gbytes_per_s,
               1e3 * r.small_gpt_s, 1e3 * r.small_gpt_all_threads_s, cores);
    }
    auto median_of = [&](auto get) {
      std::vector<double> v;
      for (const ComputeRound& r : rounds) v.push_back(get(r));
      std::sort(v.begin(), v.end());
      return round_sig(v[v.size() / 2]);
    };
    hw.gemm = rounds[0].gemm;
    for (size_t i = 0; i < hw.gemm.size(); ++i) {
      hw.gemm[i].tflops = median_of([&](const ComputeRound& r) { return r.gemm[i].tflops; });
      progress(lead, "linear layer [{}, {}] -> {}, forward and backward, 1 thread: {:.1f} "
               "GFLOP/s (median of {} rounds)", hw.gemm[i].min_dim, 2 * hw.gemm[i].min_dim,
               8 * hw.gemm[i].min_dim, hw.gemm[i].tflops * 1e3, kRounds);
    }
    hw.elementwise_gbytes_per_s =
        median_of([](const ComputeRound& r) { return r.elementwise_gbytes_per_s; });
    hw.optimizer_gbytes_per_s =
        median_of([](const ComputeRound& r) { return r.optimizer_gbytes_per_s; });
    for (const GemmPoint& p : hw.gemm) hw.peak_tflops = std::max(hw.peak_tflops, p.tflops);
    const double one_thread = median_of([](const ComputeRound& r) { return r.small_gpt_s; });
    hw.compute_efficiency = round_sig(compute_efficiency_of(hw, one_thread));
    if (cores > 1)
      hw.thread_scaling = round_sig(std::clamp(
          one_thread / (cores * median_of([](const ComputeRound& r) {
                          return r.small_gpt_all_threads_s;
                        })),
          0.01, 1.0));
    progress(lead, "medians: elementwise {:.2f} GB/s, AdamW {:.2f} GB/s at 32 B per parameter, "
             "compute_efficiency {:.2f}, thread_scaling {:.2f}", hw.elementwise_gbytes_per_s,
             hw.optimizer_gbytes_per_s, hw.compute_efficiency, hw.thread_scaling);
    const size_t n = size_t(8) << 20;  // 64 MiB of doubles per array
    {
      AllCoresWhileAlive widen(cores);
      hw.memory_gbytes_per_s = round_sig(measure_triad(threads, n));
    }
    progress(lead, "memory triad, {} threads, 3 x 64 MiB: {:.2f} GB/s (best of 10)", threads,
             hw.memory_gbytes_per_s);
  }
  quiet_barrier(world);

  std::vector<std::string> notes;
  std::unique_ptr<MpiComm> comm;
  if (size >= 2) {
    comm = MpiComm::duplicate(world, "calibrate");
    hw.intra_node = measure_link(*comm, world, size_t(64) << 20, 5);
    progress(lead, "link: MpiComm ring all-reduce, {} ranks: busbw {:.3f} GB/s, latency {:.1f} us "
             "per hop", size, hw.intra_node.gbytes_per_s, hw.intra_node.latency_us);
    notes.push_back(fmt::format(
        "intra_node: MpiComm ring all-reduce (MPI_Iallreduce, libnbc ring) over {} ranks on this "
        "node; busbw from 64 MiB with the latency taken out; latency = one-float all-reduce / "
        "2(n-1); slowest rank, best of 5", size));
  } else {
    const double copy = measure_copy(size_t(64) << 20);
    hw.intra_node = {round_sig(copy / 2), 1.0};
    progress(lead, "link: one rank, no peer: intra_node estimated as half of one thread's "
             "memcpy ({:.2f} GB/s), latency assumed 1 us; run under mpirun -n 2 to measure it",
             copy);
    notes.push_back("intra_node: NOT measured (one rank): half of one thread's memcpy rate "
                    "(a shared-memory transport copies each byte twice), latency 1 us assumed; "
                    "calibrate under mpirun -n 2 to measure it");
  }

  if (size >= 2 && args.emulate_gbps > 0) {
    auto emulated = MpiComm::duplicate(world, "calibrate-emulated");
    emulated->set_emulated_link(args.emulate_gbps, args.emulate_latency_us);
    // About 50 ms of wire time per operation: long enough to time, short enough to repeat.
    const double bytes = args.emulate_gbps * 1e9 / 8 * 0.05 * size / (2.0 * (size - 1));
    const size_t large = std::clamp<size_t>(size_t(bytes) / 4096 * 4096, 1u << 20, 64u << 20);
    hw.inter_node = measure_link(*emulated, world, large, 3);
    progress(lead, "emulated link ({} Gbit/s, {} us): busbw {:.4f} GB/s, latency {:.1f} us per "
             "hop", args.emulate_gbps, args.emulate_latency_us, hw.inter_node.gbytes_per_s,
             hw.inter_node.latency_us);
    notes.push_back(fmt::format(
        "inter_node: the same all-reduce through MpiComm's emulated link (--emulate-gbps {} "
        "--emulate-latency-us {}), {} MiB", args.emulate_gbps, args.emulate_latency_us,
        large >> 20));
  } else {
    hw.inter_node = hw.intra_node;
    notes.push_back(size >= 2 && args.emulate_gbps <= 0
                        ? "inter_node: a copy of intra_node (one node, no --emulate-gbps)"
                        : "inter_node: a copy of intra_node (one rank: no link to emulate)");
  }

  const OverlapRates overlap = measure_overlap(*single, comm.get(), world);
  hw.overlap_slowdown = round_sig(overlap.slowdown());
  progress(lead, "overlap: gemm 512x512x512, 1 thread: {:.1f} GFLOP/s alone, {:.1f} GFLOP/s with "
           "{}: slowdown {:.3f}", overlap.alone / 1e9, overlap.with_comm / 1e9,
           comm ? "this rank's communication thread running all-reduces"
                : "a thread copying 16 MiB buffers (one rank)",
           hw.overlap_slowdown);
  notes.push_back(fmt::format("thread_scaling: the small GPT's forward + backward on {} threads "
                              "in one process against ({} x) its 1-thread time, medians (a "
                              "large GEMM alone scaled 0.7-0.9; whole steps scale less)", cores,
                              cores));
  if (size >= 2) {
    const double alone = overlap.alone > 0 ? overlap.alone : 1;  // rank 0's is the one written
    hw.core_scaling = round_sig(measure_core_scaling(*single, world, size, alone));
    progress(lead, "cores: {} ranks computing 512x512x512 GEMMs at once get {:.2f} of one "
             "alone each", size, hw.core_scaling);
    notes.push_back(fmt::format(
        "core_scaling: the mean single-thread 512^3 GEMM rate of {} ranks computing at once / "
        "rank 0's rate alone, best of 2 windows of 0.4 s", size));
  } else {
    notes.push_back("core_scaling: NOT measured (one rank): 1 assumed; calibrate under mpirun "
                    "-n <cores> to measure it");
  }
  notes.push_back(fmt::format(
      "overlap_slowdown: 1 - (single-thread 512^3 GEMM rate while {}) / (rate alone), best of 2 "
      "windows of 0.4 s each, inside rank 0's binding ({} core(s) allowed), as a training rank "
      "runs", comm ? "rank 0's communication thread runs 16 MiB all-reduces"
                   : "a thread copies 16 MiB buffers (one rank, no peer)", bound));

  setup_step([&] {
    if (!lead) return;
    const CpuPeakBounds bounds = cpu_gemm_peak_bounds(blas.fp32_lanes, 1, cores, 1);
    const PeakVerdict verdict = judge_peak(hw.peak_tflops * 1e12, bounds);
    if (verdict == PeakVerdict::kImpossible)
      throw Error(peak_problem_message(hw.peak_tflops * 1e12, bounds, verdict,
                                       isa_name(blas.cpu_isa), blas.chosen),
                  ExitCode::kInternal);
    hw.sources.push_back(fmt::format("measured by trident plan --calibrate on {}, {}, {} thread(s) "
                                     "for memory, {} rank(s), OpenBLAS core {}, load average {} "
                                     "before measuring (other work lowers every figure)", today(),
                                     cpu_model(), threads, size, blas.chosen, load));
    hw.sources.push_back("gemm: a linear layer [4d, d] -> 4d, forward and backward "
                         "(CpuBackend::matmul_forward, matmul_backward), 1 thread, runs of >= 20 "
                         "ms, median run; peak_tflops = best point");
    hw.sources.push_back("compute_efficiency: the per-op terms' forward + backward of a small "
                         "GPT (4 layers, d_model 512, 8 heads, vocabulary 8192, 4 x 128 tokens) / "
                         "its time through trident's GPT on 1 thread, median of 5");
    hw.sources.push_back("optimizer_gbytes_per_s: CpuBackend adamw_update over 16 Mi parameters, "
                         "1 thread, 32 B per parameter, median of 5");
    hw.sources.push_back("elementwise_gbytes_per_s: CpuBackend layernorm_forward, gelu_forward, "
                         "gelu_backward over [1024, 768] and [1024, 3072], 1 thread, median of 7");
    hw.sources.push_back(fmt::format("memory_gbytes_per_s: STREAM triad, {} threads, 3 x 64 MiB "
                                     "double arrays, 24 bytes per element, best of 10", threads));
    hw.sources.push_back("memory_gb: /proc/meminfo MemTotal");
    for (const std::string& note : notes) hw.sources.push_back(note);
    hw.sources.push_back("attention_tflops: 0 (the CPU backend's attention runs as loops over "
                         "memory, not a fused kernel)");
    if (verdict == PeakVerdict::kImplausiblyLow) {
      const std::string why = peak_problem_message(hw.peak_tflops * 1e12, bounds, verdict,
                                                   isa_name(blas.cpu_isa), blas.chosen);
      progress(lead, "warning: {}", why);
      hw.sources.push_back("warning: " + why);
    }
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp);
      out << hardware_to_yaml(hw);
      if (!out.flush()) input_error("--out {}: cannot write {}", path, tmp);
    }
    std::filesystem::rename(tmp, path);
    load_hardware(path);  // reads back: the file is valid
    progress(lead, "wrote {}", path);
  });
  return 0;
}

}  // namespace trident
