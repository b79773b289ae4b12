#include "model/tp_overlap.h"

#include <algorithm>
#include <thread>

#include "core/elapsed.h"
#include "trident/check.h"

namespace trident {
namespace {

// Each ring has its own tag (MPI keeps order per tag and peer).
constexpr int kTagGather = 451, kTagReduce = 452;

}  // namespace

void wait_tp(Backend& be, Work& w, TpTimes& times, bool transfer) {
  const auto t0 = std::chrono::steady_clock::now();
  if (be.is_device()) {
    w.wait();
  } else {
    while (!w.test()) std::this_thread::yield();
  }
  const double waited = ms_since(t0);
  times.exposed_ms += waited;
  if (!w.impl()) return;
  const double link_ms = w.record().link_ms;
  times.comm_ms += link_ms > 0 ? (transfer ? link_ms : 0.0) : waited;
  w = Work{};
}

TpOverlap::TpOverlap(Backend& be, const TensorParallel& tp, int maxN, int C, size_t widest,
                     float* stage, float* partial, TpTimes& times)
    : be_(be), tp_(tp), stage_(stage), partial_(partial), times_(times) {
  TRIDENT_CHECK(tp_.size > 1 && tp_.comm != nullptr && tp_.comm->size() == tp_.size,
                "tp overlap over {} ranks needs their communicator", tp_.size);
  TRIDENT_CHECK(maxN % tp_.size == 0, "{} rows do not split over tp {}", maxN, tp_.size);
  if (tp_.chunks <= 0) tp_.chunks = tp_.size;
  rows_ = BackendBuffer<float>(be_, size_t(maxN / tp_.size) * widest);
  const size_t steps = size_t(std::max(tp_.size, tp_.chunks));
  sends_.resize(steps);
  recvs_.resize(steps);
  (void)C;
}

// Chunk c of a sequence-parallel tensor is sequence rows [c·Tl, (c+1)·Tl) of every sequence
// (Note [Sequence-parallel rows]).
void TpOverlap::scatter_chunk(float* full, const float* rows, int chunk, int B, int T,
                              int width) const {
  const int Tl = T / tp_.size;
  const size_t row = size_t(width) * sizeof(float);
  be_.copy_rows(full + size_t(chunk) * Tl * width, T * row, rows, Tl * row, Tl * row, size_t(B));
}

void TpOverlap::gather_chunk(float* rows, const float* full, int chunk, int B, int T,
                             int width) const {
  const int Tl = T / tp_.size;
  const size_t row = size_t(width) * sizeof(float);
  be_.copy_rows(rows, Tl * row, full + size_t(chunk) * Tl * width, T * row, Tl * row, size_t(B));
}

void TpOverlap::gather_matmul(float* out, float* in_full, const float* local, const Gemm& g, int B,
                              int T, int C) {
  const int n = tp_.size, r = tp_.rank, Tl = T / n;
  const int prev = (r + n - 1) % n, next = (r + 1) % n;
  const size_t Nr = size_t(B) * Tl, chunk = Nr * C;
  Communicator& comm = *tp_.comm;
  const float* held = local;  // the chunk this step computes on, of rank `src`
  int src = r;
  for (int s = 0; s < n; ++s) {
    const int arriving = (r + n - s - 1) % n;  // the chunk the ring brings during this step
    auto post = [&] {
      if (s == n - 1) return;
      recvs_[size_t(s)] = comm.recv(stage_ + size_t(arriving) * chunk, chunk, prev, kTagGather);
      note(Event::kRecvPosted, s + 1);
      sends_[size_t(s)] = comm.send(held, chunk, next, kTagGather);
    };
    if (!post_late_) post();
    note(Event::kComputeBegin, s);
    if (in_full) scatter_chunk(in_full, held, src, B, T, C);
    // One sequence: the chunk's rows of `out` are contiguous, so the GEMM writes them in place.
    float* dst = B == 1 ? out + size_t(src) * Tl * g.OC : rows_.data();
    if (g.input_gradient)
      be_.matmul_backward(dst, nullptr, nullptr, held, nullptr, g.w, int(Nr), g.OC, C);
    else be_.matmul_forward(dst, held, g.w, g.bias, int(Nr), C, g.OC);
    if (B > 1) scatter_chunk(out, rows_.data(), src, B, T, g.OC);
    note(Event::kComputeEnd, s);
    if (post_late_) post();
    if (s == n - 1) break;
    wait_tp(be_, recvs_[size_t(s)], times_);
    held = stage_ + size_t(arriving) * chunk;
    src = arriving;
  }
  for (int s = 0; s + 1 < n; ++s) wait_tp(be_, sends_[size_t(s)], times_, false);
}

void TpOverlap::matmul_reduce_scatter(float* out, const float* inp, const float* w,
                                      const float* bias, int B, int T, int K, int C) {
  const int n = tp_.size, r = tp_.rank, Tl = T / n;
  const int prev = (r + n - 1) % n, next = (r + 1) % n;
  const size_t Nr = size_t(B) * Tl, chunk = Nr * C;
  Communicator& comm = *tp_.comm;
  float* arrived[2] = {stage_, stage_ + chunk};
  for (int s = 0; s < n; ++s) {
    // The chunk whose owner is s + 1 hops ahead: the last step computes this rank's own.
    const int c = (r + 2 * n - s - 1) % n;
    auto post = [&] {
      if (s == n - 1) return;
      recvs_[size_t(s) + 1] = comm.recv(arrived[(s + 1) % 2], chunk, prev, kTagReduce);
      note(Event::kRecvPosted, s + 1);
    };
    if (!post_late_) post();
    float* dst = s == n - 1 ? out : partial_ + size_t(s % 2) * chunk;
    if (s >= 2) wait_tp(be_, sends_[size_t(s) - 2], times_, false);  // dst's last send
    note(Event::kComputeBegin, s);
    const float* rows = inp + size_t(c) * Tl * K;  // one sequence: contiguous
    if (B > 1) {
      gather_chunk(rows_.data(), inp, c, B, T, K);
      rows = rows_.data();
    }
    be_.matmul_forward(dst, rows, w, bias, int(Nr), K, C);
    note(Event::kComputeEnd, s);
    if (post_late_) post();
    if (s > 0) {
      wait_tp(be_, recvs_[size_t(s)], times_);
      be_.add(dst, dst, arrived[s % 2], chunk);
    }
    if (s < n - 1) sends_[size_t(s)] = comm.send(dst, chunk, next, kTagReduce);
  }
  for (int s = 0; s + 1 < n; ++s) wait_tp(be_, sends_[size_t(s)], times_, false);
}

void TpOverlap::matmul_all_reduce(float* out, const float* inp, const float* w, const float* bias,
                                  int N, int K, int C) {
  const int chunks = tp_.chunks;
  TRIDENT_CHECK(chunks >= 1 && N % chunks == 0 && size_t(chunks) <= recvs_.size(),
                "{} rows in {} pieces", N, chunks);
  const size_t rows = size_t(N / chunks);
  for (int i = 0; i < chunks; ++i) {
    float* o = out + size_t(i) * rows * C;
    be_.matmul_forward(o, inp + size_t(i) * rows * K, w, bias, int(rows), K, C);
    recvs_[size_t(i)] = tp_.comm->all_reduce(o, rows * C);
  }
  for (int i = 0; i < chunks; ++i) wait_tp(be_, recvs_[size_t(i)], times_);
}

}  // namespace trident
