// Which OpenBLAS kernel ("core") this process runs, and whether it is the one the CPU deserves.
//
// Note [BLAS core check]
// A DYNAMIC_ARCH OpenBLAS picks its kernels from the CPU's family and model when it loads
// (before main); a CPU newer than its table, or a VM that hides the model, gets an old, slow
// fallback, which only OPENBLAS_CORETYPE set before loading can change. So main() compares the
// chosen core with what cpuid says the CPU supports and, when it fell back, executes itself
// again with OPENBLAS_CORETYPE set (before MPI_Init, once: TRIDENT_BLAS_REEXEC marks the second
// process). docs/decisions.md says why this way; figures in docs/perf.md.
//
// The pure parts (features → expected core, chosen vs expected → action) are tested on their
// own; detect_cpu_features() and check_blas_core() read the machine and the environment.
#pragma once

#include <string>

namespace trident {

// What cpuid (and xgetbv: the OS saves the registers) says this CPU can run.
struct CpuFeatures {
  bool amd = false;  // AuthenticAMD or HygonGenuine: OpenBLAS names its AVX2 core "Zen"
  bool avx = false, avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool avx512_bf16 = false;
  bool amx = false;  // AMX-TILE and AMX-BF16 (OpenBLAS ≥ 0.3.22 uses it for bf16 GEMM only)
};

CpuFeatures detect_cpu_features();

// Vector ISA levels, in order; an OpenBLAS core name maps to the level its sgemm kernel needs.
enum class VectorIsa { kSse = 0, kAvx = 1, kAvx2 = 2, kAvx512 = 3, kAvx512Bf16 = 4, kAmx = 5 };

VectorIsa best_isa(const CpuFeatures& f);
// fp32 lanes of the widest vector registers: 16 (AVX-512), 8 (AVX, AVX2) or 4 (SSE).
int fp32_lanes(const CpuFeatures& f);
// Short text for messages: "AVX-512-BF16", "AVX2+FMA", ...
std::string isa_name(VectorIsa isa);
// The OpenBLAS x86_64 core with the fastest sgemm this CPU can run, named as 0.3.21's
// DYNAMIC_ARCH build accepts it in OPENBLAS_CORETYPE: Cooperlake, SkylakeX, Haswell or Zen,
// Sandybridge, Prescott. (AMX adds nothing to fp32 GEMM, so an AMX CPU gets Cooperlake.)
std::string expected_blas_core(const CpuFeatures& f);
// The ISA level a core name's kernels use; false for a name this table does not know
// (another architecture, a newer OpenBLAS): then no verdict is given.
bool blas_core_isa(const std::string& core, VectorIsa* isa);

enum class BlasCoreAction {
  kNone,             // the chosen core is as good as the CPU allows (or unknown: no verdict)
  kReexec,           // fell back on its own: execute again with OPENBLAS_CORETYPE = expected
  kWarnUserChoice,   // the user's OPENBLAS_CORETYPE chose a weaker core: respected, said once
  kWarnUncorrected,  // still a fallback core in the re-executed process: said loudly
};

// chosen: what OpenBLAS runs; user_coretype: OPENBLAS_CORETYPE as the user set it ("" if not);
// reexeced: this is the second process already.
BlasCoreAction decide_blas_core_action(const std::string& chosen, const std::string& expected,
                                       bool user_coretype, bool reexeced);

struct BlasCoreCheck {
  std::string chosen;          // the core OpenBLAS runs (openblas_get_corename())
  std::string expected;        // expected_blas_core() of this CPU
  std::string corrected_from;  // set in the re-executed process: the core the first one had
  std::string user_coretype;   // OPENBLAS_CORETYPE from the user ("" if unset or ours)
  VectorIsa cpu_isa = VectorIsa::kSse;
  int fp32_lanes = 4;
  BlasCoreAction action = BlasCoreAction::kNone;
  std::string reexec_error;  // kReexec left standing: why execv failed
};

// Environment variables of the check.
inline constexpr const char* kBlasReexecMarker = "TRIDENT_BLAS_REEXEC";  // value: first core
// Test hook: pretend OpenBLAS chose this core. Read only here, and dropped from the
// environment on re-exec, so the second process sees the real core (and cannot loop).
inline constexpr const char* kTestBlasCoreHook = "TRIDENT_TEST_BLAS_CORE";

// Reads cpuid, openblas_get_corename() and the environment; starts nothing.
BlasCoreCheck check_blas_core();

// For kReexec: replaces this process by itself (/proc/self/exe, same argv) with
// OPENBLAS_CORETYPE = check.expected and the marker set. Returns only if execv failed, with
// the reason; the caller carries on with the slow kernel and says so.
std::string reexec_with_blas_core(const BlasCoreCheck& check, char** argv);

// The header's note ("" when there is nothing to say): the correction made, or a warning
// naming the chosen core, the expected one and what to set.
std::string blas_core_note(const BlasCoreCheck& check);

}  // namespace trident
