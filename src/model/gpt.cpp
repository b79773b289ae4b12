// GPT-2 forward and backward as a sequence of Backend layer calls, tensor-parallel in the
// Megatron way (Note [Tensor-parallel shards] in trident/model.h):
//   - qkv and fc are column-parallel (each tp rank computes its heads / its slice of 4C);
//     attproj and fcproj are row-parallel (partial sums, reduced over tp, bias added once);
//   - the residual stream is replicated, or split along the sequence with sequence
//     parallelism (LayerNorm outputs are gathered before the column-parallel linears, the
//     row-parallel outputs reduce-scattered after);
//   - the embedding and the LM head are vocab-parallel, the loss a vocab-parallel softmax.
// The conjugate pair "identity forward / all-reduce backward" sits in layernorm_gathered*,
// "all-reduce forward / identity backward" in reduce_rows / gather_rows (gpt_tp.cpp): written
// once, used by attention, MLP, embedding and head alike. With tp = 1 they are plain copies.
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

GPT::GPT(const GPTConfig& cfg, Backend& backend, int B, int T, TensorParallel tp)
    : cfg_(cfg), be_(backend), maxB_(B), maxT_(T),
      infos_(gpt_param_layout(cfg, tp.size, tp.rank)), tp_(tp) {
  TRIDENT_CHECK(T <= cfg.max_seq_len, "T {} > max_seq_len {}", T, cfg.max_seq_len);
  TRIDENT_CHECK(cfg.channels % cfg.heads == 0, "C {} % NH {}", cfg.channels, cfg.heads);
  TRIDENT_CHECK(tp.size == 1 || tp.comm != nullptr, "tp {} without a communicator", tp.size);
  check_tensor_parallel(cfg, tp.size, tp.sequence_parallel, T);
  if (tp.size == 1) tp_.sequence_parallel = false;
  rows_divisor_ = tp_.sequence_parallel ? tp.size : 1;
  const ParamInfo& last = infos_.back();
  params_.assign(last.offset + last.count, 0.0f);
  grads_.assign(params_.size(), 0.0f);

  const size_t L = cfg.layers, C = cfg.channels, tps = tp.size;
  const size_t NHl = cfg.heads / tps, Cl = C / tps, Vl = cfg.padded_vocab / tps;
  const size_t N = size_t(B) * T, Nr = N / rows_divisor_;
  Activations& a = acts_;
  a.encoded.resize(Nr * C);
  a.ln1.resize(L * N * C);
  a.ln1_mean.resize(L * Nr);
  a.ln1_rstd.resize(L * Nr);
  a.qkv.resize(L * N * 3 * Cl);
  a.att.resize(L * B * NHl * T * T);
  a.atty.resize(L * N * Cl);
  a.residual2.resize(L * Nr * C);
  a.ln2.resize(L * N * C);
  a.ln2_mean.resize(L * Nr);
  a.ln2_rstd.resize(L * Nr);
  a.fch.resize(L * N * 4 * Cl);
  a.fch_gelu.resize(L * N * 4 * Cl);
  a.residual3.resize(L * Nr * C);
  a.lnf.resize(N * C);
  a.lnf_mean.resize(Nr);
  a.lnf_rstd.resize(Nr);
  a.logits.resize(N * Vl);
  a.losses.resize(N);
  a.full_c.resize(N * C);
  a.stage.resize(N * C);
  a.ln_out.resize(Nr * C);
  a.dresidual.resize(Nr * C);
  a.dfull.resize(N * C);
  a.dbuf_c.resize(N * C);
  a.dbuf_c2.resize(Nr * C);
  a.dbuf_3c.resize(N * 3 * Cl);
  a.dbuf_4c.resize(N * 4 * Cl);
  a.dbuf_4c2.resize(N * 4 * Cl);
  a.datt.resize(size_t(B) * NHl * T * T);
  a.dln_scratch.resize(2 * C);
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
  const int C = cfg_.channels, L = cfg_.layers, tps = tp_.size;
  const int NHl = cfg_.heads / tps, Cl = C / tps, Vl = cfg_.padded_vocab / tps;
  const int N = B * T, Nr = N / rows_divisor_;
  B_ = B;
  T_ = T;
  inputs_.assign(inputs, inputs + N);
  Activations& a = acts_;
  float* P = params_.data();
  // Row-parallel biases are added by tp rank 0 only, before the sum over tp.
  const bool add_row_bias = tp_.rank == 0;

  {
    Phase ph(phases_, "forward embedding");
    embedding_forward(a.encoded.data(), inputs, B, T);
  }
  const float* residual = a.encoded.data();
  for (int l = 0; l < L; ++l) {
    Phase ph(phases_, phase_name(phases_, "forward block", l));
    BlockWeights w = block(P, l);
    const size_t nc = size_t(l) * N * C, rc = size_t(l) * Nr * C;
    float* ln1 = a.ln1.data() + nc;
    float* qkv = a.qkv.data() + size_t(l) * N * 3 * Cl;
    float* att = a.att.data() + size_t(l) * B * NHl * T * T;
    float* atty = a.atty.data() + size_t(l) * N * Cl;
    float* residual2 = a.residual2.data() + rc;
    float* ln2 = a.ln2.data() + nc;
    float* fch = a.fch.data() + size_t(l) * N * 4 * Cl;
    float* fch_gelu = a.fch_gelu.data() + size_t(l) * N * 4 * Cl;
    float* residual3 = a.residual3.data() + rc;
    float* partial = a.full_c.data();

    layernorm_gathered(ln1, a.ln1_mean.data() + l * Nr, a.ln1_rstd.data() + l * Nr, residual,
                       w.ln1w, w.ln1b, B, T, C);
    be_.matmul_forward(qkv, ln1, w.qkvw, w.qkvb, N, C, 3 * Cl);
    be_.attention_forward(atty, att, qkv, B, T, Cl, NHl);
    be_.matmul_forward(partial, atty, w.attprojw, add_row_bias ? w.attprojb : nullptr, N, Cl, C);
    reduce_rows(residual2, partial, B, T, C);
    be_.add(residual2, residual2, residual, size_t(Nr) * C);
    layernorm_gathered(ln2, a.ln2_mean.data() + l * Nr, a.ln2_rstd.data() + l * Nr, residual2,
                       w.ln2w, w.ln2b, B, T, C);
    be_.matmul_forward(fch, ln2, w.fcw, w.fcb, N, C, 4 * Cl);
    be_.gelu_forward(fch_gelu, fch, size_t(N) * 4 * Cl);
    be_.matmul_forward(partial, fch_gelu, w.fcprojw, add_row_bias ? w.fcprojb : nullptr, N,
                       4 * Cl, C);
    reduce_rows(residual3, partial, B, T, C);
    be_.add(residual3, residual3, residual2, size_t(Nr) * C);
    residual = residual3;
  }
  Phase ph(phases_, "forward head+loss");
  layernorm_gathered(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), residual,
                     at(P, "lnfw"), at(P, "lnfb"), B, T, C);
  be_.matmul_forward(a.logits.data(), a.lnf.data(), at(P, "wte"), nullptr, N, C, Vl);
  if (!targets) {
    targets_.clear();
    return 0.0f;
  }
  targets_.assign(targets, targets + N);
  return crossentropy_forward(targets, N);
}

void GPT::backward(float dloss_scale, const GradReadyFn& on_ready, const EmbeddingRowSink* sink) {
  TRIDENT_CHECK(!targets_.empty(), "backward() needs a forward() with targets first");
  const int B = B_, T = T_, N = B * T, Nr = N / rows_divisor_;
  const int C = cfg_.channels, L = cfg_.layers, tps = tp_.size;
  const int NHl = cfg_.heads / tps, Cl = C / tps, Vl = cfg_.padded_vocab / tps;
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
  // The gradient w.r.t. the residual stream on all N rows (gathered with sequence parallelism).
  auto dresidual_all_rows = [&]() -> const float* {
    if (rows_divisor_ == 1) return a.dresidual.data();
    gather_rows(a.dfull.data(), a.dresidual.data(), B, T, C);
    return a.dfull.data();
  };

  {
    Phase ph(phases_, "backward head+loss");
    // Mean over the N tokens of this micro-batch, times the caller's scale (1/accum).
    crossentropy_backward(targets_.data(), dloss_scale / float(N), N);
    // dwte first: with a sink that is all wte gets in this buffer, so it can be reduced while
    // the head's input gradient (the rest of backward's critical path) is computed.
    be_.matmul_backward(nullptr, at(G, "wte"), nullptr, a.logits.data(), a.lnf.data(),
                        at(P, "wte"), N, C, Vl);
    if (sink && on_ready) on_ready(0);
    be_.matmul_backward(a.dbuf_c.data(), nullptr, nullptr, a.logits.data(), a.lnf.data(),
                        at(P, "wte"), N, C, Vl);
    const float* final_residual = L > 0 ? a.residual3.data() + size_t(L - 1) * Nr * C
                                        : a.encoded.data();
    layernorm_gathered_backward(a.dresidual.data(), at(G, "lnfw"), at(G, "lnfb"),
                                a.dbuf_c.data(), final_residual, at(P, "lnfw"),
                                a.lnf_mean.data(), a.lnf_rstd.data(), B, T, C);
    ready_through("lnfb");
  }

  for (int l = L - 1; l >= 0; --l) {
    Phase ph(phases_, phase_name(phases_, "backward block", l));
    BlockWeights w = block(P, l);
    BlockWeights dw = block(G, l);
    const size_t nc = size_t(l) * N * C, rc = size_t(l) * Nr * C;
    const size_t n3 = size_t(l) * N * 3 * Cl, n4 = size_t(l) * N * 4 * Cl, na = size_t(l) * N * Cl;
    const float* residual_in = l == 0 ? a.encoded.data() : a.residual3.data() + rc - size_t(Nr) * C;
    float* dres = a.dresidual.data();  // gradient w.r.t. this block's output (this rank's rows)

    const float* dout = dresidual_all_rows();
    be_.matmul_backward(a.dbuf_4c.data(), dw.fcprojw, dw.fcprojb, dout, a.fch_gelu.data() + n4,
                        w.fcprojw, N, 4 * Cl, C);
    ready_through(fmt::format("h{}.fcprojb", l));
    be_.gelu_backward(a.dbuf_4c2.data(), a.fch.data() + n4, a.dbuf_4c.data(),
                      size_t(N) * 4 * Cl);
    be_.matmul_backward(a.dbuf_c.data(), dw.fcw, dw.fcb, a.dbuf_4c2.data(), a.ln2.data() + nc,
                        w.fcw, N, C, 4 * Cl);
    ready_through(fmt::format("h{}.fcb", l));
    layernorm_gathered_backward(a.dbuf_c2.data(), dw.ln2w, dw.ln2b, a.dbuf_c.data(),
                                a.residual2.data() + rc, w.ln2w, a.ln2_mean.data() + l * Nr,
                                a.ln2_rstd.data() + l * Nr, B, T, C);
    ready_through(fmt::format("h{}.ln2b", l));
    be_.add(dres, dres, a.dbuf_c2.data(), size_t(Nr) * C);  // now w.r.t. residual2

    dout = dresidual_all_rows();
    be_.matmul_backward(a.dbuf_c.data(), dw.attprojw, dw.attprojb, dout, a.atty.data() + na,
                        w.attprojw, N, Cl, C);
    ready_through(fmt::format("h{}.attprojb", l));
    be_.attention_backward(a.dbuf_3c.data(), a.datt.data(), a.dbuf_c.data(), a.qkv.data() + n3,
                           a.att.data() + size_t(l) * B * NHl * T * T, B, T, Cl, NHl);
    be_.matmul_backward(a.dbuf_c.data(), dw.qkvw, dw.qkvb, a.dbuf_3c.data(), a.ln1.data() + nc,
                        w.qkvw, N, C, 3 * Cl);
    ready_through(fmt::format("h{}.qkvb", l));
    layernorm_gathered_backward(a.dbuf_c2.data(), dw.ln1w, dw.ln1b, a.dbuf_c.data(), residual_in,
                                w.ln1w, a.ln1_mean.data() + l * Nr, a.ln1_rstd.data() + l * Nr,
                                B, T, C);
    ready_through(fmt::format("h{}.ln1b", l));
    be_.add(dres, dres, a.dbuf_c2.data(), size_t(Nr) * C);  // now w.r.t. the block's input
  }
  // The token embedding's second (sparse) contribution comes last (Note [Tied embedding
  // gradient]): into the sink's compact rows, or into wte's gradient, which is final only now.
  Phase ph(phases_, "backward embedding");
  embedding_backward(dresidual_all_rows(), sink, B, T);
  ready_through("wpe");
  if (!sink && on_ready) on_ready(0);  // wte
}

}  // namespace trident
