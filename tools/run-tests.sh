#!/usr/bin/env bash
# The whole test suite: set up, build, run every CTest test (unit, MPI, end-to-end).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh "$@"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
# In parallel, one test more than the cores (the scripts wait a third of their time); an MPI
# test claims two (PROCESSORS) and a test that bounds times runs alone (RUN_SERIAL; see
# tests/CMakeLists.txt and docs/decisions.md, "CI time").
ctest --test-dir build --output-on-failure --timeout 900 --parallel "$(($(nproc) + 1))"
