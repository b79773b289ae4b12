#!/usr/bin/env bash
# Emulated nodes on one machine: each node is a network namespace with its own hostname, joined
# to the others over TCP through a bridge, with its own link rate. Open MPI then runs across
# them as it would across machines (rsh launcher, TCP BTL between nodes, shared memory inside
# one), so multi-node runs can be tried where there is one machine.
#
#   tools/netns-nodes.sh start N [--rate 1gbit] [--delay 100us] [--slots S] [--dir DIR]
#   $(cat DIR/mpirun-prefix) -n 2 build/trident train inputs/gpt-tiny.yaml ...
#   tools/netns-nodes.sh exec [--dir DIR] I CMD...  # CMD on node I (its namespace, hostname nodeI)
#   tools/netns-nodes.sh stats [--dir DIR] # bytes each node's link carried, both directions
#   tools/netns-nodes.sh stop [--dir DIR]  # removes everything start made; idempotent
#
# DIR defaults to $TRIDENT_NETNS_DIR or /tmp/trident-netns; exec and stats read it too.
# Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2 and the kernel's veth, bridge and
# sch_tbf; start exits 3 with the reason when these are missing, 2 on bad arguments.
#
# Layout, K being the first free instance number (so two instances can coexist):
#   namespace tnK-br       bridge br0 and one port nI per node; no address
#   namespace tnK-nI       lo, veth0 = 10.213.K.(I+1)/24, hostname nodeI for what runs there
#   the root namespace is not touched: no link, address or route is added to it.
# Each link is shaped in both directions by a token bucket (tbf) at --rate on the egress of
# both veth ends: veth0 in the node (what the node sends), nI in the bridge namespace (what it
# receives). --delay adds sch_netem under each tbf, and is refused when the kernel lacks it.
#
# mpirun runs in node 0's namespace (DIR/mpirun wraps it), so node 0's ranks are local to it and
# the other nodes' orted daemons are started through DIR/agent, which plays ssh: it runs the
# command in node I's namespace with hostname nodeI. Each node needs its own UTS namespace:
# Open MPI names its session directory and shared-memory segments after the hostname, and with
# one hostname the "nodes" share /tmp and /dev/shm and their segments collide.
#
# Note [Cores per node]
# Each node gets its own share of the cores (taskset on its orted, or on mpirun for node 0,
# inherited by its ranks), and mpirun-prefix has --bind-to none: every emulated node sees the
# whole machine, and Open MPI would bind each node's first rank to the same first core. With N
# nodes and C usable cores, node I gets cores I*C/N .. (I+1)*C/N - 1 (C/N rounded down; cores
# left over stay unused); with more nodes than cores all nodes share them.
set -euo pipefail

die() { echo "netns-nodes: $*" >&2; exit "${code:-1}"; }
cmd=${1:-}
[ $# -gt 0 ] && shift
dir=${TRIDENT_NETNS_DIR:-/tmp/trident-netns}

# Bits per second of a tc rate (bit, kbit, mbit, gbit; tc's units are powers of 1000).
rate_bits() {
  local n unit
  [[ $1 =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] || return 1
  n=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]}
  case $unit in
    bit) echo "$n" ;; kbit) echo $((n * 1000)) ;; mbit) echo $((n * 1000000)) ;;
    gbit) echo $((n * 1000000000)) ;;
  esac
}

load_state() {
  [ -f "$dir/state" ] || return 1
  # shellcheck source=/dev/null
  . "$dir/state"
}

# Adds the shaping of one veth end: tbf at the link rate, netem under it for a delay.
shape() {
  local ns=$1 dev=$2
  tc -n "$ns" qdisc add dev "$dev" root handle 1: tbf rate "$rate" burst "$burst" latency 20ms
  if [ -n "$delay" ]; then
    tc -n "$ns" qdisc add dev "$dev" parent 1:1 handle 10: netem delay "$delay"
  fi
}

start() {
  local nodes=$1 slots=1
  shift
  rate=1gbit delay=""
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) rate=$2; shift 2 ;;
      --delay) delay=$2; shift 2 ;;
      --slots) slots=$2; shift 2 ;;
      --dir) dir=$2; shift 2 ;;
      *) code=2 die "unknown argument $1" ;;
    esac
  done
  [[ $nodes =~ ^[0-9]+$ ]] && [ "$nodes" -ge 1 ] && [ "$nodes" -le 200 ] \
    || code=2 die "N must be 1..200, got '$nodes'"
  [[ $slots =~ ^[0-9]+$ ]] && [ "$slots" -ge 1 ] || code=2 die "--slots must be >= 1, got '$slots'"
  local bits
  bits=$(rate_bits "$rate") || code=2 die "--rate must be a number with bit, kbit, mbit or gbit, got '$rate'"
  [ -z "$delay" ] || [[ $delay =~ ^[0-9.]+(us|ms)$ ]] || code=2 die "--delay must be like 100us or 2ms, got '$delay'"
  # Open MPI splits plm_rsh_agent at spaces, and the files below are named in one line.
  [[ $dir =~ ^[A-Za-z0-9_./+-]+$ ]] || code=2 die "--dir may hold only [A-Za-z0-9_./+-]: '$dir'"
  for tool in ip tc unshare taskset mpirun; do
    command -v "$tool" >/dev/null || code=3 die "$tool not found"
  done
  if load_state; then
    code=2 die "$dir already holds instance tn$instance ($node_count nodes); stop it first"
  fi
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)

  # Claim an instance number: `ip netns add` fails when the name exists, so two starts at once
  # cannot take the same K. The state file is written before anything else is made, so stop
  # can clean up after a start that failed half-way.
  local k err
  for k in $(seq 1 250); do
    if err=$(ip netns add "tn$k-br" 2>&1); then break; fi
    grep -q "File exists" <<<"$err" || code=3 die "cannot create a network namespace (need root or CAP_SYS_ADMIN): $err"
    [ "$k" -eq 250 ] && code=3 die "no free instance number: tn1-br .. tn250-br all exist"
  done
  instance=$k node_count=$nodes
  local subnet=10.213.$k
  # The cores this process may use, one per word (Cpus_allowed_list: "0-3,6"), split per node.
  local cores=() range lo hi c i per
  for range in $(awk '/^Cpus_allowed_list/ {print $2}' /proc/self/status | tr ',' ' '); do
    lo=${range%-*} hi=${range#*-}
    for ((c = lo; c <= hi; c++)); do cores+=("$c"); done
  done
  per=$(( ${#cores[@]} / nodes ))
  node_cpus=()
  for ((i = 0; i < nodes; i++)); do
    if [ "$per" -ge 1 ]; then
      node_cpus+=("$(IFS=,; echo "${cores[*]:$((i * per)):$per}")")
    else
      node_cpus+=("$(IFS=,; echo "${cores[*]}")")
    fi
  done
  cat >"$dir/state" <<EOF
instance=$k
node_count=$nodes
subnet=$subnet.0/24
rate=$rate
delay=$delay
node_cpus=(${node_cpus[*]})
EOF
  trap 'if [ $? -ne 0 ]; then echo "netns-nodes: start failed; removing what it made" >&2; stop_instance; fi' EXIT

  # 1 ms of the rate, at least 128 KiB: a TSO/GSO packet of 64 KiB must fit, and a bucket this
  # small keeps bursts above the rate under 1 ms.
  burst=$(( bits / 8 / 1000 > 131072 ? bits / 8 / 1000 : 131072 ))
  err=$(ip -n "tn$k-br" link set lo up 2>&1) || code=3 die "cannot configure links (need CAP_NET_ADMIN): $err"
  ip -n "tn$k-br" link add br0 type bridge || code=3 die "the kernel has no bridge support"
  ip -n "tn$k-br" link set br0 up
  local netem=yes
  if ! tc -n "tn$k-br" qdisc add dev lo root netem delay 1ms 2>/dev/null; then
    netem=no
  else
    tc -n "tn$k-br" qdisc del dev lo root
  fi
  if [ -n "$delay" ] && [ $netem = no ]; then
    code=3 die "--delay needs sch_netem, which this kernel lacks (tc qdisc add ... netem fails)"
  fi
  : >"$dir/hostfile"
  for ((i = 0; i < nodes; i++)); do
    ip netns add "tn$k-n$i"
    ip -n "tn$k-n$i" link set lo up
    ip link add veth0 netns "tn$k-n$i" type veth peer name "n$i" netns "tn$k-br" \
      || code=3 die "cannot create a veth pair (kernel without veth?)"
    ip -n "tn$k-br" link set "n$i" master br0 up
    ip -n "tn$k-n$i" addr add "$subnet.$((i + 1))/24" dev veth0
    ip -n "tn$k-n$i" link set veth0 up
    shape "tn$k-n$i" veth0 || code=3 die "cannot add a tbf qdisc (kernel without sch_tbf?)"
    shape "tn$k-br" "n$i"
    echo "$subnet.$((i + 1)) slots=$slots" >>"$dir/hostfile"
  done

  # The launch agent, in place of ssh: `agent [options] HOST COMMAND...`. Like ssh it hands the
  # command to a shell (Open MPI quotes orted's arguments for one), in node I's namespace with
  # hostname nodeI, on node I's cores.
  cat >"$dir/agent" <<EOF
#!/usr/bin/env bash
# Written by tools/netns-nodes.sh for instance tn$k: Open MPI's rsh agent for its nodes.
cpus=(${node_cpus[*]})
while [ \$# -gt 0 ] && [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
case \$host in
  $subnet.*) i=\$(( \${host##*.} - 1 )) ;;
  *) echo "netns-nodes agent: \$host is not a node of tn$k ($subnet.0/24)" >&2; exit 255 ;;
esac
[ -e /run/netns/tn$k-n\$i ] || { echo "netns-nodes agent: no node \$i (\$host)" >&2; exit 255; }
exec ip netns exec tn$k-n\$i unshare --uts -- taskset -c "\${cpus[\$i]}" /bin/sh -c "hostname node\$i && \$*"
EOF
  cat >"$dir/mpirun" <<EOF
#!/usr/bin/env bash
# Written by tools/netns-nodes.sh for instance tn$k: mpirun in node 0 (hostname node0, its cores).
exec ip netns exec tn$k-n0 unshare --uts -- taskset -c ${node_cpus[0]} /bin/sh -c 'hostname node0 && exec mpirun "\$@"' mpirun "\$@"
EOF
  chmod +x "$dir/agent" "$dir/mpirun"
  local root_opt=""
  [ "$(id -u)" -eq 0 ] && root_opt=" --allow-run-as-root"
  # No tree spawn: every orted is started by mpirun itself, through the agent. No binding: each
  # node's ranks keep to its cores (Note [Cores per node]).
  echo "$dir/mpirun$root_opt --hostfile $dir/hostfile --mca plm_rsh_agent $dir/agent" \
       "--mca plm_rsh_no_tree_spawn 1 --bind-to none --mca btl self,vader,tcp" \
       "--mca btl_tcp_if_include $subnet.0/24 --mca oob_tcp_if_include $subnet.0/24" >"$dir/mpirun-prefix"
  trap - EXIT

  local delay_text="no delay"
  [ -n "$delay" ] && delay_text="delay $delay per direction per hop"
  [ $netem = no ] && delay_text="no netem (kernel lacks sch_netem: latency cannot be emulated)"
  local cpu_text="" sep=""
  for ((i = 0; i < nodes; i++)); do cpu_text+="${sep}node$i on core(s) ${node_cpus[$i]}"; sep=", "; done
  [ "$per" -ge 1 ] || cpu_text="all on cores ${node_cpus[0]}: fewer cores than nodes"
  echo "netns-nodes: $nodes nodes tn$k-n0..n$((nodes - 1)) ($subnet.1-$subnet.$nodes, hostnames" \
       "node0..node$((nodes - 1)), $slots slot(s) each; $cpu_text), $rate per link each way," \
       "$delay_text; state in $dir (mpirun-prefix, hostfile, agent)"
}

# Removes instance $instance's namespaces (their veths, bridge and qdiscs go with them) after
# ending what still runs in them, which only this tool's users started there.
stop_instance() {
  local ns pids
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^tn$instance-(br|n[0-9]+)$" || true); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    if [ -n "$pids" ]; then
      # shellcheck disable=SC2086
      kill $pids 2>/dev/null || true
      sleep 1
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      # shellcheck disable=SC2086
      [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
    fi
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -f "$dir/state" "$dir/hostfile" "$dir/agent" "$dir/mpirun" "$dir/mpirun-prefix"
}

parse_dir_only() {
  while [ $# -gt 0 ]; do
    case $1 in
      --dir) dir=$2; shift 2 ;;
      *) code=2 die "unknown argument $1" ;;
    esac
  done
}

case $cmd in
  start)
    [ $# -ge 1 ] || code=2 die "usage: start N [--rate R] [--delay D] [--slots S] [--dir DIR]"
    start "$@" ;;
  stop)
    parse_dir_only "$@"
    if load_state; then
      stop_instance
      echo "netns-nodes: removed instance tn$instance ($node_count nodes)"
    else
      echo "netns-nodes: nothing to stop in $dir"
    fi ;;
  exec)
    if [ "${1:-}" = --dir ]; then dir=${2:-}; shift 2; fi
    [ $# -ge 2 ] || code=2 die "usage: exec [--dir DIR] I CMD..."
    i=$1; shift
    load_state || die "no nodes in $dir (start first)"
    [[ $i =~ ^[0-9]+$ ]] && [ "$i" -lt "$node_count" ] || code=2 die "node must be 0..$((node_count - 1)), got '$i'"
    exec ip netns exec "tn$instance-n$i" unshare --uts -- taskset -c "${node_cpus[$i]}" \
      /bin/sh -c "hostname node$i && exec \"\$@\"" sh "$@" ;;
  stats)
    parse_dir_only "$@"
    load_state || die "no nodes in $dir (start first)"
    # "Sent N bytes" of each tbf: what the node sent (veth0) and what it received (nI).
    sent() { tc -n "$1" -s qdisc show dev "$2" | awk '/^qdisc tbf/ {t = 1} t && /Sent/ {print $2; exit}'; }
    for ((i = 0; i < node_count; i++)); do
      echo "node$i sent_bytes=$(sent "tn$instance-n$i" veth0) received_bytes=$(sent "tn$instance-br" "n$i")"
    done ;;
  *)
    echo "usage: $0 start N [--rate 1gbit] [--delay D] [--slots S] [--dir DIR] | stop [--dir DIR] |" \
         "exec [--dir DIR] I CMD... | stats [--dir DIR]" >&2
    exit 2 ;;
esac
