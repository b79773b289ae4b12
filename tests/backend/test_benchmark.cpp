// Benchmarks of the CPU backend at the GPT-2 124M shape (B=4, T=64, C=768, NH=12, Vp=50304).
// Disabled by default (they take ~1 min and need ~2.5 GB); run with
//   build/tests/test_backend --gtest_also_run_disabled_tests --gtest_filter='*Benchmark*'
// TRIDENT_BENCH_THREADS sets the thread count (default 2). Each benchmark validates its results
// before it times them, and prints the units and the peak it compares with.
#include <cblas.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include "backend/gemm.h"
#include "backend/kernels.h"
#include "backend_test_util.h"
#include "trident/backend.h"

namespace trident {
namespace {

using namespace trident::testing;
using cpu::Trans;

constexpr int B = 4, T = 64, C = 768, NH = 12, V = 50257, Vp = 50304, L = 12, N = B * T;
constexpr size_t kParams = 124439808;  // GPT-2 small with Vp = 50304

int bench_threads() {
  const char* env = std::getenv("TRIDENT_BENCH_THREADS");
  return env ? std::atoi(env) : 2;
}

// Best wall time of `repeats` runs after one warm-up, in seconds.
double best_time(const std::function<void()>& run, int repeats = 5) {
  run();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

struct Shape {
  const char* name;
  Trans ta, tb;
  int M, N, K;
};

// The products of one training step: out = inp·wᵀ, dinp = dout·w, dw += doutᵀ·inp per linear.
std::vector<Shape> model_shapes() {
  std::vector<Shape> shapes;
  const std::pair<const char*, std::pair<int, int>> linears[] = {{"qkv", {C, 3 * C}},
                                                                 {"attproj", {C, C}},
                                                                 {"fc", {C, 4 * C}},
                                                                 {"fcproj", {4 * C, C}},
                                                                 {"lm-head", {C, Vp}}};
  for (const auto& [name, io] : linears) {
    const auto [in, out] = io;
    shapes.push_back({name, Trans::kNo, Trans::kYes, N, out, in});  // forward
    shapes.push_back({name, Trans::kNo, Trans::kNo, N, in, out});   // dinp
    shapes.push_back({name, Trans::kYes, Trans::kNo, out, in, N});  // dw
  }
  return shapes;
}

const char* role(const Shape& s) {
  return s.ta == Trans::kYes   ? "dw   += doutT.inp"
         : s.tb == Trans::kYes ? "out   = inp.wT   "
                               : "dinp  = dout.w   ";
}

TEST(DISABLED_Benchmark, GemmShapes) {
  const int threads = bench_threads();
  const double peak = cpu::measure_sgemm_flops(threads);
  std::printf("sgemm peak (2048^3, %d threads): %.1f GFLOP/s\n", threads, peak / 1e9);
  std::printf("%-8s %-18s %6s %6s %6s %9s %9s %7s %s\n", "layer", "product", "M", "N", "K", "ms",
              "GFLOP/s", "%peak", "#wrong");
  std::mt19937 rng(1);
  double total_flop = 0, total_s = 0;
  for (const Shape& s : model_shapes()) {
    const auto A = to_float(uniform(size_t(s.M) * s.K, rng));
    const auto Bm = to_float(uniform(size_t(s.K) * s.N, rng));
    std::vector<float> Cm(size_t(s.M) * s.N, 0.0f);
    const int lda = s.ta == Trans::kNo ? s.K : s.M, ldb = s.tb == Trans::kNo ? s.N : s.K;
    auto run = [&](float beta) {
      cpu::gemm(s.ta, s.tb, s.M, s.N, s.K, A.data(), lda, Bm.data(), ldb, beta, Cm.data(), s.N,
                threads);
    };
    run(0.0f);  // validate 64 sampled entries against a double dot product
    int wrong = 0;
    for (int probe = 0; probe < 64; ++probe) {
      const int i = (probe * 7919) % s.M, j = (probe * 104729) % s.N;
      double want = 0.0, scale = 0.0;
      for (int k = 0; k < s.K; ++k) {
        const double a = s.ta == Trans::kNo ? A[size_t(i) * s.K + k] : A[size_t(k) * s.M + i];
        const double b = s.tb == Trans::kNo ? Bm[size_t(k) * s.N + j] : Bm[size_t(j) * s.K + k];
        want += a * b;
        scale += std::abs(a * b);
      }
      wrong += std::abs(Cm[size_t(i) * s.N + j] - want) > 1e-5 * scale;
    }
    EXPECT_EQ(wrong, 0) << s.name;
    const double sec = best_time([&] { run(s.ta == Trans::kYes ? 1.0f : 0.0f); });
    const double flop = 2.0 * s.M * double(s.N) * s.K;
    total_flop += flop * (std::string(s.name) == "lm-head" ? 1 : L);
    total_s += sec * (std::string(s.name) == "lm-head" ? 1 : L);
    std::printf("%-8s %-18s %6d %6d %6d %9.3f %9.1f %6.1f%% %d\n", s.name, role(s), s.M, s.N, s.K,
                sec * 1e3, flop / sec / 1e9, 100 * flop / sec / peak, wrong);
  }
  std::printf("all linear-layer GEMMs of one step (12 layers + lm-head): %.0f ms, %.1f GFLOP/s, "
              "%.1f%% of peak\n",
              total_s * 1e3, total_flop / total_s / 1e9, 100 * total_flop / total_s / peak);
}

// OpenBLAS's own threads vs the OpenMP split (Note [GEMM threading] in src/backend/gemm.cpp), on
// a loop that alternates GEMMs with OpenMP elementwise work as the model does.
TEST(DISABLED_Benchmark, GemmThreadingSchemes) {
  const int threads = bench_threads();
  std::mt19937 rng(2);
  const auto x = to_float(uniform(size_t(N) * C, rng)),
             w1 = to_float(uniform(size_t(4) * C * C, rng, -0.05, 0.05));
  const auto w2 = to_float(uniform(size_t(4) * C * C, rng, -0.05, 0.05));
  std::vector<float> h(size_t(N) * 4 * C), g(h.size()), y(size_t(N) * C), y2(y.size());
  auto mlp = [&](bool openblas_threads) {
    for (int l = 0; l < L; ++l) {
      if (openblas_threads)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, 4 * C, C, 1.0f, x.data(), C,
                    w1.data(), C, 0.0f, h.data(), 4 * C);
      else
        cpu::gemm(Trans::kNo, Trans::kYes, N, 4 * C, C, x.data(), C, w1.data(), C, 0.0f, h.data(),
                  4 * C, threads);
      cpu::gelu_forward(g.data(), h.data(), h.size(), threads);
      if (openblas_threads)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C, 4 * C, 1.0f, g.data(), 4 * C,
                    w2.data(), 4 * C, 0.0f, y.data(), C);
      else
        cpu::gemm(Trans::kNo, Trans::kYes, N, C, 4 * C, g.data(), 4 * C, w2.data(), 4 * C, 0.0f,
                  y.data(), C, threads);
      cpu::add(y2.data(), y.data(), x.data(), y.size(), threads);
    }
  };
  const double flop = L * 2 * (2.0 * N * 4 * C * C);
  openblas_set_num_threads(threads);
  mlp(true);
  const auto reference = y2;
  const double t_openblas = best_time([&] { mlp(true); }, 3);
  openblas_set_num_threads(1);
  mlp(false);
  EXPECT_LT(rel_err(y2, to_double(reference)), 1e-5);  // both schemes compute the same thing
  const double t_split = best_time([&] { mlp(false); }, 3);
  std::printf(
      "12 x [fc GEMM, GELU, fcproj GEMM, add], %d threads (GEMM GFLOP/s over total time):\n"
      "  OpenBLAS threads: %.1f ms %.1f GFLOP/s\n  OpenMP split:     %.1f ms %.1f GFLOP/s\n",
      threads, t_openblas * 1e3, flop / t_openblas / 1e9, t_split * 1e3, flop / t_split / 1e9);
}

TEST(DISABLED_Benchmark, NonGemmOps) {
  auto be = make_cpu_backend(bench_threads());
  std::mt19937 rng(3);
  const auto tok = tokens(N, V, rng), targets = tokens(N, V, rng);
  const auto wte = to_float(uniform(size_t(Vp) * C, rng)),
             wpe = to_float(uniform(size_t(T) * C, rng));
  const auto x = to_float(uniform(size_t(N) * C, rng)), w = to_float(uniform(C, rng));
  const auto qkv = to_float(uniform(size_t(N) * 3 * C, rng, -2, 2));
  const auto h = to_float(uniform(size_t(N) * 4 * C, rng, -4, 4));
  const auto logits = to_float(uniform(size_t(N) * Vp, rng, -10, 10));
  std::vector<float> out(size_t(N) * 4 * C), out2(out.size()), mean(N), rstd(N), dw(C), db(C);
  std::vector<float> att(size_t(B) * NH * T * T), scratch(att.size()), dqkv(qkv.size());
  std::vector<float> probs(logits.size()), losses(N), dwte(wte.size()), dwpe(wpe.size());

  struct Row {
    const char* op;
    double ms;
    double bytes;
    int per_step;
  };
  std::vector<Row> rows;
  auto time = [&](const char* op, double bytes, int per_step, const std::function<void()>& f) {
    rows.push_back({op, best_time(f) * 1e3, bytes, per_step});
  };
  const double act = 4.0 * N * C;  // bytes of one [N,C] float tensor
  time("encoder_forward", 3 * act, 1,
       [&] { be->encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C); });
  time("encoder_backward", 4 * act, 1,
       [&] { be->encoder_backward(dwte.data(), dwpe.data(), x.data(), tok.data(), B, T, C); });
  time("layernorm_forward", 2 * act, 2 * L + 1, [&] {
    be->layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), w.data(), N, C);
  });
  time("layernorm_backward", 3 * act, 2 * L + 1, [&] {
    be->layernorm_backward(out2.data(), dw.data(), db.data(), x.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), N, C);
  });
  time("attention_forward", 4 * act + 4.0 * att.size(), L,
       [&] { be->attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH); });
  time("attention_backward", 7 * act + 8.0 * att.size(), L, [&] {
    be->attention_backward(dqkv.data(), scratch.data(), x.data(), qkv.data(), out.data(),
                           att.data(), B, T, C, NH);
  });
  time("gelu_forward", 8 * act, L, [&] { be->gelu_forward(out.data(), h.data(), h.size()); });
  time("gelu_backward", 12 * act, L,
       [&] { be->gelu_backward(out2.data(), h.data(), h.data(), h.size()); });
  time("add (residual)", 3 * act, 2 * L,
       [&] { be->add(out.data(), x.data(), x.data(), x.size()); });
  // crossentropy is in place: each timed run starts from a fresh copy (copy time not included).
  double ce_f = 1e30, ce_b = 1e30;
  for (int r = 0; r < 4; ++r) {
    probs = logits;
    auto t0 = std::chrono::steady_clock::now();
    be->crossentropy_forward(losses.data(), probs.data(), targets.data(), N, V, Vp);
    auto t1 = std::chrono::steady_clock::now();
    be->crossentropy_backward(probs.data(), targets.data(), 1.0f / N, N, V, Vp);
    auto t2 = std::chrono::steady_clock::now();
    if (r > 0) {
      ce_f = std::min(ce_f, std::chrono::duration<double>(t1 - t0).count());
      ce_b = std::min(ce_b, std::chrono::duration<double>(t2 - t1).count());
    }
  }
  rows.push_back({"crossentropy_forward", ce_f * 1e3, 8.0 * logits.size(), 1});
  rows.push_back({"crossentropy_backward", ce_b * 1e3, 8.0 * logits.size(), 1});
  {
    std::vector<float> p(kParams, 0.01f), m(kParams, 0.0f), v(kParams, 0.0f), g(kParams, 0.001f);
    time("sum_squares (124M)", 4.0 * kParams, 1, [&] { (void)be->sum_squares(g.data(), kParams); });
    int t = 0;
    time("adamw_update (124M)", 28.0 * kParams, 1, [&] {
      be->adamw_update(p.data(), m.data(), v.data(), g.data(), kParams, 1e-4f, 0.9f, 0.95f, 1e-8f,
                       0.1f, ++t, 1.0f);
    });
    EXPECT_TRUE(std::isfinite(p[0]) && p[0] < 0.01f);
  }
  std::printf("GPT-2 124M shape, B=%d T=%d, %d threads\n%-24s %9s %8s %9s %13s\n", B, T,
              be->threads(), "op", "ms/call", "GB/s", "calls/step", "ms/step");
  double step_ms = 0;
  for (const Row& r : rows) {
    step_ms += r.ms * r.per_step;
    std::printf("%-24s %9.3f %8.1f %9d %13.2f\n", r.op, r.ms, r.bytes / r.ms / 1e6, r.per_step,
                r.ms * r.per_step);
  }
  std::printf("non-GEMM total per step (matmul bias adds/dbias not included): %.1f ms\n", step_ms);
  EXPECT_TRUE(std::isfinite(losses[0]));
}

}  // namespace
}  // namespace trident
