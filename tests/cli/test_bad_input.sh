#!/usr/bin/env bash
# Bad input to the trident binary: each case must exit with status 2, print one message naming
# the thing that is wrong, and leave what an earlier run saved untouched.
# usage: test_bad_input.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
set -uo pipefail
bin=$1 src=$2 scratch=$3
rm -rf "$scratch" && mkdir -p "$scratch"
cd "$scratch"
failures=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

# A finished earlier run whose files must survive every bad invocation below.
mkdir -p runs/keep
echo "earlier metrics" > runs/keep/metrics.jsonl
echo "earlier deck" > runs/keep/deck.yaml

cp "$src/inputs/gpt-tiny.yaml" deck.yaml
sed -i "s|data/tiny-train.bin|$src/inputs/data/tiny-train.bin|; s|data/tiny-valid.bin|$src/inputs/data/tiny-valid.bin|" deck.yaml
common=(--set run.out_dir=runs/keep --set train.steps=2 --set run.threads=1)

# expect NAME PATTERN -- COMMAND...: exit status 2 and PATTERN (grep -E) on stderr.
expect() {
  local name=$1 pattern=$2
  shift 3
  local err rc
  err=$("$@" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 2 ]; then
    echo "FAIL $name: exit status $rc, expected 2; stderr: $err"; failures=$((failures + 1)); return
  fi
  if ! grep -qE -e "$pattern" <<<"$err"; then
    echo "FAIL $name: message does not match /$pattern/: $err"; failures=$((failures + 1)); return
  fi
  if [ "$(grep -c 'trident: error' <<<"$err")" -ne 1 ]; then
    echo "FAIL $name: expected exactly one error line: $err"; failures=$((failures + 1)); return
  fi
  echo "ok   $name: $(grep 'trident: error' <<<"$err")"
}

# Datasets
expect missing-dataset "data.train.*nope.bin" -- "$bin" train deck.yaml "${common[@]}" --set data.train=nope.bin
head -c 1000 "$src/inputs/data/tiny-train.bin" > truncated.bin
expect truncated-dataset "data.train.*truncated.bin.*bytes" -- "$bin" train deck.yaml "${common[@]}" --set data.train=truncated.bin
{ printf 'NOTTOKEN'; head -c 5000 /dev/zero; } > badmagic.bin
expect wrong-magic "data.train.*badmagic.bin.*magic" -- "$bin" train deck.yaml "${common[@]}" --set data.train=badmagic.bin
expect token-out-of-range "data.train.*token.*>= .*vocab" -- "$bin" train deck.yaml "${common[@]}" --set model.vocab=100
expect missing-valid "data.valid.*nope-valid.bin" -- "$bin" train deck.yaml "${common[@]}" --set data.valid=nope-valid.bin

# Decks and overrides
expect missing-deck "no-such-deck.yaml" -- "$bin" train no-such-deck.yaml
printf 'model:\n  layers: [1, 2\n' > malformed.yaml
expect malformed-yaml "malformed.yaml" -- "$bin" train malformed.yaml
expect unknown-key "model.layerz" -- "$bin" train deck.yaml "${common[@]}" --set model.layerz=3
expect wrong-type "train.steps.*integer" -- "$bin" train deck.yaml "${common[@]}" --set train.steps=ten
expect out-of-range "train.lr" -- "$bin" train deck.yaml "${common[@]}" --set train.lr=-1
expect bad-set-syntax "expected key=value" -- "$bin" train deck.yaml --set model.layers
expect bad-enum "train.lr_schedule" -- "$bin" train deck.yaml "${common[@]}" --set train.lr_schedule=linear
# Note [bf16 activations]: bf16 is the GPU's; the CPU's bf16 ops are a test twin.
expect bf16-on-cpu "run.precision bf16 needs run.backend cuda" -- "$bin" train deck.yaml "${common[@]}" --set run.precision=bf16
expect bad-precision "run.precision" -- "$bin" train deck.yaml "${common[@]}" --set run.precision=fp16
expect bad-nonfinite "train.nonfinite" -- "$bin" train deck.yaml "${common[@]}" --set train.nonfinite=ignore
expect heads-not-dividing "heads" -- "$bin" train deck.yaml "${common[@]}" --set model.heads=3
# Note [Memory plan]: refused before allocating, with the bytes per rank and the largest item.
expect model-too-big "not enough memory: each rank needs [0-9.]+ GiB .*largest: .*only [0-9.]+ GiB is free" -- "$bin" train deck.yaml "${common[@]}" --set model.layers=100000
# Note [Asynchronous checkpoints]: the snapshot is counted (one more copy of params, m and v).
expect model-too-big-async "not enough memory: .*checkpoint.async's snapshot [0-9.]+; the largest" -- "$bin" train deck.yaml "${common[@]}" --set model.layers=100000 --set checkpoint.async=true --set checkpoint.dir=ck_async
expect bad-on-error "checkpoint.on_error" -- "$bin" train deck.yaml "${common[@]}" --set checkpoint.on_error=ignore

# Layouts
expect grid-not-dividing "world 6 is not divisible by tp 4" -- "$bin" grid --world 6 --tp 4
expect dp-not-fitting "dp 3.*world is 1|world 1.*dp 3" -- "$bin" train deck.yaml "${common[@]}" --set parallel.dp=3
# The named dimensions (Note [Grid rank order] in src/comm/grid.cpp): dp = dp_replicate × dp_shard.
expect dp-split-not-fitting "dp_replicate 2 × dp_shard 3 = 6 but dp is 4" -- "$bin" train deck.yaml "${common[@]}" --set parallel.dp=4 --set parallel.dp_replicate=2 --set parallel.dp_shard=3
expect grid-dp-replicate-not-dividing "dp 8 is not divisible by dp_replicate 3" -- "$bin" grid --world 8 --dp-replicate 3
expect grid-cp-not-dividing "world 6 is not divisible by tp 1 × pp 1 × cp 4" -- "$bin" grid --world 6 --cp 4
# On two ranks: every rank exits 2, one message (from the lowest failing rank).
mpi=(mpirun -n 2)
mpi4=(mpirun -n 4)
expect stages-over-layers "parallel.pp \(2\) must be at most model.layers \(1\)" -- "${mpi[@]}" "$bin" train deck.yaml "${common[@]}" --set parallel.pp=2 --set model.layers=1
expect stage-layers-sum "stage_layers.*6 layers but model.layers is 4" -- "${mpi[@]}" "$bin" train deck.yaml "${common[@]}" --set parallel.pp=2 --set parallel.stage_layers=3,3
expect tp-not-dividing-heads "parallel.tp.*heads" -- "${mpi[@]}" "$bin" train deck.yaml "${common[@]}" --set parallel.tp=2 --set model.heads=1 --set model.d_model=128
expect sp-not-dividing-seq "seq_len 63 is not divisible" -- "${mpi[@]}" "$bin" train deck.yaml "${common[@]}" --set parallel.tp=2 --set parallel.sequence_parallel=true --set model.seq_len=63
expect tp-overlap-pieces "parallel.tp_overlap_chunks 3 does not divide the sequence shard: 32 rows" -- "${mpi[@]}" "$bin" train deck.yaml "${common[@]}" --set parallel.tp=2 --set parallel.sequence_parallel=true --set parallel.tp_overlap=true --set parallel.tp_overlap_chunks=3
expect emulate-groups-unknown "comm.emulate_groups: unknown group \"xp\"" -- "$bin" train deck.yaml "${common[@]}" --set comm.emulate_groups=dp,xp
expect two-ranks-bad-deck "rank 0.*train.lr" -- "${mpi[@]}" "$bin" train deck.yaml "${common[@]}" --set train.lr=-1
expect two-ranks-bad-data "rank 0.*data.train.*truncated.bin" -- "${mpi[@]}" "$bin" train deck.yaml "${common[@]}" --set data.train=truncated.bin
# Pipeline schedules (Note [Interleaved 1F1B], Note [Split backward]).
expect virtual-without-interleaved "parallel.virtual_stages: 2 needs parallel.schedule: interleaved" -- "${mpi[@]}" "$bin" train deck.yaml "${common[@]}" --set parallel.pp=2 --set parallel.virtual_stages=2
il=(--set parallel.pp=2 --set parallel.schedule=interleaved --set parallel.virtual_stages=2)
expect interleaved-accum "train.accum 3 is not a multiple of parallel.pp 2 \(use 2 or 4\)" -- "${mpi[@]}" "$bin" train deck.yaml "${common[@]}" "${il[@]}" --set train.accum=3
expect interleaved-layers "4 model chunks, but model.layers is 3" -- "${mpi[@]}" "$bin" train deck.yaml "${common[@]}" "${il[@]}" --set model.layers=3 --set train.accum=2
expect zb-with-recompute "zb-h1 keeps .* train.recompute: full drops" -- "$bin" train deck.yaml "${common[@]}" --set parallel.schedule=zb-h1 --set train.recompute=full
# ZeRO (Note [ZeRO-1] in src/train/zero.h): a stage out of range.
expect zero-out-of-range "parallel.zero" -- "$bin" train deck.yaml "${common[@]}" --set parallel.zero=4
# Context parallelism (Note [Context parallelism] in src/model/cp_attention.h): a sequence that
# does not split into 2·cp chunks, a cp that does not divide the world.
expect cp-seq-len "model.seq_len 60 must be a multiple of 2 \* parallel.cp = 8" -- "${mpi4[@]}" "$bin" train deck.yaml "${common[@]}" --set parallel.cp=4 --set model.seq_len=60
expect cp-world "world 2 .*cp 4|cp 4.*world 2" -- "${mpi[@]}" "$bin" train deck.yaml "${common[@]}" --set parallel.cp=4
# Mixtures of experts (Note [Mixture of experts] in include/trident/model_config.h): what no
# mixture can be, and what is not built (Note [Mixtures in the layouts] in src/model/gpt_moe.cpp).
moe=(--set model.family=mixtral --set model.moe.experts=4 --set model.moe.ffn_width=64)
expect moe-top-k-over-experts "model.moe.top_k 5 must be in \[1, model.moe.experts 4\]" -- "$bin" train deck.yaml "${common[@]}" "${moe[@]}" --set model.moe.top_k=5
expect ep-not-dividing-experts "parallel.ep 2 must divide model.moe.experts 3" -- "${mpi[@]}" "$bin" train deck.yaml "${common[@]}" "${moe[@]}" --set model.moe.experts=3 --set parallel.ep=2
expect ep-not-dividing-dp-cp "parallel.ep 4 must divide .*dp × cp = 2" -- "${mpi[@]}" "$bin" train deck.yaml "${common[@]}" "${moe[@]}" --set parallel.ep=4
expect ep-without-experts "parallel.ep 2 needs a mixture of experts \(model.moe.experts > 0\)" -- "${mpi[@]}" "$bin" train deck.yaml "${common[@]}" --set parallel.ep=2
expect moe-with-tp "model.moe with parallel.tp 2" -- "${mpi[@]}" "$bin" train deck.yaml "${common[@]}" "${moe[@]}" --set parallel.tp=2
# HSDP takes ep within a replica (Note [Experts with HSDP] in src/train/zero3.h): ep 4 over dp 4 but dp_shard 2.
expect ep-with-hsdp "parallel.ep 4 with HSDP .* must divide dp_shard × cp = 2" -- "${mpi4[@]}" "$bin" train deck.yaml "${common[@]}" "${moe[@]}" --set parallel.ep=4 --set parallel.zero=1 --set parallel.dp_replicate=2
expect moe-sigmoid-with-switch "model.moe.aux_loss switch with model.moe.router sigmoid" -- "$bin" train deck.yaml "${common[@]}" "${moe[@]}" --set model.moe.router=sigmoid --set model.moe.aux_loss=switch
expect moe-shared-gate-alone "model.moe.shared_gate needs model.moe.shared_experts > 0" -- "$bin" train deck.yaml "${common[@]}" "${moe[@]}" --set model.moe.shared_gate=true
# bf16 is the GPU's (mixtures run there in bf16 too): the CPU refuses the precision.
expect moe-with-bf16 "run.precision bf16" -- "$bin" train deck.yaml "${common[@]}" "${moe[@]}" --set run.precision=bf16

# A bad llm.c checkpoint
head -c 3000 /dev/urandom > badckpt.bin
expect bad-init-from "model.init_from.*badckpt.bin" -- "$bin" train deck.yaml "${common[@]}" --set model.init_from=badckpt.bin

# Backends: an unknown one, the GPU where there is none.
expect bad-backend "run.backend.*cpu\|cuda" -- "$bin" train deck.yaml "${common[@]}" --set run.backend=tpu
if ! nvidia-smi -L >/dev/null 2>&1; then
  expect cuda-without-gpu "run.backend is cuda" -- "$bin" train deck.yaml "${common[@]}" --set run.backend=cuda
fi

# Nothing saved earlier was touched.
[ "$(cat runs/keep/metrics.jsonl)" = "earlier metrics" ] || { echo "FAIL: metrics.jsonl overwritten"; failures=$((failures + 1)); }
[ "$(cat runs/keep/deck.yaml)" = "earlier deck" ] || { echo "FAIL: deck.yaml overwritten"; failures=$((failures + 1)); }

echo "$failures failure(s)"
[ $failures -eq 0 ]
