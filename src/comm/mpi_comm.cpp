// MpiComm: the Communicator for host buffers, over nonblocking MPI calls.
//
// Every operation is an MPI_I* call whose request an MpiWork polls with MPI_Test. Open MPI has
// no asynchronous progress thread, so nothing moves unless some thread is inside MPI; wait()
// therefore loops on MPI_Test with yields and short sleeps (progress_backoff) instead of
// calling MPI_Wait, which keeps the timeout enforceable and, with
// OMPI_MCA_mpi_yield_when_idle, leaves the cores to compute threads.
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <thread>

#include "bf16_sum.h"
#include "trident/check.h"
#include "trident/comm.h"

namespace trident {

size_t elem_bytes(ElemType type) {
  switch (type) {
    case ElemType::kFloat32: return 4;
    case ElemType::kFloat64: return 8;
    case ElemType::kInt32: return 4;
    case ElemType::kInt64: return 8;
    case ElemType::kUint8: return 1;
    case ElemType::kBfloat16: return 2;
  }
  return 0;
}

const char* elem_type_name(ElemType type) {
  switch (type) {
    case ElemType::kFloat32: return "float32";
    case ElemType::kFloat64: return "float64";
    case ElemType::kInt32: return "int32";
    case ElemType::kInt64: return "int64";
    case ElemType::kUint8: return "uint8";
    case ElemType::kBfloat16: return "bf16";
  }
  return "?";
}

const OpRecord& Work::record() const {
  TRIDENT_CHECK(impl_ != nullptr, "record() of an empty Work");
  return impl_->record();
}

double emulated_link_seconds(LinkOp op, size_t bytes, int n, double gbps, double latency_us) {
  if (gbps <= 0) return 0;
  const double bytes_per_s = gbps * 1e9 / 8;
  const double latency_s = latency_us * 1e-6;
  const double b = static_cast<double>(bytes);
  if (op == LinkOp::kSendRecv) return b / bytes_per_s + latency_s;
  if (n <= 1) return 0;
  const double steps = n - 1;
  switch (op) {
    case LinkOp::kAllReduce: return 2 * steps / n * b / bytes_per_s + 2 * steps * latency_s;
    case LinkOp::kReduceScatter:
    case LinkOp::kAllGather: return steps / n * b / bytes_per_s + steps * latency_s;
    case LinkOp::kBroadcast:
    case LinkOp::kAllToAll: return b / bytes_per_s + steps * latency_s;
    case LinkOp::kSendRecv: break;
  }
  return 0;
}

std::chrono::microseconds progress_backoff(int idle_polls) {
  using std::chrono::microseconds;
  if (idle_polls < 8) return microseconds(0);  // 0 = yield
  if (idle_polls < 16) return microseconds(10);
  if (idle_polls < 24) return microseconds(50);
  return microseconds(200);
}

namespace {

MPI_Datatype mpi_type(ElemType type) {
  switch (type) {
    case ElemType::kFloat32: return MPI_FLOAT;
    case ElemType::kFloat64: return MPI_DOUBLE;
    case ElemType::kInt32: return MPI_INT32_T;
    case ElemType::kInt64: return MPI_INT64_T;
    case ElemType::kUint8: return MPI_UINT8_T;
    case ElemType::kBfloat16: return MPI_UINT16_T;  // moved, never summed (check_summable)
  }
  return MPI_DATATYPE_NULL;
}

int mpi_count(size_t count, const char* op) {
  TRIDENT_CHECK(count <= static_cast<size_t>(INT_MAX), "{} of {} elements: MPI counts are int", op,
                count);
  return static_cast<int>(count);
}

void pause_for(int idle_polls) {
  const auto pause = progress_backoff(idle_polls);
  if (pause.count() == 0) std::this_thread::yield();
  else std::this_thread::sleep_for(pause);
}

// MPI has no bf16 sum (its MPI_UINT16_T would add integers): bf16 is only moved here.
void check_summable(ElemType type, const std::string& comm) {
  if (type == ElemType::kBfloat16)
    internal_error(
        __FILE__, __LINE__,
        fmt::format("a bf16 sum on host communicator '{}': bf16 is moved, not summed", comm));
}

}  // namespace

// Note [Paced link]
// On an emulated link an operation's MPI call is posted when its turn on the link begins, not
// when it is started, so its copies and sums take the cores while the link carries it, as a
// real link's queue would spread them (shared memory moves the bytes in milliseconds).
// Operations are posted in start order, whichever Work is tested first, since MPI pairs
// collectives by it (Note [Same buckets, same order]). Without emulation all post at once.
class MpiWork final : public Work::Impl {
 public:
  // One operation may be several MPI requests (a reduce-scatter:
  // Note [Reduce-scatter as reduces]); it is complete when all are. `post` makes the MPI calls,
  // at post_at or later.
  MpiWork(MpiComm* comm, const char* op, size_t bytes, size_t requests, MpiComm::Post post,
          CommClock::time_point start, CommClock::time_point post_at,
          CommClock::time_point link_done)
      : comm_(comm), requests_(requests, MPI_REQUEST_NULL), post_(std::move(post)),
        post_at_(post_at), link_done_(link_done) {
    record_.op = op;
    record_.bytes = bytes;
    record_.start = start;
    record_.link_ms = std::chrono::duration<double, std::milli>(link_done - post_at).count();
  }

  // A bf16-staged sum (Note [bf16 gradient compression]): its n values at `offset` of the
  // staging buffer widened into `out` when done.
  void set_staged(std::vector<uint16_t>* staged, float* out, size_t n, size_t offset) {
    staged_ = staged;
    out_ = out;
    n_ = n;
    offset_ = offset;
  }

  ~MpiWork() override {
    if (!posted_) comm_->forget_unposted(this);
    if (staged_ != nullptr && transport_done_) comm_->give_staging(staged_);
  }

  CommClock::time_point post_at() const { return post_at_; }
  // `post` lives until the transport completed: what it captured (an all-to-all's counts) may
  // be read by MPI until then.
  void post() {
    post_(requests_.data());
    posted_ = true;
  }

  bool test() override {
    if (complete_) return true;
    // Whatever is due on this communicator, not only this operation: a peer may be waiting for
    // an operation queued behind this one while this rank waits for this one.
    comm_->post_due();
    if (!posted_) return false;  // waiting for its turn on the emulated link
    if (!transport_done_) {
      int flag = 0;
      TRIDENT_MPI(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                              MPI_STATUSES_IGNORE));
      transport_done_ = flag != 0;
      if (transport_done_) post_ = nullptr;
      if (transport_done_ && staged_ != nullptr)
        bf16::to_float(staged_->data() + offset_, out_, n_);
    }
    const auto now = CommClock::now();
    if (transport_done_) {
      if (now < link_done_) return false;
      complete_ = true;
      record_.end = now;
      comm_->note_completed(record_);
      return true;
    }
    const double elapsed = std::chrono::duration<double>(now - record_.start).count();
    if (elapsed > comm_->timeout())
      internal_error(__FILE__, __LINE__,
                     fmt::format("{} of {} bytes on communicator '{}' (rank {} of {}) did not "
                                 "complete within the timeout of {} s (comm.timeout_s)",
                                 record_.op, record_.bytes, comm_->name(), comm_->rank(),
                                 comm_->size(), comm_->timeout()));
    return false;
  }

  void wait() override {
    for (int idle = 0; !test(); ++idle) {
      if (!posted_) std::this_thread::sleep_until(post_at_);
      else if (transport_done_) std::this_thread::sleep_until(link_done_);
      else pause_for(idle);
    }
  }

  const OpRecord& record() const override { return record_; }

  CommClock::time_point idle_until() const override {
    if (!posted_) return post_at_;
    return transport_done_ && !complete_ ? link_done_ : CommClock::time_point::min();
  }

 private:
  MpiComm* comm_;
  std::vector<MPI_Request> requests_;
  MpiComm::Post post_;
  CommClock::time_point post_at_, link_done_;
  OpRecord record_;
  bool posted_ = false;
  bool transport_done_ = false;
  bool complete_ = false;
  // An abandoned (timed-out) operation keeps its staging buffer: MPI may still write it.
  std::vector<uint16_t>* staged_ = nullptr;
  float* out_ = nullptr;
  size_t n_ = 0, offset_ = 0;
};

MpiComm::MpiComm(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
  TRIDENT_CHECK(comm != MPI_COMM_NULL, "MpiComm '{}' from MPI_COMM_NULL", name_);
  TRIDENT_MPI(MPI_Comm_rank(comm_, &rank_));
  TRIDENT_MPI(MPI_Comm_size(comm_, &size_));
  // Only on communicators we own: MPI_COMM_WORLD's handler belongs to the application.
  if (comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF)
    TRIDENT_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
}

std::unique_ptr<MpiComm> MpiComm::duplicate(MPI_Comm parent, std::string name) {
  MPI_Comm comm = MPI_COMM_NULL;
  TRIDENT_MPI(MPI_Comm_dup(parent, &comm));
  return std::make_unique<MpiComm>(comm, std::move(name));
}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (bf16_op_ != MPI_OP_NULL) MPI_Op_free(&bf16_op_);
  if (comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF) MPI_Comm_free(&comm_);
}

void MpiComm::set_bf16_sums(bool on) {
  if (on && bf16_op_ == MPI_OP_NULL)
    TRIDENT_MPI(MPI_Op_create(bf16::sum_function(), /*commute=*/1, &bf16_op_));
  if (!on && bf16_op_ != MPI_OP_NULL) TRIDENT_MPI(MPI_Op_free(&bf16_op_));
}

std::vector<uint16_t>* MpiComm::take_staging(size_t n) {
  std::lock_guard<std::mutex> lock(staging_mutex_);
  std::vector<uint16_t>* buffer = nullptr;
  if (staging_free_.empty()) {
    staging_.push_back(std::make_unique<std::vector<uint16_t>>());
    buffer = staging_.back().get();
  } else {
    buffer = staging_free_.back();
    staging_free_.pop_back();
  }
  if (buffer->size() < n) buffer->resize(n);
  return buffer;
}

void MpiComm::give_staging(std::vector<uint16_t>* buffer) {
  std::lock_guard<std::mutex> lock(staging_mutex_);
  staging_free_.push_back(buffer);
}

void MpiComm::set_timeout(double seconds) {
  TRIDENT_CHECK(seconds > 0, "comm timeout must be positive, got {}", seconds);
  timeout_s_ = seconds;
}

void MpiComm::set_emulated_link(double gbps, double latency_us) {
  link_gbps_ = gbps > 0 ? gbps : 0;
  link_latency_us_ = std::max(0.0, latency_us);
}

void MpiComm::share_emulated_link(MpiComm& other) {
  link_gbps_ = other.link_gbps_;
  link_latency_us_ = other.link_latency_us_;
  link_clock_ = other.link_clock_;
}

std::vector<OpRecord> MpiComm::take_records() { return std::exchange(records_, {}); }

void MpiComm::note_completed(const OpRecord& record) {
  if (recording_) records_.push_back(record);
}

void MpiComm::post_due() {
  const auto now = CommClock::now();
  while (!unposted_.empty() && unposted_.front()->post_at() <= now) {
    MpiWork* work = unposted_.front();
    unposted_.pop_front();
    work->post();
  }
  // A duplex link's two wires keep their own queues: a send due now is not held behind a
  // receive still waiting for its wire (point-to-point operations pair by peer and tag, not by
  // posting order; each wire's operations still post in start order).
  if (!duplex_) return;
  for (auto it = unposted_.begin(); it != unposted_.end();) {
    if ((*it)->post_at() > now) {
      ++it;
      continue;
    }
    MpiWork* work = *it;
    it = unposted_.erase(it);
    work->post();
  }
}

void MpiComm::forget_unposted(const MpiWork* work) { std::erase(unposted_, work); }

Work MpiComm::make_work(const char* op, LinkOp link_op, size_t bytes, size_t requests, Post post,
                        CommClock::time_point start, Staged staged) {
  CommClock::time_point post_at = start, link_done = start;
  if (link_gbps_ > 0) {
    // The emulated link carries one operation at a time: this one starts when it is free.
    const double s = emulated_link_seconds(link_op, bytes, size_, link_gbps_, link_latency_us_);
    CommClock::time_point& clock =
        duplex_ && std::string_view(op) == "send" ? send_free_at_ : *link_clock_;
    post_at = std::max(start, clock);
    link_done =
        post_at + std::chrono::duration_cast<CommClock::duration>(std::chrono::duration<double>(s));
    clock = link_done;
  }
  auto work = std::make_unique<MpiWork>(this, op, bytes, requests, std::move(post), start, post_at,
                                        link_done);
  if (staged.buffer != nullptr)
    work->set_staged(staged.buffer, staged.out, staged.count, staged.offset);
  // Note [Paced link]: behind the queue, or posted now (which also posts any queued one due).
  unposted_.push_back(work.get());
  post_due();
  return Work(std::move(work));
}

Work MpiComm::start_all_reduce(void* data, size_t count, ElemType type) {
  check_summable(type, name_);
  const auto start = CommClock::now();
  if (bf16_op_ != MPI_OP_NULL && type == ElemType::kFloat32) {  // Note [bf16 gradient compression]
    std::vector<uint16_t>* staged = take_staging(count);
    bf16::from_float(static_cast<const float*>(data), staged->data(), count);
    const int n = mpi_count(count, "all_reduce");
    return make_work(
        "all_reduce", LinkOp::kAllReduce, count * 2, 1,
        [buf = staged->data(), n, op = bf16_op_, comm = comm_](MPI_Request* req) {
          TRIDENT_MPI(MPI_Iallreduce(MPI_IN_PLACE, buf, n, MPI_UINT16_T, op, comm, req));
        },
        start, {staged, static_cast<float*>(data), count});
  }
  const int n = mpi_count(count, "all_reduce");
  return make_work(
      "all_reduce", LinkOp::kAllReduce, count * elem_bytes(type), 1,
      [data, n, t = mpi_type(type), comm = comm_](MPI_Request* req) {
        TRIDENT_MPI(MPI_Iallreduce(MPI_IN_PLACE, data, n, t, MPI_SUM, comm, req));
      },
      start);
}

Work MpiComm::start_all_reduce_op(void* data, size_t count, ElemType type, ReduceOp op,
                                  std::string_view label) {
  if (op != ReduceOp::kBitOr)
    return Communicator::start_all_reduce_op(data, count, type, op, label);
  // Refused before anything starts, so no operation is left in flight.
  if (type == ElemType::kFloat32 || type == ElemType::kFloat64)
    internal_error(__FILE__, __LINE__,
                   fmt::format("all_reduce bitwise OR of {} on communicator '{}': integers only",
                               elem_type_name(type), name_));
  const auto start = CommClock::now();
  const int n = mpi_count(count, "all_reduce");
  return make_work(
      "all_reduce", LinkOp::kAllReduce, count * elem_bytes(type), 1,
      [data, n, t = mpi_type(type), comm = comm_](MPI_Request* req) {
        TRIDENT_MPI(MPI_Iallreduce(MPI_IN_PLACE, data, n, t, MPI_BOR, comm, req));
      },
      start);
}

// Note [Reduce-scatter as reduces]
// A reduce-scatter is n nonblocking reduces, one to each block's owner, in pieces of at most
// kReducePiece elements, started in the same order on every rank; one Work holds the requests.
// Each rank then sends (n-1)/n of its buffer and sums only its own block, as a ring does, with
// scratch small enough to reuse. Open MPI's MPI_Ireduce_scatter_block (libnbc) instead sends
// every full buffer to rank 0, sums there, and mallocs twice the buffer per call.
constexpr size_t kReducePiece = size_t(4) << 20;  // floats: 16 MiB (Note [Message size])
static_assert(kReducePiece <= size_t(INT_MAX), "a reduce piece's count is an MPI int");

Work MpiComm::start_reduce_scatter(const void* send, void* recv, size_t recv_count, ElemType type) {
  check_summable(type, name_);
  const auto start = CommClock::now();
  const size_t pieces = (recv_count + kReducePiece - 1) / kReducePiece;
  // The reduces of `data` (esize bytes an element, MPI type t, op): into recv, or with `in_place`
  // into this rank's own block of data (MPI_IN_PLACE at the root).
  auto reduces = [recv_count, size = size_, rank = rank_, comm = comm_](
                     const char* data, char* recv, size_t esize, MPI_Datatype t, MPI_Op op,
                     bool in_place) {
    return [=](MPI_Request* req) {
      for (int root = 0; root < size; ++root) {
        const char* block = data + size_t(root) * recv_count * esize;
        for (size_t done = 0; done < recv_count; done += kReducePiece) {
          const int n = static_cast<int>(std::min(recv_count - done, kReducePiece));
          const void* in = block + done * esize;
          void* out = nullptr;
          if (root == rank) {
            out = in_place ? const_cast<char*>(block) + done * esize : recv + done * esize;
            if (in_place) in = MPI_IN_PLACE;
          }
          TRIDENT_MPI(MPI_Ireduce(in, out, n, t, op, root, comm, req++));
        }
      }
    };
  };
  const size_t total = recv_count * size_t(size_);
  if (bf16_op_ != MPI_OP_NULL && type == ElemType::kFloat32) {  // Note [bf16 gradient compression]
    std::vector<uint16_t>* staged = take_staging(total);
    bf16::from_float(static_cast<const float*>(send), staged->data(), total);
    const auto* wire = reinterpret_cast<const char*>(staged->data());
    return make_work("reduce_scatter", LinkOp::kReduceScatter, total * 2, size_t(size_) * pieces,
                     reduces(wire, nullptr, 2, MPI_UINT16_T, bf16_op_, true), start,
                     {staged, static_cast<float*>(recv), recv_count, size_t(rank_) * recv_count});
  }
  return make_work("reduce_scatter", LinkOp::kReduceScatter, total * elem_bytes(type),
                   size_t(size_) * pieces,
                   reduces(static_cast<const char*>(send), static_cast<char*>(recv),
                           elem_bytes(type), mpi_type(type), MPI_SUM, false),
                   start);
}

Work MpiComm::start_all_gather(const void* send, void* recv, size_t send_count, ElemType type) {
  const auto start = CommClock::now();
  const int n = mpi_count(send_count, "all_gather");
  // send == this rank's block of recv means in place.
  const bool in_place =
      send == static_cast<const char*>(recv) + rank_ * send_count * elem_bytes(type);
  return make_work(
      "all_gather", LinkOp::kAllGather, send_count * size_ * elem_bytes(type), 1,
      [send = in_place ? MPI_IN_PLACE : send, recv, n, t = mpi_type(type), comm = comm_](
          MPI_Request* req) { TRIDENT_MPI(MPI_Iallgather(send, n, t, recv, n, t, comm, req)); },
      start);
}

Work MpiComm::start_broadcast(void* data, size_t count, ElemType type, int root) {
  TRIDENT_CHECK(root >= 0 && root < size_, "broadcast root {} on '{}' of size {}", root, name_,
                size_);
  const auto start = CommClock::now();
  const int n = mpi_count(count, "broadcast");
  return make_work(
      "broadcast", LinkOp::kBroadcast, count * elem_bytes(type), 1,
      [data, n, t = mpi_type(type), root, comm = comm_](MPI_Request* req) {
        TRIDENT_MPI(MPI_Ibcast(data, n, t, root, comm, req));
      },
      start);
}

Work MpiComm::start_send(const void* data, size_t count, ElemType type, int dest, int tag) {
  TRIDENT_CHECK(dest >= 0 && dest < size_, "send to rank {} on '{}' of size {}", dest, name_,
                size_);
  const auto start = CommClock::now();
  const int n = mpi_count(count, "send");
  return make_work(
      "send", LinkOp::kSendRecv, count * elem_bytes(type), 1,
      [data, n, t = mpi_type(type), dest, tag, comm = comm_](MPI_Request* req) {
        TRIDENT_MPI(MPI_Isend(data, n, t, dest, tag, comm, req));
      },
      start);
}

Work MpiComm::start_recv(void* data, size_t count, ElemType type, int src, int tag) {
  TRIDENT_CHECK(src >= 0 && src < size_, "recv from rank {} on '{}' of size {}", src, name_, size_);
  const auto start = CommClock::now();
  const int n = mpi_count(count, "recv");
  return make_work(
      "recv", LinkOp::kSendRecv, count * elem_bytes(type), 1,
      [data, n, t = mpi_type(type), src, tag, comm = comm_](MPI_Request* req) {
        TRIDENT_MPI(MPI_Irecv(data, n, t, src, tag, comm, req));
      },
      start);
}

Work MpiComm::start_all_to_all_v(const void* send, const size_t* send_counts, void* recv,
                                 const size_t* recv_counts, ElemType type) {
  const auto start = CommClock::now();
  // MPI's int counts and displacements, copied into the operation: it may be posted later
  // (Note [Paced link]) and MPI reads them until it completes. Checked before anything starts.
  const size_t n = size_t(size_);
  std::vector<int> ints(4 * n);  // send counts, send displacements, recv counts, recv displs
  size_t send_at = 0, recv_at = 0, sent = 0;
  auto to_int = [&](size_t v, const char* what, int peer) {
    TRIDENT_CHECK(v <= size_t(INT_MAX),
                  "all_to_all on '{}' (rank {}): {} for rank {} is {} elements; MPI counts are int",
                  name_, rank_, what, peer, v);
    return static_cast<int>(v);
  };
  for (int p = 0; p < size_; ++p) {
    ints[size_t(p)] = to_int(send_counts[p], "the send count", p);
    ints[n + size_t(p)] = to_int(send_at, "the send offset", p);
    ints[2 * n + size_t(p)] = to_int(recv_counts[p], "the receive count", p);
    ints[3 * n + size_t(p)] = to_int(recv_at, "the receive offset", p);
    send_at += send_counts[p];
    recv_at += recv_counts[p];
    if (p != rank_) sent += send_counts[p];
  }
  return make_work(
      "all_to_all", LinkOp::kAllToAll, sent * elem_bytes(type), 1,
      [send, recv, ints = std::move(ints), n, t = mpi_type(type), comm = comm_](MPI_Request* req) {
        const int* c = ints.data();
        TRIDENT_MPI(MPI_Ialltoallv(send, c, c + n, t, recv, c + 2 * n, c + 3 * n, t, comm, req));
      },
      start);
}

}  // namespace trident
