#!/usr/bin/env bash
# Every rank must run the same resolved deck (src/app/run_setup.cpp, make_grid: a hash of the
# resolved deck compared across ranks). Started MPMD, one rank per program block of mpirun:
#   - rank 1 with a different --set: every rank exits 2 within seconds, and the job prints
#     exactly one error line, naming the problem;
#   - rank 1 with a --set that resolves to the same deck (the deck's own value): it runs;
#   - the same --set on both ranks: it runs.
# Each rank's own exit status is recorded by a wrapper (mpirun reports only one).
# usage: test_deck_agreement.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
source "$(dirname "$0")/lib.sh" "$@"

common=("$src/inputs/gpt-tiny.yaml" --set run.threads=1 --set train.steps=2 --set train.val_every=0
        --set train.micro_batch=2)
# Runs one rank and writes its exit status to rc.<world rank>.
cat >rank.sh <<'EOF'
"$@"
rc=$?
echo $rc >"rc.$OMPI_COMM_WORLD_RANK"
exit $rc
EOF
# mpmd NAME "RANK0 --set..." "RANK1 --set...": one rank each; sets $secs and $rcs, stderr in NAME.err.
mpmd() {
  local name=$1 set0=$2 set1=$3
  rm -f rc.0 rc.1
  local t0=$SECONDS
  # shellcheck disable=SC2086  # the --set lists are meant to split into words
  timeout 120 mpirun -n 1 bash rank.sh "$bin" train "${common[@]}" --set run.out_dir=$name $set0 : \
                     -n 1 bash rank.sh "$bin" train "${common[@]}" --set run.out_dir=$name $set1 \
    >"$name.out" 2>"$name.err"
  mpirun_rc=$?
  secs=$((SECONDS - t0))
  rcs="$(cat rc.0 2>/dev/null || echo none) $(cat rc.1 2>/dev/null || echo none)"
}

# 1. Different learning rates: refused by every rank, quickly, with one message.
mpmd differ "--set train.lr=0.001" "--set train.lr=0.002"
errors=$(grep -c 'trident: error' differ.err)
if [ "$rcs" = "2 2" ] && [ $mpirun_rc -eq 2 ] && [ "$errors" -eq 1 ] && [ $secs -le 30 ] \
   && grep -q "resolved deck differs between ranks" differ.err && [ ! -s differ/metrics.jsonl ]; then
  ok "different --set on rank 1: both ranks exit 2 in $secs s, one message: $(grep 'trident: error' differ.err)"
else
  fail "different --set on rank 1: rank exits '$rcs', mpirun $mpirun_rc, $errors error lines, $secs s," \
       "metrics $([ -s differ/metrics.jsonl ] && echo written || echo none): $(head -5 differ.err)"
fi

# 2. The same resolved deck spelled differently (3.0e-3 is the deck's own train.lr): it runs.
mpmd spelled "" "--set train.lr=0.003"
if [ "$rcs" = "0 0" ] && [ $mpirun_rc -eq 0 ] && [ "$(wc -l <spelled/metrics.jsonl)" -eq 2 ]; then
  ok "rank 1 sets train.lr to the deck's own value: runs 2 steps ($secs s)"
else
  fail "same resolved deck: rank exits '$rcs', mpirun $mpirun_rc: $(tail -3 spelled.err)"
fi

# 3. The same --set on both ranks: it runs.
mpmd same "--set train.lr=0.002" "--set train.lr=0.002"
if [ "$rcs" = "0 0" ] && [ $mpirun_rc -eq 0 ] && [ "$(wc -l <same/metrics.jsonl)" -eq 2 ] \
   && grep -q "lr: 0.002" same/deck.yaml; then
  ok "the same --set on both ranks: runs 2 steps ($secs s)"
else
  fail "same --set: rank exits '$rcs', mpirun $mpirun_rc: $(tail -3 same.err)"
fi

finish
