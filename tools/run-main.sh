#!/usr/bin/env bash
# The main job: set up, build, train the bundled tiny GPT on the bundled data with 2 data-parallel
# ranks (one thread each, so 2 cores are used once). Extra arguments go to `trident train`.
# Outputs: runs/gpt-tiny/metrics.jsonl (one JSON object per step) and runs/gpt-tiny/deck.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
ranks=${TRIDENT_RANKS:-2}
exec mpirun --allow-run-as-root --oversubscribe -n "$ranks" \
  build/trident train inputs/gpt-tiny.yaml --set run.threads=1 "$@"
