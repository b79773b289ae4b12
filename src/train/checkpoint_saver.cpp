// CheckpointSaver: synchronous saves, and the snapshot and writer thread of asynchronous ones
// (Note [Asynchronous checkpoints], Note [Background commit]).
#include "train/checkpoint_saver.h"

#include <chrono>
#include <cstdlib>
#include <exception>

#include "trident/backend.h"

namespace trident {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

CheckpointSaver::CheckpointSaver(Trainer& trainer, Backend& backend, const CheckpointConfig& config,
                                 double timeout_s, std::string run_id)
    : trainer_(trainer), backend_(backend), config_(config), timeout_s_(timeout_s),
      run_id_(std::move(run_id)), async_(config.async && !config.dir.empty()) {
  if (!async_) return;
  write_share_ = config.write_share > 0 ? config.write_share : backend.is_device() ? 1.0 : 0.1;
  snapshot_floats_ = trainer_.snapshot_floats();
  snapshot_ = static_cast<float*>(backend_.allocate_host_snapshot(snapshot_bytes()));
  if (!backend_.is_device())  // Note [Deferred host snapshot]
    trainer_.set_update_gate([this] {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return copied_; });
    });
  TRIDENT_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
  MPI_Comm_set_name(comm_, "checkpoint writer");
  writer_ = std::thread([this] { writer_loop(); });
}

CheckpointSaver::~CheckpointSaver() {
  if (!async_) return;
  trainer_.set_update_gate(nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  writer_.join();  // after the write in flight: its collectives end with the other ranks'
  MPI_Comm_free(&comm_);
  backend_.release_host_snapshot(snapshot_);
}

double CheckpointSaver::save(int steps_done, const char* why, bool last) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!async_) {
    SaveOutcome out;
    out.step = steps_done;
    out.why = why;
    try {
      out.path = trainer_.save(config_.dir, steps_done, run_id_, config_.keep);
    } catch (const Error& e) {
      if (e.code() != ExitCode::kBadInput) throw;  // a timeout, a bug: not a storage fault
      out.error = e.what();
      out.code = e.code();
    }
    out.write_ms = ms_since(t0);
    std::lock_guard<std::mutex> lock(mu_);
    finished_.push_back(std::move(out));
    return ms_since(t0);
  }
  wait();  // one save at a time: the buffers are free once their write is durable
  Job job;
  job.meta = trainer_.checkpoint_meta(steps_done, run_id_);
  job.why = why;
  job.paced = !last;
  job.tensors = trainer_.snapshot_plan(snapshot_, &job.copies);
  if (backend_.is_device()) {  // now, on the copy stream, ordered with the compute stream
    for (const Trainer::HostCopy& c : job.copies)
      backend_.start_host_snapshot(c.dst, c.src, c.count * sizeof(float));
    job.copies.clear();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    copied_ = job.copies.empty();
    job_ = std::move(job);
    has_job_ = true;
    hurry_.store(false);
    writing_.store(true);
  }
  cv_.notify_all();
  return ms_since(t0);
}

double CheckpointSaver::wait() {
  const auto t0 = std::chrono::steady_clock::now();
  hurry_.store(true);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !writing_.load(); });
  return ms_since(t0);
}

std::vector<SaveOutcome> CheckpointSaver::take_finished() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SaveOutcome> out;
  out.swap(finished_);
  return out;
}

void CheckpointSaver::writer_loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return has_job_ || quit_; });
      if (!has_job_) return;  // quit with nothing to write
      job = std::move(job_);
      has_job_ = false;
    }
    const auto t0 = std::chrono::steady_clock::now();
    // Note [Deferred host snapshot]: first the copies, unpaced: the next update waits for them.
    // Fault injection for tests/cli/test_async_checkpoint.sh: milliseconds before they start.
    if (const char* ms = std::getenv("TRIDENT_FAULT_SNAPSHOT_DELAY_MS"); ms && !job.copies.empty())
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atoll(ms)));
    for (const Trainer::HostCopy& c : job.copies)
      backend_.start_host_snapshot(c.dst, c.src, c.count * sizeof(float));
    {
      std::lock_guard<std::mutex> lock(mu_);
      copied_ = true;
    }
    cv_.notify_all();
    SaveOutcome out;
    out.step = job.meta.step;
    out.why = job.why;
    try {
      backend_.finish_host_snapshot();  // a device's copy stream
      SaveOptions options;
      options.read_back = true;  // Note [Read-back]
      options.write_share = job.paced ? write_share_ : 1.0;
      options.hurry = &hurry_;
      out.path = save_checkpoint(config_.dir, job.meta, job.tensors, config_.keep, comm_,
                                 timeout_s_, options);
    } catch (const Error& e) {
      out.error = e.what();
      out.code = e.code();
    } catch (const std::exception& e) {
      out.error = e.what();
      out.code = ExitCode::kInternal;
    }
    out.write_ms = ms_since(t0);
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_.push_back(std::move(out));
      writing_.store(false);
    }
    cv_.notify_all();
  }
}

}  // namespace trident
