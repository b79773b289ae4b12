#!/usr/bin/env bash
# The test-only Python environment with TensorBoard from PyPI (its event reader and server), for
# tests/cli/test_tensorboard.sh; trident itself needs none of it. Made with Debian's python3 and
# --system-site-packages (numpy comes from Debian), kept outside the clone so CI's machine keeps
# it between runs: $TRIDENT_TB_VENV, else ~/.cache/trident/tb-venv. Prints its directory.
# Idempotent: a venv that already imports TensorBoard is used as it is (about 45 s to make on
# the 2-core machine, docs/decisions.md). Exits 1 if pip cannot install it (no network).
set -euo pipefail
venv=${TRIDENT_TB_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/trident/tb-venv}
version=2.21.0  # the version the tests were written against
ready() {
  "$venv/bin/python" -c "import tensorboard as t, sys; sys.exit(t.__version__ != '$version')" \
    2>/dev/null
}
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"  # two tests asking at once: one makes it, the other waits
flock 9
if ! ready; then
  rm -rf "$venv"
  start=$SECONDS
  echo "tools/tb_venv.sh: installing tensorboard $version into $venv" >&2
  /usr/bin/python3 -m venv --system-site-packages "$venv" >&2
  if ! "$venv/bin/pip" install -q --disable-pip-version-check "tensorboard==$version" >&2; then
    rm -rf "$venv"
    echo "tools/tb_venv.sh: pip could not install tensorboard $version" >&2
    exit 1
  fi
  echo "tools/tb_venv.sh: done in $((SECONDS - start)) s" >&2
fi
echo "$venv"
