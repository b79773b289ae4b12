// GPT-2 forward and backward as a sequence of Backend layer calls.
#include <algorithm>
#include <cstring>

#include "trident/check.h"
#include "trident/model.h"

namespace trident {
namespace {

// Reports one phase to the recorder (if any) when it goes out of scope.
class Phase {
 public:
  Phase(const PhaseFn& fn, std::string name) : fn_(fn), name_(std::move(name)) {
    if (fn_) begin_ = std::chrono::steady_clock::now();
  }
  ~Phase() {
    if (fn_) fn_(name_, begin_, std::chrono::steady_clock::now());
  }

 private:
  const PhaseFn& fn_;
  std::string name_;
  std::chrono::steady_clock::time_point begin_;
};

std::string phase_name(const PhaseFn& fn, const char* what, int layer) {
  return fn ? fmt::format("{} {}", what, layer) : std::string();
}

}  // namespace

GPT::GPT(const GPTConfig& cfg, Backend& backend, int B, int T)
    : cfg_(cfg), be_(backend), maxB_(B), maxT_(T), infos_(gpt_param_layout(cfg)) {
  TRIDENT_CHECK(T <= cfg.max_seq_len, "T {} > max_seq_len {}", T, cfg.max_seq_len);
  TRIDENT_CHECK(cfg.channels % cfg.heads == 0, "C {} % NH {}", cfg.channels, cfg.heads);
  const ParamInfo& last = infos_.back();
  params_.assign(last.offset + last.count, 0.0f);
  grads_.assign(params_.size(), 0.0f);

  const size_t L = cfg.layers, C = cfg.channels, NH = cfg.heads, Vp = cfg.padded_vocab;
  const size_t N = size_t(B) * T;
  Activations& a = acts_;
  a.encoded.resize(N * C);
  a.ln1.resize(L * N * C);
  a.ln1_mean.resize(L * N);
  a.ln1_rstd.resize(L * N);
  a.qkv.resize(L * N * 3 * C);
  a.att.resize(L * B * NH * T * T);
  a.atty.resize(L * N * C);
  a.residual2.resize(L * N * C);
  a.ln2.resize(L * N * C);
  a.ln2_mean.resize(L * N);
  a.ln2_rstd.resize(L * N);
  a.fch.resize(L * N * 4 * C);
  a.fch_gelu.resize(L * N * 4 * C);
  a.residual3.resize(L * N * C);
  a.lnf.resize(N * C);
  a.lnf_mean.resize(N);
  a.lnf_rstd.resize(N);
  a.logits.resize(N * Vp);
  a.losses.resize(N);
  a.dresidual.resize(N * C);
  a.dbuf_c.resize(N * C);
  a.dbuf_c2.resize(N * C);
  a.dbuf_3c.resize(N * 3 * C);
  a.dbuf_4c.resize(N * 4 * C);
  a.dbuf_4c2.resize(N * 4 * C);
  a.datt.resize(size_t(B) * NH * T * T);
}

const ParamInfo& GPT::param(const std::string& name) const {
  for (const ParamInfo& p : infos_)
    if (p.name == name) return p;
  internal_error(__FILE__, __LINE__, "no parameter named " + name);
}

float* GPT::at(float* base, const std::string& name) const { return base + param(name).offset; }

GPT::BlockWeights GPT::block(float* base, int l) const {
  auto p = [&](const char* s) { return at(base, fmt::format("h{}.{}", l, s)); };
  return {p("ln1w"),     p("ln1b"), p("qkvw"), p("qkvb"), p("attprojw"), p("attprojb"),
          p("ln2w"),     p("ln2b"), p("fcw"),  p("fcb"),  p("fcprojw"),  p("fcprojb")};
}

void GPT::zero_grads() { std::memset(grads_.data(), 0, grads_.size() * sizeof(float)); }

float GPT::forward(const int32_t* inputs, const int32_t* targets, int B, int T) {
  TRIDENT_CHECK(B <= maxB_ && T <= maxT_, "micro-batch {}x{} exceeds {}x{}", B, T, maxB_, maxT_);
  const int C = cfg_.channels, NH = cfg_.heads, L = cfg_.layers;
  const int V = cfg_.vocab, Vp = cfg_.padded_vocab;
  const int N = B * T;
  B_ = B;
  T_ = T;
  inputs_.assign(inputs, inputs + N);
  Activations& a = acts_;
  float* P = params_.data();

  {
    Phase ph(phases_, "forward embedding");
    be_.encoder_forward(a.encoded.data(), inputs, at(P, "wte"), at(P, "wpe"), B, T, C);
  }
  const float* residual = a.encoded.data();
  for (int l = 0; l < L; ++l) {
    Phase ph(phases_, phase_name(phases_, "forward block", l));
    BlockWeights w = block(P, l);
    const size_t nc = size_t(l) * N * C;
    float* ln1 = a.ln1.data() + nc;
    float* qkv = a.qkv.data() + 3 * nc;
    float* att = a.att.data() + size_t(l) * B * NH * T * T;
    float* atty = a.atty.data() + nc;
    float* residual2 = a.residual2.data() + nc;
    float* ln2 = a.ln2.data() + nc;
    float* fch = a.fch.data() + 4 * nc;
    float* fch_gelu = a.fch_gelu.data() + 4 * nc;
    float* residual3 = a.residual3.data() + nc;
    float* proj = a.dbuf_c.data();  // projection outputs are consumed at once; scratch is fine

    be_.layernorm_forward(ln1, a.ln1_mean.data() + l * N, a.ln1_rstd.data() + l * N, residual,
                          w.ln1w, w.ln1b, N, C);
    be_.matmul_forward(qkv, ln1, w.qkvw, w.qkvb, N, C, 3 * C);
    be_.attention_forward(atty, att, qkv, B, T, C, NH);
    be_.matmul_forward(proj, atty, w.attprojw, w.attprojb, N, C, C);
    be_.add(residual2, residual, proj, size_t(N) * C);
    be_.layernorm_forward(ln2, a.ln2_mean.data() + l * N, a.ln2_rstd.data() + l * N, residual2,
                          w.ln2w, w.ln2b, N, C);
    be_.matmul_forward(fch, ln2, w.fcw, w.fcb, N, C, 4 * C);
    be_.gelu_forward(fch_gelu, fch, size_t(N) * 4 * C);
    be_.matmul_forward(proj, fch_gelu, w.fcprojw, w.fcprojb, N, 4 * C, C);
    be_.add(residual3, residual2, proj, size_t(N) * C);
    residual = residual3;
  }
  Phase ph(phases_, "forward head+loss");
  be_.layernorm_forward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), residual,
                        at(P, "lnfw"), at(P, "lnfb"), N, C);
  be_.matmul_forward(a.logits.data(), a.lnf.data(), at(P, "wte"), nullptr, N, C, Vp);
  if (!targets) {
    targets_.clear();
    return 0.0f;
  }
  targets_.assign(targets, targets + N);
  be_.crossentropy_forward(a.losses.data(), a.logits.data(), targets, N, V, Vp);
  double sum = 0.0;
  for (int i = 0; i < N; ++i) sum += a.losses[i];
  return float(sum / N);
}

void GPT::backward(float dloss_scale, const GradReadyFn& on_ready, const EmbeddingRowSink* sink) {
  TRIDENT_CHECK(!targets_.empty(), "backward() needs a forward() with targets first");
  const int B = B_, T = T_, N = B * T;
  const int C = cfg_.channels, NH = cfg_.heads, L = cfg_.layers;
  const int V = cfg_.vocab, Vp = cfg_.padded_vocab;
  Activations& a = acts_;
  float* P = params_.data();
  float* G = grads_.data();
  // Parameters are listed in ready order, so "ready" walks the list front to back.
  int next_ready = 0;
  auto ready_through = [&](const std::string& name) {
    if (!on_ready) return;
    for (; next_ready < int(infos_.size()); ++next_ready) {
      if (infos_[next_ready].name == "wte") continue;  // reported on its own, see below
      on_ready(next_ready);
      if (infos_[next_ready].name == name) {
        ++next_ready;
        return;
      }
    }
  };

  {
    Phase ph(phases_, "backward head+loss");
    // Mean over the N tokens of this micro-batch, times the caller's scale (1/accum).
    be_.crossentropy_backward(a.logits.data(), targets_.data(), dloss_scale / float(N), N, V,
                              Vp);
    // dwte first: with a sink that is all wte gets in this buffer, so it can be reduced while
    // the head's input gradient (the rest of backward's critical path) is computed.
    be_.matmul_backward(nullptr, at(G, "wte"), nullptr, a.logits.data(), a.lnf.data(),
                        at(P, "wte"), N, C, Vp);
    if (sink && on_ready) on_ready(0);
    be_.matmul_backward(a.dbuf_c.data(), nullptr, nullptr, a.logits.data(), a.lnf.data(),
                        at(P, "wte"), N, C, Vp);
    const float* final_residual = L > 0 ? a.residual3.data() + size_t(L - 1) * N * C
                                        : a.encoded.data();
    be_.layernorm_backward(a.dresidual.data(), at(G, "lnfw"), at(G, "lnfb"), a.dbuf_c.data(),
                           final_residual, at(P, "lnfw"), a.lnf_mean.data(), a.lnf_rstd.data(),
                           N, C);
    ready_through("lnfb");
  }

  for (int l = L - 1; l >= 0; --l) {
    Phase ph(phases_, phase_name(phases_, "backward block", l));
    BlockWeights w = block(P, l);
    BlockWeights dw = block(G, l);
    const size_t nc = size_t(l) * N * C;
    const float* residual_in = l == 0 ? a.encoded.data() : a.residual3.data() + nc - size_t(N) * C;
    float* dres = a.dresidual.data();  // gradient w.r.t. this block's output

    be_.matmul_backward(a.dbuf_4c.data(), dw.fcprojw, dw.fcprojb, dres,
                        a.fch_gelu.data() + 4 * nc, w.fcprojw, N, 4 * C, C);
    ready_through(fmt::format("h{}.fcprojb", l));
    be_.gelu_backward(a.dbuf_4c2.data(), a.fch.data() + 4 * nc, a.dbuf_4c.data(),
                      size_t(N) * 4 * C);
    be_.matmul_backward(a.dbuf_c.data(), dw.fcw, dw.fcb, a.dbuf_4c2.data(), a.ln2.data() + nc,
                        w.fcw, N, C, 4 * C);
    ready_through(fmt::format("h{}.fcb", l));
    be_.layernorm_backward(a.dbuf_c2.data(), dw.ln2w, dw.ln2b, a.dbuf_c.data(),
                           a.residual2.data() + nc, w.ln2w, a.ln2_mean.data() + l * N,
                           a.ln2_rstd.data() + l * N, N, C);
    ready_through(fmt::format("h{}.ln2b", l));
    be_.add(dres, dres, a.dbuf_c2.data(), size_t(N) * C);  // now w.r.t. residual2

    be_.matmul_backward(a.dbuf_c.data(), dw.attprojw, dw.attprojb, dres, a.atty.data() + nc,
                        w.attprojw, N, C, C);
    ready_through(fmt::format("h{}.attprojb", l));
    be_.attention_backward(a.dbuf_3c.data(), a.datt.data(), a.dbuf_c.data(),
                           a.qkv.data() + 3 * nc, a.att.data() + size_t(l) * B * NH * T * T, B,
                           T, C, NH);
    be_.matmul_backward(a.dbuf_c.data(), dw.qkvw, dw.qkvb, a.dbuf_3c.data(), a.ln1.data() + nc,
                        w.qkvw, N, C, 3 * C);
    ready_through(fmt::format("h{}.qkvb", l));
    be_.layernorm_backward(a.dbuf_c2.data(), dw.ln1w, dw.ln1b, a.dbuf_c.data(), residual_in,
                           w.ln1w, a.ln1_mean.data() + l * N, a.ln1_rstd.data() + l * N, N, C);
    ready_through(fmt::format("h{}.ln1b", l));
    be_.add(dres, dres, a.dbuf_c2.data(), size_t(N) * C);  // now w.r.t. the block's input
  }
  // The token embedding's second (sparse) contribution comes last (Note [Tied embedding
  // gradient]): into the sink's compact rows, or into wte's gradient, which is final only now.
  Phase ph(phases_, "backward embedding");
  if (sink)
    be_.encoder_backward(sink->rows, at(G, "wpe"), a.dresidual.data(), sink->row_of_input, B, T,
                         C);
  else
    be_.encoder_backward(at(G, "wte"), at(G, "wpe"), a.dresidual.data(), inputs_.data(), B, T,
                         C);
  ready_through("wpe");
  if (!sink && on_ready) on_ready(0);  // wte
}

}  // namespace trident
