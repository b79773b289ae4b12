// NcclComm: the Communicator for device buffers, over NCCL (CUDA builds: library trident_cuda).
//
// Every operation is enqueued on the communicator's own stream (non-blocking, highest
// priority), so communication overlaps the compute stream's kernels; a Work is an event
// recorded after the operation, polled with cudaEventQuery. The host never blocks on the GPU:
// wait() polls with short sleeps and enforces comm.timeout_s, and a stuck or failed operation
// aborts the NCCL communicator and throws an Error naming the operation, the communicator and
// the rank (the app then MPI_Aborts every rank).
//
// For the grid's data-parallel group, on the rank's device (cudaSetDevice first):
//
//     NcclCommOptions o;
//     o.timeout_s = deck.comm.timeout_s;
//     o.grad_bf16 = deck.comm.grad_dtype == "bf16";
//     NcclComm dp_nccl(grid.dp().raw(), "dp-nccl", compute_stream, o);   // collective over dp
//     GradReducer reducer(dp_nccl, device_grads, params, options);
//
// The compute thread then calls reducer.grad_ready(i) right after enqueueing the kernels that
// finish parameter i's gradient on `compute_stream`, and reducer.finish() before enqueueing
// the optimizer on that stream (Note [Gradient-ready events] in trident/comm.h).
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "trident/comm.h"

namespace trident {

struct NcclCommOptions {
  double timeout_s = kDefaultCommTimeoutSeconds;  // comm.timeout_s
  // comm.grad_dtype = bf16: every float32 all_reduce and reduce_scatter (ZeRO's) of this
  // communicator travels as bf16 (cast on the communication stream, reduced in bf16, cast back
  // to fp32). It applies to all float32 sums, so give the GradReducer its own NcclComm when it
  // is on.
  bool grad_bf16 = false;
  // Enqueue on the compute stream instead of an own stream: tensor-parallel collectives, whose
  // results the very next kernel needs (docs/design.md, "The communication thread's
  // contract"). Ordering with compute is then the stream's own; a Work still polls an
  // event after the operation, so a stuck collective ends at the timeout instead of hanging.
  bool on_compute_stream = false;
  // Profiling asked for (log.trace, or an NVTX tool attached): each operation gets an NVTX
  // range named after it and two timed events (Note [Device time of an operation]). Without
  // it an operation formats no string and takes its completion event from a pool.
  bool profile = false;
};

class NcclComm final : public Communicator {
 public:
  // Collective over `group` (not owned; only used here): its rank 0 makes the NCCL id and
  // broadcasts it with MPI_Bcast. The CUDA device must already be current (cudaSetDevice);
  // `compute_stream` is the stream whose work the operations are ordered with
  // (Note [Gradient-ready events] in trident/comm.h).
  NcclComm(MPI_Comm group, std::string name, cudaStream_t compute_stream,
           NcclCommOptions options = {});
  // Without MPI: every one of `size` ranks passes the same id, from ncclGetUniqueId on one
  // of them (tests; other launchers).
  NcclComm(const ncclUniqueId& id, int rank, int size, std::string name,
           cudaStream_t compute_stream, NcclCommOptions options = {});
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  // Finalizes the NCCL communicator (or aborts it if operations are stuck or it failed).
  ~NcclComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  cudaStream_t stream() const { return stream_; }
  cudaStream_t compute_stream() const { return compute_stream_; }
  int device() const { return device_; }

  void set_timeout(double seconds);
  double timeout() const { return options_.timeout_s; }
  bool grad_bf16() const { return options_.grad_bf16; }

  // new_mark(true) is null unless options.profile (Note [Device time of an operation]).
  std::shared_ptr<ComputeMark> new_mark(bool timed) override;
  void record_mark(ComputeMark& mark) override;
  void order_after(const ComputeMark* mark) override;
  void compute_waits_for_comm() override;
  bool device_span(const Work& w, const ComputeMark& origin, double* start_ms,
                   double* end_ms) override;
  bool mark_elapsed_ms(const ComputeMark& origin, const ComputeMark& later, double* ms) override;

  // Used by this communicator's Work objects.
  void bind_device() const;
  // Throws (after aborting) if NCCL reported an asynchronous error; `what` names the operation.
  void check_async_error(const char* what);
  // Aborts the NCCL communicator (idempotent); every later operation throws.
  void abort() noexcept;
  bool aborted() const { return aborted_; }
  // Untimed events for operations' completion, reused (Work objects give theirs back).
  cudaEvent_t take_event();
  void give_event(cudaEvent_t event) noexcept;

  // One NCCL group of a send and a receive per peer with a nonzero count (self included).
  Work start_all_to_all_v(const void* send, const size_t* send_counts, void* recv,
                          const size_t* recv_counts, ElemType type) override;

 protected:
  Work start_all_reduce(void* data, size_t count, ElemType type) override;
  Work start_all_reduce_op(void* data, size_t count, ElemType type, ReduceOp op,
                           std::string_view label) override;
  Work start_reduce_scatter(const void* send, void* recv, size_t recv_count,
                            ElemType type) override;
  Work start_all_gather(const void* send, void* recv, size_t send_count, ElemType type) override;
  Work start_broadcast(void* data, size_t count, ElemType type, int root) override;
  // NCCL matches point-to-point transfers by their order between two ranks, not by tag, so
  // only tag 0 is accepted.
  Work start_send(const void* data, size_t count, ElemType type, int dest, int tag) override;
  Work start_recv(void* data, size_t count, ElemType type, int src, int tag) override;

 private:
  void init(const ncclUniqueId& id);
  void wait_while_in_progress(const char* what);
  template <typename Enqueue>
  Work launch(const char* op, size_t bytes, std::string_view label, Enqueue&& enqueue);
  void* staging(size_t bytes);

  std::string name_;
  int rank_ = 0, size_ = 1;
  int device_ = 0;
  NcclCommOptions options_;
  cudaStream_t compute_stream_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t comm_done_ = nullptr;  // compute_waits_for_comm
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  void* staging_ = nullptr;  // bf16 copies of float all-reduces; grow-only
  size_t staging_bytes_ = 0;
  std::mutex events_mutex_;  // Works may end on another thread than the one starting them
  std::vector<cudaEvent_t> free_events_;
};

}  // namespace trident
