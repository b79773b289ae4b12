// Helpers shared by the checkpoint writer and reader: names, CRC-32, checked HDF5 calls and
// attributes, failure agreement, fsync. The layout itself is described in checkpoint_format.h.
#include "io/checkpoint_format.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <isa-l/crc.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <regex>
#include <thread>

namespace trident::ckpt {

std::string shard_file_name(int rank) { return fmt::format("shard_r{:05d}.h5", rank); }

std::string step_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }

int64_t step_of_dir_name(const std::string& name) {
  static const std::regex complete_re("step_([0-9]{8,})");
  std::smatch m;
  return std::regex_match(name, m, complete_re) ? std::stoll(m[1].str()) : -1;
}

std::string block_dataset_name(const std::string& tensor, size_t block) {
  return fmt::format("{}/{}", tensor, block);
}

std::string escape_vds_name(const std::string& name) {
  std::string out;
  for (char c : name) {
    out += c;
    if (c == '%') out += '%';
  }
  return out;
}

std::string unescape_vds_name(const std::string& name) {
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    out += name[i];
    if (name[i] == '%' && i + 1 < name.size() && name[i + 1] == '%') ++i;
  }
  return out;
}

// Note [Checkpoint CRC]
// Every block's CRC is the standard CRC-32 (zlib's and Python's zlib.crc32), so tools outside
// trident can check a checkpoint. It is computed with ISA-L's crc32_gzip_refl, the same
// function at about 10 GB/s against zlib's 1-3 here (PCLMULQDQ folding): a save and a load
// pass every byte through it, and an async save's writer takes its time from the steps beside
// it (Note [Paced background writes]). tests/io/test_crc32.cpp checks it against a bitwise one.
uint32_t crc32_of(const void* data, size_t bytes) { return crc32_extend(0, data, bytes); }

uint32_t crc32_extend(uint32_t start, const void* data, size_t bytes) {
  if (bytes == 0) return start;
  return crc32_gzip_refl(start, static_cast<const unsigned char*>(data), bytes);
}

std::string hex32(uint32_t v) { return fmt::format("{:#010x}", v); }

Pacer::Pacer(double share, const std::atomic<bool>* hurry)
    : share_(share), last_(share < 1 ? thread_cpu_seconds() : 0), hurry_(hurry) {}

double Pacer::thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

void Pacer::pause() {
  if (share_ >= 1 || (hurry_ && hurry_->load())) return;
  const double worked = thread_cpu_seconds() - last_;
  // In slices, so that a hurry is noticed within 20 ms.
  using Clock = std::chrono::steady_clock;
  const Clock::time_point until =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(worked * (1 - share_) / share_));
  for (Clock::time_point now = Clock::now(); now < until && !(hurry_ && hurry_->load());
       now = Clock::now())
    std::this_thread::sleep_for(
        std::min<Clock::duration>(std::chrono::milliseconds(20), until - now));
  last_ = thread_cpu_seconds();
}

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

int64_t elements_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void silence_hdf5_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

namespace {

herr_t collect_error(unsigned /*n*/, const H5E_error2_t* err, void* client) {
  auto* lines = static_cast<std::vector<std::string>*>(client);
  if (!err->desc || !*err->desc) return 0;
  // One line: a message of the POSIX driver spans two ("time = ...\n, filename = ...").
  std::string desc(err->desc);
  std::replace(desc.begin(), desc.end(), '\n', ' ');
  lines->push_back(std::move(desc));
  return 0;
}

}  // namespace

// The stack is walked outermost first; the innermost entries say why (e.g. "truncated
// file: eof = ..."), the outer ones what was being done. Repeats are dropped.
std::string hdf5_error_text() {
  std::vector<std::string> lines;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error, &lines);
  std::vector<std::string> unique;
  for (auto& l : lines)
    if (std::find(unique.begin(), unique.end(), l) == unique.end()) unique.push_back(l);
  if (unique.empty()) return "no HDF5 error detail";
  if (unique.size() > 3) unique.resize(3);  // the innermost three say enough
  return fmt::format("{}", fmt::join(unique, "; "));
}

void h5_failed(const char* file, int line, const char* call, const std::string& what) {
  const std::string detail = hdf5_error_text();
  H5Eclear2(H5E_DEFAULT);
  const char* base = std::strrchr(file, '/');
  const std::string function(call, std::strcspn(call, "("));  // "H5Fopen", not its arguments
  throw Error(fmt::format("{}: {} failed: {} ({}:{})", what, function, detail,
                          base ? base + 1 : file, line),
              ExitCode::kInternal);
}

void H5Id::close(const std::string& what) {
  if (id_ < 0) return;
  const hid_t id = std::exchange(id_, -1);
  TRIDENT_H5(closer_(id), "closing {}", what);
}

namespace {

H5Id scalar_space() { return {TRIDENT_H5(H5Screate(H5S_SCALAR), "scalar dataspace"), H5Sclose}; }

H5Id vector_space(size_t n) {
  const hsize_t dims[1] = {n};
  return {TRIDENT_H5(H5Screate_simple(1, dims, nullptr), "dataspace of {}", n), H5Sclose};
}

H5Id string_type() {
  H5Id t{TRIDENT_H5(H5Tcopy(H5T_C_S1), "string type"), H5Tclose};
  TRIDENT_H5(H5Tset_size(t, H5T_VARIABLE), "string type size");
  TRIDENT_H5(H5Tset_cset(t, H5T_CSET_UTF8), "string type cset");
  return t;
}

void write_raw_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, hid_t space,
                    const void* buf) {
  H5Id a{TRIDENT_H5(H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT),
                    "creating attribute {}", name),
         H5Aclose};
  TRIDENT_H5(H5Awrite(a, mem_type, buf), "writing attribute {}", name);
  a.close(fmt::format("attribute {}", name));
}

H5Id open_attr(hid_t obj, const char* name) {
  return {TRIDENT_H5(H5Aopen(obj, name, H5P_DEFAULT), "opening attribute {}", name), H5Aclose};
}

size_t attr_elements(hid_t attr, const char* name) {
  H5Id space{TRIDENT_H5(H5Aget_space(attr), "dataspace of attribute {}", name), H5Sclose};
  return static_cast<size_t>(
      TRIDENT_H5(H5Sget_simple_extent_npoints(space), "size of attribute {}", name));
}

}  // namespace

void write_attr(hid_t obj, const char* name, int64_t value) {
  write_raw_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, scalar_space(), &value);
}

void write_attr(hid_t obj, const char* name, const std::vector<int64_t>& values) {
  write_raw_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, vector_space(values.size()),
                 values.data());
}

void write_attr(hid_t obj, const char* name, const std::vector<uint32_t>& values) {
  write_raw_attr(obj, name, H5T_STD_U32LE, H5T_NATIVE_UINT32, vector_space(values.size()),
                 values.data());
}

void write_attr(hid_t obj, const char* name, const std::string& value) {
  H5Id t = string_type();
  const char* p = value.c_str();
  write_raw_attr(obj, name, t, t, scalar_space(), &p);
}

void write_attr(hid_t obj, const char* name, const std::vector<std::string>& values) {
  H5Id t = string_type();
  std::vector<const char*> ptrs;
  for (const auto& v : values) ptrs.push_back(v.c_str());
  write_raw_attr(obj, name, t, t, vector_space(values.size()), ptrs.data());
}

bool has_attr(hid_t obj, const char* name) {
  return TRIDENT_H5(H5Aexists(obj, name), "looking for attribute {}", name) > 0;
}

int64_t read_attr_int(hid_t obj, const char* name) {
  std::vector<int64_t> v = read_attr_ints(obj, name);
  if (v.size() != 1)
    throw Error(fmt::format("attribute {} has {} values, expected 1", name, v.size()),
                ExitCode::kBadInput);
  return v[0];
}

std::vector<int64_t> read_attr_ints(hid_t obj, const char* name) {
  H5Id a = open_attr(obj, name);
  std::vector<int64_t> v(attr_elements(a, name));
  TRIDENT_H5(H5Aread(a, H5T_NATIVE_INT64, v.data()), "reading attribute {}", name);
  return v;
}

std::vector<uint32_t> read_attr_u32s(hid_t obj, const char* name) {
  H5Id a = open_attr(obj, name);
  std::vector<uint32_t> v(attr_elements(a, name));
  TRIDENT_H5(H5Aread(a, H5T_NATIVE_UINT32, v.data()), "reading attribute {}", name);
  return v;
}

std::vector<std::string> read_attr_strings(hid_t obj, const char* name) {
  H5Id a = open_attr(obj, name);
  H5Id space{TRIDENT_H5(H5Aget_space(a), "dataspace of attribute {}", name), H5Sclose};
  H5Id t = string_type();
  std::vector<char*> ptrs(attr_elements(a, name), nullptr);
  TRIDENT_H5(H5Aread(a, t, ptrs.data()), "reading attribute {}", name);
  std::vector<std::string> out;
  for (char* p : ptrs) out.emplace_back(p ? p : "");
  TRIDENT_H5(H5Dvlen_reclaim(t, space, H5P_DEFAULT, ptrs.data()), "freeing attribute {}", name);
  return out;
}

std::string read_attr_string(hid_t obj, const char* name) {
  std::vector<std::string> v = read_attr_strings(obj, name);
  if (v.size() != 1)
    throw Error(fmt::format("attribute {} has {} values, expected 1", name, v.size()),
                ExitCode::kBadInput);
  return v[0];
}

H5Id make_fapl() {
  H5Id fapl{TRIDENT_H5(H5Pcreate(H5P_FILE_ACCESS), "file access properties"), H5Pclose};
  TRIDENT_H5(H5Pset_fapl_sec2(fapl), "POSIX file driver");
  TRIDENT_H5(H5Pset_file_locking(fapl, true, true), "file locking properties");
  return fapl;
}

H5Id open_read_only(const std::string& path, const std::string& what) {
  H5Id fapl = make_fapl();
  return {TRIDENT_H5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), "opening {}", what), H5Fclose};
}

void wait_within(MPI_Request& request, MPI_Comm comm, double timeout_s, const char* op) {
  const auto start = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    int done = 0;
    TRIDENT_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeout_s) {
      int rank = 0, size = 1, length = 0;
      char name[MPI_MAX_OBJECT_NAME] = {};
      MPI_Comm_rank(comm, &rank);
      MPI_Comm_size(comm, &size);
      MPI_Comm_get_name(comm, name, &length);
      internal_error(__FILE__, __LINE__,
                     fmt::format("checkpoint: {} on communicator '{}' (rank {} of {}) did not "
                                 "complete within the timeout of {} s (comm.timeout_s): another "
                                 "rank stopped answering",
                                 op, name, rank, size, timeout_s));
    }
    // A few polls back to back (the others are usually there), then short sleeps.
    if (polls > 100) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void agree_or_throw(MPI_Comm comm, double timeout_s, const std::optional<Error>& local,
                    const std::string& others_prefix) {
  int rank = 0, size = 1;
  TRIDENT_MPI(MPI_Comm_rank(comm, &rank));
  TRIDENT_MPI(MPI_Comm_size(comm, &size));
  // [0]: size - rank of a failing rank (the max is the lowest failing rank), [1]: its exit code.
  int mine[2] = {local ? size - rank : 0, local ? static_cast<int>(local->code()) : 0};
  int all[2] = {0, 0};
  MPI_Request request = MPI_REQUEST_NULL;
  TRIDENT_MPI(MPI_Iallreduce(mine, all, 2, MPI_INT, MPI_MAX, comm, &request));
  wait_within(request, comm, timeout_s, "the all-reduce that agrees on failures");
  if (all[0] == 0) return;
  // Every rank throws the lowest failing rank's own message, so whichever rank reports it
  // (main prints one) names the file and what differs.
  const int root = size - all[0];
  std::string text = rank == root ? std::string(local->what()) : std::string();
  int length = static_cast<int>(text.size());
  TRIDENT_MPI(MPI_Ibcast(&length, 1, MPI_INT, root, comm, &request));
  wait_within(request, comm, timeout_s, "the broadcast of a failure's length");
  text.resize(static_cast<size_t>(length));
  TRIDENT_MPI(MPI_Ibcast(text.data(), length, MPI_CHAR, root, comm, &request));
  wait_within(request, comm, timeout_s, "the broadcast of a failure's message");
  if (local && rank == root) throw *local;
  throw Error(fmt::format("{} on rank {}: {}", others_prefix, root, text),
              static_cast<ExitCode>(all[1]));
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  if (fd < 0)
    throw Error(fmt::format("opening {} to sync it: {}", path, std::strerror(errno)),
                ExitCode::kBadInput);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0)
    throw Error(fmt::format("fsync of {}: {}", path, std::strerror(err)), ExitCode::kBadInput);
}

}  // namespace trident::ckpt
