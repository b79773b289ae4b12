#include "model/ring_order.h"

#include <algorithm>
#include <utility>

namespace trident {

RingOrder::RingOrder(Communicator& comm, size_t transfers)
    : comm_(comm), mark_(comm.new_mark(false)), send_counts_(size_t(comm.size()), 0),
      recv_counts_(size_t(comm.size()), 0) {
  pending_.reserve(transfers);
}

void RingOrder::counts(size_t send_count, int to, size_t recv_count, int from) {
  std::fill(send_counts_.begin(), send_counts_.end(), size_t(0));
  std::fill(recv_counts_.begin(), recv_counts_.end(), size_t(0));
  send_counts_[size_t(to)] = send_count;
  recv_counts_[size_t(from)] = recv_count;
}

void RingOrder::before_transfer() {
  if (!mark_) return;
  comm_.record_mark(*mark_);
  comm_.order_after(mark_.get());
}

bool RingOrder::defer(Work& w) {
  if (!mark_) return false;
  comm_.compute_waits_for_comm();
  pending_.push_back(std::move(w));
  return true;
}

double RingOrder::settle() {
  double ms = 0;
  for (Work& w : pending_) {
    w.wait();
    ms += w.record().ms();
  }
  pending_.clear();
  return ms;
}

}  // namespace trident
