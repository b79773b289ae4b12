// A ring's transfers in grouped exchanges, ordered with the compute as a device needs it
// (Note [Ring on a device] in cp_ring_grouped.cpp): context parallelism's ring (CpAttention)
// and tensor parallelism's (TpOverlap, Note [Tensor-parallel ring on a device] in
// tp_ring_grouped.cpp). On a host communicator (no marks) the orderings do nothing and the
// caller waits itself.
#pragma once

#include <memory>
#include <vector>

#include "trident/comm.h"

namespace trident {

class RingOrder {
 public:
  // The mark is made once here (Note [Marks made once]); `transfers` is the most a call starts.
  RingOrder(Communicator& comm, size_t transfers);

  bool on_device() const { return mark_ != nullptr; }
  // send_count elements to rank `to` and recv_count from rank `from`, as one operation (on NCCL
  // one group: Note [Ring on a device]); float or bfloat16 (the bf16 tp block's gathers).
  template <class E>
  Work exchange(const E* send, size_t send_count, int to, E* recv, size_t recv_count, int from) {
    counts(send_count, to, recv_count, from);
    return comm_.all_to_all_v(send, send_counts_.data(), recv, recv_counts_.data());
  }
  // The transfer started next reads or overwrites what the compute enqueued so far used: on a
  // device the communication stream waits for a mark recorded now; on the host, nothing to do.
  void before_transfer();
  // The compute enqueued next needs `w`: on a device the compute stream waits for the
  // communication stream, `w` is kept until settle() and true is returned; on the host false,
  // and `w` is the caller's to wait for.
  bool defer(Work& w);
  // Device: the previous call's transfers, long done on the device by now, are waited for (a
  // stuck one ends at comm.timeout_s); returns the sum of their spans as the host saw them
  // (enqueue to a poll seeing them done: an upper bound), in ms.
  double settle();

 private:
  void counts(size_t send_count, int to, size_t recv_count, int from);  // exchange()'s
  Communicator& comm_;
  std::shared_ptr<ComputeMark> mark_;              // null on a host communicator
  std::vector<size_t> send_counts_, recv_counts_;  // exchange()'s, sized once
  std::vector<Work> pending_;                      // defer()'s until settle()
};

}  // namespace trident
