#!/usr/bin/env bash
# The sanitizer build (CI's second build): trident with AddressSanitizer + UndefinedBehavior-
# Sanitizer in build-asan/, then the CTest tests labelled `sanitize` — every unit test and the
# MPI tests (2, 4 and 8 ranks). Left out, and why: docs/decisions.md, "Sanitizer build".
# Any ASan or UBSan report, or a leak in trident's own code, fails the test that made it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh fuzz  # clang 14 and its sanitizer and OpenMP runtimes
start=$SECONDS

# Leaks are checked; only third-party libraries' own leaks are suppressed (tools/lsan.supp).
# ASan stops at its first report by default; UBSan does through -fno-sanitize-recover.
export ASAN_OPTIONS=strict_string_checks=1:check_initialization_order=1
export LSAN_OPTIONS=suppressions=$PWD/tools/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# clang 14, not the normal build's gcc: at the same -O1 -g1 with the sanitizers it compiled our
# files in about 60% of gcc's time (docs/decisions.md, "CI time"). A build-asan/ configured
# with gcc by an earlier version of this script is configured afresh.
if ! grep -qs '^CMAKE_CXX_COMPILER:.*clang++-14' build-asan/CMakeCache.txt; then
  rm -rf build-asan
  CC=clang-14 CXX=clang++-14 cmake -S . -B build-asan "${generator[@]}" -DTRIDENT_SANITIZE=ON \
    -DTRIDENT_CUDA=OFF -DTRIDENT_NATIVE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
echo "run-sanitized: building the test programs (target sanitize_tests) in build-asan/"
# Building runs each gtest program once (test discovery), so the options above apply here too.
cmake --build build-asan --target sanitize_tests --parallel "$(nproc)"
echo "run-sanitized: built in $((SECONDS - start)) s"

# The two long training curves (100 bf16 steps against fp32, 250 steps of loss falling) run the
# ops the short tests run, only for longer: under ASan they took 600+ and 193 s (docs/decisions.md,
# "Sanitizer build").
long='GptBf16\.HundredTrainingSteps|Training\.LossFallsOnBundledData'
selected=$(ctest --test-dir build-asan -N -L sanitize -E "$long" | sed -n 's/^Total Tests: //p')
all=$(ctest --test-dir build-asan -N | sed -n 's/^Total Tests: //p')
not_run=$(ctest --test-dir build-asan -N -LE sanitize | sed -n 's/^ *Test *#[0-9]*: //p' | tr '\n' ' ')
echo "run-sanitized: running the $selected tests labelled 'sanitize' of $all; not run: $not_run" \
  "and the long curves ($long)"
ctest --test-dir build-asan -L sanitize -E "$long" --output-on-failure --timeout 600 \
  --parallel "$(nproc)"
echo "run-sanitized: the 'sanitize' tests passed under ASan + UBSan; build and run took $((SECONDS - start)) s"
