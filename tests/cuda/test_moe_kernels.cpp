// The mixture of experts' kernels (kernels/moe.cu) against their CPU twins (the Backend's host
// definitions, src/backend/moe_ops.cpp): routing (softmax and sigmoid with its choice bias,
// norm_topk on and off), the permutation with and without capacity (positions, drops, counts
// exactly; the sums in double), the row gather, the combine and its backward, the
// un-permutation, the router's gradient with the aux and z terms, and the shared gate.
// Skips without a GPU (Note [GPU skips]).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernel_checks.h"
#include "moe.h"

namespace trident::testing {
namespace {

struct Shape {
  int N, E, k, C;
};
const Shape kShapes[] = {{1, 4, 1, 8}, {37, 4, 2, 33}, {256, 8, 2, 64}, {129, 64, 6, 40}};

// Logits spread wide enough that two experts' scores are rarely within the kernels' rounding
// (a near tie could then be chosen differently; the routing test would say which token).
std::vector<float> logits_for(const Shape& s, std::mt19937& rng) {
  return random_floats(size_t(s.N) * s.E, rng, -4.0, 4.0);
}

// A routing made by the CPU twin, the inputs of the kernels after it.
struct Routing {
  std::vector<float> probs, lse, topw;
  std::vector<int32_t> top, pos, send_token, counts;
  std::vector<double> sums;
  int M = 0;
};
Routing cpu_routing(Backend& cpu, const Shape& s, const std::vector<float>& logits, bool sigmoid,
                    bool norm_topk, int cap) {
  Routing r;
  const size_t NE = size_t(s.N) * s.E, Nk = size_t(s.N) * s.k;
  r.probs.resize(NE), r.lse.resize(size_t(s.N)), r.topw.resize(Nk), r.top.resize(Nk);
  r.pos.resize(Nk), r.send_token.assign(Nk, -1), r.counts.resize(2 * size_t(s.E));
  r.sums.resize(size_t(s.E) + 1);
  cpu.moe_route_forward(r.probs.data(), r.lse.data(), r.top.data(), r.topw.data(), logits.data(),
                        nullptr, s.N, s.E, s.k, sigmoid, norm_topk);
  cpu.moe_permute(r.pos.data(), r.send_token.data(), r.counts.data(), r.sums.data(), nullptr,
                  r.top.data(), r.probs.data(), r.lse.data(), s.N, s.E, s.k, cap);
  for (int e = 0; e < s.E; ++e) r.M += r.counts[size_t(s.E + e)];
  return r;
}

TEST(KernelMoe, RouteForwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  auto cpu = cpu_twin();
  std::mt19937 rng(41);
  for (const Shape& s : kShapes)
    for (bool sigmoid : {false, true})
      for (bool norm : {true, false}) {
        const std::string at =
            fmt::format("N={} E={} k={} sigmoid={} norm_topk={}", s.N, s.E, s.k, sigmoid, norm);
        const std::vector<float> logits = logits_for(s, rng);
        const std::vector<float> bias = random_floats(size_t(s.E), rng, -0.05, 0.05);
        const size_t NE = size_t(s.N) * s.E, Nk = size_t(s.N) * s.k;
        std::vector<float> probs(NE), lse(size_t(s.N)), topw(Nk);
        std::vector<int32_t> top(Nk);
        cpu->moe_route_forward(probs.data(), lse.data(), top.data(), topw.data(), logits.data(),
                               bias.data(), s.N, s.E, s.k, sigmoid, norm);
        DeviceBuffer<float> d_logits(logits), d_bias(bias), d_probs(NE), d_lse(size_t(s.N)),
            d_topw(Nk);
        DeviceBuffer<int32_t> d_top(Nk);
        cuda::moe_route_forward_cuda(d_probs.get(), d_lse.get(), d_top.get(), d_topw.get(),
                                     d_logits.get(), d_bias.get(), s.N, s.E, s.k, sigmoid, norm,
                                     nullptr);
        EXPECT_EQ(d_top.download(), top) << at;
        expect_within({{"probs", err_vs(d_probs.download(), probs), kFp32Tol},
                       {"lse", err_vs(d_lse.download(), lse, 1.0), kFp32Tol},
                       {"topw", err_vs(d_topw.download(), topw), kFp32Tol}},
                      at);
      }
}

TEST(KernelMoe, PermuteMatchesCpuExactly) {
  TRIDENT_REQUIRE_GPU();
  auto cpu = cpu_twin();
  std::mt19937 rng(42);
  for (const Shape& s : kShapes)
    for (bool capped : {false, true}) {
      const int cap = capped ? std::max(1, s.N * s.k / s.E / 2) : s.N * s.k;
      const std::string at = fmt::format("N={} E={} k={} cap={}", s.N, s.E, s.k, cap);
      const Routing r = cpu_routing(*cpu, s, logits_for(s, rng), false, true, cap);
      std::vector<int32_t> hf(size_t(s.E), 3), hf_want(hf);
      std::vector<int32_t> pos(r.pos.size()), send(r.send_token.size(), -1), counts(r.counts);
      std::vector<double> sums(r.sums.size());
      cpu->moe_permute(pos.data(), send.data(), counts.data(), sums.data(), hf_want.data(),
                       r.top.data(), r.probs.data(), r.lse.data(), s.N, s.E, s.k, cap);
      DeviceBuffer<int32_t> d_pos(pos.size()), d_send(send.size()), d_counts(counts.size()),
          d_hf(hf), d_top(r.top);
      d_send.upload(std::vector<int32_t>(send.size(), -1));
      DeviceBuffer<double> d_sums(sums.size());
      DeviceBuffer<float> d_probs(r.probs), d_lse(r.lse);
      cuda::moe_permute_cuda(d_pos.get(), d_send.get(), d_counts.get(), d_sums.get(), d_hf.get(),
                             d_top.get(), d_probs.get(), d_lse.get(), s.N, s.E, s.k, cap, nullptr);
      EXPECT_EQ(d_pos.download(), pos) << at;
      EXPECT_EQ(d_send.download(), send) << at;
      EXPECT_EQ(d_counts.download(), counts) << at;
      EXPECT_EQ(d_hf.download(), hf_want) << at;
      const std::vector<double> got = d_sums.download();
      for (size_t i = 0; i < sums.size(); ++i)
        EXPECT_NEAR(got[i], sums[i], 1e-12 * std::max(1.0, std::abs(sums[i])))
            << at << " sum " << i;
      if (s.N * s.k > s.E * cap) EXPECT_LT(r.M, s.N * s.k) << at;  // it must have dropped
    }
}

TEST(KernelMoe, GatherCombineScatterMatchCpu) {
  TRIDENT_REQUIRE_GPU();
  auto cpu = cpu_twin();
  std::mt19937 rng(43);
  for (const Shape& s : kShapes)
    for (bool shared : {false, true}) {
      const int cap = std::max(1, s.N * s.k / s.E);  // some drops on the skewed shapes
      const std::string at =
          fmt::format("N={} E={} k={} C={} shared={}", s.N, s.E, s.k, s.C, shared);
      const Routing r = cpu_routing(*cpu, s, logits_for(s, rng), false, true, cap);
      const size_t NC = size_t(s.N) * s.C, MC = size_t(r.M) * s.C, Nk = size_t(s.N) * s.k;
      const std::vector<float> x = random_floats(NC, rng), ys = random_floats(MC, rng);
      const std::vector<float> sh = random_floats(NC, rng),
                               gate = random_floats(size_t(s.N), rng, 0.1, 0.9);
      const std::vector<float> dout = random_floats(NC, rng), dx0 = random_floats(NC, rng);
      std::vector<float> rows(MC), out(NC), dys(MC), dtopw(Nk), dx(dx0);
      cpu->moe_gather_rows(rows.data(), x.data(), r.send_token.data(), r.M, s.C);
      cpu->moe_combine_forward(out.data(), ys.data(), shared ? sh.data() : nullptr,
                               shared ? gate.data() : nullptr, r.pos.data(), r.topw.data(), s.N,
                               s.C, s.k);
      cpu->moe_combine_backward(dys.data(), dtopw.data(), dout.data(), ys.data(), r.pos.data(),
                                r.topw.data(), s.N, s.C, s.k);
      cpu->moe_scatter_add(dx.data(), ys.data(), r.pos.data(), s.N, s.C, s.k);
      DeviceBuffer<float> d_x(x), d_ys(ys), d_sh(sh), d_gate(gate), d_dout(dout), d_dx(dx0),
          d_topw(r.topw), d_rows(MC), d_out(NC), d_dys(MC), d_dtopw(Nk);
      DeviceBuffer<int32_t> d_pos(r.pos), d_send(r.send_token);
      cuda::moe_gather_rows_cuda(d_rows.get(), d_x.get(), d_send.get(), r.M, s.C, nullptr);
      cuda::moe_combine_forward_cuda(d_out.get(), d_ys.get(), shared ? d_sh.get() : nullptr,
                                     shared ? d_gate.get() : nullptr, d_pos.get(), d_topw.get(),
                                     s.N, s.C, s.k, nullptr);
      cuda::moe_combine_backward_cuda(d_dys.get(), d_dtopw.get(), d_dout.get(), d_ys.get(),
                                      d_pos.get(), d_topw.get(), s.N, s.C, s.k, nullptr);
      cuda::moe_scatter_add_cuda(d_dx.get(), d_ys.get(), d_pos.get(), s.N, s.C, s.k, nullptr);
      EXPECT_TRUE(same_bits(d_rows.download(), rows)) << at;
      expect_within({{"out", err_vs(d_out.download(), out), kFp32Tol},
                     {"dys", err_vs(d_dys.download(), dys), kFp32Tol},
                     {"dtopw", err_vs(d_dtopw.download(), dtopw), kFp32Tol},
                     {"dx", err_vs(d_dx.download(), dx), kFp32Tol}},
                    at);
    }
}

TEST(KernelMoe, RouteBackwardAndGateMatchCpu) {
  TRIDENT_REQUIRE_GPU();
  auto cpu = cpu_twin();
  std::mt19937 rng(44);
  for (const Shape& s : kShapes)
    for (bool sigmoid : {false, true})
      for (bool norm : {true, false}) {
        const std::string at =
            fmt::format("N={} E={} k={} sigmoid={} norm_topk={}", s.N, s.E, s.k, sigmoid, norm);
        const Routing r = cpu_routing(*cpu, s, logits_for(s, rng), sigmoid, norm, s.N * s.k);
        const size_t NE = size_t(s.N) * s.E, Nk = size_t(s.N) * s.k, NC = size_t(s.N) * s.C;
        const std::vector<float> dtopw = random_floats(Nk, rng);
        const double aux_num = 0.01 * s.E, aux_den = double(s.N) * s.N * s.k, z2 = 2e-3;
        const double loss_scale = 0.25;
        std::vector<float> dl(NE);
        cpu->moe_route_backward(dl.data(), dtopw.data(), r.probs.data(), r.lse.data(), r.top.data(),
                                r.topw.data(), r.counts.data(), aux_num, aux_den, z2, loss_scale,
                                s.N, s.E, s.k, sigmoid, norm);
        DeviceBuffer<float> d_dtopw(dtopw), d_probs(r.probs), d_lse(r.lse), d_topw(r.topw),
            d_dl(NE);
        DeviceBuffer<int32_t> d_top(r.top), d_counts(r.counts);
        cuda::moe_route_backward_cuda(d_dl.get(), d_dtopw.get(), d_probs.get(), d_lse.get(),
                                      d_top.get(), d_topw.get(), d_counts.get(), aux_num, aux_den,
                                      z2, loss_scale, s.N, s.E, s.k, sigmoid, norm, nullptr);
        // The shared experts' gate: its sigmoid and its backward.
        const std::vector<float> pre = random_floats(size_t(s.N), rng, -3.0, 3.0);
        const std::vector<float> y = random_floats(NC, rng), dout = random_floats(NC, rng);
        std::vector<float> g(size_t(s.N)), dgate(size_t(s.N)), dy(NC);
        cpu->sigmoid_forward(g.data(), pre.data(), g.size());
        cpu->moe_gate_backward(dgate.data(), dy.data(), dout.data(), y.data(), g.data(), s.N, s.C);
        DeviceBuffer<float> d_pre(pre), d_g(size_t(s.N)), d_y(y), d_dout(dout),
            d_dgate(size_t(s.N)), d_dy(NC);
        cuda::sigmoid_forward_cuda(d_g.get(), d_pre.get(), g.size(), nullptr);
        cuda::moe_gate_backward_cuda(d_dgate.get(), d_dy.get(), d_dout.get(), d_y.get(), d_g.get(),
                                     s.N, s.C, nullptr);
        expect_within({{"dlogits", err_vs(d_dl.download(), dl), kFp32Tol},
                       {"gate", err_vs(d_g.download(), g), kFp32Tol},
                       {"dgate", err_vs(d_dgate.download(), dgate), kFp32Tol},
                       {"dy", err_vs(d_dy.download(), dy), kFp32Tol}},
                      at);
      }
}

}  // namespace
}  // namespace trident::testing
