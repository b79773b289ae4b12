#!/usr/bin/env bash
# The whole test suite: set up, build, run every CTest test (unit, MPI, end-to-end).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh "$@"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
# In parallel: an MPI test claims its ranks (PROCESSORS), a timing test runs alone (RUN_SERIAL;
# tests/CMakeLists.txt).
ctest --test-dir build --output-on-failure --timeout 900 --parallel "$(nproc)"
