// The mixture layer (src/model/moe.h): routing, permutation and combine as Backend ops
// (Note [Mixture ops]), the GEMMs through the Backend, the counts on the host. Everything runs
// in a fixed order whatever the thread count: loops over tokens are parallel only where each
// token writes its own row, and sums over a token's k choices or over the tokens of an expert
// run in one order.
#include "model/moe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "model/activation.h"
#include "trident/check.h"

namespace trident {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// A routing summary of `size` doubles (moe_permute): [E+1] sums, then 2E int32 counts from its
// third (its size is 3(E+1)), in device memory or in the host's copy.
int32_t* summary_counts(double* summary, size_t size) {
  return reinterpret_cast<int32_t*>(summary + size / 3);
}

}  // namespace

// Note [Expert counts on the host]
// The experts' GEMMs are per-expert GEMMs on row offsets, and the ep all-to-all (MPI, or NCCL's
// grouped send/recv) takes its counts from the host: so the per-expert rows reach the host once
// per layer per micro-batch forward, the routing summary (counts | kept | probability and z
// sums) in one device-to-host copy, a wait for the device; ep's counts are then exchanged
// between the hosts (ExpertParallel::counts), not on the device and back. Backward reuses
// forward's and waits for nothing. Megatron-Core's dropless path waits likewise; no grouped
// GEMM we have reads its sizes on the device (docs/decisions.md, "Mixture of experts on the
// GPU").
struct MoeLayer::SlotState {
  int N = 0, M = 0, R = 0;  // tokens, rows sent (kept choices), rows received
  int64_t dropped = 0;
  // Backend memory: [N,E] router logits and scores (softmax p or sigmoid s), [N] their
  // log-sum-exp; [N,k] each choice's expert, its row (-1: dropped), its combine weight; [M] the
  // token of each sent row; the summary (moe_permute: [E+1] sums, then [2E] int32 counts).
  BackendBuffer<float> logits, probs, lse, topw;
  BackendBuffer<int32_t> top, pos, send_token;
  BackendBuffer<double> summary;
  // The host's copies (Note [Expert counts on the host]).
  std::vector<int32_t> count;    // [E] choices per expert, before drops
  std::vector<int32_t> kept;     // [E] rows sent per expert (expert order)
  std::vector<int32_t> recv;     // [ep][El] rows from peer p for local expert e
  std::vector<int32_t> rows_at;  // [El+1] local expert e's rows in xr
  // [M,C] [R,C] [R,fcr] [R,Fe] [M,C] (h, act: recompute none); the shared experts' [N,fcs]
  // [N,Fs] [N,C] [N].
  BackendBuffer<float> xs, xr, h, act, ys;
  BackendBuffer<float> sh_h, sh_act, sh_y, sh_g;
  int32_t* counts() { return summary_counts(summary.data(), summary.size()); }
};

struct MoeLayer::Scratch {
  BackendBuffer<float> h, act, yr;  // Note [Mixture memory]: h and act under mlp and full
  BackendBuffer<float> dys, dyr, dact, dh, dxr, dxs, dlogits, dtopw, dx2, peer;
  BackendBuffer<float> dsh_y, dsh_act, dsh_h, dgate;
  std::vector<double> summary;  // the host's copy of a slot's summary
  std::vector<size_t> send_counts, recv_counts, int_counts;
};

// Note [Mixture memory]
// A mixture layer's buffers are fp32. Per slot it keeps what backward reads: the routing, the
// rows sent and received, with recompute none the experts' h and act (mlp computes them again
// in backward). Shared by every mixture layer (one runs at a time, nothing outlives a call):
// backward's scratch, the outputs before they go home, h and act under mlp and full, and under
// full the slots too (the block's forward refills them right before its backward). A rank
// receives at most R = ep·N·min(k, E/ep) rows (k distinct experts a token): dropless, what a
// slot holds. N: this rank's rows, B·T or B·T/tp under SP. Its block keeps no fc/act rows.
MoeLayer::MoeLayer(const GPTConfig& cfg, Backend& be, int layer, int slots, int max_tokens,
                   ExpertParallel ep, MoeHfTotals* hf, Recompute recompute, const MoeLayer* share)
    : cfg_(cfg), be_(be), layer_(layer), max_tokens_(max_tokens), ep_(ep), hf_(hf),
      recompute_(recompute) {
  const bool keep_hidden = recompute == Recompute::kNone;
  const int E = cfg.moe.experts, k = cfg.moe.top_k, C = cfg.channels;
  const int Fe = cfg.expert_width(), fcr = cfg.fc_rows_of(Fe), El = E / ep.size;
  const int Fs = cfg.shared_width(), fcs = cfg.fc_rows_of(Fs);
  const size_t N = size_t(max_tokens), M = N * size_t(k);
  const size_t R = N * size_t(ep.size) * size_t(std::min(k, El));
  TRIDENT_CHECK(
      cfg.moe.aux_loss != MoeAux::kHF || (hf && hf->count_device.size() >= size_t(slots) * E),
      "mixture layer {}: the hf form needs its totals' {} counts in backend memory", layer,
      size_t(slots) * E);
  auto floats = [&](size_t n) { return BackendBuffer<float>(be, n); };
  auto ints = [&](size_t n) { return BackendBuffer<int32_t>(be, n); };
  // Note [Mixture memory]: full runs each block's forward again right before its backward, so
  // one set of slots serves every mixture layer.
  if (share && recompute == Recompute::kFull) {
    slots_ = share->slots_;
    owns_slots_ = false;
  } else {
    slots_ = std::make_shared<std::vector<SlotState>>(size_t(slots));
  }
  const size_t own_slots = owns_slots_ ? slots_->size() : 0;
  for (size_t i = 0; i < own_slots; ++i) {
    SlotState& s = (*slots_)[i];
    s.logits = floats(N * E);
    s.probs = floats(N * E);
    s.lse = floats(N);
    s.top = ints(M);
    s.pos = ints(M);
    s.topw = floats(M);
    s.send_token = ints(M);
    // [E+1] sums, then 2E int32s in E doubles, padded to 3(E+1) so counts() finds them.
    s.summary = BackendBuffer<double>(be, 3 * (size_t(E) + 1));
    s.count.resize(size_t(E));
    s.kept.resize(size_t(E));
    s.recv.resize(size_t(ep.size) * El);
    s.rows_at.resize(size_t(El) + 1);
    s.xs = floats(M * C);
    if (keep_hidden) {
      s.h = floats(R * fcr);
      s.act = floats(R * Fe);
    }
    s.ys = floats(M * C);
    if (ep.size > 1) s.xr = floats(R * C);
    if (Fs > 0) {
      s.sh_h = floats(N * fcs);
      s.sh_act = floats(N * Fs);
      s.sh_y = floats(N * C);
      if (cfg.moe.shared_gate) s.sh_g = floats(N);
    }
  }
  step_load_.assign(size_t(E), 0.0);
  if (share) {
    TRIDENT_CHECK(share->max_tokens_ == max_tokens && share->ep_.size == ep.size,
                  "mixture layer {} shares the scratch of layer {}, sized for other rows", layer,
                  share->layer_);
    scratch_ = share->scratch_;
    owns_scratch_ = false;
    return;
  }
  scratch_ = std::make_shared<Scratch>();
  Scratch& x = *scratch_;
  if (!keep_hidden) {
    x.h = floats(R * fcr);
    x.act = floats(R * Fe);
  }
  x.yr = floats(ep.size > 1 ? R * C : 0);
  x.dys = floats(M * C);
  x.dyr = floats(ep.size > 1 ? R * C : 0);
  x.dact = floats(R * Fe);
  x.dh = floats(R * fcr);
  x.dxr = floats(R * C);
  x.dxs = floats(ep.size > 1 ? M * C : 0);
  x.peer = floats(ep.size > 1 ? R * C : 0);
  x.dlogits = floats(N * E);
  x.dtopw = floats(M);
  x.dx2 = floats(N * C);
  if (Fs > 0) {
    x.dsh_y = floats(N * C);
    x.dsh_act = floats(N * Fs);
    x.dsh_h = floats(N * fcs);
    x.dgate = floats(N);
  }
  x.summary.resize(3 * (size_t(E) + 1));
  x.send_counts.resize(size_t(ep.size));
  x.recv_counts.resize(size_t(ep.size));
  x.int_counts.assign(size_t(ep.size), size_t(El));
}

MoeLayer::~MoeLayer() = default;

// The router's scores, each token's top k and their weights, the permutation (the Backend's
// ops: Note [Mixture ops]); the summary to the host (Note [Expert counts on the host]); the
// statistics and the transformers-form totals when `counted`.
void MoeLayer::route(SlotState& s, const float* x, const MoeWeights& w, int N, bool counted) {
  const MoeConfig& m = cfg_.moe;
  const int E = m.experts, k = m.top_k, C = cfg_.channels;
  const bool sigmoid = m.router == MoeRouter::kSigmoid;
  be_.matmul_forward(s.logits.data(), x, w.router, nullptr, N, C, E);
  be_.moe_route_forward(s.probs.data(), s.lse.data(), s.top.data(), s.topw.data(), s.logits.data(),
                        sigmoid ? w.routerbias : nullptr, N, E, k, sigmoid, m.norm_topk);
  const int cap =
      m.capacity_factor > 0 ? int(std::ceil(double(m.capacity_factor) * double(N) * k / E)) : N * k;
  const size_t slot = size_t(&s - slots_->data());
  int32_t* hf_count =
      counted && m.aux_loss == MoeAux::kHF ? hf_->count_device.data() + slot * size_t(E) : nullptr;
  be_.moe_permute(s.pos.data(), s.send_token.data(), s.counts(), s.summary.data(), hf_count,
                  s.top.data(), s.probs.data(), s.lse.data(), N, E, k, cap);
  std::vector<double>& summary = scratch_->summary;
  be_.copy(summary.data(), s.summary.data(), summary.size() * sizeof(double));
  const int32_t* counts = summary_counts(summary.data(), summary.size());
  std::copy(counts, counts + E, s.count.begin());
  std::copy(counts + E, counts + 2 * E, s.kept.begin());
  s.M = 0;
  for (int i = 0; i < E; ++i) s.M += s.kept[size_t(i)];
  s.dropped = int64_t(N) * k - s.M;
  if (!counted) return;
  const double* psum = summary.data();
  const double mean = double(N) * k / E;
  double mx = 0, aux = 0, z = 0;
  for (int i = 0; i < E; ++i) {
    mx = std::max(mx, double(s.count[size_t(i)]));
    step_load_[size_t(i)] += s.count[size_t(i)];
    if (m.aux_loss == MoeAux::kSwitch)
      aux += psum[size_t(i)] * s.count[size_t(i)] * m.aux_coeff * E / (double(N) * N * k);
  }
  if (m.z_coeff > 0) {
    z = psum[size_t(E)];
    z *= m.z_coeff / double(N);
  }
  if (m.aux_loss == MoeAux::kHF) {
    for (int i = 0; i < E; ++i) {
      hf_->count[slot * E + i] += s.count[size_t(i)];
      hf_->psum[slot * E + i] += psum[size_t(i)];
    }
    ++hf_->layers[slot];
  }
  stats_.aux_loss += aux;
  stats_.z_loss += z;
  stats_.load_max_over_mean += mean > 0 ? mx / mean : 0.0;
  stats_.layers_seen += 1;
  stats_.choices += int64_t(N) * k;
  stats_.dropped += s.dropped;
}

// ep > 1: each rank's kept rows per expert to the experts' ranks, an all-to-all of E/ep
// integers a peer between the hosts (Note [Expert counts on the host]); a local expert's rows
// follow, [local expert][peer].
void MoeLayer::exchange_counts(SlotState& s) {
  const int P = ep_.size, El = cfg_.moe.experts / P;
  Scratch& x = *scratch_;
  const auto t0 = std::chrono::steady_clock::now();
  Communicator& host = ep_.counts ? *ep_.counts : *ep_.comm;
  host.all_to_all_v(s.kept.data(), x.int_counts.data(), s.recv.data(), x.int_counts.data()).wait();
  const double ms = ms_since(t0);
  stats_.a2a_ms += ms;
  stats_.a2a_exposed_ms += ms;  // the compute thread waits for it
  s.rows_at[0] = 0;
  for (int e = 0; e < El; ++e) {
    int n = 0;
    for (int p = 0; p < P; ++p) n += s.recv[size_t(p) * El + e];
    s.rows_at[size_t(e) + 1] = s.rows_at[size_t(e)] + n;
  }
  s.R = s.rows_at[size_t(El)];
}

// Rows in send order (the M rows of this rank, in expert order) to the experts' ranks, into
// expert-major order there ([local expert][peer]); `back`: the reverse, rows in [local
// expert][peer] order home into send order. `width` floats a row.
void MoeLayer::dispatch(SlotState& s, const float* rows, float* out, int width, bool back) {
  const int P = ep_.size, El = cfg_.moe.experts / P;
  Scratch& x = *scratch_;
  auto t0 = std::chrono::steady_clock::now();
  // Peer-major staging [peer][local expert] on the experts' side.
  float* staged = x.peer.data();
  auto reorder = [&](const float* src, float* dst, bool to_expert_major) {
    size_t peer_major = 0;
    for (int p = 0; p < P; ++p)
      for (int e = 0; e < El; ++e) {
        size_t expert_major = size_t(s.rows_at[size_t(e)]);
        for (int q = 0; q < p; ++q) expert_major += size_t(s.recv[size_t(q) * El + e]);
        const size_t n = size_t(s.recv[size_t(p) * El + e]) * width;
        if (to_expert_major)
          be_.copy(dst + expert_major * width, src + peer_major * width, n * sizeof(float));
        else be_.copy(dst + peer_major * width, src + expert_major * width, n * sizeof(float));
        peer_major += size_t(s.recv[size_t(p) * El + e]);
      }
  };
  for (int p = 0; p < P; ++p) {
    size_t mine = 0, theirs = 0;
    for (int e = 0; e < El; ++e) {
      mine += size_t(s.kept[size_t(p) * El + e]);
      theirs += size_t(s.recv[size_t(p) * El + e]);
    }
    x.send_counts[size_t(p)] = (back ? theirs : mine) * width;
    x.recv_counts[size_t(p)] = (back ? mine : theirs) * width;
  }
  if (!back) {
    ep_.comm->all_to_all_v(rows, x.send_counts.data(), staged, x.recv_counts.data()).wait();
    reorder(staged, out, true);
  } else {
    reorder(rows, staged, false);
    ep_.comm->all_to_all_v(staged, x.send_counts.data(), out, x.recv_counts.data()).wait();
  }
  const double ms = ms_since(t0);
  stats_.a2a_ms += ms;
  stats_.a2a_exposed_ms += ms;  // the compute thread waits for every exchange
}

float* MoeLayer::h_of(SlotState& s) { return s.h.size() ? s.h.data() : scratch_->h.data(); }
float* MoeLayer::act_of(SlotState& s) { return s.act.size() ? s.act.data() : scratch_->act.data(); }

void MoeLayer::experts_up(SlotState& s, const MoeWeights& w) {
  const int C = cfg_.channels, Fe = cfg_.expert_width(), fcr = cfg_.fc_rows_of(Fe);
  const int El = cfg_.moe.experts / ep_.size;
  const float* xr = ep_.size > 1 ? s.xr.data() : s.xs.data();
  float* h = h_of(s);
  be_.matmul_forward_grouped(h, xr, w.expfcw, s.rows_at.data(), El, C, fcr);
  activation_forward(be_, cfg_.activation, act_of(s), h, s.rows_at[size_t(El)], Fe);
}

void MoeLayer::experts_forward(SlotState& s, const MoeWeights& w) {
  const int C = cfg_.channels, Fe = cfg_.expert_width();
  const int El = cfg_.moe.experts / ep_.size;
  experts_up(s, w);
  float* yr = ep_.size > 1 ? scratch_->yr.data() : s.ys.data();
  be_.matmul_forward_grouped(yr, act_of(s), w.expfcprojw, s.rows_at.data(), El, Fe, C);
}

void MoeLayer::forward(int slot, float* out, const float* x, const MoeWeights& w, int N,
                       bool counted) {
  TRIDENT_CHECK(N <= max_tokens_, "mixture layer {}: {} tokens, built for {}", layer_, N,
                max_tokens_);
  SlotState& s = (*slots_)[size_t(slot)];
  const MoeConfig& m = cfg_.moe;
  const int E = m.experts, k = m.top_k, C = cfg_.channels, P = ep_.size;
  s.N = N;
  const auto t_layer = std::chrono::steady_clock::now();
  route(s, x, w, N, counted);
  be_.moe_gather_rows(s.xs.data(), x, s.send_token.data(), s.M, C);
  stats_.route_ms += ms_since(t_layer);
  if (P > 1) {  // the counts first: this rank's rows for each peer's experts
    exchange_counts(s);
    dispatch(s, s.xs.data(), s.xr.data(), C, false);
  } else {
    s.rows_at[0] = 0;
    for (int e = 0; e < E; ++e) s.rows_at[size_t(e) + 1] = s.rows_at[size_t(e)] + s.kept[size_t(e)];
    std::copy(s.kept.begin(), s.kept.end(), s.recv.begin());
    s.R = s.M;
  }
  experts_forward(s, w);
  if (P > 1) dispatch(s, scratch_->yr.data(), s.ys.data(), C, true);
  // The shared experts on every token, then each token's sum over its choices in choice order.
  const int Fs = cfg_.shared_width();
  if (Fs > 0) {
    const int fcs = cfg_.fc_rows_of(Fs);
    be_.matmul_forward(s.sh_h.data(), x, w.shfcw, nullptr, N, C, fcs);
    activation_forward(be_, cfg_.activation, s.sh_act.data(), s.sh_h.data(), N, Fs);
    be_.matmul_forward(s.sh_y.data(), s.sh_act.data(), w.shfcprojw, nullptr, N, Fs, C);
    if (m.shared_gate) {
      be_.matmul_forward(s.sh_g.data(), x, w.shgate, nullptr, N, C, 1);
      be_.sigmoid_forward(s.sh_g.data(), s.sh_g.data(), size_t(N));
    }
  }
  const auto t_combine = std::chrono::steady_clock::now();
  be_.moe_combine_forward(out, s.ys.data(), Fs > 0 ? s.sh_y.data() : nullptr,
                          Fs > 0 && m.shared_gate ? s.sh_g.data() : nullptr, s.pos.data(),
                          s.topw.data(), N, C, k);
  stats_.route_ms += ms_since(t_combine);
  stats_.layer_ms += ms_since(t_layer);
}

void MoeLayer::experts_backward(SlotState& s, const MoeWeights& w, const MoeGrads& g) {
  Scratch& x = *scratch_;
  const int C = cfg_.channels, Fe = cfg_.expert_width(), fcr = cfg_.fc_rows_of(Fe);
  const int El = cfg_.moe.experts / ep_.size, R = s.rows_at[size_t(El)];
  const float* xr = ep_.size > 1 ? s.xr.data() : s.xs.data();
  const float* dyr = ep_.size > 1 ? x.dyr.data() : x.dys.data();
  // Note [Mixture memory]: mlp computes h and act again here; full's forward just did.
  if (recompute_ == Recompute::kMlp) experts_up(s, w);
  const float *h = h_of(s), *act = act_of(s);
  be_.matmul_backward_grouped(x.dact.data(), g.expfcprojw, dyr, act, w.expfcprojw, s.rows_at.data(),
                              El, Fe, C);
  activation_backward(be_, cfg_.activation, x.dh.data(), h, x.dact.data(), R, Fe);
  be_.matmul_backward_grouped(x.dxr.data(), g.expfcw, x.dh.data(), xr, w.expfcw, s.rows_at.data(),
                              El, C, fcr);
}

// d logits from the combine weights' gradients, the auxiliary losses and the z-loss
// (Note [Auxiliary losses]); then the router's weight gradient and its input gradient into dx.
void MoeLayer::router_backward(SlotState& s, float* dx, const float* x, const MoeWeights& w,
                               const MoeGrads& g, int N, float loss_scale) {
  const MoeConfig& m = cfg_.moe;
  const int E = m.experts, k = m.top_k, C = cfg_.channels;
  Scratch& sc = *scratch_;
  const int32_t* aux_count = nullptr;  // d(aux)/d p_i = num · count_i / den · loss_scale
  double aux_num = double(m.aux_coeff) * E, aux_den = 1.0;
  if (m.aux_loss == MoeAux::kSwitch) {
    aux_count = s.counts();
    aux_den = double(N) * N * k;
  } else if (m.aux_loss == MoeAux::kHF) {
    const size_t slot = size_t(&s - slots_->data());
    const double LN = double(hf_->layers[slot]) * N;
    aux_count = hf_->count_device.data() + slot * size_t(E);
    aux_den = LN * LN;
  }
  const bool sigmoid = m.router == MoeRouter::kSigmoid;
  be_.moe_route_backward(sc.dlogits.data(), sc.dtopw.data(), s.probs.data(), s.lse.data(),
                         s.top.data(), s.topw.data(), aux_count, aux_num, aux_den, 2.0 * m.z_coeff,
                         loss_scale, N, E, k, sigmoid, m.norm_topk);
  be_.matmul_backward(dx, g.router, nullptr, sc.dlogits.data(), x, w.router, N, C, E);
}

void MoeLayer::backward(int slot, float* dx, const float* dout, const float* x, const MoeWeights& w,
                        const MoeGrads& g, int N, float loss_scale) {
  SlotState& s = (*slots_)[size_t(slot)];
  TRIDENT_CHECK(s.N == N, "mixture layer {}: backward of {} tokens after a forward of {}", layer_,
                N, s.N);
  const MoeConfig& m = cfg_.moe;
  const int k = m.top_k, C = cfg_.channels;
  Scratch& sc = *scratch_;
  const auto t_layer = std::chrono::steady_clock::now();
  // The combine: each choice's weight gradient, and its row's output gradient.
  be_.moe_combine_backward(sc.dys.data(), sc.dtopw.data(), dout, s.ys.data(), s.pos.data(),
                           s.topw.data(), N, C, k);
  stats_.route_ms += ms_since(t_layer);
  if (ep_.size > 1) dispatch(s, sc.dys.data(), sc.dyr.data(), C, false);
  experts_backward(s, w, g);
  const float* dxs = sc.dxr.data();
  if (ep_.size > 1) {
    dispatch(s, sc.dxr.data(), sc.dxs.data(), C, true);
    dxs = sc.dxs.data();
  }
  const auto t_router = std::chrono::steady_clock::now();
  router_backward(s, dx, x, w, g, N, loss_scale);
  stats_.route_ms += ms_since(t_router);
  // The shared experts' input gradient (and the gate's) into dx2, then every term into dx.
  const int Fs = cfg_.shared_width();
  if (Fs > 0) {
    const int fcs = cfg_.fc_rows_of(Fs);
    const float* dy = dout;
    if (m.shared_gate) {
      be_.moe_gate_backward(sc.dgate.data(), sc.dsh_y.data(), dout, s.sh_y.data(), s.sh_g.data(), N,
                            C);
      be_.matmul_backward(sc.dx2.data(), g.shgate, nullptr, sc.dgate.data(), x, w.shgate, N, C, 1);
      be_.add(dx, dx, sc.dx2.data(), size_t(N) * C);
      dy = sc.dsh_y.data();
    }
    be_.matmul_backward(sc.dsh_act.data(), g.shfcprojw, nullptr, dy, s.sh_act.data(), w.shfcprojw,
                        N, Fs, C);
    activation_backward(be_, cfg_.activation, sc.dsh_h.data(), s.sh_h.data(), sc.dsh_act.data(), N,
                        Fs);
    be_.matmul_backward(sc.dx2.data(), g.shfcw, nullptr, sc.dsh_h.data(), x, w.shfcw, N, C, fcs);
    be_.add(dx, dx, sc.dx2.data(), size_t(N) * C);
  }
  const auto t_gather = std::chrono::steady_clock::now();
  be_.moe_scatter_add(dx, dxs, s.pos.data(), N, C, k);
  stats_.route_ms += ms_since(t_gather);
  stats_.layer_ms += ms_since(t_layer);
}

size_t MoeLayer::bytes() const {
  size_t floats = 0, ints = 0;
  for (size_t i = 0; i < (owns_slots_ ? slots_->size() : 0); ++i) {
    const SlotState& s = (*slots_)[i];
    for (const auto* b : {&s.xs, &s.xr, &s.h, &s.act, &s.ys, &s.sh_h, &s.sh_act, &s.sh_y, &s.sh_g})
      floats += b->size();
    floats += s.logits.size() + s.probs.size() + s.lse.size() + s.topw.size();
    ints += s.top.size() + s.pos.size() + s.send_token.size();
    floats += 2 * s.summary.size();
  }
  const Scratch& x = *scratch_;
  if (owns_scratch_)
    for (const auto* b :
         {&x.h, &x.act, &x.yr, &x.dys, &x.dyr, &x.dact, &x.dh, &x.dxr, &x.dxs, &x.dlogits, &x.dtopw,
          &x.dx2, &x.peer, &x.dsh_y, &x.dsh_act, &x.dsh_h, &x.dgate})
      floats += b->size();
  return (floats + ints) * sizeof(float);
}

void MoeLayer::take_stats(MoeStats& into) {
  into.aux_loss += stats_.aux_loss;
  into.z_loss += stats_.z_loss;
  into.dropped += stats_.dropped;
  into.choices += stats_.choices;
  into.load_max_over_mean += stats_.load_max_over_mean;
  into.layers_seen += stats_.layers_seen;
  into.a2a_ms += stats_.a2a_ms;
  into.a2a_exposed_ms += stats_.a2a_exposed_ms;
  into.layer_ms += stats_.layer_ms;
  if (into.layer_load.size() <= size_t(layer_)) {
    into.layer_load.resize(size_t(layer_) + 1, 0.0);
    into.layer_forwards.resize(size_t(layer_) + 1, 0.0);
  }
  into.layer_load[size_t(layer_)] += stats_.load_max_over_mean;  // this layer's own
  into.layer_forwards[size_t(layer_)] += stats_.layers_seen;
  into.route_ms += stats_.route_ms;
  stats_ = MoeStats{};
}

}  // namespace trident
