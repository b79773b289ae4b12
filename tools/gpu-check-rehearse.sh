#!/usr/bin/env bash
# Rehearses the device call of tools/gpu-check.sh on a machine without a GPU: in a bare Debian 12
# root (the fresh-machine tool's rootfs: no MPI, HDF5 or yaml-cpp; with --like-target, the
# default, g++, cmake, python3 and the host's CUDA toolkit, as the GPU machine's image has), over
# a copy of the working tree as the device tool carries it (tracked and untracked-not-ignored
# files, and the .gpu-bundle it is told to carry), with no NVIDIA driver and either a fake
# nvidia-smi (an H100 PCIe) or none, and with phases made to hang
# (TRIDENT_GPU_CHECK_REHEARSE_HANG, Note [GPU check phases]). Passes when the call ends within
# its limit and $OUT holds table.md with a verdict, gpu-check.log and logs.tar.gz; prints the
# wall time and the table, and leaves $OUT in runs/gpu-check-rehearsal/.
# Usage (as root, after tools/gpu-bundle.sh):
#   bash tools/gpu-check-rehearse.sh [--base] [--no-nvidia-smi] [--hang PHASES] [--limit S]
#     --base           the base rootfs (no python3, compiler or CUDA) instead of like-target
#     --no-nvidia-smi  no nvidia-smi at all (default: the fake from tests/cli/gpu_check_fakes)
#     --hang PHASES    TRIDENT_GPU_CHECK_REHEARSE_HANG (default: smoke)
#     --limit S        the call's time limit, the device tool's timeout_s (default 560)
#   FRESH_TOOLS: the fresh-machine tool (default ../shared/tools/fresh-machine beside the repo).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
variant=like-target nvidia_smi=fake hang=smoke limit=560
while [ $# -gt 0 ]; do
  case $1 in
    --base) variant=base ;;
    --no-nvidia-smi) nvidia_smi=none ;;
    --hang) hang=$2; shift ;;
    --limit) limit=$2; shift ;;
    *) echo "gpu-check-rehearse: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
fresh=${FRESH_TOOLS:-$repo/../shared/tools/fresh-machine}
[ -f "$fresh/lib.sh" ] || { echo "gpu-check-rehearse: no fresh-machine tool at $fresh (set FRESH_TOOLS)" >&2; exit 2; }
. "$fresh/lib.sh"
[ "$(id -u)" = 0 ] || { echo "gpu-check-rehearse: must run as root (chroot, mounts)" >&2; exit 2; }
tarball=$(fresh_tarball "$variant")
[ -f "$tarball" ] || { echo "gpu-check-rehearse: $tarball missing: run $fresh/make-rootfs.sh$([ $variant = like-target ] && echo ' --like-target')" >&2; exit 2; }
[ -f .gpu-bundle/bundle.tar.xz ] || { echo "gpu-check-rehearse: no .gpu-bundle/bundle.tar.xz: run tools/gpu-bundle.sh first" >&2; exit 2; }
like_target=0; [ $variant = like-target ] && like_target=1

work=$(mktemp -d "$FRESH_BASE/gpu-check-rehearse.XXXX")
R=$work/root
results=$repo/runs/gpu-check-rehearsal
inner_pid=""
cleanup() {
  [ -n "$inner_pid" ] && kill -TERM "$inner_pid" 2>/dev/null
  fresh_kill_pids_of "" "$R"  # whatever the call left running in the root (started here)
  fresh_remove_tree "$work" || true
}
trap cleanup EXIT

# The tree as the device tool sends it, plus the carried bundle.
tree=$work/tree.tar
git ls-files -co --exclude-standard -z | tar --null -T - -cf "$tree"
tar -rf "$tree" .gpu-bundle
echo "rehearsal: $variant root, nvidia-smi $nvidia_smi, hang '$hang', limit $limit s; tree $(du -h "$tree" | cut -f1)"

rm -rf "$results" && mkdir -p "$results"
rc=0
unshare --mount --propagation private bash -s "$fresh/lib.sh" "$R" "$like_target" "$tree" \
  "$nvidia_smi" "$hang" "$limit" "$repo/tests/cli/gpu_check_fakes/nvidia-smi" "$results" <<'INNER' &
set -euo pipefail
. "$1"; R=$2 like_target=$3 tree=$4 nvidia_smi=$5 hang=$6 limit=$7 fake_smi=$8 results=$9
mkdir -p "$R"
mount -t tmpfs -o size=8g,mode=0755 rehearse-root "$R"
tar --numeric-owner -xpf "$(fresh_tarball "$([ "$like_target" = 1 ] && echo like-target || echo base)")" -C "$R"
mkdir -p "$R/root/project" "$R/root/out"
tar -xf "$tree" -C "$R/root/project"
[ "$nvidia_smi" = fake ] && install -m 755 "$fake_smi" "$R/usr/local/bin/nvidia-smi"
fresh_mount_chroot "$R" "$like_target"
path=$FRESH_STD_PATH; [ "$like_target" = 1 ] && path="$path:/usr/local/cuda/bin"
set +e
# The device call: one command under the tool's limit; $OUT is all that comes back.
t=$(fresh_now)
timeout -k 10 "$limit" chroot "$R" /usr/bin/env -i HOME=/root PATH="$path" OUT=/root/out \
  TRIDENT_GPU_CHECK_REHEARSE_HANG="$hang" /bin/bash -c 'cd /root/project && bash tools/gpu-check.sh' \
  </dev/null >"$results/call-output.txt" 2>&1
echo "$? $(fresh_elapsed "$t")" > "$results/call-rc-wall.txt"
cp -r "$R/root/out/." "$results/"
INNER
inner_pid=$!
wait "$inner_pid" || rc=$?
inner_pid=""
[ "$rc" -eq 0 ] || { echo "gpu-check-rehearse: the root could not be set up (exit $rc)" >&2; exit 1; }
read -r call_rc wall < "$results/call-rc-wall.txt"
echo "rehearsal: the call exited $call_rc after $wall s (limit $limit s); \$OUT: $(ls "$results" | tr '\n' ' ')"
echo "--- its last lines"; tail -n 25 "$results/call-output.txt"
verdict=$(grep -E "^gpu-check: (PASS|FAIL|INCOMPLETE)" "$results/table.md" 2>/dev/null | head -1)
ok=1
[ "$call_rc" != 124 ] && [ "$call_rc" != 137 ] || { echo "rehearsal: FAIL: the call ran into its limit"; ok=0; }
[ -n "$verdict" ] || { echo "rehearsal: FAIL: no verdict in table.md"; ok=0; }
for f in table.md gpu-check.log logs.tar.gz; do
  [ -s "$results/$f" ] || { echo "rehearsal: FAIL: \$OUT lacks $f"; ok=0; }
done
[ "$ok" = 1 ] && echo "rehearsal: ok: a table and the verdict \"$verdict\" in $wall s of $limit"
[ "$ok" = 1 ]
