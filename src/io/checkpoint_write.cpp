// Saving a sharded checkpoint: every rank writes its shard, rank 0 writes the index of virtual
// datasets, then publishes the directory atomically (Note [Checkpoint layout on disk] in
// checkpoint_format.h). Also the checkpoint.dir lock.
//
// The phases of save_checkpoint, each ended by an agreement all ranks reach
// (Note [Agree before throwing]):
//   1. rank 0 removes a leftover step_X.tmp of this step and creates it afresh;
//   2. every rank writes and fsyncs shard_r<rank>.h5 (only tensors it owns); with read_back
//      it then reads the shard back (Note [Read-back]);
//   3. rank 0 gathers what each rank wrote (MPI_Gatherv of a serialized list);
//   4. rank 0 checks that the blocks cover every global tensor exactly once, writes and
//      fsyncs index.h5 and the directory, renames step_X.tmp to step_X, switches `latest`
//      and prunes. Its agreement is the closing barrier: no rank returns before `latest` moved.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "io/checkpoint_format.h"
#include "trident/checkpoint.h"

namespace trident {

size_t ShardTensor::count() const {
  size_t n = 0;
  for (const auto& b : blocks) n += static_cast<size_t>(ckpt::elements_of(b.count));
  return n;
}

namespace ckpt {
namespace fs = std::filesystem;
namespace {

// One block as written: where it sits in the global tensor, which shard dataset holds it.
struct SavedBlock {
  std::vector<int64_t> start, count;
  uint32_t crc = 0;
  std::string dataset;
  int shard = 0;  // rank that wrote it
};

struct SavedTensor {
  std::string name;
  std::vector<int64_t> global_shape;
  std::vector<SavedBlock> blocks;
};

// ---- serialization of a rank's SavedTensors for the gather (int64s and strings) ----

void put(std::vector<char>& buf, int64_t v) {
  const char* p = reinterpret_cast<const char*>(&v);
  buf.insert(buf.end(), p, p + sizeof v);
}
void put(std::vector<char>& buf, const std::string& s) {
  put(buf, static_cast<int64_t>(s.size()));
  buf.insert(buf.end(), s.begin(), s.end());
}
void put(std::vector<char>& buf, const std::vector<int64_t>& v) {
  put(buf, static_cast<int64_t>(v.size()));
  for (int64_t x : v) put(buf, x);
}

struct Reader {
  const char* p;
  const char* end;
  int64_t i64() {
    TRIDENT_CHECK(end - p >= 8, "checkpoint gather: short record");
    int64_t v;
    std::memcpy(&v, p, sizeof v);
    p += sizeof v;
    return v;
  }
  std::string str() {
    const int64_t n = i64();
    TRIDENT_CHECK(n >= 0 && end - p >= n, "checkpoint gather: short string");
    std::string s(p, p + n);
    p += n;
    return s;
  }
  std::vector<int64_t> ints() {
    std::vector<int64_t> v(static_cast<size_t>(i64()));
    for (auto& x : v) x = i64();
    return v;
  }
};

std::vector<char> serialize(const std::vector<SavedTensor>& tensors) {
  std::vector<char> buf;
  put(buf, static_cast<int64_t>(tensors.size()));
  for (const auto& t : tensors) {
    put(buf, t.name);
    put(buf, t.global_shape);
    put(buf, static_cast<int64_t>(t.blocks.size()));
    for (const auto& b : t.blocks) {
      put(buf, b.start);
      put(buf, b.count);
      put(buf, static_cast<int64_t>(b.crc));
      put(buf, b.dataset);
    }
  }
  return buf;
}

void deserialize(Reader& r, int shard, std::vector<SavedTensor>& out) {
  const int64_t n = r.i64();
  for (int64_t i = 0; i < n; ++i) {
    SavedTensor t;
    t.name = r.str();
    t.global_shape = r.ints();
    const int64_t nb = r.i64();
    for (int64_t k = 0; k < nb; ++k) {
      SavedBlock b;
      b.start = r.ints();
      b.count = r.ints();
      b.crc = static_cast<uint32_t>(r.i64());
      b.dataset = r.str();
      b.shard = shard;
      t.blocks.push_back(std::move(b));
    }
    out.push_back(std::move(t));
  }
}

// ---- phase 2: this rank's shard ----

constexpr size_t kPacedFloats = size_t(4) << 20;  // 16 MiB of CRC between a writer's pauses

void check_tensor(const ShardTensor& t) {
  TRIDENT_CHECK(!t.name.empty() && t.name.front() != '/' && t.name.back() != '/',
                "checkpoint tensor name '{}' must be a relative path like params/wte", t.name);
  TRIDENT_CHECK(!t.global_shape.empty(), "checkpoint tensor {}: scalars are not supported", t.name);
  for (int64_t d : t.global_shape)
    TRIDENT_CHECK(d >= 0, "checkpoint tensor {}: global shape {}", t.name,
                  shape_str(t.global_shape));
  for (const auto& b : t.blocks) {
    TRIDENT_CHECK(
        b.start.size() == t.global_shape.size() && b.count.size() == t.global_shape.size(),
        "checkpoint tensor {}: block rank differs from global shape {}", t.name,
        shape_str(t.global_shape));
    for (size_t d = 0; d < b.start.size(); ++d)
      TRIDENT_CHECK(
          b.start[d] >= 0 && b.count[d] >= 0 && b.start[d] + b.count[d] <= t.global_shape[d],
          "checkpoint tensor {}: block start {} count {} outside global shape {}", t.name,
          shape_str(b.start), shape_str(b.count), shape_str(t.global_shape));
  }
  TRIDENT_CHECK(t.data != nullptr || t.count() == 0, "checkpoint tensor {}: no data", t.name);
}

// A new shard or index file with the attributes both carry (format, step, run id).
H5Id create_checkpoint_file(const std::string& path, const CheckpointMeta& meta) {
  H5Id fapl = make_fapl();
  H5Id file{
      TRIDENT_H5(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), "creating {}", path),
      H5Fclose};
  write_attr(file, kAttrFormatVersion, int64_t{meta.format_version});
  write_attr(file, kAttrStep, meta.step);
  write_attr(file, kAttrRunId, meta.run_id);
  return file;
}

H5Id intermediate_groups_lcpl() {
  H5Id lcpl{TRIDENT_H5(H5Pcreate(H5P_LINK_CREATE), "link creation properties"), H5Pclose};
  TRIDENT_H5(H5Pset_create_intermediate_group(lcpl, 1), "intermediate groups");
  return lcpl;
}

std::vector<SavedTensor> write_shard(const std::string& path, const CheckpointMeta& meta,
                                     const std::vector<ShardTensor>& tensors, int rank, int size,
                                     Pacer& pacer) {
  H5Id file = create_checkpoint_file(path, meta);
  write_attr(file, kAttrRank, int64_t{rank});
  write_attr(file, kAttrWorld, int64_t{size});
  H5Id lcpl = intermediate_groups_lcpl();

  std::vector<SavedTensor> saved;
  std::set<std::string> names;
  haddr_t first_data = HADDR_UNDEF;  // where the first block's bytes are (a fault's target)
  for (const auto& t : tensors) {
    if (!t.owner) continue;
    check_tensor(t);
    TRIDENT_CHECK(names.insert(t.name).second, "checkpoint tensor {} listed twice", t.name);
    SavedTensor st{t.name, t.global_shape, {}};
    H5Id group{TRIDENT_H5(H5Gcreate2(file, t.name.c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT),
                          "creating group {} in {}", t.name, path),
               H5Gclose};
    write_attr(group, kAttrGlobalShape, t.global_shape);
    const float* data = t.data;
    for (size_t k = 0; k < t.blocks.size(); ++k) {
      const ShardBlock& b = t.blocks[k];
      const auto n = static_cast<size_t>(elements_of(b.count));
      if (n == 0) continue;  // nothing to hold; no mapping either
      const std::string dname = std::to_string(k);
      std::vector<hsize_t> dims(b.count.begin(), b.count.end());
      H5Id space{TRIDENT_H5(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                            "dataspace of {}/{}", t.name, k),
                 H5Sclose};
      H5Id ds{TRIDENT_H5(H5Dcreate2(group, dname.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT,
                                    H5P_DEFAULT, H5P_DEFAULT),
                         "creating dataset {}/{} in {}", t.name, k, path),
              H5Dclose};
      TRIDENT_H5(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
                 "writing dataset {}/{} to {}", t.name, k, path);
      pacer.pause();
      uint32_t crc = 0;
      for (size_t at = 0; at < n; at += kPacedFloats) {  // Note [Paced background writes]
        crc = crc32_extend(crc, data + at, std::min(kPacedFloats, n - at) * sizeof(float));
        pacer.pause();
      }
      if (first_data == HADDR_UNDEF) first_data = H5Dget_offset(ds);
      write_attr(ds, kAttrStart, b.start);
      write_attr(ds, kAttrCrc32, std::vector<uint32_t>{crc});
      ds.close(fmt::format("dataset {}/{} in {}", t.name, k, path));
      st.blocks.push_back({b.start, b.count, crc, block_dataset_name(t.name, k), rank});
      data += n;
    }
    saved.push_back(std::move(st));
  }
  file.close(path);
  fsync_path(path, false);
  // Fault injection for tests/cli/test_async_checkpoint.sh: "RANK:STEP", one byte of that
  // rank's first block in that step's shard flipped after the write (damage the read-back finds).
  int bad_rank = -1;
  long long bad_step = -1;
  if (const char* f = std::getenv("TRIDENT_FAULT_CORRUPT_SHARD");
      f && std::sscanf(f, "%d:%lld", &bad_rank, &bad_step) == 2 && bad_rank == rank &&
      bad_step == meta.step && first_data != HADDR_UNDEF) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    char byte = 0;
    if (fd >= 0 && ::pread(fd, &byte, 1, off_t(first_data)) == 1) {
      byte = char(byte ^ 0x10);
      if (::pwrite(fd, &byte, 1, off_t(first_data)) != 1) byte = 0;
    }
    if (fd >= 0) ::close(fd);
  }
  return saved;
}

// Note [Read-back]
// A background save reads its shard back before `latest` can move. After the fsync the file's
// pages are dropped from the page cache (they are clean), so the read comes from the storage,
// and each block is compared with the snapshot it was written from: any byte the storage
// changed fails the save (a comparison finds every changed byte, a CRC all but 2^-32 of them,
// and memcmp costs no more than the CRC pass).
void read_back_shard(const std::string& path, const std::vector<ShardTensor>& tensors,
                     Pacer& pacer) {
  if (const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // advice: a failure only reads the cache
    ::close(fd);
  }
  H5Id file = open_read_only(path, path);
  std::vector<float> buf;
  for (const auto& t : tensors) {
    if (!t.owner) continue;
    const float* data = t.data;
    for (size_t k = 0; k < t.blocks.size(); ++k) {
      const auto n = static_cast<size_t>(elements_of(t.blocks[k].count));
      if (n == 0) continue;
      const std::string name = block_dataset_name(t.name, k);
      H5Id ds{TRIDENT_H5(H5Dopen2(file, name.c_str(), H5P_DEFAULT), "reading back {} in {}", name,
                         path),
              H5Dclose};
      buf.resize(n);
      TRIDENT_H5(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()),
                 "reading back {} in {}", name, path);
      if (std::memcmp(buf.data(), data, n * sizeof(float)) != 0) {
        size_t i = 0;
        while (i < n && std::memcmp(&buf[i], &data[i], sizeof(float)) == 0) ++i;
        input_error("{}: dataset {} read back differs from what was written, from element {} of "
                    "{} (the storage changed it)",
                    path, name, i, n);
      }
      pacer.pause();
      data += n;
    }
  }
}

// ---- phase 4: the index ----

bool boxes_overlap(const SavedBlock& a, const SavedBlock& b) {
  for (size_t d = 0; d < a.start.size(); ++d)
    if (a.start[d] + a.count[d] <= b.start[d] || b.start[d] + b.count[d] <= a.start[d])
      return false;
  return true;
}

// All ranks' pieces of each global tensor, checked to cover it exactly once: the same global
// shape everywhere, pairwise disjoint blocks whose sizes add up to the whole.
std::map<std::string, SavedTensor> merge_and_check(std::vector<SavedTensor> pieces) {
  std::map<std::string, SavedTensor> merged;
  for (auto& p : pieces) {
    auto [it, fresh] = merged.try_emplace(p.name, SavedTensor{p.name, p.global_shape, {}});
    SavedTensor& m = it->second;
    TRIDENT_CHECK(m.global_shape == p.global_shape,
                  "checkpoint tensor {}: global shape {} on rank {}, {} on another", p.name,
                  shape_str(p.global_shape), p.blocks.empty() ? -1 : p.blocks[0].shard,
                  shape_str(m.global_shape));
    for (auto& b : p.blocks) m.blocks.push_back(std::move(b));
  }
  for (const auto& [name, t] : merged) {
    int64_t covered = 0;
    for (size_t i = 0; i < t.blocks.size(); ++i) {
      covered += elements_of(t.blocks[i].count);
      for (size_t j = 0; j < i; ++j)
        TRIDENT_CHECK(!boxes_overlap(t.blocks[i], t.blocks[j]),
                      "checkpoint tensor {}: more than one owner: rank {} start {} count {} "
                      "overlaps rank {} start {} count {}",
                      name, t.blocks[i].shard, shape_str(t.blocks[i].start),
                      shape_str(t.blocks[i].count), t.blocks[j].shard, shape_str(t.blocks[j].start),
                      shape_str(t.blocks[j].count));
    }
    TRIDENT_CHECK(covered == elements_of(t.global_shape),
                  "checkpoint tensor {}: the owners' blocks hold {} of its {} elements {}", name,
                  covered, elements_of(t.global_shape), shape_str(t.global_shape));
  }
  return merged;
}

void write_virtual_dataset(hid_t file, hid_t lcpl, const SavedTensor& t) {
  std::vector<hsize_t> dims(t.global_shape.begin(), t.global_shape.end());
  const int ndim = static_cast<int>(dims.size());
  H5Id vspace{TRIDENT_H5(H5Screate_simple(ndim, dims.data(), nullptr), "dataspace of {}", t.name),
              H5Sclose};
  H5Id dcpl{TRIDENT_H5(H5Pcreate(H5P_DATASET_CREATE), "creation properties of {}", t.name),
            H5Pclose};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  TRIDENT_H5(H5Pset_fill_value(dcpl, H5T_NATIVE_FLOAT, &nan), "fill value of {}", t.name);
  std::vector<uint32_t> crcs;
  for (const auto& b : t.blocks) {
    std::vector<hsize_t> start(b.start.begin(), b.start.end()),
        count(b.count.begin(), b.count.end());
    TRIDENT_H5(
        H5Sselect_hyperslab(vspace, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
        "selecting block {} of {}", shape_str(b.start), t.name);
    H5Id src{
        TRIDENT_H5(H5Screate_simple(ndim, count.data(), nullptr), "source space of {}", b.dataset),
        H5Sclose};
    const std::string file_name = escape_vds_name(shard_file_name(b.shard));
    const std::string dset_name = escape_vds_name(b.dataset);
    TRIDENT_H5(H5Pset_virtual(dcpl, vspace, file_name.c_str(), dset_name.c_str(), src),
               "mapping {} of {} to {}:{}", shape_str(b.start), t.name, file_name, dset_name);
    crcs.push_back(b.crc);
  }
  TRIDENT_H5(H5Sselect_all(vspace), "selecting all of {}", t.name);
  H5Id ds{
      TRIDENT_H5(H5Dcreate2(file, t.name.c_str(), H5T_IEEE_F32LE, vspace, lcpl, dcpl, H5P_DEFAULT),
                 "creating virtual dataset {}", t.name),
      H5Dclose};
  write_attr(ds, kAttrSourceCrc32, crcs);
  ds.close(fmt::format("virtual dataset {}", t.name));
}

void write_index(const std::string& path, const CheckpointMeta& meta, int shards,
                 const std::map<std::string, SavedTensor>& tensors) {
  H5Id file = create_checkpoint_file(path, meta);
  write_attr(file, kAttrDeckYaml, meta.deck_yaml);
  write_attr(file, kAttrWorld, int64_t{meta.world});
  write_attr(file, kAttrDp, int64_t{meta.dp});
  write_attr(file, kAttrTp, int64_t{meta.tp});
  write_attr(file, kAttrPp, int64_t{meta.pp});
  write_attr(file, kAttrNumShards, int64_t{shards});
  std::vector<std::string> files;
  for (int r = 0; r < shards; ++r) files.push_back(shard_file_name(r));
  write_attr(file, kAttrShardFiles, files);
  H5Id lcpl = intermediate_groups_lcpl();
  for (const auto& [name, t] : tensors) write_virtual_dataset(file, lcpl, t);
  file.close(path);
  fsync_path(path, false);
}

void remove_tree(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
  if (ec)
    throw Error(fmt::format("removing {}: {}", p.string(), ec.message()), ExitCode::kBadInput);
}

// step_X.tmp -> step_X. If step_X exists (a run resumed from an older checkpoint saves this
// step again) the two are swapped atomically (renameat2 RENAME_EXCHANGE), so `latest` never
// names a missing directory, and the old one is removed afterwards.
void publish(const fs::path& base, const fs::path& tmp, const fs::path& final_dir) {
  if (fs::exists(final_dir)) {
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0)
      throw Error(fmt::format("exchanging {} with {}: {}", tmp.string(), final_dir.string(),
                              std::strerror(errno)),
                  ExitCode::kBadInput);
    fsync_path(base.string(), true);
    remove_tree(tmp);
  } else if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    throw Error(fmt::format("renaming {} to {}: {}", tmp.string(), final_dir.string(),
                            std::strerror(errno)),
                ExitCode::kBadInput);
  }
  fsync_path(base.string(), true);
}

// A new relative link renamed over `latest`: rename is atomic, so `latest` is always either
// the old or the new target.
void switch_latest(const fs::path& base, const std::string& target) {
  const fs::path link = base / kLatestLink;
  const fs::path new_link = base / (std::string(".") + kLatestLink + kTmpSuffix);
  std::error_code ec;
  fs::remove(new_link, ec);
  if (::symlink(target.c_str(), new_link.c_str()) != 0 ||
      ::rename(new_link.c_str(), link.c_str()) != 0)
    throw Error(fmt::format("pointing {} at {}: {}", link.string(), target, std::strerror(errno)),
                ExitCode::kBadInput);
  fsync_path(base.string(), true);
}

// Removes the complete checkpoints beyond the `keep` highest steps (keep <= 0 keeps all), never
// the one just written, and every step_*.tmp (saves that crashed; the lock on the checkpoint.dir
// says no other run is writing one).
void prune(const fs::path& base, int keep, const std::string& current) {
  static const std::regex tmp_re("step_[0-9]{8,}.*\\.tmp");
  std::vector<std::pair<int64_t, fs::path>> complete;
  for (const auto& e : fs::directory_iterator(base)) {
    const std::string name = e.path().filename().string();
    if (e.is_symlink() || !e.is_directory()) continue;
    if (const int64_t step = step_of_dir_name(name); step >= 0)
      complete.emplace_back(step, e.path());
    else if (std::regex_match(name, tmp_re)) remove_tree(e.path());
  }
  if (keep <= 0) return;
  std::sort(complete.begin(), complete.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (size_t i = static_cast<size_t>(keep); i < complete.size(); ++i)
    if (complete[i].second.filename() != current) remove_tree(complete[i].second);
  fsync_path(base.string(), true);
}

}  // namespace
}  // namespace ckpt

namespace ckpt {
namespace {

std::atomic<bool> hdf5_write_broken{false};  // Note [Leaving after a storage fault]

// Runs an HDF5 write; if it throws, HDF5 may be left holding the file. A failed write is the
// storage refusing the save (full, an I/O error), exit 2 like every other storage fault.
template <typename F>
auto hdf5_write(F&& write) {
  try {
    return write();
  } catch (const Error& e) {
    hdf5_write_broken.store(true);
    throw Error(e.what(), ExitCode::kBadInput);
  } catch (...) {
    hdf5_write_broken.store(true);
    throw;
  }
}

// Bytes this rank's shard will take, generously: the data, plus HDF5's object headers,
// attributes and CRCs (a few KiB per dataset and group), plus the file's own metadata.
uint64_t estimated_shard_bytes(const std::vector<ShardTensor>& tensors) {
  uint64_t bytes = 1 << 20;
  for (const ShardTensor& t : tensors) {
    if (!t.owner) continue;
    bytes += t.count() * sizeof(float) + 4096 * (t.blocks.size() + 1);
  }
  return bytes;
}

// Stale step_X.tmp directories of an interrupted save (the directory lock rules out another
// run writing one now).
void remove_stale_tmp(const std::filesystem::path& base) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(base, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0 && name.size() > std::strlen(kTmpSuffix) &&
        name.compare(name.size() - std::strlen(kTmpSuffix), std::string::npos, kTmpSuffix) == 0)
      remove_tree(e.path());
  }
}

}  // namespace
}  // namespace ckpt

namespace ckpt {
namespace {

// Runs file-system steps of a save (directories, renames, the link); a refusal of the file
// system (EACCES, EROFS, ENOSPC, a vanished parent) becomes one message naming the path and
// the cause, exit 2 like a full disk, instead of an internal error.
template <typename F>
void storage_step(const std::filesystem::path& final_dir, F&& step) {
  try {
    step();
  } catch (const std::filesystem::filesystem_error& e) {
    input_error("checkpoint save to {}: {}: {}", final_dir.string(), e.path1().string(),
                e.code().message());
  }
}

std::string save_into(const std::filesystem::path& base, const std::filesystem::path& tmp,
                      const std::filesystem::path& final_dir, const CheckpointMeta& meta,
                      const std::vector<ShardTensor>& tensors, int keep, MPI_Comm comm,
                      double timeout_s, const SaveOptions& options) {
  namespace fs = std::filesystem;
  int rank = 0, size = 1;
  TRIDENT_MPI(MPI_Comm_rank(comm, &rank));
  TRIDENT_MPI(MPI_Comm_size(comm, &size));
  const std::string final_name = final_dir.filename().string();
  const std::string others = fmt::format("checkpoint save to {}: failed", final_dir.string());

  // Room for every shard, checked before HDF5 writes a byte; the ranks share the directory, so
  // rank 0 checks the sum (Note [Leaving after a storage fault]).
  uint64_t need = estimated_shard_bytes(tensors), total_need = 0;
  MPI_Request request = MPI_REQUEST_NULL;  // Note [Checkpoint collectives under the timeout]
  TRIDENT_MPI(MPI_Ireduce(&need, &total_need, 1, MPI_UINT64_T, MPI_SUM, 0, comm, &request));
  wait_within(request, comm, timeout_s, "the reduce of the shards' sizes");
  agree_or_throw(comm, timeout_s, attempt([&] {
                   // Fault injection for tests/cli/test_storage_faults.sh: skip the check so
                   // that the disk fills inside HDF5's writes.
                   if (rank != 0 || std::getenv("TRIDENT_FAULT_SKIP_SPACE_CHECK")) return;
                   struct statvfs fs_info {};
                   if (::statvfs(tmp.c_str(), &fs_info) != 0) return;  // unknown: try
                   const uint64_t avail = uint64_t(fs_info.f_bavail) * fs_info.f_frsize;
                   const uint64_t index = 65536 + total_need / 1000;
                   if (total_need + index > avail)
                     input_error("checkpoint save to {}: needs about {:.1f} MiB but {} has "
                                 "{:.1f} MiB free; nothing was saved (the previous checkpoint "
                                 "and `latest` are unchanged)",
                                 final_dir.string(), double(total_need + index) / 1048576.0,
                                 base.string(), double(avail) / 1048576.0);
                 }),
                 others);

  // Fault injection for tests/cli/test_async_checkpoint.sh: milliseconds to wait before the
  // shards are written (step_X.tmp exists; training changes its live buffers meanwhile).
  if (const char* ms = std::getenv("TRIDENT_FAULT_SAVE_DELAY_MS"))
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoll(ms)));

  std::vector<char> mine;
  agree_or_throw(
      comm, timeout_s, attempt([&] {
        const std::string shard = (tmp / shard_file_name(rank)).string();
        Pacer pacer(options.write_share, options.hurry);
        mine = serialize(
            hdf5_write([&] { return write_shard(shard, meta, tensors, rank, size, pacer); }));
        if (options.read_back) read_back_shard(shard, tensors, pacer);  // Note [Read-back]
        // Fault injection for tests/cli/test_storage_faults.sh: "RANK:STEP", that
        // rank dies in that step's save, its shard written and the index not.
        int die_rank = -1;
        long long die_step = -1;
        if (const char* f = std::getenv("TRIDENT_FAULT_DIE_IN_SAVE");
            f && std::sscanf(f, "%d:%lld", &die_rank, &die_step) == 2 && die_rank == rank &&
            die_step == meta.step)
          std::raise(SIGKILL);
        TRIDENT_CHECK(mine.size() < (size_t{1} << 30), "checkpoint list of {} bytes", mine.size());
      }),
      others);

  // What each rank wrote, to rank 0 (names, shapes, blocks, CRCs: kilobytes per rank).
  int my_bytes = static_cast<int>(mine.size());
  std::vector<int> bytes(rank == 0 ? size : 0), offsets(rank == 0 ? size : 0);
  TRIDENT_MPI(MPI_Igather(&my_bytes, 1, MPI_INT, bytes.data(), 1, MPI_INT, 0, comm, &request));
  wait_within(request, comm, timeout_s, "the gather of the shard lists' sizes");
  std::vector<char> all;
  agree_or_throw(comm, timeout_s, attempt([&] {
                   if (rank != 0) return;
                   int64_t total = 0;
                   for (int r = 0; r < size; ++r) {
                     offsets[r] = static_cast<int>(total);
                     total += bytes[r];
                     TRIDENT_CHECK(total < std::numeric_limits<int>::max(),
                                   "checkpoint lists of {} bytes", total);
                   }
                   all.resize(static_cast<size_t>(total));
                 }),
                 others);
  TRIDENT_MPI(MPI_Igatherv(mine.data(), my_bytes, MPI_CHAR, all.data(), bytes.data(),
                           offsets.data(), MPI_CHAR, 0, comm, &request));
  wait_within(request, comm, timeout_s, "the gather of the shard lists");

  agree_or_throw(comm, timeout_s, attempt([&] {
                   if (rank != 0) return;
                   std::vector<SavedTensor> pieces;
                   for (int r = 0; r < size; ++r) {
                     Reader rd{all.data() + offsets[r], all.data() + offsets[r] + bytes[r]};
                     deserialize(rd, r, pieces);
                   }
                   hdf5_write([&] {
                     write_index((tmp / kIndexFile).string(), meta, size,
                                 merge_and_check(std::move(pieces)));
                   });
                   storage_step(final_dir, [&] {
                     fsync_path(tmp.string(), true);
                     publish(base, tmp, final_dir);
                     switch_latest(base, final_name);
                     prune(base, keep, final_name);
                   });
                 }),
                 others);
  return final_dir.string();
}

}  // namespace
}  // namespace ckpt

bool checkpoint_write_broken() { return ckpt::hdf5_write_broken.load(); }

std::string save_checkpoint(const std::string& dir, const CheckpointMeta& meta,
                            const std::vector<ShardTensor>& tensors, int keep, MPI_Comm comm,
                            double timeout_s, const SaveOptions& options) {
  namespace fs = std::filesystem;
  using namespace ckpt;
  silence_hdf5_errors();
  int rank = 0, size = 1;
  TRIDENT_MPI(MPI_Comm_rank(comm, &rank));
  TRIDENT_MPI(MPI_Comm_size(comm, &size));
  const fs::path base(dir.empty() ? "." : dir);
  const std::string final_name = step_dir_name(meta.step);
  const fs::path final_dir = (base / final_name).lexically_normal();
  const fs::path tmp = base / (final_name + kTmpSuffix);
  const std::string others = fmt::format("checkpoint save to {}: failed", final_dir.string());

  agree_or_throw(comm, timeout_s, attempt([&] {
                   if (rank != 0) return;
                   storage_step(final_dir, [&] {
                     fs::create_directories(base);
                     remove_stale_tmp(base);
                     fs::create_directory(tmp);
                   });
                 }),
                 others);
  // From here on a failure removes the unfinished step_X.tmp (`latest` was never touched).
  try {
    return save_into(base, tmp, final_dir, meta, tensors, keep, comm, timeout_s, options);
  } catch (...) {
    if (rank == 0) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
    throw;
  }
}

CheckpointDirLock::CheckpointDirLock(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) input_error("checkpoint.dir {}: cannot create it: {}", dir, ec.message());
  const std::string path = (std::filesystem::path(dir) / ckpt::kLockFile).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    input_error("checkpoint.dir {}: cannot open {}: {}", dir, path, std::strerror(errno));
  // flock locks belong to the open file description: a second open() of the same file (in
  // this process or another) conflicts, a fork()ed child shares this one.
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK) {
      const std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "unknown";
      input_error("checkpoint.dir {} is in use by another run (pid {})", dir,
                  pid.substr(0, pid.find_first_of("\n ")));
    }
    input_error("checkpoint.dir {}: cannot lock {}: {}", dir, path, std::strerror(err));
  }
  const std::string pid = fmt::format("{}\n", ::getpid());
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
    // The lock holds without the pid; only the message of a second run would lack it.
  }
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace trident
