// The BLAS core check (Note [BLAS core check] in trident/blas_core.h): cpuid, the table of
// OpenBLAS core names, and the re-exec.
#include "trident/blas_core.h"

#include <cblas.h>
#include <cpuid.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

// CPUID leaf 7, EDX: gcc's <cpuid.h> names the AMX bits, clang 14's does not (the fuzz build).
#ifndef bit_AMX_BF16
#define bit_AMX_BF16 (1u << 22)
#endif
#ifndef bit_AMX_TILE
#define bit_AMX_TILE (1u << 24)
#endif

namespace trident {
namespace {

// XCR0: which register states the OS saves on a context switch. A CPU flag without its state
// bit cannot be used (a hypervisor or kernel may disable AVX-512 that way).
uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

const char* env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const unsigned max_leaf = a;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  f.amd = std::strcmp(vendor, "AuthenticAMD") == 0 || std::strcmp(vendor, "HygonGenuine") == 0;

  __get_cpuid(1, &a, &b, &c, &d);
  if (!(c & bit_OSXSAVE)) return f;  // no xgetbv: the OS saves no AVX state
  const uint64_t xcr = xcr0();
  const bool os_avx = (xcr & 0x6) == 0x6;          // SSE and AVX (YMM) state
  const bool os_avx512 = (xcr & 0xe6) == 0xe6;     // plus opmask, ZMM0-15 high, ZMM16-31
  const bool os_amx = (xcr & 0x60000) == 0x60000;  // XTILECFG and XTILEDATA
  f.avx = os_avx && (c & bit_AVX);
  f.fma = f.avx && (c & bit_FMA);
  if (max_leaf < 7) return f;

  __get_cpuid_count(7, 0, &a, &b, &c, &d);
  f.avx2 = f.avx && (b & bit_AVX2);
  f.avx512f = os_avx512 && (b & bit_AVX512F);
  f.avx512dq = f.avx512f && (b & bit_AVX512DQ);
  f.avx512bw = f.avx512f && (b & bit_AVX512BW);
  f.avx512vl = f.avx512f && (b & bit_AVX512VL);
  f.amx = os_amx && (d & bit_AMX_TILE) && (d & bit_AMX_BF16);
  const unsigned max_sub = a;
  if (max_sub >= 1) {
    __get_cpuid_count(7, 1, &a, &b, &c, &d);
    f.avx512_bf16 = f.avx512f && (a & bit_AVX512BF16);
  }
  return f;
}

VectorIsa best_isa(const CpuFeatures& f) {
  // SkylakeX's kernels use F, BW, DQ and VL; Knights Landing has F without BW/VL, and
  // OpenBLAS gives it Haswell's kernels.
  const bool avx512 = f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl;
  if (avx512 && f.avx512_bf16 && f.amx) return VectorIsa::kAmx;
  if (avx512 && f.avx512_bf16) return VectorIsa::kAvx512Bf16;
  if (avx512) return VectorIsa::kAvx512;
  if (f.avx2 && f.fma) return VectorIsa::kAvx2;
  if (f.avx) return VectorIsa::kAvx;
  return VectorIsa::kSse;
}

int fp32_lanes(const CpuFeatures& f) {
  if (f.avx512f) return 16;
  if (f.avx) return 8;
  return 4;
}

std::string isa_name(VectorIsa isa) {
  switch (isa) {
    case VectorIsa::kAmx: return "AVX-512-BF16 and AMX";
    case VectorIsa::kAvx512Bf16: return "AVX-512-BF16";
    case VectorIsa::kAvx512: return "AVX-512";
    case VectorIsa::kAvx2: return "AVX2+FMA";
    case VectorIsa::kAvx: return "AVX";
    case VectorIsa::kSse: break;
  }
  return "SSE";
}

std::string expected_blas_core(const CpuFeatures& f) {
  switch (best_isa(f)) {
    case VectorIsa::kAmx:  // SapphireRapids (0.3.22+) adds AMX for bf16 only; fp32 is the same
    case VectorIsa::kAvx512Bf16: return "Cooperlake";
    case VectorIsa::kAvx512: return "SkylakeX";
    case VectorIsa::kAvx2: return f.amd ? "Zen" : "Haswell";
    case VectorIsa::kAvx: return "Sandybridge";
    case VectorIsa::kSse: break;
  }
  return "Prescott";
}

bool blas_core_isa(const std::string& core, VectorIsa* isa) {
  // The x86_64 names of OpenBLAS's DYNAMIC_ARCH corename table (driver/others/dynamic.c), by
  // the widest vector instructions their sgemm kernels use.
  static constexpr std::pair<const char*, VectorIsa> kCores[] = {
      {"Katmai", VectorIsa::kSse},
      {"Coppermine", VectorIsa::kSse},
      {"Northwood", VectorIsa::kSse},
      {"Prescott", VectorIsa::kSse},
      {"Banias", VectorIsa::kSse},
      {"Atom", VectorIsa::kSse},
      {"Core2", VectorIsa::kSse},
      {"Penryn", VectorIsa::kSse},
      {"Dunnington", VectorIsa::kSse},
      {"Nehalem", VectorIsa::kSse},
      {"Athlon", VectorIsa::kSse},
      {"Opteron", VectorIsa::kSse},
      {"Opteron_SSE3", VectorIsa::kSse},
      {"Barcelona", VectorIsa::kSse},
      {"Nano", VectorIsa::kSse},
      {"Bobcat", VectorIsa::kSse},
      {"Sandybridge", VectorIsa::kAvx},
      {"Bulldozer", VectorIsa::kAvx},
      {"Piledriver", VectorIsa::kAvx},
      {"Steamroller", VectorIsa::kAvx},
      {"Excavator", VectorIsa::kAvx},
      {"Haswell", VectorIsa::kAvx2},
      {"Zen", VectorIsa::kAvx2},
      {"SkylakeX", VectorIsa::kAvx512},
      {"Cooperlake", VectorIsa::kAvx512Bf16},
      {"SapphireRapids", VectorIsa::kAmx},
  };
  for (const auto& [name, level] : kCores)
    if (strcasecmp(core.c_str(), name) == 0) {
      *isa = level;
      return true;
    }
  return false;
}

BlasCoreAction decide_blas_core_action(const std::string& chosen, const std::string& expected,
                                       bool user_coretype, bool reexeced) {
  VectorIsa have{}, want{};
  if (!blas_core_isa(chosen, &have) || !blas_core_isa(expected, &want))
    return BlasCoreAction::kNone;
  if (have >= want) return BlasCoreAction::kNone;
  if (user_coretype) return BlasCoreAction::kWarnUserChoice;
  // The second process got OPENBLAS_CORETYPE and still runs a fallback: executing a third time
  // would change nothing.
  if (reexeced) return BlasCoreAction::kWarnUncorrected;
  return BlasCoreAction::kReexec;
}

BlasCoreCheck check_blas_core() {
  BlasCoreCheck c;
  const CpuFeatures f = detect_cpu_features();
  c.cpu_isa = best_isa(f);
  c.fp32_lanes = fp32_lanes(f);
  c.expected = expected_blas_core(f);
  const char* hook = std::getenv(kTestBlasCoreHook);
  c.chosen = hook && *hook ? hook : openblas_get_corename();
  c.corrected_from = env_or_empty(kBlasReexecMarker);
  const bool reexeced = !c.corrected_from.empty();
  // In the second process OPENBLAS_CORETYPE is ours, not the user's.
  if (!reexeced) c.user_coretype = env_or_empty("OPENBLAS_CORETYPE");
  c.action = decide_blas_core_action(c.chosen, c.expected, !c.user_coretype.empty(), reexeced);
  return c;
}

std::string reexec_with_blas_core(const BlasCoreCheck& check, char** argv) {
  // Before MPI_Init: the launcher's environment (PMIx / ORTE variables) is inherited and the
  // pid stays the same, so mpirun and srun see the process they started.
  setenv("OPENBLAS_CORETYPE", check.expected.c_str(), /*overwrite=*/1);
  setenv(kBlasReexecMarker, check.chosen.c_str(), /*overwrite=*/1);
  unsetenv(kTestBlasCoreHook);
  execv("/proc/self/exe", argv);
  const std::string why = std::strerror(errno);
  unsetenv("OPENBLAS_CORETYPE");  // this process keeps its kernel; do not mislead children
  unsetenv(kBlasReexecMarker);
  return why;
}

std::string blas_core_note(const BlasCoreCheck& c) {
  const std::string cpu = isa_name(c.cpu_isa);
  switch (c.action) {
    case BlasCoreAction::kNone:
      if (c.corrected_from.empty()) return "";
      return fmt::format("blas: OpenBLAS chose the {} kernel for this {} CPU (a fallback: it did "
                         "not recognise the CPU); re-executed with OPENBLAS_CORETYPE={}",
                         c.corrected_from, cpu, c.chosen);
    case BlasCoreAction::kWarnUserChoice:
      return fmt::format("blas: note: OPENBLAS_CORETYPE={} runs the {} kernel; this {} CPU "
                         "could run {} (respected as set; unset it for the faster kernel)",
                         c.user_coretype, c.chosen, cpu, c.expected);
    case BlasCoreAction::kWarnUncorrected:
    case BlasCoreAction::kReexec:  // only if the re-exec failed
      return fmt::format(
          "WARNING: OpenBLAS runs the {} kernel, but this {} CPU supports {}: "
          "GEMMs run several times slower than they could. {}Set "
          "OPENBLAS_CORETYPE={} in the job's environment, or use an OpenBLAS "
          "that knows this CPU.",
          c.chosen, cpu, c.expected,
          c.action == BlasCoreAction::kReexec
              ? fmt::format("Re-executing with the right kernel failed ({}). ", c.reexec_error)
              : fmt::format("Re-executing with OPENBLAS_CORETYPE={} did not "
                            "help (first core {}). ",
                            c.expected, c.corrected_from),
          c.expected);
  }
  return "";
}

}  // namespace trident
