// Hardware files (Note [Hardware files] in src/plan/hardware.cpp): the shipped ones carry the
// vendors' figures, a description reads back what it wrote, the GEMM rate interpolates as
// documented, and every kind of bad input is refused with exit code 2 naming the key.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "scratch_dir.h"
#include "trident/check.h"
#include "trident/plan.h"

namespace trident {
namespace {

std::string shipped(const std::string& name) {
  return std::string(TRIDENT_SOURCE_DIR) + "/inputs/hardware/" + name + ".yaml";
}

struct VendorFigures {
  std::string name;
  double peak_tflops, hbm_gbytes_per_s, memory_gb, nic_gbytes_per_s, pcie_gbytes_per_s;
};

// Written by hand from the datasheets (sources: in each file): dense BF16, HBM peak, capacity,
// one NIC per GPU (HDR 200 Gb/s = 25 GB/s, NDR 400 Gb/s = 50 GB/s), the host link's raw rate
// (PCIe Gen4 x16 32 GB/s, Gen5 x16 64 GB/s).
const VendorFigures kVendor[] = {
    {"dgx-a100-80gb", 312, 2039, 80, 25, 32},
    {"dgx-h100", 989, 3350, 80, 50, 64},
    {"hgx-h200", 989, 4800, 141, 50, 64},
};

TEST(ShippedHardware, CarryTheVendorFigures) {
  for (const VendorFigures& v : kVendor) {
    SCOPED_TRACE(v.name);
    const Hardware hw = load_hardware(shipped(v.name));
    EXPECT_EQ(hw.name, v.name);
    EXPECT_EQ(hw.kind, "gpu");
    EXPECT_EQ(hw.dtype, "bf16");
    EXPECT_EQ(hw.devices_per_node, 8);
    EXPECT_EQ(hw.peak_tflops, v.peak_tflops);
    EXPECT_EQ(hw.memory_gb, v.memory_gb);
    // Achieved figures: below the peaks they are measured against, and not absurdly below.
    EXPECT_LE(hw.memory_gbytes_per_s, v.hbm_gbytes_per_s);
    EXPECT_GE(hw.memory_gbytes_per_s, 0.8 * v.hbm_gbytes_per_s);
    EXPECT_LE(hw.inter_node.gbytes_per_s, v.nic_gbytes_per_s);
    EXPECT_GE(hw.inter_node.gbytes_per_s, 0.8 * v.nic_gbytes_per_s);
    EXPECT_GT(hw.intra_node.gbytes_per_s, hw.inter_node.gbytes_per_s);
    for (const GemmPoint& p : hw.gemm) EXPECT_LE(p.tflops, 0.9 * hw.peak_tflops);
    EXPECT_GT(hw.overlap_slowdown, 0);
    // A device-to-host copy over PCIe x16: Gen4 32 GB/s, Gen5 64 GB/s before protocol overhead.
    EXPECT_GT(hw.host_copy_gbytes_per_s, 0.5 * v.pcie_gbytes_per_s);
    EXPECT_LT(hw.host_copy_gbytes_per_s, v.pcie_gbytes_per_s);
    EXPECT_GE(hw.sources.size(), 5u);
  }
  // Megatron 2021 ran attention unfused (the file says why).
  EXPECT_EQ(load_hardware(shipped("dgx-a100-80gb")).attention_tflops, 0);
  EXPECT_GT(load_hardware(shipped("dgx-h100")).attention_tflops, 0);
}

TEST(ShippedHardware, CalibratedFileLoadsAsACpu) {
  const std::string path = shipped("this-machine");
  if (!std::ifstream(path)) GTEST_SKIP() << path << " not calibrated yet";
  const Hardware hw = load_hardware(path);
  EXPECT_EQ(hw.kind, "cpu");
  EXPECT_EQ(hw.dtype, "fp32");
  EXPECT_GE(hw.gemm.size(), 5u);
}

class HardwareFileTest : public testing::ScratchDirTest {
 protected:
  HardwareFileTest() : ScratchDirTest("trident_hardware_") {}

  std::string write(const std::string& name, const std::string& text) {
    const std::string path = file(name);
    std::ofstream(path) << text;
    return path;
  }

  // A valid file with `line` (a whole "key: value" line) replacing the line of the same key,
  // or added when the key is new.
  std::string valid_with(const std::string& line) {
    std::string text = kValid;
    const std::string key = line.substr(0, line.find(':') + 1);
    const size_t at = text.find("\n" + key);
    if (at == std::string::npos) {
      text += line + "\n";
    } else {  // the key's line and the indented lines of a list under it
      size_t end = text.find('\n', at + 1);
      while (end + 1 < text.size() && text[end + 1] == ' ') end = text.find('\n', end + 1);
      text.replace(at + 1, end - at - 1, line);
    }
    return text;
  }

  // Loading `text` fails with exit code 2 and a message that starts with the file's path and
  // contains `key`.
  void expect_refused(const std::string& text, const std::string& key) {
    const std::string path = write("bad.yaml", text);
    try {
      load_hardware(path);
      ADD_FAILURE() << "accepted a file that should name " << key << ":\n" << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::kBadInput) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind(path, 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos)
          << "message does not name " << key << ": " << e.what();
    }
  }

  static constexpr const char* kValid = "name: test-node\n"
                                        "kind: gpu\n"
                                        "devices_per_node: 4\n"
                                        "dtype: bf16\n"
                                        "peak_tflops: 100\n"
                                        "gemm:\n"
                                        "  - {min_dim: 128, tflops: 40}\n"
                                        "  - {min_dim: 1024, tflops: 80}\n"
                                        "attention_tflops: 50\n"
                                        "memory_gbytes_per_s: 1000\n"
                                        "memory_gb: 40\n"
                                        "intra_node: {gbytes_per_s: 100, latency_us: 2}\n"
                                        "inter_node: {gbytes_per_s: 10, latency_us: 8}\n"
                                        "overlap_slowdown: 0.1\n"
                                        "sources:\n"
                                        "  - \"a test: figures made up\"\n";
};

TEST_F(HardwareFileTest, ReadsEveryKey) {
  const Hardware hw = load_hardware(write("ok.yaml", kValid));
  EXPECT_EQ(hw.name, "test-node");
  EXPECT_EQ(hw.path, file("ok.yaml"));
  EXPECT_EQ(hw.devices_per_node, 4);
  ASSERT_EQ(hw.gemm.size(), 2u);
  EXPECT_EQ(hw.gemm[1].min_dim, 1024);
  EXPECT_EQ(hw.gemm[1].tflops, 80);
  EXPECT_EQ(hw.attention_tflops, 50);
  EXPECT_EQ(hw.intra_node.latency_us, 2);
  EXPECT_EQ(hw.inter_node.gbytes_per_s, 10);
  EXPECT_EQ(hw.overlap_slowdown, 0.1);
  ASSERT_EQ(hw.sources.size(), 1u);
  EXPECT_EQ(hw.sources[0], "a test: figures made up");
}

TEST_F(HardwareFileTest, OptionalKeysDefault) {
  std::string text = kValid;
  for (const char* key : {"attention_tflops: 50\n", "overlap_slowdown: 0.1\n"})
    text.erase(text.find(key), std::string(key).size());
  const Hardware hw = load_hardware(write("ok.yaml", text));
  EXPECT_EQ(hw.attention_tflops, 0);
  EXPECT_EQ(hw.overlap_slowdown, 0);
  EXPECT_EQ(hw.host_copy_gbytes_per_s, 0);
  EXPECT_EQ(hw.host_memory_gb, 0);
  EXPECT_EQ(hw.host_copy_path, "");
}

// Note [Plan checkpoint snapshot] in src/plan/memory.cpp: the host copy's figures.
TEST_F(HardwareFileTest, ReadsTheHostCopyKeys) {
  std::string text = valid_with("host_copy_gbytes_per_s: 52");
  text += "host_copy_path: \"PCIe Gen5 x16\"\nhost_memory_gb: 2048\n";
  const Hardware hw = load_hardware(write("ok.yaml", text));
  EXPECT_EQ(hw.host_copy_gbytes_per_s, 52);
  EXPECT_EQ(hw.host_copy_path, "PCIe Gen5 x16");
  EXPECT_EQ(hw.host_memory_gb, 2048);
  EXPECT_DOUBLE_EQ(host_copy_bytes_per_s(hw), 52e9);
  const Hardware back = load_hardware(write("back.yaml", hardware_to_yaml(hw)));
  EXPECT_EQ(back.host_copy_gbytes_per_s, 52);
  EXPECT_EQ(back.host_copy_path, "PCIe Gen5 x16");
  EXPECT_EQ(back.host_memory_gb, 2048);
  expect_refused(valid_with("host_copy_gbytes_per_s: -1"), "host_copy_gbytes_per_s");
  expect_refused(valid_with("host_memory_gb: lots"), "host_memory_gb");
  expect_refused(valid_with("host_copy_path: [a, b]"), "host_copy_path");
  // Unknown on a gpu: no rate; a cpu without one copies at half its memory bandwidth.
  Hardware gpu = hw, cpu = hw;
  gpu.host_copy_gbytes_per_s = cpu.host_copy_gbytes_per_s = 0;
  cpu.kind = "cpu";
  EXPECT_EQ(host_copy_bytes_per_s(gpu), 0);
  EXPECT_DOUBLE_EQ(host_copy_bytes_per_s(cpu), 500e9);
}

TEST_F(HardwareFileTest, RoundTripsThroughYaml) {
  for (const VendorFigures& v : kVendor) {
    SCOPED_TRACE(v.name);
    const Hardware a = load_hardware(shipped(v.name));
    const Hardware b = load_hardware(write(v.name + ".yaml", hardware_to_yaml(a)));
    EXPECT_EQ(b.name, a.name);
    EXPECT_EQ(b.kind, a.kind);
    EXPECT_EQ(b.devices_per_node, a.devices_per_node);
    EXPECT_EQ(b.dtype, a.dtype);
    EXPECT_EQ(b.peak_tflops, a.peak_tflops);
    ASSERT_EQ(b.gemm.size(), a.gemm.size());
    for (size_t i = 0; i < a.gemm.size(); ++i) {
      EXPECT_EQ(b.gemm[i].min_dim, a.gemm[i].min_dim);
      EXPECT_EQ(b.gemm[i].tflops, a.gemm[i].tflops);
    }
    EXPECT_EQ(b.attention_tflops, a.attention_tflops);
    EXPECT_EQ(b.memory_gbytes_per_s, a.memory_gbytes_per_s);
    EXPECT_EQ(b.memory_gb, a.memory_gb);
    EXPECT_EQ(b.intra_node.gbytes_per_s, a.intra_node.gbytes_per_s);
    EXPECT_EQ(b.intra_node.latency_us, a.intra_node.latency_us);
    EXPECT_EQ(b.inter_node.gbytes_per_s, a.inter_node.gbytes_per_s);
    EXPECT_EQ(b.inter_node.latency_us, a.inter_node.latency_us);
    EXPECT_EQ(b.overlap_slowdown, a.overlap_slowdown);
    EXPECT_EQ(b.host_copy_gbytes_per_s, a.host_copy_gbytes_per_s);
    EXPECT_EQ(b.host_copy_path, a.host_copy_path);
    EXPECT_EQ(b.host_memory_gb, a.host_memory_gb);
    EXPECT_EQ(b.sources, a.sources);
  }
  // Numbers that need every digit, and strings that need quoting.
  Hardware odd = load_hardware(write("ok.yaml", kValid));
  odd.name = "node: \"quoted\" #1";
  odd.gemm[0].tflops = 0.1 + 0.2;
  odd.intra_node.latency_us = 1.0 / 3;
  odd.sources = {"a: b", "- dash", "it's \\ back"};
  const Hardware back = load_hardware(write("odd.yaml", hardware_to_yaml(odd)));
  EXPECT_EQ(back.name, odd.name);
  EXPECT_EQ(back.gemm[0].tflops, odd.gemm[0].tflops);
  EXPECT_EQ(back.intra_node.latency_us, odd.intra_node.latency_us);
  EXPECT_EQ(back.sources, odd.sources);
}

TEST(GemmRate, InterpolatesInLogMinDim) {
  Hardware hw;
  hw.gemm = {{100, 10}, {1000, 40}, {10000, 50}};
  // Below the first and above the last point, the nearest holds.
  EXPECT_DOUBLE_EQ(gemm_flops_per_s(hw, 50, 5000, 5000), 10e12);
  EXPECT_DOUBLE_EQ(gemm_flops_per_s(hw, 1e6, 1e6, 1e5), 50e12);
  // On a point.
  EXPECT_DOUBLE_EQ(gemm_flops_per_s(hw, 1000, 4096, 2048), 40e12);
  // sqrt(100·1000) ≈ 316.2 lies halfway in log between 100 and 1000: (10 + 40) / 2 = 25.
  EXPECT_NEAR(gemm_flops_per_s(hw, 4096, std::sqrt(1e5), 4096), 25e12, 1e3);
  // 2000 is log10(2) = 0.30103 of the way from 1000 to 10000: 40 + 0.30103 · 10 = 43.0103.
  EXPECT_NEAR(gemm_flops_per_s(hw, 2000, 3000, 8000), 43.0103e12, 1e8);
  // The smallest dimension decides, whichever it is.
  EXPECT_DOUBLE_EQ(gemm_flops_per_s(hw, 5000, 100, 5000), gemm_flops_per_s(hw, 5000, 5000, 100));
}

// The keys that describe a software stack's differences (inputs/plan/megatron-core-2024.yaml):
// unset by default, read, written back, refused out of range.
TEST_F(HardwareFileTest, SoftwareStackKeys) {
  const Hardware none = load_hardware(write("ok.yaml", kValid));
  EXPECT_LT(none.tp_overlap_slowdown, 0);  // unset: overlap_slowdown applies
  EXPECT_EQ(none.cross_entropy_forward_bytes, 0);
  EXPECT_EQ(none.cross_entropy_backward_bytes, 0);
  EXPECT_EQ(hardware_to_yaml(none).find("tp_overlap_slowdown"), std::string::npos);
  const Hardware a = load_hardware(
      write("sw.yaml", valid_with("tp_overlap_slowdown: 0.06\ncross_entropy_forward_bytes: 38\n"
                                  "cross_entropy_backward_bytes: 14")));
  EXPECT_EQ(a.tp_overlap_slowdown, 0.06);
  EXPECT_EQ(a.cross_entropy_forward_bytes, 38);
  EXPECT_EQ(a.cross_entropy_backward_bytes, 14);
  const Hardware b = load_hardware(write("sw2.yaml", hardware_to_yaml(a)));
  EXPECT_EQ(b.tp_overlap_slowdown, a.tp_overlap_slowdown);
  EXPECT_EQ(b.cross_entropy_forward_bytes, a.cross_entropy_forward_bytes);
  EXPECT_EQ(b.cross_entropy_backward_bytes, a.cross_entropy_backward_bytes);
  expect_refused(valid_with("tp_overlap_slowdown: 1"), "tp_overlap_slowdown");
  expect_refused(valid_with("cross_entropy_backward_bytes: -1"), "cross_entropy_backward_bytes");
}

TEST_F(HardwareFileTest, RefusesBadInput) {
  expect_refused("name: [unclosed\n", "malformed");
  std::string text = kValid;
  text.replace(text.find("peak_tflops"), 11, "peak_tflop");
  expect_refused(text, "did you mean 'peak_tflops'");
  expect_refused(valid_with("gpus_per_node: 8"), "gpus_per_node");
  // Each required key, missing.
  for (const char* key :
       {"name", "kind", "devices_per_node", "dtype", "peak_tflops", "gemm", "memory_gbytes_per_s",
        "memory_gb", "intra_node", "inter_node", "sources"}) {
    SCOPED_TRACE(key);
    std::string t = kValid;
    const size_t at = t.find(std::string(key) + ":");
    size_t end = t.find('\n', at) + 1;
    while (end < t.size() && t[end] == ' ') end = t.find('\n', end) + 1;  // the list under it
    t.erase(at, end - at);
    expect_refused(t, key);
  }
  // Wrong types.
  expect_refused(valid_with("devices_per_node: 8.5"), "devices_per_node");
  expect_refused(valid_with("peak_tflops: fast"), "peak_tflops");
  expect_refused(valid_with("memory_gb: [1, 2]"), "memory_gb");
  expect_refused(valid_with("intra_node: 100"), "intra_node");
  expect_refused(valid_with("intra_node: {gbytes_per_s: many, latency_us: 1}"),
                 "intra_node.gbytes_per_s");
  expect_refused(valid_with("inter_node: {gbytes_per_s: 10}"), "inter_node.latency_us");
  expect_refused(valid_with("inter_node: {gbytes_per_s: 10, latency_us: 1, mtu: 9000}"),
                 "inter_node.mtu");
  expect_refused(valid_with("sources: a string"), "sources");
  expect_refused(valid_with("peak_tflops: .inf"), "peak_tflops");
  // Out of range.
  expect_refused(valid_with("intra_node: {gbytes_per_s: -5, latency_us: 1}"),
                 "intra_node.gbytes_per_s");
  expect_refused(valid_with("inter_node: {gbytes_per_s: 10, latency_us: -1}"),
                 "inter_node.latency_us");
  expect_refused(valid_with("memory_gbytes_per_s: 0"), "memory_gbytes_per_s");
  expect_refused(valid_with("devices_per_node: 0"), "devices_per_node");
  expect_refused(valid_with("overlap_slowdown: 1"), "overlap_slowdown");
  expect_refused(valid_with("overlap_slowdown: -0.1"), "overlap_slowdown");
  expect_refused(valid_with("attention_tflops: 200"), "attention_tflops");
  expect_refused(valid_with("sources: []"), "sources");
  // Enumerations.
  expect_refused(valid_with("kind: tpu"), "kind");
  expect_refused(valid_with("dtype: fp16"), "dtype");
  // GEMM points.
  std::string gemm = kValid;
  const std::string points = "  - {min_dim: 128, tflops: 40}\n  - {min_dim: 1024, tflops: 80}\n";
  auto with_points = [&](const std::string& p) {
    std::string t = gemm;
    t.replace(t.find(points), points.size(), p);
    return t;
  };
  expect_refused(with_points("  - {min_dim: 1024, tflops: 80}\n  - {min_dim: 128, tflops: 40}\n"),
                 "gemm[1].min_dim");
  expect_refused(with_points("  - {min_dim: 128, tflops: 40}\n  - {min_dim: 128, tflops: 50}\n"),
                 "gemm[1].min_dim");
  expect_refused(with_points("  - {min_dim: 128, tflops: 400}\n"), "gemm[0].tflops");
  expect_refused(with_points("  - {min_dim: 0, tflops: 40}\n"), "gemm[0].min_dim");
  expect_refused(with_points("  - {min_dim: 128, tflops: 40, note: x}\n"), "gemm[0].note");
  expect_refused(with_points("  - {min_dim: 128}\n"), "gemm[0].tflops");
  expect_refused(valid_with("gemm: []"), "gemm");
  expect_refused(valid_with("gemm: {min_dim: 128, tflops: 40}"), "gemm");
}

TEST_F(HardwareFileTest, MissingFileNamesThePath) {
  try {
    load_hardware(file("nope.yaml"));
    ADD_FAILURE() << "a missing file was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find(file("nope.yaml")), std::string::npos) << e.what();
  }
}

TEST_F(HardwareFileTest, FindsByNameOrPath) {
  EXPECT_EQ(find_hardware(write("mine.yaml", kValid)).name, "test-node");  // a path
  EXPECT_EQ(find_hardware("dgx-h100").name, "dgx-h100");                   // the source tree
  EXPECT_EQ(find_hardware("dgx-a100").name, "dgx-a100-80gb");              // the one name it begins
  EXPECT_THROW(find_hardware("dgx"), Error);      // begins dgx-a100-80gb and dgx-h100: ambiguous
  EXPECT_THROW(find_hardware("dgx-a10"), Error);  // not up to a dash
  // $TRIDENT_HARDWARE_DIR comes first.
  write("dgx-h100.yaml", kValid);
  ASSERT_EQ(setenv("TRIDENT_HARDWARE_DIR", dir_.c_str(), 1), 0);
  EXPECT_EQ(find_hardware("dgx-h100").name, "test-node");
  try {
    find_hardware("dgx-z900");
    ADD_FAILURE() << "an unknown name was found";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    const std::string what = e.what();
    EXPECT_NE(what.find("dgx-z900"), std::string::npos) << what;
    for (const char* name : {"dgx-a100-80gb", "hgx-h200", "mine"})  // both directories listed
      EXPECT_NE(what.find(name), std::string::npos) << name << " not listed: " << what;
  }
  unsetenv("TRIDENT_HARDWARE_DIR");
  EXPECT_THROW(find_hardware(file("missing/none.yaml")), Error);
}

// Sets or unsets an environment variable for one scope, restoring it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    value ? setenv(name, value, 1) : unsetenv(name);
  }
  ~ScopedEnv() { had_ ? setenv(name_, old_.c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// Note [User hardware files]: where calibrations go, and that they shadow the shipped files.
TEST_F(HardwareFileTest, UserDirectoryIsFoundFirst) {
  const std::string home = file("home"), xdg = file("xdg"), own = file("own");
  ScopedEnv set_home("HOME", home.c_str());
  ScopedEnv no_dir("TRIDENT_HARDWARE_DIR", nullptr);
  {
    ScopedEnv no_xdg("XDG_DATA_HOME", nullptr);
    EXPECT_EQ(user_hardware_dir(), home + "/.local/share/trident/hardware");
    ScopedEnv relative_xdg("XDG_DATA_HOME", "relative/data");  // ignored, as the spec says
    EXPECT_EQ(user_hardware_dir(), home + "/.local/share/trident/hardware");
  }
  ScopedEnv set_xdg("XDG_DATA_HOME", xdg.c_str());
  EXPECT_EQ(user_hardware_dir(), xdg + "/trident/hardware");
  // A calibration named as a shipped description is read instead of it; others still are found.
  std::filesystem::create_directories(user_hardware_dir());
  write("xdg/trident/hardware/this-machine.yaml", kValid);
  EXPECT_EQ(find_hardware("this-machine").path, xdg + "/trident/hardware/this-machine.yaml");
  EXPECT_EQ(find_hardware("dgx-h100").name, "dgx-h100");
  {
    ScopedEnv set_dir("TRIDENT_HARDWARE_DIR", own.c_str());  // replaces the XDG directory
    EXPECT_EQ(user_hardware_dir(), own);
    EXPECT_TRUE(
        std::filesystem::equivalent(find_hardware("this-machine").path, shipped("this-machine")));
  }
  ScopedEnv no_home("HOME", nullptr);
  ScopedEnv no_xdg("XDG_DATA_HOME", nullptr);
  EXPECT_EQ(user_hardware_dir(), "");  // calibrate then asks for --out
  EXPECT_TRUE(
      std::filesystem::equivalent(find_hardware("this-machine").path, shipped("this-machine")));
}

}  // namespace
}  // namespace trident
