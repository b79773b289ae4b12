#!/usr/bin/env bash
# The Hugging Face oracle's Python: a venv over Debian's python3 (its torch 1.13, numpy, h5py
# come through --system-site-packages) with transformers 4.36.2, tokenizers and safetensors
# from PyPI. Idempotent: an existing venv whose imports work is reused at once (~2 s); a new one
# takes a few minutes (docs/decisions.md, "Hugging Face oracle"). Prints the venv's python on
# the last line of stdout.
# usage: tools/hf_venv.sh [DIR]   (default: $TRIDENT_HF_VENV, else build/hf-venv)
# exit 0: ready; exit 77: pip could not install it (no network, no ensurepip): tests skip.
set -u
dir=${1:-${TRIDENT_HF_VENV:-$(cd "$(dirname "$0")/.." && pwd)/build/hf-venv}}
py=$dir/bin/python
probe='import transformers, tokenizers, safetensors, torch; assert transformers.__version__ == "4.36.2"'

if [ -x "$py" ] && "$py" -c "$probe" 2>/dev/null; then
  echo "$py"
  exit 0
fi
mkdir -p "$(dirname "$dir")"
# One installer at a time (ctest runs tests in parallel, and each may ask for the venv).
exec 9>"$dir.lock"
flock 9
if [ -x "$py" ] && "$py" -c "$probe" 2>/dev/null; then
  echo "$py"
  exit 0
fi
log=$dir.install.log
echo "hf_venv: installing transformers 4.36.2 into $dir (log: $log)" >&2
rm -rf "$dir"
if ! /usr/bin/python3 -m venv --system-site-packages "$dir" >"$log" 2>&1; then
  echo "hf_venv: cannot make a venv with /usr/bin/python3 (python3-venv missing?): $(tail -1 "$log")" >&2
  exit 77
fi
# transformers 4.36.2 pins tokenizers < 0.19 and huggingface-hub; torch stays Debian's.
if ! "$py" -m pip install --disable-pip-version-check --no-input -q \
    "transformers==4.36.2" "tokenizers>=0.14,<0.19" "safetensors>=0.4.1" >>"$log" 2>&1; then
  echo "hf_venv: pip could not install transformers 4.36.2: $(tail -2 "$log")" >&2
  exit 77
fi
if ! "$py" -c "$probe" >>"$log" 2>&1; then
  echo "hf_venv: installed, but the imports fail: $(tail -2 "$log")" >&2
  exit 77
fi
echo "$py"
