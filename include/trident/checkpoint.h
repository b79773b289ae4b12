// Sharded HDF5 checkpoints.
//
// A checkpoint is a directory dir/step_00000100/ holding
//   shard_r00000.h5 ... shard_rNNNNN.h5   what each rank owns, one file per rank
//   index.h5                             one virtual dataset per global tensor, at its global
//                                        name and shape, mapping every region to the shard
//                                        that holds it — any reader (h5py included) sees e.g.
//                                        /params/h3.qkvw as one [3C, C] array
// plus attributes: format_version, step, run_id, the resolved deck (YAML) and the layout.
// Every shard dataset carries a CRC-32 of its bytes, checked on load.
//
// Saving is atomic: everything is written under dir/step_00000100.tmp, fsynced, renamed, and
// only then the symbolic link dir/latest is switched (a temporary link renamed over it); the
// oldest complete checkpoints beyond `keep` are removed last. A crash at any point leaves the
// previous checkpoint complete and `latest` pointing at it.
//
// HDF5 is not thread-safe here: call these from one thread at a time (the compute thread, or
// the background writer of Note [Asynchronous checkpoints] while the compute thread uses none).
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace trident {

constexpr int kCheckpointFormatVersion = 1;
// How long a checkpoint collective may wait for the other ranks (the trainer passes
// comm.timeout_s; this is its default). Note [Checkpoint collectives under the timeout].
constexpr double kCheckpointTimeoutSeconds = 300.0;

// One hyperslab of a global tensor: start and count per dimension.
struct ShardBlock {
  std::vector<int64_t> start, count;
};

// The part of one global tensor this rank holds: its blocks, whose elements (each block in
// row-major order, block after block) are contiguous in `data`.
struct ShardTensor {
  std::string name;  // global name, e.g. "params/h3.qkvw", "adam_m/wte"
  std::vector<int64_t> global_shape;
  std::vector<ShardBlock> blocks;
  float* data = nullptr;  // written from on save, read into on load
  bool owner = false;     // this rank writes it; every element has one owner
  size_t count() const;   // elements over all blocks
};

struct CheckpointMeta {
  int64_t step = 0;       // optimizer steps completed
  std::string run_id;     // identifies the run that wrote it
  std::string deck_yaml;  // the resolved deck
  int world = 1, dp = 1, tp = 1, pp = 1;
  int format_version = kCheckpointFormatVersion;
};

// How save_checkpoint writes: read_back, every rank reads its shard back from the storage and
// compares it with `tensors` before `latest` moves (Note [Read-back] in
// src/io/checkpoint_write.cpp); write_share < 1, the CPU time spent writing is paced to that
// share of the time passed (Note [Paced background writes]). The background writer's choices:
// its time is off the step's path.
struct SaveOptions {
  bool read_back = false;
  double write_share = 1.0;
  const std::atomic<bool>* hurry = nullptr;  // once true, no more pacing
};

// Collective over `comm` (every rank calls it with its own tensors and the same meta). Writes,
// syncs and publishes dir/step_<step>, switches dir/latest, prunes to the `keep` newest.
// Returns the checkpoint's path. A collective that waits longer than timeout_s throws.
std::string save_checkpoint(const std::string& dir, const CheckpointMeta& meta,
                            const std::vector<ShardTensor>& tensors, int keep, MPI_Comm comm,
                            double timeout_s = kCheckpointTimeoutSeconds,
                            const SaveOptions& options = {});

// Note [Leaving after a storage fault]
// A save checks for room before HDF5 writes a byte. If an HDF5 write still fails (the disk
// filled after the check, an I/O error), the app reports the error and leaves without
// MPI_Finalize: HDF5 1.10 may hold a file it could not close and would close it again when MPI
// finalizes, crashing inside HDF5. What the save promised still holds: `latest` was not
// advanced and the unfinished directory was removed.
//
// True once an HDF5 write of a checkpoint failed in this process.
bool checkpoint_write_broken();

// dir/latest resolved to its target, or "" if there is none.
std::string latest_checkpoint(const std::string& dir);
// The newest complete checkpoint in `dir` with a lower step than the checkpoint `than` (a
// step directory's path), or "" if there is none (Note [A damaged latest] in the app).
std::string previous_checkpoint(const std::string& dir, const std::string& than);
// A checkpoint directory, or a checkpoint.dir (then its latest); input_error if neither.
std::string resolve_checkpoint(const std::string& path);

// Not collective. input_error naming the file if it is missing or not a checkpoint.
CheckpointMeta read_checkpoint_meta(const std::string& path);

// Collective: the shard files are checked in parallel (split over the ranks of comm): present,
// readable, same step and run id as the index, every dataset's CRC-32. On any mismatch every
// rank throws input_error; the rank that found it names the file and what differs.
void verify_checkpoint(const std::string& path, MPI_Comm comm,
                       double timeout_s = kCheckpointTimeoutSeconds);

// Collective: verifies, then fills each tensor's data from the global datasets, whatever the
// layout that saved them. input_error naming the tensor if one is missing or its global shape
// differs.
void load_checkpoint(const std::string& path, const std::vector<ShardTensor>& tensors,
                     MPI_Comm comm, double timeout_s = kCheckpointTimeoutSeconds);

// `trident ckpt inspect`: meta, layout, and every global tensor with its shape and size.
std::string describe_checkpoint(const std::string& path);

// Holds an exclusive lock on dir/.lock (flock) while alive, so two runs cannot write one
// checkpoint.dir; input_error naming the directory if another process holds it.
class CheckpointDirLock {
 public:
  explicit CheckpointDirLock(const std::string& dir);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace trident
