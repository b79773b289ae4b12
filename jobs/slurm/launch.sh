# Sourced by jobs/slurm/*.sbatch (from $SLURM_SUBMIT_DIR: Slurm runs a copy of the batch script
# from its spool directory, so the script cannot find this file next to itself).
# Note [Batch job continuation]:
#   - The pre-timeout signal (#SBATCH --signal=USR1@T, no "B:") goes to every task of the srun
#     step, so each trident rank gets it directly. A user's --signal=B:USR1@T goes to this shell
#     only: trident_srun traps it and passes it on to srun, which forwards USR1 to its tasks.
#     Either way trident saves a checkpoint at the next step boundary and exits 0.
#   - trident then says in run.out_dir/run_state.json whether the run is done or was stopped by
#     the signal (Note [Run state file]); only the latter requeues the job (scontrol requeue:
#     same job id, same options; needs #SBATCH --requeue). Requeue rather than an
#     afterany follow-up job, because a follow-up would have to rebuild every sbatch option of the
#     first job; a requeued job waits Slurm's credential lifetime (cred_expire, 120 s by default)
#     before it may start again. The next run continues with checkpoint.resume: auto.
#   - Anything else (a crash, bad input, a time-out kill) fails the job and does not requeue:
#     a run that cannot start would otherwise requeue itself forever.

# The srun --mpi plugin for Open MPI: $TRIDENT_SRUN_MPI if set, else pmix, else pmi2, from what
# `srun --mpi=list` offers. Without one Open MPI's MPI_Init fails ("OMPI was not built with
# SLURM's PMI support"), so stop before that with a message that says what to do.
trident_mpi_plugin() {
  if [ -n "${TRIDENT_SRUN_MPI:-}" ]; then echo "$TRIDENT_SRUN_MPI"; return; fi
  local offered
  offered=$(srun --mpi=list 2>&1 || true)
  for p in pmix pmi2; do
    if grep -qw "$p" <<<"$offered"; then echo "$p"; return; fi
  done
  echo "trident: this Slurm offers no PMI plugin Open MPI can use (srun --mpi=list: $(tr '\n' ' ' \
    <<<"$offered")); ask for slurm's pmix plugin, or set TRIDENT_SRUN_MPI" >&2
  return 2
}

# The run.out_dir a trident command line ends up with: the last --set run.out_dir=X, else $1.
trident_out_dir() {
  local dir=$1
  shift
  while [ $# -gt 0 ]; do
    case $1 in
      --set) [ $# -gt 1 ] && case $2 in run.out_dir=*) dir=${2#run.out_dir=} ;; esac; shift ;;
      --set=run.out_dir=*) dir=${1#--set=run.out_dir=} ;;
    esac
    shift
  done
  echo "$dir"
}

# trident_srun OUT_DIR SRUN_ARGS... -- runs srun with the given arguments (the trident command
# line included), passes a batch-shell USR1/TERM on to it, then requeues the job when trident was
# stopped by the signal. Returns srun's status otherwise.
trident_srun() {
  local out_dir=$1
  shift
  local mpi
  mpi=$(trident_mpi_plugin) || return 2
  echo "trident: job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}), ${SLURM_NTASKS:-?} tasks on ${SLURM_JOB_NODELIST:-?}, srun --mpi=$mpi"
  srun --mpi="$mpi" --kill-on-bad-exit=1 "$@" &
  local srun_pid=$!
  trap 'echo "trident: batch shell got SIGUSR1, passing it to the ranks"; kill -USR1 $srun_pid' USR1
  trap 'echo "trident: batch shell got SIGTERM, passing it to the ranks"; kill -TERM $srun_pid' TERM
  local rc=0
  # wait returns early (status > 128) when a trapped signal arrives; wait again for srun itself.
  while true; do
    wait "$srun_pid" && rc=0 || rc=$?
    kill -0 "$srun_pid" 2>/dev/null || break
  done
  trap - USR1 TERM
  [ "$rc" -eq 0 ] || { echo "trident: srun exited with status $rc; not requeued" >&2; return "$rc"; }
  local state_file=$out_dir/run_state.json
  if [ ! -f "$state_file" ]; then
    echo "trident: $state_file is missing after a clean exit; not requeued" >&2
    return 1
  fi
  if grep -q '"reason":"stop signal"' "$state_file" && grep -q '"state":"stopped"' "$state_file"; then
    echo "trident: stopped by the signal ($(cat "$state_file")); requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID" || {
      echo "trident: Slurm refused the requeue (the job needs --requeue, or the cluster forbids" \
        "it); submit the same command again: checkpoint.resume: auto continues" >&2
      return 1
    }
    sleep 60  # scontrol requeue ends this script; never report success before it does
    return 1
  fi
  echo "trident: $(cat "$state_file")"
}
