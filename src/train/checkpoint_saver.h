// Saving checkpoints during a run: now (checkpoint.async false) or from a snapshot, written in
// the background by a writer thread (checkpoint.async true).
//
// Note [Asynchronous checkpoints]
// A save copies exactly what a synchronous save writes (Trainer::snapshot_plan: parameters, m,
// v; the meta holds step, run id and deck, whence the data cursor and RNG) into host buffers
// allocated once, and returns: training changes the live buffers, never the copy. The
// writer then runs save_checkpoint on it, with read-back, so a damaged shard never becomes
// `latest`. One save at a time: the next save first waits for the write in flight, so the
// buffers are reused only once their write is durable (Megatron-LM PR #2288's corruption came
// from reusing them earlier). HDF5 then runs on the writer only; the compute thread uses none.
//
// Note [Background commit]
// The writer completes the commit protocol (gathers, agreements, the closing barrier) on a
// communicator of its own, a duplicate of the world made at start-up: the step's collectives
// keep their order on the compute and communication threads, and `latest` moves as soon as
// every shard is durable, not at some later step. The outcome is taken at a step boundary only
// when no rank's writer is still writing (a sum in the stop-signal all-reduce), so every rank
// reports it at the same step and on_error acts on every rank alike.
//
// Note [Deferred host snapshot]
// Forward and backward only read the parameters, m and v; the optimizer's update is the first
// thing of a step that writes them. So on a host the writer thread makes the snapshot's copy
// while the next step's forward and backward run, and the update first waits until it is done
// (Trainer::set_update_gate; StepStats::snapshot_wait_ms, counted in ckpt_block_ms). The save
// itself stops the step only to hand the job over. On a device the copy stream does the same
// (Note [Snapshots to the host]).
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "trident/check.h"
#include "trident/checkpoint.h"
#include "trident/deck.h"
#include "trident/train.h"

namespace trident {

class Backend;

// A save that ended: committed (`path`) or failed (`error`, every rank alike).
struct SaveOutcome {
  int64_t step = 0;
  std::string why;    // "every", "end", "stop signal", ...
  std::string path;   // the committed checkpoint; empty on failure
  std::string error;  // what failed; empty on success
  ExitCode code = ExitCode::kBadInput;
  double write_ms = 0;  // the write's own time (in the background when async)
  bool ok() const { return error.empty(); }
};

class CheckpointSaver {
 public:
  // Collective over MPI_COMM_WORLD when async (the writer's communicator); allocates the
  // snapshot buffers (Trainer::snapshot_floats) with every page touched.
  CheckpointSaver(Trainer& trainer, Backend& backend, const CheckpointConfig& config,
                  double timeout_s, std::string run_id);
  ~CheckpointSaver();  // waits for the write in flight
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  bool async() const { return async_; }
  // Collective: saves after `steps_done` steps. Synchronous: writes and commits now (a storage
  // fault becomes a failed outcome; any other error is thrown). Async: waits for the write in
  // flight, snapshots, hands the write to the writer. Returns the milliseconds it stopped the
  // caller.
  // `last`: the run stops after it (its end, a signal): the write is not paced.
  double save(int steps_done, const char* why, bool last = false);
  // This rank's writer has a write that has not ended.
  bool writing() const { return writing_.load(); }
  // Waits for the write in flight, if any. Returns the milliseconds waited.
  double wait();
  // The saves that ended since the last call, oldest first.
  std::vector<SaveOutcome> take_finished();
  // Bytes of host memory the snapshot buffers hold (0 when synchronous).
  size_t snapshot_bytes() const { return snapshot_floats_ * sizeof(float); }

 private:
  struct Job {
    CheckpointMeta meta;
    std::vector<ShardTensor> tensors;
    std::vector<Trainer::HostCopy> copies;  // the writer's to make (host backends); else made
    std::string why;
    bool paced = true;  // Note [Paced background writes]; a stop's save is not
  };
  void writer_loop();

  Trainer& trainer_;
  Backend& backend_;
  CheckpointConfig config_;
  double timeout_s_;
  std::string run_id_;
  bool async_ = false;
  size_t snapshot_floats_ = 0;
  float* snapshot_ = nullptr;
  MPI_Comm comm_ = MPI_COMM_NULL;  // the writer's (Note [Background commit])

  std::mutex mu_;
  std::condition_variable cv_;
  bool has_job_ = false, quit_ = false;  // under mu_
  Job job_;                              // under mu_
  std::vector<SaveOutcome> finished_;    // under mu_
  std::atomic<bool> writing_{false};
  std::atomic<bool> hurry_{false};  // someone waits for the write: no more pacing
  bool copied_ = true;              // under mu_: the job's copies are made
  double write_share_ = 1;
  std::thread writer_;
};

}  // namespace trident
