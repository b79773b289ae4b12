#!/usr/bin/env bash
# `trident plan` end to end (issue 16, docs/plan.md). First --calibrate on 2 ranks with an
# emulated link: it prints its progress with units, writes a cpu description that carries
# every key with positive figures (Note [Hardware files]), and refuses a bad --out with exit 2.
# Then the planner on that file: the ranked table, --json's keys, --png, exit 2 naming the key
# for a bad hardware file, an unknown hardware name and a layout trident refuses; the NeoX and
# Llama decks' FLOP counts and a refused kv_heads; ZeRO-3 and HSDP on the Llama deck; the
# checkpoint snapshot's line and memory term with --async-checkpoint; and last
# predictions against `trident bench` for a few layouts (tools/plan_validate.py --cases quick)
# within the tolerance stated below. About 2 minutes on 2 cores.
# usage: test_plan.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
source "$(dirname "$0")/lib.sh" "$@"

out=$scratch/hw.yaml
log=$(mpirun -n 2 "$bin" plan --calibrate --name cli-test --out "$out" --emulate-gbps 1 2>&1); rc=$?
echo "$log"
[ $rc -eq 0 ] && ok "calibrate exits 0" || fail "calibrate exit status $rc"
[ -s "$out" ] && ok "wrote $out" || fail "no file at $out"
grep -q "calibrate: wrote $out" <<<"$log" && ok "prints the written path" || fail "no 'wrote' line"
grep -qE "linear layer \[1024, 2048\] -> 8192, forward and backward, 1 thread: [0-9.]+ GFLOP/s" <<<"$log" && ok "gemm progress with units" \
  || fail "no gemm progress line in GFLOP/s"
grep -qE "memory triad.*: [0-9.]+ GB/s" <<<"$log" && ok "memory progress with units" \
  || fail "no memory progress line in GB/s"
grep -qE "emulated link \(1 Gbit/s" <<<"$log" && ok "measures the emulated link" \
  || fail "no emulated-link line"

# The file itself: every key, kind cpu, positive numbers, ascending GEMM points, the emulated
# link near its 1 Gbit/s = 0.125 GB/s (the emulation is a floor, never faster).
if "$py" - "$out" <<'PY'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
keys = {"name", "kind", "devices_per_node", "dtype", "peak_tflops", "gemm", "attention_tflops",
        "memory_gbytes_per_s", "memory_gb", "intra_node", "inter_node", "overlap_slowdown",
        "core_scaling", "thread_scaling", "elementwise_gbytes_per_s", "optimizer_gbytes_per_s", "compute_efficiency",
        "host_copy_gbytes_per_s", "sources"}
assert set(d) == keys, f"keys differ: {set(d) ^ keys}"
assert d["name"] == "cli-test" and d["kind"] == "cpu" and d["dtype"] == "fp32", d
assert d["devices_per_node"] >= 1
dims = [p["min_dim"] for p in d["gemm"]]
assert dims == [32, 64, 128, 256, 512, 1024], dims
assert all(p["tflops"] > 0 for p in d["gemm"]) and d["peak_tflops"] == max(p["tflops"] for p in d["gemm"])
for k in ("memory_gbytes_per_s", "memory_gb"):
    assert d[k] > 0, (k, d[k])
for link in ("intra_node", "inter_node"):
    assert d[link]["gbytes_per_s"] > 0 and d[link]["latency_us"] >= 0, d[link]
assert 0.05 < d["inter_node"]["gbytes_per_s"] <= 0.126, d["inter_node"]
assert 0 <= d["overlap_slowdown"] < 1
assert 0 < d["core_scaling"] <= 1 and 0 < d["thread_scaling"] <= 1, d
assert 0 < d["compute_efficiency"] <= 2, d
assert 0 < d["host_copy_gbytes_per_s"] <= d["memory_gbytes_per_s"], d  # a copy moves each byte twice
assert any("measured by trident plan --calibrate" in s for s in d["sources"]), d["sources"]
PY
then ok "the file has every key and plausible figures"; else fail "the file's contents"; fi

# A directory that does not exist: exit 2 with one message naming --out.
err=$(mpirun -n 2 "$bin" plan --calibrate --out "$scratch/no/such/dir/hw.yaml" 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] && ok "bad --out exits 2" || fail "bad --out: exit status $rc, expected 2: $err"
grep -q -- "--out .*no/such/dir" <<<"$err" && ok "the message names --out" || fail "message: $err"

# The planner on the file just written.
tiny=$src/inputs/gpt-tiny.yaml
table=$("$bin" plan "$tiny" --hardware "$out" --gpus 2 --global-batch 16 2>&1); rc=$?
echo "$table" | head -8
[ $rc -eq 0 ] && ok "plan exits 0" || fail "plan exit status $rc: $table"
grep -qE "^ +1  dp=" <<<"$table" && ok "ranks layouts" || fail "no ranked table"
grep -q "^best: " <<<"$table" && ok "says why the best wins" || fail "no 'best:' line"
"$bin" plan "$tiny" --hardware "$out" --gpus 2 --global-batch 16 --json --top 3 > plan.jsonl
if "$py" - plan.jsonl <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 3, len(rows)
keys = {"dp", "tp", "pp", "cp", "cp_comm", "v", "micro_batch", "zero", "recompute", "step_s", "tokens_per_s",
        "tflops_per_gpu", "mfu", "memory_gb_per_rank", "fits"}
for r in rows:
    assert keys <= set(r), keys - set(r)
    assert r["dp"] * r["cp"] * r["tp"] * r["pp"] == 2 and 0 < r["mfu"] <= 1, r
    assert abs(sum(r["time_s"].values()) - r["step_s"]) <= 1e-9 * r["step_s"], r
    assert abs(r["tokens_per_s"] - 16 * 64 / r["step_s"]) <= 1e-6 * r["tokens_per_s"], r
assert rows[0]["tokens_per_s"] >= rows[1]["tokens_per_s"] >= rows[2]["tokens_per_s"]
PY
then ok "--json: one object per layout with the documented keys, best first"; else fail "--json"; fi
"$bin" plan "$tiny" --hardware "$out" --gpus 2 --global-batch 16 --top 4 --png plan.png >/dev/null 2>&1
[ -s plan.png ] && [ "$(head -c 4 plan.png | tail -c 3)" = PNG ] && ok "--png draws" || fail "no PNG"

note=$("$bin" plan "$tiny" --hardware "$out" --layout dp=1 --set model.init_from=weights.bin 2>&1)
grep -q "model.init_from is set" <<<"$note" && ok "says it plans the deck's shape, not init_from's" \
  || fail "no note about model.init_from: $note"

expect_bad() {  # WHAT PATTERN COMMAND...: exit 2 and a message matching PATTERN
  local what=$1 pattern=$2; shift 2
  local err rc
  err=$("$@" 2>&1 >/dev/null); rc=$?
  [ $rc -eq 2 ] && grep -qE -- "$pattern" <<<"$err" && ok "$what: exit 2 naming $pattern" \
    || fail "$what: exit $rc, expected 2 with '$pattern': $err"
}
sed 's/^peak_tflops:.*/peak_tflops: -1/' "$out" > bad.yaml
expect_bad "bad hardware file" "peak_tflops" "$bin" plan "$tiny" --hardware bad.yaml --gpus 2
expect_bad "unknown hardware" "no-such-machine" "$bin" plan "$tiny" --hardware no-such-machine --gpus 2
expect_bad "refused layout" "parallel.tp" "$bin" plan "$tiny" --hardware "$out" --layout tp=3
expect_bad "unknown layout key" "dq" "$bin" plan "$tiny" --hardware "$out" --layout dq=2
expect_bad "layout against --gpus" "--gpus" "$bin" plan "$tiny" --hardware "$out" --layout dp=2 --gpus 4

# The family decks (issue 35 part 6): each plans, and its FLOPs per step are 6·N_matmul + 6·L·T·C
# per token (attention's causal half, as its time is counted: docs/plan.md) with N_matmul counted here from the published shapes (NeoX: 12·C² per layer; Llama:
# q, k, v with 8 kv heads, attproj and SwiGLU's three matrices), the head's C·V once each.
for deck in neox-2.7b llama-3-8b; do
  "$bin" plan "$src/inputs/$deck.yaml" --hardware dgx-h100 --gpus 16 --json --top 1 > "$deck.jsonl"; rc=$?
  if [ $rc -eq 0 ] && "$py" - "$deck" "$deck.jsonl" <<'PY'
import json, sys
r = json.loads(open(sys.argv[2]).readline())
if sys.argv[1] == "neox-2.7b":
    L, C, T, V, batch = 32, 2560, 2048, 50432, 512
    matmul = L * 12 * C * C + C * V
else:
    L, C, T, V, batch = 32, 4096, 8192, 128256, 128
    matmul = L * (C * (32 + 2 * 8) * 128 + C * C + 3 * C * 14336) + C * V
flops = (6 * matmul + 6 * L * T * C) * batch * T
got = r["tflops_per_gpu"] * 1e12 * r["step_s"] * r["dp"] * r["cp"] * r["tp"] * r["pp"]
assert abs(got / flops - 1) < 1e-9, (got, flops)
assert r["fits"] and 0 < r["mfu"] <= 1, r
PY
  then ok "$deck plans, with its family's FLOP count"; else fail "$deck: exit $rc, $(head -c 300 "$deck.jsonl")"; fi
done
expect_bad "kv_heads not dividing heads" "model.kv_heads" \
  "$bin" plan "$src/inputs/llama-3-8b.yaml" --hardware dgx-h100 --gpus 8 --set model.kv_heads=5

# ZeRO-3 and HSDP (Note [Plan ZeRO-3]): Llama-3-8B on one DGX H100 node at ZeRO-3 holds less
# per rank than the same layout at ZeRO-2 (16·Ψ/8 + the pool against 2Ψ + 16·Ψ/8), the layout
# text names zero=3 and the shard group; on two nodes the search offers the HSDP split 2 × 8;
# --zero-capacity grows with the devices at ZeRO-3 and stays flat at ZeRO-0. Global batch 8, no
# accumulation: with it (zero_reduce step) a GPU keeps its gradients whole
# (Note [Plan ZeRO-3 on a device]). The HSDP rows rank below the fitting ones: --top 40.
l8b=$src/inputs/llama-3-8b.yaml
z2=$("$bin" plan "$l8b" --hardware dgx-h100 --layout dp=8,micro=1,zero=2,recompute=none --global-batch 8 --json)
z3=$("$bin" plan "$l8b" --hardware dgx-h100 --layout dp=8,micro=1,zero=3,recompute=none --global-batch 8 --json)
hsdp=$("$bin" plan "$l8b" --hardware dgx-h100 --gpus 16 --global-batch 64 --tp 1 --pp 1 --zero 3 --micro 1 --recompute none --top 40 2>&1)
cap=$("$bin" plan "$l8b" --hardware dgx-h100 --zero-capacity --json --gpus 64)
if "$py" - "$z2" "$z3" "$hsdp" "$cap" <<'PY'
import json, sys
z2, z3 = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert z3["zero"] == 3 and z3["dp_shard"] == 8 and z3["dp_replicate"] == 1 and z3["fits"], z3
assert z3["memory_gb_per_rank"] < z2["memory_gb_per_rank"] - 5, (z3["memory_gb_per_rank"], z2["memory_gb_per_rank"])
assert z3["info"]["all_gathers_per_step"] == 2, z3["info"]  # forward and backward
assert "zero=3,dp_replicate=2,dp_shard=8" in sys.argv[3], sys.argv[3]
cap = [json.loads(l) for l in sys.argv[4].splitlines()]
by = {(r["zero"], r["devices"]): r["params"] for r in cap}
assert by[(3, 64)] > 8 * by[(3, 8)] > 8 * by[(0, 8)] and by[(0, 64)] == by[(0, 1)], by
PY
then ok "zero 3 and HSDP: less memory than zero 2, the split named, capacity grows"; else fail "zero 3: $z3 / $(head -5 <<<"$hsdp")"; fi
expect_bad "dp_shard without zero 3" "needs zero=3" "$bin" plan "$tiny" --hardware "$out" --layout dp=4,zero=2,dp_shard=2

# checkpoint.async's snapshot (Note [Plan checkpoint snapshot] in src/plan/memory.cpp), asked for
# with --async-checkpoint: GPT-2 124M's fp32 params, m and v (1.48 GB at the deck's 64 positions) in a DGX H100's pinned host
# memory, not the device's; on the calibrated CPU in the rank's memory total; nothing without it.
g2=$src/inputs/gpt2-124m.yaml
snap=$("$bin" plan "$g2" --hardware dgx-h100 --layout dp=1 --async-checkpoint 2>&1)
grep -qE "^  checkpoint snapshot: 1\.48 GB per rank \(in pinned host memory.*, 28\.6 ms per save at 52 GB/s \(PCIe Gen5 x16" <<<"$snap" \
  && ok "--async-checkpoint prints the snapshot's size and copy time" || fail "no snapshot line: $snap"
"$bin" plan "$g2" --hardware dgx-h100 --layout dp=1 2>&1 | grep -q "checkpoint snapshot" \
  && fail "a snapshot line without --async-checkpoint" || ok "no snapshot line without the flag"
"$bin" plan "$g2" --hardware dgx-h100 --gpus 8 --async-checkpoint 2>&1 | grep -qE "^#1 checkpoint snapshot: .* per node of 8 ranks" \
  && ok "the ranked table names the best layout's snapshot" || fail "no snapshot line under the table"
with=$("$bin" plan "$g2" --hardware "$out" --layout dp=1 --async-checkpoint --json)
without=$("$bin" plan "$g2" --hardware "$out" --layout dp=1 --json)
if "$py" - "$with" "$without" <<'PY'
import json, sys
w, wo = json.loads(sys.argv[1]), json.loads(sys.argv[2])
s = w["checkpoint_snapshot"]
assert s["bytes_per_rank"] == 12 * 123738624 and s["in"] == "rank memory", s
assert w["memory_bytes"]["checkpoint_snapshot"] == s["bytes_per_rank"], w["memory_bytes"]
assert abs(w["memory_gb_per_rank"] - wo["memory_gb_per_rank"] - s["bytes_per_rank"] / 1e9) < 1e-6, (w, wo)
assert abs(s["copy_s"] * s["host_copy_gbytes_per_s"] * 1e9 - s["bytes_per_rank"]) < 1, s
assert "checkpoint_snapshot" not in wo and "checkpoint_snapshot" not in wo["memory_bytes"], wo
PY
then ok "cpu: the snapshot is in the rank's memory total"; else fail "cpu snapshot: $with"; fi

# Predicted against measured on this machine, with the file calibrated just now: each of four
# layouts within a factor 2 (predicted/measured in [0.5, 2]). The documented validation
# (docs/plan.md, "Validation on this machine") aims at 10% / 20% over 12 layouts with
# interleaved rounds; on this shared VM one calibration or one bench round moves by ±25-35%
# from one minute to the next (this test's own runs: 0.67-1.46), so a single round can only
# check that the model has not gone wrong as a whole (a doubled step, a missing half). Each
# term is checked against a hand calculation in tests/plan/test_plan_model.cpp. Under ctest -j
# a neighbour's burst can land between the calibration above and a bench, so a failed round gets
# one more, calibrated before and after its benches (--bracket: each bench predicted from the
# two, interpolated by time); a model wrong by 2x fails both.
if "$py" "$src/tools/plan_validate.py" --trident "$bin" --hardware "$out" --cases quick \
     --within-factor 2; then
  ok "predictions within a factor 2 of bench"
elif echo "test_plan: a ratio outside [0.5, 2]; once more, calibrated again" &&
     "$py" "$src/tools/plan_validate.py" --trident "$bin" --bracket --cases quick \
       --within-factor 2; then
  ok "predictions within a factor 2 of bench (second round)"
else
  fail "predictions against bench"
fi
finish
