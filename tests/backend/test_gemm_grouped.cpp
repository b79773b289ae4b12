// The experts' grouped products (Backend::matmul_forward_grouped / matmul_backward_grouped) on
// the CPU backend against their definition and against one matmul_forward / matmul_backward per
// expert, as src/model/moe.cpp called them before: uneven rows, experts with none (first,
// middle, last), shapes that split along rows and along columns, 1, 2 and 3 threads
// (Note [Grouped GEMM] in src/backend/gemm.cpp).
//   - bitwise equal to the per-expert calls at the same thread count: the same OpenBLAS calls;
//   - within 1e-5 of scale of a double reference (sums of ≤ 600 float products);
//   - dw accumulates (+=) and an expert without rows keeps its dw; dinp and out assign.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "backend_test_util.h"
#include "trident/backend.h"

namespace trident {
namespace {

using namespace trident::testing;

struct Group {
  static constexpr int C = 40, OC = 600;
  std::vector<int32_t> rows_at{0};
  std::vector<float> inp, w, dout, dw0;

  explicit Group(const std::vector<int>& rows) {
    for (int n : rows) rows_at.push_back(rows_at.back() + n);
    std::mt19937 rng(5);
    const size_t R = size_t(rows_at.back()), E = rows.size();
    inp = to_float(uniform(R * C, rng));
    w = to_float(uniform(E * OC * C, rng, -0.3, 0.3));
    dout = to_float(uniform(R * OC, rng));
    dw0 = to_float(uniform(E * OC * C, rng));  // dw accumulates onto this
  }
  int experts() const { return int(rows_at.size()) - 1; }
  int rows() const { return rows_at.back(); }
};

struct Outputs {
  std::vector<float> out, dinp, dw;
};

Outputs run_grouped(Backend& be, const Group& g) {
  const int E = g.experts(), R = g.rows(), C = Group::C, OC = Group::OC;
  Outputs o{nans(size_t(R) * OC), nans(size_t(R) * C), g.dw0};
  be.matmul_forward_grouped(o.out.data(), g.inp.data(), g.w.data(), g.rows_at.data(), E, C, OC);
  be.matmul_backward_grouped(o.dinp.data(), o.dw.data(), g.dout.data(), g.inp.data(), g.w.data(),
                             g.rows_at.data(), E, C, OC);
  return o;
}

// The loop src/model/moe.cpp ran before the grouped calls.
Outputs run_per_expert(Backend& be, const Group& g) {
  const int R = g.rows(), C = Group::C, OC = Group::OC;
  Outputs o{nans(size_t(R) * OC), nans(size_t(R) * C), g.dw0};
  for (int e = 0; e < g.experts(); ++e) {
    const int r0 = g.rows_at[size_t(e)], n = g.rows_at[size_t(e) + 1] - r0;
    if (n == 0) continue;
    const size_t we = size_t(e) * OC * C;
    be.matmul_forward(o.out.data() + size_t(r0) * OC, g.inp.data() + size_t(r0) * C,
                      g.w.data() + we, nullptr, n, C, OC);
    be.matmul_backward(o.dinp.data() + size_t(r0) * C, o.dw.data() + we, nullptr,
                       g.dout.data() + size_t(r0) * OC, g.inp.data() + size_t(r0) * C,
                       g.w.data() + we, n, C, OC);
  }
  return o;
}

// out, dinp and dw from their definitions, in double.
void reference(const Group& g, std::vector<double>* out, std::vector<double>* dinp,
               std::vector<double>* dw) {
  const int C = Group::C, OC = Group::OC;
  out->assign(size_t(g.rows()) * OC, 0.0);
  dinp->assign(size_t(g.rows()) * C, 0.0);
  dw->assign(g.dw0.begin(), g.dw0.end());
  for (int e = 0; e < g.experts(); ++e)
    for (int r = g.rows_at[size_t(e)]; r < g.rows_at[size_t(e) + 1]; ++r)
      for (int o = 0; o < OC; ++o)
        for (int c = 0; c < C; ++c) {
          const size_t wi = (size_t(e) * OC + o) * C + c;
          const double x = g.inp[size_t(r) * C + c], d = g.dout[size_t(r) * OC + o];
          (*out)[size_t(r) * OC + o] += x * g.w[wi];
          (*dinp)[size_t(r) * C + c] += d * g.w[wi];
          (*dw)[wi] += d * x;
        }
}

// The number of elements whose bits differ, 0 when bitwise equal.
size_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  size_t n = a.size() == b.size() ? 0 : std::max(a.size(), b.size());
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

void expect_bitwise(const Outputs& got, const Outputs& want) {
  EXPECT_EQ(differing(got.out, want.out), 0u) << "out";
  EXPECT_EQ(differing(got.dinp, want.dinp), 0u) << "dinp";
  EXPECT_EQ(differing(got.dw, want.dw), 0u) << "dw";
}

void expect_close(const Outputs& got, const std::vector<double>& out,
                  const std::vector<double>& dinp, const std::vector<double>& dw) {
  EXPECT_LT(rel_err(got.out, out), 1e-5) << "out";
  EXPECT_LT(rel_err(got.dinp, dinp), 1e-5) << "dinp";
  EXPECT_LT(rel_err(got.dw, dw), 1e-5) << "dw";
}

class GroupedGemm : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(GroupedGemm, EqualsPerExpertCallsBitForBit) {
  const Group g(GetParam());
  std::vector<double> out, dinp, dw;
  reference(g, &out, &dinp, &dw);
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << threads << " threads");
    auto be = make_cpu_backend(threads);
    const Outputs grouped = run_grouped(*be, g);
    expect_close(grouped, out, dinp, dw);
    expect_bitwise(grouped, run_per_expert(*be, g));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Rows, GroupedGemm,
    ::testing::Values(std::vector<int>{0, 3, 700, 0, 1, 17, 0},  // 0-row experts, one taller than
                                                                 // wide: split along rows
                      std::vector<int>{130, 126},                // two loaded experts, as mixtral
                      std::vector<int>{0, 0, 2}, std::vector<int>{1}));

// Null dinp or dw skips that product only; no rows at all touches nothing.
TEST(GroupedGemm, NullOutputsAndNoRows) {
  const Group g({4, 0, 9});
  auto be = make_cpu_backend(2);
  const Outputs both = run_grouped(*be, g);
  const int E = g.experts(), C = Group::C, OC = Group::OC;
  std::vector<float> dinp = nans(both.dinp.size()), dw = g.dw0;
  be->matmul_backward_grouped(dinp.data(), nullptr, g.dout.data(), g.inp.data(), g.w.data(),
                              g.rows_at.data(), E, C, OC);
  EXPECT_EQ(dinp, both.dinp);
  be->matmul_backward_grouped(nullptr, dw.data(), g.dout.data(), g.inp.data(), g.w.data(),
                              g.rows_at.data(), E, C, OC);
  EXPECT_EQ(dw, both.dw);
  const std::vector<int32_t> none(size_t(E) + 1, 0);
  std::vector<float> out = nans(4);
  dw = g.dw0;
  be->matmul_forward_grouped(out.data(), g.inp.data(), g.w.data(), none.data(), E, C, OC);
  be->matmul_backward_grouped(nullptr, dw.data(), g.dout.data(), g.inp.data(), g.w.data(),
                              none.data(), E, C, OC);
  EXPECT_EQ(dw, g.dw0);
  for (float v : out) EXPECT_TRUE(std::isnan(v));
}

}  // namespace
}  // namespace trident
