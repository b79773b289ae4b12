#!/usr/bin/env bash
# The main job: set up, build, train the bundled tiny GPT on the bundled data.
# Outputs: runs/gpt-tiny/metrics.jsonl (one JSON object per step) and runs/gpt-tiny/deck.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec build/trident train inputs/gpt-tiny.yaml "$@"
