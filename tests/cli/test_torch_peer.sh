#!/usr/bin/env bash
# The torch peers of our benchmarks run at torch's fair setting (tools/torch_peer.py, issue 46
# part 5), on a tiny shape (a few seconds):
#   1. tools/bench_torch.py by default: OpenBLAS loaded the fair core and OMP_WAIT_POLICY is
#      passive, as its header and `torch_bench:` line say; also when the caller's environment
#      says otherwise (the script re-executes itself before importing torch);
#   2. --torch-defaults: torch as shipped, both variables unset, and OpenBLAS on the core it
#      detects by itself; --blas-core / --omp-wait-policy choose others;
#   3. torch_peer.with_env refuses once torch is imported (the settings could not take effect);
#   4. tools/bench_llama.py --torch-only, by hand: the fair setting too; with --env-as-given
#      (the driver's) the environment as given. Only where tools/hf_venv.sh's venv exists.
# usage: test_torch_peer.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR (the binary is not used)
source "$(dirname "$0")/lib.sh" "$@"
if ! $py -c "import torch" 2>/dev/null; then
  echo "skip: $py with torch is needed"
  exit 77
fi
core=$($py -c "import sys; sys.path.insert(0, '$src/tools'); import torch_peer; print(torch_peer.FAIR_CORE)")
wait=$($py -c "import sys; sys.path.insert(0, '$src/tools'); import torch_peer; print(torch_peer.FAIR_WAIT)")
tiny=(--layers 1 --d-model 32 --heads 2 --vocab 300 --seq-len 16 --micro-batch 2 --warmup 1 --steps 1)

# 1. Fair by default, whatever the caller's environment says.
for pre in "" "OPENBLAS_CORETYPE=Haswell OMP_WAIT_POLICY=active"; do
  out=$(env -u OPENBLAS_CORETYPE -u OMP_WAIT_POLICY $pre $py "$src/tools/bench_torch.py" "${tiny[@]}" 2>&1)
  last=$(tail -1 <<<"$out")
  if [[ $last == torch_bench:*" blas_core=$core omp_wait_policy=$wait" ]] &&
     grep -q "OPENBLAS_CORETYPE=$core OMP_WAIT_POLICY=$wait (OpenBLAS core loaded: $core)" <<<"$out"; then
    ok "bench_torch.py by default (caller's env '${pre:-none}'): $core, $wait"
  else
    fail "bench_torch.py by default (caller's env '${pre:-none}'): $out"
  fi
done

# 2. Torch as shipped, and a named setting.
out=$(OPENBLAS_CORETYPE=$core OMP_WAIT_POLICY=$wait $py "$src/tools/bench_torch.py" "${tiny[@]}" --torch-defaults 2>&1)
last=$(tail -1 <<<"$out")
if [[ $last == *" omp_wait_policy=unset" && $last != *"blas_core=$core "* ]] &&
   grep -q "OPENBLAS_CORETYPE=unset OMP_WAIT_POLICY=unset .*torch as shipped" <<<"$out"; then
  ok "--torch-defaults: both unset (${last##* blas_core=})"
else
  fail "--torch-defaults: $out"
fi
out=$($py "$src/tools/bench_torch.py" "${tiny[@]}" --blas-core Haswell --omp-wait-policy active 2>&1)
if [[ $(tail -1 <<<"$out") == *" blas_core=Haswell omp_wait_policy=active" ]]; then
  ok "--blas-core Haswell --omp-wait-policy active"
else
  fail "--blas-core Haswell --omp-wait-policy active: $out"
fi

# 3. Too late once torch is loaded.
out=$(env -u OPENBLAS_CORETYPE $py -c "
import sys; sys.path.insert(0, '$src/tools')
import torch, torch_peer
torch_peer.with_env(torch_peer.wanted('$core', '$wait'))
print('returned')" 2>&1)
rc=$?
if [ $rc -ne 0 ] && grep -q "already imported" <<<"$out" && ! grep -q returned <<<"$out"; then
  ok "with_env after import torch: refused"
else
  fail "with_env after import torch (exit $rc): $out"
fi

# 4. bench_llama.py's peer side, where the transformers venv is already there (not built here).
venv=${TRIDENT_HF_VENV:-$src/build/hf-venv}/bin/python
if [ -x "$venv" ] && $venv -c "import transformers" 2>/dev/null; then
  ltiny=(--torch-only --layers 1 --d-model 32 --heads 2 --kv-heads 1 --mlp-hidden 64 --vocab 256
         --seq-len 16 --micro-batch 2 --warmup 1 --steps 1)
  out=$(env -u OPENBLAS_CORETYPE -u OMP_WAIT_POLICY $venv "$src/tools/bench_llama.py" "${ltiny[@]}" 2>&1)
  if [[ $(tail -1 <<<"$out") == *"coretype=$core blas_core=$core omp_wait_policy=$wait "* ]]; then
    ok "bench_llama.py --torch-only by hand: $core, $wait"
  else
    fail "bench_llama.py --torch-only by hand: $out"
  fi
  out=$(env -u OPENBLAS_CORETYPE -u OMP_WAIT_POLICY $venv "$src/tools/bench_llama.py" "${ltiny[@]}" --env-as-given 2>&1)
  if [[ $(tail -1 <<<"$out") == *"coretype=unset blas_core="*" omp_wait_policy=unset "* ]]; then
    ok "bench_llama.py --torch-only --env-as-given: the environment as given"
  else
    fail "bench_llama.py --torch-only --env-as-given: $out"
  fi
else
  echo "note: no transformers venv at $venv; bench_llama.py's part not checked"
fi
finish
