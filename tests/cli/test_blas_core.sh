#!/usr/bin/env bash
# The BLAS core check through the trident binary under mpirun (2 ranks), Note [BLAS core check]:
#   a fallback core (faked with TRIDENT_TEST_BLAS_CORE, which only the first process sees) is
#   corrected by re-executing before MPI_Init, and the header names the corrected core;
#   with the re-exec marker already set it is not corrected again (no loop) but reported
#   loudly; a user's OPENBLAS_CORETYPE is respected and noted; MFU is never above 1 (text and
#   metrics JSON), and the bench: line names blas_core.
# usage: test_blas_core.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
set -uo pipefail
bin=$1 src=$2 scratch=$3
rm -rf "$scratch" && mkdir -p "$scratch"
cd "$scratch"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mpi_yield_when_idle=1
unset OPENBLAS_CORETYPE TRIDENT_BLAS_REEXEC TRIDENT_TEST_BLAS_CORE
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
ok() { echo "ok   $*"; }
py=/usr/bin/python3

common=("$src/inputs/gpt-tiny.yaml" --set run.threads=1 --set train.steps=3 --set train.val_every=0
        --set log.every=1)
run2() { timeout 300 mpirun -n 2 "$bin" "$@"; }
core_of() { grep -o 'blas_core=[A-Za-z0-9_]*' "$1" | head -1 | cut -d= -f2; }
# Every mfu in a metrics file is null or at most 1.
mfu_sane() { $py -c "
import json,sys
bad=[l for l in open(sys.argv[1]) if (m:=json.loads(l)['mfu']) is not None and not 0 <= m <= 1]
sys.exit(1 if bad else 0)" "$1"; }
# A CPU with AVX2 has a better core than Prescott, so a faked Prescott must be corrected.
has_avx2=0; grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && has_avx2=1

# 1. A faked fallback is corrected without the user doing anything.
TRIDENT_TEST_BLAS_CORE=Prescott run2 train "${common[@]}" --set run.out_dir=fixed >fixed.log 2>&1 \
  || fail "run with a faked fallback core: $(tail -3 fixed.log)"
core=$(core_of fixed.log)
if [ $has_avx2 = 0 ]; then
  [ -n "$core" ] && ok "no AVX2 here: header says blas_core=$core (nothing to correct)" || fail "no blas_core in the header"
elif [ -n "$core" ] && [ "$core" != Prescott ] && grep -q "re-executed with OPENBLAS_CORETYPE=$core" fixed.log \
     && ! grep -q "WARNING: OpenBLAS" fixed.log; then
  ok "faked Prescott corrected by re-exec under mpirun -n 2: blas_core=$core"
else
  fail "faked fallback not corrected (blas_core=$core): $(grep -i 'blas\|ranks:' fixed.log | head -4)"
fi
[ "$(grep -c '^step ' fixed.log)" = 3 ] || fail "corrected run did not print its 3 steps once each: $(grep -c '^step ' fixed.log)"
mfu_sane fixed/metrics.jsonl && ok "mfu in metrics is null or <= 1" || fail "mfu above 1 in metrics: $(head -2 fixed/metrics.jsonl)"

# 2. Marker already set (as in the re-executed process): no second re-exec, a loud warning.
if [ $has_avx2 = 1 ]; then
  TRIDENT_BLAS_REEXEC=Prescott TRIDENT_TEST_BLAS_CORE=Prescott run2 train "${common[@]}" \
    --set run.out_dir=stuck >stuck.log 2>&1 || fail "run with the marker set: $(tail -3 stuck.log)"
  if [ "$(core_of stuck.log)" = Prescott ] && grep -q "WARNING: OpenBLAS runs the Prescott kernel" stuck.log \
     && grep -q "Set OPENBLAS_CORETYPE=" stuck.log; then
    ok "uncorrectable fallback reported: $(grep -o 'WARNING: OpenBLAS runs[^:]*' stuck.log)"
  else
    fail "uncorrectable fallback not reported: $(grep -i 'blas\|warn' stuck.log | head -3)"
  fi
  mfu_sane stuck/metrics.jsonl || fail "mfu above 1 in metrics of the stuck run"
  # A rejected peak shows as n/a on every step line, never as a number.
  if grep -q "MFU is not reported" stuck.log; then
    [ "$(grep '^step ' stuck.log | grep -vc 'mfu n/a')" = 0 ] && ok "rejected peak: mfu n/a on every step" \
      || fail "rejected peak but mfu printed: $(grep '^step ' stuck.log | head -2)"
  fi

  # 3. The user's OPENBLAS_CORETYPE is respected, and noted when it is weaker than the CPU allows.
  OPENBLAS_CORETYPE=Sandybridge run2 train "${common[@]}" --set run.out_dir=user >user.log 2>&1 \
    || fail "run with OPENBLAS_CORETYPE=Sandybridge: $(tail -3 user.log)"
  if [ "$(core_of user.log)" = Sandybridge ] && grep -q "note: OPENBLAS_CORETYPE=Sandybridge" user.log; then
    ok "user's OPENBLAS_CORETYPE=Sandybridge respected and noted"
  else
    fail "user's core not respected/noted: $(grep -i 'blas' user.log | head -3)"
  fi
fi

# 4. bench: the line names the kernel; mfu is n/a or a fraction <= 1.
timeout 300 "$bin" bench "$src/inputs/gpt-tiny.yaml" --set run.threads=1 --warmup 1 --steps 2 >bench.log 2>&1 \
  || fail "bench: $(tail -3 bench.log)"
line=$(grep '^bench: tokens_per_s=' bench.log)
mfu=$(grep -o ' mfu=[^ ]*' <<<"$line" | cut -d= -f2)
if grep -q 'blas_core=[A-Za-z]' <<<"$line" && { [ "$mfu" = n/a ] || $py -c "import sys; sys.exit(0 if 0 <= float('$mfu') <= 1 else 1)"; }; then
  ok "bench line: mfu=$mfu $(grep -o 'blas_core=[^ ]*' <<<"$line")"
else
  fail "bench line: $line"
fi

[ $failures = 0 ] && echo "all blas core checks passed" || echo "$failures failure(s)"
exit $((failures > 0))
