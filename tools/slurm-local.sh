#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for tests and for trying the batch jobs in jobs/slurm.
# Debian's slurm-wlm 22.05 and munge, run as root without systemd; every file it writes (config,
# keys, sockets, state, logs, pid files) is under one directory.
#
#   tools/slurm-local.sh start [--cpus N] [--dir DIR]   # starts munged, slurmctld, slurmd
#   eval "$(tools/slurm-local.sh env [--dir DIR])"      # SLURM_CONF for sbatch, squeue, srun
#   tools/slurm-local.sh stop [--dir DIR]               # stops the daemons (state stays)
# start exits 3 where slurmd cannot run at all (no cgroup filesystem mounted).
#
# DIR defaults to $TRIDENT_SLURM_DIR or /tmp/trident-slurm. The node advertises N CPUs (default
# 8, more than the machine has, so several one-core tasks fit on 2 cores). Ports: $SLURM_PORT
# (default 16817) for slurmctld and the next one for slurmd. MpiDefault stays `none`, as on a
# stock cluster, so a batch script that forgets `--mpi=pmix` fails here as it would there.
# Installs slurmctld, slurmd, slurm-client and munge when they are missing (Debian packages).
set -euo pipefail

cmd=${1:-}
[ $# -gt 0 ] && shift
dir=${TRIDENT_SLURM_DIR:-/tmp/trident-slurm}
cpus=8
while [ $# -gt 0 ]; do
  case $1 in
    --dir) dir=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    *) echo "slurm-local: unknown argument $1" >&2; exit 2 ;;
  esac
done
port=${SLURM_PORT:-16817}
node=$(hostname -s)

install_missing() {
  local missing=()
  for p in slurmctld slurmd slurm-client munge; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  echo "slurm-local: installing ${missing[*]}"
  local sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

write_config() {
  mkdir -p "$dir"/{munge,ctld,spool,log}
  chmod 700 "$dir/munge"
  [ -f "$dir/munge/munge.key" ] || {
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$dir/munge/munge.key"
  }
  # The hardware is what slurmd finds; config_overrides makes it trust the CPU count below.
  cat >"$dir/slurm.conf" <<EOF
# Written by tools/slurm-local.sh: a one-node cluster, all state under $dir.
ClusterName=trident-local
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job waits this long (Slurm default 120 s) before it may start again.
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=${SLURM_CRED_EXPIRE:-10}
StateSaveLocation=$dir/ctld
# Job ids of their own per port: two local clusters on one machine (the Slurm and the scaling
# tests under ctest -j2) must not share ids, since the PMIx plugin keys its per-step
# directories in /tmp by uid and job id (shared ids made srun's task launch fail).
FirstJobId=$(( (port % 10000) * 100 + 1 ))
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=10
MinJobAge=300
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

running() {  # PIDFILE
  [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

start() {
  install_missing
  # slurmd 22.05 always loads a cgroup plugin (its cgroup.conf has no "disabled") and fails
  # where no cgroup filesystem is mounted (a chroot, some containers): say so, exit 3.
  if ! awk '$2 == "/sys/fs/cgroup" || $2 ~ "^/sys/fs/cgroup/" {found=1} END {exit !found}' /proc/mounts; then
    echo "slurm-local: no cgroup filesystem is mounted at /sys/fs/cgroup, and slurmd 22.05 cannot" \
      "start without one (a chroot or a restricted container?)" >&2
    return 3
  fi
  write_config
  if ! running "$dir/munge/munged.pid"; then
    munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
      --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
      --seed-file="$dir/munge/munged.seed"
  fi
  export SLURM_CONF=$dir/slurm.conf
  running "$dir/slurmctld.pid" || slurmctld -f "$SLURM_CONF"
  running "$dir/slurmd.pid" || slurmd -f "$SLURM_CONF" -N "$node"
  # Ready when the node takes jobs (idle or mixed); a minute is ample, it takes about a second.
  for _ in $(seq 1 120); do
    if sinfo -h -N -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
      echo "slurm-local: up, node $node with $cpus CPUs, partition local (SLURM_CONF=$SLURM_CONF)"
      return 0
    fi
    sleep 0.5
  done
  echo "slurm-local: the node did not come up within 60 s; logs in $dir/log:" >&2
  tail -5 "$dir"/log/*.log >&2
  return 1
}

stop() {
  local f
  for f in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    running "$f" && kill "$(cat "$f")"
  done
  for _ in $(seq 1 40); do
    running "$dir/slurmd.pid" || running "$dir/slurmctld.pid" || running "$dir/munge/munged.pid" \
      || { echo "slurm-local: stopped"; return 0; }
    sleep 0.25
  done
  for f in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    running "$f" && kill -9 "$(cat "$f")"
  done
  echo "slurm-local: stopped (killed)"
}

case $cmd in
  start) start ;;
  stop) stop ;;
  env) echo "export SLURM_CONF=$dir/slurm.conf" ;;
  *) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
