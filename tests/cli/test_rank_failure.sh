#!/usr/bin/env bash
# A rank that fails must end the whole job within 60 s, with the exit status README's "Exit
# status" promises, and the message names the failing rank. Three ways a rank fails:
#   1. bad input found during setup on some ranks only: each rank runs in its own working
#      directory and the deck names /proc/self/cwd/data.bin — the same deck text everywhere, a
#      good file on rank 0, truncated files (5000 and 7000 bytes) on ranks 1 and 2. setup_step
#      agrees on the worst code: status 2 from every rank, and exactly one message, from the
#      lowest failing rank (1, naming its 5000 bytes);
#   2. a rank that stops answering (SIGSTOP) mid-training: the other rank's collective times out
#      (comm.timeout_s), an internal error (status 1) that MPI_Abort gives to mpirun; exactly
#      one message from rank 0 naming the communicator. The stopped rank may add its own (mpirun
#      sends it SIGCONT before killing it, and it then finds its own collective timed out), so
#      rank 1 may print at most one;
#   3. as 2, but while a checkpoint is being saved (see case 3 below).
# Only this test's rank is stopped: the pgrep pattern ends at this test's run.out_dir, and a
# decoy process that differs only in that directory must be left running.
# usage: test_rank_failure.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
set -uo pipefail
bin=$1 src=$2 scratch=$3
rm -rf "$scratch" && mkdir -p "$scratch"/{good,bad1,bad2}
cd "$scratch"
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
ok() { echo "ok   $*"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

# SIGSTOPs rank 1 of the run whose run.out_dir is OUT_DIR and adds its pid to `stopped`. Only
# this test's ranks: a bare "$bin train" would also stop other tests' runs (ctest -j).
stop_rank1() {  # OUT_DIR
  local p
  for p in $(pgrep -f "$bin train .*run\.out_dir=$1( |\$)"); do
    if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then
      kill -STOP "$p" && stopped+=("$p")
    fi
  done
}

cp "$src/inputs/data/tiny-train.bin" good/data.bin
head -c 5000 "$src/inputs/data/tiny-train.bin" > bad1/data.bin
head -c 7000 "$src/inputs/data/tiny-train.bin" > bad2/data.bin
deck=("$src/inputs/gpt-tiny.yaml" --set data.train=/proc/self/cwd/data.bin --set data.valid=
      --set run.threads=1 --set log.every=1)

# 1. Bad input on ranks 1 and 2 of 3.
start=$(date +%s)
timeout 120 mpirun -n 1 -wdir "$scratch/good" "$bin" train "${deck[@]}" --set run.out_dir="$scratch/out1" \
  : -n 1 -wdir "$scratch/bad1" "$bin" train "${deck[@]}" --set run.out_dir="$scratch/out1" \
  : -n 1 -wdir "$scratch/bad2" "$bin" train "${deck[@]}" --set run.out_dir="$scratch/out1" > one.log 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
errors=$(grep -c "trident: error" one.log)
if [ $rc -ne 2 ] || [ $elapsed -gt 60 ]; then
  fail "bad-input-on-two-ranks: exit $rc after ${elapsed}s, expected 2 within 60 s:"; tail -5 one.log
elif [ "$errors" -ne 1 ]; then
  fail "bad-input-on-two-ranks: $errors error lines, expected exactly one (from rank 1):"; grep "trident: error" one.log
elif ! grep -qE "^trident: error \(rank 1\): data.train: .*data.bin: file is 5000 bytes" one.log; then
  fail "bad-input-on-two-ranks: the message is not rank 1's (data.train, 5000 bytes):"; grep "trident: error" one.log
else
  ok "bad-input-on-two-ranks: exit $rc after ${elapsed}s, one message: $(grep 'trident: error' one.log)"
fi

# 2. Rank 1 stops answering during training; rank 0 times out after comm.timeout_s = 5.
# The decoy: a process with OMPI_COMM_WORLD_RANK=1 whose command line is "$bin train ..." with
# another run.out_dir that starts with this one's (python keeps its arguments on its command
# line and just sleeps).
OMPI_COMM_WORLD_RANK=1 /usr/bin/python3 -c 'import time; time.sleep(120)' "$bin" train \
  --set run.out_dir="$scratch/out2-decoy" &
decoy=$!
start=$(date +%s)
timeout 120 mpirun -n 2 -wdir "$scratch/good" "$bin" train "${deck[@]}" --set train.steps=100000 \
  --set comm.timeout_s=5 --set run.out_dir="$scratch/out2" > two.log 2>&1 &
job=$!
stopped=()
for _ in $(seq 1 300); do
  if grep -q "^step" two.log 2>/dev/null; then
    stop_rank1 "$scratch/out2"
    [ ${#stopped[@]} -gt 0 ] && break
  fi
  sleep 0.2
done
decoy_state=$(awk '{print $3}' /proc/$decoy/stat 2>/dev/null)
wait $job
rc=$?
elapsed=$(( $(date +%s) - start ))
rank0=$(grep -c "^trident: error (rank 0)" two.log)
rank1=$(grep -c "^trident: error (rank 1)" two.log)
if [ ${#stopped[@]} -ne 1 ]; then
  fail "stopped-rank: stopped ${#stopped[@]} processes (${stopped[*]}), expected exactly rank 1 of this run"; tail -5 two.log
elif [ "$decoy_state" = T ]; then
  fail "stopped-rank: the decoy (another run.out_dir) was stopped too"
elif [ $rc -ne 1 ] || [ $elapsed -gt 60 ]; then
  fail "stopped-rank: exit $rc after ${elapsed}s, expected 1 (MPI_Abort of an internal error) within 60 s"; tail -5 two.log
elif [ "$rank0" -ne 1 ] || [ "$rank1" -gt 1 ]; then
  fail "stopped-rank: $rank0 error lines from rank 0 (expected 1), $rank1 from rank 1 (expected at most 1):"
  grep "trident: error" two.log
elif ! grep "^trident: error (rank 0)" two.log | grep -E "communicator '(dp|world)'" | grep -q "timeout"; then
  # Where rank 1 stops decides which all-reduce times out: a gradient bucket (the message then
  # also names the bucket) or the step's loss on dp, or the step's stop-signal agreement on
  # world; either way the message names the communicator and the rank.
  fail "stopped-rank: no timeout message naming the rank and the communicator:"; tail -5 two.log
else
  ok "stopped-rank: exit $rc after ${elapsed}s (the decoy left running): $(grep -m1 'error (rank 0)' two.log)"
fi
for p in "${stopped[@]}"; do kill -KILL "$p" 2>/dev/null; done
kill "$decoy" 2>/dev/null

# 3. Rank 1 stops answering while a checkpoint is being saved (caught by its step_X.tmp
#    directory; a bigger model so a save lasts long enough): the save's own collectives are
#    under comm.timeout_s too (Note [Checkpoint collectives under the timeout]), so rank 0 ends
#    the job with status 1 instead of waiting forever; latest stays on a complete checkpoint.
start=$(date +%s)
timeout 120 mpirun -n 2 -wdir "$scratch/good" "$bin" train "${deck[@]}" --set train.steps=100000 \
  --set model.d_model=512 --set model.heads=8 --set checkpoint.every=1 --set checkpoint.keep=3 \
  --set checkpoint.dir="$scratch/ck3" --set comm.timeout_s=5 --set run.out_dir="$scratch/out3" > three.log 2>&1 &
job=$!
stopped=()
for _ in $(seq 1 1500); do
  if [ -L "$scratch/ck3/latest" ] && ls -d "$scratch"/ck3/*.tmp >/dev/null 2>&1; then
    stop_rank1 "$scratch/out3"
    [ ${#stopped[@]} -gt 0 ] && break
  fi
  sleep 0.02
done
wait $job
rc=$?
elapsed=$(( $(date +%s) - start ))
if [ ${#stopped[@]} -ne 1 ]; then
  fail "stopped-in-save: never caught a save in progress (stopped ${#stopped[@]})"; tail -3 three.log
elif [ $rc -ne 1 ] || [ $elapsed -gt 60 ]; then
  fail "stopped-in-save: exit $rc after ${elapsed}s, expected 1 within 60 s (a hang: the save's collectives wait forever)"
  tail -3 three.log
elif ! grep "^trident: error (rank 0)" three.log | grep -q "within the timeout of 5 s (comm.timeout_s)"; then
  fail "stopped-in-save: no timeout message from rank 0:"; grep "trident: error" three.log
elif ! "$bin" ckpt verify "$scratch/ck3" >verify3.log 2>&1; then
  fail "stopped-in-save: latest does not verify: $(cat verify3.log)"
else
  ok "stopped-in-save: exit $rc after ${elapsed}s, latest verifies: $(grep -m1 'error (rank 0)' three.log | cut -c1-160)"
fi
for p in "${stopped[@]}"; do kill -KILL "$p" 2>/dev/null; done

echo "$failures failure(s)"
[ $failures -eq 0 ]
