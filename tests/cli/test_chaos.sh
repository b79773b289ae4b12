#!/usr/bin/env bash
# The chaos test's short version (issue 17; tools/chaos.sh, docs/reliability.md): 8 short runs
# of the tiny deck on 2-3 ranks, each with one fault, every kind at least once (--each-kind),
# seed 17. Every run must end within comm.timeout_s + 60 s without a crash, with the exit
# status and the message its fault expects, and leave a `latest` that verifies and resumes.
# The disk-full runs need a tmpfs (root); where none can be mounted they are skipped and the
# rest still run. About 80 s on 2 cores (CI time: one run per kind).
# usage: test_chaos.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
source "$(dirname "$0")/lib.sh" "$@"

if bash "$src/tools/chaos.sh" --faults 8 --seed 17 --ranks 2..3 --each-kind --binary "$bin" \
     --scratch "$scratch/chaos" >chaos.log 2>&1; then
  ok "chaos: $(tail -1 chaos.log)"
else
  fail "chaos (logs of the failed runs under $scratch/chaos):"; cat chaos.log
fi
grep -q "skipped (no tmpfs)" chaos.log && echo "note: no tmpfs could be mounted: the diskfull runs were skipped"
finish
