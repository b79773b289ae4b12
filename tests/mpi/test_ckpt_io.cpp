// Sharded HDF5 checkpoints: save in one layout, load in others; latest, keep, leftovers; every
// corruption makes every rank throw (the finding rank naming the file); the checkpoint.dir lock;
// h5py reading a global tensor through the index. Runs under mpirun with 2 and 4 ranks.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "io/checkpoint_format.h"
#include "trident/check.h"
#include "trident/checkpoint.h"

namespace trident {
namespace {

namespace fs = std::filesystem;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

void barrier() { MPI_Barrier(MPI_COMM_WORLD); }

// ---- tensors with known values: element i of tensor t saved with seed s is s*1e5 + t*1e4 + i
// (exact in float32 for the sizes and seeds used here) ----

struct TestTensor {
  std::string name;
  std::vector<int64_t> shape;
  int id;
};

std::vector<TestTensor> tensor_specs(int n) {
  return {{"params/rows", {3 * n + 1, 5}, 1},     // split by rows
          {"params/cols", {4, 2 * n + 3}, 2},     // split by columns
          {"params/h0.qkvw", {3 * 2 * n, 3}, 3},  // three row blocks per rank, like q|k|v
          {"params/repl", {7}, 4},                // replicated, one owner
          {"adam_m/cube", {2 * n, 3, 4}, 5}};     // 3-D, split along two dimensions
}

struct HostTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<ShardBlock> blocks;
  bool owner = false;
  std::vector<float> data;
};

float value_at(int seed, int id, int64_t flat) {
  return static_cast<float>(seed * 100000 + id * 10000 + flat);
}

// The values of `blocks` of a tensor, block after block, each in row-major order.
std::vector<float> block_values(const TestTensor& t, const std::vector<ShardBlock>& blocks,
                                int seed) {
  std::vector<float> out;
  const size_t nd = t.shape.size();
  for (const auto& b : blocks) {
    if (ckpt::elements_of(b.count) == 0) continue;
    std::vector<int64_t> idx(nd, 0);
    while (true) {
      int64_t flat = 0;
      for (size_t d = 0; d < nd; ++d) flat = flat * t.shape[d] + b.start[d] + idx[d];
      out.push_back(value_at(seed, t.id, flat));
      size_t d = nd;
      while (d > 0 && ++idx[d - 1] == b.count[d - 1]) idx[--d] = 0;
      if (d == 0) break;
    }
  }
  return out;
}

// Rows [lo, hi) of n split over `parts` as evenly as possible: the part'th piece.
std::pair<int64_t, int64_t> even_split(int64_t n, int parts, int part) {
  const int64_t base = n / parts, extra = n % parts;
  const int64_t lo = part * base + std::min<int64_t>(part, extra);
  return {lo, base + (part < extra ? 1 : 0)};
}

ShardBlock along(const std::vector<int64_t>& shape, size_t dim, int64_t lo, int64_t count) {
  ShardBlock b{std::vector<int64_t>(shape.size(), 0), shape};
  b.start[dim] = lo;
  b.count[dim] = count;
  return b;
}

ShardBlock split_block(const std::vector<int64_t>& shape, size_t dim, int parts, int part) {
  auto [lo, count] = even_split(shape[dim], parts, part);
  return along(shape, dim, lo, count);
}

enum class Layout { kSaved, kWhole, kTransposed, kReversed };

// Which blocks rank r of n holds of each tensor, and whether it owns them.
std::vector<ShardBlock> blocks_for(const TestTensor& t, Layout layout, int r, int n, bool* owner) {
  *owner = true;
  if (layout == Layout::kReversed) return blocks_for(t, Layout::kSaved, n - 1 - r, n, owner);
  if (layout == Layout::kWhole) {
    *owner = r == 0;
    return {ShardBlock{std::vector<int64_t>(t.shape.size(), 0), t.shape}};
  }
  const bool saved = layout == Layout::kSaved;
  switch (t.id) {
    case 1: return {split_block(t.shape, saved ? 0 : 1, n, r)};
    case 2: return {split_block(t.shape, saved ? 1 : 0, n, r)};
    case 3: {
      if (!saved) return {split_block(t.shape, 0, n, r)};  // contiguous rows instead
      const int64_t h = t.shape[0] / 3, per = h / n;
      std::vector<ShardBlock> bs;
      for (int k = 0; k < 3; ++k) bs.push_back(along(t.shape, 0, k * h + r * per, per));
      return bs;
    }
    case 4:
      *owner = r == n - 1;  // every rank holds it, the last one writes it
      return {ShardBlock{{0}, t.shape}};
    case 5: {
      if (!saved) return {split_block(t.shape, 1, n, r)};  // 3 rows over n ranks: some get none
      if (n % 2 != 0) return {split_block(t.shape, 0, n, r)};
      ShardBlock b = split_block(t.shape, 0, n / 2, r / 2);
      b.count[2] = 2;
      b.start[2] = 2 * (r % 2);
      return {b};
    }
  }
  return {};
}

// Rank r of n's tensors in `layout`; the shapes are those of the saving world, whatever n.
std::vector<HostTensor> make_tensors(Layout layout, int r, int n, int seed, bool fill) {
  std::vector<HostTensor> out;
  for (const auto& t : tensor_specs(world_size())) {
    HostTensor h{t.name, t.shape, {}, false, {}};
    h.blocks = blocks_for(t, layout, r, n, &h.owner);
    h.data = block_values(t, h.blocks, seed);
    if (!fill) std::fill(h.data.begin(), h.data.end(), -1.0f);
    out.push_back(std::move(h));
  }
  return out;
}

std::vector<ShardTensor> views(std::vector<HostTensor>& ts) {
  std::vector<ShardTensor> out;
  for (auto& t : ts) out.push_back({t.name, t.shape, t.blocks, t.data.data(), t.owner});
  return out;
}

CheckpointMeta meta_for(int64_t step, const std::string& run_id = "run-a") {
  CheckpointMeta m;
  m.step = step;
  m.run_id = run_id;
  m.deck_yaml = "model: {layers: 2}\ntrain: {steps: 100}\n";
  m.world = world_size();
  m.dp = world_size();
  return m;
}

std::string save(const fs::path& dir, int64_t step, int seed, int keep = 0,
                 const std::string& run_id = "run-a") {
  auto ts = make_tensors(Layout::kSaved, world_rank(), world_size(), seed, true);
  return save_checkpoint(dir.string(), meta_for(step, run_id), views(ts), keep, MPI_COMM_WORLD);
}

// Loads `path` into `layout` on comm and compares every element with what seed saved.
void expect_loads(const std::string& path, Layout layout, int seed,
                  MPI_Comm comm = MPI_COMM_WORLD) {
  int r = 0, n = 1;
  MPI_Comm_rank(comm, &r);
  MPI_Comm_size(comm, &n);
  auto ts = make_tensors(layout, r, n, seed, false);
  const auto specs = tensor_specs(world_size());
  load_checkpoint(path, views(ts), comm);
  for (size_t i = 0; i < ts.size(); ++i)
    EXPECT_EQ(ts[i].data, block_values(specs[i], ts[i].blocks, seed))
        << ts[i].name << " on rank " << r << " of " << n;
}

// ---- scratch directory shared by all ranks ----

class CheckpointIo : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string path;
    if (world_rank() == 0) {
      std::string tmpl = (fs::temp_directory_path() / "trident-ckpt-XXXXXX").string();
      ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
      path = tmpl;
    }
    int len = static_cast<int>(path.size());
    MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
    path.resize(static_cast<size_t>(len));
    MPI_Bcast(path.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD);
    scratch_ = path;
    dir_ = scratch_ / "ckpt";
  }
  void TearDown() override {
    barrier();
    if (world_rank() == 0) fs::remove_all(scratch_);
  }
  fs::path scratch_, dir_;
};

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST_F(CheckpointIo, LoadsIntoOtherLayouts) {
  const std::string path = save(dir_, 10, 10);
  EXPECT_EQ(path, (dir_ / "step_00000010").string());
  for (Layout l : {Layout::kSaved, Layout::kWhole, Layout::kTransposed, Layout::kReversed})
    expect_loads(path, l, 10);
  // One shard per rank and the index, nothing else.
  std::vector<std::string> want{"index.h5"};
  for (int r = 0; r < world_size(); ++r) want.push_back(ckpt::shard_file_name(r));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(entries(path), want);
}

TEST_F(CheckpointIo, LoadsOnFewerRanks) {
  const std::string path = save(dir_, 10, 10);
  MPI_Comm first = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &first);
  if (first != MPI_COMM_NULL) {
    expect_loads(path, Layout::kWhole, 10, first);
    expect_loads(path, Layout::kTransposed, 10, first);
    MPI_Comm_free(&first);
  }
}

TEST_F(CheckpointIo, IndexHoldsMetaAndGlobalTensors) {
  const std::string path = save(dir_, 10, 10);
  const CheckpointMeta m = read_checkpoint_meta(path);
  EXPECT_EQ(m.step, 10);
  EXPECT_EQ(m.run_id, "run-a");
  EXPECT_EQ(m.deck_yaml, meta_for(10).deck_yaml);
  EXPECT_EQ(m.world, world_size());
  EXPECT_EQ(m.dp, world_size());
  EXPECT_EQ(m.format_version, kCheckpointFormatVersion);
  const std::string text = describe_checkpoint(path);
  const int n = world_size();
  EXPECT_NE(text.find(fmt::format("params/h0.qkvw  [{}, 3]", 6 * n)), std::string::npos) << text;
  EXPECT_NE(text.find(fmt::format("{} shards", n)), std::string::npos) << text;
  EXPECT_NE(text.find("adam_m/cube"), std::string::npos) << text;
  EXPECT_NE(text.find("train: {steps: 100}"), std::string::npos) << text;
  if (world_rank() == 0) std::printf("%s", text.c_str());
  EXPECT_THROW(read_checkpoint_meta(dir_.string()), Error);  // the checkpoint.dir is not one
}

// Runs a command, returns its stdout (and whether it exited 0).
std::string run_command(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) {
    *status = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  *status = ::pclose(p);
  return out;
}

// h5py reads a global tensor by name through the index's virtual dataset, from working
// directories other than the checkpoint's (Note [VDS source paths]).
TEST_F(CheckpointIo, H5pyReadsGlobalTensorFromAnotherDirectory) {
  int have_h5py = 0;
  if (world_rank() == 0) {
    int st = 0;
    run_command("/usr/bin/python3 -c 'import h5py' 2>/dev/null", &st);
    have_h5py = st == 0;
  }
  MPI_Bcast(&have_h5py, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!have_h5py) GTEST_SKIP() << "no /usr/bin/python3 with h5py";
  const std::string path = save(dir_, 10, 10);
  if (world_rank() == 0) {
    fs::create_directories(scratch_ / "elsewhere");
    const std::string tool = std::string(TRIDENT_SOURCE_DIR) + "/tools/ckpt_read.py";
    const TestTensor qkv = tensor_specs(world_size())[2];
    const auto want = block_values(qkv, {ShardBlock{{0, 0}, qkv.shape}}, 10);
    // (working directory, checkpoint argument): relative with .., absolute, a checkpoint.dir.
    const std::vector<std::pair<fs::path, std::string>> cases{
        {scratch_ / "elsewhere", "../ckpt/step_00000010"}, {"/", path}, {scratch_, "ckpt"}};
    for (const auto& [cwd, arg] : cases) {
      int st = 0;
      const std::string out =
          run_command(fmt::format("cd '{}' && env -u HDF5_VDS_PREFIX /usr/bin/python3 '{}' '{}' "
                                  "params/h0.qkvw --all 2>&1",
                                  cwd.string(), tool, arg),
                      &st);
      ASSERT_EQ(st, 0) << out;
      std::istringstream lines(out);
      std::string line, shape, nan, values;
      while (std::getline(lines, line)) {
        if (line.rfind("shape ", 0) == 0) shape = line.substr(6);
        if (line.rfind("nan ", 0) == 0) nan = line.substr(4);
        if (line.rfind("values ", 0) == 0) values = line.substr(7);
      }
      EXPECT_EQ(shape, fmt::format("{} {}", qkv.shape[0], qkv.shape[1])) << out;
      EXPECT_EQ(nan, "0") << "regions read as the fill value: shards not found from " << cwd;
      std::istringstream vs(values);
      std::vector<float> got;
      for (double v; vs >> v;) got.push_back(static_cast<float>(v));
      EXPECT_EQ(got, want) << "from " << cwd << " with " << arg;
    }
  }
}

TEST_F(CheckpointIo, LatestSwitchesAndKeepPrunes) {
  EXPECT_EQ(latest_checkpoint(dir_.string()), "");
  EXPECT_THROW(resolve_checkpoint(dir_.string()), Error);
  barrier();
  for (int step : {10, 20, 30, 40}) {
    const std::string path = save(dir_, step, step, /*keep=*/2);
    EXPECT_EQ(latest_checkpoint(dir_.string()), path);
    EXPECT_EQ(resolve_checkpoint(dir_.string()), path);
    EXPECT_EQ(fs::read_symlink(dir_ / "latest"), fs::path(ckpt::step_dir_name(step)));
  }
  EXPECT_EQ(entries(dir_), (std::vector<std::string>{"latest", "step_00000030", "step_00000040"}));
  const std::string step30 = (dir_ / "step_00000030").string();
  EXPECT_EQ(resolve_checkpoint(step30), step30);
  EXPECT_EQ(read_checkpoint_meta(resolve_checkpoint(dir_.string())).step, 40);
  expect_loads(step30, Layout::kTransposed, 30);
  expect_loads(resolve_checkpoint(dir_.string()), Layout::kWhole, 40);
}

// A checkpoint.dir relative to the working directory, spelled with ./ and a trailing slash.
TEST_F(CheckpointIo, RelativeDirectory) {
  const fs::path cwd = fs::current_path();
  fs::current_path(scratch_);
  const std::string path = save("./rel/ckpt/", 10, 10);
  EXPECT_EQ(path, "rel/ckpt/step_00000010");
  EXPECT_EQ(latest_checkpoint("./rel/ckpt/"), path);
  EXPECT_EQ(resolve_checkpoint("rel/ckpt"), "rel/ckpt/step_00000010");
  expect_loads(resolve_checkpoint("rel/ckpt"), Layout::kTransposed, 10);
  barrier();
  fs::current_path(cwd);
}

// A save killed in the middle leaves step_X.tmp behind: latest stays on the previous
// checkpoint, which loads; the next save of that step replaces the leftover, other steps'
// leftovers are pruned, and saving an existing step again swaps it in whole.
TEST_F(CheckpointIo, LeftoverTmpKeepsPreviousCheckpoint) {
  const std::string step10 = save(dir_, 10, 10);
  if (world_rank() == 0) {
    for (const char* name : {"step_00000020.tmp", "step_00000015.tmp"}) {
      fs::create_directories(dir_ / name);
      std::ofstream(dir_ / name / "shard_r00000.h5") << "half a shard";
      std::ofstream(dir_ / name / "index.h5") << "not hdf5";
    }
  }
  barrier();
  EXPECT_EQ(latest_checkpoint(dir_.string()), step10);
  expect_loads(resolve_checkpoint(dir_.string()), Layout::kReversed, 10);
  barrier();
  const std::string step20 = save(dir_, 20, 20);
  EXPECT_EQ(entries(dir_), (std::vector<std::string>{"latest", "step_00000010", "step_00000020"}));
  expect_loads(resolve_checkpoint(dir_.string()), Layout::kWhole, 20);
  barrier();
  EXPECT_EQ(save(dir_, 20, 21), step20);  // the same step again, other values
  EXPECT_EQ(entries(dir_), (std::vector<std::string>{"latest", "step_00000010", "step_00000020"}));
  expect_loads(latest_checkpoint(dir_.string()), Layout::kSaved, 21);
}

// ---- corruptions: every rank throws input_error, the one that checked the file names it ----

// Shard k is checked by rank k % size.
void expect_rejected(const std::string& path, int shard, const std::vector<std::string>& needles) {
  const int finder = shard % world_size();
  for (int pass = 0; pass < 2; ++pass) {
    try {
      if (pass == 0) {
        verify_checkpoint(path, MPI_COMM_WORLD);
      } else {
        auto ts = make_tensors(Layout::kWhole, world_rank(), world_size(), 0, false);
        load_checkpoint(path, views(ts), MPI_COMM_WORLD);
      }
      ADD_FAILURE() << "no error on rank " << world_rank() << (pass ? " (load)" : " (verify)");
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(e.code(), ExitCode::kBadInput) << msg;
      if (world_rank() == finder) {
        EXPECT_NE(msg.find("checkpoint " + path + ": "), std::string::npos) << msg;
        EXPECT_NE(msg.find(ckpt::shard_file_name(shard) + ": "), std::string::npos) << msg;
        for (const auto& needle : needles) EXPECT_NE(msg.find(needle), std::string::npos) << msg;
        if (pass == 0) std::printf("rank %d: %s\n", world_rank(), msg.c_str());
      } else {
        // The others carry the finder's message too, so whichever rank reports names the file.
        EXPECT_EQ(
            msg.rfind(fmt::format("checkpoint {}: verification failed on rank {}: ", path, finder),
                      0),
            0u)
            << msg;
        EXPECT_NE(msg.find(ckpt::shard_file_name(shard) + ": "), std::string::npos) << msg;
      }
    }
  }
}

std::string shard_path(const std::string& ckpt, int shard) {
  return (fs::path(ckpt) / ckpt::shard_file_name(shard)).string();
}

TEST_F(CheckpointIo, FlippedByteIsFound) {
  const std::string path = save(dir_, 10, 10);
  const int shard = world_size() - 1;
  const TestTensor rows = tensor_specs(world_size())[0];
  bool owner = false;
  const auto original =
      block_values(rows, blocks_for(rows, Layout::kSaved, shard, world_size(), &owner), 10);
  if (world_rank() == 0) {
    hid_t f = H5Fopen(shard_path(path, shard).c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "params/rows/0", H5P_DEFAULT);
    const haddr_t offset = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
    ASSERT_NE(offset, HADDR_UNDEF);
    std::fstream io(shard_path(path, shard), std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(offset + 6));
    char c = 0;
    io.get(c);
    io.seekp(static_cast<std::streamoff>(offset + 6));
    io.put(static_cast<char>(c ^ 0x10));
  }
  barrier();
  const uint32_t crc = ckpt::crc32_of(original.data(), original.size() * sizeof(float));
  expect_rejected(path, shard,
                  {"dataset params/rows/0: CRC-32 0x", "expected " + ckpt::hex32(crc)});
}

TEST_F(CheckpointIo, TruncatedShardIsFound) {
  const std::string path = save(dir_, 10, 10);
  const int shard = world_size() - 1;
  if (world_rank() == 0)
    fs::resize_file(shard_path(path, shard), fs::file_size(shard_path(path, shard)) / 2);
  barrier();
  expect_rejected(path, shard, {"not a readable HDF5 file", "truncated"});
}

TEST_F(CheckpointIo, MissingShardIsFound) {
  const std::string path = save(dir_, 10, 10);
  if (world_rank() == 0) fs::remove(shard_path(path, 0));
  barrier();
  expect_rejected(path, 0, {"shard_r00000.h5: missing"});
}

TEST_F(CheckpointIo, ShardOfAnotherStepIsFound) {
  const std::string step10 = save(dir_, 10, 10);
  const std::string step20 = save(dir_, 20, 20);
  const int shard = world_size() - 1;
  if (world_rank() == 0)
    fs::copy_file(shard_path(step10, shard), shard_path(step20, shard),
                  fs::copy_options::overwrite_existing);
  barrier();
  expect_rejected(step20, shard, {"step 10, the index's is 20"});
  expect_loads(step10, Layout::kWhole, 10);  // the other one is untouched
}

TEST_F(CheckpointIo, ShardOfAnotherRunIsFound) {
  const std::string a = save(dir_, 10, 10, 0, "run-a");
  const std::string b = save(scratch_ / "other", 10, 11, 0, "run-b");
  const int shard = world_size() - 1;
  if (world_rank() == 0)
    fs::copy_file(shard_path(b, shard), shard_path(a, shard), fs::copy_options::overwrite_existing);
  barrier();
  expect_rejected(a, shard, {"run_id 'run-b', the index's is 'run-a'"});
}

// Load errors found on one rank (a tensor it alone asks for) still stop every rank.
TEST_F(CheckpointIo, LoadNamesMissingTensorAndWrongShape) {
  const std::string path = save(dir_, 10, 10);
  const int last = world_size() - 1;
  for (int pass = 0; pass < 2; ++pass) {
    auto ts = make_tensors(Layout::kSaved, world_rank(), world_size(), 10, false);
    std::vector<float> extra(4);
    auto v = views(ts);
    if (world_rank() == last && pass == 0)
      v.push_back({"params/nope", {4}, {ShardBlock{{0}, {4}}}, extra.data()});
    if (world_rank() == last && pass == 1) v[0].global_shape[1] += 1;
    try {
      load_checkpoint(path, v, MPI_COMM_WORLD);
      ADD_FAILURE() << "no error on rank " << world_rank();
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(e.code(), ExitCode::kBadInput) << msg;
      if (world_rank() == last)
        EXPECT_NE(
            msg.find(pass == 0 ? "no tensor params/nope" : "tensor params/rows has global shape"),
            std::string::npos)
            << msg;
      else
        EXPECT_EQ(
            msg.rfind(fmt::format("checkpoint {}: loading failed on rank {}: ", path, last), 0), 0u)
            << msg;
    }
  }
}

// A layout bug (two owners of one element) stops every rank and publishes nothing.
TEST_F(CheckpointIo, SaveRejectsTwoOwnersOnEveryRank) {
  auto ts = make_tensors(Layout::kSaved, world_rank(), world_size(), 10, true);
  for (auto& t : ts)
    if (t.name == "params/repl") t.owner = true;
  try {
    save_checkpoint(dir_.string(), meta_for(10), views(ts), 0, MPI_COMM_WORLD);
    ADD_FAILURE() << "no error on rank " << world_rank();
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (world_rank() == 0)
      EXPECT_NE(msg.find("checkpoint tensor params/repl: more than one owner"), std::string::npos)
          << msg;
    else
      EXPECT_NE(msg.find("checkpoint save to " + (dir_ / "step_00000010").string() +
                         ": failed on rank 0"),
                std::string::npos)
          << msg;
  }
  EXPECT_EQ(latest_checkpoint(dir_.string()), "");
  barrier();
  save(dir_, 10, 10);  // the leftover step_00000010.tmp does not get in the way
  expect_loads(latest_checkpoint(dir_.string()), Layout::kWhole, 10);
}

TEST_F(CheckpointIo, DirLockIsExclusive) {
  const fs::path dir = scratch_ / fmt::format("locked_r{}", world_rank());
  {
    CheckpointDirLock lock(dir.string());
    try {
      CheckpointDirLock second(dir.string());  // another open file description: conflicts
      ADD_FAILURE() << "second lock granted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::kBadInput);
      EXPECT_EQ(std::string(e.what()), fmt::format("checkpoint.dir {} is in use by another run "
                                                   "(pid {})",
                                                   dir.string(), ::getpid()));
    }
    // Another process (flock(1)) cannot take it either.
    if (std::system("command -v flock >/dev/null 2>&1") == 0)
      EXPECT_NE(std::system(fmt::format("flock -n '{}/.lock' true", dir.string()).c_str()), 0);
  }
  CheckpointDirLock again(dir.string());  // released with the first
  if (std::system("command -v flock >/dev/null 2>&1") == 0)
    EXPECT_NE(std::system(fmt::format("flock -n '{}/.lock' true", dir.string()).c_str()), 0);
}

}  // namespace
}  // namespace trident
