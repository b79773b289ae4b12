// The order of a ring's transfers and computations, for the tests that check the overlap
// (Note [Ring attention] in cp_attention.h, Note [Tensor-parallel overlap] in tp_overlap.h):
// each step's receive must be posted before the previous step's compute begins. A ring records
// when asked, and can be told to post late, breaking the overlap on purpose, so that a test
// shows its check can tell.
#pragma once

#include <algorithm>
#include <vector>

namespace trident {

class RingEvents {
 public:
  enum class Event { kRecvPosted, kComputeBegin, kComputeEnd };
  struct EventRecord {
    Event event;
    int step;
  };
  void record_events(bool on) { record_ = on; }
  const std::vector<EventRecord>& events() const { return events_; }
  // Tests only: post each step's transfers after its compute (breaks the overlap on purpose).
  void post_after_compute(bool on) { post_late_ = on; }

  // True when the receive of every step s in [first, last] was posted before step s − 1's
  // compute began.
  static bool receives_posted_ahead(const std::vector<EventRecord>& events, int first, int last) {
    const auto at = [&](Event e, int step) {
      return long(
          std::find_if(events.begin(), events.end(),
                       [&](const EventRecord& r) { return r.event == e && r.step == step; }) -
          events.begin());
    };
    for (int s = first; s <= last; ++s) {
      const long posted = at(Event::kRecvPosted, s), before = at(Event::kComputeBegin, s - 1);
      if (posted >= long(events.size()) || before >= long(events.size()) || posted > before)
        return false;
    }
    return true;
  }

 protected:
  void note(Event e, int step) {
    if (record_) events_.push_back({e, step});
  }
  bool post_late_ = false;

 private:
  bool record_ = false;
  std::vector<EventRecord> events_;
};

}  // namespace trident
