#!/usr/bin/env bash
# The family decks run through the binary as a user runs them: `trident train` and
# `trident bench` on inputs/llama-124m.yaml (shrunk to 2 layers of width 128 so the test takes
# seconds) exit 0 and print their figures. Before this test, the memory plan stopped every
# rotary model at start-up with an internal error (src/backend/counting_backend.cpp): building
# the model on the counting backend copies the RoPE tables in, and that backend refused copy.
# usage: test_family_decks.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
source "$(dirname "$0")/lib.sh" "$@"

small=(--set model.layers=2 --set model.d_model=128 --set model.heads=4 --set model.kv_heads=2
       --set model.mlp_hidden=256 --set run.threads=1 --set log.every=100)
for deck in llama-124m; do
  if timeout 120 "$bin" train "$src/inputs/$deck.yaml" "${small[@]}" --set train.steps=2 \
      --set run.out_dir=train-$deck >train-$deck.log 2>&1; then
    ok "$deck: train runs 2 steps"
  else
    fail "$deck: train: $(tail -3 train-$deck.log)"
  fi
  if timeout 120 "$bin" bench "$src/inputs/$deck.yaml" "${small[@]}" --warmup 0 --steps 1 \
      --set run.out_dir=bench-$deck >bench-$deck.log 2>&1 \
      && grep -q '^bench: tokens_per_s=' bench-$deck.log; then
    ok "$deck: bench prints its bench: line"
  else
    fail "$deck: bench: $(tail -3 bench-$deck.log)"
  fi
done
finish
