#!/usr/bin/env bash
# A rank that fails must end the whole job: every rank exits non-zero within 60 s, and the
# message names the failing rank. Two ways a rank fails:
#   1. bad input on one rank only: each rank runs in its own working directory and the deck
#      names /proc/self/cwd/data.bin — the same deck text everywhere, a truncated file on rank 1;
#   2. a rank that stops answering (SIGSTOP) mid-training: the other rank's communication thread
#      times out (comm.timeout_s), the error travels to its compute thread, the job ends.
# usage: test_rank_failure.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
set -uo pipefail
bin=$1 src=$2 scratch=$3
rm -rf "$scratch" && mkdir -p "$scratch"/{good,bad}
cd "$scratch"
failures=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

cp "$src/inputs/data/tiny-train.bin" good/data.bin
head -c 5000 "$src/inputs/data/tiny-train.bin" > bad/data.bin
deck=("$src/inputs/gpt-tiny.yaml" --set data.train=/proc/self/cwd/data.bin --set data.valid=
      --set run.threads=1 --set log.every=1)

# 1. Bad input on rank 1 only.
start=$(date +%s)
timeout 120 mpirun -n 1 -wdir "$scratch/good" "$bin" train "${deck[@]}" --set run.out_dir="$scratch/out1" \
  : -n 1 -wdir "$scratch/bad" "$bin" train "${deck[@]}" --set run.out_dir="$scratch/out1" > one.log 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $elapsed -gt 60 ]; then
  echo "FAIL bad-input-on-one-rank: exit $rc after ${elapsed}s"; failures=$((failures + 1))
elif ! grep -qE "rank 1.*data.train.*data.bin" one.log; then
  echo "FAIL bad-input-on-one-rank: no message naming rank 1 and the file:"; cat one.log; failures=$((failures + 1))
else
  echo "ok   bad-input-on-one-rank: exit $rc after ${elapsed}s: $(grep -m1 'error' one.log)"
fi

# 2. Rank 1 stops answering during training; rank 0 times out after comm.timeout_s = 5.
cp "$src/inputs/data/tiny-train.bin" bad/data.bin
start=$(date +%s)
timeout 120 mpirun -n 2 -wdir "$scratch/good" "$bin" train "${deck[@]}" --set train.steps=100000 \
  --set comm.timeout_s=5 --set run.out_dir="$scratch/out2" > two.log 2>&1 &
job=$!
stopped=""
for _ in $(seq 1 300); do
  if grep -q "^step" two.log 2>/dev/null; then
    # Only this test's ranks: a bare "$bin train" would also stop other tests' runs (ctest -j).
    for p in $(pgrep -f "$bin train .*$scratch/out2"); do
      if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then
        kill -STOP "$p" && stopped=$p
      fi
    done
    [ -n "$stopped" ] && break
  fi
  sleep 0.2
done
wait $job
rc=$?
elapsed=$(( $(date +%s) - start ))
if [ -z "$stopped" ]; then
  echo "FAIL stopped-rank: could not find rank 1 to stop"; cat two.log; failures=$((failures + 1))
elif [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $elapsed -gt 60 ]; then
  echo "FAIL stopped-rank: exit $rc after ${elapsed}s"; tail -5 two.log; failures=$((failures + 1))
elif ! grep "error (rank 0)" two.log | grep -E "communicator '(dp|world)'" | grep -q "timeout"; then
  # Where rank 1 stops decides which all-reduce times out: a gradient bucket (the message then
  # also names the bucket) or the step's loss on dp, or the step's stop-signal agreement on
  # world; either way the message names the communicator and the rank.
  echo "FAIL stopped-rank: no timeout message naming the rank and the communicator:"; tail -5 two.log; failures=$((failures + 1))
else
  echo "ok   stopped-rank: exit $rc after ${elapsed}s: $(grep -m1 'error' two.log)"
fi
[ -n "$stopped" ] && kill -KILL "$stopped" 2>/dev/null

echo "$failures failure(s)"
[ $failures -eq 0 ]
