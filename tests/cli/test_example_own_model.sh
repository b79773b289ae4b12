#!/usr/bin/env bash
# The bring-your-own-model example (examples/own_model) on every kind of layout: each run
# trains the example's residual MLP on the grid and compares it with the same model on one
# rank; the example prints PASS/FAIL and exits non-zero on FAIL.
#   2 ranks: dp 2; tp 2; pp 2          4 ranks: dp2×tp2, tp2×pp2, dp2×pp2 (+ pp 4 with GPipe)
#   8 ranks: dp2×tp2×pp2 (oversubscribed)
# usage: test_example_own_model.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
# (the example is built next to the trident binary, in examples/own_model)
set -uo pipefail
bin=$1 scratch=$3
example="$(dirname "$bin")/examples/own_model"
rm -rf "$scratch" && mkdir -p "$scratch"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
if [ ! -x "$example" ]; then
  echo "FAIL: $example not built (cmake --build <dir> --target own_model)"; exit 1
fi

failures=0
run() {  # run NP ARGS...: one layout
  local np=$1; shift
  local name="np${np}${*// /}"
  local log="$scratch/${name//-/_}.log"
  local start=$(date +%s)
  timeout 60 mpirun --oversubscribe -n "$np" "$example" "$@" > "$log" 2>&1
  local rc=$? elapsed=$(( $(date +%s) - start ))
  if [ $rc -ne 0 ] || ! grep -qx PASS "$log"; then
    echo "FAIL -n $np $*: exit $rc after ${elapsed}s"; tail -n 8 "$log"; failures=$((failures + 1))
  else
    echo "ok   -n $np $*: ${elapsed}s, $(grep 'max relative difference' "$log")"
  fi
}

run 2 --dp 2
run 2 --tp 2
run 2 --pp 2
run 4 --dp 2 --tp 2
run 4 --tp 2 --pp 2
run 4 --dp 2 --pp 2
run 4 --pp 4 --schedule gpipe --micro-batches 2
run 8 --dp 2 --tp 2 --pp 2

# Bad arguments stop every rank with one message and exit status 2.
timeout 60 mpirun -n 2 "$example" --tp 2 --hidden 63 > "$scratch/bad.log" 2>&1
rc=$?
if [ $rc -ne 2 ] || ! grep -q "hidden 63 must divide by tp 2" "$scratch/bad.log"; then
  echo "FAIL bad arguments: exit $rc"; cat "$scratch/bad.log"; failures=$((failures + 1))
else
  echo "ok   bad arguments: exit 2: $(grep -m1 own_model "$scratch/bad.log")"
fi

echo "$failures failure(s)"
[ $failures -eq 0 ]
