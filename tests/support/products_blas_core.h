// Tests run the GEMM kernel that trident runs (Note [Tests' BLAS core]).
#pragma once

#include <cstdio>
#include <cstdlib>

#include "trident/blas_core.h"

namespace trident::testing {

// Note [Tests' BLAS core]
// trident re-executes itself when OpenBLAS takes a fallback kernel for a CPU it does not know
// (Note [BLAS core check]); the test programs do the same first thing in main, so that they
// test the kernel users run, at its speed (the fallback's cost: docs/decisions.md, "CI time").
// Silent on stdout (ctest lists the tests from it); the marker is cleared so that a trident
// started by a test makes its own check.
inline void use_products_blas_core(char** argv) {
  BlasCoreCheck check = check_blas_core();
  if (check.action == BlasCoreAction::kReexec) {
    const std::string why = reexec_with_blas_core(check, argv);  // returns only on failure
    std::fprintf(stderr, "tests: re-executing with OPENBLAS_CORETYPE=%s failed (%s)\n",
                 check.expected.c_str(), why.c_str());
  }
  unsetenv(kBlasReexecMarker);
}

}  // namespace trident::testing
