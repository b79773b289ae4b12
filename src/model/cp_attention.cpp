#include "model/cp_attention.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "core/elapsed.h"
#include "trident/check.h"

namespace trident {
namespace {

// Each stream of messages between two ranks has its own tag (MPI keeps order per tag and peer).
constexpr int kTagForwardKv = 431, kTagBackwardKv = 432, kTagDkv = 440;  // + part

Communicator& checked_comm(const ContextParallel& cp) {
  TRIDENT_CHECK(cp.size > 1 && cp.comm != nullptr && cp.comm->size() == cp.size,
                "context parallelism over {} ranks needs their communicator", cp.size);
  return *cp.comm;
}

}  // namespace

CpComm parse_cp_comm(const std::string& text) {
  if (text == "ring") return CpComm::kRing;
  if (text == "allgather") return CpComm::kAllGather;
  input_error("parallel.cp_comm: expected ring or allgather, got \"{}\"", text);
}

std::vector<int> cp_positions(int T_local, int cp, int cp_rank) {
  TRIDENT_CHECK(cp >= 1 && cp_rank >= 0 && cp_rank < cp && T_local % 2 == 0,
                "cp_positions({}, {}, {})", T_local, cp, cp_rank);
  const int c = T_local / 2;
  std::vector<int> pos(static_cast<size_t>(T_local));
  for (int i = 0; i < c; ++i) {
    pos[size_t(i)] = cp_rank * c + i;
    pos[size_t(c + i)] = (2 * cp - 1 - cp_rank) * c + i;
  }
  return pos;
}

CpAttention::CpAttention(Backend& be, const ContextParallel& cp, int B, int T, int NH, int KVH,
                         int hs, bool grouped)
    : be_(be), cp_(cp), NH_(NH), KVH_(KVH), hs_(hs), kv_row_(2 * size_t(KVH) * hs),
      // A call's transfers: at most cp + 1 exchanges.
      order_(checked_comm(cp), size_t(cp.size) + 2) {
  TRIDENT_CHECK(T % 2 == 0, "a cp rank's {} rows are not two chunks", T);
  const size_t block = size_t(B) * T * kv_row_;
  grouped_ = grouped || order_.on_device();
  if (cp_.mode == CpComm::kRing && grouped_) {
    kv_[0] = BackendBuffer<float>(be_, 2 * block);
    kv_[1] = BackendBuffer<float>(be_, 2 * block);
    dkv_[0] = BackendBuffer<float>(be_, block);
    dkv_in_ = BackendBuffer<float>(be_, block);
  } else if (cp_.mode == CpComm::kRing) {
    for (auto* b : {&kv_[0], &kv_[1], &dkv_[0], &dkv_[1], &dkv_in_})
      *b = BackendBuffer<float>(be_, block);
  } else {
    kv_[0] = BackendBuffer<float>(be_, block);
    dkv_in_ = BackendBuffer<float>(be_, block);
    gathered_ = BackendBuffer<float>(be_, block * size_t(cp_.size));
    dgathered_ = BackendBuffer<float>(be_, block * size_t(cp_.size));
  }
}

size_t CpAttention::buffer_bytes() const {
  size_t n = gathered_.size() + dgathered_.size() + dkv_in_.size();
  for (int i = 0; i < 2; ++i) n += kv_[i].size() + dkv_[i].size();
  return n * sizeof(float);
}

double CpAttention::take_comm_ms() {
  const double ms = comm_ms_;
  comm_ms_ = 0;
  return ms;
}

double CpAttention::take_exposed_ms() {
  const double ms = exposed_ms_;
  exposed_ms_ = 0;
  return ms;
}

AttentionBlockArgs CpAttention::args(int B, int T) const {
  AttentionBlockArgs a;
  a.B = B, a.NH = NH_, a.KVH = KVH_, a.hs = hs_;
  a.Tq = a.Tk = T / 2;
  const size_t row = size_t(NH_ + 2 * KVH_) * hs_, C = size_t(NH_) * hs_;
  a.q_bstride = size_t(T) * row, a.q_rstride = row;
  a.kv_bstride = size_t(T) * kv_row_, a.kv_rstride = kv_row_;
  a.o_bstride = size_t(T) * C, a.o_rstride = C;
  a.s_bstride = size_t(NH_) * T, a.s_hstride = size_t(T);
  return a;
}

// Note [Waiting for a tp collective] (gpt_tp.cpp): the compute thread tests and yields.
// Note [Time of a K/V transfer]
// Open MPI moves a large host message only inside MPI calls, and attention makes none while it
// computes: the bytes move in this wait, whose time is then the transfer's (its Work's span
// would end only when the wait saw it, after the compute, and count the compute). On an
// emulated link the transfer's time is the link's. `received` counts it into cp_comm_ms.
void CpAttention::wait(Work& w, bool received) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!w.test()) std::this_thread::yield();
  const double waited = ms_since(t0);
  exposed_ms_ += waited;
  if (received) comm_ms_ += w.record().link_ms > 0 ? w.record().link_ms : waited;
}

void CpAttention::pack_kv(float* kv, const float* qkv, int B, int T) const {
  const size_t row = size_t(NH_ + 2 * KVH_) * hs_ * sizeof(float), kv_row = kv_row_ * sizeof(float);
  be_.copy_rows(kv, kv_row, qkv + size_t(NH_) * hs_, row, kv_row, size_t(B) * T);
}

void CpAttention::unpack_dkv(float* dkv, float* dqkv, int B, int T, bool to_packed) const {
  const size_t row = size_t(NH_ + 2 * KVH_) * hs_ * sizeof(float), kv_row = kv_row_ * sizeof(float);
  float* columns = dqkv + size_t(NH_) * hs_;
  if (to_packed) be_.copy_rows(dkv, kv_row, columns, row, kv_row, size_t(B) * T);
  else be_.copy_rows(columns, row, dkv, kv_row, kv_row, size_t(B) * T);
}

CpAttention::KvView CpAttention::packed(const float* kv, float* dkv, int T) const {
  return {kv,      kv + size_t(KVH_) * hs_, dkv, dkv ? dkv + size_t(KVH_) * hs_ : nullptr,
          kv_row_, size_t(T) * kv_row_};
}

// This rank's query chunks (local rows [0, c) and [c, 2c)) against rank src's two key chunks;
// the pairs that causality hides entirely are not called.
void CpAttention::forward_pair(AttentionBlockArgs a, const KvView& kv, int src, int T) {
  const int c = T / 2, n = cp_.size;
  const int q_chunk[2] = {cp_.rank, 2 * n - 1 - cp_.rank}, k_chunk[2] = {src, 2 * n - 1 - src};
  const float* q = a.q;
  float* out = a.out;
  float* lse = a.lse;
  a.kv_rstride = kv.rstride, a.kv_bstride = kv.bstride;
  for (int qi = 0; qi < 2; ++qi)
    for (int kj = 0; kj < 2; ++kj) {
      if (k_chunk[kj] > q_chunk[qi]) continue;
      a.q = q + size_t(qi) * c * a.q_rstride;
      a.out = out + size_t(qi) * c * a.o_rstride;
      a.lse = lse + size_t(qi) * c;
      a.k = kv.k + size_t(kj) * c * kv.rstride;
      a.v = kv.v + size_t(kj) * c * kv.rstride;
      a.q_pos = long(q_chunk[qi]) * c;
      a.k_pos = long(k_chunk[kj]) * c;
      be_.attention_block_forward(a);
    }
}

void CpAttention::backward_pair(AttentionBlockArgs a, const KvView& kv, int src, int T, int lo,
                                int hi) {
  const int c = T / 2, n = cp_.size;
  if (hi < 0) hi = T;
  const int q_chunk[2] = {cp_.rank, 2 * n - 1 - cp_.rank}, k_chunk[2] = {src, 2 * n - 1 - src};
  const float* q = a.q;
  const float* out = a.out;
  const float* dout = a.dout;
  float *lse = a.lse, *delta = a.delta, *dq = a.dq;
  a.kv_rstride = kv.rstride, a.kv_bstride = kv.bstride;
  for (int qi = 0; qi < 2; ++qi)
    for (int kj = 0; kj < 2; ++kj) {
      // The key rows of chunk kj inside [lo, hi).
      const int k0 = std::max(lo, kj * c), k1 = std::min(hi, (kj + 1) * c);
      if (k_chunk[kj] > q_chunk[qi] || k0 >= k1) continue;
      const size_t q_rows = size_t(qi) * c, k_rows = size_t(k0) * kv.rstride;
      a.q = q + q_rows * a.q_rstride;
      a.dq = dq + q_rows * a.q_rstride;
      a.out = const_cast<float*>(out) + q_rows * a.o_rstride;
      a.dout = dout + q_rows * a.o_rstride;
      a.lse = lse + q_rows;
      a.delta = delta + q_rows;
      a.k = kv.k + k_rows;
      a.v = kv.v + k_rows;
      a.dk = kv.dk + k_rows;
      a.dv = kv.dv + k_rows;
      a.Tk = k1 - k0;
      a.q_pos = long(q_chunk[qi]) * c;
      a.k_pos = long(k_chunk[kj]) * c + (k0 - kj * c);
      be_.attention_block_backward(a);
    }
}

void CpAttention::forward(float* out, float* lse, const float* qkv, int B, int T) {
  AttentionBlockArgs a = args(B, T);
  a.q = qkv;
  a.out = out;
  a.lse = lse;
  AttentionBlockArgs all = a;  // every local row
  all.Tq = T;
  comm_ms_ += order_.settle();
  be_.attention_block_reset(all);
  if (cp_.mode == CpComm::kAllGather) gather_forward(a, B, T);
  else if (grouped_) grouped_ring_forward(a, B, T);
  else ring_forward(a, B, T);
}

void CpAttention::backward(float* dqkv, float* delta, const float* dout, const float* qkv,
                           const float* out, const float* lse, int B, int T) {
  AttentionBlockArgs a = args(B, T);
  a.q = qkv;
  a.out = const_cast<float*>(out);
  a.dout = dout;
  a.lse = const_cast<float*>(lse);
  a.delta = delta;
  a.dq = dqkv;
  AttentionBlockArgs all = a;
  all.Tq = T;
  comm_ms_ += order_.settle();
  be_.attention_block_delta(all);
  be_.fill_zero(dqkv, size_t(B) * T * (NH_ + 2 * KVH_) * hs_ * sizeof(float));
  if (cp_.mode == CpComm::kAllGather) gather_backward(a, B, T);
  else if (grouped_) grouped_ring_backward(a, B, T);
  else ring_backward(a, B, T);
}

void CpAttention::ring_forward(AttentionBlockArgs a, int B, int T) {
  const int n = cp_.size, r = cp_.rank, next = (r + 1) % n, prev = (r + n - 1) % n;
  const size_t count = size_t(B) * T * kv_row_;
  Communicator& comm = *cp_.comm;
  pack_kv(kv_[0].data(), a.q, B, T);
  for (int s = 0; s < n; ++s) {
    float* cur = kv_[s % 2].data();
    const bool more = s + 1 < n;
    Work recv, send;
    auto post = [&] {
      if (!more) return;
      recv = comm.recv(kv_[(s + 1) % 2].data(), count, prev, kTagForwardKv);
      note(Event::kRecvPosted, s + 1);
      send = comm.send(cur, count, next, kTagForwardKv);
    };
    if (!post_late_) post();
    note(Event::kComputeBegin, s);
    forward_pair(a, packed(cur, nullptr, T), (r + n - s) % n, T);
    note(Event::kComputeEnd, s);
    if (post_late_) post();
    if (!more) break;
    wait(recv, true);
    wait(send, false);
  }
}

// Note [dK/dV in parts]
// A step's partial sums of dK/dV are computed in kDkvParts parts of the block's key rows, and
// each part goes on to r − 1 as soon as it is final (the part arriving from r + 1 added), not
// when the whole step is done. So the sums stream around the ring beside the computation, and
// after the last step only the last part's trip home is left exposed; a whole block's would be
// as long as a step's compute on a link that just keeps up with the ring.
void CpAttention::ring_backward(AttentionBlockArgs a, int B, int T) {
  const int n = cp_.size, r = cp_.rank, next = (r + 1) % n, prev = (r + n - 1) % n;
  const size_t count = size_t(B) * T * kv_row_;
  Communicator& comm = *cp_.comm;
  pack_kv(kv_[0].data(), a.q, B, T);
  float* dqkv = a.dq;
  // Messages of part p of a block: one per sequence b, rows b·T + lo … hi.
  auto part_messages = [&](float* base, int p, bool receive, std::vector<Work>& into) {
    const int lo = p * T / kDkvParts, hi = (p + 1) * T / kDkvParts;
    for (int b = 0; b < B; ++b) {
      float* at = base + (size_t(b) * T + size_t(lo)) * kv_row_;
      const size_t rows = size_t(hi - lo) * kv_row_;
      into.push_back(receive ? comm.recv(at, rows, next, kTagDkv + p)
                             : comm.send(at, rows, prev, kTagDkv + p));
    }
  };
  Work kv_recv, kv_send;
  std::vector<Work> arriving, sent[2], home;
  for (int s = 0; s < n; ++s) {
    float* cur = kv_[s % 2].data();
    float* acc = dkv_[s % 2].data();
    const bool last = s + 1 == n;
    bool posted = false;
    auto post = [&] {
      posted = true;
      if (!last) {
        kv_recv = comm.recv(kv_[(s + 1) % 2].data(), count, next, kTagBackwardKv);
        note(Event::kRecvPosted, s + 1);
        kv_send = comm.send(cur, count, prev, kTagBackwardKv);
      }
      arriving.clear();
      if (s > 0)  // the visiting block's partial sum, part by part
        for (int p = 0; p < kDkvParts; ++p) part_messages(dkv_in_.data(), p, true, arriving);
    };
    if (!post_late_) post();
    be_.fill_zero(acc, count * sizeof(float));
    note(Event::kComputeBegin, s);
    for (int p = 0; p < kDkvParts; ++p) {
      const int lo = p * T / kDkvParts, hi = (p + 1) * T / kDkvParts;
      backward_pair(a, packed(cur, acc, T), (r + s) % n, T, lo, hi);
      if (post_late_ && !posted) post();
      if (s > 0)
        for (int b = 0; b < B; ++b) {
          wait(arriving[size_t(p * B + b)], true);
          const size_t at = (size_t(b) * T + size_t(lo)) * kv_row_;
          be_.add(acc + at, acc + at, dkv_in_.data() + at, size_t(hi - lo) * kv_row_);
        }
      if (last) part_messages(dkv_in_.data(), p, true, home);  // this rank's own, complete
      part_messages(acc, p, false, sent[s % 2]);  // on to r − 1 (home, after the last step)
    }
    note(Event::kComputeEnd, s);
    if (!last) {
      wait(kv_recv, true);
      wait(kv_send, false);
    }
    for (Work& w : sent[(s + 1) % 2]) wait(w, false);  // the step before's: its buffer is next
    sent[(s + 1) % 2].clear();
  }
  for (Work& w : sent[(n - 1) % 2]) wait(w, false);
  for (Work& w : home) wait(w, true);
  unpack_dkv(dkv_in_.data(), dqkv, B, T, /*to_packed=*/false);
}

void CpAttention::gather_forward(AttentionBlockArgs a, int B, int T) {
  const size_t count = size_t(B) * T * kv_row_;
  pack_kv(kv_[0].data(), a.q, B, T);
  order_.before_transfer();
  needed(cp_.comm->all_gather(kv_[0].data(), gathered_.data(), count), true);
  for (int src = 0; src < cp_.size; ++src)
    forward_pair(a, packed(gathered_.data() + size_t(src) * count, nullptr, T), src, T);
}

void CpAttention::gather_backward(AttentionBlockArgs a, int B, int T) {
  const size_t count = size_t(B) * T * kv_row_;
  float* dqkv = a.dq;
  pack_kv(kv_[0].data(), a.q, B, T);
  order_.before_transfer();
  needed(cp_.comm->all_gather(kv_[0].data(), gathered_.data(), count), true);
  be_.fill_zero(dgathered_.data(), dgathered_.size() * sizeof(float));
  for (int src = 0; src < cp_.size; ++src)
    backward_pair(
        a,
        packed(gathered_.data() + size_t(src) * count, dgathered_.data() + size_t(src) * count, T),
        src, T);
  order_.before_transfer();
  needed(cp_.comm->reduce_scatter(dgathered_.data(), dkv_in_.data(), count), true);
  unpack_dkv(dkv_in_.data(), dqkv, B, T, /*to_packed=*/false);
}

}  // namespace trident
