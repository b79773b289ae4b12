// NcclComm: collectives on device buffers over NCCL, on a dedicated communication stream.
//
// Note [NCCL without hangs]
// The host never waits on NCCL in a way that cannot time out: a collective whose peer never
// arrives spins on the GPU forever, and a stream synchronisation would block the host with it.
// So the NCCL communicator is non-blocking (config.blocking = 0; a call that returns
// ncclInProgress is polled until its state settles), completion is a cudaEventQuery, and each
// poll also reads ncclCommGetAsyncError and the elapsed time: an error or the timeout ends in
// ncclCommAbort, which stops the kernels, and an Error naming operation, communicator and rank.
//
// An OpRecord's start is when the host enqueued the operation, and its end is when test()
// first saw its event complete (up to one poll interval late). The device's own times come
// from two timed events around each operation (Note [Device time of an operation] in
// trident/comm.h); the GradReducer reports those.
#include "trident/nccl_comm.h"

#include <fmt/format.h>
#include <nvtx3/nvToolsExt.h>

#include <optional>
#include <thread>
#include <utility>

#include "cuda_check.h"
#include "elementwise.h"
#include "trident/check.h"

namespace trident {

namespace {

ncclDataType_t nccl_type(ElemType type) {
  switch (type) {
    case ElemType::kFloat32: return ncclFloat32;
    case ElemType::kFloat64: return ncclFloat64;
    case ElemType::kInt32: return ncclInt32;
    case ElemType::kInt64: return ncclInt64;
    case ElemType::kUint8: return ncclUint8;
    case ElemType::kBfloat16: return ncclBfloat16;
  }
  return ncclFloat32;
}

double seconds_since(CommClock::time_point start) {
  return std::chrono::duration<double>(CommClock::now() - start).count();
}

void pause_for(int idle_polls) {
  const auto pause = progress_backoff(idle_polls);
  if (pause.count() == 0) std::this_thread::yield();
  else std::this_thread::sleep_for(pause);
}

// An NVTX range for the enqueue of one operation (popped even if the enqueue throws).
class NvtxRange {
 public:
  explicit NvtxRange(const std::string& name) { nvtxRangePushA(name.c_str()); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

// A point in the compute stream (Note [Gradient-ready events]).
class EventMark final : public ComputeMark {
 public:
  cudaEvent_t event = nullptr;
  ~EventMark() override {
    if (event) cudaEventDestroy(event);  // fine while pending: freed once it completes
  }
};

class NcclWork final : public Work::Impl {
 public:
  // `began`: null unless profiling; `done`: from the communicator's pool unless profiling.
  NcclWork(NcclComm* comm, const char* op, size_t bytes, cudaEvent_t began, cudaEvent_t done,
           CommClock::time_point start)
      : comm_(comm), began_(began), done_(done) {
    record_.op = op;
    record_.bytes = bytes;
    record_.start = start;
  }
  ~NcclWork() override {
    if (began_) {
      cudaEventDestroy(began_);
      cudaEventDestroy(done_);
    } else {
      comm_->give_event(done_);
    }
  }
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;

  bool test() override {
    if (complete_) return true;
    if (comm_->aborted())
      fail("was abandoned: the NCCL communicator was aborted after an earlier failure");
    comm_->bind_device();
    const cudaError_t q = cudaEventQuery(done_);
    if (q == cudaSuccess) {
      complete_ = true;
      record_.end = CommClock::now();  // up to one poll late: Note [NCCL without hangs]
      return true;
    }
    if (q != cudaErrorNotReady) {
      comm_->abort();
      fail(
          fmt::format("failed on the device: {} ({})", cudaGetErrorName(q), cudaGetErrorString(q)));
    }
    comm_->check_async_error(record_.op);
    if (seconds_since(record_.start) > comm_->timeout()) {
      comm_->abort();
      fail(fmt::format("did not complete within the timeout of {} s (comm.timeout_s); the NCCL "
                       "communicator was aborted",
                       comm_->timeout()));
    }
    return false;
  }

  void wait() override {
    for (int idle = 0; !test(); ++idle) pause_for(idle);
  }

  const OpRecord& record() const override { return record_; }
  // Note [Device time of an operation]: both events are on the communication stream, timed
  // (profiling only; otherwise began() is null).
  cudaEvent_t began() const { return began_; }
  cudaEvent_t done() const { return done_; }
  bool complete() const { return complete_; }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    internal_error(
        __FILE__, __LINE__,
        fmt::format("{} of {} bytes on NCCL communicator '{}' (rank {} of {}) {}", record_.op,
                    record_.bytes, comm_->name(), comm_->rank(), comm_->size(), what));
  }

  NcclComm* comm_;
  cudaEvent_t began_, done_;
  OpRecord record_;
  bool complete_ = false;
};

}  // namespace

NcclComm::NcclComm(MPI_Comm group, std::string name, cudaStream_t compute_stream,
                   NcclCommOptions options)
    : name_(std::move(name)), options_(options), compute_stream_(compute_stream) {
  TRIDENT_CHECK(group != MPI_COMM_NULL, "NcclComm '{}' from MPI_COMM_NULL", name_);
  TRIDENT_MPI(MPI_Comm_rank(group, &rank_));
  TRIDENT_MPI(MPI_Comm_size(group, &size_));
  ncclUniqueId id{};
  if (rank_ == 0) TRIDENT_NCCL(ncclGetUniqueId(&id));
  TRIDENT_MPI(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, group));
  init(id);
}

NcclComm::NcclComm(const ncclUniqueId& id, int rank, int size, std::string name,
                   cudaStream_t compute_stream, NcclCommOptions options)
    : name_(std::move(name)), rank_(rank), size_(size), options_(options),
      compute_stream_(compute_stream) {
  TRIDENT_CHECK(size >= 1 && rank >= 0 && rank < size, "NcclComm '{}': rank {} of {}", name_, rank,
                size);
  init(id);
}

void NcclComm::init(const ncclUniqueId& id) {
  TRIDENT_CHECK(options_.timeout_s > 0, "NcclComm '{}': timeout must be positive, got {}", name_,
                options_.timeout_s);
  TRIDENT_CUDA(cudaGetDevice(&device_));
  int least = 0, greatest = 0;
  TRIDENT_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  // Highest priority: a bucket's kernels get SMs ahead of backward's, so they finish early.
  if (options_.on_compute_stream) stream_ = compute_stream_;
  else TRIDENT_CUDA(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
  TRIDENT_CUDA(cudaEventCreateWithFlags(&comm_done_, cudaEventDisableTiming));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // Note [NCCL without hangs]
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  config.commName = name_.c_str();
#endif
  TRIDENT_NCCL(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config));
  wait_while_in_progress("ncclCommInitRankConfig");
}

NcclComm::~NcclComm() {
  cudaSetDevice(device_);
  if (comm_ && !aborted_) {
    // Finalize only if nothing is stuck on our stream; otherwise abort, which cannot hang.
    bool clean = cudaStreamQuery(stream_) == cudaSuccess;
    if (clean) {
      const ncclResult_t rc = ncclCommFinalize(comm_);
      clean = rc == ncclSuccess || rc == ncclInProgress;
    }
    const auto start = CommClock::now();
    ncclResult_t state = ncclInProgress;
    for (int idle = 0; clean; ++idle) {
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
      if (state != ncclInProgress || seconds_since(start) > options_.timeout_s) break;
      pause_for(idle);
    }
    if (clean && state == ncclSuccess) ncclCommDestroy(comm_);
    else ncclCommAbort(comm_);
  }
  if (staging_) cudaFreeAsync(staging_, stream_);
  if (comm_done_) cudaEventDestroy(comm_done_);
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  if (stream_ && !options_.on_compute_stream) cudaStreamDestroy(stream_);
}

void NcclComm::set_timeout(double seconds) {
  TRIDENT_CHECK(seconds > 0, "comm timeout must be positive, got {}", seconds);
  options_.timeout_s = seconds;
}

// cudaSetDevice is per host thread, and the GradReducer's thread never called it: every entry
// point that creates events, launches kernels or calls NCCL binds this communicator's device.
void NcclComm::bind_device() const { TRIDENT_CUDA(cudaSetDevice(device_)); }

void NcclComm::abort() noexcept {
  if (aborted_) return;
  aborted_ = true;
  if (comm_) ncclCommAbort(comm_);
  comm_ = nullptr;
}

void NcclComm::check_async_error(const char* what) {
  if (aborted_ || !comm_) return;
  ncclResult_t state = ncclSuccess;
  const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
  if (rc == ncclSuccess && (state == ncclSuccess || state == ncclInProgress)) return;
  const ncclResult_t bad = rc != ncclSuccess ? rc : state;
  const std::string detail = ncclGetLastError(comm_);
  abort();
  internal_error(__FILE__, __LINE__,
                 fmt::format("{} on NCCL communicator '{}' (rank {} of {}) failed: {} ({}); the "
                             "communicator was aborted",
                             what, name_, rank_, size_, ncclGetErrorString(bad), detail));
}

// Note [NCCL without hangs]: a non-blocking call may return ncclInProgress; the operation is
// enqueued (or the communicator ready) only once the state leaves ncclInProgress.
void NcclComm::wait_while_in_progress(const char* what) {
  const auto start = CommClock::now();
  for (int idle = 0;; ++idle) {
    ncclResult_t state = ncclSuccess;
    TRIDENT_NCCL(ncclCommGetAsyncError(comm_, &state));
    if (state != ncclInProgress) break;
    if (seconds_since(start) > options_.timeout_s) {
      abort();
      internal_error(__FILE__, __LINE__,
                     fmt::format("{} on NCCL communicator '{}' (rank {} of {}) did not finish "
                                 "within the timeout of {} s (comm.timeout_s); the communicator "
                                 "was aborted",
                                 what, name_, rank_, size_, options_.timeout_s));
    }
    pause_for(idle);
  }
  check_async_error(what);
}

// One bf16 buffer serves every operation: they all run in order on stream_, so an operation's
// cast into it starts only after the previous one's cast back finished. Growing is
// stream-ordered too (cudaFreeAsync/cudaMallocAsync), so the host never synchronises.
void* NcclComm::staging(size_t bytes) {
  if (bytes > staging_bytes_) {
    if (staging_) TRIDENT_CUDA(cudaFreeAsync(staging_, stream_));
    staging_ = nullptr;
    staging_bytes_ = 0;
    TRIDENT_CUDA(cudaMallocAsync(&staging_, bytes, stream_));
    staging_bytes_ = bytes;
  }
  return staging_;
}

template <typename Enqueue>
Work NcclComm::launch(const char* op, size_t bytes, std::string_view label, Enqueue&& enqueue) {
  if (aborted_)
    internal_error(__FILE__, __LINE__,
                   fmt::format("{} on NCCL communicator '{}' (rank {} of {}) after it was aborted",
                               op, name_, rank_, size_));
  bind_device();
  const auto start = CommClock::now();
  // Named and timed only when profiling (NcclCommOptions::profile): a step formats no string.
  std::optional<NvtxRange> range;
  if (options_.profile) {
    const double mb = static_cast<double>(bytes) / 1e6;
    range.emplace(label.empty() ? fmt::format("{} ({:.1f} MB)", op, mb)
                                : fmt::format("{} {} ({:.1f} MB)", op, label, mb));
  }
  cudaEvent_t began = nullptr, done = nullptr;  // timed: Note [Device time of an operation]
  try {
    if (options_.profile) {
      TRIDENT_CUDA(cudaEventCreate(&began));
      TRIDENT_CUDA(cudaEventRecord(began, stream_));
    }
    enqueue();
    wait_while_in_progress(op);
    if (options_.profile) TRIDENT_CUDA(cudaEventCreate(&done));
    else done = take_event();
    TRIDENT_CUDA(cudaEventRecord(done, stream_));
  } catch (const Error& e) {
    // A half-enqueued operation leaves the peers waiting: abort, so nothing hangs here.
    if (began) cudaEventDestroy(began);
    if (done && began) cudaEventDestroy(done);
    else if (done) give_event(done);
    abort();
    throw Error(fmt::format("{} on NCCL communicator '{}' (rank {} of {}): {}", op, name_, rank_,
                            size_, e.what()),
                e.code());
  }
  return Work(std::make_unique<NcclWork>(this, op, bytes, began, done, start));
}

cudaEvent_t NcclComm::take_event() {
  {
    std::lock_guard lock(events_mutex_);
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  TRIDENT_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

// Recording a pooled event again is safe even if its operation is still pending: a later
// query sees the new record, and the Work that polled the old one is gone.
void NcclComm::give_event(cudaEvent_t event) noexcept {
  std::lock_guard lock(events_mutex_);
  free_events_.push_back(event);
}

Work NcclComm::start_all_reduce(void* data, size_t count, ElemType type) {
  return start_all_reduce_op(data, count, type, ReduceOp::kSum, {});
}

Work NcclComm::start_all_reduce_op(void* data, size_t count, ElemType type, ReduceOp op,
                                   std::string_view label) {
  // Refused before anything is enqueued: NCCL has no bitwise OR (ReduceOp, trident/comm.h).
  if (op == ReduceOp::kBitOr)
    internal_error(
        __FILE__, __LINE__,
        fmt::format("all_reduce bitwise OR on NCCL communicator '{}': not supported", name_));
  const size_t bytes = count * elem_bytes(type);
  if (options_.grad_bf16 && type == ElemType::kFloat32) {
    auto* x = static_cast<float*>(data);
    // Sum in bf16, widened back into x. (The label is formatted only for a profiler.)
    const std::string bf16_label =
        options_.profile ? fmt::format("{}{}bf16", label, label.empty() ? "" : " ") : "";
    return launch("all_reduce", bytes, bf16_label, [&] {
      auto* wire = static_cast<cuda::bf16*>(staging(count * sizeof(cuda::bf16)));
      cuda::cast_f32_to_bf16_cuda(wire, x, count, stream_);
      TRIDENT_NCCL(ncclAllReduce(wire, wire, count, ncclBfloat16, ncclSum, comm_, stream_));
      // A non-blocking communicator may return ncclInProgress before the all-reduce is on
      // stream_ (Note [NCCL without hangs]): the cast back must be enqueued after it is.
      wait_while_in_progress("all_reduce");
      cuda::cast_bf16_to_f32_cuda(x, wire, 1.0f, count, stream_);
    });
  }
  return launch("all_reduce", bytes, label, [&] {
    TRIDENT_NCCL(ncclAllReduce(data, data, count, nccl_type(type), ncclSum, comm_, stream_));
  });
}

Work NcclComm::start_reduce_scatter(const void* send, void* recv, size_t recv_count,
                                    ElemType type) {
  if (options_.grad_bf16 && type == ElemType::kFloat32) {  // ZeRO's, as the all-reduce above
    const size_t total = recv_count * size_t(size_);
    return launch("reduce_scatter", total * sizeof(cuda::bf16), {}, [&] {
      auto* wire = static_cast<cuda::bf16*>(staging(total * sizeof(cuda::bf16)));
      cuda::cast_f32_to_bf16_cuda(wire, static_cast<const float*>(send), total, stream_);
      cuda::bf16* own = wire + size_t(rank_) * recv_count;  // NCCL's in-place reduce-scatter
      TRIDENT_NCCL(ncclReduceScatter(wire, own, recv_count, ncclBfloat16, ncclSum, comm_, stream_));
      wait_while_in_progress("reduce_scatter");
      cuda::cast_bf16_to_f32_cuda(static_cast<float*>(recv), own, 1.0f, recv_count, stream_);
    });
  }
  return launch("reduce_scatter", recv_count * size_ * elem_bytes(type), {}, [&] {
    TRIDENT_NCCL(
        ncclReduceScatter(send, recv, recv_count, nccl_type(type), ncclSum, comm_, stream_));
  });
}

// send == this rank's block of recv is NCCL's in-place all-gather, as MpiComm's.
Work NcclComm::start_all_gather(const void* send, void* recv, size_t send_count, ElemType type) {
  return launch("all_gather", send_count * size_ * elem_bytes(type), {}, [&] {
    TRIDENT_NCCL(ncclAllGather(send, recv, send_count, nccl_type(type), comm_, stream_));
  });
}

Work NcclComm::start_broadcast(void* data, size_t count, ElemType type, int root) {
  TRIDENT_CHECK(root >= 0 && root < size_, "broadcast root {} on '{}' of size {}", root, name_,
                size_);
  return launch("broadcast", count * elem_bytes(type), {}, [&] {
    TRIDENT_NCCL(ncclBroadcast(data, data, count, nccl_type(type), root, comm_, stream_));
  });
}

Work NcclComm::start_send(const void* data, size_t count, ElemType type, int dest, int tag) {
  TRIDENT_CHECK(dest >= 0 && dest < size_, "send to rank {} on '{}' of size {}", dest, name_,
                size_);
  TRIDENT_CHECK(tag == 0,
                "send with tag {} on NCCL communicator '{}': NCCL pairs transfers by "
                "order, not tag",
                tag, name_);
  return launch("send", count * elem_bytes(type), {}, [&] {
    TRIDENT_NCCL(ncclSend(data, count, nccl_type(type), dest, comm_, stream_));
  });
}

Work NcclComm::start_recv(void* data, size_t count, ElemType type, int src, int tag) {
  TRIDENT_CHECK(src >= 0 && src < size_, "recv from rank {} on '{}' of size {}", src, name_, size_);
  TRIDENT_CHECK(tag == 0,
                "recv with tag {} on NCCL communicator '{}': NCCL pairs transfers by "
                "order, not tag",
                tag, name_);
  return launch("recv", count * elem_bytes(type), {},
                [&] { TRIDENT_NCCL(ncclRecv(data, count, nccl_type(type), src, comm_, stream_)); });
}

// Peers with nothing to exchange get no call; record bytes are those sent to other ranks, as
// MpiComm's. A failing call inside the group still ends the group, so this thread's later
// NCCL calls are not swallowed into it.
Work NcclComm::start_all_to_all_v(const void* send, const size_t* send_counts, void* recv,
                                  const size_t* recv_counts, ElemType type) {
  const size_t esize = elem_bytes(type);
  size_t sent = 0;
  for (int p = 0; p < size_; ++p)
    if (p != rank_) sent += send_counts[p] * esize;
  return launch("all_to_all", sent, {}, [&] {
    const auto* s = static_cast<const char*>(send);
    auto* r = static_cast<char*>(recv);
    const ncclDataType_t t = nccl_type(type);
    TRIDENT_NCCL(ncclGroupStart());
    try {
      for (int p = 0; p < size_; ++p) {
        if (send_counts[p] > 0) TRIDENT_NCCL(ncclSend(s, send_counts[p], t, p, comm_, stream_));
        if (recv_counts[p] > 0) TRIDENT_NCCL(ncclRecv(r, recv_counts[p], t, p, comm_, stream_));
        s += send_counts[p] * esize;
        r += recv_counts[p] * esize;
      }
    } catch (...) {
      ncclGroupEnd();
      throw;
    }
    TRIDENT_NCCL(ncclGroupEnd());
  });
}

// ---- ordering with the compute stream: Note [Gradient-ready events] ----

// Called on the compute thread (Note [Marks made once] in src/comm/grad_reducer.cpp).
std::shared_ptr<ComputeMark> NcclComm::new_mark(bool timed) {
  if (timed && !options_.profile) return nullptr;  // Note [Device time of an operation]
  bind_device();
  auto mark = std::make_shared<EventMark>();
  TRIDENT_CUDA(cudaEventCreateWithFlags(&mark->event, timed ? 0u : cudaEventDisableTiming));
  return mark;
}

// Called on the compute thread: touches only compute_stream_ and the mark's event.
void NcclComm::record_mark(ComputeMark& mark) {
  auto* event_mark = dynamic_cast<EventMark*>(&mark);
  TRIDENT_CHECK(event_mark != nullptr,
                "NcclComm '{}': record_mark with a mark made by another kind of communicator",
                name_);
  bind_device();
  TRIDENT_CUDA(cudaEventRecord(event_mark->event, compute_stream_));
}

void NcclComm::order_after(const ComputeMark* mark) {
  if (!mark) return;
  const auto* event_mark = dynamic_cast<const EventMark*>(mark);
  TRIDENT_CHECK(event_mark != nullptr,
                "NcclComm '{}': order_after with a mark made by another "
                "kind of communicator",
                name_);
  bind_device();
  TRIDENT_CUDA(cudaStreamWaitEvent(stream_, event_mark->event, 0));
}

// ---- device time: Note [Device time of an operation] ----

// cudaEventElapsedTime of two recorded, completed, timed events; false if either is not yet
// complete (then the caller keeps host times).
static bool elapsed_ms(cudaEvent_t from, cudaEvent_t to, double* ms) {
  float f = 0;
  const cudaError_t rc = cudaEventElapsedTime(&f, from, to);
  if (rc == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  TRIDENT_CUDA(rc);
  *ms = f;
  return true;
}

bool NcclComm::device_span(const Work& w, const ComputeMark& origin, double* start_ms,
                           double* end_ms) {
  const auto* work = dynamic_cast<const NcclWork*>(w.impl());
  const auto* mark = dynamic_cast<const EventMark*>(&origin);
  if (!work || !mark || !work->began() || !work->complete()) return false;
  bind_device();
  return elapsed_ms(mark->event, work->began(), start_ms) &&
         elapsed_ms(mark->event, work->done(), end_ms);
}

bool NcclComm::mark_elapsed_ms(const ComputeMark& origin, const ComputeMark& later, double* ms) {
  const auto* from = dynamic_cast<const EventMark*>(&origin);
  const auto* to = dynamic_cast<const EventMark*>(&later);
  if (!from || !to) return false;
  bind_device();
  TRIDENT_CUDA(cudaEventSynchronize(to->event));  // the end of backward: reached by now, or soon
  return elapsed_ms(from->event, to->event, ms);
}

void NcclComm::compute_waits_for_comm() {
  bind_device();
  TRIDENT_CUDA(cudaEventRecord(comm_done_, stream_));
  TRIDENT_CUDA(cudaStreamWaitEvent(compute_stream_, comm_done_, 0));
}

}  // namespace trident
