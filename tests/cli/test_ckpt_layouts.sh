#!/usr/bin/env bash
# A checkpoint saved in the full 3D layout (dp 2 × tp 2 × pp 2, 8 ranks, oversubscribed) resumes
# in another layout, and one saved elsewhere resumes in 3D, through the trident binary:
#   3D, stop_at 4  -> resume as tp 2 (2 ranks)        steps 5..8
#   dp 2, stop_at 4 -> resume in 3D (8 ranks)         steps 5..8
#   3D at parallel.zero 2, stop_at 4 -> one rank, zero 0   steps 5..8
#   NeoX and Llama blocks, 3D at zero 1 -> one rank / tp 2  steps 5..8
# Each combined run (the resumed run appends to the saving run's metrics.jsonl) must match an
# uninterrupted dp-2 run step by step (tolerances below). The global batch is the same in every
# layout (micro-batch 4 × accum × dp = 16 samples), so the same samples are seen.
# (tests/mpi/test_ckpt_training.cpp covers the layouts that fit in 2 and 4 ranks.)
# usage: test_ckpt_layouts.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
source "$(dirname "$0")/lib.sh" "$@"

# warmup 2 (not the deck's 20) so that 4 steps move every tensor well away from its initial
# value: a tensor left out of the load then shows in the losses.
common=("$src/inputs/gpt-tiny.yaml" --set run.threads=1 --set train.steps=8 --set train.micro_batch=4
        --set train.warmup_steps=2 --set train.val_every=0 --set log.every=100)
run_np() { local n=$1; shift; timeout 300 mpirun -n "$n" "$bin" train "${common[@]}" "$@"; }
layout_3d=(--set parallel.tp=2 --set parallel.pp=2 --set train.accum=2)   # dp 2 on 8 ranks

# compare NAME FILE REFERENCE: 8 rows, steps 1..8, each loss within 1e-5 and each grad norm
# within 1e-4 of the reference, relative. The layouts sum in other orders (tp partial sums, the
# tied embedding across stages, accum 2 vs 4): measured at most 3e-8 (loss) and 8e-8 (norm)
# relative. The bounds are testing::expect_close's, as in the 2/4-rank tests; one tensor left
# at its initial value by the load (params/h1.fcw) moved the loss by 1.3e-4..8e-4 and the norm
# by up to 8e-3 relative.
compare() {
  local name=$1 out
  out=$($py - "$2" "$3" <<'PY' 2>&1
import json, math, sys
rows, ref = ([json.loads(line) for line in open(f)] for f in sys.argv[1:3])
if [r["step"] for r in rows] != list(range(1, 9)) or [r["step"] for r in ref] != list(range(1, 9)):
    sys.exit(f"steps {[r['step'] for r in rows]} and {[r['step'] for r in ref]}, expected 1..8")
worst = {"loss": 0.0, "grad_norm": 0.0}
bad = []
for r, e in zip(rows, ref):
    for key, bound in (("loss", 1e-5), ("grad_norm", 1e-4)):
        if not (math.isfinite(r[key]) and e[key] > 0):
            sys.exit(f"step {r['step']}: {key} {r[key]}, reference {e[key]}")
        rel = abs(r[key] - e[key]) / e[key]
        worst[key] = max(worst[key], rel)
        if rel > bound:
            bad.append(f"step {r['step']}: {key} {r[key]!r} vs {e[key]!r} ({rel:.2g} relative, bound {bound})")
if bad:
    sys.exit("\n".join(bad))
print(f"worst relative difference: loss {worst['loss']:.2g}, grad norm {worst['grad_norm']:.2g}")
PY
)
  if [ $? -eq 0 ]; then ok "$name: $out"; else fail "$name:"; echo "$out"; fi
}
# resumed LOG STEP LAYOUT: the log says it resumed at STEP from a checkpoint saved by LAYOUT.
resumed() { grep -qE "^resumed from .*step_0*$2 \(step $2, run [0-9a-f]+, saved by $3\)" "$1"; }

# The reference: dp 2, 8 steps, uninterrupted.
run_np 2 --set train.accum=2 --set run.out_dir=ref >ref.log 2>&1 || fail "reference run: $(tail -3 ref.log)"

# 1. Saved in 3D, resumed as tp 2 on 2 ranks (dp 1: accum 4).
run_np 8 "${layout_3d[@]}" --set run.out_dir=from3d --set checkpoint.dir=ck3d --set train.stop_at=4 \
  >from3d_save.log 2>&1 || fail "3D save: $(tail -3 from3d_save.log)"
grep -q "^ranks: 8 (dp 2 x tp 2 x pp 2)" from3d_save.log || fail "3D save: not dp 2 x tp 2 x pp 2: $(grep '^ranks' from3d_save.log)"
run_np 2 --set parallel.tp=2 --set train.accum=4 --set run.out_dir=from3d --set checkpoint.dir=ck3d \
  --set checkpoint.resume=true >from3d_resume.log 2>&1 || fail "tp-2 resume: $(tail -3 from3d_resume.log)"
resumed from3d_resume.log 4 "dp 2 x tp 2 x pp 2" || fail "tp-2 resume: $(grep -m1 -E '^resumed|error' from3d_resume.log)"
compare "3D (steps 1-4) then tp 2 (5-8) vs dp 2" from3d/metrics.jsonl ref/metrics.jsonl

# 2. Saved as dp 2 on 2 ranks, resumed in 3D.
run_np 2 --set train.accum=2 --set run.out_dir=to3d --set checkpoint.dir=ckdp --set train.stop_at=4 \
  >to3d_save.log 2>&1 || fail "dp-2 save: $(tail -3 to3d_save.log)"
run_np 8 "${layout_3d[@]}" --set run.out_dir=to3d --set checkpoint.dir=ckdp --set checkpoint.resume=true \
  >to3d_resume.log 2>&1 || fail "3D resume: $(tail -3 to3d_resume.log)"
resumed to3d_resume.log 4 "dp 2 x tp 1 x pp 1" || fail "3D resume: $(grep -m1 -E '^resumed|error' to3d_resume.log)"
compare "dp 2 (steps 1-4) then 3D (5-8) vs dp 2" to3d/metrics.jsonl ref/metrics.jsonl

# 3. ZeRO through the binary (Note [ZeRO-1] in src/train/zero.h): saved in 3D at zero 2, each
# rank writing the m/v pieces it owns; verified; resumed on one rank at zero 0 (accum 4).
run_np 8 "${layout_3d[@]}" --set parallel.zero=2 --set run.out_dir=zero3d --set checkpoint.dir=ckz \
  --set train.stop_at=4 >zero3d_save.log 2>&1 || fail "3D zero-2 save: $(tail -3 zero3d_save.log)"
"$bin" ckpt verify ckz/latest >zero_verify.log 2>&1 || fail "ckpt verify of the zero-2 checkpoint: $(tail -3 zero_verify.log)"
timeout 300 "$bin" train "${common[@]}" --set train.accum=4 --set run.out_dir=zero3d --set checkpoint.dir=ckz \
  --set checkpoint.resume=true >zero1rank_resume.log 2>&1 || fail "one-rank resume: $(tail -3 zero1rank_resume.log)"
resumed zero1rank_resume.log 4 "dp 2 x tp 2 x pp 2" || fail "one-rank resume: $(grep -m1 -E '^resumed|error' zero1rank_resume.log)"
compare "3D zero 2 (steps 1-4) then one rank zero 0 (5-8) vs dp 2" zero3d/metrics.jsonl ref/metrics.jsonl

# 4. The other blocks (model.family; tests/mpi/test_family_layouts.cpp covers 2 and 4 ranks): a
# NeoX checkpoint (partial rotary, parallel residual, untied head) and a Llama one (RMSNorm,
# SwiGLU, 2 kv heads of 4, untied head) saved in 3D at zero 1 resume on one rank and as tp 2,
# against the family's own uninterrupted dp-2 run, within the same bounds.
declare -A family_keys=([neox]="--set model.family=neox"
                        [llama]="--set model.family=llama --set model.kv_heads=2")
declare -A resume_as=([neox]="1 --set train.accum=4" [llama]="2 --set parallel.tp=2 --set train.accum=4")
for f in neox llama; do
  read -ra keys <<<"${family_keys[$f]}"
  read -ra resume <<<"${resume_as[$f]}"
  run_np 2 "${keys[@]}" --set train.accum=2 --set run.out_dir=ref_$f >ref_$f.log 2>&1 ||
    fail "$f reference run: $(tail -3 ref_$f.log)"
  run_np 8 "${layout_3d[@]}" "${keys[@]}" --set parallel.zero=1 --set run.out_dir=$f \
    --set checkpoint.dir=ck_$f --set train.stop_at=4 >${f}_save.log 2>&1 ||
    fail "$f 3D save: $(tail -3 ${f}_save.log)"
  run_np "${resume[@]}" "${keys[@]}" --set run.out_dir=$f --set checkpoint.dir=ck_$f \
    --set checkpoint.resume=true >${f}_resume.log 2>&1 || fail "$f resume: $(tail -3 ${f}_resume.log)"
  resumed ${f}_resume.log 4 "dp 2 x tp 2 x pp 2" ||
    fail "$f resume: $(grep -m1 -E '^resumed|error' ${f}_resume.log)"
  compare "$f: 3D zero 1 (steps 1-4) then ${resume[0]} rank(s) (5-8) vs dp 2" $f/metrics.jsonl \
    ref_$f/metrics.jsonl
done

finish
