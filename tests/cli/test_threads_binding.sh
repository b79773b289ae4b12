#!/usr/bin/env bash
# Note [Threads and binding] (src/app/run_setup.h): a rank asked for more run.threads than the
# cores its CPU affinity allows says so, once, with the launch fix, and reports cores=:
#   1. bench under `mpirun -n 1 --bind-to core` (Open MPI's default for up to 2 ranks) with
#      run.threads 2: the WARNING names run.threads and --bind-to none; the bench line says
#      cores=1 and bench.json "cores": 1.
#   2. The same with --bind-to none: no warning, cores = the machine's cores.
#   3. train's header says "on 1 allowed core(s)" and warns, under the same binding.
# usage: test_threads_binding.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
source "$(dirname "$0")/lib.sh" "$@"
cores=$($py -c "import os; print(len(os.sched_getaffinity(0)))")  # nproc honours OMP_NUM_THREADS
if [ "$cores" -lt 2 ]; then
  echo "skip: one core here, so no binding can leave a thread without its own core"
  exit 77
fi
tiny=("$src/inputs/gpt-tiny.yaml" --set run.threads=2 --set train.val_every=0)

# 1. Bound to one core.
timeout 300 mpirun -n 1 --bind-to core "$bin" bench "${tiny[@]}" --set run.out_dir=bound \
  --warmup 1 --steps 1 >bound.log 2>&1 || fail "bench bound to a core: $(tail -3 bound.log)"
if grep -q "WARNING: run.threads is 2 but a rank may run on only 1 core" bound.log &&
   grep -q -- "--bind-to none" bound.log; then
  ok "bound to one core: warned, naming the fix"
else
  fail "bound to one core, no warning: $(grep -i 'warn\|bench:' bound.log | head -3)"
fi
[ "$(grep -c 'WARNING: run.threads' bound.log)" = 1 ] && ok "warned once" ||
  fail "warned $(grep -c 'WARNING: run.threads' bound.log) times"
grep -q '^bench: tokens_per_s=.* cores=1 ' bound.log && ok "bench line: cores=1" ||
  fail "bench line without cores=1: $(grep '^bench: tokens_per_s=' bound.log)"
$py -c "import json,sys; sys.exit(0 if json.load(open('bound/bench.json'))['cores'] == 1 else 1)" &&
  ok "bench.json: cores 1" || fail "bench.json cores: $(grep cores bound/bench.json)"

# 2. Not bound: every core allowed, no warning.
timeout 300 mpirun -n 1 --bind-to none "$bin" bench "${tiny[@]}" --set run.out_dir=free \
  --warmup 1 --steps 1 >free.log 2>&1 || fail "bench unbound: $(tail -3 free.log)"
if ! grep -q "WARNING: run.threads" free.log && grep -q "^bench: tokens_per_s=.* cores=$cores " free.log; then
  ok "unbound: no warning, cores=$cores"
else
  fail "unbound: $(grep -i 'warn' free.log | head -2) $(grep -o 'cores=[0-9]*' free.log)"
fi

# 3. train's header.
timeout 300 mpirun -n 1 --bind-to core "$bin" train "${tiny[@]}" --set train.steps=1 \
  --set run.out_dir=train >train.log 2>&1 || fail "train bound to a core: $(tail -3 train.log)"
if grep -q "with 2 threads per rank on 1 allowed core(s)" train.log &&
   grep -q "^WARNING: run.threads is 2" train.log; then
  ok "train header: 2 threads on 1 allowed core, warned"
else
  fail "train header: $(grep -i 'ranks:\|warn' train.log | head -3)"
fi
finish
