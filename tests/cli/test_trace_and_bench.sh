#!/usr/bin/env bash
# README claims about what a run and a bench leave behind, through the binary under mpirun
# (2 data-parallel ranks of inputs/gpt-tiny.yaml, one thread each):
#   1. `log.trace: FILE` writes one Chrome-trace file per rank: valid traceEvents JSON, a
#      compute track with forward/backward per block per micro-batch (1F1B order with pp 1)
#      and one optimizer span per step, an all-reduce track with the wte row set before the
#      forward, the buckets and the sparse wte rows last, all done before the optimizer, the
#      same all-reduces in the same order on both ranks; rank 0's step spans agree with
#      metrics.jsonl's ms_per_step and comm_ms.
#   2. tools/plot_trace.py draws a step as a PNG with bars in its four colours, and refuses
#      bad input with a message naming the file (no traceback).
#   3. The run's checkpoint: every dataset's crc32 attribute, and the index's source_crc32,
#      equal Python's zlib.crc32 over the dataset's float32 bytes read with h5py.
#   4. `trident bench` ends with exactly one `bench: k=v ...` line holding the documented
#      fields, with units and values consistent with each other, the deck and the step lines.
#   5. With parallel.schedule zb-h1 on 2 stages the compute tracks show ZB-H1's order (B and
#      W apart: Note [ZB-H1]), written out here by hand, and plot_trace.py draws the W bars.
# usage: test_trace_and_bench.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
source "$(dirname "$0")/lib.sh" "$@"
if ! $py -c "import h5py, matplotlib, numpy" 2>/dev/null; then
  echo "skip: $py with h5py, matplotlib and numpy is needed to read traces, PNGs and checkpoints"
  exit 77
fi
# Runs a Python check (stdin) that prints ok/FAIL lines; its FAIL lines count here.
pycheck() {
  local out
  out=$($py - "$@" 2>&1)
  echo "$out"
  failures=$((failures + $(grep -c '^FAIL' <<<"$out")))
  grep -q '^Traceback' <<<"$out" && fail "the check itself crashed (above)"
}

steps=4 accum=2 micro=4
common=("$src/inputs/gpt-tiny.yaml" --set run.threads=1 --set train.micro_batch=$micro
        --set train.accum=$accum --set train.val_every=0 --set log.every=100)

# 1. A traced 2-rank run (with a checkpoint for section 3).
timeout 300 mpirun -n 2 "$bin" train "${common[@]}" --set train.steps=$steps --set run.out_dir=run \
  --set log.trace="$scratch/trace/trace.json" --set checkpoint.dir=ck >train.log 2>&1 \
  || fail "traced run: $(tail -3 train.log)"
for r in 0 1; do [ -s trace/trace.rank$r.json ] || fail "no trace/trace.rank$r.json: $(ls trace 2>&1)"; done
grep -q "^trace: .*trace.rank0.json" train.log && ok "the run names its trace: $(grep '^trace:' train.log)" \
  || fail "the run does not print where the trace went"

pycheck trace/trace.rank0.json trace/trace.rank1.json run/metrics.jsonl $steps $accum 4 <<'EOF'
import json, sys
paths, metrics_path = sys.argv[1:3], sys.argv[3]
steps, accum, layers = map(int, sys.argv[4:7])
def ok(m): print("ok   " + m)
def fail(m): print("FAIL " + m)
number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)

# What a step must contain on the compute track: with pp = 1 the 1F1B schedule runs each
# micro-batch's forward then its backward (README: at most pp micro-batches alive).
micro = (["forward embedding"] + [f"forward block {l}" for l in range(layers)] +
         ["forward head+loss", "backward head+loss"] +
         [f"backward block {l}" for l in reversed(range(layers))] + ["backward embedding"])
expected_compute = micro * accum + ["optimizer"]
# Timestamps are microseconds written from doubles; 1 ns covers their rounding.
EPS_US = 1e-3

per_rank = []
for rank, path in enumerate(paths):
    try:
        trace = json.load(open(path))
        events = trace["traceEvents"]
        assert isinstance(events, list)
    except Exception as e:
        fail(f"{path}: not Chrome-trace JSON with a traceEvents list: {e!r}"); per_rank.append(None); continue
    bad, threads, spans, process = [], {}, [], None
    for e in events:
        if not isinstance(e.get("name"), str) or e.get("pid") != rank or e.get("ph") not in ("M", "X"):
            bad.append(e); continue
        if e["ph"] == "M":
            if e["name"] == "thread_name": threads[e["tid"]] = e["args"]["name"]
            elif e["name"] == "process_name": process = e["args"]["name"]
            elif e["name"] != "thread_sort_index": bad.append(e)
        elif not (number(e.get("ts")) and number(e.get("dur")) and isinstance(e.get("tid"), int)
                  and e["ts"] >= 0 and e["dur"] >= 0 and e["tid"] in threads):
            bad.append(e)
        else:
            spans.append(e)
    if bad: fail(f"{path}: {len(bad)} malformed events, first {bad[0]}")
    else: ok(f"{path}: {len(events)} events, each M or X with name/pid (= rank {rank}); X with ts, dur >= 0, a named tid")
    if process != f"rank {rank}": fail(f"{path}: process_name is {process!r}, expected 'rank {rank}'")
    tracks = {name: tid for tid, name in threads.items()}
    if set(tracks) != {"compute", "all-reduce"}:
        fail(f"{path}: tracks {sorted(tracks)}, expected compute and all-reduce"); per_rank.append(None); continue
    compute = sorted((e for e in spans if e["tid"] == tracks["compute"]), key=lambda e: e["ts"])
    comm = sorted((e for e in spans if e["tid"] == tracks["all-reduce"]), key=lambda e: e["ts"])

    # Compute spans run one after another on one thread: none starts before the last ended.
    overlaps = [(a["name"], b["name"]) for a, b in zip(compute, compute[1:]) if b["ts"] < a["ts"] + a["dur"] - EPS_US]
    if overlaps: fail(f"{path}: overlapping compute spans, first {overlaps[0]}")
    else: ok(f"{path}: {len(compute)} compute spans, in sequence")
    # Steps end at their optimizer span.
    step_spans, current = [], []
    for e in compute:
        current.append(e)
        if e["name"] == "optimizer": step_spans.append(current); current = []
    if current: fail(f"{path}: {len(current)} compute spans after the last optimizer: {current[0]['name']}")
    if len(step_spans) != steps:
        fail(f"{path}: {len(step_spans)} optimizer spans, expected one per step ({steps})"); per_rank.append(None); continue
    wrong = [k for k, s in enumerate(step_spans) if [e["name"] for e in s] != expected_compute]
    if wrong:
        k = wrong[0]; got = [e["name"] for e in step_spans[k]]
        fail(f"{path}: step {k + 1} compute spans {got}, expected {expected_compute}")
    else:
        ok(f"{path}: every step is {accum} x (forward embedding, blocks 0..{layers - 1}, head; "
           f"backward head, blocks {layers - 1}..0, embedding) + optimizer")

    # Every all-reduce belongs to a step: it starts after the previous optimizer and ends
    # before this step's optimizer starts (finish() waits for all of them).
    windows, comm_names, unions, problems = [], [], [], []
    prev_end = 0.0
    for k, s in enumerate(step_spans):
        opt = s[-1]
        mine = [e for e in comm if prev_end <= e["ts"] < opt["ts"]]
        late = [e["name"] for e in mine if e["ts"] + e["dur"] > opt["ts"] + EPS_US]
        if late: problems.append(f"step {k + 1}: {late[0]} ends after the optimizer started")
        names = [e["name"] for e in mine]
        if not mine or names[0] != "wte row set" or names[-1] != "wte rows" or \
                not all(n.startswith("bucket ") for n in names[1:-1]) or len(names) < 3:
            problems.append(f"step {k + 1}: all-reduces {names}, expected wte row set, buckets, wte rows")
        elif mine[0]["ts"] + mine[0]["dur"] > s[0]["ts"] + EPS_US:
            problems.append(f"step {k + 1}: the wte row set ends after the first forward began")
        start = min([s[0]["ts"]] + [e["ts"] for e in mine])
        windows.append((opt["ts"] + opt["dur"] - start) / 1e3)
        comm_names.append(names)
        # The union of the step's all-reduce intervals (what comm_ms is documented to be).
        union, reach = 0.0, None
        for e in mine:
            b, f = e["ts"], e["ts"] + e["dur"]
            if reach is None or b > reach: union += f - b; reach = f
            elif f > reach: union += f - reach; reach = f
        unions.append(union / 1e3)
        prev_end = opt["ts"] + opt["dur"]
    assigned = sum(len(n) for n in comm_names)
    if assigned != len(comm): problems.append(f"{len(comm) - assigned} all-reduce spans outside any step's window")
    for p in problems: fail(f"{path}: {p}")
    if not problems:
        ok(f"{path}: each step's all-reduces ({len(comm_names[0])}: wte row set, buckets, "
           f"wte rows) end before its optimizer")
    per_rank.append((windows, comm_names, unions))

if all(per_rank):
    if per_rank[0][1] == per_rank[1][1]: ok("both ranks ran the same all-reduces in the same order every step")
    else: fail(f"the ranks' all-reduces differ: {per_rank[0][1][0]} vs {per_rank[1][1][0]}")
    rows = [json.loads(l) for l in open(metrics_path)]
    if len(rows) != steps: fail(f"{metrics_path}: {len(rows)} rows, expected {steps}")
    windows, _, unions = per_rank[0]
    agree = True
    for k, row in enumerate(rows[:steps]):
        ms, w = row["ms_per_step"], windows[k]
        # The trace's step (first span to the optimizer's end) lies inside the interval that
        # ms_per_step measures, on the same clock: never longer (0.01 ms: microsecond rounding).
        # It leaves out only zero_grads and marking the step's samples (< 1 ms here); 4 ms (a
        # scheduler time slice) or 5% allows for the rank being descheduled on 2 shared cores.
        if not (ms - max(4.0, 0.05 * ms) <= w <= ms + 0.01):
            agree = False
            fail(f"step {k + 1}: trace step {w:.3f} ms, metrics ms_per_step {ms:.3f} ms")
        # comm_ms is the union of the step's all-reduce intervals, the same numbers the trace
        # holds; 1e-3 ms covers the microsecond conversion.
        if abs(unions[k] - row["comm_ms"]) > 1e-3:
            agree = False
            fail(f"step {k + 1}: union of the trace's all-reduces {unions[k]:.4f} ms, "
                 f"metrics comm_ms {row['comm_ms']:.4f} ms")
    if agree and len(rows) == steps:
        ok("rank 0's trace steps " + ", ".join(f"{w:.1f}" for w in windows) + " ms vs ms_per_step " +
           ", ".join(f"{r['ms_per_step']:.1f}" for r in rows) + " ms; all-reduce unions = comm_ms")
EOF

# 2. plot_trace.py: one step of both ranks as a PNG.
if $py "$src/tools/plot_trace.py" trace/trace.rank0.json trace/trace.rank1.json --step -1 --out step.png \
     --title "last step" >plot.log 2>&1; then
  ok "plot_trace.py exits 0: $(cat plot.log)"
else
  fail "plot_trace.py: $(cat plot.log)"
fi
# The legend shows every colour whether or not a bar has it: a trace whose one step has only
# an (uncoloured) idle span and an empty optimizer, plotted as two ranks like the real one
# (same figure size), gives each colour's legend-only pixel count.
$py -c "import json
ev = [{'ph': 'M', 'name': 'thread_name', 'pid': 0, 'tid': t, 'args': {'name': n}}
      for t, n in ((0, 'compute'), (1, 'all-reduce'))]
ev += [{'ph': 'X', 'name': n, 'pid': 0, 'tid': 0, 'ts': b, 'dur': d}
       for n, b, d in (('idle', 0, 1000), ('optimizer', 1000, 0))]
json.dump({'traceEvents': ev}, open('legend_only.json', 'w'))"
$py "$src/tools/plot_trace.py" legend_only.json legend_only.json --out legend.png >/dev/null 2>&1 \
  || fail "plot_trace.py on a trace with one idle span"
pycheck step.png legend.png <<'EOF'
import sys
import matplotlib.image as mpimg
import numpy as np
path, legend_path = sys.argv[1:3]
def ok(m): print("ok   " + m)
def fail(m): print("FAIL " + m)
try:
    head = open(path, "rb").read(8)
except OSError as e:
    fail(f"{path}: {e}"); sys.exit()
if head != b"\x89PNG\r\n\x1a\n": fail(f"{path}: not a PNG (first bytes {head!r})"); sys.exit()
img, legend = mpimg.imread(path)[..., :3], mpimg.imread(legend_path)[..., :3]
ok(f"{path}: PNG, {img.shape[1]} x {img.shape[0]} pixels")
# Bars in each of the tool's four colours: more pixels of it than the legend alone has, by at
# least 200 (a bar 3 pixels wide in each rank's ~35-pixel-high row). 0.02 of full scale per
# channel: the PNG stores 8 bits, so an exact colour is within 1/255.
colours = {"forward": "#4c78a8", "backward": "#f58518", "optimizer": "#54a24b", "all-reduce": "#b279a2"}
count = lambda im, rgb: int((np.abs(im - rgb).max(axis=2) < 0.02).sum())
for what, hexc in colours.items():
    rgb = np.array([int(hexc[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    n, base = count(img, rgb), count(legend, rgb)
    if base > 0 and n >= base + 200: ok(f"{what} bars: {n} pixels of {hexc} ({base} in the legend)")
    else: fail(f"{what}: {n} pixels of {hexc}, the legend alone has {base}: no bars")
EOF
# Bad input: exit non-zero, name the file, no traceback, no PNG.
printf '{"traceEvents": [' >truncated.json
echo '{"displayTimeUnit": "ms"}' >no_events.json
$py -c "import json; t = json.load(open('trace/trace.rank0.json'))
t['traceEvents'] = [e for e in t['traceEvents'] if e['name'] != 'optimizer']
json.dump(t, open('no_optimizer.json', 'w'))"
for bad in truncated.json no_events.json run/metrics.jsonl no_optimizer.json; do
  rm -f bad.png
  err=$($py "$src/tools/plot_trace.py" "$bad" --out bad.png 2>&1); rc=$?
  if [ $rc -ne 0 ] && grep -qF "$bad" <<<"$err" && ! grep -q Traceback <<<"$err" && [ ! -e bad.png ]; then
    ok "plot_trace.py refuses $bad: $err"
  else
    fail "plot_trace.py on $bad: exit $rc, png $([ -e bad.png ] && echo written || echo none): $err"
  fi
done
err=$($py "$src/tools/plot_trace.py" trace/trace.rank0.json --step $steps --out bad.png 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q "step $steps" <<<"$err" && ! grep -q Traceback <<<"$err"; then
  ok "plot_trace.py refuses --step $steps of $steps steps (0-based): $err"
else
  fail "plot_trace.py --step $steps: exit $rc: $err"
fi

# 3. The checkpoint's CRCs are zlib.crc32 of the data as stored.
pycheck ck/latest <<'EOF'
import glob, os, sys, zlib
import h5py, numpy as np
d = sys.argv[1]
def ok(m): print("ok   " + m)
def fail(m): print("FAIL " + m)
shard_crc, bad = {}, []
def visit(f, fname):
    def one(name, obj):
        if not isinstance(obj, h5py.Dataset): return
        data = obj[()]
        if data.dtype != np.dtype("<f4"): bad.append(f"{fname}:{name} dtype {data.dtype}"); return
        crc = zlib.crc32(data.tobytes())
        stored = [int(x) for x in np.atleast_1d(obj.attrs["crc32"])]
        if stored != [crc]: bad.append(f"{fname}:{name} crc32 attribute {[hex(s) for s in stored]}, zlib.crc32 {crc:#010x}")
        shard_crc[(fname, name)] = crc
    f.visititems(one)
shards = sorted(glob.glob(os.path.join(d, "shard_r*.h5")))
for p in shards:
    with h5py.File(p, "r") as f: visit(f, os.path.basename(p))
if not shards or len(shard_crc) < 3: fail(f"{d}: {len(shards)} shards, {len(shard_crc)} datasets")
elif bad: fail(f"{len(bad)} of {len(shard_crc)} datasets: {bad[0]}")
else: ok(f"{len(shard_crc)} datasets in {len(shards)} shards: crc32 attribute = zlib.crc32 of the float32 bytes")
checked, bad = 0, []
with h5py.File(os.path.join(d, "index.h5"), "r") as f:
    def one(name, obj):
        global checked
        if not isinstance(obj, h5py.Dataset) or not obj.is_virtual: return
        crcs = [int(x) for x in obj.attrs["source_crc32"]]
        for i, m in enumerate(obj.virtual_sources()):
            want = shard_crc.get((os.path.basename(m.file_name), m.dset_name.lstrip("/")))
            checked += 1
            if want is None or crcs[i] != want: bad.append(f"{name} mapping {i} ({m.file_name}:{m.dset_name}): source_crc32 "
                           f"{crcs[i]:#010x}, zlib.crc32 {'(no such dataset)' if want is None else f'{want:#010x}'}")
    f.visititems(one)
if bad or checked != len(shard_crc): fail(f"index.h5: {checked} mappings for {len(shard_crc)} datasets; {bad[:1]}")
else: ok(f"index.h5: all {checked} source_crc32 values = zlib.crc32 of their shard datasets")
EOF

# 4. bench: the last line is the one machine-readable line.
timeout 300 mpirun -n 2 "$bin" bench "${common[@]}" --warmup 1 --steps 3 --set run.out_dir=bench \
  >bench.log 2>&1 || fail "bench: $(tail -3 bench.log)"
pycheck bench.log $micro $accum 2 64 4 128 256 3 1 <<'EOF'
import math, re, sys
log = open(sys.argv[1]).read().splitlines()
micro, accum, dp, T, L, C, V, timed, warmup = map(int, sys.argv[2:11])
def ok(m): print("ok   " + m)
def fail(m): print("FAIL " + m)
kv_lines = [l for l in log if l.startswith("bench: ") and l.split()[1:] and
            all(re.fullmatch(r"[a-z_]+=\S+", w) for w in l.split()[1:])]
if len(kv_lines) != 1: fail(f"{len(kv_lines)} 'bench: k=v ...' lines, expected 1"); sys.exit()
last = [l for l in log if l.strip()][-1]
if last != kv_lines[0]: fail(f"the output does not end with the bench line; it ends with {last!r}")
words = kv_lines[0].split()[1:]
f = dict(w.split("=", 1) for w in words)
if len(f) != len(words): fail("a key appears twice on the bench line")
# Documented: README (blas_core, comm_cpu_ms, activation memory, the bubble next to its model),
# docs/perf.md (ms/step, tokens/s, MFU, the step split, comm and exposed comm),
# tools/gpu-check.sh (reads tokens_per_s ms_per_step mfu mfu_nominal exposed_comm_ms).
promised = ["tokens_per_s", "ms_per_step", "mfu", "mfu_nominal", "forward_ms", "backward_ms",
            "optimizer_ms", "comm_ms", "comm_cpu_ms", "exposed_comm_ms", "overlap", "bubble",
            "bubble_model", "activation_mb", "blas_core", "tokens_per_step", "dp"]
missing = [k for k in promised if k not in f]
if missing: fail(f"bench line lacks {missing}: {kv_lines[0]}"); sys.exit()
ok(f"one bench line, last in the output, with all {len(promised)} documented fields ({len(f)} in all)")
num = {}
for k, v in f.items():
    try: num[k] = float(v)
    except ValueError: pass
# Units: *_ms, *_mb, *_gflops, *_per_s are non-negative numbers; fractions lie in [0, 1].
units = [k for k in f if re.search(r"_(ms|mb|gflops|per_s|m)$", k)]
bad = [k for k in units if not (k in num and num[k] >= 0 and math.isfinite(num[k]))]
if bad: fail(f"not a non-negative number: {[(k, f[k]) for k in bad]}")
else: ok(f"{len(units)} fields with a unit suffix are non-negative numbers")
bad = [k for k in ("overlap", "bubble", "bubble_model", "pipeline_runner_max")
       if not 0 <= num.get(k, -1) <= 1]
# MFU is never above 1, and not reported ("n/a") when it cannot be true: a printed 0 would
# claim that no useful work was done.
bad += [k for k in ("mfu", "mfu_nominal") if f[k] != "n/a" and not 0 < num.get(k, -1) <= 1]
if bad: fail(f"not a fraction where one belongs: {[(k, f[k]) for k in bad]}")
else: ok(f"mfu={f['mfu']} mfu_nominal={f['mfu_nominal']} (n/a or in (0, 1]), "
        f"overlap={f['overlap']} bubble={f['bubble']} (in [0, 1])")
# Against the deck: 2 ranks of dp, pp 1 (so no bubble), the CPU backend with one thread.
tokens = micro * accum * dp * T
expect = {"tokens_per_step": tokens, "ranks": 2, "dp": dp, "tp": 1, "pp": 1, "threads": 1,
          "bubble_model": 0.0, "bubble": 0.0}
wrong = [(k, f.get(k), v) for k, v in expect.items() if num.get(k) != v]
# The runner's own time (neither compute nor waiting) is ~1e-4 of the schedule's here; 1e-2
# would be 10 ms in a 1 s step, far more than its bookkeeping per action costs.
if not num.get("pipeline_runner_max", 1) < 1e-2:
    wrong.append(("pipeline_runner_max", f.get("pipeline_runner_max"), "< 0.01"))
if wrong: fail(f"fields against the deck (key, printed, expected): {wrong}")
if f.get("backend") != "cpu" or not f["blas_core"] or f["blas_core"] in ("n/a", "unknown"):
    wrong.append(("backend, blas_core", f.get("backend"), f["blas_core"]))
    fail(f"backend={f.get('backend')} blas_core={f['blas_core']}")
header = [l for l in log if l.startswith("bench: measured sgemm peak")]
if not header or f"blas_core={f['blas_core']}" not in header[0]:
    wrong.append(("blas_core", f["blas_core"], header[:1]))
    fail(f"the peak line names another blas_core: {header[:1]}")
if not wrong:
    ok(f"tokens_per_step={tokens} (micro {micro} x accum {accum} x dp {dp} x seq {T}), "
       f"ranks/dp/tp/pp/threads as run, blas_core={f['blas_core']} as on the peak line")
# tokens_per_s = tokens_per_step / (ms_per_step / 1000), within the printed rounding
# (ms_per_step to 0.005 ms, tokens_per_s to 0.05).
ms = num["ms_per_step"]
lo, hi = tokens / ((ms + 0.005) / 1e3) - 0.05, tokens / ((ms - 0.005) / 1e3) + 0.05
if lo <= num["tokens_per_s"] <= hi: ok(f"tokens_per_s={f['tokens_per_s']} = {tokens} tokens / {ms} ms")
else: fail(f"tokens_per_s={f['tokens_per_s']}, expected {lo:.1f}..{hi:.1f} from ms_per_step={ms}")
# Parameters and FLOPs of a GPT-2 from its shape (vocabulary 256 is already a multiple of 128):
# wte, wpe, 12C^2+13C per block, the final LayerNorm; 6 x matmul weights + 12 L T C per token.
params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
if abs(num["params_m"] - params / 1e6) > 0.005: fail(f"params_m={f['params_m']}, the shape gives {params / 1e6:.4f}")
flops = 6 * (L * 12 * C * C + V * C) + 12 * L * T * C
want = flops * num["tokens_per_s"] / 1e9
if abs(num["achieved_gflops"] - want) > 0.05 + 1e-4 * want:
    fail(f"achieved_gflops={f['achieved_gflops']}, {flops} FLOP/token x tokens_per_s gives {want:.2f}")
# Within the three printed roundings: mfu's 4 decimals (5e-5), achieved's and the peak's 1
# decimal (±0.05 each, through achieved/peak).
a, pk = num["achieved_gflops"], num["peak_gflops"]
if f["mfu"] != "n/a" and abs(num["mfu"] - a / pk) > 5e-5 + 0.05 / pk + a * 0.05 / pk**2:
    fail(f"mfu={f['mfu']} but achieved/peak = {f['achieved_gflops']}/{f['peak_gflops']}")
ok(f"params_m={f['params_m']} ({params} from the shape), achieved_gflops="
   f"{f['achieved_gflops']} ({flops} FLOP/token), peak_gflops={f['peak_gflops']}")
# The summary holds medians of the timed step lines (each printed to 0.1 ms).
steps = [l for l in log if re.match(r"bench: step \d+ ", l)]
kinds = [l.split()[3].rstrip(":") for l in steps]
if kinds != ["warm-up"] * warmup + ["timed"] * timed: fail(f"step lines {kinds}")
rx = re.compile(r": ([\d.]+) ms \(forward ([\d.]+), backward ([\d.]+), optimizer ([\d.]+), comm ([\d.]+), "
                r"exposed comm ([\d.]+), comm thread cpu ([\d.]+) in \d+ polls\)")
rows = [tuple(map(float, rx.search(l).groups())) for l in steps if "timed" in l and rx.search(l)]
if len(rows) != timed: fail(f"{len(rows)} parsable timed step lines, expected {timed}"); sys.exit()
med = lambda xs: sorted(xs)[len(xs) // 2]  # an odd count of steps
for i, k in enumerate(["ms_per_step", "forward_ms", "backward_ms", "optimizer_ms", "comm_ms",
                       "exposed_comm_ms", "comm_cpu_ms"]):
    m = med([r[i] for r in rows])  # 0.055: step lines to 0.05 ms, the summary to 0.005 ms
    if abs(m - num[k]) > 0.055: fail(f"{k}={f[k]}, median of the step lines {m}")
# Forward, backward and optimizer run one after another inside the step (0.2 ms: four
# numbers rounded to 0.05 ms each).
over = [r for r in rows if r[1] + r[2] + r[3] > r[0] + 0.2]
if over: fail(f"a step's forward+backward+optimizer exceeds its time: {over[0]}")
if num["comm_ms"] <= 0 or num["comm_cpu_ms"] <= 0: fail(f"dp 2 but comm_ms={f['comm_ms']} comm_cpu_ms={f['comm_cpu_ms']}")
ok(f"summary = medians of the {timed} timed step lines; comm_ms={f['comm_ms']} comm_cpu_ms={f['comm_cpu_ms']} with dp {dp}")
EOF

# 5. zb-h1 on 2 stages (4 blocks, 2 per stage), accum 2: stage 0 runs F0 F1 B0 W0 B1 W1 and
# stage 1 (W one micro-batch late) F0 B0 F1 B1 W0 W1. B leaves the embedding's gradient and
# the blocks' linear ones to W; the head's stay in B (Note [Split backward]).
timeout 300 mpirun -n 2 "$bin" train "${common[@]}" --set train.steps=2 --set run.out_dir=zb \
  --set parallel.pp=2 --set parallel.schedule=zb-h1 --set log.trace="$scratch/zbtrace/trace.json" \
  >zb.log 2>&1 || fail "zb-h1 traced run: $(tail -3 zb.log)"
pycheck zbtrace/trace.rank0.json zbtrace/trace.rank1.json <<'EOF'
import json, sys
def ok(m): print("ok   " + m)
def fail(m): print("FAIL " + m)
F = [["forward embedding", "forward block 0", "forward block 1"],
     ["forward block 2", "forward block 3", "forward head+loss"]]
B = [["backward block 1", "backward block 0"],
     ["backward head+loss", "backward block 3", "backward block 2"]]
W = [["weight block 1", "weight block 0", "weight embedding"], ["weight block 3", "weight block 2"]]
order = [["F", "F", "B", "W", "B", "W"], ["F", "B", "F", "B", "W", "W"]]
for stage, path in enumerate(sys.argv[1:3]):
    t = json.load(open(path))["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in t
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    compute = sorted((e for e in t if e.get("ph") == "X" and names.get(e["tid"]) == "compute"),
                     key=lambda e: e["ts"])
    got = [e["name"] for e in compute]
    step = [n for k in order[stage] for n in {"F": F, "B": B, "W": W}[k][stage]] + ["optimizer"]
    if got == step * 2:
        ok(f"stage {stage}: {len(got)} compute spans in ZB-H1's order " + " ".join(order[stage]))
    else:
        fail(f"stage {stage} compute track:\n  got      {got}\n  expected {step * 2}")
EOF
if $py "$src/tools/plot_trace.py" zbtrace/trace.rank0.json zbtrace/trace.rank1.json --out zb.png \
     >zbplot.log 2>&1; then
  pycheck zb.png <<'EOF'
import sys
import matplotlib.image as mpimg
import numpy as np
img = mpimg.imread(sys.argv[1])[..., :3]
rgb = np.array([0xe4, 0x57, 0x56]) / 255  # plot_trace.py's "weight" colour
n = int((np.abs(img - rgb).max(axis=2) < 0.02).sum())
print(("ok   " if n > 400 else "FAIL ") + f"zb.png: {n} pixels of the W colour (legend alone ~100)")
EOF
else
  fail "plot_trace.py on the zb-h1 traces: $(cat zbplot.log)"
fi

finish
