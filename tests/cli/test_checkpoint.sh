#!/usr/bin/env bash
# Checkpoints end to end, through the trident binary under mpirun (2 ranks):
#   stop_at + resume = the uninterrupted run, bitwise (losses and grad norms in metrics.jsonl,
#   which must hold one row per step with plausible values), with checkpoint.resume: auto,
#   which starts from step 0 without a checkpoint (and says so) and resumes with one;
#   index.h5's virtual datasets, read with h5py, are finite, equal the shards' own datasets
#   put together (read directly, not through trident's reader or the index), and equal a
#   one-rank save of the same steps within a stated tolerance;
#   ckpt verify passes, then fails naming the file after a flipped byte, a truncated shard and a
#   missing shard, and a resume from a corrupted checkpoint stops every rank with status 2, naming
#   the previous checkpoint, which resumes once `latest` points at it;
#   SIGTERM and SIGUSR1 to every rank: a checkpoint and exit 0; after SIGUSR1 the resume
#   continues bitwise; a second run on the same checkpoint.dir is refused; kill -9 of one rank
#   during a save leaves `latest` on a complete checkpoint; eval, generate and ckpt inspect run.
# usage: test_checkpoint.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
source "$(dirname "$0")/lib.sh" "$@"

common=("$src/inputs/gpt-tiny.yaml" --set run.threads=1 --set train.steps=12 --set train.accum=2
        --set train.micro_batch=4 --set train.val_every=0 --set log.every=100)
run2() { timeout 300 mpirun -n 2 "$bin" "$@"; }
losses() { $py -c "import json,sys; [print(repr(json.loads(l)['loss']), repr(json.loads(l)['grad_norm'])) for l in open(sys.argv[1])]" "$1"; }
# metrics_check FILE STEPS: one row per step 1..STEPS, finite positive loss and grad norm, the
# first loss within 0.1 of ln 256 = 5.545 (the weights start at std 0.02, so the logits are
# near 0 and the softmax near uniform over the 256 byte tokens; measured 5.557), the last one
# lower (12 steps take it to about 3.6). Prints what is wrong; silent when all is well.
metrics_check() {
  $py - "$1" "$2" <<'PY'
import json, math, sys
try:
    rows = [json.loads(line) for line in open(sys.argv[1])]
except OSError as e:
    sys.exit(f"{sys.argv[1]}: {e}")
n = int(sys.argv[2])
if [r.get("step") for r in rows] != list(range(1, n + 1)):
    sys.exit(f"{sys.argv[1]}: steps {[r.get('step') for r in rows]}, expected 1..{n}")
for r in rows:
    if not all(math.isfinite(r[k]) and r[k] > 0 for k in ("loss", "grad_norm")):
        sys.exit(f"{sys.argv[1]}: step {r['step']}: loss {r['loss']}, grad_norm {r['grad_norm']}")
if abs(rows[0]["loss"] - math.log(256)) > 0.1:
    sys.exit(f"{sys.argv[1]}: first loss {rows[0]['loss']}, expected ln 256 = 5.545 +- 0.1")
if rows[-1]["loss"] >= rows[0]["loss"]:
    sys.exit(f"{sys.argv[1]}: loss did not fall: {rows[0]['loss']} -> {rows[-1]['loss']}")
PY
}
# same_losses NAME A B STEPS: both metrics files pass metrics_check and agree bitwise.
same_losses() {
  local name=$1 a=$2 b=$3 steps=$4 bad
  for f in "$a" "$b"; do
    if ! bad=$(metrics_check "$f" "$steps" 2>&1); then fail "$name: $bad"; return; fi
  done
  if diff <(losses "$a") <(losses "$b") >/dev/null; then
    ok "$name: bitwise equal over $steps steps (last loss $(losses "$b" | tail -1 | cut -d' ' -f1))"
  else
    fail "$name: losses differ:"; diff <(losses "$a") <(losses "$b") | head -5
  fi
}
# first_step_line LOG: the step number of the first progress line.
first_step_line() { grep -m1 -oE '^step +[0-9]+' "$1" | grep -oE '[0-9]+'; }

# 1. Uninterrupted vs stop_at 5 + resume (tp 2 so the checkpoint is sharded), both halves with
#    checkpoint.resume: auto: the first finds no checkpoint and starts from step 0 (and says
#    so), the second resumes from step 5. (resume: true is tested after SIGUSR1, below.)
run2 train "${common[@]}" --set parallel.tp=2 --set run.out_dir=whole >whole.log 2>&1 || fail "uninterrupted run: $(tail -3 whole.log)"
split=("${common[@]}" --set parallel.tp=2 --set run.out_dir=split --set checkpoint.dir=ck
       --set checkpoint.resume=auto)
run2 train "${split[@]}" --set train.stop_at=5 >first.log 2>&1 || fail "stop_at run: $(tail -3 first.log)"
[ -L ck/latest ] && [ "$(readlink ck/latest)" = "step_00000005" ] || fail "latest is not step_00000005: $(ls -l ck)"
if grep -q "no checkpoint yet: starting from step 0" first.log && ! grep -q "^resumed from" first.log \
   && [ "$(first_step_line first.log)" = 1 ]; then
  ok "resume auto without a checkpoint: $(grep -m1 'no checkpoint yet' first.log | sed 's|/.*/ck |ck |')"
else
  fail "resume auto without a checkpoint: first step $(first_step_line first.log); $(grep -m1 -E 'checkpoint.resume|^resumed' first.log)"
fi
run2 train "${split[@]}" >second.log 2>&1 || fail "resumed run: $(tail -3 second.log)"
if grep -qE "^resumed from .*/ck/step_00000005 \(step 5," second.log && [ "$(first_step_line second.log)" = 6 ]; then
  ok "resume auto with a checkpoint: $(grep -m1 '^resumed from' second.log | sed 's|/.*/ck/|ck/|')"
else
  fail "resume auto with a checkpoint: first step $(first_step_line second.log); $(grep -m1 -E 'checkpoint.resume|^resumed' second.log)"
fi
same_losses "stop_at 5 + resume auto vs uninterrupted" whole/metrics.jsonl split/metrics.jsonl 12

# 2. The checkpoint's values, read with h5py: through index.h5 (every global tensor finite),
#    against the shards read directly (each element held exactly once, and equal bitwise), and
#    against a one-rank save after the same 5 steps (same global batch: dp 1 in both).
timeout 300 "$bin" train "${common[@]}" --set run.out_dir=one --set checkpoint.dir=ckone \
  --set train.stop_at=5 >one.log 2>&1 || fail "one-rank stop_at run: $(tail -3 one.log)"
# Tolerance against the one-rank save: per tensor, max |tp2 - one| <= 2e-3 * max |one|. The two
# differ in fp32 summation order only; after 5 AdamW steps that leaves at most 1.6e-4 of the
# tensor's largest value (measured; params/h0.qkvb, a bias near 2e-3 moved by sign-sensitive
# Adam updates), while a block put in the wrong place or left out differs by O(1) of it.
out=$($py - ck/step_00000005 ckone/step_00000005 2e-3 <<'PY' 2>&1
import os, sys
import h5py
import numpy as np

ckpt, ref, rel = sys.argv[1], sys.argv[2], float(sys.argv[3])
problems = []

def global_tensors(path):
    with h5py.File(os.path.join(path, "index.h5"), "r") as index:
        names = []
        index.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        shards = [s.decode() if isinstance(s, bytes) else str(s) for s in index.attrs["shard_files"]]
        return {n: np.asarray(index[n][()], dtype=np.float32) for n in names}, shards

tensors, shard_files = global_tensors(ckpt)
# GPT-2 with 4 blocks: 12 tensors per block + wte, wpe, lnfw, lnfb; params, adam_m, adam_v.
if len(tensors) != 3 * (4 * 12 + 4):
    problems.append(f"{len(tensors)} global tensors, expected 156")
for name, t in tensors.items():
    if not np.isfinite(t).all():
        problems.append(f"{name}: {int((~np.isfinite(t)).sum())} of {t.size} elements not finite")

# Put every tensor together from the shards' own datasets (/<name>/<k>, attribute start).
assembled, hits, sources = {}, {}, {}
for shard_name in shard_files:
    with h5py.File(os.path.join(ckpt, shard_name), "r") as shard:
        blocks = []
        shard.visititems(lambda n, o: blocks.append(n) if isinstance(o, h5py.Dataset) else None)
        for block in blocks:
            name = block.rsplit("/", 1)[0]
            shape = tuple(int(d) for d in shard[name].attrs["global_shape"])
            data = np.asarray(shard[block][()], dtype=np.float32)
            where = tuple(slice(int(s), int(s) + c) for s, c in zip(shard[block].attrs["start"], data.shape))
            assembled.setdefault(name, np.zeros(shape, np.float32))[where] = data
            hits.setdefault(name, np.zeros(shape, np.int32))[where] += 1
            sources.setdefault(name, set()).add(shard_name)
if set(assembled) != set(tensors):
    problems.append(f"tensors in the shards but not the index: {sorted(set(assembled) - set(tensors))[:3]}, "
                    f"in the index but not the shards: {sorted(set(tensors) - set(assembled))[:3]}")
split = sum(len(s) > 1 for s in sources.values())
if split == 0:
    problems.append("no tensor is split over more than one shard: not a sharded checkpoint")
for name in sorted(set(assembled) & set(tensors)):
    if not (hits[name] == 1).all():
        problems.append(f"{name}: {int((hits[name] != 1).sum())} elements held by != 1 shard")
    elif not np.array_equal(assembled[name], tensors[name]):
        problems.append(f"{name}: index.h5 differs from its shards")

reference, _ = global_tensors(ref)
worst, worst_name = 0.0, ""
for name, t in tensors.items():
    r = reference.get(name)
    if r is None or r.shape != t.shape:
        problems.append(f"{name}: shape {t.shape}, one-rank save {None if r is None else r.shape}")
        continue
    d = float(np.abs(t - r).max() / max(np.abs(r).max(), 1e-30))
    if not d <= rel:
        problems.append(f"{name}: max |tp2 - one rank| is {d:.3g} of max |one rank|, bound {rel}")
    if d > worst:
        worst, worst_name = d, name
if problems:
    print("\n".join(problems[:10]))
    sys.exit(1)
print(f"{len(tensors)} tensors finite, {split} split over {len(shard_files)} shards equal the shards "
      f"bitwise; vs one rank: worst {worst:.2g} of the tensor's max ({worst_name}), bound {rel}")
PY
)
[ $? -eq 0 ] && ok "h5py values: $out" || fail "h5py values: $out"
out=$($py "$src/tools/ckpt_read.py" ck/latest params/wte 2>&1)
if grep -qx "shape 256 128" <<<"$out" && grep -qx "nan 0" <<<"$out"; then ok "ckpt_read.py: $(head -2 <<<"$out" | tr '\n' ' ')"; else fail "ckpt_read.py: $out"; fi
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
# The message names the shard and the way back (Note [A damaged latest]): the previous
# checkpoint (step 5; keep 2) and the command that points latest at it.
[ $rc -eq 2 ] && grep -q "$shard" <<<"$err" && ok "resume from a truncated shard: exit 2" || fail "resume from bad: exit $rc: $err"
grep -qE "The previous checkpoint is (.*/)?bad/step_00000005: .*ln -sfn step_00000005 (.*/)?bad/latest" <<<"$err" \
  && ok "resume from a truncated shard: the message names step_00000005 and ln -sfn" || fail "resume from bad: no way back in: $err"
ln -sfn step_00000005 bad/latest
run2 train "${common[@]}" --set parallel.tp=2 --set run.out_dir=badrun --set checkpoint.dir=bad \
  --set checkpoint.resume=true >badrun.log 2>&1 && grep -qE "^resumed from (.*/)?bad/step_00000005" badrun.log \
  && ok "latest pointed back at step_00000005: resumed" || fail "resume after ln -sfn: $(tail -2 badrun.log)"

# Like Slurm's --signal, to the ranks themselves (not to mpirun, which would end the job).
# Prints how many ranks it signalled. Every pattern below names an absolute checkpoint.dir
# under this test's scratch directory, so it never matches another test's run (ctest -j).
signal_ranks() {  # SIGNAL PATTERN
  local n=0
  for p in $(pgrep -f "$2"); do
    tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -q "^OMPI_COMM_WORLD_RANK=" && kill "-$1" "$p" && n=$((n + 1))
  done
  echo $n
}
wait_for_step() { for _ in $(seq 1 300); do grep -q "^step" "$1" 2>/dev/null && break; sleep 0.1; done; }
# signal_case SIGNAL DIR: a long run signalled at every rank; exit 0, a checkpoint that
# verifies, "stopped by signal". Leaves the step it stopped at in $stopped_at.
signal_case() {
  local sig=$1 dir=$2 rc n
  run2 train "${common[@]}" --set train.steps=100000 --set run.out_dir=$dir --set checkpoint.dir="$PWD/ck$dir" \
    >$dir.log 2>&1 &
  local job=$!
  wait_for_step $dir.log
  sleep 0.5
  n=$(signal_ranks $sig "$bin train .*$PWD/ck$dir")
  # A signal that is ignored would leave the run going for 100000 steps: at most 60 s.
  local hung=""
  for _ in $(seq 1 600); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
  if kill -0 $job 2>/dev/null; then hung=" (still running 60 s after the signal, killed)"; pkill -KILL -f "$bin train .*$PWD/ck$dir"; fi
  wait $job; rc=$?
  stopped_at=$(readlink ck$dir/latest 2>/dev/null | sed 's/^step_0*//')
  if [ $rc -eq 0 ] && [ "$n" = 2 ] && grep -q "^stopped by signal: $stopped_at steps" $dir.log \
     && grep -q "(stop signal," $dir.log && "$bin" ckpt verify ck$dir >/dev/null 2>&1; then
    ok "SIG$sig to $n ranks: exit 0, $(grep -o 'checkpoint: .*' $dir.log | sed 's|/.*/ck|ck|')"
  else
    fail "SIG$sig to $n ranks: exit $rc$hung; $(tail -3 $dir.log)"
    stopped_at=""
  fi
}

# 4. SIGTERM to every rank: checkpoint at the next step boundary, exit 0.
signal_case TERM sig

# 5. SIGUSR1 (Slurm's warning) the same; then a resume continues bitwise: 3 steps more against
#    an uninterrupted run to the same step (stop_at leaves the schedule of 100000 steps as is).
signal_case USR1 usr
if [ -n "$stopped_at" ]; then
  run2 train "${common[@]}" --set train.steps=100000 --set run.out_dir=usr --set checkpoint.dir=ckusr \
    --set checkpoint.resume=true --set train.stop_at=$((stopped_at + 3)) >usr2.log 2>&1 \
    || fail "resume after SIGUSR1: $(tail -3 usr2.log)"
  run2 train "${common[@]}" --set train.steps=100000 --set run.out_dir=usrref \
    --set train.stop_at=$((stopped_at + 3)) >usrref.log 2>&1 || fail "reference for SIGUSR1: $(tail -3 usrref.log)"
  same_losses "SIGUSR1 at step $stopped_at + resume vs uninterrupted" usrref/metrics.jsonl usr/metrics.jsonl $((stopped_at + 3))
else
  fail "SIGUSR1: no checkpoint to resume from"
fi

# 6. Two runs on one checkpoint.dir: the second is refused.
run2 train "${common[@]}" --set train.steps=100000 --set run.out_dir=lock1 --set checkpoint.dir="$PWD/cklock" >lock1.log 2>&1 &
job=$!
wait_for_step lock1.log
err=$(run2 train "${common[@]}" --set run.out_dir=lock2 --set checkpoint.dir=cklock 2>&1 >/dev/null); rc=$?
pkill -TERM -f "$bin train .*$PWD/cklock"; wait $job
[ $rc -eq 2 ] && grep -q "in use" <<<"$err" && ok "second run on one checkpoint.dir: $(grep 'trident: error' <<<"$err")" || fail "lock: exit $rc: $err"

# 7. kill -9 of one rank while a checkpoint is being written: latest stays on a complete one.
# A bigger model so that a save takes long enough to be caught in the act (.tmp directory).
run2 train "${common[@]}" --set model.d_model=512 --set model.heads=8 --set train.steps=100000 \
  --set checkpoint.every=1 --set checkpoint.keep=3 --set run.out_dir=kill --set checkpoint.dir="$PWD/ckkill" >kill.log 2>&1 &
job=$!
killed=""
for _ in $(seq 1 1200); do
  if [ -L ckkill/latest ] && ls -d ckkill/*.tmp >/dev/null 2>&1; then
    for p in $(pgrep -f "$bin train .*$PWD/ckkill"); do
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

finish
