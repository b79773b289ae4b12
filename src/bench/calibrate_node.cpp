// One rank's compute and memory figures (Note [Calibration] in bench/calibrate.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "bench/calibrate.h"
#include "trident/check.h"
#include "trident/model.h"

namespace trident::calibration {
namespace {

using Clock = std::chrono::steady_clock;

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
    be.matmul_backward(l.dx.data(), l.dw.data(), l.db.data(), l.dy.data(), l.x.data(), l.w.data(),
                       int(N), int(C), int(OC));
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
  BackendBuffer<float> x(be, n4), y(be, n4), dy(be, n4), w(be, C), b(be, C), mean(be, N),
      rstd(be, N);
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

// Large enough to leave the caches (a GPT-2 124M snapshot is 1.49 GB), small enough for a round.
constexpr size_t kSnapshotCopyBytes = size_t(256) << 20;

// One round of the compute figures (ComputeRound); compute_efficiency and thread_scaling come
// from the rounds' medians.
void measure_compute_round(Backend& single, int cores, ComputeRound& hw) {
  hw.gemm.clear();
  for (int d : {32, 64, 128, 256, 512, 1024}) {
    const GemmRate r = time_linear(single, d, d >= 512 ? 0.5 : 0.2);
    hw.gemm.push_back({d, r.flops / 1e12});
  }
  hw.elementwise_gbytes_per_s = measure_elementwise(single);
  hw.optimizer_gbytes_per_s = measure_optimizer(single);
  hw.small_gpt_s = time_small_gpt(single);
  hw.host_copy_gbytes_per_s = measure_snapshot_copy(kSnapshotCopyBytes);
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

}  // namespace

double round_sig(double x) {
  if (x == 0) return 0;
  const double scale = std::pow(10.0, 3 - std::floor(std::log10(std::fabs(x))));
  return std::round(x * scale) / scale;
}

AllCoresWhileAlive::AllCoresWhileAlive(int cores) {
  saved_ok_ = sched_getaffinity(0, sizeof saved_, &saved_) == 0;
  cpu_set_t all;
  CPU_ZERO(&all);
  for (int c = 0; c < cores && c < CPU_SETSIZE; ++c) CPU_SET(c, &all);
  sched_setaffinity(0, sizeof all, &all);  // refused (cgroup): the work runs where allowed
}

AllCoresWhileAlive::~AllCoresWhileAlive() {
  if (saved_ok_) sched_setaffinity(0, sizeof saved_, &saved_);
}

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

void measure_compute(Backend& single, int cores, Hardware& hw,
                     const std::function<void(int, const ComputeRound&)>& after_round) {
  // Every figure is measured once per round and written as the median of its rounds: a shared
  // machine's figures move from one minute to the next (docs/plan.md).
  std::vector<ComputeRound> rounds(kComputeRounds);
  for (int round = 0; round < kComputeRounds; ++round) {
    measure_compute_round(single, cores, rounds[size_t(round)]);
    after_round(round, rounds[size_t(round)]);
  }
  auto median_of = [&](auto get) {
    std::vector<double> v;
    for (const ComputeRound& r : rounds) v.push_back(get(r));
    std::sort(v.begin(), v.end());
    return round_sig(v[v.size() / 2]);
  };
  hw.gemm = rounds[0].gemm;
  for (size_t i = 0; i < hw.gemm.size(); ++i)
    hw.gemm[i].tflops = median_of([&](const ComputeRound& r) { return r.gemm[i].tflops; });
  hw.elementwise_gbytes_per_s =
      median_of([](const ComputeRound& r) { return r.elementwise_gbytes_per_s; });
  hw.optimizer_gbytes_per_s =
      median_of([](const ComputeRound& r) { return r.optimizer_gbytes_per_s; });
  for (const GemmPoint& p : hw.gemm) hw.peak_tflops = std::max(hw.peak_tflops, p.tflops);
  hw.host_copy_gbytes_per_s =
      median_of([](const ComputeRound& r) { return r.host_copy_gbytes_per_s; });
  hw.sources.push_back(fmt::format(
      "host_copy_gbytes_per_s: a checkpoint snapshot's copy, memcpy of {} MiB on 1 thread into a "
      "buffer touched beforehand, median of 5 per round, median of {} rounds",
      kSnapshotCopyBytes >> 20, kComputeRounds));
  const double one_thread = median_of([](const ComputeRound& r) { return r.small_gpt_s; });
  hw.compute_efficiency = round_sig(compute_efficiency_of(hw, one_thread));
  if (cores > 1)
    hw.thread_scaling = round_sig(std::clamp(
        one_thread /
            (cores * median_of([](const ComputeRound& r) { return r.small_gpt_all_threads_s; })),
        0.01, 1.0));
}

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

double measure_snapshot_copy(size_t bytes) {
  std::vector<char> src(bytes), dst(bytes);
  for (size_t i = 0; i < bytes; i += 4096) src[i] = char(i / 4096 % 127 + 1);
  std::memset(dst.data(), 0, bytes);           // touched: the timed copies take no page faults
  std::memcpy(dst.data(), src.data(), bytes);  // validated first, then timed
  for (size_t i = 0; i < bytes; i += 4096 * 97)
    TRIDENT_CHECK(dst[i] == src[i], "calibration: the snapshot copy's byte {} is wrong", i);
  std::vector<double> gbs;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    gbs.push_back(double(bytes) / seconds_since(t0) / 1e9);
  }
  std::sort(gbs.begin(), gbs.end());
  return gbs[gbs.size() / 2];
}

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

}  // namespace trident::calibration
