#!/usr/bin/env bash
# Context parallelism through the binary (Note [Context parallelism] in src/model/cp_attention.h):
#   1. gpt-tiny as a Llama at seq_len 256 (blockwise attention: beyond the T×T op's 64) trains
#      the same at cp 2, ring and allgather, as on one rank: every step's loss within 1e-5
#      relative (the layouts' bound, tests/mpi/test_cp_training.cpp);
#   2. their metrics.jsonl has cp_comm_ms and cp_exposed_ms on every step (ms, ≥ 0; the one-rank
#      run has neither), and bench's line names cp, cp_comm and both figures;
#   3. the emulated link reaches the cp group: at 0.2 Gbit/s a step's cp_comm_ms is at least the
#      link's time for the K/V blocks that crossed it (computed below from the shapes).
# usage: test_cp.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
source "$(dirname "$0")/lib.sh" "$@"

deck=("$src/inputs/gpt-tiny.yaml" --set model.family=llama --set model.seq_len=256
      --set train.micro_batch=2 --set train.steps=4 --set train.val_every=0 --set run.threads=1
      --set log.every=1)

timeout 300 "$bin" train "${deck[@]}" --set run.out_dir=one >one.log 2>&1 \
  || fail "one rank: $(tail -3 one.log)"
for mode in ring allgather; do
  timeout 300 mpirun -n 2 "$bin" train "${deck[@]}" --set parallel.cp=2 \
    --set parallel.cp_comm=$mode --set run.out_dir=$mode >$mode.log 2>&1 \
    || fail "cp 2 $mode: $(tail -3 $mode.log)"
done

# 1 and 2: the losses, and the metrics.
if "$py" - one/metrics.jsonl ring/metrics.jsonl allgather/metrics.jsonl <<'PY'
import json, sys
runs = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
one = runs[0]
assert len(one) == 4 and all("cp_comm_ms" not in r for r in one), "one rank: 4 steps, no cp keys"
for name, run in zip(("ring", "allgather"), runs[1:]):
    assert len(run) == 4, (name, len(run))
    for a, b in zip(run, one):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]), (name, a["step"], a["loss"], b["loss"])
        assert a["cp_comm_ms"] >= 0 and a["cp_exposed_ms"] >= 0, (name, a)
print("losses equal one rank's; cp_comm_ms", [r["cp_comm_ms"] for r in runs[1]])
PY
then ok "cp 2 (ring, allgather) equals one rank, cp figures in metrics.jsonl"
else fail "the losses or the metrics"; fi

# 3. The emulated link on the cp group, in bench.
timeout 300 mpirun -n 2 "$bin" bench "${deck[@]}" --set parallel.cp=2 --set comm.emulate_gbps=0.2 --set comm.emulate_groups=cp \
  --set run.out_dir=bench --warmup 1 --steps 2 >bench.log 2>&1 || fail "bench: $(tail -3 bench.log)"
line=$(grep '^bench: tokens_per_s' bench.log)
for key in "cp=2" "cp_comm=ring" "cp_comm_ms=" "cp_exposed_ms="; do
  grep -q -- "$key" <<<"$line" || fail "bench line without $key: $line"
done
# K/V blocks per step: 4 layers × (1 forward + 1 backward K/V + 1 partial sum + 1 home), each
# B·T/cp rows × 2 · kv heads · head size floats: 2 · 128 · 2 · 4 · 32 · 4 B = 256 KiB, 10.5 ms at
# 0.2 Gbit/s; 16 of them are 168 ms (checked at 95%: 159).
comm=$(grep -oE 'cp_comm_ms=[0-9.]+' <<<"$line" | cut -d= -f2)
if awk -v c="$comm" 'BEGIN { exit !(c >= 159) }'; then ok "cp_comm_ms $comm ms on the emulated link (≥ 159)"
else fail "cp_comm_ms $comm below 95% of the emulated link's 168 ms: $line"; fi
finish
