// exp_fast (float) against std::exp in double.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backend/fast_math.h"

namespace trident {
namespace {

using cpu::exp_fast;

// Over the range where exp is a normal float, the error stays within a few ulp (2^-23 ≈ 1.2e-7).
TEST(FastMath, ExpIsAccurateOverTheNormalRange) {
  double worst = 0.0;
  float worst_x = 0.0f;
  for (float x = -87.0f; x <= 88.5f; x += 0.000731f) {
    const double want = std::exp(double(x));
    const double err = std::abs(double(exp_fast(x)) - want) / want;
    if (err > worst) worst = err, worst_x = x;
  }
  EXPECT_LT(worst, 3e-7) << "at x = " << worst_x;
  EXPECT_EQ(exp_fast(0.0f), 1.0f);
}

TEST(FastMath, ExpLimits) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {89.0f, 100.0f, 1e4f, 3e38f, inf}) EXPECT_EQ(exp_fast(x), inf) << x;
  for (float x : {-104.0f, -1e4f, -3e38f, -inf}) EXPECT_EQ(exp_fast(x), 0.0f) << x;
  EXPECT_TRUE(std::isnan(exp_fast(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_GT(exp_fast(-87.0f), 0.0f);  // still representable: no early flush
}

}  // namespace
}  // namespace trident
