#!/usr/bin/env bash
# Two emulated nodes (tools/netns-nodes.sh: network namespaces on a bridge, 1 Gbit/s links
# shaped by tbf) and trident across them over TCP:
#   1. mpirun through DIR/mpirun-prefix puts one rank on each node (hostnames node0, node1), on
#      disjoint cores;
#   2. the links carry no more than their rate: 25 MB from node 0 to node 1 take at least
#      25 MB / 1 Gbit/s, and no less than a third of the rate is reached;
#   3. inputs/gpt-tiny.yaml with dp 2, one rank per node, one thread, 20 steps: every step's
#      loss equals the one-rank run's (same global batch as 2 accumulated micro-batches) within
#      1e-5 relative, and the tbf byte counters show that the gradients crossed the links;
#   4. stop leaves nothing behind: no namespace of the instance, no new link in the root
#      namespace, no state files. Teardown also runs on failure (trap).
# Skips (77) when network namespaces, veth pairs or tbf qdiscs cannot be created (not root, no
# CAP_NET_ADMIN/CAP_SYS_ADMIN, a kernel without them): tools/netns-nodes.sh start exits 3 then.
# usage: test_netns_nodes.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
# A run killed before its trap ran (a ctest timeout) left its instance: stop it before lib.sh
# empties the scratch directory that holds its state.
[ -f "$3/nodes/state" ] && bash "$2/tools/netns-nodes.sh" stop --dir "$3/nodes"
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh" "$@"
$py -c "import json" 2>/dev/null || { echo "skip: $py is needed to read metrics.jsonl"; exit 77; }
# Runs a Python check (stdin) that prints ok/FAIL lines; its FAIL lines count here, and so does
# a check that crashed or printed nothing.
pycheck() {
  local out
  out=$($py - "$@" 2>&1)
  echo "$out"
  failures=$((failures + $(grep -c '^FAIL' <<<"$out")))
  if grep -q '^Traceback' <<<"$out"; then fail "the check itself crashed (above)"
  elif ! grep -qE '^(ok|FAIL) ' <<<"$out"; then fail "the check printed no result"; fi
}
nodes_tool=$src/tools/netns-nodes.sh
dir=$scratch/nodes

links_before=$(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sort)
out=$(bash "$nodes_tool" start 2 --rate 1gbit --dir "$dir" 2>&1); rc=$?
echo "$out"
if [ $rc -eq 3 ]; then echo "skip: emulated nodes cannot be made here: $out"; exit 77; fi
[ $rc -eq 0 ] || { echo "FAIL netns-nodes.sh start exited $rc"; bash "$nodes_tool" stop --dir "$dir"; exit 1; }
instance=$(. "$dir/state" && echo "$instance")
trap 'bash "$nodes_tool" stop --dir "$dir" >/dev/null 2>&1' EXIT
prefix=$(cat "$dir/mpirun-prefix")
node1_ip=$(awk 'NR == 2 {print $1}' "$dir/hostfile")

# 1. One rank per node, each with its node's hostname, on its node's own cores (2 cores or
# more: Open MPI, left to bind, put the rank of every emulated node on core 0).
# shellcheck disable=SC2016,SC2086
timeout 60 $prefix -n 2 sh -c 'echo $(hostname) $(awk "/^Cpus_allowed_list/ {print \$2}" /proc/self/status)' \
  >placement.txt 2>&1 || fail "mpirun -n 2 through mpirun-prefix: $(cat placement.txt)"
pycheck placement.txt <<'EOF'
import os, sys
lines = sorted(l.split() for l in open(sys.argv[1]) if l.strip())
cores = len(os.sched_getaffinity(0))  # not nproc: it answers OMP_NUM_THREADS when that is set
def cpus(text):
    out = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-"); out |= set(range(int(lo), int(hi or lo) + 1))
    return out
if [l[0] for l in lines] != ["node0", "node1"] or any(len(l) != 2 for l in lines):
    print(f"FAIL mpirun -n 2 ran on {lines}, expected one rank on node0 and one on node1")
elif cores >= 2 and cpus(lines[0][1]) & cpus(lines[1][1]):
    print(f"FAIL the two nodes' ranks share cores: {lines} ({cores} cores here)")
else:
    print(f"ok   mpirun -n 2 through mpirun-prefix: {lines[0][0]} on core(s) {lines[0][1]}, "
          f"{lines[1][0]} on core(s) {lines[1][1]} ({cores} cores here)")
EOF

# 2. 25 MB over the link, timed by the sender from the first byte to the receiver's reply
# after the last. A tbf at 1 Gbit/s cannot pass it in under 25e6 * 8 / 1e9 = 0.2 s, less what
# its bucket holds at the start (128 KiB in each of the two tbfs on the path, 1% of 25 MB):
# the bound is 0.98 x 0.2 s. Unshaped, this veth pair carried ~12 Gbit/s. The goodput must
# also reach a third of the rate: TCP/IP headers take ~5%, and the two Python ends share 2
# cores with whatever else runs, but a wrongly sized bucket throttles far below the rate.
cat >xfer.py <<'EOF'
import socket, sys, time
role, host, port, nbytes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if role == "recv":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port)); s.listen(1)
    c, _ = s.accept(); got = 0
    while got < nbytes:
        b = c.recv(1 << 20)
        if not b: break
        got += len(b)
    c.sendall(b"k")
else:
    for _ in range(100):
        try: c = socket.create_connection((host, port)); break
        except OSError: time.sleep(0.1)
    buf, left, t = bytes(1 << 20), nbytes, time.perf_counter()
    while left > 0:
        n = min(left, len(buf)); c.sendall(buf[:n]); left -= n
    c.recv(1); print(f"{time.perf_counter() - t:.4f}")
EOF
bytes=25000000
timeout 30 bash "$nodes_tool" exec --dir "$dir" 1 $py xfer.py recv "$node1_ip" 5001 $bytes &
receiver=$!
secs=$(timeout 30 bash "$nodes_tool" exec --dir "$dir" 0 $py xfer.py send "$node1_ip" 5001 $bytes 2>&1)
wait $receiver
if $py -c "import sys; t = float(sys.argv[1]); sys.exit(not (0.98 * 0.2 <= t <= 0.2 * 3))" "$secs" 2>/dev/null; then
  ok "25 MB node0 -> node1 in $secs s (at least 0.196 s at 1 Gbit/s, at most 0.6 s)"
else
  fail "25 MB node0 -> node1 took '$secs' s; 1 Gbit/s allows 0.196 .. 0.6 s"
fi

# 3. dp 2 across the nodes against one rank accumulating the same 2 micro-batches.
common=("$src/inputs/gpt-tiny.yaml" --set run.threads=1 --set train.steps=20 --set train.val_every=0
        --set log.every=10)
before=$(bash "$nodes_tool" stats --dir "$dir")
# shellcheck disable=SC2086
timeout 120 $prefix -n 2 "$bin" train "${common[@]}" --set run.out_dir=dp2 >dp2.log 2>&1 \
  || fail "dp 2 over the emulated nodes: $(tail -3 dp2.log)"
after=$(bash "$nodes_tool" stats --dir "$dir")
timeout 120 "$bin" train "${common[@]}" --set train.accum=2 --set run.out_dir=one >one.log 2>&1 \
  || fail "one rank: $(tail -3 one.log)"
# Bound: the dp sum adds the two ranks' gradients in another order than one rank's
# accumulation, and the all-reduce its own; in fp32 that is rounding only, which over 20 AdamW
# steps stays near 1e-6 relative on the loss; 1e-5 is the bound the dp tests use.
pycheck dp2/metrics.jsonl one/metrics.jsonl 20 <<'EOF'
import json, sys
dp, one = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
steps = int(sys.argv[3])
if len(dp) != steps or len(one) != steps:
    print(f"FAIL {len(dp)} and {len(one)} steps in metrics.jsonl, expected {steps}"); sys.exit()
worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(dp, one))
bad = [(a["step"], a["loss"], b["loss"]) for a, b in zip(dp, one) if abs(a["loss"] - b["loss"]) > 1e-5 * abs(b["loss"])]
if bad: print(f"FAIL {len(bad)} steps differ from one rank by more than 1e-5 relative, first (step, dp 2, one rank): {bad[0]}")
else: print(f"ok   dp 2 over TCP = one rank within 1e-5 relative on all {steps} losses (worst {worst:.1e}; "
            f"final {dp[-1]['loss']:.4f} vs {one[-1]['loss']:.4f})")
EOF
# The gradients crossed the emulated links: every step all-reduces the 834304-parameter
# gradient (gpt-tiny: 256*128 wte + 64*128 wpe + 4 blocks of 12*128^2 + 13*128, 2*128 final LN)
# in fp32, and any all-reduce of S bytes between 2 ranks sends at least S bytes from each
# (each rank must receive the other's contribution), so each node sends and receives at least
# 20 * 4 * 834304 B = 66.7 MB. At most 1.3 times that: TCP/IP headers and the receiver's ACKs
# (~7%), the wte row set and rows (< 4%), losses and norms and MPI's wire-up (< 1 MB).
pycheck "$before" "$after" <<'EOF'
import sys
parse = lambda text: {l.split()[0]: {k: int(v) for k, v in (w.split("=") for w in l.split()[1:])}
                      for l in text.splitlines()}
b, a = parse(sys.argv[1]), parse(sys.argv[2])
low = 20 * 4 * 834304
for node in ("node0", "node1"):
    for way in ("sent_bytes", "received_bytes"):
        n = a[node][way] - b[node][way]
        if low <= n <= 1.3 * low: print(f"ok   {node} {way.split('_')[0]} {n / 1e6:.1f} MB over its tbf during the "
                                        f"run ({low / 1e6:.1f} .. {1.3 * low / 1e6:.1f} MB)")
        else: print(f"FAIL {node} {way.split('_')[0]} {n / 1e6:.3f} MB during the run, expected "
                    f"{low / 1e6:.1f} .. {1.3 * low / 1e6:.1f} MB")
EOF

# 4. Teardown leaves nothing; stop twice is fine.
bash "$nodes_tool" stop --dir "$dir" >stop.log 2>&1 || fail "stop: $(cat stop.log)"
bash "$nodes_tool" stop --dir "$dir" >>stop.log 2>&1 || fail "a second stop: $(cat stop.log)"
left=$(ip netns list | awk '{print $1}' | grep -E "^tn$instance-" | tr '\n' ' ')
links_after=$(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sort)
files=$(ls -A "$dir" 2>/dev/null | tr '\n' ' ')
if [ -z "$left" ] && [ "$links_before" = "$links_after" ] && [ -z "$files" ]; then
  ok "stop (twice) removed instance tn$instance: no namespace, root links as before, $dir empty"
else
  fail "after stop: namespaces '$left', state files '$files', root links before/after differ: $(diff <(echo "$links_before") <(echo "$links_after") | tr '\n' ' ')"
fi

finish
