#!/usr/bin/env bash
# tools/plot_metrics.py on synthetic metrics.jsonl files of two runs (no training needed):
#   1. it writes a PNG of the documented size in which both runs' lines (matplotlib's first two
#      colours) and the four panels are drawn;
#   2. what it plots: a step written twice keeps its last record, skipped steps have no loss,
#      bench warm-up ("timed": false) no speed, a null MFU is a gap; the labels are run names;
#   3. a file that is not a metrics.jsonl is refused naming the file and line, no traceback.
# usage: test_plot_metrics.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR (the binary is not used)
source "$(dirname "$0")/lib.sh" "$@"
if ! $py -c "import matplotlib, numpy" 2>/dev/null; then
  echo "skip: $py with matplotlib and numpy is needed"
  exit 77
fi
tool=$src/tools/plot_metrics.py

# Run "fast" and run "slow": 60 steps, validation every 10, one skipped step, one step written
# twice (the second record wins), a null MFU at step 30, bench-like warm-up in "slow".
mkdir -p fast slow
$py - <<'PY'
import json, math
for name, rate, speed in (("fast", 0.05, 20000.0), ("slow", 0.02, 9000.0)):
    with open(f"{name}/metrics.jsonl", "w") as f:
        for step in range(1, 61):
            r = {"step": step, "loss": 5.5 * math.exp(-rate * step) + 1.0, "lr": 1e-3,
                 "grad_norm": 1.0, "tokens_per_s": speed + 50 * (step % 7),
                 "mfu": speed / 50000 + 0.01 * (step % 5)}
            if step % 10 == 0:
                r["val_loss"] = r["loss"] + 0.1
            if step == 30:
                r["mfu"] = None
            if step == 17:
                r["skipped"], r["loss"] = True, None
            if name == "slow" and step <= 3:
                r["timed"] = False
            f.write(json.dumps(r) + "\n")
            if step == 40:  # a resumed run appends step 40 again
                r["loss"] = 0.25
                f.write(json.dumps(r) + "\n")
PY

# 1. The PNG.
if $py "$tool" fast/metrics.jsonl slow/metrics.jsonl --out cmp.png --title synthetic >plot.log 2>&1; then
  ok "plot_metrics.py ran: $(cat plot.log)"
else
  fail "plot_metrics.py failed: $(cat plot.log)"
fi
$py - cmp.png <<'PY' | tee png.log
import os, sys
import matplotlib.image as mpimg
import numpy as np
path = sys.argv[1]
if not os.path.exists(path):
    print(f"FAIL {path} was not written"); sys.exit()
head = open(path, "rb").read(8)
print(("ok  " if head == b"\x89PNG\r\n\x1a\n" else "FAIL") + f" {path} is a PNG ({os.path.getsize(path)} bytes)")
img = mpimg.imread(path)[:, :, :3]
print(("ok  " if img.shape[:2] == (700, 1100) else "FAIL") + f" size {img.shape[1]}x{img.shape[0]} (11x7 in at 100 dpi)")
colours = len(np.unique((img * 255).astype(np.uint8).reshape(-1, 3), axis=0))
print(("ok  " if colours > 50 else "FAIL") + f" {colours} distinct colours (not a blank image)")
for name, rgb in (("fast (C0)", (0x1f, 0x77, 0xb4)), ("slow (C1)", (0xff, 0x7f, 0x0e))):
    near = np.all(np.abs(img * 255 - np.array(rgb)) < 8, axis=2)
    # each run's line in each of the four panels: count the panels (quadrants) it appears in
    h, w = near.shape
    quads = sum(near[r:r + h // 2, c:c + w // 2].sum() > 30 for r in (0, h // 2) for c in (0, w // 2))
    print(("ok  " if quads == 4 else "FAIL") + f" {name}: {near.sum()} pixels, in {quads} of 4 panels")
PY
failures=$((failures + $(grep -c '^FAIL' png.log)))

# 2. What is plotted, through the script's own functions.
$py - "$tool" <<'PY' | tee series.log
import importlib.util, sys
spec = importlib.util.spec_from_file_location("plot_metrics", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
def check(cond, what): print(("ok   " if cond else "FAIL ") + what)
fast, slow = m.load("fast/metrics.jsonl"), m.load("slow/metrics.jsonl")
steps, loss = m.series(fast, "loss")
check(17 not in steps and len(steps) == 59, f"skipped step 17 has no loss ({len(steps)} points)")
check(loss[steps.index(40)] == 0.25, "step 40 written twice keeps the last record")
steps, _ = m.series(fast, "mfu")
check(30 not in steps and len(steps) == 59, "null MFU at step 30 is a gap")
steps, values = m.with_gaps(fast, "mfu")
check(len(steps) == 60 and values[29] != values[29], "the MFU line breaks at step 30 (NaN)")
steps, _ = m.series(slow, "tokens_per_s")
check(steps[0] == 4, f"warm-up steps have no speed (first timed step {steps[0]})")
steps, _ = m.series(fast, "val_loss")
check(steps == [10, 20, 30, 40, 50, 60], f"validation at {steps}")
check(m.run_labels(["fast/metrics.jsonl", "slow/metrics.jsonl"], None) == ["fast", "slow"],
      "labels are the run directories")
check(m.run_labels(["a/x.jsonl", "b/x.jsonl"], None) == ["a/x.jsonl", "b/x.jsonl"],
      "same names: labels are the paths")
PY
failures=$((failures + $(grep -c '^FAIL' series.log)))

# 3. Bad input.
printf '{"step": 1, "loss": 2.0}\nnot json\n' > broken.jsonl
err=$($py "$tool" broken.jsonl --out broken.png 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "broken.jsonl:2: not JSON" <<<"$err" && ! grep -q Traceback <<<"$err"; then
  ok "a broken file is refused: $err"
else
  fail "broken file: exit $rc: $err"
fi
err=$($py "$tool" missing.jsonl --out missing.png 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "missing.jsonl: cannot read" <<<"$err" && ok "a missing file is refused: $err" \
  || fail "missing file: exit $rc: $err"
finish
