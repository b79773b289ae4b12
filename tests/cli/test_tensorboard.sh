#!/usr/bin/env bash
# log.tensorboard end to end, read back by TensorBoard itself (PyPI, tools/tb_venv.sh's venv;
# the test skips only when pip cannot install it):
#   1. a 2-rank run: TensorBoard's event accumulator reads every scalar equal to metrics.jsonl
#      (tests/cli/tb_check.py), and the deck and layout as text; a directory that cannot be
#      made is bad input (exit 2, one message);
#      bench writes its steps and bench.json's figures the same way;
#   2. resume: the run goes on from its step-3 checkpoint after having logged 6 steps; the new
#      event file's SessionLog START makes every step show once, with the resumed run's values;
#   3. SIGKILL mid-training leaves a readable file holding the steps before the kill;
#   4. `tensorboard --logdir` serves both runs on localhost: its HTTP API lists their tags and
#      the resumed run's steps once each, and
#      headless Chromium (Debian's, tools/setup.sh) renders the page with both runs and every tag
#      group, and a screenshot of the scalars (tensorboard.png in the scratch directory).
# usage: test_tensorboard.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
source "$(dirname "$0")/lib.sh" "$@"
venv=$(bash "$src/tools/tb_venv.sh") || { echo "SKIP: pip could not install tensorboard"; exit 77; }
tbpy=$venv/bin/python
check=$src/tests/cli/tb_check.py
common=("$src/inputs/gpt-tiny.yaml" --set run.threads=1 --set train.val_every=2
        --set train.val_batches=2 --set log.every=100)

# 1. Two data-parallel ranks (so the communication figures are not all zero), 6 steps.
if timeout 300 mpirun -n 2 "$bin" train "${common[@]}" --set train.steps=6 --set run.out_dir=dp2 \
     --set log.tensorboard="$PWD/tb/dp2" >dp2.log 2>&1 \
   && out=$($tbpy "$check" equal tb/dp2 dp2/metrics.jsonl 2>&1); then
  ok "dp 2: $out"
else
  fail "dp 2: $(tail -5 dp2.log) ${out:-}"
fi

# 1a. A directory that cannot be made stops both ranks with one message and status 2.
touch afile
timeout 120 mpirun -n 2 "$bin" train "${common[@]}" --set train.steps=2 --set run.out_dir=bad \
  --set log.tensorboard="$PWD/afile/tb" >bad.log 2>bad.err
rc=$?
if [ $rc = 2 ] && [ "$(grep -c '^trident: error' bad.err)" = 1 ] && grep -q "log.tensorboard" bad.err; then
  ok "bad log.tensorboard: exit 2, $(grep '^trident: error' bad.err)"
else
  fail "bad log.tensorboard: exit $rc (2 expected): $(head -3 bad.err)"
fi

# 1b. bench: its steps the same way, and its figures (bench.json) as bench/* at the last step.
if timeout 300 "$bin" bench "${common[@]}" --steps 2 --warmup 1 --set run.out_dir=bench \
     --set log.tensorboard=true >bench.log 2>&1 \
   && out=$($tbpy "$check" bench bench/tensorboard bench/metrics.jsonl 2>&1); then
  ok "bench: $out"
else
  fail "bench: $(tail -3 bench.log) ${out:-}"
fi

# 2. 6 steps with checkpoints at 3 and 6, then `latest` back to step 3 and a resume: steps 4-6
# are logged twice, in two files; the second run's count.
res=(--set train.steps=6 --set run.out_dir=res --set log.tensorboard="$PWD/tb/resumed"
     --set checkpoint.dir="$PWD/ck" --set checkpoint.every=3 --set checkpoint.keep=3)
if timeout 300 "$bin" train "${common[@]}" "${res[@]}" >res1.log 2>&1 \
   && ln -sfn step_00000003 ck/latest \
   && timeout 300 "$bin" train "${common[@]}" "${res[@]}" --set checkpoint.resume=true \
        >res2.log 2>&1; then
  files=$(ls tb/resumed | grep -c tfevents)
  lines=$(wc -l <res/metrics.jsonl)
  if [ "$files" = 2 ] && [ "$lines" = 9 ] \
     && out=$($tbpy "$check" equal tb/resumed res/metrics.jsonl 2>&1); then
    ok "resume: $files event files, $lines metrics lines; $out"
  else
    fail "resume: $files event files (2 expected), $lines metrics lines (9 expected); ${out:-}"
  fi
else
  fail "resume runs: $(tail -3 res1.log) $(tail -3 res2.log)"
fi

# 3. SIGKILL once at least 4 steps are in metrics.jsonl (300 steps would take about 30 s).
"$bin" train "${common[@]}" --set train.steps=300 --set run.out_dir=kill \
  --set log.tensorboard="$PWD/tb/kill" >kill.log 2>&1 &
job=$!
for _ in $(seq 600); do
  [ "$(cat kill/metrics.jsonl 2>/dev/null | wc -l)" -ge 4 ] && break
  sleep 0.1
done
kill -KILL $job
wait $job
rc=$?
if [ $rc = 137 ] && out=$($tbpy "$check" prefix tb/kill kill/metrics.jsonl 2>&1); then
  ok "SIGKILL after $(wc -l <kill/metrics.jsonl) steps: $out"
else
  fail "SIGKILL: exit $rc (137 expected); ${out:-} $(tail -3 kill.log)"
fi

# 4. The server and the browser.
if ! command -v chromium >/dev/null; then
  echo "skip: chromium is not installed (tools/setup.sh installs it); the browser check is left out"
  finish
  exit
fi
rm -rf tb/kill
port=$($tbpy -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
"$venv/bin/tensorboard" --logdir tb --host 127.0.0.1 --port "$port" >server.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
# The tags, as the scalars page asks for them: {run: {tag: {...}}}.
tags=$($tbpy - "$port" <<'PY' 2>&1
import json, sys, time, urllib.request
want = {"train/loss", "val/loss", "perf/tokens_per_s", "time/forward_ms", "memory/param_mib"}
last = f"no runs dp2 and resumed with tags {sorted(want)}"
for _ in range(120):
    try:
        runs = json.load(urllib.request.urlopen(
            f"http://127.0.0.1:{sys.argv[1]}/data/plugin/scalars/tags", timeout=5))
        if set(runs) >= {"dp2", "resumed"} and all(want <= set(runs[r]) for r in ("dp2", "resumed")):
            # The server honours the restart too: the resumed run's steps once each.
            loss = json.load(urllib.request.urlopen(
                f"http://127.0.0.1:{sys.argv[1]}/data/plugin/scalars/scalars"
                "?run=resumed&tag=train/loss", timeout=5))
            steps = [point[1] for point in loss]
            if steps == [1, 2, 3, 4, 5, 6]:
                print(f"runs {sorted(runs)}, {len(runs['dp2'])} tags each; resumed: steps {steps}")
                sys.exit(0)
            last = f"run resumed: train/loss at steps {steps}"
    except OSError:
        pass
    time.sleep(1)
sys.exit(last)
PY
)
if [ $? = 0 ]; then ok "tensorboard serves $tags"; else fail "tensorboard: $tags $(tail -3 server.log)"; fi
# The page, rendered: the Time Series dashboard (in the DOM Chromium dumps, unlike the Scalars
# one's shadow DOM) names both runs and each tag group; the screenshot is the Scalars dashboard.
browse=(timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars
        --window-size=1400,900 --virtual-time-budget=20000)
"${browse[@]}" --dump-dom "http://127.0.0.1:$port/#timeseries" >page.html 2>chromium.log
"${browse[@]}" --screenshot="$PWD/tensorboard.png" "http://127.0.0.1:$port/#scalars&tagFilter=loss" \
  >>chromium.log 2>&1
groups=$(grep -oE 'class="group-title" title="[a-z]+"' page.html | grep -oE '"[a-z]+"$' | tr -d '"' \
         | sort -u | tr '\n' ' ')
size=$(stat -c %s tensorboard.png 2>/dev/null || echo 0)
if [ "$groups" = "ckpt comm memory perf time train val " ] && grep -q dp2 page.html \
   && grep -q resumed page.html && [ "$size" -gt 20000 ]; then
  ok "chromium: the page shows runs dp2 and resumed, tag groups $groups; screenshot $size bytes"
else
  fail "chromium: tag groups '$groups'; screenshot $size bytes; $(grep -v dbus chromium.log | tail -3)"
fi
finish
