#!/usr/bin/env bash
# Installs what is missing (tools/setup.sh), configures and builds trident into build/.
# Extra arguments go to CMake's configure step (e.g. -DTRIDENT_NATIVE=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
elif [ $# -gt 0 ]; then
  cmake -S . -B build "$@" >/dev/null
fi
cmake --build build --parallel "$(nproc)"
