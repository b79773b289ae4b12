# Sourced first by every tests/cli/test_*.sh, with the script's arguments:
#   source "$(dirname "$0")/lib.sh" "$@"     # TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
# Sets bin, src and scratch, starts in a fresh scratch directory, lets Open MPI run as root with
# more ranks than cores (and idle ranks yield), and counts checks: `ok TEXT`, `fail TEXT`, then
# `finish` prints the count and returns non-zero if any failed. py is Debian's python (h5py,
# numpy, torch). start_local_slurm PORT_BASE runs a private tools/slurm-local.sh cluster in
# the scratch directory until the script exits (skips where slurmd cannot run: no cgroup fs).
set -uo pipefail
bin=$1 src=$2 scratch=$3
rm -rf "$scratch" && mkdir -p "$scratch"
cd "$scratch" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mpi_yield_when_idle=1
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
ok() { echo "ok   $*"; }
finish() { echo "$failures failure(s)"; [ "$failures" -eq 0 ]; }
py=/usr/bin/python3

start_local_slurm() {  # PORT_BASE: skips (77) without Slurm, exits 1 if it does not start
  local tool
  for tool in slurmctld slurmd munged sbatch; do
    command -v "$tool" >/dev/null || { echo "SKIP: $tool is not installed (tools/setup.sh installs slurm)"; exit 77; }
  done
  # Its own state and ports, never a developer's instance.
  export TRIDENT_SLURM_DIR=$scratch/slurm SLURM_PORT=$(($1 + ($$ % 500) * 2))
  local rc=0
  bash "$src/tools/slurm-local.sh" start --cpus 8 || rc=$?
  [ $rc -eq 3 ] && { echo "SKIP: slurmd cannot run on this machine (see the message above)"; exit 77; }
  [ $rc -eq 0 ] || { echo "FAIL: local Slurm did not start (exit $rc)"; exit 1; }
  trap 'bash "$src/tools/slurm-local.sh" stop >/dev/null' EXIT
  eval "$(bash "$src/tools/slurm-local.sh" env)"
}
