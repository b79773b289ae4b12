#!/usr/bin/env bash
# Storage faults during a checkpoint save (Note [Leaving after a storage fault] in
# trident/checkpoint.h): a checkpoint.dir on a small tmpfs.
#   1. 3 MiB: the first save does not fit: exit 2 before HDF5 writes anything, a message with
#      the sizes, nothing left behind.
#   2. 16 MiB: the step-2 checkpoint fits, the step-4 one does not: exit 2, `latest` still names
#      step 2, which verifies and resumes; no step_*.tmp left.
#   3. As 2 with the space check skipped (TRIDENT_FAULT_SKIP_SPACE_CHECK), so the disk fills
#      inside HDF5's writes, on one rank and on two: exit 2, not a crash (HDF5 1.10 may
#      segfault in MPI_Finalize here, status 139), the message names the shard file
#      and the cause, `latest` is intact and the unfinished directory is gone.
#   4. A stale step_*.tmp of an interrupted save is removed by the next save.
#   5. No permission (EACCES, run as nobody): a run saves step 2 and stops; the directory is made
#      read-only for its owner; the resumed run's step-4 save is refused: exit 2, one message
#      naming the directory it could not create and the cause, `latest` still step 2 (skipped
#      where nobody cannot start an MPI program at all, e.g. a chroot).
#   6. A read-only file system (the tmpfs remounted ro): refused up front (the lock file), exit 2
#      with the path and the cause, `latest` unchanged and still loadable.
#   7. checkpoint.dir removed while a run is going: the next save recreates it; exit 0 and the
#      final `latest` verifies.
#   8. A rank dies mid-save (TRIDENT_FAULT_DIE_IN_SAVE=1:4: rank 1 SIGKILLs itself after writing
#      its step-4 shard; 2 ranks): the job ends within 60 s, non-zero; `latest` still names step 2 and verifies; the
#      resumed run removes the unfinished step_00000004.tmp and finishes.
# Needs root (mount); skips (77) where tmpfs cannot be mounted.
# usage: test_storage_faults.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
source "$(dirname "$0")/lib.sh" "$@"

mnt=$scratch/mnt
mkdir -p "$mnt"
mount_tmpfs() {  # SIZE
  mountpoint -q "$mnt" && umount "$mnt"
  mount -t tmpfs -o "size=$1" tmpfs "$mnt" 2>/dev/null || { echo "SKIP: cannot mount a tmpfs (not root?)"; exit 77; }
}
trap 'mountpoint -q "$mnt" && umount "$mnt"' EXIT
common=("$src/inputs/gpt-tiny.yaml" --set run.threads=1 --set train.steps=4 --set checkpoint.every=2
        --set checkpoint.dir="$mnt/ck" --set train.val_every=0 --set log.every=100)
no_tmp() { ! ls -d "$mnt"/ck/step_*.tmp >/dev/null 2>&1; }

# 1. The first save does not fit.
mount_tmpfs 3m
timeout 300 "$bin" train "${common[@]}" --set run.out_dir=r1 >r1.log 2>&1; rc=$?
[ $rc -eq 2 ] || fail "3 MiB: exit $rc, expected 2: $(grep error r1.log)"
grep -qE "checkpoint save to .*step_00000002: needs about [0-9.]+ MiB but .* has [0-9.]+ MiB free" r1.log \
  && ok "3 MiB: $(grep -o 'needs about.*free' r1.log)" || fail "3 MiB: message: $(grep error r1.log)"
no_tmp || fail "3 MiB: a step_*.tmp was left behind"
[ ! -e "$mnt/ck/latest" ] || fail "3 MiB: latest exists"

# 2. The second save does not fit; the first stays.
mount_tmpfs 16m
timeout 300 "$bin" train "${common[@]}" --set run.out_dir=r2 >r2.log 2>&1; rc=$?
[ $rc -eq 2 ] || fail "16 MiB: exit $rc, expected 2: $(grep error r2.log)"
[ "$(readlink "$mnt/ck/latest")" = step_00000002 ] && ok "16 MiB: latest still step 2" || fail "16 MiB: latest -> $(readlink "$mnt/ck/latest")"
no_tmp || fail "16 MiB: a step_*.tmp was left behind"
"$bin" ckpt verify "$mnt/ck/latest" >v2.log 2>&1 || fail "16 MiB: latest does not verify: $(tail -2 v2.log)"
umount "$mnt"; mount_tmpfs 64m  # room again (the tmpfs starts empty: save step 2 once more)
timeout 300 "$bin" train "${common[@]}" --set train.stop_at=2 --set run.out_dir=r2b >r2b.log 2>&1 || fail "64 MiB save: $(tail -2 r2b.log)"
timeout 300 "$bin" train "${common[@]}" --set checkpoint.resume=true --set run.out_dir=r2b >r2c.log 2>&1 \
  && grep -q "^resumed from .*step_00000002" r2c.log && ok "64 MiB: saved at 2, resumed, finished" || fail "64 MiB resume: $(tail -2 r2c.log)"

# 3. The disk fills inside HDF5's writes (one rank, then two).
for ranks in 1 2; do
  mount_tmpfs 16m
  launcher=(); [ "$ranks" -gt 1 ] && launcher=(mpirun -x TRIDENT_FAULT_SKIP_SPACE_CHECK -n "$ranks")
  TRIDENT_FAULT_SKIP_SPACE_CHECK=1 timeout 300 "${launcher[@]}" "$bin" train "${common[@]}" --set run.out_dir=r3_$ranks >r3_$ranks.log 2>&1; rc=$?
  if [ $rc -ne 2 ]; then fail "$ranks rank(s), disk full in HDF5: exit $rc, expected 2 (not 0, a timeout or a signal): $(grep -iE 'error|signal' r3_$ranks.log | head -2)"
  else ok "$ranks rank(s), disk full in HDF5: exit $rc"; fi
  grep -q "Segmentation fault\|Signal:" r3_$ranks.log && fail "$ranks rank(s): crashed: $(grep -m1 -i signal r3_$ranks.log)"
  # One line (HDF5's POSIX driver message has a newline of its own, replaced by a space).
  grep -qE "trident: error.*shard_r0000[01].h5.*No space left on device" r3_$ranks.log \
    || fail "$ranks rank(s): the message does not name the shard and the cause on one line: $(grep -m1 error r3_$ranks.log | cut -c1-200)"
  [ "$(readlink "$mnt/ck/latest")" = step_00000002 ] || fail "$ranks rank(s): latest -> $(readlink "$mnt/ck/latest")"
  no_tmp || fail "$ranks rank(s): a step_*.tmp was left behind"
  "$bin" ckpt verify "$mnt/ck/latest" >v3.log 2>&1 || fail "$ranks rank(s): latest does not verify: $(tail -2 v3.log)"
done

# 4. A stale step_*.tmp (an interrupted save) goes with the next save.
mount_tmpfs 64m
mkdir -p "$mnt/ck/step_00000099.tmp" && echo junk >"$mnt/ck/step_00000099.tmp/shard_r00000.h5"
timeout 300 "$bin" train "${common[@]}" --set train.stop_at=2 --set run.out_dir=r4 >r4.log 2>&1 || fail "stale tmp run: $(tail -2 r4.log)"
no_tmp && ok "a stale step_00000099.tmp was removed by the next save" || fail "stale step_00000099.tmp still there"

# 5. No permission. Open MPI's singleton start needs a writable session directory: TMPDIR.
if command -v setpriv >/dev/null; then
  mount_tmpfs 64m
  chmod 777 "$mnt" && mkdir -p "$mnt/ck" "$mnt/tmp" && chown nobody "$mnt/ck" && chmod 1777 "$mnt/tmp"
  as_nobody=(env TMPDIR="$mnt/tmp" setpriv --reuid=nobody --regid=nogroup --clear-groups)
  timeout 300 "${as_nobody[@]}" "$bin" train "${common[@]}" --set train.stop_at=2 --set run.out_dir="$mnt/r5" >r5.log 2>&1
  first_rc=$?
fi
# Where nobody cannot start an MPI program at all (a chroot without a session directory it may
# use, a binary under a directory it cannot enter), the case cannot be made here: skip it.
if ! command -v setpriv >/dev/null; then
  echo "skip EACCES: no setpriv"
elif [ "$first_rc" -ne 0 ] && grep -q "MPI_Init\|Permission denied" r5.log && ! grep -q "^step" r5.log; then
  echo "skip EACCES: trident cannot start as nobody on this machine: $(grep -m1 -i 'MPI_Init\|denied' r5.log)"
else
  [ "$first_rc" -eq 0 ] || fail "EACCES: the first run (as nobody) failed: $(tail -2 r5.log)"
  chmod 555 "$mnt/ck"
  timeout 300 "${as_nobody[@]}" "$bin" train "${common[@]}" --set checkpoint.resume=true --set run.out_dir="$mnt/r5" >r5b.log 2>&1; rc=$?
  chmod 755 "$mnt/ck"
  [ $rc -eq 2 ] || fail "EACCES: exit $rc, expected 2: $(grep error r5b.log)"
  grep -qE "^trident: error.*checkpoint save to .*step_00000004: .*step_00000004.tmp: Permission denied" r5b.log \
    && ok "EACCES: $(grep -m1 'trident: error' r5b.log)" || fail "EACCES: message: $(grep error r5b.log)"
  [ "$(grep -c 'trident: error' r5b.log)" -eq 1 ] || fail "EACCES: not exactly one error line"
  [ "$(readlink "$mnt/ck/latest")" = step_00000002 ] || fail "EACCES: latest -> $(readlink "$mnt/ck/latest")"
  no_tmp || fail "EACCES: a step_*.tmp was left behind"
fi

# 6. A read-only file system.
mount_tmpfs 64m
timeout 300 "$bin" train "${common[@]}" --set train.stop_at=2 --set run.out_dir=r6 >r6.log 2>&1 || fail "read-only: the first run failed: $(tail -2 r6.log)"
mount -o remount,ro "$mnt"
timeout 300 "$bin" train "${common[@]}" --set checkpoint.resume=true --set run.out_dir=r6 >r6b.log 2>&1; rc=$?
[ $rc -eq 2 ] || fail "read-only: exit $rc, expected 2: $(grep error r6b.log)"
grep -qE "^trident: error.*ck/\.lock: Read-only file system" r6b.log \
  && ok "read-only: $(grep -m1 'trident: error' r6b.log)" || fail "read-only: message: $(grep error r6b.log)"
[ "$(readlink "$mnt/ck/latest")" = step_00000002 ] || fail "read-only: latest -> $(readlink "$mnt/ck/latest")"
"$bin" ckpt verify "$mnt/ck/latest" >v6.log 2>&1 || fail "read-only: latest does not verify: $(tail -2 v6.log)"

# 7. The checkpoint directory vanishes while the run goes on.
mount_tmpfs 64m
timeout 300 "$bin" train "${common[@]}" --set train.steps=300 --set checkpoint.every=10 --set run.out_dir=r7 >r7.log 2>&1 &
job=$!
for _ in $(seq 1 600); do [ -e "$mnt/ck/latest" ] && break; sleep 0.05; done
rm -rf "$mnt/ck"
wait $job; rc=$?
[ $rc -eq 0 ] || fail "vanished: exit $rc, expected 0: $(grep error r7.log)"
[ "$(readlink "$mnt/ck/latest")" = step_00000300 ] && "$bin" ckpt verify "$mnt/ck/latest" >v7.log 2>&1 \
  && ok "vanished: the directory was recreated; latest -> step_00000300 verifies" \
  || fail "vanished: latest -> $(readlink "$mnt/ck/latest" 2>&1): $(tail -2 v7.log 2>/dev/null)"

# 8. A rank dies in the middle of a save.
mount_tmpfs 64m
start=$(date +%s)
timeout 120 mpirun -n 2 -x TRIDENT_FAULT_DIE_IN_SAVE=1:4 "$bin" train "${common[@]}" --set run.out_dir=r8 >r8.log 2>&1; rc=$?
elapsed=$(( $(date +%s) - start ))
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $elapsed -gt 60 ]; then fail "rank dies mid-save: exit $rc after ${elapsed} s"
else ok "rank dies mid-save: exit $rc after ${elapsed} s"; fi
[ "$(readlink "$mnt/ck/latest")" = step_00000002 ] && "$bin" ckpt verify "$mnt/ck/latest" >v8.log 2>&1 \
  || fail "rank dies mid-save: latest -> $(readlink "$mnt/ck/latest"): $(tail -2 v8.log)"
timeout 120 mpirun -n 2 "$bin" train "${common[@]}" --set checkpoint.resume=true --set run.out_dir=r8 >r8b.log 2>&1 \
  && grep -q "^resumed from .*step_00000002" r8b.log && [ "$(readlink "$mnt/ck/latest")" = step_00000004 ] && no_tmp \
  && ok "rank dies mid-save: resumed from step 2, saved step 4, no step_*.tmp left" \
  || fail "rank dies mid-save: the resume: $(grep -m1 error r8b.log) latest -> $(readlink "$mnt/ck/latest"); $(ls "$mnt/ck")"

finish
