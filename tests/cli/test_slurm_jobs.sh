#!/usr/bin/env bash
# jobs/slurm/cpu-train.sbatch under a real (local, one-node) Slurm 22.05 (tools/slurm-local.sh):
#   1. the pre-timeout signal: a 2-task job with --time=2 --signal=USR1@85 gets SIGUSR1 in every
#      rank mid-run, checkpoints, requeues itself (same job id, restart count 1), resumes with
#      checkpoint.resume: auto and ends at train.steps with every loss and grad norm equal,
#      bitwise, to an uninterrupted mpirun run of the same deck;
#   2. launch mistakes: `srun mpirun trident` (two worlds) stops with exit 2 and a message that
#      says so; a batch job whose srun has no PMI plugin fails and is not requeued;
#   3. the jobs' output lands in runs/slurm/ of the submit directory, never beside it (the
#      repository root, for a user), and the source tree ships runs/slurm/ for it.
# Skips (77) when Slurm's daemons are not installed (tools/setup.sh installs them).
# usage: test_slurm_jobs.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
source "$(dirname "$0")/lib.sh" "$@"
start_local_slurm 20000
export TRIDENT_HOME=$src TRIDENT_BIN=$bin
mkdir -p runs/slurm  # Slurm does not create --output's directory (the sbatch headers say so)

wait_job() {  # JOBID SECONDS: until the job has left the queue; prints its final state
  local end=$((SECONDS + $2))
  while [ $SECONDS -lt $end ]; do
    squeue -h -j "$1" 2>/dev/null | grep -q . || break
    sleep 1
  done
  scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | head -1
}
losses() { $py -c "import json,sys; [print(repr(json.loads(l)['step']), repr(json.loads(l)['loss']), repr(json.loads(l)['grad_norm'])) for l in open(sys.argv[1])]" "$1"; }

# 1. The pre-timeout signal. Slurm checks time limits about every 30 s, so USR1@85 under a 120 s
# limit arrives 5-35 s after the start; 700 steps of gpt-tiny take longer than that on 2 cores
# (about 70 ms per step). The uninterrupted reference runs meanwhile under mpirun.
steps=700
deck=("$src/inputs/gpt-tiny.yaml" --set train.steps=$steps --set train.val_every=0 --set log.every=100
      --set run.threads=1)
timeout 600 mpirun -n 2 "$bin" train "${deck[@]}" --set run.out_dir=whole >whole.log 2>&1 &
ref=$!
jid=$(sbatch --parsable --ntasks=2 --time=2 --signal=USR1@85 "$src/jobs/slurm/cpu-train.sbatch" \
      "${deck[@]}" --set run.out_dir=job)
# Once the job has been requeued, give it room so its second part is not signalled again: one
# requeue is what this test pins.
requeued=""
for _ in $(seq 1 240); do
  if scontrol show job "$jid" 2>/dev/null | grep -q 'Restarts=1'; then
    scontrol update JobId="$jid" TimeLimit=10 && requeued=yes
    break
  fi
  sleep 0.5
done
state=$(wait_job "$jid" 600)
wait $ref || fail "uninterrupted mpirun run: $(tail -3 whole.log)"
out=runs/slurm/trident-$jid.out
if [ -z "$requeued" ]; then
  fail "job $jid was not requeued ($state): $(grep -E 'trident:|checkpoint|error' "$out" | head -5)"
elif [ "$state" != "JobState=COMPLETED" ]; then
  fail "job $jid ended $state: $(tail -5 "$out")"
elif ! grep -q "(stop signal" "$out" || ! grep -q "requeueing job $jid" "$out"; then
  fail "no stop-signal checkpoint and requeue in $out: $(grep -E 'trident:|checkpoint' "$out")"
elif ! grep -q "resumed from .*step_" "$out" || ! grep -q "restart 1" "$out"; then
  fail "the requeued job did not resume: $(grep -E 'trident:|resumed' "$out")"
else
  stop=$(grep -o 'step_[0-9]*.(stop signal' "$out" | head -1)
  ok "job $jid: signal, checkpoint at ${stop%% *}, requeued, resumed, $state"
fi
n_whole=$(wc -l < whole/metrics.jsonl 2>/dev/null || echo 0)
n_job=$(wc -l < job/metrics.jsonl 2>/dev/null || echo 0)
if [ "$n_whole" -ne $steps ] || [ "$n_job" -ne $steps ]; then
  fail "metrics lines: uninterrupted $n_whole, job $n_job, want $steps each"
elif diff <(losses whole/metrics.jsonl) <(losses job/metrics.jsonl) >/dev/null; then
  ok "requeued job's $n_job losses and grad norms equal the uninterrupted run's bitwise (final $(tail -1 job/metrics.jsonl | $py -c 'import json,sys; print(json.load(sys.stdin)["loss"])'))"
else
  fail "requeued job's losses differ:"; diff <(losses whole/metrics.jsonl) <(losses job/metrics.jsonl) | head -4
fi
# The BLAS kernel check re-executes trident before MPI_Init (Note [BLAS core check]): under srun
# it must pick the same kernel as under mpirun.
core_mpirun=$(grep -o 'blas_core=[A-Za-z0-9]*' whole.log | head -1)
core_srun=$(grep -o 'blas_core=[A-Za-z0-9]*' "$out" | sort -u | tr '\n' ' ')
[ -n "$core_mpirun" ] && [ "$core_srun" = "$core_mpirun " ] && ok "srun and mpirun: $core_mpirun" \
  || fail "BLAS kernel under srun '$core_srun', under mpirun '$core_mpirun'"
grep -q '"state":"done"' job/run_state.json 2>/dev/null && ok "run_state.json: $(cat job/run_state.json)" \
  || fail "run_state.json after the job: $(cat job/run_state.json 2>&1)"

# 2a. srun mpirun: every srun task runs its own mpirun world; trident must refuse, exit 2.
short=("$src/inputs/gpt-tiny.yaml" --set train.steps=3 --set run.threads=1 --set log.every=1)
timeout 120 srun --mpi=pmix -n 2 mpirun -n 1 "$bin" train "${short[@]}" --set run.out_dir=nested \
  >nested.log 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "mpirun runs inside srun" nested.log && ! grep -q "^step" nested.log; then
  ok "srun mpirun refused (exit $rc): $(grep -m1 'launch:' nested.log | head -c 100)..."
else
  fail "srun mpirun: exit $rc: $(tail -3 nested.log)"
fi

# 2b. A job whose srun has no PMI plugin: it fails, says why, and is not requeued.
jid2=$(TRIDENT_SRUN_MPI=none sbatch --parsable --ntasks=2 --time=2 "$src/jobs/slurm/cpu-train.sbatch" \
       "${short[@]}" --set run.out_dir=nopmi)
state=$(wait_job "$jid2" 120)
if [ "$state" = "JobState=FAILED" ] && grep -q "not requeued" "runs/slurm/trident-$jid2.out" \
   && ! scontrol show job "$jid2" | grep -q 'Restarts=[1-9]'; then
  ok "no PMI plugin: job $jid2 $state, not requeued: $(grep -m1 -i 'PMI' "runs/slurm/trident-$jid2.out" | head -c 90)"
else
  fail "no PMI plugin: job $jid2 $state: $(tail -5 "runs/slurm/trident-$jid2.out")"
fi

# 3. Where the output went: runs/slurm/ for both jobs, nothing beside it.
stray=$(ls trident-*.out 2>/dev/null | tr '\n' ' ')
if [ -s "runs/slurm/trident-$jid.out" ] && [ -s "runs/slurm/trident-$jid2.out" ] && [ -z "$stray" ]; then
  ok "job output in runs/slurm/ (trident-$jid.out, trident-$jid2.out), none in the submit directory"
else
  fail "job output: runs/slurm/ has '$(ls runs/slurm | tr '\n' ' ')', the submit directory '$stray'"
fi
# A clone has the directory: its placeholder is tracked although runs/ is ignored.
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  git -C "$src" ls-files --error-unmatch runs/slurm/.gitkeep >/dev/null 2>&1 \
    && ok "the repository tracks runs/slurm/ (a clone can submit from its root)" \
    || fail "runs/slurm/.gitkeep is not tracked: sbatch from a fresh clone's root finds no runs/slurm/"
fi

finish
