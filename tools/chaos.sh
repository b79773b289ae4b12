#!/usr/bin/env bash
# Chaos test (issue 17): many short trainings of the tiny deck on 2-4 ranks, each with one fault,
# then the checkpoint it left must verify and resume. Fault kinds (--kinds, comma-separated):
#   kill      SIGKILL of one random rank after a random step (a node lost): mpirun ends the job
#             non-zero naming that rank and signal 9;
#   stop      SIGSTOP of one random rank (a node that stops answering): a surviving rank's
#             collective times out after comm.timeout_s, exit 1 with "trident: error" naming the
#             communicator (test_rank_failure.sh);
#   term      SIGTERM, or
#   usr1      SIGUSR1 (Slurm's warning) to one random rank or to all of them: every rank saves at
#             the next step boundary and exits 0 (Note [Stop signals]); run_state.json says so;
#   nan       TRIDENT_FAULT_NAN_STEPS on a random step: train.nonfinite stop ends with exit 1
#             and a message naming the step; skip drops 1-2 steps and exits 0;
#   diskfull  checkpoint.dir on a tmpfs that holds the first checkpoint(s) but not the next one,
#             with or without the up-front space check (TRIDENT_FAULT_SKIP_SPACE_CHECK: the disk
#             fills inside HDF5): exit 2 (space check) or non-zero (HDF5), a message naming the
#             shard or the sizes, no step_*.tmp left, `latest` unchanged; the resume runs after
#             the tmpfs is grown (the user freed space). Needs mount (root); without it these
#             runs are reported as skipped;
#   asynckill SIGKILL of one random rank while a background write is in progress
#             (checkpoint.async; each write first waits 300-1500 ms, TRIDENT_FAULT_SAVE_DELAY_MS,
#             so the kill lands inside one): mpirun ends the job non-zero naming that rank, and
#             the checkpoint before the one being written is `latest`, verifies and resumes;
#   corrupt   a finished run's newest checkpoint gets a flipped byte, a truncated or a missing
#             shard before a resume: the resume refuses with exit 2 naming the file and the
#             previous checkpoint (Note [A damaged latest]); the recovery the message gives,
#             pointing `latest` at that one (keep 2), must verify and resume.
# After every run: no process of it is left; if `latest` exists it verifies (`trident ckpt
# verify`), and if the log reported a checkpoint, `latest` exists; a resume of 2 steps from it
# exits 0 and continues the step count (from step 0 if the fault came before any checkpoint).
# Every run must end within comm.timeout_s + 60 s of its fault, or it is killed and counted as a
# hang; a crash is any signal or crash report other than the SIGKILL we sent.
#
# Reproducible: run I draws its choices from (seed, I) alone, so `--seed S --only I` replays it
# (the fault's moment within a step still depends on timing).
#
# usage: tools/chaos.sh --faults N --seed S --binary PATH --scratch DIR
#                       [--ranks 2..4] [--kinds kill,stop,...] [--each-kind] [--only I]
#                       [--timeout-s T] [--dry-run]
#   --each-kind: run I has kind I mod (number of kinds), so every kind comes up (CI);
#   --dry-run: print each run's choice, run nothing.
# Exits 1 if any run hung, crashed, left an unloadable `latest`, exited with an unexpected status
# or printed the wrong message; 2 for bad arguments.
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
all_kinds=kill,stop,term,usr1,nan,diskfull,corrupt,asynckill
faults=10 seed=1 bin= scratch= ranks_arg=2..4 kinds_arg=$all_kinds only=0 timeout_s=5 each_kind=0
dry_run=0

usage() { sed -n '/^# usage:/,/^# Exits/p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --faults) faults=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --binary) bin=$(realpath "$2"); shift 2 ;;
    --scratch) scratch=$2; shift 2 ;;
    --ranks) ranks_arg=$2; shift 2 ;;
    --kinds) kinds_arg=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --timeout-s) timeout_s=$2; shift 2 ;;
    --each-kind) each_kind=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    *) usage ;;
  esac
done
[ -x "$bin" ] && [ -n "$scratch" ] || usage
[[ $ranks_arg =~ ^([2-9])(\.\.([2-9]))?$ ]] || usage
ranks_lo=${BASH_REMATCH[1]} ranks_hi=${BASH_REMATCH[3]:-${BASH_REMATCH[1]}}
IFS=, read -ra kinds <<<"$kinds_arg"
for k in "${kinds[@]}"; do [[ ,$all_kinds, == *,$k,* ]] || { echo "unknown fault kind: $k"; usage; }; done

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mpi_yield_when_idle=1
mkdir -p "$scratch" && scratch=$(realpath "$scratch")
limit_s=$((timeout_s + 60))  # the issue's bound on any run's time to exit after its fault

# --- Small tools -------------------------------------------------------------------------------
# draw LO HI: a number in [LO, HI] into $r, from bash's RANDOM (seeded per run, so never in a
# subshell: $(...) would draw from a copy and leave the sequence unchanged).
draw() { r=$(($1 + RANDOM % ($2 - $1 + 1))); }
now_ms() { echo $(( ${EPOCHREALTIME/./} / 1000 )); }
seconds_since() { awk -v a="$1" -v b="$(now_ms)" 'BEGIN { printf "%.1f", (b - a) / 1000 }'; }

# This run's rank processes: the pattern ends at this run's run.out_dir (always the last
# argument), so no other run's or session's ranks match.
rank_pids() {  # [RANK]: all of this run's ranks, or the one with that world rank
  local p
  for p in $(pgrep -f "$bin train .*run\.out_dir=$out\$"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=${1:-[0-9]*}" && echo "$p"
  done
}

# launch LOG RANKS [VAR=VALUE...] -- TRAIN_ARGS: mpirun in the background; job = its pid.
launch() {
  local log=$1 n=$2; shift 2
  local envs=() exports=()
  while [ "$1" != -- ]; do envs+=("$1"); exports+=(-x "${1%%=*}"); shift; done
  shift
  env "${envs[@]}" mpirun "${exports[@]}" -n "$n" "$bin" train "$src/inputs/gpt-tiny.yaml" \
    "${deck[@]}" "$@" --set run.out_dir="$out" >"$log" 2>&1 &
  job=$!
  t_start=$(now_ms) t_fault=$t_start
}

# finish_job: waits for the job until t_fault + limit_s; sets rc, exit_s (time from the fault
# to the exit) and hung. A hung job is killed, its ranks too (SIGCONT first: a stopped process
# cannot die of SIGTERM's default). Then no rank of this run may be left (leftover).
finish_job() {
  hung=0 leftover=0
  while kill -0 "$job" 2>/dev/null; do
    if [ $(( $(now_ms) - t_fault )) -gt $((limit_s * 1000)) ]; then
      hung=1
      for p in $(rank_pids); do kill -KILL "$p"; done 2>/dev/null
      sleep 2; kill -KILL "$job" 2>/dev/null
      break
    fi
    sleep 0.1
  done
  wait "$job"; rc=$?
  exit_s=$(seconds_since "$t_fault")
  local p left
  for _ in $(seq 1 50); do left=$(rank_pids); [ -z "$left" ] && break; sleep 0.1; done
  if [ -n "$left" ]; then
    leftover=1
    for p in $left; do kill -KILL "$p"; done 2>/dev/null
  fi
}

# wait_step LOG K: until the job logged step K (log.every 1); false if it ended first.
wait_step() {
  while kill -0 "$job" 2>/dev/null; do
    grep -qsE "^step +$2/" "$1" && return 0
    sleep 0.05
  done
  return 1
}

# Crash reports in LOG, other than mpirun's report of the SIGKILL we sent ($killed_rank).
crash_lines() {
  grep -E "Segmentation fault|core dumped|AddressSanitizer|runtime error:|SIGSEGV|SIGABRT|SIGBUS|terminate called|Signal: |exited on signal|Aborted" "$1" \
    | grep -vE "rank ${killed_rank:-x} with PID [0-9]+ on node .* exited on signal 9 \(Killed\)"
}

latest_step() {  # of $ck/latest, or 0 without one
  local t; t=$(readlink "$ck/latest" 2>/dev/null) || { echo 0; return; }
  echo $((10#${t#step_}))
}

# --- tmpfs for diskfull --------------------------------------------------------------------------
mnt=$scratch/tmpfs
can_mount=0
if mkdir -p "$mnt" && mount -t tmpfs -o size=1m tmpfs "$mnt" 2>/dev/null; then
  can_mount=1 && umount "$mnt"
fi
trap 'mountpoint -q "$mnt" && umount "$mnt"; [ -n "${job:-}" ] && kill "$job" 2>/dev/null' EXIT

# --- One run -------------------------------------------------------------------------------------
# Sets kind, what (the choice), verdict (ok; hang, crash or unloadable, which count on their
# own; failed for any other problem; skipped; planned), problems (one line each), fault_rc and
# worst (the run's slowest time to exit, in s).
declare -A count bad_count slowest
hangs=0 crashes=0 unloadable=0 failed_runs=0 skipped=0 total_slowest=0

one_run() {  # I
  local i=$1
  # Scrambled: bash's RANDOM is a linear generator, and seeds one apart drew the same small
  # numbers (every SIGKILL went to rank 0).
  RANDOM=$(printf 'chaos %s %s' "$seed" "$i" | cksum | cut -d' ' -f1)
  draw 0 $((${#kinds[@]} - 1)); kind=${kinds[$r]}
  [ $each_kind = 1 ] && kind=${kinds[$(( (i - 1) % ${#kinds[@]} ))]}
  draw "$ranks_lo" "$ranks_hi"; ranks=$r
  draw 3 4; every=$r
  # The layout: plain dp, ZeRO 1 or 2, or (on an even number of ranks) tp 2 or pp 2, so that
  # the shards, the collectives and the pipeline's sends all meet the faults.
  local layouts=(dp zero1 zero2); [ $((ranks % 2)) = 0 ] && layouts+=(tp2 pp2)
  draw 0 $((${#layouts[@]} - 1)); layout=${layouts[$r]}
  steps=16
  dir=$scratch/run_$(printf %03d "$i") out=$dir/out ck=$dir/ck
  rm -rf "$dir" && mkdir -p "$dir"
  deck=(--set run.threads=1 --set data.valid= --set log.every=1 --set train.steps=$steps
        --set checkpoint.every=$every --set checkpoint.resume=auto --set comm.timeout_s=$timeout_s)
  case $layout in
    zero1|zero2) deck+=(--set parallel.zero=${layout#zero}) ;;
    tp2|pp2) deck+=(--set parallel.${layout%2}=2) ;;
  esac
  killed_rank= verdict=ok problems=() worst=0 harmless=0 rc= exit_s=0
  local log=$dir/fault.log expect_rc= expect_msg= env=() target signal step delay
  case $kind in
    kill|stop|term|usr1)
      draw 1 $((steps - 3)); step=$r
      draw 0 99; delay=$r          # then 0-0.2 s (a step of 2-4 ranks takes about 0.2 s)
      draw 0 $((ranks - 1)); target=$r
      signal=KILL; [ "$kind" = stop ] && signal=STOP
      [ "$kind" = term ] && signal=TERM; [ "$kind" = usr1 ] && signal=USR1
      if [[ $kind == term || $kind == usr1 ]]; then
        draw 0 1; [ "$r" = 1 ] && target=all
      fi
      what="SIG$signal to rank $target $((delay * 2)) ms after step $step"
      ;;
    nan)
      draw 1 $((steps - 2)); step=$r
      draw 0 1; local policy=stop; [ "$r" = 1 ] && policy=skip
      local nan_steps=$step
      if [ $policy = skip ]; then draw 0 1; [ "$r" = 1 ] && nan_steps=$step,$((step + 1)); fi
      env=(TRIDENT_FAULT_NAN_STEPS=$nan_steps)
      deck+=(--set train.nonfinite=$policy)
      what="NaN on step(s) $nan_steps, nonfinite $policy"
      ;;
    diskfull)
      draw 0 1; local skip_check=$r
      draw 1 2; local fits=$r     # checkpoints that fit before the one that does not
      what="tmpfs for $fits checkpoint(s), space check $([ "$skip_check" = 1 ] && echo skipped || echo on)"
      ;;
    asynckill)
      draw 300 1500; delay=$r
      draw 0 $((ranks - 1)); target=$r
      what="SIGKILL to rank $target inside a background write (checkpoint.async, each write waits $delay ms)"
      ;;
    corrupt)
      draw 0 2; local damage=(flip truncate remove); damage=${damage[$r]}
      draw 0 999; local pick=$r     # which of the shards that hold data (some hold none)
      draw 0 999; local where=$r    # flip: the byte at where/1000 of the file
      what="$damage shard #$pick of latest$([ "$damage" = flip ] && echo " at $where/1000")"
      ;;
  esac
  what="$ranks ranks $layout, every $every: $what"
  if [ $dry_run = 1 ]; then verdict=planned; rm -rf "$dir"; return; fi

  case $kind in
    kill|stop|term|usr1)
      launch "$log" "$ranks" -- --set checkpoint.dir="$ck"
      if wait_step "$log" "$step"; then
        sleep "$(awk -v d="$delay" 'BEGIN { print d / 500 }')"
        local pids
        if [ "$target" = all ]; then pids=$(rank_pids); else pids=$(rank_pids "$target"); fi
        [ "$target" != all ] && [ "$kind" = kill ] && killed_rank=$target
        if [ -n "$pids" ]; then
          t_fault=$(now_ms)
          kill -"$signal" $pids 2>/dev/null
        else
          problems+=("the rank(s) to signal were gone")
        fi
      else
        problems+=("the run ended before step $step")
      fi
      finish_job
      case $kind in
        kill) [ $rc -ne 0 ] || problems+=("exit 0 after SIGKILL of a rank")
              grep -qE "rank $target with PID [0-9]+ .* exited on signal 9" "$log" \
                || problems+=("mpirun did not report rank $target's SIGKILL") ;;
        stop) expect_rc=1 expect_msg="trident: error \(rank [0-9]+\): .*communicator '[^']+'.*comm.timeout_s"
              # Which collective noticed: a step's ('dp', 'tp', 'pp', ...) or a save's.
              what+=" -> $(grep -m1 -oE "^trident: error .*communicator '[^']+'" "$log" | grep -oE "(checkpoint: )|communicator '[^']+'" | tr -d '\n')" ;;
        *) expect_rc=0
           grep -qE "^(stopped by signal|done): " "$log" || problems+=("no 'stopped by signal' line")
           grep -q "trident: error" "$log" && problems+=("an error message: $(grep -m1 'trident: error' "$log")")
           local state_step; state_step=$(/usr/bin/python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["step"])' "$out/run_state.json" 2>/dev/null)
           [ "$state_step" = "$(latest_step)" ] || problems+=("run_state.json step '${state_step}', latest $(latest_step)") ;;
      esac
      ;;
    nan)
      launch "$log" "$ranks" "${env[@]}" -- --set checkpoint.dir="$ck"
      finish_job
      if [ "$policy" = stop ]; then
        expect_rc=1 expect_msg="trident: error.*step $step: the loss is [^ ]+ and the gradient norm [^ ]+: training diverged"
      else
        expect_rc=0
        local skipped_steps
        skipped_steps=$(/usr/bin/python3 -c 'import json,sys; print(",".join(str(j["step"]) for j in map(json.loads, open(sys.argv[1])) if j.get("skipped")))' "$out/metrics.jsonl" 2>/dev/null)
        [ "$skipped_steps" = "$nan_steps" ] || problems+=("skipped steps '$skipped_steps' in metrics.jsonl, expected $nan_steps")
      fi
      ;;
    diskfull)
      if [ $can_mount = 0 ]; then verdict=skipped; return; fi
      # One checkpoint of the tiny deck takes 9.9 MiB (params and AdamW's two moments), and
      # the space check asks for more (1 MiB per shard and 4 KiB per block on top: up to 15
      # MiB on 4 ranks with ZeRO 2); with keep 2 the third save still needs room next to two.
      local room=$((6 + ranks)); [ "$skip_check" = 1 ] && room=2  # HDF5 then needs just 9.9
      mount -t tmpfs -o size=$((fits * 10 + room))m tmpfs "$mnt"
      ck=$mnt/ck
      [ "$skip_check" = 1 ] && env=(TRIDENT_FAULT_SKIP_SPACE_CHECK=1)
      launch "$log" "$ranks" "${env[@]}" -- --set checkpoint.dir="$ck"
      finish_job
      if [ "$skip_check" = 1 ]; then
        [ $rc -ne 0 ] || problems+=("exit 0 with a full disk")
        expect_msg="trident: error.*shard_r[0-9]+\.h5.*No space left on device"
      else
        expect_rc=2 expect_msg="trident: error.*checkpoint save to .*step_[0-9]+: needs about .* MiB free"
      fi
      [ "$(latest_step)" = $((fits * every)) ] || problems+=("latest is step $(latest_step), expected $((fits * every))")
      ls -d "$ck"/step_*.tmp >/dev/null 2>&1 && problems+=("a step_*.tmp was left")
      mount -o remount,size=64m "$mnt"   # the user frees space, then resumes
      ;;
    asynckill)
      launch "$log" "$ranks" TRIDENT_FAULT_SAVE_DELAY_MS=$delay -- --set checkpoint.dir="$ck" \
        --set checkpoint.async=true
      local caught=0 written
      while kill -0 "$job" 2>/dev/null; do  # a write in progress after the first one committed
        if [ -L "$ck/latest" ] && ls -d "$ck"/step_*.tmp >/dev/null 2>&1; then caught=1; break; fi
        sleep 0.02
      done
      if [ $caught = 1 ]; then
        written=$(latest_step)
        killed_rank=$target t_fault=$(now_ms)
        kill -KILL $(rank_pids "$target") 2>/dev/null
      else
        problems+=("the run ended before a background write after the first checkpoint")
      fi
      finish_job
      [ $rc -ne 0 ] || problems+=("exit 0 after SIGKILL of a rank")
      grep -qE "rank $target with PID [0-9]+ .* exited on signal 9" "$log" \
        || problems+=("mpirun did not report rank $target's SIGKILL")
      [ $caught = 0 ] || [ "$(latest_step)" = "$written" ] \
        || problems+=("latest moved from step $written to $(latest_step) after the kill")
      ;;
    corrupt)
      launch "$dir/first.log" "$ranks" -- --set checkpoint.dir="$ck" --set train.stop_at=$((2 * every))
      finish_job
      [ $rc -eq 0 ] || problems+=("the run before the damage: exit $rc: $(grep -m1 'error' "$dir/first.log")")
      local shards=() f
      for f in "$ck/latest"/shard_r*.h5; do [ "$(stat -c %s "$f")" -gt 65536 ] && shards+=("$f"); done
      local damaged=${shards[$((pick % ${#shards[@]}))]} shard
      shard=$(basename "$damaged")
      what=${what/shard #$pick/$shard}
      case $damage in
        flip) /usr/bin/python3 -c "import os, sys; f = open(sys.argv[1], 'r+b'); f.seek(os.path.getsize(sys.argv[1]) * int(sys.argv[2]) // 1000); b = f.read(1); f.seek(-1, 1); f.write(bytes([b[0] ^ 0xff]))" "$damaged" "$where" ;;
        truncate) truncate -s 3000 "$damaged" ;;
        remove) rm "$damaged" ;;
      esac
      # A flipped byte HDF5 never reads (free space in a file's metadata blocks) changes
      # nothing: if verify passes, the checkpoint is sound and the resume below is the check.
      if [ "$damage" = flip ] && "$bin" ckpt verify "$ck/latest" >"$dir/damaged-verify.log" 2>&1; then
        what+=" (a byte nobody reads: verifies)"
        harmless=1 log=$dir/first.log
      else
        launch "$log" "$ranks" -- --set checkpoint.dir="$ck"
        finish_job
        expect_rc=2 expect_msg="trident: error.*$shard.*The previous checkpoint is .*step_$(printf %08d "$every"): .*ln -sfn"
      fi
      ;;
  esac
  worst=$exit_s fault_rc=$rc
  [ $hung = 1 ] && problems+=("HANG: killed after $limit_s s") && verdict=hang
  [ $leftover = 1 ] && problems+=("a rank was left running after mpirun exited")
  [ -n "$expect_rc" ] && [ $rc -ne "$expect_rc" ] && [ $hung = 0 ] && problems+=("exit $rc, expected $expect_rc")
  if [ -n "$expect_msg" ] && ! grep -qE "$expect_msg" "$log"; then
    problems+=("no message like /$expect_msg/: $(grep -m1 'trident: error' "$log" | cut -c1-200)")
  fi
  local crash f; crash=$(for f in "$dir"/*.log; do crash_lines "$f"; done)
  [ -n "$crash" ] && problems+=("CRASH: $(head -1 <<<"$crash")") && verdict=crash

  # The recovery: for a damaged latest, the previous checkpoint (what a user does by hand).
  if [ "$kind" = corrupt ] && [ $harmless = 0 ]; then
    ln -sfn "step_$(printf %08d "$every")" "$ck/latest"
  fi
  check_latest_and_resume
  [ $verdict = ok ] && [ ${#problems[@]} -gt 0 ] && verdict=failed
  mountpoint -q "$mnt" && umount "$mnt"
  [ $verdict = ok ] && rm -rf "$dir"
}

# check_latest_and_resume: latest verifies (or there is none and none was reported), then 2
# more steps resume from it on the same ranks.
check_latest_and_resume() {
  local from; from=$(latest_step)
  if [ -L "$ck/latest" ]; then
    timeout 120 "$bin" ckpt verify "$ck/latest" >"$dir/verify.log" 2>&1 \
      || { problems+=("UNLOADABLE latest: $(tail -1 "$dir/verify.log")"); verdict=unloadable; return; }
  elif grep -hq "^checkpoint: " "$dir"/*.log; then
    problems+=("UNLOADABLE: the log reported a checkpoint but there is no latest"); verdict=unloadable; return
  fi
  # train.steps grows by 2 so that a run that had finished can go on too.
  launch "$dir/resume.log" "$ranks" -- --set checkpoint.dir="$ck" --set train.steps=$((steps + 2)) \
    --set train.stop_at=$((from + 2))
  finish_job
  [ "$(awk -v a="$exit_s" -v b="$worst" 'BEGIN { print (a > b) }')" = 1 ] && worst=$exit_s
  local first; first=$(grep -m1 -oE '^step +[0-9]+' "$dir/resume.log" | grep -oE '[0-9]+')
  if [ $hung = 1 ]; then problems+=("HANG in the resume"); verdict=hang
  elif [ $rc -ne 0 ]; then problems+=("resume from step $from: exit $rc: $(grep -m1 'error' "$dir/resume.log")")
  elif [ "$first" != $((from + 1)) ]; then problems+=("resume from step $from began at step '$first'")
  fi
  local crash; crash=$(crash_lines "$dir/resume.log")
  [ -n "$crash" ] && problems+=("CRASH in the resume: $(head -1 <<<"$crash")") && verdict=crash
}

# --- Main ----------------------------------------------------------------------------------------
echo "chaos: $faults fault(s), seed $seed, ranks $ranks_lo..$ranks_hi, kinds $kinds_arg, comm.timeout_s $timeout_s (a hang: over $limit_s s)"
echo "chaos: $bin; scratch $scratch$([ $can_mount = 0 ] && echo '; cannot mount a tmpfs: diskfull runs are skipped')"
t_all=$(now_ms) runs=0
for i in $(seq 1 "$faults"); do
  [ "$only" -gt 0 ] && [ "$i" -ne "$only" ] && continue
  one_run "$i"
  runs=$((runs + 1))
  [ $verdict = planned ] && { printf '%3d %-8s %s\n' "$i" "$kind" "$what"; continue; }
  count[$kind]=$(( ${count[$kind]:-0} + 1 ))
  [ $verdict = skipped ] && { skipped=$((skipped + 1)); printf '%3d %-8s skipped (no tmpfs) | %s\n' "$i" "$kind" "$what"; continue; }
  [ "$(awk -v a="$worst" -v b="${slowest[$kind]:-0}" 'BEGIN { print (a > b) }')" = 1 ] && slowest[$kind]=$worst
  [ "$(awk -v a="$worst" -v b="$total_slowest" 'BEGIN { print (a > b) }')" = 1 ] && total_slowest=$worst
  case $verdict in
    hang) hangs=$((hangs + 1)) ;;
    crash) crashes=$((crashes + 1)) ;;
    unloadable) unloadable=$((unloadable + 1)) ;;
  esac
  if [ $verdict != ok ]; then
    failed_runs=$((failed_runs + 1)) bad_count[$kind]=$(( ${bad_count[$kind]:-0} + 1 ))
  fi
  printf '%3d %-8s %-10s exit %3s in %5ss | %s\n' "$i" "$kind" "$verdict" "$fault_rc" "$worst" "$what"
  for p in "${problems[@]}"; do echo "      $p   (replay: --seed $seed --only $i; logs in $dir)"; done
done

echo
echo "| fault kind | runs | failed | slowest exit (s) |"
echo "|---|---:|---:|---:|"
for k in "${kinds[@]}"; do
  [ -n "${count[$k]:-}" ] && echo "| $k | ${count[$k]} | ${bad_count[$k]:-0} | ${slowest[$k]:-} |"
done
echo
echo "runs: $((runs - skipped)) of $runs ($skipped skipped), failed: $failed_runs, hangs: $hangs, crashes: $crashes, unloadable latest: $unloadable, slowest exit: $total_slowest s, wall: $(seconds_since "$t_all") s"
[ $failed_runs -eq 0 ]
