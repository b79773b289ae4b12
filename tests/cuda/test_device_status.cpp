// When a GPU test may skip (Note [GPU or no GPU] in src/backend/cuda/device.cpp): the
// decision from what the probe saw, tested without a GPU, and the probe on this machine
// against what the machine shows.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <string>

#include "gpu_test_util.h"
#include "trident/cuda_backend.h"

namespace trident {

void PrintTo(CudaDeviceState s, std::ostream* os) {
  *os << (s == CudaDeviceState::kUsable   ? "kUsable"
          : s == CudaDeviceState::kAbsent ? "kAbsent"
                                          : "kBroken");
}

namespace {

// What the build machine's probe sees: the CUDA 13 runtime without a driver.
CudaDeviceProbe no_driver_probe() {
  CudaDeviceProbe p;
  p.runtime_error = "cudaErrorInsufficientDriver (CUDA driver version is insufficient for CUDA "
                    "runtime version)";
  p.driver_error = "libcuda.so.1: cannot open shared object file: No such file or directory";
  return p;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != s.npos; }

TEST(CudaDeviceStatus, NoDriverAndNoDeviceNodeIsAbsent) {
  const CudaDeviceStatus s = classify_cuda_device(no_driver_probe());
  EXPECT_EQ(s.state, CudaDeviceState::kAbsent);
  EXPECT_TRUE(contains(s.reason, "libcuda.so.1 cannot be loaded")) << s.reason;
  EXPECT_TRUE(contains(s.reason, "cudaErrorInsufficientDriver")) << s.reason;
}

// The finding this guards against: the same runtime error on a machine with a GPU.
TEST(CudaDeviceStatus, TheSameErrorWithAGpuIsBroken) {
  CudaDeviceProbe p = no_driver_probe();
  p.device_nodes = {"/dev/nvidia0"};
  CudaDeviceStatus s = classify_cuda_device(p);
  EXPECT_EQ(s.state, CudaDeviceState::kBroken);
  EXPECT_TRUE(contains(s.reason, "cudaErrorInsufficientDriver")) << s.reason;
  EXPECT_TRUE(contains(s.reason, "/dev/nvidia0")) << s.reason;

  p = no_driver_probe();  // a driver older than the runtime, on a machine without a device node
  p.driver_loads = true;
  p.driver_error.clear();
  s = classify_cuda_device(p);
  EXPECT_EQ(s.state, CudaDeviceState::kBroken);
  EXPECT_TRUE(contains(s.reason, "older than the CUDA runtime")) << s.reason;
}

TEST(CudaDeviceStatus, ADriverThatFindsNoDevice) {
  CudaDeviceProbe p;
  p.runtime_error = "cudaErrorNoDevice (no CUDA-capable device is detected)";
  p.runtime_says_no_device = true;
  p.driver_loads = true;
  EXPECT_EQ(classify_cuda_device(p).state, CudaDeviceState::kAbsent);  // a CPU machine
  p.device_nodes = {"/dev/nvidia0", "/dev/nvidia1"};                   // but there are GPUs
  const CudaDeviceStatus s = classify_cuda_device(p);
  EXPECT_EQ(s.state, CudaDeviceState::kBroken);
  EXPECT_TRUE(contains(s.reason, "/dev/nvidia0, /dev/nvidia1")) << s.reason;
  p.visible_devices_set = true;  // hidden on purpose
  p.visible_devices = "";
  const CudaDeviceStatus hidden = classify_cuda_device(p);
  EXPECT_EQ(hidden.state, CudaDeviceState::kAbsent);
  EXPECT_TRUE(contains(hidden.reason, "CUDA_VISIBLE_DEVICES")) << hidden.reason;
}

TEST(CudaDeviceStatus, DevicesFoundAreUsable) {
  CudaDeviceProbe p;
  p.devices = 2;
  p.driver_loads = true;
  p.device_nodes = {"/dev/nvidia0", "/dev/nvidia1"};
  const CudaDeviceStatus s = classify_cuda_device(p);
  EXPECT_EQ(s.state, CudaDeviceState::kUsable);
  EXPECT_EQ(s.devices, 2);
  p.devices = 0;  // success, but no device, and nothing on the machine either
  p.device_nodes.clear();
  EXPECT_EQ(classify_cuda_device(p).state, CudaDeviceState::kAbsent);
}

// The probe on this machine, against a look of our own: a machine with /dev/nvidia0 or a
// loadable libcuda.so.1 is never one where GPU tests may skip for want of a driver, and one
// with neither never has a usable device.
TEST(CudaDeviceStatus, ThisMachine) {
  const CudaDeviceStatus& s = cuda_device_status();
  std::cout << "this machine: "
            << (s.state == CudaDeviceState::kUsable
                    ? "usable, " + std::to_string(s.devices) + " device(s)"
                : s.state == CudaDeviceState::kAbsent ? "no GPU: " + s.reason
                                                      : "broken: " + s.reason)
            << "\n";
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  const bool has_driver = driver != nullptr;
  if (driver) dlclose(driver);
  const bool has_node = std::filesystem::exists("/dev/nvidia0");
  if (has_node) EXPECT_NE(s.state, CudaDeviceState::kAbsent) << s.reason;
  if (!has_node && !has_driver) EXPECT_EQ(s.state, CudaDeviceState::kAbsent) << s.reason;
  if (s.state == CudaDeviceState::kAbsent)
    EXPECT_TRUE(contains(s.reason, "libcuda.so.1") || contains(s.reason, "CUDA_VISIBLE_DEVICES"))
        << s.reason;
}

}  // namespace
}  // namespace trident
