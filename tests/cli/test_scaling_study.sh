#!/usr/bin/env bash
# tools/scaling_study.py end to end:
#   1. under a local Slurm (tools/slurm-local.sh), a weak-scaling study of inputs/gpt-tiny.yaml at
#      1, 2 and 4 ranks, each point an sbatch job: the CSV has one row per point, each row's job
#      COMPLETED, and its figures agree with that point's metrics.jsonl (medians of the timed
#      steps recomputed here), with each other (tokens/s, efficiency, the step split) and with
#      the deck (tokens per step); the three PNGs are drawn; `plot` draws them again from the
#      CSV alone without submitting anything; a file that is not a study CSV is refused;
#   2. under mpirun, a strong-scaling study over dp x tp layouts keeps the global batch, and
#      writes each point's TensorBoard events as its own run.
# Skips (77) when Slurm is not installed (tools/setup.sh installs it).
# usage: test_scaling_study.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
source "$(dirname "$0")/lib.sh" "$@"
start_local_slurm 21000
study=("$py" "$src/tools/scaling_study.py")

# Checks one study's CSV against its points' metrics files. Tolerances: the CSV holds Python's
# repr of bench.json's doubles, and bench's median is of the same doubles metrics.jsonl holds,
# so ms_per_step and exposed_comm_ms agree to 1e-9 relative (only JSON's decimal round trip);
# derived columns are recomputed from the CSV's own figures to 1e-9.
check_csv() {  # CSV EXPECTED_POINTS TIMED_STEPS MODE
  $py - "$@" <<'PY'
import csv, json, math, statistics, sys
path, want, timed_steps, mode = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), sys.argv[4]
rows = list(csv.DictReader(open(path)))
bad = []
def close(a, b, what, tol=1e-9):
    if not math.isclose(a, b, rel_tol=tol, abs_tol=1e-9):
        bad.append(f"{what}: {a!r} vs {b!r}")
if [r["point"] for r in rows] != want:
    bad.append(f"points {[r['point'] for r in rows]}, want {want}")
f = lambda r, k: float(r[k])
for r in rows:
    steps = [json.loads(l) for l in open(r["metrics"]) if l.strip()]
    timed = [s for s in steps if s["timed"]]
    if len(timed) != timed_steps:
        bad.append(f"{r['point']}: {len(timed)} timed steps in {r['metrics']}, want {timed_steps}")
        continue
    close(f(r, "ms_per_step"), statistics.median(s["ms_per_step"] for s in timed), r["point"] + " ms_per_step")
    close(f(r, "exposed_comm_ms"), statistics.median(s["exposed_comm_ms"] for s in timed), r["point"] + " exposed_comm_ms")
    dp = int(r["dp"])
    close(f(r, "tokens_per_step"), int(r["micro_batch"]) * int(r["accum"]) * 64 * dp, r["point"] + " tokens_per_step")
    close(f(r, "tokens_per_s"), f(r, "tokens_per_step") / (f(r, "ms_per_step") / 1e3), r["point"] + " tokens_per_s")
    parts = sum(f(r, k) for k in ("compute_ms", "tp_comm_ms", "exposed_comm_ms", "bubble_ms"))
    close(parts, f(r, "ms_per_step"), r["point"] + " step split")
    r0 = rows[0]
    eff = (f(r, "tokens_per_s") / f(r0, "tokens_per_s")) / (f(r, "ranks") / f(r0, "ranks"))
    close(f(r, "efficiency"), eff, r["point"] + " efficiency")
    if r["mfu"] != "" and not 0 < f(r, "mfu") <= 1:
        bad.append(f"{r['point']}: mfu {r['mfu']}")
if mode == "weak":
    per_replica = {(r["micro_batch"], r["accum"]) for r in rows}
    if len(per_replica) != 1: bad.append(f"weak scaling changed the per-replica batch: {per_replica}")
else:
    if len({r["tokens_per_step"] for r in rows}) != 1:
        bad.append(f"strong scaling changed the global batch: {[r['tokens_per_step'] for r in rows]}")
print("\n".join(bad) if bad else f"{len(rows)} rows agree with their metrics files")
sys.exit(1 if bad else 0)
PY
}
pngs_ok() {  # DIR
  for p in throughput breakdown mfu; do
    [ "$(head -c 8 "$1/$p.png" 2>/dev/null | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || return 1
    [ "$(stat -c %s "$1/$p.png")" -gt 10000 ] || return 1
  done
}

# 1. Weak scaling under Slurm.
timeout 600 "${study[@]}" run "$src/inputs/gpt-tiny.yaml" --mode weak --ranks 1,2,4 --steps 3 --warmup 1 \
  --launcher slurm --bin "$bin" --out weak >weak.log 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  fail "weak study exit $rc: $(tail -5 weak.log)"
else
  out=$(check_csv weak/study.csv dp1_tp1_pp1,dp2_tp1_pp1,dp4_tp1_pp1 3 weak) && ok "weak study under Slurm: $out" || fail "weak study CSV: $out"
  jobs_ok=0
  for job in $($py -c "import csv; [print(r['job']) for r in csv.DictReader(open('weak/study.csv'))]"); do
    scontrol show job "$job" 2>/dev/null | grep -q "JobState=COMPLETED" && jobs_ok=$((jobs_ok + 1))
  done
  [ $jobs_ok -eq 3 ] && ok "each point was a Slurm job that COMPLETED" || fail "only $jobs_ok of 3 points are completed Slurm jobs"
  grep -q "point 2/3" weak.log && ok "progress shown: $(grep -c 'point ' weak.log) progress lines" || fail "no progress lines in weak.log"
  pngs_ok weak && ok "throughput.png, breakdown.png, mfu.png drawn" || fail "PNGs missing or empty: $(ls -l weak)"
  # Re-plot from the CSV alone: the PNGs come back, nothing is submitted.
  rm -f weak/*.png
  before=$(scontrol show jobs 2>/dev/null | grep -c JobId=)
  "${study[@]}" plot weak/study.csv >replot.log 2>&1 && pngs_ok weak \
    && [ "$(scontrol show jobs 2>/dev/null | grep -c JobId=)" -eq "$before" ] \
    && ok "plot study.csv draws the PNGs again, no job submitted" || fail "re-plot: $(tail -3 replot.log)"
fi
printf "not,a,study\n1,2,3\n" >bad.csv
err=$("${study[@]}" plot bad.csv 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "not a study CSV" <<<"$err" && ok "a non-study CSV is refused: $err" || fail "bad CSV: exit $rc: $err"

# 2. Strong scaling under mpirun over layouts: the global batch stays, the per-replica one shrinks.
timeout 600 "${study[@]}" run "$src/inputs/gpt-tiny.yaml" --mode strong --layouts 1x1x1,2x1x1,1x2x1 \
  --steps 3 --warmup 1 --launcher mpirun --bin "$bin" --out strong >strong.log 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  fail "strong study exit $rc: $(tail -5 strong.log)"
else
  out=$(check_csv strong/study.csv dp1_tp1_pp1,dp2_tp1_pp1,dp1_tp2_pp1 3 strong) && ok "strong study under mpirun: $out" || fail "strong study CSV: $out"
  mbs=$($py -c "import csv; print(' '.join(r['micro_batch'] + 'x' + r['accum'] for r in csv.DictReader(open('strong/study.csv'))))")
  [ "$mbs" = "8x1 4x1 8x1" ] && ok "strong micro_batch x accum per point: $mbs" || fail "strong per-point batches: $mbs"
  # Each point its own TensorBoard run (tests/cli/test_tensorboard.sh reads bench's files back).
  runs=$(for d in strong/tensorboard/*/; do ls "$d" | grep -q '^events.out.tfevents' && basename "$d"; done | tr '\n' ' ')
  [ "$runs" = "dp1_tp1_pp1 dp1_tp2_pp1 dp2_tp1_pp1 " ] && ok "TensorBoard runs per point: $runs" || fail "TensorBoard runs: '$runs'"
fi

finish
