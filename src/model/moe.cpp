// The mixture layer (src/model/moe.h): routing and permutation on the host, the GEMMs through
// the Backend. Everything runs in a fixed order whatever the thread count: loops over tokens
// are parallel only where each token writes its own row, and sums over a token's k choices or
// over the tokens of an expert run in one order.
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

}  // namespace

struct MoeLayer::SlotState {
  int N = 0, M = 0, R = 0;  // tokens, rows sent (kept choices), rows received
  int64_t dropped = 0;
  std::vector<float> logits, probs, lse;  // [N,E] scores (softmax p or sigmoid s); [N] z-loss
  std::vector<int32_t> top, pos;          // [N,k] expert of each choice; its sent row (-1: dropped)
  std::vector<float> topw;                // [N,k] combine weights
  std::vector<int32_t> count;             // [E] choices per expert, before drops
  std::vector<int32_t> kept;              // [E] rows sent per expert (expert order)
  std::vector<int32_t> send_token;        // [M] the token of each sent row
  std::vector<int32_t> recv;              // [ep][El] rows from peer p for local expert e
  std::vector<int32_t> rows_at;           // [El+1] local expert e's rows in xr
  // Backend memory (the memory plan counts it): [M,C] [R,C] [R,fcr] [R,Fe] [R,C] [M,C]; the
  // shared experts' [N,fcs] [N,Fs] [N,C] [N].
  BackendBuffer<float> xs, xr, h, act, yr, ys;
  BackendBuffer<float> sh_h, sh_act, sh_y, sh_g;
};

struct MoeLayer::Scratch {
  BackendBuffer<float> dys, dyr, dact, dh, dxr, dxs, dlogits, dtopw, dx2, peer;
  BackendBuffer<float> dsh_y, dsh_act, dsh_h, dgate;
  std::vector<double> psum, aux;  // [E] routing statistics, the aux losses' gradient
  std::vector<size_t> send_counts, recv_counts, int_counts;
  std::vector<int32_t> count_send;
};

MoeLayer::MoeLayer(const GPTConfig& cfg, Backend& be, int layer, int slots, int max_tokens,
                   ExpertParallel ep, MoeHfTotals* hf)
    : cfg_(cfg), be_(be), layer_(layer), max_tokens_(max_tokens), ep_(ep), hf_(hf),
      slots_(size_t(slots)), scratch_(std::make_unique<Scratch>()) {
  TRIDENT_CHECK(!be.is_device(), "the mixture layer runs on the host only");
  const int E = cfg.moe.experts, k = cfg.moe.top_k, C = cfg.channels;
  const int Fe = cfg.expert_width(), fcr = cfg.fc_rows_of(Fe), El = E / ep.size;
  const int Fs = cfg.shared_width(), fcs = cfg.fc_rows_of(Fs);
  const size_t N = size_t(max_tokens), M = N * size_t(k), R = M * size_t(ep.size);
  auto floats = [&](size_t n) { return BackendBuffer<float>(be, n); };
  for (SlotState& s : slots_) {
    s.logits.resize(N * E);
    s.probs.resize(N * E);
    s.lse.resize(N);
    s.top.resize(M);
    s.pos.resize(M);
    s.topw.resize(M);
    s.count.resize(size_t(E));
    s.kept.resize(size_t(E));
    s.send_token.resize(M);
    s.recv.resize(size_t(ep.size) * El);
    s.rows_at.resize(size_t(El) + 1);
    s.xs = floats(M * C);
    s.h = floats(R * fcr);
    s.act = floats(R * Fe);
    s.ys = floats(M * C);
    if (ep.size > 1) {
      s.xr = floats(R * C);
      s.yr = floats(R * C);
    }
    if (Fs > 0) {
      s.sh_h = floats(N * fcs);
      s.sh_act = floats(N * Fs);
      s.sh_y = floats(N * C);
      if (cfg.moe.shared_gate) s.sh_g = floats(N);
    }
  }
  Scratch& x = *scratch_;
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
  x.send_counts.resize(size_t(ep.size));
  x.recv_counts.resize(size_t(ep.size));
  x.count_send.resize(size_t(E));
  x.psum.resize(size_t(E));
  x.aux.resize(size_t(E));
  x.int_counts.assign(size_t(ep.size), size_t(El));
  step_load_.assign(size_t(E), 0.0);
}

MoeLayer::~MoeLayer() = default;

// The router's scores, each token's top k (ties to the lower index) and their weights; the
// statistics and the transformers-form totals when `counted`.
void MoeLayer::route(SlotState& s, const float* x, const MoeWeights& w, int N, bool counted) {
  const MoeConfig& m = cfg_.moe;
  const int E = m.experts, k = m.top_k, C = cfg_.channels;
  be_.matmul_forward(s.logits.data(), x, w.router, nullptr, N, C, E);
  const bool sigmoid = m.router == MoeRouter::kSigmoid;
#pragma omp parallel for schedule(static)
  for (int t = 0; t < N; ++t) {
    const float* l = s.logits.data() + size_t(t) * E;
    float* p = s.probs.data() + size_t(t) * E;
    if (sigmoid) {
      for (int i = 0; i < E; ++i) p[i] = 1.0f / (1.0f + std::exp(-l[i]));
    } else {
      float mx = l[0];
      for (int i = 1; i < E; ++i) mx = std::max(mx, l[i]);
      double sum = 0;
      for (int i = 0; i < E; ++i) sum += std::exp(double(l[i] - mx));
      for (int i = 0; i < E; ++i) p[i] = float(std::exp(double(l[i] - mx)) / sum);
      s.lse[size_t(t)] = float(double(mx) + std::log(sum));
    }
    int32_t* top = s.top.data() + size_t(t) * k;
    float* tw = s.topw.data() + size_t(t) * k;
    double chosen = 0;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      float best_score = 0;
      for (int i = 0; i < E; ++i) {
        bool taken = false;
        for (int q = 0; q < j; ++q) taken = taken || top[q] == i;
        if (taken) continue;
        const float score = sigmoid && w.routerbias ? p[i] + w.routerbias[i] : p[i];
        if (best < 0 || score > best_score) best = i, best_score = score;  // ties: lower index
      }
      top[j] = best;
      tw[j] = p[best];
      chosen += p[best];
    }
    if (m.norm_topk)
      for (int j = 0; j < k; ++j) tw[j] = float(double(tw[j]) / chosen);
  }
  std::fill(s.count.begin(), s.count.end(), 0);
  for (size_t c = 0; c < size_t(N) * k; ++c) ++s.count[size_t(s.top[c])];
  if (!counted) return;
  const double mean = double(N) * k / E;
  double mx = 0, aux = 0, z = 0;
  std::vector<double>& psum = scratch_->psum;
  std::fill(psum.begin(), psum.end(), 0.0);
  for (int t = 0; t < N; ++t)
    for (int i = 0; i < E; ++i) psum[size_t(i)] += s.probs[size_t(t) * E + i];
  for (int i = 0; i < E; ++i) {
    mx = std::max(mx, double(s.count[size_t(i)]));
    step_load_[size_t(i)] += s.count[size_t(i)];
    if (m.aux_loss == MoeAux::kSwitch)
      aux += psum[size_t(i)] * s.count[size_t(i)] * m.aux_coeff * E / (double(N) * N * k);
  }
  if (m.z_coeff > 0) {
    for (int t = 0; t < N; ++t) z += double(s.lse[size_t(t)]) * s.lse[size_t(t)];
    z *= m.z_coeff / double(N);
  }
  if (m.aux_loss == MoeAux::kHF) {
    const size_t slot = size_t(&s - slots_.data());
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
}

// Each kept choice's row in expert order (Note [Expert capacity]): token order, then choice.
void MoeLayer::permute(SlotState& s, int N) {
  const MoeConfig& m = cfg_.moe;
  const int E = m.experts, k = m.top_k;
  const int cap =
      m.capacity_factor > 0 ? int(std::ceil(double(m.capacity_factor) * double(N) * k / E)) : N * k;
  std::fill(s.kept.begin(), s.kept.end(), 0);
  for (size_t c = 0; c < size_t(N) * k; ++c) {
    int32_t& kept = s.kept[size_t(s.top[c])];
    if (kept < cap) {
      s.pos[c] = kept++;  // the rank within its expert for now
    } else {
      s.pos[c] = -1;
    }
  }
  std::vector<int32_t> first(size_t(E) + 1, 0);
  for (int i = 0; i < E; ++i) first[size_t(i) + 1] = first[size_t(i)] + s.kept[size_t(i)];
  s.M = first[size_t(E)];
  s.dropped = int64_t(N) * k - s.M;
  for (size_t c = 0; c < size_t(N) * k; ++c) {
    if (s.pos[c] < 0) continue;
    s.pos[c] += first[size_t(s.top[c])];
    s.send_token[size_t(s.pos[c])] = int32_t(c / size_t(k));
  }
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
          std::memcpy(dst + expert_major * width, src + peer_major * width, n * sizeof(float));
        else std::memcpy(dst + peer_major * width, src + expert_major * width, n * sizeof(float));
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

void MoeLayer::experts_forward(SlotState& s, const MoeWeights& w) {
  const int C = cfg_.channels, Fe = cfg_.expert_width(), fcr = cfg_.fc_rows_of(Fe);
  const int El = cfg_.moe.experts / ep_.size;
  const float* xr = ep_.size > 1 ? s.xr.data() : s.xs.data();
  float* yr = ep_.size > 1 ? s.yr.data() : s.ys.data();
  for (int e = 0; e < El; ++e) {
    const int r0 = s.rows_at[size_t(e)], n = s.rows_at[size_t(e) + 1] - r0;
    if (n == 0) continue;
    be_.matmul_forward(s.h.data() + size_t(r0) * fcr, xr + size_t(r0) * C,
                       w.expfcw + size_t(e) * fcr * C, nullptr, n, C, fcr);
  }
  const int R = s.rows_at[size_t(El)];
  activation_forward(be_, cfg_.activation, s.act.data(), s.h.data(), R, Fe);
  for (int e = 0; e < El; ++e) {
    const int r0 = s.rows_at[size_t(e)], n = s.rows_at[size_t(e) + 1] - r0;
    if (n == 0) continue;
    be_.matmul_forward(yr + size_t(r0) * C, s.act.data() + size_t(r0) * Fe,
                       w.expfcprojw + size_t(e) * C * Fe, nullptr, n, Fe, C);
  }
}

void MoeLayer::forward(int slot, float* out, const float* x, const MoeWeights& w, int N,
                       bool counted) {
  TRIDENT_CHECK(N <= max_tokens_, "mixture layer {}: {} tokens, built for {}", layer_, N,
                max_tokens_);
  SlotState& s = slots_[size_t(slot)];
  const MoeConfig& m = cfg_.moe;
  const int E = m.experts, k = m.top_k, C = cfg_.channels, P = ep_.size, El = E / P;
  s.N = N;
  const auto t_layer = std::chrono::steady_clock::now();
  route(s, x, w, N, counted);
  permute(s, N);
  if (counted) stats_.dropped += s.dropped;
#pragma omp parallel for schedule(static)
  for (int r = 0; r < s.M; ++r)
    std::memcpy(s.xs.data() + size_t(r) * C, x + size_t(s.send_token[size_t(r)]) * C,
                size_t(C) * sizeof(float));
  stats_.route_ms += ms_since(t_layer);
  if (P > 1) {  // the counts first: this rank's rows for each peer's experts
    std::copy(s.kept.begin(), s.kept.end(), scratch_->count_send.begin());
    auto t0 = std::chrono::steady_clock::now();
    ep_.comm
        ->all_to_all_v(scratch_->count_send.data(), scratch_->int_counts.data(), s.recv.data(),
                       scratch_->int_counts.data())
        .wait();
    stats_.a2a_ms += ms_since(t0);
    stats_.a2a_exposed_ms += ms_since(t0);
    s.rows_at[0] = 0;
    for (int e = 0; e < El; ++e) {
      int n = 0;
      for (int p = 0; p < P; ++p) n += s.recv[size_t(p) * El + e];
      s.rows_at[size_t(e) + 1] = s.rows_at[size_t(e)] + n;
    }
    s.R = s.rows_at[size_t(El)];
    dispatch(s, s.xs.data(), s.xr.data(), C, false);
  } else {
    s.rows_at[0] = 0;
    for (int e = 0; e < E; ++e) s.rows_at[size_t(e) + 1] = s.rows_at[size_t(e)] + s.kept[size_t(e)];
    std::copy(s.kept.begin(), s.kept.end(), s.recv.begin());
    s.R = s.M;
  }
  experts_forward(s, w);
  if (P > 1) dispatch(s, s.yr.data(), s.ys.data(), C, true);
  // The shared experts on every token, then each token's sum over its choices in choice order.
  const int Fs = cfg_.shared_width();
  if (Fs > 0) {
    const int fcs = cfg_.fc_rows_of(Fs);
    be_.matmul_forward(s.sh_h.data(), x, w.shfcw, nullptr, N, C, fcs);
    activation_forward(be_, cfg_.activation, s.sh_act.data(), s.sh_h.data(), N, Fs);
    be_.matmul_forward(s.sh_y.data(), s.sh_act.data(), w.shfcprojw, nullptr, N, Fs, C);
    if (m.shared_gate) {
      be_.matmul_forward(s.sh_g.data(), x, w.shgate, nullptr, N, C, 1);
      for (int t = 0; t < N; ++t)
        s.sh_g.data()[size_t(t)] = 1.0f / (1.0f + std::exp(-s.sh_g.data()[size_t(t)]));
    }
  }
  const auto t_combine = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static)
  for (int t = 0; t < N; ++t) {
    float* o = out + size_t(t) * C;
    if (Fs > 0) {
      const float g = m.shared_gate ? s.sh_g.data()[size_t(t)] : 1.0f;
      const float* y = s.sh_y.data() + size_t(t) * C;
      for (int c = 0; c < C; ++c) o[c] = g * y[c];
    } else {
      std::fill(o, o + C, 0.0f);
    }
    for (int j = 0; j < k; ++j) {
      const int r = s.pos[size_t(t) * k + j];
      if (r < 0) continue;
      const float wgt = s.topw[size_t(t) * k + j];
      const float* y = s.ys.data() + size_t(r) * C;
      for (int c = 0; c < C; ++c) o[c] += wgt * y[c];
    }
  }
  stats_.route_ms += ms_since(t_combine);
  stats_.layer_ms += ms_since(t_layer);
}

void MoeLayer::experts_backward(SlotState& s, const MoeWeights& w, const MoeGrads& g) {
  Scratch& x = *scratch_;
  const int C = cfg_.channels, Fe = cfg_.expert_width(), fcr = cfg_.fc_rows_of(Fe);
  const int El = cfg_.moe.experts / ep_.size, R = s.rows_at[size_t(El)];
  const float* xr = ep_.size > 1 ? s.xr.data() : s.xs.data();
  const float* dyr = ep_.size > 1 ? x.dyr.data() : x.dys.data();
  for (int e = 0; e < El; ++e) {
    const int r0 = s.rows_at[size_t(e)], n = s.rows_at[size_t(e) + 1] - r0;
    if (n == 0) continue;
    be_.matmul_backward(x.dact.data() + size_t(r0) * Fe, g.expfcprojw + size_t(e) * C * Fe, nullptr,
                        dyr + size_t(r0) * C, s.act.data() + size_t(r0) * Fe,
                        w.expfcprojw + size_t(e) * C * Fe, n, Fe, C);
  }
  activation_backward(be_, cfg_.activation, x.dh.data(), s.h.data(), x.dact.data(), R, Fe);
  for (int e = 0; e < El; ++e) {
    const int r0 = s.rows_at[size_t(e)], n = s.rows_at[size_t(e) + 1] - r0;
    if (n == 0) continue;
    be_.matmul_backward(x.dxr.data() + size_t(r0) * C, g.expfcw + size_t(e) * fcr * C, nullptr,
                        x.dh.data() + size_t(r0) * fcr, xr + size_t(r0) * C,
                        w.expfcw + size_t(e) * fcr * C, n, C, fcr);
  }
}

// d logits from the combine weights' gradients, the auxiliary losses and the z-loss
// (Note [Auxiliary losses]); then the router's weight gradient and its input gradient into dx.
void MoeLayer::router_backward(SlotState& s, float* dx, const float* x, const MoeWeights& w,
                               const MoeGrads& g, int N, float loss_scale) {
  const MoeConfig& m = cfg_.moe;
  const int E = m.experts, k = m.top_k, C = cfg_.channels;
  Scratch& sc = *scratch_;
  std::vector<double>& aux = sc.aux;  // d(aux)/d p_i, the same for every token
  std::fill(aux.begin(), aux.end(), 0.0);
  if (m.aux_loss == MoeAux::kSwitch) {
    for (int i = 0; i < E; ++i)
      aux[size_t(i)] =
          double(m.aux_coeff) * E * s.count[size_t(i)] / (double(N) * N * k) * loss_scale;
  } else if (m.aux_loss == MoeAux::kHF) {
    const size_t slot = size_t(&s - slots_.data());
    const double LN = double(hf_->layers[slot]) * N;
    for (int i = 0; i < E; ++i)
      aux[size_t(i)] = double(m.aux_coeff) * E * hf_->count[slot * E + i] / (LN * LN) * loss_scale;
  }
  const bool sigmoid = m.router == MoeRouter::kSigmoid;
#pragma omp parallel for schedule(static)
  for (int t = 0; t < N; ++t) {
    const float* p = s.probs.data() + size_t(t) * E;
    const int32_t* top = s.top.data() + size_t(t) * k;
    const float* tw = s.topw.data() + size_t(t) * k;
    const float* dtw = sc.dtopw.data() + size_t(t) * k;
    float* dl = sc.dlogits.data() + size_t(t) * E;
    double dp[256];  // E ≤ 256 (check_moe)
    for (int i = 0; i < E; ++i) dp[i] = aux[size_t(i)];
    if (m.norm_topk) {
      double chosen = 0, dot = 0;
      for (int j = 0; j < k; ++j) chosen += p[top[j]], dot += double(dtw[j]) * tw[j];
      for (int j = 0; j < k; ++j) dp[top[j]] += (double(dtw[j]) - dot) / chosen;
    } else {
      for (int j = 0; j < k; ++j) dp[top[j]] += dtw[j];
    }
    if (sigmoid) {
      for (int i = 0; i < E; ++i) dl[i] = float(dp[i] * p[i] * (1.0 - p[i]));
      continue;
    }
    double dot = 0;
    for (int i = 0; i < E; ++i) dot += double(p[i]) * dp[i];
    const double z = m.z_coeff > 0 ? 2.0 * m.z_coeff * s.lse[size_t(t)] / N * loss_scale : 0.0;
    for (int i = 0; i < E; ++i) dl[i] = float(double(p[i]) * (dp[i] - dot) + z * p[i]);
  }
  be_.matmul_backward(dx, g.router, nullptr, sc.dlogits.data(), x, w.router, N, C, E);
}

void MoeLayer::backward(int slot, float* dx, const float* dout, const float* x, const MoeWeights& w,
                        const MoeGrads& g, int N, float loss_scale) {
  SlotState& s = slots_[size_t(slot)];
  TRIDENT_CHECK(s.N == N, "mixture layer {}: backward of {} tokens after a forward of {}", layer_,
                N, s.N);
  const MoeConfig& m = cfg_.moe;
  const int k = m.top_k, C = cfg_.channels;
  Scratch& sc = *scratch_;
  const auto t_layer = std::chrono::steady_clock::now();
  // The combine: each choice's weight gradient, and its row's output gradient.
#pragma omp parallel for schedule(static)
  for (int t = 0; t < N; ++t) {
    const float* d = dout + size_t(t) * C;
    for (int j = 0; j < k; ++j) {
      const size_t c = size_t(t) * k + j;
      const int r = s.pos[c];
      if (r < 0) {
        sc.dtopw.data()[c] = 0.0f;
        continue;
      }
      const float* y = s.ys.data() + size_t(r) * C;
      float* dy = sc.dys.data() + size_t(r) * C;
      double dot = 0;
      for (int q = 0; q < C; ++q) dot += double(d[q]) * y[q], dy[q] = s.topw[c] * d[q];
      sc.dtopw.data()[c] = float(dot);
    }
  }
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
      for (int t = 0; t < N; ++t) {
        const float gt = s.sh_g.data()[size_t(t)];
        double dot = 0;
        for (int q = 0; q < C; ++q) {
          dot += double(dout[size_t(t) * C + q]) * s.sh_y.data()[size_t(t) * C + q];
          sc.dsh_y.data()[size_t(t) * C + q] = gt * dout[size_t(t) * C + q];
        }
        sc.dgate.data()[size_t(t)] = float(dot * gt * (1.0 - gt));
      }
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
#pragma omp parallel for schedule(static)
  for (int t = 0; t < N; ++t) {
    float* d = dx + size_t(t) * C;
    for (int j = 0; j < k; ++j) {
      const int r = s.pos[size_t(t) * k + j];
      if (r < 0) continue;
      const float* src = dxs + size_t(r) * C;
      for (int q = 0; q < C; ++q) d[q] += src[q];
    }
  }
  stats_.route_ms += ms_since(t_gather);
  stats_.layer_ms += ms_since(t_layer);
}

size_t MoeLayer::bytes() const {
  size_t floats = 0, ints = 0;
  for (const SlotState& s : slots_) {
    for (const auto* b :
         {&s.xs, &s.xr, &s.h, &s.act, &s.yr, &s.ys, &s.sh_h, &s.sh_act, &s.sh_y, &s.sh_g})
      floats += b->size();
    floats += s.logits.size() + s.probs.size() + s.lse.size() + s.topw.size();
    ints += s.top.size() + s.pos.size() + s.send_token.size();
  }
  const Scratch& x = *scratch_;
  for (const auto* b : {&x.dys, &x.dyr, &x.dact, &x.dh, &x.dxr, &x.dxs, &x.dlogits, &x.dtopw,
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
