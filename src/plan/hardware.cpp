// Hardware descriptions: reading and checking inputs/hardware/*.yaml, finding one by name,
// writing one back (Note [Hardware files]), and the achieved GEMM rate they describe.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <string_view>
#include <system_error>

#include "core/text.h"
#include "trident/check.h"
#include "trident/plan.h"

namespace trident {

// Note [Hardware files]
// One YAML file describes one kind of node: what a device (a GPU, or a CPU core) computes and
// moves per second, as a training step sees it; `sources:` says where each figure comes from
// (a vendor, a publication, `trident plan --calibrate`). Unknown keys, wrong types and values out
// of range are refused (exit 2) with one message that starts with "file:line:" and names the
// key, so a typo cannot silently mean a default. GB is 10⁹ bytes, as vendors and nccl-tests say.
//
// The keys, all at the top level:
//   name                 string, required    what `trident plan` prints; usually the file stem
//   kind                 gpu | cpu, required  cpu: a device is one core
//   devices_per_node     integer ≥ 1, req.   GPUs per node, or cores per node
//   dtype                bf16 | fp32, req.   what trident computes in on it (bf16: mixed)
//   peak_tflops          > 0, required       dense peak per device at dtype: MFU's denominator
//   gemm                 list, required      achieved GEMM rate by size, per device:
//                                              [{min_dim: integer ≥ 1, tflops: > 0}, ...],
//                                              at least one point, min_dim strictly ascending,
//                                              no tflops above peak_tflops; min_dim is the
//                                              smallest of M, N, K (gemm_flops_per_s)
//   attention_tflops     ≥ 0, default 0      a fused attention kernel's achieved rate (forward
//                                              and backward); 0: attention runs as its GEMMs
//                                              plus the softmax's memory traffic
//   memory_gbytes_per_s  > 0, required       achieved memory bandwidth per device (cpu: node)
//   memory_gb            > 0, required       memory capacity per device (cpu: node)
//   intra_node           map, required       {gbytes_per_s: > 0, latency_us: ≥ 0}: NVLink /
//                                              shared memory
//   inter_node           map, required       the same for the network, per device
//   overlap_slowdown     in [0, 1), default 0  fraction by which compute slows while a
//                                              collective overlaps it
//   tp_overlap_slowdown  in [0, 1), default: overlap_slowdown  the same under tp collectives
//   core_scaling         in (0, 1], default 1  cpu: a core's share of its single-thread GEMM
//                                              rate when all the node's cores compute at once
//   elementwise_gbytes_per_s ≥ 0, default 0  the elementwise kernels' rate (cpu: per core);
//                                              0: memory_gbytes_per_s
//   optimizer_gbytes_per_s ≥ 0, default 0    AdamW's rate at 32 B per parameter (cpu: per
//                                              core); 0: memory_gbytes_per_s
//   compute_efficiency   in (0, 2], default 1  the per-op terms / measured forward + backward
//                                              (above 1: the terms' rates were measured low)
//   cross_entropy_forward_bytes, cross_entropy_backward_bytes  ≥ 0, default 0  the loss's
//                                              traffic per logit (Hardware); 0: trident's own
//   thread_scaling       in (0, 1], default 1  cpu: one rank's GEMM rate with a thread on
//                                              every core / (cores × one thread's rate)
//   host_copy_gbytes_per_s ≥ 0, default 0    a checkpoint snapshot's copy to host memory,
//                                              bytes copied: gpu: pinned device-to-host per
//                                              device, the node's devices at once; cpu: one
//                                              thread's memcpy. 0: unknown (gpu), half of
//                                              memory_gbytes_per_s (cpu)
//   host_copy_path       string, optional    what that copy crosses, as printed
//   host_memory_gb       ≥ 0, default 0      gpu: host memory per node (pinned snapshots);
//                                              0: unknown; cpu: not read (memory_gb is it)
//   sources              list of strings, required, not empty: where each figure comes from
// A link's gbytes_per_s is the achieved ring bus bandwidth per device in one direction, what
// nccl-tests calls busbw (algbw · 2(n−1)/n for all-reduce); latency_us is the cost of one ring
// hop, so a ring all-reduce of B bytes on n devices takes 2(n−1)/n · B / bw + 2(n−1) · latency,
// the formula of emulated_link_seconds (trident/comm.h).

namespace {

constexpr std::string_view kTopKeys[] = {"name",
                                         "kind",
                                         "devices_per_node",
                                         "dtype",
                                         "peak_tflops",
                                         "gemm",
                                         "attention_tflops",
                                         "memory_gbytes_per_s",
                                         "memory_gb",
                                         "intra_node",
                                         "inter_node",
                                         "overlap_slowdown",
                                         "tp_overlap_slowdown",
                                         "core_scaling",
                                         "thread_scaling",
                                         "elementwise_gbytes_per_s",
                                         "optimizer_gbytes_per_s",
                                         "compute_efficiency",
                                         "cross_entropy_forward_bytes",
                                         "cross_entropy_backward_bytes",
                                         "host_copy_gbytes_per_s",
                                         "host_copy_path",
                                         "host_memory_gb",
                                         "sources"};
constexpr std::string_view kLinkKeys[] = {"gbytes_per_s", "latency_us"};
constexpr std::string_view kGemmKeys[] = {"min_dim", "tflops"};

// Reads one file's nodes; every message starts with "path:line:" and names the key.
class HardwareReader {
 public:
  explicit HardwareReader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const YAML::Node& node, std::string_view key,
                         std::string_view what) const {
    const YAML::Mark mark = node.Mark();
    const std::string where = mark.is_null() ? path_ : fmt::format("{}:{}", path_, mark.line + 1);
    input_error("{}: {} {}", where, key, what);
  }

  // Refuses keys not in `known`, naming the closest known one.
  template <size_t N>
  void check_keys(const YAML::Node& map, std::string_view prefix,
                  const std::string_view (&known)[N]) const {
    for (const auto& entry : map) {
      const std::string key = entry.first.Scalar();
      if (std::find(std::begin(known), std::end(known), key) != std::end(known)) continue;
      std::string hint;
      int best = 3;
      for (std::string_view k : known) {
        const int d = edit_distance(key, k);
        if (d < best) best = d, hint = fmt::format(" (did you mean '{}{}'?)", prefix, k);
      }
      std::string listing;
      for (std::string_view k : known)
        listing += fmt::format("{}{}", listing.empty() ? "" : ", ", k);
      fail(entry.first, fmt::format("{}{}", prefix, key),
           fmt::format("is not a hardware key{}; known: {}", hint, listing));
    }
  }

  YAML::Node required(const YAML::Node& map, std::string_view prefix, std::string_view key) const {
    YAML::Node node = map[std::string(key)];
    if (!node) fail(map, fmt::format("{}{}", prefix, key), "is missing (required)");
    return node;
  }

  std::string text(const YAML::Node& node, std::string_view key) const {
    if (!node.IsScalar() || node.Scalar().empty()) fail(node, key, "must be a non-empty string");
    return node.Scalar();
  }

  std::string one_of(const YAML::Node& node, std::string_view key,
                     std::initializer_list<std::string_view> allowed) const {
    const std::string value = text(node, key);
    std::string listing;
    for (std::string_view a : allowed) {
      if (value == a) return value;
      listing += fmt::format("{}{}", listing.empty() ? "" : " | ", a);
    }
    fail(node, key, fmt::format("must be one of {}, got '{}'", listing, value));
  }

  double number(const YAML::Node& node, std::string_view key) const {
    double value = 0;
    if (!node.IsScalar() || !YAML::convert<double>::decode(node, value) || !std::isfinite(value))
      fail(node, key, fmt::format("must be a finite number, got '{}'", describe(node)));
    return value;
  }

  int integer(const YAML::Node& node, std::string_view key) const {
    int value = 0;
    if (!node.IsScalar() || !YAML::convert<int>::decode(node, value))
      fail(node, key, fmt::format("must be an integer, got '{}'", describe(node)));
    return value;
  }

  double positive(const YAML::Node& node, std::string_view key) const {
    const double v = number(node, key);
    if (v <= 0) fail(node, key, fmt::format("must be > 0, got {}", v));
    return v;
  }

  // A number in an interval, "[0, 1)" style; refused with the interval in the message.
  double in_range(const YAML::Node& node, std::string_view key, double lo, bool lo_closed,
                  double hi, bool hi_closed) const {
    const double v = number(node, key);
    if (!((lo_closed ? v >= lo : v > lo) && (hi_closed ? v <= hi : v < hi)))
      fail(node, key,
           fmt::format("must be in {}{}, {}{}, got {}", lo_closed ? "[" : "(", lo, hi,
                       hi_closed ? "]" : ")", v));
    return v;
  }

  double non_negative(const YAML::Node& node, std::string_view key) const {
    const double v = number(node, key);
    if (v < 0) fail(node, key, fmt::format("must be >= 0, got {}", v));
    return v;
  }

  LinkSpec link(const YAML::Node& map, std::string_view key) const {
    const YAML::Node node = required(map, "", key);
    if (!node.IsMap()) fail(node, key, "must be a map {gbytes_per_s: ..., latency_us: ...}");
    const std::string prefix = fmt::format("{}.", key);
    check_keys(node, prefix, kLinkKeys);
    LinkSpec spec;
    spec.gbytes_per_s = positive(required(node, prefix, "gbytes_per_s"), prefix + "gbytes_per_s");
    spec.latency_us = non_negative(required(node, prefix, "latency_us"), prefix + "latency_us");
    return spec;
  }

  std::vector<GemmPoint> gemm(const YAML::Node& map, double peak_tflops) const {
    const YAML::Node list = required(map, "", "gemm");
    if (!list.IsSequence() || list.size() == 0)
      fail(list, "gemm", "must be a non-empty list of {min_dim: ..., tflops: ...}");
    std::vector<GemmPoint> points;
    for (size_t i = 0; i < list.size(); ++i) {
      const YAML::Node entry = list[i];
      const std::string key = fmt::format("gemm[{}]", i);
      if (!entry.IsMap()) fail(entry, key, "must be a map {min_dim: ..., tflops: ...}");
      check_keys(entry, key + ".", kGemmKeys);
      GemmPoint p;
      const YAML::Node dim = required(entry, key + ".", "min_dim");
      p.min_dim = integer(dim, key + ".min_dim");
      if (p.min_dim < 1)
        fail(dim, key + ".min_dim", fmt::format("must be >= 1, got {}", p.min_dim));
      const YAML::Node rate = required(entry, key + ".", "tflops");
      p.tflops = positive(rate, key + ".tflops");
      if (!points.empty() && p.min_dim <= points.back().min_dim)
        fail(dim, key + ".min_dim",
             fmt::format("must be above the previous point's ({}): points ascend by min_dim",
                         points.back().min_dim));
      if (p.tflops > peak_tflops * (1 + 1e-9))
        fail(rate, key + ".tflops",
             fmt::format("is {} TFLOP/s, above peak_tflops {}: an achieved rate cannot exceed "
                         "the peak",
                         p.tflops, peak_tflops));
      points.push_back(p);
    }
    return points;
  }

  std::vector<std::string> sources(const YAML::Node& map) const {
    const YAML::Node list = required(map, "", "sources");
    if (!list.IsSequence() || list.size() == 0)
      fail(list, "sources", "must be a non-empty list of strings (where each figure comes from)");
    std::vector<std::string> out;
    for (size_t i = 0; i < list.size(); ++i)
      out.push_back(text(list[i], fmt::format("sources[{}]", i)));
    return out;
  }

 private:
  static std::string describe(const YAML::Node& node) {
    if (node.IsScalar()) return node.Scalar();
    if (node.IsSequence()) return "a list";
    if (node.IsMap()) return "a map";
    return "nothing";
  }

  std::string path_;
};

Hardware parse(const YAML::Node& root, const std::string& path) {
  HardwareReader r(path);
  if (!root.IsMap())
    r.fail(root, "the file", "must be a map of hardware keys (Note [Hardware files])");
  r.check_keys(root, "", kTopKeys);
  Hardware hw;
  hw.path = path;
  hw.name = r.text(r.required(root, "", "name"), "name");
  hw.kind = r.one_of(r.required(root, "", "kind"), "kind", {"gpu", "cpu"});
  const YAML::Node devices = r.required(root, "", "devices_per_node");
  hw.devices_per_node = r.integer(devices, "devices_per_node");
  if (hw.devices_per_node < 1)
    r.fail(devices, "devices_per_node", fmt::format("must be >= 1, got {}", hw.devices_per_node));
  hw.dtype = r.one_of(r.required(root, "", "dtype"), "dtype", {"bf16", "fp32"});
  hw.peak_tflops = r.positive(r.required(root, "", "peak_tflops"), "peak_tflops");
  hw.gemm = r.gemm(root, hw.peak_tflops);
  if (const YAML::Node a = root["attention_tflops"]) {
    hw.attention_tflops = r.non_negative(a, "attention_tflops");
    if (hw.attention_tflops > hw.peak_tflops * (1 + 1e-9))
      r.fail(a, "attention_tflops",
             fmt::format("is {}, above peak_tflops {}", hw.attention_tflops, hw.peak_tflops));
  }
  hw.memory_gbytes_per_s =
      r.positive(r.required(root, "", "memory_gbytes_per_s"), "memory_gbytes_per_s");
  hw.memory_gb = r.positive(r.required(root, "", "memory_gb"), "memory_gb");
  hw.intra_node = r.link(root, "intra_node");
  hw.inter_node = r.link(root, "inter_node");
  // The optional figures with their defaults (struct Hardware) and allowed intervals.
  struct OptionalFigure {
    const char* key;
    double Hardware::*field;
    double lo;
    bool lo_closed;
    double hi;
    bool hi_closed;
  };
  constexpr double kNoLimit = std::numeric_limits<double>::infinity();
  for (const OptionalFigure& o :
       {OptionalFigure{"overlap_slowdown", &Hardware::overlap_slowdown, 0, true, 1, false},
        OptionalFigure{"tp_overlap_slowdown", &Hardware::tp_overlap_slowdown, 0, true, 1, false},
        OptionalFigure{"core_scaling", &Hardware::core_scaling, 0, false, 1, true},
        OptionalFigure{"thread_scaling", &Hardware::thread_scaling, 0, false, 1, true},
        OptionalFigure{"compute_efficiency", &Hardware::compute_efficiency, 0, false, 2, true},
        OptionalFigure{"elementwise_gbytes_per_s", &Hardware::elementwise_gbytes_per_s, 0, true,
                       kNoLimit, false},
        OptionalFigure{"optimizer_gbytes_per_s", &Hardware::optimizer_gbytes_per_s, 0, true,
                       kNoLimit, false},
        OptionalFigure{"host_copy_gbytes_per_s", &Hardware::host_copy_gbytes_per_s, 0, true,
                       kNoLimit, false},
        OptionalFigure{"host_memory_gb", &Hardware::host_memory_gb, 0, true, kNoLimit, false},
        OptionalFigure{"cross_entropy_forward_bytes", &Hardware::cross_entropy_forward_bytes, 0,
                       true, kNoLimit, false},
        OptionalFigure{"cross_entropy_backward_bytes", &Hardware::cross_entropy_backward_bytes, 0,
                       true, kNoLimit, false}})
    if (const YAML::Node n = root[o.key])
      hw.*o.field = r.in_range(n, o.key, o.lo, o.lo_closed, o.hi, o.hi_closed);
  if (const YAML::Node n = root["host_copy_path"]) hw.host_copy_path = r.text(n, "host_copy_path");
  hw.sources = r.sources(root);
  return hw;
}

namespace fs = std::filesystem;

// The trees trident's files are looked for in: beside the executable (<exe>/..), then the
// source tree it was built from.
std::vector<fs::path> tree_roots() {
  std::vector<fs::path> roots;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) roots.push_back((exe.parent_path() / "..").lexically_normal());
#ifdef TRIDENT_SOURCE_DIR
  roots.emplace_back(TRIDENT_SOURCE_DIR);
#else
  roots.emplace_back(".");
#endif
  return roots;
}

// Where NAME.yaml is looked for, in order (see find_hardware in trident/plan.h): the user's
// calibrations shadow the shipped descriptions of the same name (Note [User hardware files]).
std::vector<fs::path> hardware_dirs() {
  std::vector<fs::path> dirs;
  if (const std::string user = user_hardware_dir(); !user.empty()) dirs.emplace_back(user);
  for (const fs::path& root : tree_roots()) dirs.push_back(root / "inputs" / "hardware");
  return dirs;
}

}  // namespace

Hardware load_hardware(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) input_error("{}: no such hardware file", path);
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::ParserException& e) {
    input_error("{}:{}:{}: malformed YAML: {}", path, e.mark.line + 1, e.mark.column + 1, e.msg);
  } catch (const YAML::Exception& e) {
    input_error("{}: cannot read: {}", path, e.what());
  }
  return parse(root, path);
}

Hardware find_hardware(const std::string& name_or_path) {
  std::error_code ec;
  if (fs::is_regular_file(name_or_path, ec)) return load_hardware(name_or_path);
  if (name_or_path.find('/') != std::string::npos || name_or_path.ends_with(".yaml"))
    input_error("--hardware {}: no such file (a name is looked up as NAME.yaml in {}, then in "
                "the shipped inputs/hardware/)",
                name_or_path,
                user_hardware_dir().empty() ? "$TRIDENT_HARDWARE_DIR" : user_hardware_dir());
  const std::vector<fs::path> dirs = hardware_dirs();
  for (const fs::path& dir : dirs) {
    const fs::path file = dir / (name_or_path + ".yaml");
    if (fs::is_regular_file(file, ec)) return load_hardware(file.string());
  }
  // Every description there, the first directory's where two share a name.
  std::map<std::string, fs::path> found;
  std::string searched;
  for (const fs::path& dir : dirs) {
    searched += fmt::format("{}{}", searched.empty() ? "" : ", ", dir.string());
    if (!fs::is_directory(dir, ec)) continue;
    for (const auto& entry : fs::directory_iterator(dir, ec))
      if (entry.path().extension() == ".yaml") found.emplace(entry.path().stem().string(), entry);
  }
  // A name that is the start of exactly one description's, up to a dash ("dgx-a100" for
  // dgx-a100-80gb), reads that one; two or more are listed.
  std::vector<std::string> starting;
  for (const auto& [n, path] : found)
    if (n.starts_with(name_or_path + "-")) starting.push_back(n);
  if (starting.size() == 1) return load_hardware(found.at(starting.front()).string());
  std::string listing;
  for (const auto& [n, path] : found)
    listing += fmt::format("{}{}", listing.empty() ? "" : ", ", n);
  input_error("--hardware {}: no such hardware description (looked for {}.yaml in {}{}); "
              "available: {}",
              name_or_path, name_or_path, searched,
              starting.size() > 1 ? ", and more than one name starts with it" : "",
              listing.empty() ? "none" : listing);
}

// Note [User hardware files]
// `plan --calibrate` writes a user's description outside the source tree, so a clone's tracked
// inputs/hardware/ stays as shipped (a calibration is this machine's, not the project's):
// $TRIDENT_HARDWARE_DIR if set, else $XDG_DATA_HOME/trident/hardware (an absolute one, as the
// XDG spec says), else ~/.local/share/trident/hardware. find_hardware looks there before the
// shipped files, so a user's this-machine shadows the shipped reference; plan prints the file.
std::string user_hardware_dir() {
  if (const char* env = std::getenv("TRIDENT_HARDWARE_DIR"); env && *env) return env;
  if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg && *xdg == '/')
    return (fs::path(xdg) / "trident" / "hardware").string();
  if (const char* home = std::getenv("HOME"); home && *home)
    return (fs::path(home) / ".local" / "share" / "trident" / "hardware").string();
  return {};
}

std::string find_in_tree(const std::string& sub) {
  std::error_code ec;
  for (const fs::path& root : tree_roots())
    if (fs::exists(root / sub, ec)) return (root / sub).string();
  return {};
}

std::string hardware_to_yaml(const Hardware& hw) {
  // "{}" prints a double's shortest form that reads back exactly.
  std::string out = fmt::format(
      "# Hardware description (Note [Hardware files] in src/plan/hardware.cpp). GB = 1e9 bytes.\n"
      "name: {}\nkind: {}\ndevices_per_node: {}\ndtype: {}\npeak_tflops: {}\ngemm:\n",
      yaml_quote(hw.name), hw.kind, hw.devices_per_node, hw.dtype, hw.peak_tflops);
  for (const GemmPoint& p : hw.gemm)
    out += fmt::format("  - {{min_dim: {}, tflops: {}}}\n", p.min_dim, p.tflops);
  out += fmt::format(
      "attention_tflops: {}\nmemory_gbytes_per_s: {}\nmemory_gb: {}\n"
      "intra_node: {{gbytes_per_s: {}, latency_us: {}}}\n"
      "inter_node: {{gbytes_per_s: {}, latency_us: {}}}\n"
      "overlap_slowdown: {}\ncore_scaling: {}\nthread_scaling: {}\nelementwise_gbytes_per_s: "
      "{}\noptimizer_gbytes_per_s: {}\ncompute_efficiency: {}\nhost_copy_gbytes_per_s: {}\n",
      hw.attention_tflops, hw.memory_gbytes_per_s, hw.memory_gb, hw.intra_node.gbytes_per_s,
      hw.intra_node.latency_us, hw.inter_node.gbytes_per_s, hw.inter_node.latency_us,
      hw.overlap_slowdown, hw.core_scaling, hw.thread_scaling, hw.elementwise_gbytes_per_s,
      hw.optimizer_gbytes_per_s, hw.compute_efficiency, hw.host_copy_gbytes_per_s);
  if (!hw.host_copy_path.empty())
    out += fmt::format("host_copy_path: {}\n", yaml_quote(hw.host_copy_path));
  if (hw.host_memory_gb > 0) out += fmt::format("host_memory_gb: {}\n", hw.host_memory_gb);
  if (hw.tp_overlap_slowdown >= 0)
    out += fmt::format("tp_overlap_slowdown: {}\n", hw.tp_overlap_slowdown);
  if (hw.cross_entropy_forward_bytes > 0 || hw.cross_entropy_backward_bytes > 0)
    out += fmt::format("cross_entropy_forward_bytes: {}\ncross_entropy_backward_bytes: {}\n",
                       hw.cross_entropy_forward_bytes, hw.cross_entropy_backward_bytes);
  out += "sources:\n";
  for (const std::string& s : hw.sources) out += fmt::format("  - {}\n", yaml_quote(s));
  return out;
}

double host_copy_bytes_per_s(const Hardware& hw) {
  if (hw.host_copy_gbytes_per_s > 0) return hw.host_copy_gbytes_per_s * 1e9;
  return hw.kind == "cpu" ? hw.memory_gbytes_per_s * 1e9 / 2 : 0;
}

double gemm_flops_per_s(const Hardware& hw, double m, double n, double k) {
  TRIDENT_CHECK(!hw.gemm.empty(), "hardware '{}' has no gemm points", hw.name);
  const double d = std::min({m, n, k});
  const std::vector<GemmPoint>& g = hw.gemm;
  if (d <= g.front().min_dim) return g.front().tflops * 1e12;
  if (d >= g.back().min_dim) return g.back().tflops * 1e12;
  size_t i = 1;
  while (g[i].min_dim < d) ++i;  // g[i-1].min_dim < d <= g[i].min_dim
  const double t = (std::log(d) - std::log(double(g[i - 1].min_dim))) /
                   (std::log(double(g[i].min_dim)) - std::log(double(g[i - 1].min_dim)));
  return (g[i - 1].tflops + t * (g[i].tflops - g[i - 1].tflops)) * 1e12;
}

}  // namespace trident
