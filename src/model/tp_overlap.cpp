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

TpOverlap::TpOverlap(Backend& be, const TensorParallel& tp, int maxN, size_t widest, float* stage,
                     float* partial, TpTimes& times)
    : be_(be), tp_(tp), stage_(stage), partial_(partial), times_(times) {
  TRIDENT_CHECK(tp_.size > 1 && tp_.comm != nullptr && tp_.comm->size() == tp_.size,
                "tp overlap over {} ranks needs their communicator", tp_.size);
  TRIDENT_CHECK(maxN % tp_.size == 0, "{} rows do not split over tp {}", maxN, tp_.size);
  // Pieces: of each rank's chunk with sequence parallelism (the ring has tp · pieces steps),
  // of the whole rows without (Note [Tensor-parallel overlap]).
  if (tp_.chunks <= 0) tp_.chunks = tp_.sequence_parallel ? 1 : tp_.size;
  rows_ = BackendBuffer<float>(be_, size_t(maxN / tp_.size) * widest);
  const size_t works = size_t(tp_.size) * size_t(tp_.chunks);
  sends_.resize(works);
  recvs_.resize(works);
  if (tp_.ring) {
    TRIDENT_CHECK(tp_.ring->size() == tp_.size, "the tp ring's communicator has {} ranks, not {}",
                  tp_.ring->size(), tp_.size);
    order_ = std::make_unique<RingOrder>(*tp_.ring, works);
  }
  // A device's collectives run in grouped exchanges ordered by marks, never host waits.
  TRIDENT_CHECK(!be_.is_device() || (order_ && order_->on_device()),
                "tp overlap on a device needs the tp ring's device communicator");
}

// Chunk c of a sequence-parallel tensor is sequence rows [c·Tl, (c+1)·Tl) of every sequence
// (Note [Sequence-parallel rows]); as it travels it is [B, Tl] rows, cut into pieces of
// consecutive rows. Rows [r0, r0 + rows) of chunk c sit in the full [B, T] tensor as at most
// one run per sequence: copied run by run.
void TpOverlap::move_rows(void* dst, const void* src, bool to_full, int chunk, int r0, int count,
                          int T, size_t row) const {
  const int Tl = T / tp_.size;
  auto* d = static_cast<char*>(dst);
  const auto* from = static_cast<const char*>(src);
  for (int r = r0; r < r0 + count;) {
    const int b = r / Tl, t = r % Tl, run = std::min(Tl - t, r0 + count - r);
    const size_t in_full = (size_t(b) * T + size_t(chunk) * Tl + t) * row,
                 packed = size_t(r - r0) * row;
    be_.copy(d + (to_full ? in_full : packed), from + (to_full ? packed : in_full),
             size_t(run) * row);
    r += run;
  }
}

void TpOverlap::gather_gemm(float* out, float* in_full, const float* in, const Gemm& g, int src,
                            int r0, int count, int B, int T, int C) {
  const int Tl = T / tp_.size;
  if (in_full) move_rows(in_full, in, true, src, r0, count, T, size_t(C) * sizeof(float));
  // One sequence: the rows of `out` are contiguous, so the GEMM writes them there.
  float* dst = B == 1 ? out + (size_t(src) * Tl + size_t(r0)) * g.OC : rows_.data();
  if (g.input_gradient)
    be_.matmul_backward(dst, nullptr, nullptr, in, nullptr, g.w, count, g.OC, C);
  else be_.matmul_forward(dst, in, g.w, g.bias, count, C, g.OC);
  if (B > 1) move_rows(out, rows_.data(), true, src, r0, count, T, size_t(g.OC) * sizeof(float));
}

void TpOverlap::gather_matmul(float* out, float* in_full, const float* local, const Gemm& g, int B,
                              int T, int C) {
  auto piece = [&](const float* in, int src, int r0, int count) {
    gather_gemm(out, in_full, in, g, src, r0, count, B, T, C);
  };
  if (order_) grouped_gather_ring<float>(local, stage_, B, T, C, piece);
  else gather_ring<float>(local, stage_, B, T, C, piece);
}

// The ring's pieces (Note [Tensor-parallel overlap]): step 0 holds this rank's own chunk whole,
// so it posts all its pieces and takes them in one GEMM; a later step computes each arrived
// piece while the next ones travel.
template <class E>
void TpOverlap::gather_ring(const E* local, E* stage, int B, int T, int C, GatherPiece<E> piece) {
  const int n = tp_.size, r = tp_.rank, Tl = T / n, k = tp_.chunks;
  const int prev = (r + n - 1) % n, next = (r + 1) % n;
  const int Nr = B * Tl, rows = Nr / k;  // a piece's rows
  const size_t chunk = size_t(Nr) * C, count = size_t(rows) * C;
  Communicator& comm = *tp_.comm;
  const E* held = local;  // the chunk this step computes on, of rank `src`
  int src = r;
  for (int s = 0; s < n; ++s) {
    const int arriving = (r + n - s - 1) % n;  // the chunk the ring brings during this step
    E* next_chunk = stage + size_t(arriving) * chunk;
    auto post = [&](int q) {  // the next step's piece q, and this step's on to the next rank
      if (s == n - 1) return;
      const size_t i = size_t(s) * k + q;
      recvs_[i] = comm.recv(next_chunk + q * count, count, prev, kTagGather);
      note(Event::kRecvPosted, s + 1);
      sends_[i] = comm.send(held + q * count, count, next, kTagGather);
    };
    if (s == 0) {
      if (!post_late_)
        for (int q = 0; q < k; ++q) post(q);
      note(Event::kComputeBegin, s);
      piece(held, src, 0, Nr);
      note(Event::kComputeEnd, s);
      if (post_late_)
        for (int q = 0; q < k; ++q) post(q);
    } else {
      for (int q = 0; q < k; ++q) {
        wait_tp(be_, recvs_[size_t(s - 1) * k + q], times_);
        if (!post_late_) post(q);
        note(Event::kComputeBegin, s);
        piece(held + q * count, src, q * rows, rows);
        note(Event::kComputeEnd, s);
        if (post_late_) post(q);
      }
    }
    held = next_chunk;
    src = arriving;
  }
  for (int i = 0; i < (n - 1) * k; ++i) wait_tp(be_, sends_[size_t(i)], times_, false);
}
template void TpOverlap::gather_ring<float>(const float*, float*, int, int, int,
                                            GatherPiece<float>);
template void TpOverlap::gather_ring<bfloat16>(const bfloat16*, bfloat16*, int, int, int,
                                               GatherPiece<bfloat16>);

void TpOverlap::partial_gemm(float* dst, const float* inp, const float* w, const float* bias, int c,
                             int r0, int count, int B, int T, int K, int C) {
  const float* in = inp + (size_t(c) * (T / tp_.size) + size_t(r0)) * K;  // one sequence
  if (B > 1) {
    move_rows(rows_.data(), inp, false, c, r0, count, T, size_t(K) * sizeof(float));
    in = rows_.data();
  }
  be_.matmul_forward(dst, in, w, bias, count, K, C);
}

void TpOverlap::matmul_reduce_scatter(float* out, const float* inp, const float* w,
                                      const float* bias, int B, int T, int K, int C) {
  auto piece = [&](float* dst, int c, int r0, int count) {
    partial_gemm(dst, inp, w, bias, c, r0, count, B, T, K, C);
  };
  if (order_) grouped_reduce_scatter_ring(out, B, T, C, piece);
  else reduce_scatter_ring(out, B, T, C, piece);
}

// The other way round: the steps before the last compute each piece of a partial sum and pass it
// on; the last computes this rank's own chunk in one piece and adds the pieces as they arrive.
void TpOverlap::reduce_scatter_ring(float* out, int B, int T, int C, PartialPiece piece) {
  const int n = tp_.size, r = tp_.rank, Tl = T / n, k = tp_.chunks;
  const int prev = (r + n - 1) % n, next = (r + 1) % n;
  const int Nr = B * Tl, rows = Nr / k;
  const size_t chunk = size_t(Nr) * C, count = size_t(rows) * C;
  Communicator& comm = *tp_.comm;
  float* arrived[2] = {stage_, stage_ + chunk};
  for (int s = 0; s < n; ++s) {
    // The chunk whose owner is s + 1 hops ahead: the last step computes this rank's own.
    const int c = (r + 2 * n - s - 1) % n;
    if (s == n - 1) {
      note(Event::kComputeBegin, s);
      piece(out, c, 0, Nr);
      note(Event::kComputeEnd, s);
      for (int q = 0; q < k; ++q) {
        wait_tp(be_, recvs_[size_t(s) * k + q], times_);
        be_.add(out + q * count, out + q * count, arrived[s % 2] + q * count, count);
      }
      break;
    }
    float* sums = partial_ + size_t(s % 2) * chunk;
    for (int q = 0; q < k; ++q) {
      const size_t i = size_t(s) * k + q;
      auto post = [&] {
        recvs_[i + size_t(k)] =
            comm.recv(arrived[(s + 1) % 2] + q * count, count, prev, kTagReduce);
        note(Event::kRecvPosted, s + 1);
      };
      if (!post_late_) post();
      if (s >= 2) wait_tp(be_, sends_[i - 2 * size_t(k)], times_, false);  // this buffer's send
      note(Event::kComputeBegin, s);
      float* dst = sums + q * count;
      piece(dst, c, q * rows, rows);
      note(Event::kComputeEnd, s);
      if (post_late_) post();
      if (s > 0) {
        wait_tp(be_, recvs_[i], times_);
        be_.add(dst, dst, arrived[s % 2] + q * count, count);
      }
      sends_[i] = comm.send(dst, count, next, kTagReduce);
    }
  }
  for (int i = 0; i < (n - 1) * k; ++i) wait_tp(be_, sends_[size_t(i)], times_, false);
}

void TpOverlap::matmul_all_reduce(float* out, const float* inp, const float* w, const float* bias,
                                  int N, int K, int C) {
  auto piece = [&](int r0, int count) {
    be_.matmul_forward(out + size_t(r0) * C, inp + size_t(r0) * K, w, bias, count, K, C);
  };
  all_reduce_pieces(out, N, C, piece);
}

void TpOverlap::all_reduce_pieces(float* out, int N, int C, RowsPiece piece) {
  const int chunks = tp_.chunks;
  TRIDENT_CHECK(chunks >= 1 && N % chunks == 0 && size_t(chunks) <= recvs_.size(),
                "{} rows in {} pieces", N, chunks);
  const int rows = N / chunks;
  // Grouped (Note [Tensor-parallel ring on a device]): on the ring's communicator, each piece
  // after a mark of its GEMM; the compute waits once, after the last.
  if (order_) times_.comm_ms += order_->settle();
  Communicator& comm = order_ ? *tp_.ring : *tp_.comm;
  for (int i = 0; i < chunks; ++i) {
    piece(i * rows, rows);
    if (order_) order_->before_transfer();
    recvs_[size_t(i)] = comm.all_reduce(out + size_t(i) * rows * C, size_t(rows) * C);
  }
  for (int i = 0; i < chunks; ++i) needed(recvs_[size_t(i)]);
}

}  // namespace trident
