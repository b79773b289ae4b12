#!/usr/bin/env bash
# ZeRO-3 and HSDP through the binary (Note [ZeRO-3 units] in src/train/zero3.h, Note [HSDP] in
# src/train/data_parallel.h):
#   1. what is not built is refused before anything is allocated, exit 2 naming the keys (and
#      zb-h1, once refused, trains);
#   2. the memory precheck refuses Llama 1.1 B (inputs/llama-1b.yaml on the CPU, micro-batch 1,
#      seq 64) at ZeRO-2 on 4 ranks with the sizes (each rank 11.4 GiB: the whole parameters
#      and gradients, its quarter of the optimizer state; 45.6 GiB for the 4 ranks);
#   3. a gather that never completes (TRIDENT_FAULT_STALL_GATHER on rank 1 only: it sleeps before
#      asking for its 5th gather of unit h1, in step 3) ends the job within 60 s with status 1
#      (a stuck peer, README's "Exit status") and one message from rank 0 naming the unit; the
#      checkpoints of steps 1 and 2 are untouched and `latest` verifies.
# usage: test_zero3.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
source "$(dirname "$0")/lib.sh" "$@"

tiny=("$src/inputs/gpt-tiny.yaml" --set run.threads=1 --set data.valid= --set log.every=1)

# expect_refusal NAME TEXT NP ARGS...: exit 2 and TEXT in the output.
expect_refusal() {
  local name=$1 text=$2 np=$3 rc
  shift 3
  timeout 120 mpirun -n "$np" "$bin" train "$@" >"$name.log" 2>&1
  rc=$?
  if [ $rc -ne 2 ]; then fail "$name: exit $rc, expected 2: $(tail -3 "$name.log")"
  elif ! grep -q -- "$text" "$name.log"; then fail "$name: no '$text' in: $(grep -m1 error "$name.log")"
  else ok "$name: $(grep -m1 'error' "$name.log" | cut -c1-160)"; fi
}

# 1. Refused by name.
# bf16 ZeRO-3 runs on a device (Note [bf16 unit gathers]; test_zero3_device_discipline): on the
# CPU the deck refuses the precision first.
expect_refusal zero3-bf16 "run.precision bf16 needs run.backend cuda" 2 "${tiny[@]}" \
  --set parallel.zero=3 --set run.precision=bf16
# zb-h1 is built (Note [ZeRO-3 and W]): dp 2 x pp 2 trains through the binary.
timeout 300 mpirun -n 4 "$bin" train "${tiny[@]}" --set parallel.zero=3 --set parallel.pp=2 \
  --set parallel.schedule=zb-h1 --set train.accum=2 --set train.steps=3 \
  --set run.out_dir="$scratch/zbh1" >zero3-zbh1.log 2>&1
rc=$?
if [ $rc -ne 0 ]; then fail "zero3-zbh1: exit $rc, expected 0: $(tail -3 zero3-zbh1.log)"
else ok "zero3-zbh1: dp 2 x pp 2 zb-h1 at zero 3 trains 3 steps"; fi
# HSDP runs rounds per micro-batch (the replicas in the last one); ZeRO-1 has no shard to add to.
expect_refusal zero1-micro-batch "parallel.zero_reduce: micro_batch needs parallel.zero 2 or 3" 4 \
  "${tiny[@]}" --set parallel.zero=1 --set parallel.dp_replicate=2 \
  --set parallel.zero_reduce=micro_batch

# 2. The precheck on Llama 1.1 B at dp 4. Skipped where the machine could hold ZeRO-2's 45.6 GiB.
avail_kb=$(awk '/MemAvailable/ {print $2}' /proc/meminfo)
llama=("$src/inputs/llama-1b.yaml" --set run.backend=cpu --set run.threads=1 --set train.micro_batch=1
       --set model.seq_len=64 --set train.steps=3 --set log.every=1)
if [ "$avail_kb" -gt $((48 * 1024 * 1024)) ]; then
  echo "skip llama-1b precheck: $((avail_kb / 1024 / 1024)) GiB available holds ZeRO-2 too"
else
  expect_refusal llama1b-zero2 "not enough memory: each rank needs 11" 4 "${llama[@]}" --set parallel.zero=2
  grep -q "for the 4 ranks on this machine" llama1b-zero2.log ||
    fail "llama1b-zero2: the refusal does not count the 4 ranks: $(grep -m1 error llama1b-zero2.log)"
fi

# 3. A stalled gather. Rank 1 alone gets the fault (an MPMD launch, one context per rank).
ck=("${tiny[@]}" --set parallel.zero=3 --set train.steps=50 --set comm.timeout_s=5
    --set checkpoint.every=1 --set checkpoint.keep=5 --set checkpoint.dir="$scratch/ck"
    --set run.out_dir="$scratch/stall")
start=$(date +%s)
timeout 120 mpirun -n 1 "$bin" train "${ck[@]}" : -n 1 -x TRIDENT_FAULT_STALL_GATHER=h1@5 "$bin" train \
  "${ck[@]}" >stall.log 2>&1
rc=$?
elapsed=$(($(date +%s) - start))
rank0=$(grep -c "^trident: error (rank 0)" stall.log)
if [ $rc -ne 1 ] || [ $elapsed -gt 60 ]; then
  fail "stalled gather: exit $rc after ${elapsed}s, expected 1 within 60 s: $(tail -3 stall.log)"
elif [ "$rank0" -ne 1 ] || ! grep "^trident: error (rank 0)" stall.log | grep -q "unit h1"; then
  fail "stalled gather: rank 0 did not name the unit ($rank0 message(s)):"; grep "trident: error" stall.log
else
  ok "stalled gather: exit $rc after ${elapsed}s: $(grep -m1 'error (rank 0)' stall.log | cut -c1-200)"
fi
latest=$(readlink "$scratch/ck/latest")
if [ "${latest##*/}" != step_00000002 ] && [ "${latest##*/}" != step_2 ]; then
  fail "stalled gather: latest is '$latest', expected step 2's checkpoint"
elif ! "$bin" ckpt verify "$scratch/ck/latest" >verify.log 2>&1; then
  fail "stalled gather: latest does not verify: $(tail -3 verify.log)"
else
  ok "stalled gather: latest is ${latest##*/} and verifies"
fi
finish
