// Tensor parallelism's rings in grouped exchanges: the way they run on a device (an NcclComm on
// its own stream, TensorParallel::ring), and on the host when a test gives a ring communicator.
//
// Note [Tensor-parallel ring on a device]
// The rings of Note [Tensor-parallel overlap], ordered as Note [Ring on a device] orders cp's
// (RingOrder). A step moves a whole chunk in one exchange: the compute stream can wait only for
// all the communication stream was given (compute_waits_for_comm), so a piece would wait for the
// pieces posted after it. The reduce-scatter sends each step's sums at the start of the next
// step, with the receive the next step adds, so that the exchange runs beside that step's GEMM.
// Without sequence parallelism the pieces' all-reduces queue behind their GEMMs and the compute
// waits once, after the last. Backward's bulk sums stay on tp's compute-stream communicator.
#include "model/tp_overlap.h"
#include "trident/check.h"

namespace trident {

void TpOverlap::needed(Work& w) {
  if (!order_ || !order_->defer(w)) wait_tp(be_, w, times_);
}

// Step s computes on the chunk of rank r − s while the exchange brings step s + 1's from r − 1
// and passes this one on to r + 1.
template <class E>
void TpOverlap::grouped_gather_ring(const E* local, E* stage, int B, int T, int C,
                                    GatherPiece<E> piece) {
  const int n = tp_.size, r = tp_.rank, Nr = B * (T / n);
  const int prev = (r + n - 1) % n, next = (r + 1) % n;
  const size_t chunk = size_t(Nr) * C;
  times_.comm_ms += order_->settle();
  const E* held = local;
  int src = r;
  for (int s = 0; s < n; ++s) {
    const int arriving = (r + n - s - 1) % n;
    E* next_chunk = stage + size_t(arriving) * chunk;
    const bool more = s + 1 < n;
    Work step;
    auto post = [&] {
      if (!more) return;
      order_->before_transfer();
      step = order_->exchange(held, chunk, next, next_chunk, chunk, prev);
      note(Event::kRecvPosted, s + 1);
    };
    if (!post_late_) post();
    note(Event::kComputeBegin, s);
    piece(held, src, 0, Nr);
    note(Event::kComputeEnd, s);
    if (post_late_) post();
    if (more) needed(step);
    held = next_chunk;
    src = arriving;
  }
}
template void TpOverlap::grouped_gather_ring<float>(const float*, float*, int, int, int,
                                                    GatherPiece<float>);
template void TpOverlap::grouped_gather_ring<bfloat16>(const bfloat16*, bfloat16*, int, int, int,
                                                       GatherPiece<bfloat16>);

// Step s computes the partial sums of the chunk owned s + 1 hops ahead (the last: this rank's
// own, into out), while the exchange passes step s − 1's sums on to r + 1 and brings from r − 1
// the sums this step adds. The exchange is noted as the receive of step s + 1, as the host's
// ring notes the transfer that runs beside step s (RingEvents' check reads both alike).
void TpOverlap::grouped_reduce_scatter_ring(float* out, int B, int T, int C, PartialPiece piece) {
  const int n = tp_.size, r = tp_.rank, Nr = B * (T / n);
  const int prev = (r + n - 1) % n, next = (r + 1) % n;
  const size_t chunk = size_t(Nr) * C;
  times_.comm_ms += order_->settle();
  float* arrived = stage_;
  for (int s = 0; s < n; ++s) {
    const int c = (r + 2 * n - s - 1) % n;
    float* sums = s == n - 1 ? out : partial_ + size_t(s % 2) * chunk;
    Work step;
    auto post = [&] {
      if (s == 0) return;
      order_->before_transfer();
      step = order_->exchange(partial_ + size_t((s - 1) % 2) * chunk, chunk, next, arrived, chunk,
                              prev);
      note(Event::kRecvPosted, s + 1);
    };
    if (!post_late_) post();
    note(Event::kComputeBegin, s);
    piece(sums, c, 0, Nr);
    note(Event::kComputeEnd, s);
    if (post_late_) post();
    if (s > 0) {
      needed(step);
      be_.add(sums, sums, arrived, chunk);
    }
  }
}

}  // namespace trident
