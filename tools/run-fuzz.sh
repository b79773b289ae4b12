#!/usr/bin/env bash
# The libFuzzer targets (tests/fuzz/, Note [Fuzz build] in CMakeLists.txt): installs clang
# (tools/setup.sh fuzz), builds the targets into build-fuzz/ with clang 14, ASan and UBSan,
# replays every seed (tests/fuzz/corpus/) and regression input (tests/fuzz/regressions/), then
# fuzzes each target for SECONDS (default 30), one per core at a time. Fails on a finding and
# names the input libFuzzer saved; once the bug is fixed, copy that input into
# tests/fuzz/regressions/TARGET/.
# usage: tools/run-fuzz.sh [SECONDS [TARGET...]]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
shift $(( $# > 0 ? 1 : 0 ))
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(fuzz_deck fuzz_tokens fuzz_indexed fuzz_llmc_checkpoint fuzz_checkpoint_index)
fi

bash tools/setup.sh fuzz
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [ ! -f build-fuzz/CMakeCache.txt ]; then
  CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRIDENT_FUZZ=ON -DTRIDENT_CUDA=OFF -DTRIDENT_NATIVE=OFF \
    >/dev/null
fi
echo "run-fuzz: building ${targets[*]} (clang 14, ASan + UBSan) into build-fuzz/"
cmake --build build-fuzz --parallel "$(nproc)" --target "${targets[@]}"

scratch=build-fuzz/scratch
mkdir -p "$scratch"
# Leaks are checked per input (libFuzzer's -detect_leaks, on by default), not at exit: MPI_Init's
# allocations are never freed, some by MCA components whose symbols are gone by then.
# tests/fuzz/lsan.supp names the libraries whose allocations are not ours. Open MPI as root.
export ASAN_OPTIONS=leak_check_at_exit=0
export LSAN_OPTIONS=suppressions=$PWD/tests/fuzz/lsan.supp
export UBSAN_OPTIONS=print_stacktrace=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export TMPDIR=$PWD/$scratch
flags=(-timeout=20 -rss_limit_mb=2560 -malloc_limit_mb=2048 -print_final_stats=1)
fuzz_one() {  # TARGET: fuzzes it; prints one line, or the finding and returns 1
  local t=$1 fuzzer seeds regressions dict log start runs cov
  fuzzer=build-fuzz/tests/fuzz/$t
  seeds=tests/fuzz/corpus/$t regressions=tests/fuzz/regressions/$t
  mkdir -p "$scratch/$t/corpus"
  if [ ! -d "$regressions" ]; then  # no regression inputs for this target yet
    regressions=$scratch/$t/no-regressions
    mkdir -p "$regressions"
  fi
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  log=$scratch/$t/fuzz.log
  start=$(date +%s)
  # New inputs go to the scratch corpus (the first directory); the checked-in ones are read only.
  if ! "$fuzzer" "${flags[@]}" "${dict[@]}" -max_total_time="$seconds" \
       -artifact_prefix="$scratch/$t/" "$scratch/$t/corpus" "$seeds" "$regressions" \
       >"$log" 2>&1; then
    {  # one block, so that a target running beside it does not cut into the report
      echo "run-fuzz: $t: FINDING after $(( $(date +%s) - start )) s; the end of $log:"
      grep -E "fuzz finding|ERROR:|SUMMARY|runtime error|Test unit written" "$log" | head -20
      tail -40 "$log"
    } >"$scratch/$t/report"
    cat "$scratch/$t/report"
    return 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  cov=$(grep -oE "cov: [0-9]+" "$log" | tail -1)
  echo "run-fuzz: $t: ok, $runs inputs in $(( $(date +%s) - start )) s (${cov:-cov: ?} edges;" \
       "$(ls "$seeds" | wc -l) seeds and $(ls "$regressions" | wc -l) regression inputs" \
       "replayed first)"
}

# One target per core at a time (each is a single-threaded process); any finding fails the run.
status=0
for t in "${targets[@]}"; do
  while [ "$(jobs -pr | wc -l)" -ge "$(nproc)" ]; do wait -n || status=1; done
  fuzz_one "$t" &
done
while [ "$(jobs -pr | wc -l)" -gt 0 ]; do wait -n || status=1; done
exit $status
