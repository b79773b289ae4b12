#!/usr/bin/env bash
# Checkpoints end to end, through the trident binary under mpirun (2 ranks):
#   stop_at + resume = the uninterrupted run, bitwise (losses and grad norms in metrics.jsonl);
#   ckpt verify passes, then fails naming the file after a flipped byte, a truncated shard and a
#   missing shard, and a resume from a corrupted checkpoint stops every rank with status 2;
#   SIGTERM to every rank: a checkpoint and exit 0; a second run on the same checkpoint.dir is
#   refused; kill -9 of one rank during a save leaves `latest` on a complete checkpoint;
#   h5py reads a global parameter by name from a sharded (tp 2) checkpoint; eval and ckpt
#   inspect run.
# usage: test_checkpoint.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
set -uo pipefail
bin=$1 src=$2 scratch=$3
rm -rf "$scratch" && mkdir -p "$scratch"
cd "$scratch"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mpi_yield_when_idle=1
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
ok() { echo "ok   $*"; }
py=/usr/bin/python3

common=("$src/inputs/gpt-tiny.yaml" --set run.threads=1 --set train.steps=12 --set train.accum=2
        --set train.micro_batch=4 --set train.val_every=0 --set log.every=100)
run2() { timeout 300 mpirun -n 2 "$bin" "$@"; }
losses() { $py -c "import json,sys; [print(repr(json.loads(l)['loss']), repr(json.loads(l)['grad_norm'])) for l in open(sys.argv[1])]" "$1"; }

# 1. Uninterrupted vs stop_at 5 + resume (tp 2 so the checkpoint is sharded).
run2 train "${common[@]}" --set parallel.tp=2 --set run.out_dir=whole >whole.log 2>&1 || fail "uninterrupted run: $(tail -3 whole.log)"
run2 train "${common[@]}" --set parallel.tp=2 --set run.out_dir=split --set checkpoint.dir=ck \
  --set train.stop_at=5 >first.log 2>&1 || fail "stop_at run: $(tail -3 first.log)"
[ -L ck/latest ] && [ "$(readlink ck/latest)" = "step_00000005" ] || fail "latest is not step_00000005: $(ls -l ck)"
run2 train "${common[@]}" --set parallel.tp=2 --set run.out_dir=split --set checkpoint.dir=ck \
  --set checkpoint.resume=true >second.log 2>&1 || fail "resumed run: $(tail -3 second.log)"
if diff <(losses whole/metrics.jsonl) <(losses split/metrics.jsonl) >/dev/null; then
  ok "stop_at 5 + resume equals the uninterrupted 12 steps bitwise ($(wc -l < split/metrics.jsonl) steps)"
else
  fail "resumed losses differ:"; diff <(losses whole/metrics.jsonl) <(losses split/metrics.jsonl) | head -5
fi

# 2. h5py reads a global parameter by name from the sharded checkpoint.
out=$($py "$src/tools/ckpt_read.py" ck/latest params/wte 2>&1)
if grep -q "250\|256" <<<"$out" && grep -q "128" <<<"$out"; then ok "h5py: $(head -1 <<<"$out")"; else fail "h5py read: $out"; fi
"$bin" ckpt inspect ck >inspect.log 2>&1 && grep -q "h0.qkvw" inspect.log && ok "ckpt inspect" || fail "ckpt inspect: $(tail -3 inspect.log)"
"$bin" eval "$src/inputs/gpt-tiny.yaml" --ckpt ck --set run.threads=1 >eval.log 2>&1 && grep -q "val_loss=" eval.log \
  && ok "eval on one rank of a tp-2 checkpoint: $(grep -o 'val_loss=[0-9.]*' eval.log)" || fail "eval: $(tail -3 eval.log)"

out=$("$bin" generate "$src/inputs/gpt-tiny.yaml" --ckpt ck --prompt "After school" --tokens 40 --set run.threads=1 2>&1)
if [ $? -eq 0 ] && [ "$(tail -1 <<<"$out" | head -c 12)" = "After school" ] && [ "$(tail -1 <<<"$out" | wc -c)" -ge 50 ]; then
  ok "generate: $(tail -1 <<<"$out" | tr -d '\n' | head -c 60)..."
else
  fail "generate: $out"
fi

# 3. verify, then corruptions.
"$bin" ckpt verify ck >verify.log 2>&1 && ok "ckpt verify: $(cat verify.log)" || fail "verify of a good checkpoint: $(cat verify.log)"
corrupt_case() {  # NAME ACTION PATTERN
  local name=$1 action=$2 pattern=$3
  rm -rf bad && cp -r ck bad && (cd bad/latest && eval "$action")
  local err rc
  err=$("$bin" ckpt verify bad 2>&1); rc=$?
  if [ $rc -ne 2 ] || ! grep -qE -e "$pattern" <<<"$err"; then fail "verify $name: exit $rc: $err"; return; fi
  ok "verify $name: $err"
}
shard=shard_r00001.h5
corrupt_case flipped-byte "$py -c \"import sys; f=open('$shard','r+b'); f.seek(-64,2); b=f.read(1); f.seek(-64,2); f.write(bytes([b[0]^0xff])); f.close()\"" "$shard"
corrupt_case truncated "truncate -s 3000 $shard" "$shard"
corrupt_case missing "rm $shard" "$shard"
# A resume from a corrupted checkpoint stops every rank with status 2.
rm -rf bad && cp -r ck bad && truncate -s 3000 bad/latest/$shard
err=$(run2 train "${common[@]}" --set parallel.tp=2 --set run.out_dir=badrun --set checkpoint.dir=bad \
  --set checkpoint.resume=true 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] && grep -q "$shard" <<<"$err" && ok "resume from a truncated shard: exit 2" || fail "resume from bad: exit $rc: $err"

# 4. SIGTERM to every rank: checkpoint at the next step boundary, exit 0.
run2 train "${common[@]}" --set train.steps=100000 --set run.out_dir=sig --set checkpoint.dir=cksig \
  >sig.log 2>&1 &
job=$!
for _ in $(seq 1 300); do grep -q "^step" sig.log 2>/dev/null && break; sleep 0.1; done
sleep 0.5
# Like Slurm's --signal, to the ranks themselves (not to mpirun, which would end the job).
signal_ranks() {  # SIGNAL PATTERN
  for p in $(pgrep -f "$2"); do
    tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -q "^OMPI_COMM_WORLD_RANK=" && kill "-$1" "$p"
  done
}
signal_ranks TERM "$bin train .*cksig"
wait $job; rc=$?
if [ $rc -eq 0 ] && grep -q "stopped by signal" sig.log && [ -L cksig/latest ] && "$bin" ckpt verify cksig >/dev/null 2>&1; then
  ok "SIGTERM: exit 0, $(grep -o 'checkpoint: .*' sig.log)"
else
  fail "SIGTERM: exit $rc; $(tail -3 sig.log)"
fi

# 5. Two runs on one checkpoint.dir: the second is refused.
run2 train "${common[@]}" --set train.steps=100000 --set run.out_dir=lock1 --set checkpoint.dir=cklock >lock1.log 2>&1 &
job=$!
for _ in $(seq 1 300); do grep -q "^step" lock1.log 2>/dev/null && break; sleep 0.1; done
err=$(run2 train "${common[@]}" --set run.out_dir=lock2 --set checkpoint.dir=cklock 2>&1 >/dev/null); rc=$?
pkill -TERM -f "$bin train .*cklock"; wait $job
[ $rc -eq 2 ] && grep -q "in use" <<<"$err" && ok "second run on one checkpoint.dir: $(grep 'trident: error' <<<"$err")" || fail "lock: exit $rc: $err"

# 6. kill -9 of one rank while a checkpoint is being written: latest stays on a complete one.
# A bigger model so that a save takes long enough to be caught in the act (.tmp directory).
run2 train "${common[@]}" --set model.d_model=512 --set model.heads=8 --set train.steps=100000 \
  --set checkpoint.every=1 --set checkpoint.keep=3 --set run.out_dir=kill --set checkpoint.dir=ckkill >kill.log 2>&1 &
job=$!
killed=""
for _ in $(seq 1 1200); do
  if [ -L ckkill/latest ] && ls -d ckkill/*.tmp >/dev/null 2>&1; then
    for p in $(pgrep -f "$bin train .*ckkill"); do
      if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then kill -KILL "$p" && killed=$p; fi
    done
    [ -n "$killed" ] && break
  fi
  sleep 0.02
done
wait $job
if [ -z "$killed" ]; then
  fail "kill -9: never caught a save in progress"
elif "$bin" ckpt verify ckkill >killverify.log 2>&1; then
  ok "kill -9 during a save: latest -> $(readlink ckkill/latest) verifies ($(ls -d ckkill/*.tmp 2>/dev/null | wc -l) partial .tmp left)"
else
  fail "kill -9: latest does not verify: $(cat killverify.log)"
fi

echo "$failures failure(s)"
[ $failures -eq 0 ]
