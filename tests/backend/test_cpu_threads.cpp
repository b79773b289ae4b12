// Thread count and determinism: a small forward/backward chain through every CpuBackend method.
//   - 1 and 2 threads agree to float rounding (1e-5, scale-relative: only the order of a few
//     sums may differ, e.g. sum_squares' per-thread partials);
//   - the same inputs twice give the same bits, even when the second run's buffers sit at
//     different addresses and alignments (Note [Deterministic reductions] in
//     src/backend/parallel.h).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "backend_test_util.h"
#include "trident/backend.h"

namespace trident {
namespace {

using namespace trident::testing;
using Results = std::map<std::string, std::vector<float>>;

struct Inputs {
  static constexpr int B = 2, T = 32, C = 64, NH = 4, V = 500, Vp = 512, N = B * T;
  std::vector<int32_t> tok, targets;
  std::vector<float> wte, wpe, ln_w, ln_b, w_qkv, b_qkv, w_lm;

  Inputs() {
    std::mt19937 rng(7);
    tok = tokens(N, V, rng);
    targets = tokens(N, V, rng);
    wte = to_float(uniform(size_t(V) * C, rng));
    wpe = to_float(uniform(size_t(T) * C, rng));
    ln_w = to_float(uniform(C, rng, 0.5, 1.5));
    ln_b = to_float(uniform(C, rng));
    w_qkv = to_float(uniform(size_t(3) * C * C, rng, -0.2, 0.2));
    b_qkv = to_float(uniform(3 * C, rng));
    w_lm = to_float(uniform(size_t(Vp) * C, rng, -0.2, 0.2));
  }
};

// A buffer whose data starts `shift` floats into its allocation.
class Shifted {
 public:
  Shifted(size_t n, int shift, float fill = 0.0f) : store_(n + shift, fill), shift_(shift) {}
  Shifted(const std::vector<float>& v, int shift) : Shifted(v.size(), shift) {
    std::copy(v.begin(), v.end(), data());
  }
  float* data() { return store_.data() + shift_; }
  std::vector<float> values() const { return {store_.begin() + shift_, store_.end()}; }

 private:
  std::vector<float> store_;
  int shift_;
};

Results run_chain(Backend& be, const Inputs& in, int shift) {
  constexpr int B = Inputs::B, T = Inputs::T, C = Inputs::C, NH = Inputs::NH, V = Inputs::V,
                Vp = Inputs::Vp, N = Inputs::N;
  Shifted wte(in.wte, shift), wpe(in.wpe, shift), ln_w(in.ln_w, shift), ln_b(in.ln_b, shift),
      w_qkv(in.w_qkv, shift), b_qkv(in.b_qkv, shift), w_lm(in.w_lm, shift);
  Shifted x(N * C, shift), ln(N * C, shift), mean(N, shift), rstd(N, shift), qkv(N * 3 * C, shift),
      att_out(N * C, shift), att(B * NH * T * T, shift), g(N * C, shift), res(N * C, shift),
      logits(size_t(N) * Vp, shift), losses(N, shift);
  be.encoder_forward(x.data(), in.tok.data(), wte.data(), wpe.data(), B, T, C);
  be.layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), ln_w.data(), ln_b.data(), N,
                       C);
  be.matmul_forward(qkv.data(), ln.data(), w_qkv.data(), b_qkv.data(), N, C, 3 * C);
  be.attention_forward(att_out.data(), att.data(), qkv.data(), B, T, C, NH);
  be.gelu_forward(g.data(), att_out.data(), N * C);
  be.add(res.data(), g.data(), x.data(), N * C);
  be.matmul_forward(logits.data(), res.data(), w_lm.data(), nullptr, N, C, Vp);
  Results r;
  r["probs"] = logits.values();  // overwritten below; keep the logits as a result too
  be.crossentropy_forward(losses.data(), logits.data(), in.targets.data(), N, V, Vp);
  r["logits"] = r["probs"];
  r["probs"] = logits.values();

  Shifted dres(N * C, shift), dw_lm(size_t(Vp) * C, shift), dg(N * C, shift),
      dqkv(N * 3 * C, shift), scratch(B * NH * T * T, shift), dln(N * C, shift),
      dw_qkv(3 * C * C, shift), db_qkv(3 * C, shift), dx(N * C, shift), dln_w(C, shift),
      dln_b(C, shift), dwte(V * C, shift), dwpe(T * C, shift);
  be.crossentropy_backward(logits.data(), in.targets.data(), 1.0f / N, N, V, Vp);
  be.matmul_backward(dres.data(), dw_lm.data(), nullptr, logits.data(), res.data(), w_lm.data(), N,
                     C, Vp);
  be.gelu_backward(dg.data(), att_out.data(), dres.data(), N * C);
  be.attention_backward(dqkv.data(), scratch.data(), dg.data(), qkv.data(), att_out.data(),
                        att.data(), B, T, C, NH);
  be.matmul_backward(dln.data(), dw_qkv.data(), db_qkv.data(), dqkv.data(), ln.data(), w_qkv.data(),
                     N, C, 3 * C);
  be.layernorm_backward(dx.data(), dln_w.data(), dln_b.data(), dln.data(), x.data(), ln_w.data(),
                        mean.data(), rstd.data(), N, C);
  be.encoder_backward(dwte.data(), dwpe.data(), dx.data(), in.tok.data(), B, T, C);

  const float norm2 = float(be.sum_squares(dw_qkv.data(), 3 * C * C));
  Shifted m(3 * C * C, shift), v(3 * C * C, shift);
  for (int t = 1; t <= 2; ++t)
    be.adamw_update(w_qkv.data(), m.data(), v.data(), dw_qkv.data(), 3 * C * C, 1e-3f, 0.9f, 0.95f,
                    1e-8f, 0.1f, t, 1.0f / std::sqrt(norm2));

  r["x"] = x.values(), r["ln"] = ln.values(), r["mean"] = mean.values(), r["rstd"] = rstd.values();
  r["qkv"] = qkv.values(), r["att_out"] = att_out.values(), r["att"] = att.values();
  r["res"] = res.values(), r["losses"] = losses.values(), r["dlogits"] = logits.values();
  r["dres"] = dres.values(), r["dw_lm"] = dw_lm.values(), r["dg"] = dg.values();
  r["dqkv"] = dqkv.values(), r["dln"] = dln.values(), r["db_qkv"] = db_qkv.values();
  r["dx"] = dx.values(), r["dln_w"] = dln_w.values(), r["dln_b"] = dln_b.values();
  r["dwte"] = dwte.values(), r["dwpe"] = dwpe.values(), r["norm2"] = {norm2};
  r["w_qkv"] = w_qkv.values(), r["m"] = m.values(), r["v"] = v.values();
  return r;
}

TEST(CpuThreads, OneAndTwoThreadsAgree) {
  const Inputs in;
  auto one = make_cpu_backend(1), two = make_cpu_backend(2);
  EXPECT_EQ(one->threads(), 1);
  EXPECT_EQ(two->threads(), 2);
  const Results a = run_chain(*one, in, 0), b = run_chain(*two, in, 0);
  for (const auto& [name, values] : a) {
    EXPECT_LT(rel_err(b.at(name), to_double(values)), 1e-5) << name;
  }
}

TEST(CpuThreads, SameInputsGiveSameBits) {
  const Inputs in;
  auto be = make_cpu_backend(2);
  const Results a = run_chain(*be, in, 0), b = run_chain(*be, in, 0), c = run_chain(*be, in, 3);
  for (const auto& [name, values] : a) {
    EXPECT_EQ(b.at(name), values) << name;
    EXPECT_EQ(c.at(name), values) << name << " (buffers shifted by 3 floats)";
  }
}

TEST(CpuThreads, RejectsZeroThreads) { EXPECT_THROW(make_cpu_backend(0), std::exception); }

}  // namespace
}  // namespace trident
