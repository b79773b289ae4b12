// Reading sharded checkpoints: meta, finding `latest`, verification of the shards (split over
// the ranks) and loading through the index's virtual datasets, which is what lets a checkpoint
// saved in one layout load into any other (Note [Checkpoint layout on disk]).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "io/checkpoint_format.h"
#include "trident/checkpoint.h"

namespace trident {
namespace ckpt {
namespace fs = std::filesystem;
namespace {

// One mapping of a virtual dataset: a block of the global tensor and the shard dataset
// holding it.
struct Mapping {
  std::string file, dataset;
  std::vector<int64_t> start, count;
  uint32_t crc = 0;
};

struct IndexTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<Mapping> mappings;
};

struct Index {
  CheckpointMeta meta;
  int64_t num_shards = 0;
  std::vector<std::string> shard_files;
  std::vector<IndexTensor> tensors;
};

[[noreturn]] void bad_checkpoint(const std::string& ckpt, const std::string& what) {
  throw Error(fmt::format("checkpoint {}: {}", ckpt, what), ExitCode::kBadInput);
}

std::string index_path(const std::string& ckpt) { return (fs::path(ckpt) / kIndexFile).string(); }

herr_t collect_dataset(hid_t /*obj*/, const char* name, const H5O_info_t* info, void* out) {
  if (info->type == H5O_TYPE_DATASET) static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

std::string virtual_name(hid_t dcpl, size_t i, bool file) {
  auto get = [&](char* buf, size_t n) {
    return file ? H5Pget_virtual_filename(dcpl, i, buf, n)
                : H5Pget_virtual_dsetname(dcpl, i, buf, n);
  };
  const ssize_t n = TRIDENT_H5(get(nullptr, 0), "length of mapping {} source name", i);
  std::string s(static_cast<size_t>(n) + 1, '\0');
  TRIDENT_H5(get(s.data(), s.size()), "mapping {} source name", i);
  s.resize(static_cast<size_t>(n));
  return unescape_vds_name(s);
}

std::vector<int64_t> extent_of(hid_t space, const std::string& what) {
  const int ndim = TRIDENT_H5(H5Sget_simple_extent_ndims(space), "rank of {}", what);
  std::vector<hsize_t> dims(static_cast<size_t>(ndim));
  TRIDENT_H5(H5Sget_simple_extent_dims(space, dims.data(), nullptr), "shape of {}", what);
  return {dims.begin(), dims.end()};
}

CheckpointMeta read_meta_attrs(hid_t file) {
  CheckpointMeta m;
  m.format_version = static_cast<int>(read_attr_int(file, kAttrFormatVersion));
  m.step = read_attr_int(file, kAttrStep);
  m.run_id = read_attr_string(file, kAttrRunId);
  m.deck_yaml = read_attr_string(file, kAttrDeckYaml);
  m.world = static_cast<int>(read_attr_int(file, kAttrWorld));
  m.dp = static_cast<int>(read_attr_int(file, kAttrDp));
  m.tp = static_cast<int>(read_attr_int(file, kAttrTp));
  m.pp = static_cast<int>(read_attr_int(file, kAttrPp));
  return m;
}

// Opens index.h5 and checks it is a trident checkpoint this build can read; input errors
// name the checkpoint.
H5Id open_index(const std::string& ckpt) {
  const std::string path = index_path(ckpt);
  if (!fs::exists(path)) bad_checkpoint(ckpt, "no index.h5: not a checkpoint directory");
  H5Id file;
  try {
    file = open_read_only(path, kIndexFile);
    if (!has_attr(file, kAttrFormatVersion))
      bad_checkpoint(ckpt, "index.h5 has no format_version: not a trident checkpoint");
    const int64_t v = read_attr_int(file, kAttrFormatVersion);
    if (v < 1 || v > kCheckpointFormatVersion)
      bad_checkpoint(ckpt, fmt::format("format_version {}; this trident reads 1 to {}", v,
                                       kCheckpointFormatVersion));
  } catch (const Error& e) {
    if (e.code() == ExitCode::kBadInput) throw;
    bad_checkpoint(ckpt, fmt::format("index.h5: {}", e.what()));
  }
  return file;
}

Index read_index(const std::string& ckpt) {
  H5Id file = open_index(ckpt);
  Index idx;
  try {
    idx.meta = read_meta_attrs(file);
    idx.num_shards = read_attr_int(file, kAttrNumShards);
    idx.shard_files = read_attr_strings(file, kAttrShardFiles);
    std::vector<std::string> names;
    TRIDENT_H5(H5Ovisit2(file, H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &names, H5O_INFO_BASIC),
               "listing the datasets");
    for (const auto& name : names) {
      H5Id ds{TRIDENT_H5(H5Dopen2(file, name.c_str(), H5P_DEFAULT), "opening {}", name), H5Dclose};
      H5Id space{TRIDENT_H5(H5Dget_space(ds), "dataspace of {}", name), H5Sclose};
      H5Id dcpl{TRIDENT_H5(H5Dget_create_plist(ds), "properties of {}", name), H5Pclose};
      if (TRIDENT_H5(H5Pget_layout(dcpl), "layout of {}", name) != H5D_VIRTUAL)
        throw Error(fmt::format("{} is not a virtual dataset", name), ExitCode::kBadInput);
      IndexTensor t{name, extent_of(space, name), {}};
      size_t n = 0;
      TRIDENT_H5(H5Pget_virtual_count(dcpl, &n), "mappings of {}", name);
      const std::vector<uint32_t> crcs = read_attr_u32s(ds, kAttrSourceCrc32);
      if (crcs.size() != n)
        throw Error(fmt::format("{}: {} CRCs for {} mappings", name, crcs.size(), n),
                    ExitCode::kBadInput);
      for (size_t i = 0; i < n; ++i) {
        Mapping m{virtual_name(dcpl, i, true), virtual_name(dcpl, i, false), {}, {}, crcs[i]};
        H5Id vspace{TRIDENT_H5(H5Pget_virtual_vspace(dcpl, i), "mapping {} of {}", i, name),
                    H5Sclose};
        std::vector<hsize_t> lo(t.shape.size()), hi(t.shape.size());
        TRIDENT_H5(H5Sget_select_bounds(vspace, lo.data(), hi.data()), "bounds of {}", name);
        for (size_t d = 0; d < lo.size(); ++d) {
          m.start.push_back(static_cast<int64_t>(lo[d]));
          m.count.push_back(static_cast<int64_t>(hi[d] - lo[d] + 1));
        }
        t.mappings.push_back(std::move(m));
      }
      idx.tensors.push_back(std::move(t));
    }
  } catch (const Error& e) {
    bad_checkpoint(ckpt, fmt::format("index.h5: {}", e.what()));
  }
  return idx;
}

// What one shard must hold, from the index: dataset name -> (shape, CRC).
struct Expected {
  std::vector<int64_t> count;
  uint32_t crc = 0;
};

// Checks one shard file; returns what is wrong with it (empty when nothing is).
std::string check_shard(const std::string& ckpt, const Index& idx, int shard_rank,
                        const std::string& file, const std::map<std::string, Expected>& expected) {
  const std::string path = (fs::path(ckpt) / file).string();
  if (!fs::exists(path)) return "missing";
  H5Id f;
  try {
    f = open_read_only(path, file);
  } catch (const Error& e) {
    return fmt::format("not a readable HDF5 file (truncated or damaged): {}", e.what());
  }
  try {
    const int64_t step = read_attr_int(f, kAttrStep);
    const std::string run_id = read_attr_string(f, kAttrRunId);
    const int64_t version = read_attr_int(f, kAttrFormatVersion);
    const int64_t rank = read_attr_int(f, kAttrRank);
    if (run_id != idx.meta.run_id)
      return fmt::format("run_id '{}', the index's is '{}': a shard of another run", run_id,
                         idx.meta.run_id);
    if (step != idx.meta.step)
      return fmt::format("step {}, the index's is {}: a shard of another checkpoint", step,
                         idx.meta.step);
    if (version != idx.meta.format_version)
      return fmt::format("format_version {}, the index's is {}", version, idx.meta.format_version);
    if (rank != shard_rank)
      return fmt::format("written by rank {}, expected rank {}", rank, shard_rank);
  } catch (const Error& e) {
    return fmt::format("attributes: {}", e.what());
  }
  std::vector<float> buf;
  for (const auto& entry : expected) {
    // Named, not a structured binding: clang 14 (the fuzz build) cannot capture one in a lambda.
    const std::string& name = entry.first;
    const Expected& want = entry.second;
    try {
      H5Id ds{TRIDENT_H5(H5Dopen2(f, name.c_str(), H5P_DEFAULT), "opening dataset {}", name),
              H5Dclose};
      H5Id space{TRIDENT_H5(H5Dget_space(ds), "dataspace of {}", name), H5Sclose};
      const std::vector<int64_t> shape = extent_of(space, name);
      if (shape != want.count)
        return fmt::format("dataset {}: shape {}, expected {}", name, shape_str(shape),
                           shape_str(want.count));
      buf.resize(static_cast<size_t>(elements_of(shape)));
      TRIDENT_H5(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()),
                 "reading dataset {}", name);
      const uint32_t crc = crc32_of(buf.data(), buf.size() * sizeof(float));
      if (crc != want.crc)
        return fmt::format("dataset {}: CRC-32 {}, expected {}", name, hex32(crc), hex32(want.crc));
      const std::vector<uint32_t> own = read_attr_u32s(ds, kAttrCrc32);
      if (own.size() != 1 || own[0] != crc)
        return fmt::format("dataset {}: crc32 attribute {}, data {}", name,
                           own.empty() ? "missing" : hex32(own[0]), hex32(crc));
    } catch (const Error& e) {
      return fmt::format("dataset {}: {}", name, e.what());
    }
  }
  return {};
}

// Whether `name` (a path like params/h0.qkvw) names an object: H5Lexists must be asked one
// path component at a time.
bool object_exists(hid_t file, const std::string& name) {
  size_t pos = 0;
  while (true) {
    pos = name.find('/', pos + 1);
    const std::string prefix = name.substr(0, pos);
    if (TRIDENT_H5(H5Lexists(file, prefix.c_str(), H5P_DEFAULT), "looking for {}", prefix) <= 0)
      return false;
    if (pos == std::string::npos) return true;
  }
}

void load_tensors(const std::string& ckpt, const std::vector<ShardTensor>& tensors) {
  H5Id file = open_index(ckpt);
  // See Note [VDS source paths]: the shards are looked for next to index.h5.
  const std::string prefix = fs::absolute(ckpt).string();
  H5Id dapl{TRIDENT_H5(H5Pcreate(H5P_DATASET_ACCESS), "dataset access properties"), H5Pclose};
  TRIDENT_H5(H5Pset_virtual_prefix(dapl, prefix.c_str()), "VDS prefix {}", prefix);
  for (const auto& t : tensors) {
    if (!object_exists(file, t.name)) bad_checkpoint(ckpt, fmt::format("no tensor {}", t.name));
    H5Id ds{TRIDENT_H5(H5Dopen2(file, t.name.c_str(), dapl), "opening {} in {}", t.name, ckpt),
            H5Dclose};
    H5Id fspace{TRIDENT_H5(H5Dget_space(ds), "dataspace of {}", t.name), H5Sclose};
    const std::vector<int64_t> shape = extent_of(fspace, t.name);
    if (shape != t.global_shape)
      bad_checkpoint(ckpt, fmt::format("tensor {} has global shape {}, this run's is {}", t.name,
                                       shape_str(shape), shape_str(t.global_shape)));
    float* out = t.data;
    for (const auto& b : t.blocks) {
      TRIDENT_CHECK(b.start.size() == shape.size() && b.count.size() == shape.size(),
                    "tensor {}: block rank differs from its shape {}", t.name, shape_str(shape));
      for (size_t d = 0; d < shape.size(); ++d)
        TRIDENT_CHECK(b.start[d] >= 0 && b.count[d] >= 0 && b.start[d] + b.count[d] <= shape[d],
                      "tensor {}: block start {} count {} outside {}", t.name, shape_str(b.start),
                      shape_str(b.count), shape_str(shape));
      const auto n = static_cast<hsize_t>(elements_of(b.count));
      if (n == 0) continue;
      std::vector<hsize_t> start(b.start.begin(), b.start.end()),
          count(b.count.begin(), b.count.end());
      TRIDENT_H5(
          H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
          "selecting block {} of {}", shape_str(b.start), t.name);
      H5Id mspace{TRIDENT_H5(H5Screate_simple(1, &n, nullptr), "memory space"), H5Sclose};
      TRIDENT_H5(H5Dread(ds, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, out),
                 "reading block {} count {} of {} from {}", shape_str(b.start), shape_str(b.count),
                 t.name, ckpt);
      out += n;
    }
  }
}

std::string human_bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.1f} {}", v, units[u]);
}

}  // namespace
}  // namespace ckpt

std::string latest_checkpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path link = fs::path(dir) / ckpt::kLatestLink;
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(link, ec);
  if (ec || !fs::exists(st)) return "";
  if (!fs::is_symlink(st)) return link.string();  // a copy that turned the link into a directory
  const fs::path target = fs::read_symlink(link, ec);
  if (ec) return "";
  return (target.is_absolute() ? target : fs::path(dir) / target).lexically_normal().string();
}

std::string previous_checkpoint(const std::string& dir, const std::string& than) {
  namespace fs = std::filesystem;
  const int64_t limit = ckpt::step_of_dir_name(fs::path(than).filename().string());
  int64_t best = -1;
  fs::path found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const int64_t step = ckpt::step_of_dir_name(entry.path().filename().string());
    if (step >= 0 && step < limit && step > best && entry.is_directory(ec)) {
      best = step;
      found = entry.path();
    }
  }
  return found.string();
}

std::string resolve_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(path) / ckpt::kIndexFile)) return path;
  if (!fs::exists(path)) input_error("checkpoint {}: no such directory", path);
  const std::string latest = latest_checkpoint(path);
  if (latest.empty())
    input_error("checkpoint {}: neither a checkpoint (no index.h5) nor a checkpoint.dir (no "
                "latest link)",
                path);
  if (!fs::exists(fs::path(latest) / ckpt::kIndexFile))
    input_error("checkpoint.dir {}: latest points to {}, which is not a checkpoint", path, latest);
  return latest;
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  ckpt::silence_hdf5_errors();
  ckpt::H5Id file = ckpt::open_index(path);
  try {
    return ckpt::read_meta_attrs(file);
  } catch (const Error& e) {
    ckpt::bad_checkpoint(path, fmt::format("index.h5: {}", e.what()));
  }
}

void verify_checkpoint(const std::string& path, MPI_Comm comm, double timeout_s) {
  using namespace ckpt;
  silence_hdf5_errors();
  int rank = 0, size = 1;
  TRIDENT_MPI(MPI_Comm_rank(comm, &rank));
  TRIDENT_MPI(MPI_Comm_size(comm, &size));
  // Every rank reads the index itself (small), so a bad index fails on all ranks alike.
  auto local = attempt([&] {
    const Index idx = read_index(path);
    if (static_cast<int64_t>(idx.shard_files.size()) != idx.num_shards)
      bad_checkpoint(path, fmt::format("index.h5: num_shards {} but {} shard files", idx.num_shards,
                                       idx.shard_files.size()));
    std::map<std::string, std::map<std::string, Expected>> by_file;
    for (const auto& f : idx.shard_files) by_file[f];
    for (const auto& t : idx.tensors)
      for (const auto& m : t.mappings) {
        if (!by_file.count(m.file))
          bad_checkpoint(
              path, fmt::format("index.h5: {} maps to {}, not one of its shards", t.name, m.file));
        by_file[m.file][m.dataset] = Expected{m.count, m.crc};
      }
    std::vector<std::string> problems;
    for (size_t i = static_cast<size_t>(rank); i < idx.shard_files.size();
         i += static_cast<size_t>(size)) {
      const std::string& file = idx.shard_files[i];
      const std::string problem = check_shard(path, idx, static_cast<int>(i), file, by_file[file]);
      if (!problem.empty()) problems.push_back(fmt::format("{}: {}", file, problem));
    }
    if (!problems.empty()) bad_checkpoint(path, fmt::format("{}", fmt::join(problems, "; ")));
  });
  agree_or_throw(comm, timeout_s, local, fmt::format("checkpoint {}: verification failed", path));
}

void load_checkpoint(const std::string& path, const std::vector<ShardTensor>& tensors,
                     MPI_Comm comm, double timeout_s) {
  verify_checkpoint(path, comm, timeout_s);
  auto local = ckpt::attempt([&] { ckpt::load_tensors(path, tensors); });
  ckpt::agree_or_throw(comm, timeout_s, local, fmt::format("checkpoint {}: loading failed", path));
}

std::string describe_checkpoint(const std::string& path) {
  using namespace ckpt;
  silence_hdf5_errors();
  const Index idx = read_index(path);
  const CheckpointMeta& m = idx.meta;
  int64_t elements = 0;
  size_t width = 4;
  for (const auto& t : idx.tensors) {
    elements += elements_of(t.shape);
    width = std::max(width, t.name.size());
  }
  std::string out = fmt::format("checkpoint {}\n", path);
  out +=
      fmt::format("  format_version {}, step {}, run_id {}\n", m.format_version, m.step, m.run_id);
  out += fmt::format("  layout: world {} = dp {} x tp {} x pp {}, {} shards\n", m.world, m.dp, m.tp,
                     m.pp, idx.num_shards);
  out += fmt::format("  {} tensors, {} elements, {} (float32)\n", idx.tensors.size(), elements,
                     human_bytes(elements * 4));
  out += fmt::format("  {:<{}}  {:<16} {:>12} {:>12} {:>7}\n", "name", width, "shape", "elements",
                     "bytes", "blocks");
  for (const auto& t : idx.tensors)
    out += fmt::format("  {:<{}}  {:<16} {:>12} {:>12} {:>7}\n", t.name, width, shape_str(t.shape),
                       elements_of(t.shape), elements_of(t.shape) * 4, t.mappings.size());
  out += "  deck:\n";
  size_t pos = 0;
  while (pos < m.deck_yaml.size()) {
    const size_t nl = m.deck_yaml.find('\n', pos);
    out += "    " + m.deck_yaml.substr(pos, nl == std::string::npos ? nl : nl - pos) + "\n";
    pos = nl == std::string::npos ? m.deck_yaml.size() : nl + 1;
  }
  return out;
}

}  // namespace trident
