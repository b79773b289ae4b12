#!/usr/bin/env bash
# `trident export` and model.init_from with Hugging Face safetensors, end to end:
#   1. 2 steps as tp 2 on 2 ranks (vocab 200, so wte has padded rows), checkpointed;
#   2. exported on one rank (the deck still says tp 2) as llm.c's checkpoint and as safetensors;
#      numpy + h5py read both and compare every tensor with the HDF5 checkpoint, bitwise
#      (tests/cli/safetensors_check.py compare);
#   3. each loads back through model.init_from and exports as the other format: the files are
#      byte-identical to the first exports, so the loaders read back exactly what was saved;
#   4. both files load in other layouts (tp 2, pp 2 on 2 ranks): one training step from either
#      gives the same loss and grad norm, bitwise;
#   5. the hub's spelling (no "transformer." prefix, heads from config.json, mask buffers, a
#      tied lm_head.weight) loads as the same weights; F16 and BF16 load widened, exactly;
#   6. bad files (header length, JSON, dtype, shape, sizes, offsets past the end, overlap,
#      missing, unknown or doubled tensors, an untied head, no head count) exit 2 naming the
#      file and the problem; export refuses more than one rank and a --format it does not know.
# usage: test_export.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
source "$(dirname "$0")/lib.sh" "$@"

deck=$src/inputs/gpt-tiny.yaml
check=$src/tests/cli/safetensors_check.py
common=(--set run.threads=1 --set model.vocab=200 --set train.micro_batch=4 --set train.val_every=0
        --set log.every=100)
export_1() { timeout 120 "$bin" export "$deck" "${common[@]}" "$@"; }  # one rank

# 1. A checkpoint in a layout other than export's.
timeout 300 mpirun -n 2 "$bin" train "$deck" "${common[@]}" --set parallel.tp=2 --set train.steps=2 \
  --set checkpoint.dir=ck --set checkpoint.every=2 --set run.out_dir=train >train.log 2>&1 \
  || fail "tp-2 training: $(tail -3 train.log)"

# 2. Export, and compare with the checkpoint outside trident.
export_1 --set parallel.tp=2 --ckpt ck --format llmc a.bin >export_llmc.log 2>&1 \
  || fail "export llmc: $(tail -3 export_llmc.log)"
export_1 --set parallel.tp=2 --ckpt ck --format safetensors a.safetensors >export_st.log 2>&1 \
  || fail "export safetensors: $(tail -3 export_st.log)"
grep -q "^export: checkpoint .*step_00000002 (step 2) -> a.safetensors (safetensors, " export_st.log \
  || fail "export's line: $(tail -1 export_st.log)"
if out=$($py "$check" compare ck a.safetensors a.bin 2>&1); then ok "exports = checkpoint: $out"
else fail "exports differ from the checkpoint:"; echo "$out"; fi

# 3. init_from reads each back exactly: re-exported as the other format, byte for byte.
export_1 --set model.init_from=a.safetensors --format llmc b.bin >reexport_llmc.log 2>&1 \
  || fail "init_from safetensors -> llmc: $(tail -3 reexport_llmc.log)"
export_1 --set model.init_from=a.bin --format safetensors b.safetensors >reexport_st.log 2>&1 \
  || fail "init_from llmc -> safetensors: $(tail -3 reexport_st.log)"
if cmp -s a.bin b.bin && cmp -s a.safetensors b.safetensors; then
  ok "init_from of either format re-exports byte-identical files"
else
  fail "round trip: $(cmp a.bin b.bin 2>&1) $(cmp a.safetensors b.safetensors 2>&1)"
fi

# 4. Other layouts load either file to the same weights: one step, the same loss and norm.
step_of() { $py -c "import json,sys; r=json.loads(open(sys.argv[1]).readline()); print(repr(r['loss']), repr(r['grad_norm']))" "$1"; }
for layout in tp pp; do
  for f in a.bin a.safetensors; do
    timeout 300 mpirun -n 2 "$bin" train "$deck" "${common[@]}" --set parallel.$layout=2 --set train.steps=1 \
      --set model.init_from=$f --set run.out_dir=$layout-$f >$layout-$f.log 2>&1 \
      || fail "$layout 2 from $f: $(tail -3 $layout-$f.log)"
  done
  a=$(step_of $layout-a.bin/metrics.jsonl 2>&1) b=$(step_of $layout-a.safetensors/metrics.jsonl 2>&1)
  if [ -n "$a" ] && [ "$a" = "$b" ]; then ok "$layout 2: the first step from either file: loss, norm $a"
  else fail "$layout 2: from a.bin: $a; from a.safetensors: $b"; fi
done

# 5 and 6. Variants of the good file.
$py "$check" variants a.safetensors v >variants.log 2>&1 || fail "variants: $(tail -3 variants.log)"
while IFS=$'\t' read -r name expect; do
  file=v/$name/model.safetensors
  export_1 --set model.init_from=$file --format safetensors "v/$name/out.safetensors" >"v/$name/log" 2>&1 </dev/null
  rc=$?
  if [ "$expect" = ok ]; then
    if [ $rc -ne 0 ]; then fail "$name: exit $rc: $(tail -2 "v/$name/log")"; continue; fi
    case $name in
      hub) if cmp -s a.safetensors "v/$name/out.safetensors"; then ok "hub spelling: the same weights"
           else fail "hub spelling: re-export differs from a.safetensors"; fi ;;
      f16|bf16) if out=$($py "$check" widened a.safetensors "v/$name/out.safetensors" "${name^^}" 2>&1)
                then ok "$out"; else fail "$out"; fi ;;
    esac
  elif [ $rc -eq 2 ] && grep -qE "model.init_from: .*$file: .*$expect" "v/$name/log"; then
    ok "$name: exit 2: $(grep -m1 -oE "$file: .*" "v/$name/log" | cut -c1-150)"
  else
    fail "$name: exit $rc, expected 2 and /$expect/:"; tail -2 "v/$name/log"
  fi
done <v/cases.tsv
[ "$(wc -l <v/cases.tsv)" -ge 18 ] || fail "only $(wc -l <v/cases.tsv) variant cases"

# Export's own refusals.
timeout 120 mpirun -n 2 "$bin" export "$deck" "${common[@]}" --format llmc two.bin >two.log 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "export runs on one rank (it got 2)" two.log; then ok "2 ranks: exit 2"
else fail "2 ranks: exit $rc: $(tail -2 two.log)"; fi
export_1 --format onnx x.onnx >fmt.log 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "format" fmt.log; then ok "--format onnx: exit 2"
else fail "--format onnx: exit $rc: $(tail -2 fmt.log)"; fi

finish
