// Communicators: collectives and point-to-point transfers that return a Work to wait on.
//
// `Communicator` is the interface the model, the trainer and the GradReducer call; `MpiComm`
// implements it for host buffers over an MPI communicator; NcclComm (trident/nccl_comm.h,
// CUDA builds) implements it for device buffers. Every operation is started at once and
// completes later:
//
//     Work w = comm.all_reduce(grads, n);   // sum, in place
//     ...                                   // other work
//     w.wait();                             // or poll w.test()
//
// A communicator is used by one thread at a time (Note [One thread per communicator]; the
// exceptions are new_mark and record_mark, Note [Gradient-ready events]); different
// communicators may be used by different threads at once. A Work must not outlive its communicator,
// and its buffers must stay alive until it completed.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "trident/bfloat16.h"

namespace trident {

using CommClock = std::chrono::steady_clock;

// kBfloat16: moved as it is (ZeRO-3's bf16 weight gathers: Note [bf16 unit gathers] in
// train/zero3_pool.h); host communicators do not sum it.
enum class ElemType { kFloat32, kFloat64, kInt32, kInt64, kUint8, kBfloat16 };
size_t elem_bytes(ElemType type);
const char* elem_type_name(ElemType type);

template <typename T>
constexpr ElemType elem_type_of() {
  if constexpr (std::is_same_v<T, float>) return ElemType::kFloat32;
  else if constexpr (std::is_same_v<T, double>) return ElemType::kFloat64;
  else if constexpr (std::is_same_v<T, int32_t>) return ElemType::kInt32;
  else if constexpr (std::is_same_v<T, int64_t>) return ElemType::kInt64;
  else if constexpr (std::is_same_v<T, uint8_t> || std::is_same_v<T, char>) return ElemType::kUint8;
  else if constexpr (std::is_same_v<T, bfloat16>) return ElemType::kBfloat16;
  else static_assert(sizeof(T) == 0, "no ElemType for this element type");
}

// One completed (or running) operation, for comm_ms accounting and traces.
struct OpRecord {
  // "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv", "all_to_all"
  const char* op = "";
  // This rank's buffer (all_reduce, broadcast, send, recv); the full gathered buffer
  // (reduce_scatter input, all_gather output); what this rank sends to the others (all_to_all).
  size_t bytes = 0;
  CommClock::time_point start{}, end{};  // end is set once the operation completed
  double link_ms = 0;  // on an emulated link, its time on the wire (emulated_link_seconds)
  double ms() const { return std::chrono::duration<double, std::milli>(end - start).count(); }
};

// A handle on one started operation. An empty (default-constructed) Work is complete.
class Work {
 public:
  class Impl {
   public:
    virtual ~Impl() = default;
    // Drives progress once; true when complete. Throws on failure or timeout.
    virtual bool test() = 0;
    // Blocks (sleeping, not spinning) until complete. Throws on failure or timeout.
    virtual void wait() = 0;
    virtual const OpRecord& record() const = 0;
    // The operation needs no more progress calls before this time (it is only waiting for an
    // emulated link); time_point::min() while it still needs them. Lets a poller sleep longer.
    virtual CommClock::time_point idle_until() const { return CommClock::time_point::min(); }
  };

  Work() = default;
  explicit Work(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Work(Work&&) noexcept = default;
  Work& operator=(Work&&) noexcept = default;
  ~Work() = default;  // an incomplete Work is abandoned, not waited for (see MpiComm)

  bool test() { return !impl_ || impl_->test(); }
  void wait() {
    if (impl_) impl_->wait();
  }
  // Valid for a non-empty Work; end is meaningful once test() returned true or wait() returned.
  const OpRecord& record() const;
  CommClock::time_point idle_until() const {
    return impl_ ? impl_->idle_until() : CommClock::time_point::min();
  }
  // The implementation, for the communicator that made it (Communicator::device_span); null
  // for an empty Work.
  const Impl* impl() const { return impl_.get(); }

 private:
  std::unique_ptr<Impl> impl_;
};

// kBitOr is the bitwise OR of integer elements (a union of bitmaps, such as a set of rows each
// rank marked); host communicators only (NCCL has no OR).
enum class ReduceOp { kSum, kBitOr };

// Note [Gradient-ready events]
// On a device, a gradient is final at a point in the compute stream, not at a moment on the
// host. So its readiness travels as a mark (an event recorded on the compute stream), the
// communication stream waits for the mark on the device before reading the gradient, and the
// compute stream waits for the communication only after the last operation (finish()). The host
// never blocks, and backward keeps running while buckets are reduced. On host communicators the
// mark is null and the hooks do nothing: host data is final when grad_ready is called.
class ComputeMark {
 public:
  virtual ~ComputeMark() = default;
};

// Note [One thread per communicator]
// A communicator is used by one thread at a time. MPI_THREAD_MULTIPLE allows concurrent calls,
// but two threads starting collectives on one communicator would start them in a racy order,
// breaking Note [Same buckets, same order]. Threads that work at once use communicators of
// their own (an MPI_Comm_dup).
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;

  // Sum (or bitwise OR) over all ranks, in place. `label` names the operation in profiler
  // ranges (e.g. the bucket); it does not change what is computed.
  template <typename T>
  Work all_reduce(T* data, size_t count, ReduceOp op = ReduceOp::kSum,
                  std::string_view label = {}) {
    return start_all_reduce_op(data, count, elem_type_of<T>(), op, label);
  }
  // send holds size()·recv_count elements; rank r receives the sum of block r.
  template <typename T>
  Work reduce_scatter(const T* send, T* recv, size_t recv_count) {
    return start_reduce_scatter(send, recv, recv_count, elem_type_of<T>());
  }
  // recv gets size()·send_count elements: rank r's send block at r·send_count.
  template <typename T>
  Work all_gather(const T* send, T* recv, size_t send_count) {
    return start_all_gather(send, recv, send_count, elem_type_of<T>());
  }
  template <typename T>
  Work broadcast(T* data, size_t count, int root) {
    return start_broadcast(data, count, elem_type_of<T>(), root);
  }
  // send_counts[p] elements to peer p, recv_counts[p] from it, each side packed in peer order.
  template <typename T>
  Work all_to_all_v(const T* send, const size_t* send_counts, T* recv, const size_t* recv_counts) {
    return start_all_to_all_v(send, send_counts, recv, recv_counts, elem_type_of<T>());
  }
  // dest/src are ranks of this communicator.
  template <typename T>
  Work send(const T* data, size_t count, int dest, int tag = 0) {
    return start_send(data, count, elem_type_of<T>(), dest, tag);
  }
  template <typename T>
  Work recv(T* data, size_t count, int src, int tag = 0) {
    return start_recv(data, count, elem_type_of<T>(), src, tag);
  }
  // Sends send_counts[p] elements to peer p (taken from `send` at the prefix sum of the counts
  // before p) and receives recv_counts[p] from p (placed at the prefix sum likewise). Both arrays
  // have size() entries; counts may be zero; every rank must call it (MPI_Ialltoallv semantics).
  // The count arrays are read during the call only; send and recv stay in use until complete.
  virtual Work start_all_to_all_v(const void* send, const size_t* send_counts, void* recv,
                                  const size_t* recv_counts, ElemType type) = 0;

  // Ordering with a compute stream: Note [Gradient-ready events]. The defaults are those of a
  // host communicator: no mark, nothing to wait for.
  // new_mark: a mark made once and recorded again and again (null on a host; `timed`: one for
  // Note [Device time of an operation], null where this communicator does not time).
  // record_mark: on the compute thread, right after the kernels the mark stands for were
  // enqueued, moves it to the compute stream's current point; record a mark again only after
  // every order_after that read it. These two are the calls a thread other than the
  // communicator's user may make (they touch only the compute stream and the mark's event).
  virtual std::shared_ptr<ComputeMark> new_mark(bool timed) {
    (void)timed;
    return nullptr;
  }
  virtual void record_mark(ComputeMark& mark) { (void)mark; }
  // A fresh mark recorded now, untimed or timed (null on a host); for one-off orderings and
  // tests: hot paths make their marks once (Note [Marks made once]).
  std::shared_ptr<const ComputeMark> mark_compute_ready() { return recorded(new_mark(false)); }
  std::shared_ptr<const ComputeMark> mark_compute_time() { return recorded(new_mark(true)); }
  // On the user thread, before starting the operation that reads the marked gradients: the
  // communication stream waits for the mark on the device.
  virtual void order_after(const ComputeMark* mark) { (void)mark; }
  // After the operations completed (GradReducer::finish): the compute stream waits for the
  // communication stream.
  virtual void compute_waits_for_comm() {}

  // Note [Device time of an operation]
  // On a device an operation's host times say only when it was enqueued and when a poll saw it
  // complete; the device ran it somewhere between. So where a communicator can time on the
  // device, spans and exposed time are device times, in ms after an `origin` mark on the
  // compute stream; host times are used only where there is none (host communicators).
  //
  // new_mark(true): a timed mark on the compute stream (compute thread); null on a host.
  // device_span: the device start and end of completed Work `w` (user thread); false where
  // there is no device time. mark_elapsed_ms: `mark` after `origin` (waits until `mark` is
  // reached); false without device time. The GradReducer times a step with them when
  // new_mark(true) gives a mark.
  virtual bool device_span(const Work& w, const ComputeMark& origin, double* start_ms,
                           double* end_ms) {
    (void)w, (void)origin, (void)start_ms, (void)end_ms;
    return false;
  }
  virtual bool mark_elapsed_ms(const ComputeMark& origin, const ComputeMark& mark, double* ms) {
    (void)origin, (void)mark, (void)ms;
    return false;
  }

 protected:
  std::shared_ptr<const ComputeMark> recorded(std::shared_ptr<ComputeMark> mark) {
    if (mark) record_mark(*mark);
    return mark;
  }
  // The sum.
  virtual Work start_all_reduce(void* data, size_t count, ElemType type) = 0;
  // The default: kSum is start_all_reduce; kBitOr is refused on more than one rank (a
  // communicator that can OR overrides this). The label is unused.
  virtual Work start_all_reduce_op(void* data, size_t count, ElemType type, ReduceOp op,
                                   std::string_view label);
  virtual Work start_reduce_scatter(const void* send, void* recv, size_t recv_count,
                                    ElemType type) = 0;
  virtual Work start_all_gather(const void* send, void* recv, size_t send_count, ElemType type) = 0;
  virtual Work start_broadcast(void* data, size_t count, ElemType type, int root) = 0;
  virtual Work start_send(const void* data, size_t count, ElemType type, int dest, int tag) = 0;
  virtual Work start_recv(void* data, size_t count, ElemType type, int src, int tag) = 0;
};

// A communicator of one rank, without MPI: collectives are copies or nothing, and send/recv
// (which would need a peer) fail. Lets single-process code (tests, a one-stage pipeline) use
// the same calls as a real grid.
class SoloComm : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }

 protected:
  Work start_all_reduce(void* data, size_t count, ElemType type) override;
  Work start_reduce_scatter(const void* send, void* recv, size_t recv_count,
                            ElemType type) override;
  Work start_all_gather(const void* send, void* recv, size_t send_count, ElemType type) override;
  Work start_broadcast(void* data, size_t count, ElemType type, int root) override;
  Work start_send(const void* data, size_t count, ElemType type, int dest, int tag) override;
  Work start_recv(void* data, size_t count, ElemType type, int src, int tag) override;

 public:
  // A copy of send_counts[0] elements.
  Work start_all_to_all_v(const void* send, const size_t* send_counts, void* recv,
                          const size_t* recv_counts, ElemType type) override;

 private:
  std::string name_ = "solo";
};

// Link emulation: the time a ring algorithm needs on a link of `gbps` gigabits per second
// (10⁹ bit/s) and `latency_us` per hop, for n ranks and `bytes` as in OpRecord::bytes:
//   all_reduce       2(n−1)/n · bytes / bw + 2(n−1) · latency
//   reduce_scatter    (n−1)/n · bytes / bw +  (n−1) · latency   (bytes = the full input)
//   all_gather        (n−1)/n · bytes / bw +  (n−1) · latency   (bytes = the full output)
//   broadcast                   bytes / bw +  (n−1) · latency   (pipelined chain)
//   send, recv                  bytes / bw +          latency   (one hop)
//   all_to_all                  bytes / bw +  (n−1) · latency   (bytes = sent to other ranks)
// Collectives on one rank take 0.
enum class LinkOp { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kSendRecv, kAllToAll };
double emulated_link_seconds(LinkOp op, size_t bytes, int n, double gbps, double latency_us);

// How long a thread that drives MPI progress pauses after `idle_polls` polls in a row that
// completed nothing: a few yields first (a short operation ends within microseconds), then
// sleeps growing to 200 µs, so waiting leaves the cores to compute.
std::chrono::microseconds progress_backoff(int idle_polls);

constexpr double kDefaultCommTimeoutSeconds = 300.0;

class MpiWork;  // one MpiComm operation (src/comm/mpi_comm.cpp)

// Host buffers over an MPI communicator, with nonblocking MPI calls (MPI_Iallreduce, ...).
// Open MPI has no asynchronous progress thread: a started operation advances only while some
// thread is inside MPI, so Work::wait() drives it with MPI_Test and short sleeps, and a poller
// must call test() often (the GradReducer's thread does).
class MpiComm : public Communicator {
 public:
  // Takes ownership of `comm` (freed on destruction) unless it is MPI_COMM_WORLD/SELF.
  // Sets MPI_ERRORS_RETURN on an owned one, so a failing call becomes an Error naming file,
  // line and rank.
  MpiComm(MPI_Comm comm, std::string name);
  static std::unique_ptr<MpiComm> duplicate(MPI_Comm parent, std::string name);
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;
  ~MpiComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  MPI_Comm raw() const { return comm_; }

  // An operation not complete this many seconds after it started throws an Error naming the
  // operation, the communicator and the rank. The operation is then abandoned: its MPI request
  // stays pending (MPI cannot cancel a collective), so the communicator is unusable and the
  // program must end (the app calls MPI_Abort on any error).
  void set_timeout(double seconds);
  double timeout() const { return timeout_s_; }

  // Emulate a slower link: every operation completes no earlier than `start + model time`
  // (emulated_link_seconds), where start is when it was started or, if an earlier operation
  // of this communicator still holds the emulated link, when that one's time ends (the link
  // carries one operation at a time). Its MPI call is posted at its turn (Note [Paced link] in
  // src/comm/mpi_comm.cpp). The waiting thread sleeps; the cores stay free. gbps <= 0 turns
  // emulation off.
  void set_emulated_link(double gbps, double latency_us);
  bool link_emulated() const { return link_gbps_ > 0; }
  // Emulates `other`'s link (its speed, and the same queue of time: one operation at a time
  // over both): two communicators over one wire, e.g. ZeRO-3's gathers beside the gradients'
  // reduce-scatters. Both must then be used from one thread; `other` must outlive this one.
  void share_emulated_link(MpiComm& other);
  // A full-duplex link: sends queue on a wire of their own, so a rank's send and receive of one
  // ring step (context parallelism's K/V) take one step's time, not two. Off by default.
  void set_duplex_link(bool on) { duplex_ = on; }

  // When on, every completed operation's OpRecord is kept until taken (for comm_ms accounting
  // of a communicator that is not driven by a GradReducer, e.g. tp()).
  void set_recording(bool on) { recording_ = on; }
  std::vector<OpRecord> take_records();

  // Note [bf16 gradient compression]
  // When on, every float32 sum all-reduce and reduce-scatter (ZeRO's) of this communicator
  // travels as bf16, for half the
  // bytes on the wire (comm.grad_dtype: bf16 on the CPU; PyTorch DDP's bf16_compress_hook):
  // rounded into a staging buffer at the start, summed in bf16 by a user MPI_Op, widened back
  // at completion. Other types and operations are unchanged. Only the gradients' communicator
  // turns it on, so the loss and the norms stay exact.
  //
  // Each rank's contribution is rounded once and every partial sum again. The emulated link
  // (set_emulated_link) counts the halved bytes.
  void set_bf16_sums(bool on);
  bool bf16_sums() const { return bf16_op_ != MPI_OP_NULL; }

 protected:
  Work start_all_reduce(void* data, size_t count, ElemType type) override;
  // kBitOr as MPI_BOR; kSum as Communicator's.
  Work start_all_reduce_op(void* data, size_t count, ElemType type, ReduceOp op,
                           std::string_view label) override;
  Work start_reduce_scatter(const void* send, void* recv, size_t recv_count,
                            ElemType type) override;
  Work start_all_gather(const void* send, void* recv, size_t send_count, ElemType type) override;
  Work start_broadcast(void* data, size_t count, ElemType type, int root) override;
  Work start_send(const void* data, size_t count, ElemType type, int dest, int tag) override;
  Work start_recv(void* data, size_t count, ElemType type, int src, int tag) override;

 public:
  // MPI_Ialltoallv; every count and displacement must fit in an int (else an Error, before
  // anything starts). The emulated link carries the bytes sent to other ranks.
  Work start_all_to_all_v(const void* send, const size_t* send_counts, void* recv,
                          const size_t* recv_counts, ElemType type) override;

 private:
  friend class MpiWork;  // the calls below serve this communicator's Work objects

  // Makes an operation's MPI call(s), into the given requests (one slot per request).
  using Post = std::function<void(MPI_Request* requests)>;
  void note_completed(const OpRecord& record);
  // Note [Paced link]: posts, in start order, every queued operation whose turn on the
  // emulated link has come; forget_unposted drops an abandoned one from the queue.
  void post_due();
  void forget_unposted(const MpiWork* work);
  // A bf16 staging buffer of at least n elements, and its return once the operation is done;
  // grow-only and reused, so a step in steady state allocates nothing.
  std::vector<uint16_t>* take_staging(size_t n);
  void give_staging(std::vector<uint16_t>* buffer);

  struct Staged {                   // a bf16 sum's staging buffer and where its result goes
    std::vector<uint16_t>* buffer;  // null: not staged
    float* out;
    size_t count;
    size_t offset;  // where the result starts in the buffer (a reduce-scatter's own block; 0)
  };
  // The operation's MPI calls are `post`, made now or, on an emulated link, at its turn.
  Work make_work(const char* op, LinkOp link_op, size_t bytes, size_t requests, Post post,
                 CommClock::time_point start, Staged staged = {});

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_;
  int rank_ = 0, size_ = 1;
  double timeout_s_ = kDefaultCommTimeoutSeconds;
  double link_gbps_ = 0, link_latency_us_ = 0;
  CommClock::time_point link_free_at_{};
  CommClock::time_point* link_clock_ = &link_free_at_;  // share_emulated_link: another's
  bool duplex_ = false;
  CommClock::time_point send_free_at_{};  // set_duplex_link: the sends' wire
  std::deque<MpiWork*> unposted_;         // Note [Paced link]: in start order
  bool recording_ = false;
  std::vector<OpRecord> records_;
  MPI_Op bf16_op_ = MPI_OP_NULL;
  std::mutex staging_mutex_;
  std::vector<std::unique_ptr<std::vector<uint16_t>>> staging_;  // every buffer, owned
  std::vector<std::vector<uint16_t>*> staging_free_;
};

}  // namespace trident
