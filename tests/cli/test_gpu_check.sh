#!/usr/bin/env bash
# tools/gpu-check.sh returns a table and a verdict whatever breaks (Note [GPU check phases]),
# checked without a GPU: the script runs on stand-ins for trident, test_cuda, bench_kernels
# and nvidia-smi (tests/cli/gpu_check_fakes/, named an H100 PCIe) within a 90 s deadline, with
# phases made to hang through TRIDENT_GPU_CHECK_REHEARSE_HANG:
#   1. smoke ignores TERM (KILL must end it), one bf16 accuracy run stops its own timeout (it
#      must be abandoned), bench gpt2-350m-bf16 hangs (recorded as timed out, not retried);
#      the script ends within its deadline with a FAIL verdict naming each, the other benchmarks
#      measured (1.5B retried at micro-batch 16 after a refusal to fit at 32; 124M in fp32
#      not retried after a refusal not about memory), MFU against the
#      H100 PCIe's 756 TFLOP/s (the fake's 0.4000 against 989: 0.4 · 989 / 756 = 0.5233), and
#      the cuDNN refusal of a shape no deck runs and the two-GPU test's skip on this one-GPU
#      machine reported, not failed; the mixture's case (mixtral-1b) measured, last;
#   2. the script killed (SIGKILL) while smoke hangs still leaves a table with an INCOMPLETE
#      verdict naming the phase, and the hung job ends at its own cap.
# usage: test_gpu_check.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR (the binary is not used)
source "$(dirname "$0")/lib.sh" "$@"
fakes=$src/tests/cli/gpu_check_fakes
export PATH=$fakes:$PATH TRIDENT_GPU_CHECK_BIN=$fakes

# 1. Hangs of each kind, the whole run.
start=$SECONDS
OUT=$scratch/out GPU_CHECK_SECONDS=90 \
  TRIDENT_GPU_CHECK_REHEARSE_HANG=smoke,accuracy-bf16-1338:stuck,bench-gpt2-350m-bf16 \
  timeout -k 5 150 bash "$src/tools/gpu-check.sh" >run1.log 2>&1
rc=$? took=$((SECONDS - start))
table=$scratch/out/table.md
[ "$rc" -eq 1 ] && ok "exit 1 (FAIL) after the hangs" || fail "exit $rc, expected 1 (FAIL); $(tail -5 run1.log)"
# 90 s deadline; its last phases' caps may overrun it by the kill margins, 10 s at most.
[ "$took" -le 100 ] && ok "ended in $took s (deadline 90)" || fail "took $took s, deadline 90"
grep -q "^gpu-check: FAIL" "$table" && ok "table.md ends with a verdict" || fail "no verdict in table.md"
grep -q "^- smoke: trident train on the GPU timed out" "$table" &&
  ok "smoke's hang (TERM ignored) is a timeout" || fail "smoke's timeout not in the verdict"
grep -q "^smoke: still running" run1.log && fail "smoke had to be abandoned: KILL did not end it" ||
  ok "KILL ended smoke"
grep -q "accuracy-bf16-1338: still running .* abandoned" run1.log &&
  ok "the stuck accuracy run was abandoned" || fail "no abandoned accuracy run in the log"
grep -q "^- bf16 accuracy: the bf16 run of seed 1338 timed out" "$table" &&
  ok "the abandoned run is in the verdict" || fail "the abandoned run is not in the verdict"
grep -q "^| gpt2-350m-bf16 | 32 | timed out after" "$table" &&
  ok "gpt2-350m-bf16 recorded as timed out at micro-batch 32" || fail "no timed-out row for gpt2-350m-bf16"
grep -q "bench gpt2-350m-bf16 micro_batch 16" run1.log &&
  fail "gpt2-350m-bf16 retried at micro-batch 16 after a timeout" || ok "no retry after the timeout"
grep -q "^| gpt2-1.5b-bf16 | 16 | 163840.0 |" "$table" &&
  ok "gpt2-1.5b-bf16 measured at 16 after 32 did not fit" || fail "no gpt2-1.5b-bf16 row at 16"
grep -q "^| gpt2-124m | 64 | failed (exit 2) |" "$table" &&
  ok "gpt2-124m's refusal (not about memory) recorded" || fail "no failed row for gpt2-124m at 64"
grep -q "bench gpt2-124m micro_batch 32" run1.log &&
  fail "gpt2-124m retried after a refusal not about memory" || ok "no retry after a refusal not about memory"
grep -q "^| gpt2-124m-bf16 | 64 | 163840.0 | 100.00 | 0.5233 |" "$table" &&
  ok "MFU against the H100 PCIe's 756 TFLOP/s" || fail "MFU not 0.5233: $(grep gpt2-124m-bf16 "$table")"
# The mixture's case is the last phase before the summary, and still has its time.
grep -q "^| mixtral-1b | 8 | 163840.0 |" "$table" &&
  ok "the last case, mixtral-1b, measured at micro-batch 8" || fail "no mixtral-1b row"
[ "$(grep -E '^=== \[[0-9]+ s\] ' run1.log | tail -2 | head -1 | grep -c 'bench mixtral-1b')" = 1 ] &&
  ok "mixtral-1b runs right before the summary" || fail "mixtral-1b is not the last phase"
grep -q "^- test_cuda Shapes/AttentionTest.CudnnMatchesCpu/3 skipped" "$table" &&
  ok "the cuDNN refusal is reported" || fail "the cuDNN refusal is not reported"
grep -q "^- test_cuda PipelineLinks.TwoStagesOverNcclOnTwoGpus skipped" "$table" &&
  ok "the two-GPU test's skip is reported" || fail "the two-GPU test's skip is not reported"
grep -q "test(s) skipped" "$table" && fail "a reported skip counted as a problem" ||
  ok "the reported skips are no problem"
# Listed whole first: grep -q would stop reading early and, under pipefail, tar's SIGPIPE fails it.
archived=$(tar -tzf "$scratch/out/logs.tar.gz")
grep -q "smoke.log" <<<"$archived" &&
  ok "logs.tar.gz holds smoke.log" || fail "logs.tar.gz lacks smoke.log"
sleep 1
pgrep -f 'kill -STOP \$PPID' >/dev/null && fail "a hung job outlived the script" ||
  ok "no hung job outlived the script"

# 2. Killed from outside while smoke hangs: the table written when the phase began remains.
OUT=$scratch/out2 GPU_CHECK_SECONDS=90 TRIDENT_GPU_CHECK_REHEARSE_HANG=smoke \
  bash "$src/tools/gpu-check.sh" >run2.log 2>&1 &
pid=$!
for _ in $(seq 1 40); do grep -q "=== .* smoke" run2.log 2>/dev/null && break; sleep 0.5; done
sleep 1
kill -KILL "$pid"; wait "$pid" 2>/dev/null
grep -q '^gpu-check: INCOMPLETE: cut off in phase "smoke' "$scratch/out2/table.md" &&
  ok "killed during smoke: table.md says INCOMPLETE in smoke" ||
  fail "no INCOMPLETE verdict after a kill: $(tail -3 "$scratch/out2/table.md")"
# Its smoke job has a timeout of its own: gone by its cap and KILL margin (11 + 5 s) at most.
for _ in $(seq 1 30); do pgrep -f 'trap "" TERM; while' >/dev/null || break; sleep 1; done
pgrep -f 'trap "" TERM; while' >/dev/null && fail "the hung smoke outlived its cap after the kill" ||
  ok "the hung smoke ended by its own timeout after the kill"
grep -q "PASS" "$scratch/out2/table.md" && fail "a cut-off run's table says PASS" ||
  ok "a cut-off run's table says no PASS"
finish
