// run_pipeline: drives one stage through a schedule and moves the boundary tensors.
//
// Note [Pipeline messages]
// One boundary crossing (micro-batch m's activations going forward, or their gradients going
// backward) is one header of a fixed kHeaderWords int64, then one message per non-empty tensor,
// straight from and into the model's buffers (no packing copy). The receiver compares the header
// with the buffers it expects before posting the tensor receives, so a mismatch is reported by
// name and shape, never as an MPI truncation error; the tags below keep messages apart.
//
// The header:
//     [0] kHeaderMagic   [1] direction (0 forward, 1 backward)   [2] micro-batch
//     [3] sending stage  [4] tensor count n ≤ kMaxStageTensors
//     [5] the sender's count of earlier messages in this direction (checked with links:
//         Note [Stage transfers on a device] in trident/pipeline.h)
//     then per tensor i < n, 10 words at 6 + 10·i:
//         [0..1] the first 16 bytes of the name (zero-padded)  [2] FNV-1a hash of the full name
//         [3] ndim ≤ kMaxStageDims (0: a scalar)   [4..9] the dims (unused ones 0)
//
// Tags: tag = ((u mod 512)·2 + direction)·32 + part, u = m·chunks + chunk (the receiving
// chunk; u = m with one chunk), part 0 the header and 1 + i tensor i, so the forward and
// backward messages of one micro-batch and chunk never pair with each other or with another
// one's; the largest tag, 32752, is below 32767, the smallest MPI_TAG_UB an MPI library may
// have. Units 512 apart share tags, which is safe: between one pair of ranks both sides issue
// one direction's messages of one chunk in micro-batch order, and MPI does not let messages
// with the same source, tag and communicator overtake each other. Headers carry the virtual
// stage (chunk·stages + stage; the stage itself with one chunk) as the sending stage.
//
// Progress: sends and receives are nonblocking (Note [Pre-posted receives]). Open MPI has no
// progress thread, so a pending transfer moves only while this rank is inside MPI: the runner
// tests its pending transfers between actions, the model calls progress_transfers() between
// its layers (Note [Progress during compute] in trident/pipeline.h), and every wait (a test()
// loop) progresses them too.
//
// With links (Note [Stage transfers on a device]) only the headers travel as above; the tensors
// go over the direction's link, tag 0, in the same order on both sides.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include "core/elapsed.h"
#include "trident/check.h"
#include "trident/pipeline.h"

namespace trident {

void PipelineStage::backward_input(int, int) {
  internal_error(__FILE__, __LINE__,
                 "PipelineStage::backward_input called on a stage that "
                 "does not split its backward");
}
void PipelineStage::backward_weight(int, int) {
  internal_error(__FILE__, __LINE__,
                 "PipelineStage::backward_weight called on a stage that "
                 "does not split its backward");
}

size_t StageTensor::count() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

namespace {

constexpr int64_t kHeaderMagic = 0x7472696465ab02;  // "tride", version 2
constexpr int kHeaderFixed = 6;
constexpr int kNameBytes = 16;
constexpr int kWordsPerTensor = 4 + kMaxStageDims;
constexpr int kHeaderWords = kHeaderFixed + kMaxStageTensors * kWordsPerTensor;
using Header = std::array<int64_t, kHeaderWords>;

constexpr int kTagParts = 32;
constexpr int kTagMicroPeriod = 512;
static_assert(1 + kMaxStageTensors <= kTagParts);
static_assert((kTagMicroPeriod * 2 - 1) * kTagParts + kTagParts - 1 <= 32767);

enum Direction { kForwardDir = 0, kBackwardDir = 1 };

// `unit` = micro·chunks + chunk (the micro-batch itself with one chunk).
int message_tag(Direction dir, int unit, int part) {
  return ((unit % kTagMicroPeriod) * 2 + dir) * kTagParts + part;
}

int64_t name_hash(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return static_cast<int64_t>(h);
}

// What the header says about one tensor (the name only as far as 16 bytes carry it).
struct TensorDesc {
  std::string name;
  bool name_truncated = false;
  int64_t hash = 0;
  std::vector<int64_t> shape;
  bool operator==(const TensorDesc& o) const { return hash == o.hash && shape == o.shape; }
};

TensorDesc describe(const StageTensor& t) {
  TensorDesc d;
  d.name = t.name.substr(0, kNameBytes);
  d.name_truncated = t.name.size() > static_cast<size_t>(kNameBytes);
  d.hash = name_hash(t.name);
  d.shape = t.shape;
  return d;
}

std::string format_desc(const TensorDesc& d) {
  return fmt::format("'{}{}' [{}]", d.name, d.name_truncated ? "..." : "",
                     fmt::join(d.shape, ", "));
}

std::string format_list(const std::vector<TensorDesc>& list) {
  if (list.empty()) return "no tensors";
  std::vector<std::string> parts;
  for (const TensorDesc& d : list) parts.push_back(format_desc(d));
  return fmt::format("{} tensor{} {}", list.size(), list.size() == 1 ? "" : "s",
                     fmt::join(parts, ", "));
}

const char* what_moves(Direction dir) { return dir == kForwardDir ? "activations" : "gradients"; }

void check_tensors(const std::vector<StageTensor>& tensors, int stage, Direction dir, int micro,
                   const char* role) {
  TRIDENT_CHECK(tensors.size() <= static_cast<size_t>(kMaxStageTensors),
                "stage {} {} for micro-batch {}: {} tensors, at most {} per message", stage, role,
                micro, tensors.size(), kMaxStageTensors);
  for (const StageTensor& t : tensors) {
    TRIDENT_CHECK(t.shape.size() <= static_cast<size_t>(kMaxStageDims),
                  "stage {} {} '{}' for micro-batch {} ({}): {} dimensions, at most {}", stage,
                  role, t.name, micro, what_moves(dir), t.shape.size(), kMaxStageDims);
    for (int64_t d : t.shape)
      TRIDENT_CHECK(d >= 0, "stage {} {} '{}': negative dimension in [{}]", stage, role, t.name,
                    fmt::join(t.shape, ", "));
    TRIDENT_CHECK(t.data != nullptr || t.count() == 0, "stage {} {} '{}': null data", stage, role,
                  t.name);
  }
}

Header encode_header(const std::vector<StageTensor>& tensors, Direction dir, int micro, int stage,
                     int64_t sequence) {
  Header h{};
  h[0] = kHeaderMagic;
  h[1] = dir;
  h[2] = micro;
  h[3] = stage;
  h[4] = static_cast<int64_t>(tensors.size());
  h[5] = sequence;
  for (size_t i = 0; i < tensors.size(); ++i) {
    int64_t* w = &h[kHeaderFixed + i * kWordsPerTensor];
    char name[kNameBytes] = {};
    std::memcpy(name, tensors[i].name.data(),
                std::min(tensors[i].name.size(), static_cast<size_t>(kNameBytes)));
    std::memcpy(w, name, kNameBytes);
    w[2] = name_hash(tensors[i].name);
    w[3] = static_cast<int64_t>(tensors[i].shape.size());
    for (size_t k = 0; k < tensors[i].shape.size(); ++k) w[4 + k] = tensors[i].shape[k];
  }
  return h;
}

// The tensors a received header describes; an Error if the header itself is not one of ours.
std::vector<TensorDesc> decode_header(const Header& h, int stage, int src, Direction dir,
                                      int micro) {
  auto bad = [&](const std::string& what) {
    internal_error(__FILE__, __LINE__,
                   fmt::format("pipeline: stage {} received a malformed header from stage {} "
                               "for micro-batch {} ({}): {}",
                               stage, src, micro, what_moves(dir), what));
  };
  if (h[0] != kHeaderMagic) bad(fmt::format("magic {:#x}", h[0]));
  if (h[1] != dir || h[2] != micro || h[3] != src)
    bad(fmt::format("it says direction {}, micro-batch {}, stage {}", h[1], h[2], h[3]));
  if (h[4] < 0 || h[4] > kMaxStageTensors) bad(fmt::format("tensor count {}", h[4]));
  std::vector<TensorDesc> list(static_cast<size_t>(h[4]));
  for (size_t i = 0; i < list.size(); ++i) {
    const int64_t* w = &h[kHeaderFixed + i * kWordsPerTensor];
    char name[kNameBytes + 1] = {};
    std::memcpy(name, w, kNameBytes);
    list[i].name = name;
    list[i].hash = w[2];
    if (w[3] < 0 || w[3] > kMaxStageDims) bad(fmt::format("tensor {} has {} dimensions", i, w[3]));
    list[i].shape.assign(w + 4, w + 4 + w[3]);
    // A 16-byte prefix whose hash is not its own was cut from a longer name.
    list[i].name_truncated = list[i].name.size() == static_cast<size_t>(kNameBytes) &&
                             name_hash(list[i].name) != list[i].hash;
  }
  return list;
}

void check_received(const std::vector<TensorDesc>& expected,
                    const std::vector<TensorDesc>& received, int stage, int src, Direction dir,
                    int micro) {
  const std::string where =
      fmt::format("from stage {} for micro-batch {} ({})", src, micro, what_moves(dir));
  if (expected.size() != received.size())
    internal_error(__FILE__, __LINE__,
                   fmt::format("pipeline: stage {} expected {} {} but received {}", stage,
                               format_list(expected), where, format_list(received)));
  for (size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] == received[i]) continue;
    internal_error(
        __FILE__, __LINE__,
        fmt::format(
            "pipeline: stage {} expected {} {} but received {}{}", stage, format_desc(expected[i]),
            where, format_desc(received[i]),
            expected.size() > 1 ? fmt::format(" (tensor {} of {})", i + 1, expected.size()) : ""));
  }
}

// A started boundary message: the header lives here until its send completed.
struct PendingSend {
  Direction dir;
  int micro, chunk;
  std::unique_ptr<Header> header;
  std::vector<Work> works;
};

// A posted boundary receive: its header's and its tensors' receives, started together.
struct PostedReceive {
  int micro = -1, chunk = 0;  // micro -1: none posted
  int64_t sequence = 0;       // this direction's receives posted before it
  std::unique_ptr<Header> header;
  Work header_work;
  std::vector<Work> works;
  std::vector<TensorDesc> expected;
};

// Note [Pre-posted receives]
// Each direction has at most one receive posted ahead, for the next action that needs one,
// posted as soon as its buffers are free (Note [Slot reuse]), so the neighbour's header and
// tensors move while this stage is busy and the header is checked with no extra round trip.
// One ahead, not all: a receive's comm timeout runs from when it is posted, and one posted a
// whole step early could time out in a long step where no message is late.
//
// Forward receives are posted in the order of the actions that need them: that of forward(m)
// (of a chunk) once the previous one was consumed and, for m ≥ k, micro-batch m − k of that
// chunk is through its whole backward and its backward send completed. Backward receives
// likewise, that of backward(m) once forward(m) returned.
class StageRunner {
 public:
  // forward_only: the actions are forwards only (run_pipeline_forward), so a slot is free again
  // once the forward of the micro-batch in_flight before has been sent, not its backward.
  StageRunner(Communicator& pp, int stages, int stage, int micro_batches, int chunks,
              std::vector<int> in_flight, bool split, bool forward_only,
              const std::vector<PipeAction>& actions, PipelineStage& model, const StageLinks* links)
      : pp_(pp), stages_(stages), stage_(stage), micro_batches_(micro_batches), chunks_(chunks),
        in_flight_(std::move(in_flight)), split_(split), forward_only_(forward_only), model_(model),
        links_(links), forwarded_(size_t(micro_batches) * chunks, 0),
        backwarded_(size_t(micro_batches) * chunks, 0) {
    if (links_)  // marks made once (Note [Marks made once]), recorded before each operation
      for (Direction dir : {kForwardDir, kBackwardDir}) {
        if (links_->send[dir]) send_mark_[dir] = links_->send[dir]->new_mark(false);
        if (links_->recv[dir]) recv_mark_[dir] = links_->recv[dir]->new_mark(false);
      }
    for (const PipeAction& a : actions) {
      if (a.kind == PipeAction::Kind::kForward && !first(a.chunk))
        receives_[kForwardDir].push_back(a);
      if (a.kind == PipeAction::Kind::kBackward && !last(a.chunk))
        receives_[kBackwardDir].push_back(a);
    }
  }

  void run_action(const PipeAction& a) {
    poll_sends();
    const int m = a.micro, c = a.chunk;
    if (a.kind == PipeAction::Kind::kForward) {
      // Note [Slot reuse]
      // Micro-batch m − in_flight's backward outputs may share buffers with micro-batch m
      // (slot m mod in_flight of the chunk; GPTStage's sent gradients do), so their send must
      // end before m's receive starts. It ends once the previous stage started
      // backward(m − in_flight), which it does without waiting for this stage's later work,
      // so waiting here cannot deadlock.
      if (m >= in_flight(c)) complete_sends(slot_freed_by(), m - in_flight(c), c);
      post_receives();
      if (!first(c)) complete_receive(kForwardDir, m, c);
      post_receives();
      timed_compute([&] { model_.forward(m, c); });
      done(forwarded_, m, c) = 1;
      if (!last(c)) send(kForwardDir, m, c, model_.forward_outputs(m, c));
    } else if (a.kind == PipeAction::Kind::kBackward) {
      // The forward outputs' buffers belong to the model again once backward starts.
      complete_sends(kForwardDir, m, c);
      post_receives();
      if (!last(c)) complete_receive(kBackwardDir, m, c);
      post_receives();
      timed_compute([&] {
        if (split_) model_.backward_input(m, c);
        else model_.backward(m, c);
      });
      if (!split_) done(backwarded_, m, c) = 1;
      if (!first(c)) send(kBackwardDir, m, c, model_.backward_outputs(m, c));
    } else {
      TRIDENT_CHECK(split_, "pipeline: a weight pass in a schedule that does not split backward");
      timed_compute([&] { model_.backward_weight(m, c); });
      done(backwarded_, m, c) = 1;
    }
    post_receives();
  }

  void complete_all_sends() {
    const auto t0 = CommClock::now();
    for (PendingSend& p : pending_) wait_send(p);
    pending_.clear();
    for (Landing& l : landing_)
      for (Work& w : l.works) wait_naming(w, "receiving", l.dir, l.micro, l.chunk);
    landing_.clear();
    stats_.wait_ms += ms_since(t0);
  }

  // Note [Progress during compute]: one test of every pending transfer.
  void progress() {
    poll_sends();
    for (Direction dir : {kForwardDir, kBackwardDir}) {
      PostedReceive& r = posted_[dir];
      if (r.micro < 0) continue;
      naming("receiving", dir, r.micro, r.chunk, [&] {
        r.header_work.test();
        for (Work& w : r.works) w.test();
      });
    }
  }

  PipelineStats& stats() { return stats_; }

 private:
  // Virtual stages (Note [Interleaved 1F1B]): chunk c of this stage is c·stages + stage; its
  // neighbours are the next and previous ranks of pp, around the ring.
  int virtual_stage(int chunk) const { return chunk * stages_ + stage_; }
  bool first(int chunk) const { return virtual_stage(chunk) == 0; }
  bool last(int chunk) const { return virtual_stage(chunk) == stages_ * chunks_ - 1; }
  int next_rank() const { return (stage_ + 1) % stages_; }
  int prev_rank() const { return (stage_ + stages_ - 1) % stages_; }
  // The chunk on the neighbouring virtual stage that a message of `chunk` goes to or comes
  // from: the same one, or the next (previous) one across the ring's wrap.
  int chunk_after(int chunk) const { return chunk + (stage_ == stages_ - 1); }
  int chunk_before(int chunk) const { return chunk - (stage_ == 0); }
  int in_flight(int chunk) const { return in_flight_[size_t(chunk)]; }
  // The send whose completion frees a micro-batch's slot (Note [Slot reuse]).
  Direction slot_freed_by() const { return forward_only_ ? kForwardDir : kBackwardDir; }
  char& done(std::vector<char>& flags, int micro, int chunk) {
    return flags[size_t(chunk) * micro_batches_ + micro];
  }
  // The peer virtual stage and its rank for a message of (dir, chunk) sent or received here.
  int peer_rank(Direction dir, bool sending) const {
    return (dir == kForwardDir) == sending ? next_rank() : prev_rank();
  }
  int peer_stage(Direction dir, int chunk, bool sending) const {
    return (dir == kForwardDir) == sending ? virtual_stage(chunk) + 1 : virtual_stage(chunk) - 1;
  }
  // The unit of a message's tag is the receiver's (micro, chunk).
  int unit(int micro, int receiving_chunk) const { return micro * chunks_ + receiving_chunk; }

  template <typename F>
  void timed_compute(F&& f) {
    const auto t0 = CommClock::now();
    f();
    stats_.compute_ms += ms_since(t0);
  }

  void send(Direction dir, int micro, int chunk, const std::vector<StageTensor>& tensors) {
    const int vs = virtual_stage(chunk);
    check_tensors(tensors, vs, dir, micro,
                  dir == kForwardDir ? "forward output" : "backward output");
    const int dest = peer_rank(dir, true);
    const int u = unit(micro, dir == kForwardDir ? chunk_after(chunk) : chunk_before(chunk));
    PendingSend p{dir,
                  micro,
                  chunk,
                  std::make_unique<Header>(encode_header(tensors, dir, micro, vs, sent_[dir]++)),
                  {}};
    p.works.push_back(pp_.send(p.header->data(), kHeaderWords, dest, message_tag(dir, u, 0)));
    Communicator* link = links_ ? links_->send[dir] : nullptr;
    if (link) order_link_after_compute(*link, send_mark_[dir].get());  // the data is written
    for (size_t i = 0; i < tensors.size(); ++i) {
      const size_t n = tensors[i].count();
      if (n == 0) continue;
      p.works.push_back(
          link ? link->send(tensors[i].data, n, 1)
               : pp_.send(tensors[i].data, n, dest, message_tag(dir, u, static_cast<int>(i) + 1)));
      stats_.bytes_sent += n * sizeof(float);
    }
    ++stats_.messages_sent;
    pending_.push_back(std::move(p));
  }

  bool send_pending(Direction dir, int micro, int chunk) const {
    return std::any_of(pending_.begin(), pending_.end(), [&](const PendingSend& p) {
      return p.dir == dir && p.micro == micro && p.chunk == chunk;
    });
  }

  // Note [Pre-posted receives]: posts what may be posted now.
  void post_receives() {
    for (Direction dir : {kForwardDir, kBackwardDir}) {
      if (posted_[dir].micro >= 0 || next_post_[dir] >= receives_[dir].size()) continue;
      const PipeAction& a = receives_[dir][next_post_[dir]];
      if (dir == kForwardDir) {
        const int prev = a.micro - in_flight(a.chunk);
        if (prev >= 0 && (!done(forward_only_ ? forwarded_ : backwarded_, prev, a.chunk) ||
                          send_pending(slot_freed_by(), prev, a.chunk)))
          continue;
        post(dir, a.micro, a.chunk, model_.forward_inputs(a.micro, a.chunk));
      } else {
        if (!done(forwarded_, a.micro, a.chunk)) continue;
        post(dir, a.micro, a.chunk, model_.backward_inputs(a.micro, a.chunk));
      }
    }
  }

  void post(Direction dir, int micro, int chunk, const std::vector<StageTensor>& tensors) {
    check_tensors(tensors, virtual_stage(chunk), dir, micro,
                  dir == kForwardDir ? "forward input" : "backward input");
    const int src = peer_rank(dir, false);
    const int u = unit(micro, chunk);
    PostedReceive& r = posted_[dir];
    r.micro = micro;
    r.chunk = chunk;
    r.header = std::make_unique<Header>();
    r.header_work = pp_.recv(r.header->data(), kHeaderWords, src, message_tag(dir, u, 0));
    r.sequence = received_[dir]++;
    r.expected.clear();
    r.works.clear();
    Communicator* link = links_ ? links_->recv[dir] : nullptr;
    if (link) order_link_after_compute(*link, recv_mark_[dir].get());  // the buffers are free
    for (size_t i = 0; i < tensors.size(); ++i) {
      r.expected.push_back(describe(tensors[i]));
      const size_t n = tensors[i].count();
      if (n == 0) continue;
      r.works.push_back(
          link ? link->recv(tensors[i].data, n, 0)
               : pp_.recv(tensors[i].data, n, src, message_tag(dir, u, static_cast<int>(i) + 1)));
      stats_.bytes_received += n * sizeof(float);
    }
    ++next_post_[dir];
  }

  // Waits for the posted receive of (micro, chunk). The header is checked before the tensors
  // are waited for, so a shape mismatch is reported as such (the tensors' receives, posted with
  // this stage's sizes, may have failed with a truncation; they are abandoned with the Error).
  void complete_receive(Direction dir, int micro, int chunk) {
    PostedReceive& r = posted_[dir];
    const int vs = virtual_stage(chunk), src = peer_stage(dir, chunk, false);
    TRIDENT_CHECK(r.micro == micro && r.chunk == chunk,
                  "pipeline: stage {} needs the {} of micro-batch {}, but the receive posted "
                  "is for micro-batch {} of chunk {}",
                  vs, what_moves(dir), micro, r.micro, r.chunk);
    const auto t0 = CommClock::now();
    wait_naming(r.header_work, "receiving", dir, micro, chunk);
    check_received(r.expected, decode_header(*r.header, vs, src, dir, micro), vs, src, dir, micro);
    if (links_ && links_->recv[dir]) {
      // Note [Stage transfers on a device]: the link paired this receive with the sender's
      // message of the same count; the header says which message that is.
      if ((*r.header)[5] != r.sequence)
        internal_error(__FILE__, __LINE__,
                       fmt::format("pipeline: stage {} posted its receive {} of {} from stage {} "
                                   "for micro-batch {}, which the sender sent as its message {}: "
                                   "the two sides order this link's messages differently",
                                   vs, r.sequence, what_moves(dir), src, micro, (*r.header)[5]));
      // Compute waits for the link on the device; the host only tests the receive from now on.
      links_->recv[dir]->compute_waits_for_comm();
      landing_.push_back({dir, micro, chunk, std::move(r.works)});
      r.works.clear();
    }
    for (Work& w : r.works) wait_naming(w, "receiving", dir, micro, chunk);
    stats_.wait_ms += ms_since(t0);
    r.micro = -1;
  }

  // A link operation reads or writes what compute wrote or read up to now.
  static void order_link_after_compute(Communicator& link, ComputeMark* mark) {
    if (!mark) return;
    link.record_mark(*mark);
    link.order_after(mark);
  }

  // Waits for w, with a failure (e.g. the comm timeout when a neighbour stopped) saying which
  // boundary message this stage was waiting for.
  //
  // Note [Waiting on the compute thread]
  // The thread that runs the schedule has nothing else to do until the message is in, so it
  // tests and yields (test() enforces the timeout) instead of Work::wait's backoff, whose
  // sleeps are for threads that share cores with compute and overshoot the neighbour's send
  // (docs/perf.md, "Tensor-parallel waits on the compute thread"); GPT::tp_wait does the same.
  void wait_naming(Work& w, const char* doing, Direction dir, int micro, int chunk) {
    naming(doing, dir, micro, chunk, [&] {
      while (!w.test()) std::this_thread::yield();
    });
  }

  template <typename F>
  void naming(const char* doing, Direction dir, int micro, int chunk, F&& f) {
    try {
      f();
    } catch (const Error& e) {
      const bool sending = doing[0] == 's';
      throw Error(fmt::format("pipeline: stage {} {} the {} of micro-batch {} {} stage {}: {}",
                              virtual_stage(chunk), doing, what_moves(dir), micro,
                              sending ? "to" : "from", peer_stage(dir, chunk, sending), e.what()),
                  e.code());
    }
  }

  void wait_send(PendingSend& p) {
    for (Work& w : p.works) wait_naming(w, "sending", p.dir, p.micro, p.chunk);
  }

  // Drives progress on every pending send (and landing receive) and drops the completed ones.
  void poll_sends() {
    std::erase_if(pending_, [](PendingSend& p) {
      bool done = true;
      for (Work& w : p.works) done = w.test() && done;
      return done;
    });
    std::erase_if(landing_, [this](Landing& l) {
      bool done = true;
      naming("receiving", l.dir, l.micro, l.chunk, [&] {
        for (Work& w : l.works) done = w.test() && done;
      });
      return done;
    });
  }

  void complete_sends(Direction dir, int micro, int chunk) {
    const auto t0 = CommClock::now();
    std::erase_if(pending_, [&](PendingSend& p) {
      if (p.dir != dir || p.micro != micro || p.chunk != chunk) return false;
      wait_send(p);
      return true;
    });
    stats_.wait_ms += ms_since(t0);
  }

  // A link receive the compute stream already waits for, tested until it completed (a failure
  // or the comm timeout is still reported).
  struct Landing {
    Direction dir;
    int micro, chunk;
    std::vector<Work> works;
  };

  Communicator& pp_;
  const int stages_, stage_, micro_batches_, chunks_;
  const std::vector<int> in_flight_;  // by chunk
  const bool split_, forward_only_;
  PipelineStage& model_;
  const StageLinks* links_;                                   // null: the tensors travel over pp
  std::shared_ptr<ComputeMark> send_mark_[2], recv_mark_[2];  // by Direction; null on a host
  int64_t sent_[2] = {0, 0}, received_[2] = {0, 0};           // messages so far, by Direction
  std::vector<Landing> landing_;
  std::vector<PendingSend> pending_;
  std::vector<PipeAction> receives_[2];       // by Direction: the actions that receive, in order
  PostedReceive posted_[2];                   // by Direction
  size_t next_post_[2] = {0, 0};              // the next of receives_ to post, by Direction
  std::vector<char> forwarded_, backwarded_;  // [chunk][micro]; backwarded_: whole backward
  PipelineStats stats_;
};

}  // namespace

namespace {

PipelineStats run_actions(Communicator& pp, int stages, int stage, int micro_batches, int chunks,
                          const std::vector<PipeAction>& actions, std::vector<int> in_flight,
                          bool split, bool forward_only, PipelineStage& model,
                          const StageLinks* links) {
  TRIDENT_CHECK(pp.size() == stages && pp.rank() == stage,
                "run_pipeline for stage {} of {} on communicator '{}' where this rank is {} of {}",
                stage, stages, pp.name(), pp.rank(), pp.size());
  TRIDENT_CHECK(model.chunks() == chunks, "run_pipeline with {} chunks for a stage holding {}",
                chunks, model.chunks());
  if (links && stages > 1)
    for (int dir : {0, 1})
      for (Communicator* link : {links->send[dir], links->recv[dir]})
        TRIDENT_CHECK(link != nullptr && link->size() == 2 &&
                          link->rank() == (link == links->send[dir] ? 0 : 1),
                      "run_pipeline: stage {}'s {} link for {} is not a two-rank communicator "
                      "with the sender at rank 0",
                      stage, link == links->send[dir] ? "sending" : "receiving",
                      dir == 0 ? "activations" : "gradients");
  const auto t0 = CommClock::now();
  StageRunner runner(pp, stages, stage, micro_batches, chunks, std::move(in_flight), split,
                     forward_only, actions, model, stages > 1 ? links : nullptr);
  model.set_transfer_progress([&runner] { runner.progress(); });
  try {
    for (const PipeAction& a : actions) runner.run_action(a);
    runner.complete_all_sends();
  } catch (...) {
    model.set_transfer_progress({});
    throw;
  }
  model.set_transfer_progress({});
  PipelineStats stats = runner.stats();
  stats.total_ms = ms_since(t0);
  return stats;
}

}  // namespace

PipelineStats run_pipeline(PipeSchedule schedule, Communicator& pp, int stages, int stage,
                           int micro_batches, PipelineStage& model, int chunks,
                           const StageLinks* links) {
  if (schedule == PipeSchedule::kInterleaved && chunks < 2)
    input_error("parallel.schedule: interleaved needs stages of 2 or more model chunks "
                "(PipelineStage::chunks(), parallel.virtual_stages), not {}; use 1f1b",
                chunks);
  const bool split = splits_backward(schedule);
  if (split && !model.can_split_backward())
    input_error("parallel.schedule: {} splits each backward into its input and weight parts, "
                "which this model's pipeline stage does not provide; use 1f1b",
                pipe_schedule_name(schedule));
  std::vector<int> in_flight;
  for (int c = 0; c < chunks; ++c)
    in_flight.push_back(max_in_flight(schedule, stages, stage, micro_batches, chunks, c));
  return run_actions(pp, stages, stage, micro_batches, chunks,
                     pipeline_actions(schedule, stages, stage, micro_batches, chunks),
                     std::move(in_flight), split, /*forward_only=*/false, model, links);
}

PipelineStats run_pipeline_forward(Communicator& pp, int stages, int stage, int micro_batches,
                                   PipelineStage& model, int chunks, const StageLinks* links) {
  // Micro-batch by micro-batch, each through the stage's chunks in order: the order the
  // neighbours' outputs arrive in, around the ring with several chunks. One micro-batch in
  // flight per chunk: forward(m) starts once forward(m − 1)'s send has completed.
  std::vector<PipeAction> actions;
  for (int m = 0; m < micro_batches; ++m)
    for (int c = 0; c < chunks; ++c) actions.push_back({PipeAction::Kind::kForward, m, c});
  return run_actions(pp, stages, stage, micro_batches, chunks, actions,
                     std::vector<int>(size_t(chunks), 1), /*split=*/false,
                     /*forward_only=*/true, model, links);
}

}  // namespace trident
