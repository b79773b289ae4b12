#!/usr/bin/env bash
# Where `trident plan --calibrate` writes (Note [User hardware files] in src/plan/hardware.cpp):
# with HOME pointed at a scratch directory, a calibration lands in
# ~/.local/share/trident/hardware/this-machine.yaml, touches no file of the source tree (the
# shipped inputs/hardware/this-machine.yaml keeps its bytes; `git status` is unchanged), and
# `plan --hardware this-machine` then reads it and says that it shadows the shipped one. With
# another HOME the shipped file is read again; with neither HOME nor TRIDENT_HARDWARE_DIR,
# calibrate asks for --out (exit 2) before measuring. About 15 s on 2 cores.
# usage: test_hardware_location.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
source "$(dirname "$0")/lib.sh" "$@"
unset TRIDENT_HARDWARE_DIR XDG_DATA_HOME

shipped=$src/inputs/hardware/this-machine.yaml
shipped_sum=$(sha256sum <"$shipped")
is_git=""
git -C "$src" rev-parse --git-dir >/dev/null 2>&1 && is_git=yes
status_before=$([ -n "$is_git" ] && git -C "$src" status --porcelain)

home=$scratch/home
user_file=$home/.local/share/trident/hardware/this-machine.yaml
echo "test_hardware_location: calibrating with HOME=$home ..."
log=$(HOME=$home mpirun -n 1 "$bin" plan --calibrate 2>&1); rc=$?
echo "$log" | tail -4
[ $rc -eq 0 ] && ok "calibrate exits 0" || fail "calibrate exit status $rc: $(tail -3 <<<"$log")"
[ -s "$user_file" ] && ok "wrote $user_file" || fail "no file at $user_file"
grep -qF "calibrate: wrote $user_file" <<<"$log" && ok "prints the path it wrote" \
  || fail "no 'wrote $user_file' line"
grep -qF "shadows the shipped" <<<"$log" && ok "says it shadows the shipped this-machine" \
  || fail "no word of the shipped file it shadows"
[ "$(sha256sum <"$shipped")" = "$shipped_sum" ] && ok "the shipped this-machine.yaml is unchanged" \
  || fail "calibrate rewrote $shipped"
if [ -n "$is_git" ]; then
  status_after=$(git -C "$src" status --porcelain)
  [ "$status_after" = "$status_before" ] && ok "git status of the source tree is unchanged" \
    || fail "the source tree changed: $(diff <(echo "$status_before") <(echo "$status_after"))"
fi

# plan finds it by name, says which file it read, and its figures are the calibration's.
tiny=$src/inputs/gpt-tiny.yaml
out=$(HOME=$home "$bin" plan "$tiny" --hardware this-machine --layout dp=1 2>&1); rc=$?
echo "$out" | head -3
[ $rc -eq 0 ] && grep -qF "hardware file $user_file" <<<"$out" \
  && ok "plan --hardware this-machine reads the calibration" || fail "plan: exit $rc: $out"
grep -qF "reads $user_file, which shadows the shipped" <<<"$out" && ok "plan says it shadows the shipped one" \
  || fail "plan does not say it shadows the shipped file"
json=$(HOME=$home "$bin" plan "$tiny" --hardware this-machine --layout dp=1 --json 2>/dev/null)
"$py" -c 'import json, sys; r = json.loads(sys.argv[1]); assert r["hardware_file"] == sys.argv[2], r["hardware_file"]' \
  "$json" "$user_file" && ok "--json names the file as hardware_file" || fail "--json: $json"

# Another user (HOME without a calibration) gets the shipped reference, and no shadow line.
out=$(HOME=$scratch/other "$bin" plan "$tiny" --hardware this-machine --layout dp=1 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "hardware file .*inputs/hardware/this-machine.yaml" <<<"$out" \
  && ! grep -q "shadows" <<<"$out" && ok "without a calibration the shipped file is read" \
  || fail "another HOME: exit $rc: $(head -3 <<<"$out")"

# Nowhere to write: exit 2 naming --out, at once (before any measurement).
start=$SECONDS
err=$(env -u HOME mpirun -n 1 "$bin" plan --calibrate 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] && grep -q -- "--out" <<<"$err" && [ $((SECONDS - start)) -lt 10 ] \
  && ok "no HOME, no TRIDENT_HARDWARE_DIR: exit 2 asking for --out" \
  || fail "no HOME: exit $rc after $((SECONDS - start)) s: $err"

finish
