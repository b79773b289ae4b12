// Private to src/io/checkpoint_*.cpp: the on-disk names, the HDF5 helpers and the failure
// agreement that the writer and the reader share.
//
// Note [Checkpoint layout on disk]
// A step is one HDF5 shard per rank of the saving communicator plus index.h5, whose virtual
// datasets map every block back to its shard. A step becomes visible only by renaming
// step_N.tmp to step_N and then switching `latest`, so a reader never sees a half-written step.
// Every block carries a crc32, and a region whose shard is missing reads as NaN, never zeros.
//
//   dir/.lock                       CheckpointDirLock (flock), holds the owner's pid
//   dir/latest -> step_00000100     relative symbolic link, switched by renaming a new link over it
//   dir/step_00000100/
//     shard_r00003.h5   written by rank 3 of the saving communicator (default driver, no
//                       MPI-IO). Root attributes format_version, step, run_id, rank, world.
//                       Every tensor the rank owns is a group /<name> (attribute global_shape,
//                       int64[ndim]) holding one float32 dataset per owned block, named "0",
//                       "1", ... in the order of ShardTensor::blocks, of the block's shape, with
//                       attributes start (int64[ndim]) and crc32 (uint32, of its bytes).
//     index.h5          /<name>: a float32 virtual dataset of the global shape, with one mapping
//                       per block to "shard_rNNNNN.h5":/<name>/<k> (fill value NaN) and
//                       attribute source_crc32 (uint32[mappings], in mapping order). Root
//                       attributes format_version, step, run_id, deck_yaml, world, dp, tp, pp,
//                       num_shards, shard_files (the names of all shards, including ranks that
//                       own nothing).
//   dir/step_00000110.tmp/          a save in progress (or one that crashed): never read
//
// Note [VDS source paths]
// The mappings name their source files bare ("shard_r00003.h5"), and trident's reads set the
// virtual prefix to the checkpoint directory: a step can be renamed or moved, and index.h5
// opened from any working directory (h5py included), as long as the shards sit beside it.
// HDF5 >= 1.10.2 resolves a bare name against HDF5_VDS_PREFIX, the access property's prefix,
// then the VDS file's own directory (tests/mpi/test_ckpt_io.cpp checks h5py elsewhere).
#pragma once

#include <hdf5.h>
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trident/check.h"

namespace trident::ckpt {

inline constexpr const char* kIndexFile = "index.h5";
inline constexpr const char* kLatestLink = "latest";
inline constexpr const char* kLockFile = ".lock";
inline constexpr const char* kTmpSuffix = ".tmp";

// Attribute names (root of index and shards, shard datasets and groups, index datasets).
inline constexpr const char* kAttrFormatVersion = "format_version";
inline constexpr const char* kAttrStep = "step";
inline constexpr const char* kAttrRunId = "run_id";
inline constexpr const char* kAttrDeckYaml = "deck_yaml";
inline constexpr const char* kAttrWorld = "world";
inline constexpr const char* kAttrDp = "dp";
inline constexpr const char* kAttrTp = "tp";
inline constexpr const char* kAttrPp = "pp";
inline constexpr const char* kAttrNumShards = "num_shards";
inline constexpr const char* kAttrShardFiles = "shard_files";
inline constexpr const char* kAttrRank = "rank";
inline constexpr const char* kAttrGlobalShape = "global_shape";
inline constexpr const char* kAttrStart = "start";
inline constexpr const char* kAttrCrc32 = "crc32";
inline constexpr const char* kAttrSourceCrc32 = "source_crc32";

std::string shard_file_name(int rank);    // shard_r00003.h5
std::string step_dir_name(int64_t step);  // step_00000100
// The step a complete checkpoint's directory name says ("step_00000100" -> 100); -1 for any
// other name ("step_00000110.tmp", "latest", ".lock").
int64_t step_of_dir_name(const std::string& name);
std::string block_dataset_name(const std::string& tensor, size_t block);  // params/x/0
// H5Pset_virtual reads printf-like patterns in source names: a literal '%' is written "%%".
std::string escape_vds_name(const std::string& name);
std::string unescape_vds_name(const std::string& name);

uint32_t crc32_of(const void* data, size_t bytes);
uint32_t crc32_extend(uint32_t crc, const void* data, size_t bytes);  // crc32_of(a + b) from a's

// Note [Paced background writes]
// On a host whose cores all train, every CPU second the background writer takes (copies into
// the page cache, CRCs, the read-back) is a second the steps beside it lose, and an OpenMP team
// waits for its slowest thread. So the writer pauses after each piece of work long enough that
// its CPU time stays a `share` of the time passed (checkpoint.write_share): the cost is spread
// over more steps. Its CPU time, not wall time: an fsync's wait costs the steps nothing.
// Once *hurry is true (someone waits for the write), it pauses no more.
class Pacer {
 public:
  Pacer(double share, const std::atomic<bool>* hurry);  // share >= 1: never pauses
  void pause();

 private:
  static double thread_cpu_seconds();
  double share_, last_;
  const std::atomic<bool>* hurry_;
};
std::string hex32(uint32_t v);                             // 0x1234abcd
std::string shape_str(const std::vector<int64_t>& shape);  // [3, 4]
int64_t elements_of(const std::vector<int64_t>& shape);

// Turns HDF5's error handler off for this thread (its own stack printing): every call is
// checked and the message comes from h5_failed instead.
void silence_hdf5_errors();

// What HDF5's error stack says about the last failure, innermost cause last, on one line.
std::string hdf5_error_text();
[[noreturn]] void h5_failed(const char* file, int line, const char* call, const std::string& what);

}  // namespace trident::ckpt

// TRIDENT_H5(call, fmt, args...): an HDF5 call returning hid_t/herr_t/htri_t/ssize_t, negative
// on failure; throws trident::Error naming what was being done, the call, HDF5's reason, file
// and line. The message arguments are only formatted on failure.
#define TRIDENT_H5(call, ...)                                                            \
  ([&]() {                                                                               \
    auto trident_h5_rc_ = (call);                                                        \
    if (trident_h5_rc_ < 0)                                                              \
      ::trident::ckpt::h5_failed(__FILE__, __LINE__, #call, ::fmt::format(__VA_ARGS__)); \
    return trident_h5_rc_;                                                               \
  }())

namespace trident::ckpt {

// One HDF5 identifier, closed on destruction (unchecked: an error path is already unwinding).
// close() closes it checked, for the writes whose close flushes data (files, datasets).
class H5Id {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Id() = default;
  H5Id(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  H5Id(H5Id&& o) noexcept : id_(std::exchange(o.id_, -1)), closer_(o.closer_) {}
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
      closer_ = o.closer_;
    }
    return *this;
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  ~H5Id() { reset(); }

  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }  // NOLINT: used where HDF5 wants a hid_t
  void close(const std::string& what);

 private:
  void reset() {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = -1;
  }
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

// Attributes: scalars, 1-D arrays and variable-length UTF-8 strings (no 64 KiB limit: the
// bytes live in the global heap), readable by h5py as int, numpy arrays and str.
void write_attr(hid_t obj, const char* name, int64_t value);
void write_attr(hid_t obj, const char* name, const std::vector<int64_t>& values);
void write_attr(hid_t obj, const char* name, const std::vector<uint32_t>& values);
void write_attr(hid_t obj, const char* name, const std::string& value);
void write_attr(hid_t obj, const char* name, const std::vector<std::string>& values);
bool has_attr(hid_t obj, const char* name);
int64_t read_attr_int(hid_t obj, const char* name);
std::vector<int64_t> read_attr_ints(hid_t obj, const char* name);
std::vector<uint32_t> read_attr_u32s(hid_t obj, const char* name);
std::string read_attr_string(hid_t obj, const char* name);
std::vector<std::string> read_attr_strings(hid_t obj, const char* name);

// File access properties for every checkpoint file: default (POSIX) driver; HDF5's own file
// locking kept, but ignored where the file system does not support it (Lustre, some NFS).
H5Id make_fapl();
// Opens an existing file read-only (checked); `what` names it in the message.
H5Id open_read_only(const std::string& path, const std::string& what);

// Note [Agree before throwing]
// A checkpoint function is collective: one rank failing (a full disk, a corrupt shard) must not
// leave the others waiting in the next collective. So each phase runs its local part inside
// `attempt`, and `agree_or_throw` (an all-reduce every rank reaches) makes every rank throw if
// any failed: a failing rank its own error, the others one naming the lowest failing rank, with
// its exit code.
template <typename F>
std::optional<Error> attempt(F&& f) {
  try {
    f();
    return std::nullopt;
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {
    return Error(e.what(), ExitCode::kInternal);
  }
}
void agree_or_throw(MPI_Comm comm, double timeout_s, const std::optional<Error>& local,
                    const std::string& others_prefix);

// Note [Checkpoint collectives under the timeout]
// A rank that stops answering during a save or a load (SIGSTOP, a hung node) must end the job
// after comm.timeout_s, as a stalled step's collective does, not hang it. So every checkpoint
// collective is the nonblocking MPI call completed by wait_within, which polls MPI_Test (Open
// MPI progresses only inside MPI calls) and after timeout_s throws an internal error naming the
// operation, communicator and rank; the app then aborts the job.
void wait_within(MPI_Request& request, MPI_Comm comm, double timeout_s, const char* op);

// fsync of a file or a directory; Error naming the path on failure.
void fsync_path(const std::string& path, bool directory);

}  // namespace trident::ckpt
