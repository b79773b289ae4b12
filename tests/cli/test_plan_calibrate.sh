#!/usr/bin/env bash
# `trident plan --calibrate` on 2 ranks with an emulated link: it prints its progress with
# units, writes a cpu description that carries every key with positive figures (Note
# [Hardware files]), and refuses a bad --out with exit 2. Takes ~10-20 s on 2 cores.
# usage: test_plan_calibrate.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
source "$(dirname "$0")/lib.sh" "$@"

out=$scratch/hw.yaml
log=$(mpirun -n 2 "$bin" plan --calibrate --name cli-test --out "$out" --emulate-gbps 1 2>&1); rc=$?
echo "$log"
[ $rc -eq 0 ] && ok "calibrate exits 0" || fail "calibrate exit status $rc"
[ -s "$out" ] && ok "wrote $out" || fail "no file at $out"
grep -q "calibrate: wrote $out" <<<"$log" && ok "prints the written path" || fail "no 'wrote' line"
grep -qE "gemm 2048x2048x2048, 1 thread: [0-9.]+ GFLOP/s" <<<"$log" && ok "gemm progress with units" \
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
        "sources"}
assert set(d) == keys, f"keys differ: {set(d) ^ keys}"
assert d["name"] == "cli-test" and d["kind"] == "cpu" and d["dtype"] == "fp32", d
assert d["devices_per_node"] >= 1
dims = [p["min_dim"] for p in d["gemm"]]
assert dims == [32, 64, 128, 256, 512, 1024, 2048], dims
assert all(p["tflops"] > 0 for p in d["gemm"]) and d["peak_tflops"] == max(p["tflops"] for p in d["gemm"])
for k in ("memory_gbytes_per_s", "memory_gb"):
    assert d[k] > 0, (k, d[k])
for link in ("intra_node", "inter_node"):
    assert d[link]["gbytes_per_s"] > 0 and d[link]["latency_us"] >= 0, d[link]
assert 0.05 < d["inter_node"]["gbytes_per_s"] <= 0.126, d["inter_node"]
assert 0 <= d["overlap_slowdown"] < 1
assert any("measured by trident plan --calibrate" in s for s in d["sources"]), d["sources"]
PY
then ok "the file has every key and plausible figures"; else fail "the file's contents"; fi

# A directory that does not exist: exit 2 with one message naming --out.
err=$(mpirun -n 2 "$bin" plan --calibrate --out "$scratch/no/such/dir/hw.yaml" 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] && ok "bad --out exits 2" || fail "bad --out: exit status $rc, expected 2: $err"
grep -q -- "--out .*no/such/dir" <<<"$err" && ok "the message names --out" || fail "message: $err"

# Once `trident plan DECK --hardware FILE` exists (src/app/plan_cmd.cpp), also check here that
# it reads $out and that a bad hardware file exits 2 naming the key, e.g.:
#   sed 's/^peak_tflops:.*/peak_tflops: -1/' "$out" > bad.yaml
#   "$bin" plan "$src/inputs/gpt-tiny.yaml" --hardware bad.yaml --gpus 2   # exit 2, "peak_tflops"
finish
