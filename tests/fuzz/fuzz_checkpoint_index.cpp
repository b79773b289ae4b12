// The checkpoint reader: index.h5's metadata and mappings, and the shards' checks.
//
// HDF5's own parsing of arbitrary bytes is HDF5's to fuzz; what trident adds on top is the
// meaning of what a well-formed file says. So each input is a list of edits, decoded with
// fuzz::Bytes, applied to a copy of a small valid checkpoint saved at start:
// attributes set to other values, types or shapes, or deleted; shard names and CRC lists
// replaced; a shard's data bytes flipped, the shard truncated or removed. Then
// read_checkpoint_meta, describe_checkpoint, verify_checkpoint and load_checkpoint run on it
// (MPI_COMM_SELF), under the contract in fuzz_support.h. A checkpoint that still loads must
// give the saved values back, unless its data bytes were edited (then the CRC must refuse it).
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <vector>

#include "fuzz_support.h"
#include "io/checkpoint_format.h"
#include "trident/checkpoint.h"

namespace {

namespace fs = std::filesystem;
using namespace trident;

constexpr const char* kIntAttrs[] = {"format_version", "step", "world", "dp", "tp", "pp",
                                     "num_shards"};
constexpr const char* kStringAttrs[] = {"run_id", "deck_yaml"};
constexpr const char* kTensors[] = {"params/a", "adam_m/b"};

// The saved tensors: a [4, 3] one in one block and a [5] one in two blocks.
std::vector<float> a_values(12), b_values(5);

std::vector<ShardTensor> tensors(float* a, float* b) {
  return {ShardTensor{"params/a", {4, 3}, {ShardBlock{{0, 0}, {4, 3}}}, a, true},
          ShardTensor{"adam_m/b", {5}, {ShardBlock{{0}, {2}}, ShardBlock{{2}, {3}}}, b, true}};
}

struct Dirs {
  fs::path root, saved, work;
};

const Dirs& dirs() {
  static const Dirs d = [] {
    const char* tmp = std::getenv("TMPDIR");
    Dirs d;
    d.root =
        fs::path(tmp && *tmp ? tmp : "/tmp") / ("trident-fuzz-ckpt-" + std::to_string(getpid()));
    fs::remove_all(d.root);
    for (size_t i = 0; i < a_values.size(); ++i) a_values[i] = 0.5f * float(i);
    for (size_t i = 0; i < b_values.size(); ++i) b_values[i] = -1.0f - float(i);
    CheckpointMeta meta;
    meta.step = 7;
    meta.run_id = "fuzz";
    meta.deck_yaml = "model:\n  layers: 1\n";
    d.saved = save_checkpoint((d.root / "saved").string(), meta,
                              tensors(a_values.data(), b_values.data()), 1, MPI_COMM_SELF);
    d.work = d.root / "work";
    return d;
  }();
  return d;
}

void delete_attr(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) > 0) H5Adelete(obj, name);
}

// Offset of a contiguous dataset's bytes in its file, or -1.
int64_t data_offset(const fs::path& shard, const std::string& dataset) {
  hid_t f = H5Fopen(shard.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return -1;
  int64_t at = -1;
  hid_t ds = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  if (ds >= 0) {
    const haddr_t off = H5Dget_offset(ds);
    if (off != HADDR_UNDEF) at = static_cast<int64_t>(off);
    H5Dclose(ds);
  }
  H5Fclose(f);
  return at;
}

// Applies the edits; returns true if the shard's data bytes end up changed (flips that cancel
// out, or a truncation to the same size, change nothing).
bool apply_edits(fuzz::Bytes& in, const fs::path& ckpt) {
  const fs::path index = ckpt / "index.h5", shard = ckpt / "shard_r00000.h5";
  bool data_changed = false;
  std::map<int64_t, uint8_t> flipped;  // file offset -> accumulated XOR mask
  const int n = in.take_int<int>(1, 8);
  for (int e = 0; e < n && in.left() > 0; ++e) {
    const int op = in.take_int<int>(0, 9);
    if (op <= 6) {  // edits of index.h5's attributes
      hid_t f = H5Fopen(index.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
      if (f < 0) break;  // index.h5 does not open: no more edits
      hid_t obj = f;
      const char* tensor = kTensors[in.take_int<int>(0, 1)];
      const char* name = kIntAttrs[in.take_int<int>(0, 6)];
      try {
        switch (op) {
          case 0:
            delete_attr(f, name);
            ckpt::write_attr(f, name, in.take<int64_t>());
            break;
          case 1: {
            std::vector<int64_t> v(in.take_int<int>(1, 3));  // HDF5 writes no empty attribute
            for (auto& x : v) x = in.take<int64_t>();
            delete_attr(f, name);
            ckpt::write_attr(f, name, v);
            break;
          }
          case 2:
            delete_attr(f, name);
            ckpt::write_attr(f, name, in.take_string(16));
            break;
          case 3: {
            const char* s = kStringAttrs[in.take_int<int>(0, 1)];
            delete_attr(f, s);
            if (in.take_bool()) ckpt::write_attr(f, s, in.take_string(64));
            else ckpt::write_attr(f, s, in.take<int64_t>());
            break;
          }
          case 4: {
            std::vector<std::string> names(in.take_int<int>(1, 3));
            for (auto& s : names)
              s = in.take_bool() ? std::string("shard_r00000.h5") : in.take_string(24);
            delete_attr(f, "shard_files");
            ckpt::write_attr(f, "shard_files", names);
            break;
          }
          case 5:
            delete_attr(f, in.take_bool() ? name : kStringAttrs[in.take_int<int>(0, 1)]);
            break;
          case 6: {
            obj = H5Dopen2(f, tensor, H5P_DEFAULT);
            if (obj < 0) break;
            std::vector<uint32_t> crcs(in.take_int<int>(1, 3));
            for (auto& c : crcs) c = in.take<uint32_t>();
            delete_attr(obj, "source_crc32");
            ckpt::write_attr(obj, "source_crc32", crcs);
            H5Dclose(obj);
            break;
          }
        }
      } catch (const Error& err) {
        fuzz::finding("the harness could not edit index.h5", err.what());
      }
      H5Fclose(f);
    } else if (op == 7) {  // flip bytes inside one block's data
      const std::string block = std::string(kTensors[in.take_int<int>(0, 1)]) + "/0";
      const int64_t at = data_offset(shard, block);
      if (at < 0) continue;
      const int64_t pos = at + in.take_int<int64_t>(0, 7);
      const uint8_t mask = in.take_int<uint8_t>(1, 255);
      FILE* fp = std::fopen(shard.c_str(), "r+b");
      if (!fp) continue;
      std::fseek(fp, pos, SEEK_SET);
      const int c = std::fgetc(fp);
      std::fseek(fp, pos, SEEK_SET);
      std::fputc(c ^ mask, fp);
      std::fclose(fp);
      flipped[pos] ^= mask;
    } else if (op == 8) {  // truncate the shard
      std::error_code ec;
      const auto size = fs::file_size(shard, ec);
      if (ec) continue;
      const uintmax_t to = in.take_int<uintmax_t>(0, size);
      fs::resize_file(shard, to, ec);
      if (to < size) data_changed = true;
    } else {
      fs::remove(shard);
      data_changed = true;
    }
  }
  for (const auto& [pos, mask] : flipped) data_changed |= mask != 0;
  return data_changed;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  MPI_Init(argc, argv);
  ckpt::silence_hdf5_errors();
  (void)dirs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Dirs& d = dirs();
  fs::remove_all(d.work);
  fs::copy(d.saved, d.work, fs::copy_options::recursive);
  fuzz::Bytes in(data, size);
  const bool data_changed = apply_edits(in, d.work);

  const std::string ckpt = d.work.string();
  fuzz::accepts([&] { (void)read_checkpoint_meta(ckpt); });
  fuzz::accepts([&] { (void)describe_checkpoint(ckpt); });
  std::vector<float> a(a_values.size(), 9.0f), b(b_values.size(), 9.0f);
  const bool loaded =
      fuzz::accepts([&] { load_checkpoint(ckpt, tensors(a.data(), b.data()), MPI_COMM_SELF); });
  if (loaded && data_changed) fuzz::finding("a checkpoint whose data bytes changed loaded", ckpt);
  if (loaded && (a != a_values || b != b_values))
    fuzz::finding("a checkpoint loaded other values than were saved", ckpt);
  return 0;
}
