// The ring of context parallelism in grouped exchanges: the way it runs on a device
// (NcclComm), and on the host when a test asks (CpAttention's `grouped`).
//
// Note [Ring on a device]
// NCCL pairs transfers by order, not tag, and a receive enqueued alone on a stream waits there
// for its peer, whose stream is held the same way: ungrouped, a ring of sends and receives
// deadlocks. So each step is one exchange (all_to_all_v: one peer each way, one NCCL group),
// started after a mark of the compute so far (RingOrder::before_transfer); the compute stream
// waits for it only before the step that reads it (defer), and the host waits for nothing until
// the next call. Backward sends each step's K/V with the previous step's partial dK/dV from one
// slot [k|v | dk|dv], so the sums travel a step behind their blocks; one more exchange takes each
// home. Host waits (no marks) make the same sequence safe on MpiComm.
#include "model/cp_attention.h"

namespace trident {

void CpAttention::needed(Work w, bool received) {
  if (!order_.defer(w)) wait(w, received);
}

void CpAttention::grouped_ring_forward(AttentionBlockArgs a, int B, int T) {
  const int n = cp_.size, r = cp_.rank, next = (r + 1) % n, prev = (r + n - 1) % n;
  const size_t count = size_t(B) * T * kv_row_;
  pack_kv(kv_[0].data(), a.q, B, T);
  for (int s = 0; s < n; ++s) {
    float* cur = kv_[s % 2].data();
    const bool more = s + 1 < n;
    Work step;
    auto post = [&] {  // this block on to r + 1, step s+1's from r − 1
      if (!more) return;
      order_.before_transfer();
      step = order_.exchange(cur, count, next, kv_[(s + 1) % 2].data(), count, prev);
      note(Event::kRecvPosted, s + 1);
    };
    if (!post_late_) post();
    note(Event::kComputeBegin, s);
    forward_pair(a, packed(cur, nullptr, T), (r + n - s) % n, T);
    note(Event::kComputeEnd, s);
    if (post_late_) post();
    if (more) needed(std::move(step), true);
  }
}

// Step s computes on the K/V of rank r + s (slot s % 2) and exchanges with r − 1 and r + 1:
//   s = 0:       sends its K/V; receives step 1's K/V
//   0 < s < n−1: sends its K/V and the sum for step s−1's block; receives both for step s+1
//   s = n−1:     sends the sum for step s−1's block; receives the sum for this step's block
// The arriving sum for this step's block lands in the other slot, behind the next K/V, and this
// rank's terms are added to it there, ready to go on at the next step. After the last step the
// sum in the other slot is complete and belongs to rank r − 1 (block r + n − 1): it goes home.
void CpAttention::grouped_ring_backward(AttentionBlockArgs a, int B, int T) {
  const int n = cp_.size, r = cp_.rank, next = (r + 1) % n, prev = (r + n - 1) % n;
  const size_t count = size_t(B) * T * kv_row_;
  float* dqkv = a.dq;
  float* own = dkv_[0].data();  // this rank's terms for the step's block
  pack_kv(kv_[0].data(), a.q, B, T);
  for (int s = 0; s < n; ++s) {
    float* cur = kv_[s % 2].data();
    float* other = kv_[(s + 1) % 2].data();
    const bool first = s == 0, last = s + 1 == n;
    Work step;
    auto post = [&] {
      order_.before_transfer();
      step = first  ? order_.exchange(cur, count, prev, other, count, next)
             : last ? order_.exchange(cur + count, count, prev, other + count, count, next)
                    : order_.exchange(cur, 2 * count, prev, other, 2 * count, next);
      if (!last) note(Event::kRecvPosted, s + 1);
    };
    if (!post_late_) post();
    // The first step has no sum arriving: its terms go straight behind the next K/V.
    float* acc = first ? other + count : own;
    be_.fill_zero(acc, count * sizeof(float));
    note(Event::kComputeBegin, s);
    backward_pair(a, packed(cur, acc, T), (r + s) % n, T);
    note(Event::kComputeEnd, s);
    if (post_late_) post();
    needed(std::move(step), true);
    if (!first) be_.add(other + count, other + count, own, count);
  }
  order_.before_transfer();
  needed(order_.exchange(kv_[n % 2].data() + count, count, prev, dkv_in_.data(), count, next),
         true);
  unpack_dkv(dkv_in_.data(), dqkv, B, T, /*to_packed=*/false);
}

}  // namespace trident
