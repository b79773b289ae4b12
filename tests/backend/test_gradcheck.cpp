// Finite-difference checks of every layer's backward, in double precision.
//
// Each test takes a scalar objective L = Σ out ⊙ R (R random, so dL/dout = R), runs the layer's
// backward with dout = R, and compares every input and weight gradient with central differences.
// Step h = 1e-5 in double: the truncation error is ~h²·|f'''| ≈ 1e-10 and the rounding error
// ~1e-16·|L|/h ≈ 1e-10 for these O(1) objectives (observed: 5e-12 to 7e-11, scale-relative);
// the threshold 1e-6 leaves a wide margin yet catches any real mistake (a wrong term is O(1)).
#include <gtest/gtest.h>

#include "backend/kernels.h"
#include "backend_test_util.h"

namespace trident {
namespace {

using namespace trident::testing;
constexpr double kStep = 1e-5;
constexpr double kTolerance = 1e-6;
constexpr int kThreads = 2;

TEST(GradCheck, Encoder) {
  const int B = 2, T = 3, C = 4, vocab = 5;
  std::mt19937 rng(1);
  const std::vector<int32_t> tok = {1, 3, 1, 0, 3, 1};  // repeats: dwte must collect them all
  auto wte = uniform(vocab * C, rng), wpe = uniform(T * C, rng);
  const auto r = uniform(B * T * C, rng);
  auto loss = [&] {
    std::vector<double> out(B * T * C);
    cpu::encoder_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C, kThreads);
    return weighted_sum(out, r);
  };
  std::vector<double> dwte(wte.size(), 0.0), dwpe(wpe.size(), 0.0);
  cpu::encoder_backward(dwte.data(), dwpe.data(), r.data(), tok.data(), B, T, C, kThreads);
  EXPECT_LT(rel_err(dwte, numeric_grad(wte, loss, kStep)), kTolerance);
  EXPECT_LT(rel_err(dwpe, numeric_grad(wpe, loss, kStep)), kTolerance);
}

TEST(GradCheck, LayerNorm) {
  const int N = 3, C = 7;
  std::mt19937 rng(2);
  auto inp = uniform(N * C, rng, -2.0, 3.0), w = uniform(C, rng), b = uniform(C, rng);
  const auto r = uniform(N * C, rng);
  std::vector<double> out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N,
                           C, kThreads);
    return weighted_sum(out, r);
  };
  loss();
  std::vector<double> dinp(N * C), dw(C, 0.0), db(C, 0.0);
  cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), r.data(), inp.data(), w.data(),
                          mean.data(), rstd.data(), N, C, kThreads);
  EXPECT_LT(rel_err(dinp, numeric_grad(inp, loss, kStep)), kTolerance);
  EXPECT_LT(rel_err(dw, numeric_grad(w, loss, kStep)), kTolerance);
  EXPECT_LT(rel_err(db, numeric_grad(b, loss, kStep)), kTolerance);
}

TEST(GradCheck, Matmul) {
  const int N = 3, C = 5, OC = 4;
  std::mt19937 rng(3);
  auto inp = uniform(N * C, rng), w = uniform(OC * C, rng), bias = uniform(OC, rng);
  const auto r = uniform(N * OC, rng);
  auto loss = [&] {
    std::vector<double> out(N * OC);
    cpu::matmul_forward(out.data(), inp.data(), w.data(), bias.data(), N, C, OC, kThreads);
    return weighted_sum(out, r);
  };
  std::vector<double> dinp(N * C), dw(OC * C, 0.0), dbias(OC, 0.0);
  cpu::matmul_backward(dinp.data(), dw.data(), dbias.data(), r.data(), inp.data(), w.data(), N, C,
                       OC, kThreads);
  EXPECT_LT(rel_err(dinp, numeric_grad(inp, loss, kStep)), kTolerance);
  EXPECT_LT(rel_err(dw, numeric_grad(w, loss, kStep)), kTolerance);
  EXPECT_LT(rel_err(dbias, numeric_grad(bias, loss, kStep)), kTolerance);
}

TEST(GradCheck, Attention) {
  const int B = 2, T = 4, C = 6, NH = 2;
  std::mt19937 rng(4);
  auto qkv = uniform(B * T * 3 * C, rng, -2.0, 2.0);  // wide enough for uneven softmaxes
  const auto r = uniform(B * T * C, rng);
  std::vector<double> out(B * T * C), att(B * NH * T * T);
  auto loss = [&] {
    cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, kThreads);
    return weighted_sum(out, r);
  };
  loss();
  std::vector<double> dqkv(qkv.size()), scratch(att.size());
  cpu::attention_backward(dqkv.data(), scratch.data(), r.data(), qkv.data(), att.data(), B, T, C,
                          NH, kThreads);
  EXPECT_LT(rel_err(dqkv, numeric_grad(qkv, loss, kStep)), kTolerance);
}

TEST(GradCheck, Gelu) {
  const size_t n = 40;
  std::mt19937 rng(5);
  auto inp = uniform(n, rng, -5.0, 5.0);
  const auto r = uniform(n, rng);
  auto loss = [&] {
    std::vector<double> out(n);
    cpu::gelu_forward(out.data(), inp.data(), n, kThreads);
    return weighted_sum(out, r);
  };
  std::vector<double> dinp(n);
  cpu::gelu_backward(dinp.data(), inp.data(), r.data(), n, kThreads);
  EXPECT_LT(rel_err(dinp, numeric_grad(inp, loss, kStep)), kTolerance);
}

TEST(GradCheck, CrossEntropy) {
  const int N = 3, V = 5, Vp = 8;
  const double dloss = 0.7;  // L = dloss · Σ losses
  std::mt19937 rng(6);
  auto logits = uniform(N * Vp, rng, -3.0, 3.0);  // padded columns hold values too: must not count
  const std::vector<int32_t> targets = {4, 0, 2};
  std::vector<double> probs;
  auto loss = [&] {
    probs = logits;
    std::vector<double> losses(N);
    cpu::crossentropy_forward(losses.data(), probs.data(), targets.data(), N, V, Vp, kThreads);
    double s = 0.0;
    for (double l : losses) s += dloss * l;
    return s;
  };
  loss();
  std::vector<double> dlogits = probs;
  cpu::crossentropy_backward(dlogits.data(), targets.data(), dloss, N, V, Vp, kThreads);
  // Central differences include the padded columns, where the loss must not move (gradient 0).
  EXPECT_LT(rel_err(dlogits, numeric_grad(logits, loss, kStep)), kTolerance);
}

}  // namespace
}  // namespace trident
