// Flat-buffer kernels (GELU, add, bf16 casts, AdamW, sum of squares) against their CPU
// twins, on aligned buffers (float4 path) and buffers one element off (scalar path), with sizes
// that leave a tail after the last float4. Checks: kernel_checks_flat.h.
#include <gtest/gtest.h>

#include <cstring>

#include "kernel_checks_flat.h"
#include "trident/cuda_backend.h"

namespace trident::testing {
namespace {

constexpr size_t kSizes[] = {1, 3, 4, 37, 4099, 1000003};
constexpr size_t kOffsets[] = {0, 1};

std::string shape(size_t n, size_t offset) { return fmt::format("n={} offset={}", n, offset); }

TEST(KernelGelu, ForwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  for (size_t n : kSizes)
    for (size_t off : kOffsets) expect_within(check_gelu_forward(n, off, 51), shape(n, off));
}

TEST(KernelGelu, BackwardMatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  for (size_t n : kSizes)
    for (size_t off : kOffsets) expect_within(check_gelu_backward(n, off, 52), shape(n, off));
}

TEST(KernelAdd, MatchesCpuWithAndWithoutAliasing) {
  TRIDENT_REQUIRE_GPU();
  for (size_t n : kSizes)
    for (size_t off : kOffsets)
      for (int alias : {0, 1, 2})
        expect_within(check_add(n, off, alias, 53),
                      shape(n, off) + fmt::format(" alias={}", alias));
}

TEST(KernelCast, F32ToBf16RoundsToNearestEven) {
  TRIDENT_REQUIRE_GPU();
  for (size_t n : kSizes)
    for (size_t off : kOffsets) expect_within(check_cast_f32_to_bf16(n, off, 55), shape(n, off));
}

TEST(KernelCast, Bf16ToF32Scaled) {
  TRIDENT_REQUIRE_GPU();
  for (size_t n : kSizes)
    for (size_t off : kOffsets)
      expect_within(check_cast_bf16_to_f32(n, off, 0.125f, 56), shape(n, off));
}

TEST(KernelAdamW, MatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  for (size_t n : kSizes)
    for (size_t off : kOffsets)
      for (bool bf16 : {false, true})
        expect_within(check_adamw(n, off, bf16, 57), shape(n, off) + (bf16 ? " +bf16" : ""));
}

TEST(KernelSumSquares, MatchesCpu) {
  TRIDENT_REQUIRE_GPU();
  for (size_t n : kSizes)
    for (size_t off : kOffsets) expect_within(check_sum_squares(n, off, 58), shape(n, off));
  // More than one block's worth per thread: every block loops.
  expect_within(check_sum_squares(size_t(9) << 20, 0, 59), "n=9Mi");
}

TEST(KernelSumSquares, IsDeterministic) {
  TRIDENT_REQUIRE_GPU();
  std::mt19937 rng(60);
  const std::vector<float> x = random_floats(3000017, rng);
  DeviceBuffer<float> d_x(x);
  DeviceBuffer<double> result(2), scratch(cuda::sum_squares_scratch_doubles());
  cuda::sum_squares_cuda(result.get(), scratch.get(), d_x.get(), x.size(), nullptr);
  cuda::sum_squares_cuda(result.get() + 1, scratch.get(), d_x.get(), x.size(), nullptr);
  const std::vector<double> r = result.download();
  EXPECT_EQ(std::memcmp(&r[0], &r[1], sizeof(double)), 0) << r[0] << " vs " << r[1];
}

// Backend::sum_squares_each (the norm with tp or pp > 1: one wait for every tensor) gives each
// buffer's sum bitwise as one sum_squares call on it does (the same kernels on the same data),
// for an empty buffer, one off float4 alignment and one spanning many blocks.
TEST(KernelSumSquares, EachEqualsOneCallPerBuffer) {
  TRIDENT_REQUIRE_GPU();
  std::mt19937 rng(61);
  const std::vector<float> x = random_floats(2000003, rng);
  auto gpu = make_cuda_backend();
  float* d = static_cast<float*>(gpu->allocate(x.size() * sizeof(float)));
  gpu->copy(d, x.data(), x.size() * sizeof(float));
  const std::vector<const float*> xs = {d, d + 1, d + 5, d + 1000};
  const std::vector<size_t> ns = {0, 37, 1000003, 999000};
  std::vector<double> each(xs.size(), -1.0);
  gpu->sum_squares_each(xs.data(), ns.data(), xs.size(), each.data());
  for (size_t i = 0; i < xs.size(); ++i) {
    const double one = gpu->sum_squares(xs[i], ns[i]);
    EXPECT_EQ(std::memcmp(&each[i], &one, sizeof(double)), 0)
        << "buffer " << i << " (n " << ns[i] << "): " << each[i] << " vs " << one;
  }
  EXPECT_EQ(each[0], 0.0);
  gpu->release(d);
}

}  // namespace
}  // namespace trident::testing
