// The BLAS core check's pure parts (CPU features → expected OpenBLAS core; chosen vs expected →
// action) and the figures that cannot mislead (peak bounds, MFU never above 1).
#include <gtest/gtest.h>

#include <cmath>

#include "trident/blas_core.h"
#include "trident/peak_check.h"

namespace trident {
namespace {

CpuFeatures avx2_fma() {
  CpuFeatures f;
  f.avx = f.avx2 = f.fma = true;
  return f;
}
CpuFeatures avx512() {
  CpuFeatures f = avx2_fma();
  f.avx512f = f.avx512bw = f.avx512dq = f.avx512vl = true;
  return f;
}

TEST(BlasCore, FeaturesGiveTheFastestCoreOpenBlas0321Knows) {
  EXPECT_EQ(expected_blas_core(CpuFeatures{}), "Prescott");
  CpuFeatures avx_only;
  avx_only.avx = true;
  EXPECT_EQ(expected_blas_core(avx_only), "Sandybridge");
  EXPECT_EQ(expected_blas_core(avx2_fma()), "Haswell");
  CpuFeatures zen = avx2_fma();
  zen.amd = true;
  EXPECT_EQ(expected_blas_core(zen), "Zen");
  EXPECT_EQ(expected_blas_core(avx512()), "SkylakeX");
  CpuFeatures cooper = avx512();
  cooper.avx512_bf16 = true;
  EXPECT_EQ(expected_blas_core(cooper), "Cooperlake");
  // Sapphire / Emerald Rapids (the dev VM): AMX adds nothing to fp32 GEMM.
  CpuFeatures spr = cooper;
  spr.amx = true;
  EXPECT_EQ(best_isa(spr), VectorIsa::kAmx);
  EXPECT_EQ(expected_blas_core(spr), "Cooperlake");
  // Zen 4: AVX-512 with BF16, as OpenBLAS itself maps it.
  CpuFeatures zen4 = cooper;
  zen4.amd = true;
  EXPECT_EQ(expected_blas_core(zen4), "Cooperlake");
}

TEST(BlasCore, PartialAvx512IsNotSkylakeX) {
  CpuFeatures knl = avx2_fma();  // Knights Landing: AVX-512F and CD, no BW/DQ/VL
  knl.avx512f = true;
  EXPECT_EQ(expected_blas_core(knl), "Haswell");
  EXPECT_EQ(fp32_lanes(knl), 16);
  CpuFeatures no_fma = avx2_fma();
  no_fma.fma = false;
  EXPECT_EQ(expected_blas_core(no_fma), "Sandybridge");
}

TEST(BlasCore, LanesFollowTheWidestRegisters) {
  EXPECT_EQ(fp32_lanes(CpuFeatures{}), 4);
  EXPECT_EQ(fp32_lanes(avx2_fma()), 8);
  EXPECT_EQ(fp32_lanes(avx512()), 16);
}

TEST(BlasCore, EveryExpectedCoreIsInTheTable) {
  for (const char* core : {"Prescott", "Sandybridge", "Haswell", "Zen", "SkylakeX", "Cooperlake"}) {
    VectorIsa isa{};
    EXPECT_TRUE(blas_core_isa(core, &isa)) << core;
  }
  VectorIsa isa{};
  EXPECT_TRUE(blas_core_isa("cooperlake", &isa));  // OpenBLAS compares without case
  EXPECT_EQ(isa, VectorIsa::kAvx512Bf16);
  EXPECT_FALSE(blas_core_isa("NEOVERSEN1", &isa));
}

TEST(BlasCore, ActionOnAFallback) {
  using A = BlasCoreAction;
  // What 0.3.21 does on the dev VM: re-execute, once.
  EXPECT_EQ(decide_blas_core_action("Prescott", "Cooperlake", false, false), A::kReexec);
  EXPECT_EQ(decide_blas_core_action("Prescott", "Cooperlake", false, true), A::kWarnUncorrected);
  // The user's choice is respected, and said.
  EXPECT_EQ(decide_blas_core_action("Haswell", "Cooperlake", true, false), A::kWarnUserChoice);
  // As good or better: nothing. Zen and Haswell are the same level.
  EXPECT_EQ(decide_blas_core_action("Cooperlake", "Cooperlake", false, false), A::kNone);
  EXPECT_EQ(decide_blas_core_action("SapphireRapids", "Cooperlake", false, false), A::kNone);
  EXPECT_EQ(decide_blas_core_action("Zen", "Haswell", false, false), A::kNone);
  EXPECT_EQ(decide_blas_core_action("SkylakeX", "Cooperlake", false, false), A::kReexec);
  // A name the table does not know: no verdict rather than a loop.
  EXPECT_EQ(decide_blas_core_action("Unknown", "Cooperlake", false, false), A::kNone);
}

TEST(BlasCore, UncorrectedFallbackIsSaidLoudlyWithWhatToSet) {
  BlasCoreCheck c;
  c.chosen = "Prescott";
  c.expected = "Cooperlake";
  c.corrected_from = "Prescott";
  c.cpu_isa = VectorIsa::kAvx512Bf16;
  c.action = BlasCoreAction::kWarnUncorrected;
  const std::string note = blas_core_note(c);
  EXPECT_NE(note.find("WARNING"), std::string::npos) << note;
  EXPECT_NE(note.find("Prescott"), std::string::npos) << note;
  EXPECT_NE(note.find("OPENBLAS_CORETYPE=Cooperlake"), std::string::npos) << note;
  c.action = BlasCoreAction::kNone;
  c.chosen = "Cooperlake";
  EXPECT_NE(blas_core_note(c).find("re-executed"), std::string::npos);
  c.corrected_from.clear();
  EXPECT_EQ(blas_core_note(c), "");
}

// The dev VM: 2 threads, 2 CPUs, AVX-512. Low bound 2 × 32 GFLOP/s, high 2 × 384.
TEST(PeakCheck, BoundsOfTheVectorWidth) {
  const CpuPeakBounds b = cpu_gemm_peak_bounds(16, 2, 2, 1);
  EXPECT_DOUBLE_EQ(b.low_flops, 64e9);
  EXPECT_DOUBLE_EQ(b.high_flops, 768e9);
  EXPECT_EQ(judge_peak(180e9, b), PeakVerdict::kPlausible);        // the right kernel
  EXPECT_EQ(judge_peak(29.2e9, b), PeakVerdict::kImplausiblyLow);  // issue 11: Prescott
  EXPECT_EQ(judge_peak(2e12, b), PeakVerdict::kImpossible);
  EXPECT_EQ(judge_peak(NAN, b), PeakVerdict::kImplausiblyLow);
  // Two ranks share the two CPUs: each may measure half.
  EXPECT_DOUBLE_EQ(cpu_gemm_peak_bounds(16, 2, 2, 2).low_flops, 32e9);
  // More threads than CPUs measure no more than the CPUs give.
  EXPECT_DOUBLE_EQ(cpu_gemm_peak_bounds(8, 8, 2, 1).high_flops, 2 * 16 * 2 * 6e9);
  const std::string m =
      peak_problem_message(29.2e9, b, PeakVerdict::kImplausiblyLow, "AVX-512", "Prescott");
  EXPECT_NE(m.find("blas_core=Prescott"), std::string::npos) << m;
  EXPECT_NE(m.find("MFU is not reported"), std::string::npos) << m;
}

TEST(PeakCheck, MfuAboveOneIsNeverANumber) {
  EXPECT_DOUBLE_EQ(mfu_or_nan(50e9, 100e9), 0.5);
  EXPECT_DOUBLE_EQ(mfu_or_nan(100e9, 100e9), 1.0);
  EXPECT_TRUE(std::isnan(mfu_or_nan(34.9e9, 29.2e9)));  // issue 11: mfu=1.1939
  EXPECT_TRUE(std::isnan(mfu_or_nan(1e9, 0)));          // peak rejected or not measured
  EXPECT_TRUE(std::isnan(mfu_or_nan(NAN, 1e9)));
  EXPECT_EQ(format_mfu_percent(mfu_or_nan(34.9e9, 29.2e9)), "n/a");
  EXPECT_EQ(format_mfu_fraction(mfu_or_nan(34.9e9, 29.2e9)), "n/a");
  EXPECT_EQ(format_mfu_percent(0.882), "88.2%");
  EXPECT_EQ(format_mfu_fraction(0.25), "0.2500");
}

}  // namespace
}  // namespace trident
