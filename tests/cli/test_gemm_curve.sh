#!/usr/bin/env bash
# tools/gemm_curve.py turns gpu-check's GEMM measurement (bench_kernels' BM_gemm_curve as
# Google Benchmark JSON) into a hardware file's `gemm:` list (issue 45, part 4), checked
# without a GPU on a JSON written here:
#   1. each min_dim's point is the mean of its places' TFLOP/s (failed runs left out), printed
#      and written into a copy of inputs/hardware/dgx-h100.yaml in place of its points, with a
#      sources line saying it was measured;
#   2. trident plan reads the rewritten file, and its slower curve gives fewer tokens/s than
#      the published one, so the plan uses the measured points;
#   3. a file with no measured point (every run an error, as on a machine without a GPU) exits 1
#      naming the first error, and leaves the hardware file alone.
# usage: test_gemm_curve.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
source "$(dirname "$0")/lib.sh" "$@"
tool=$src/tools/gemm_curve.py

$py - <<'PY'
import json
runs = []
for d in [64, 128, 256, 512, 1024, 2048, 4096]:
    for i, place in enumerate(["rows", "inner", "cols"]):
        runs.append({"name": f"BM_gemm_curve/{d}_{place}/iterations:3/manual_time",
                     "error_occurred": False, "min_dim": float(d), "TFLOP/s": d / 20 + 10 * i})
runs.append({"name": "BM_gemm_curve/64_rows/iterations:3/manual_time", "error_occurred": True,
             "error_message": "a failed run"})
json.dump({"benchmarks": runs}, open("curve.json", "w"))
json.dump({"benchmarks": [{"name": "BM_gemm_curve/64_rows/iterations:3/manual_time",
                           "error_occurred": True, "error_message": "no usable CUDA device"}]},
          open("nogpu.json", "w"))
PY

# 1. The points: min_dim 64 → 64/20 + (0 + 10 + 20)/3 = 13.2 → 13; 4096 → 204.8 + 10 = 215.
cp "$src/inputs/hardware/dgx-h100.yaml" h100.yaml
$py "$tool" curve.json --hardware h100.yaml --device "test GPU" >run.log 2>&1 ||
  fail "gemm_curve.py failed: $(tail -3 run.log)"
grep -q "^  - {min_dim: 64, tflops: 13}$" h100.yaml && grep -q "^  - {min_dim: 4096, tflops: 215}$" h100.yaml &&
  ok "the points are the means of the places" || fail "points: $(grep min_dim h100.yaml)"
[ "$(grep -c "^  - {min_dim:" h100.yaml)" -eq 7 ] && ok "7 points replace the 7 before" ||
  fail "$(grep -c "^  - {min_dim:" h100.yaml) points"
grep -q '^  - "gemm: MEASURED by tools/gpu-check.sh on test GPU' h100.yaml &&
  ok "the sources say the curve was measured" || fail "no sources line: $(tail -2 h100.yaml)"
grep -q "tflops: 808" h100.yaml && fail "a published point is left" || ok "no published point left"

# 2. The plan reads it and uses it.
tok() { "$bin" plan "$src/inputs/gpt2-350m.yaml" --hardware "$1" --gpus 8 2>&1 | awk '$1 == "1" {print $3}'; }
measured=$(tok h100.yaml) published=$(tok "$src/inputs/hardware/dgx-h100.yaml")
awk -v m="$measured" -v p="$published" 'BEGIN { exit !(m + 0 > 0 && p + 0 > m + 0) }' &&
  ok "plan: $measured tokens/s on the slower measured curve, $published on the published one" ||
  fail "plan: measured '$measured', published '$published' tokens/s"

# 3. Nothing measured.
cp "$src/inputs/hardware/dgx-h100.yaml" untouched.yaml
$py "$tool" nogpu.json --hardware untouched.yaml >none.log 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "holds no measured BM_gemm_curve point (first error: no usable CUDA device)" none.log &&
  ok "no measured point: exit 1 naming the error" || fail "exit $rc: $(cat none.log)"
cmp -s untouched.yaml "$src/inputs/hardware/dgx-h100.yaml" && ok "the hardware file is left alone" ||
  fail "the hardware file changed"
finish
