#!/usr/bin/env bash
# Megatron indexed datasets through the binary (docs/data-format.md, "Megatron indexed dataset"):
#   1. the bundled corpus converted by tools/make_indexed.py (tokens, one document per line)
#      trains exactly as the trident token files do — named by prefix, .bin or .idx — on one
#      rank and on two; and text converted by the tool trains as tools/text_to_tokens.py's file;
#   2. the hand-written fixture tests/data/indexed/handmade (int32, written with struct only)
#      is what its script writes, and trains exactly as its text in a trident token file;
#   3. every bad header field, a short .bin and a token >= model.vocab exit 2 with one message
#      naming the file and the field.
# "Exactly": metrics.jsonl's loss, val_loss, grad_norm and lr of every step are equal.
# usage: test_indexed_data.sh TRIDENT_BINARY SOURCE_DIR SCRATCH_DIR
source "$(dirname "$0")/lib.sh" "$@"
if ! $py -c "import numpy" 2>/dev/null; then
  echo "skip: $py with numpy is needed for tools/make_indexed.py"
  exit 77
fi
tool=("$py" "$src/tools/make_indexed.py")
data=$src/inputs/data
common=("$src/inputs/gpt-tiny.yaml" --set run.threads=1 --set train.steps=6
        --set train.val_every=3 --set train.val_batches=2 --set log.every=100)

# The figures a run's metrics.jsonl holds for each step, one line per step.
losses() {
  $py -c 'import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r["step"], repr(r["loss"]), repr(r.get("val_loss")), repr(r["grad_norm"]), repr(r["lr"]))' \
    "$1/metrics.jsonl"
}
# same NAME RUN_A RUN_B: the two runs' figures are equal (and there are some).
same() {
  local a b
  a=$(losses "$2") b=$(losses "$3")
  if [ -z "$a" ]; then fail "$1: no metrics in $2"; return; fi
  if [ "$a" == "$b" ]; then ok "$1: $(wc -l <<<"$a") steps equal, last: $(tail -1 <<<"$a")"
  else fail "$1: metrics differ:"; diff <(echo "$a") <(echo "$b") | head -6; fi
}
train() {  # OUT_DIR ARGS...: trains, fails the check if the run fails
  local out=$1; shift
  "$@" --set run.out_dir="$out" >"$out.log" 2>&1 || fail "$out: exit $?: $(tail -3 "$out.log")"
}

# 1. The bundled corpus as an indexed dataset.
"${tool[@]}" tokens "$data/tiny-train.bin" --split-after 10 -o tiny-train 2>/dev/null \
  && "${tool[@]}" tokens "$data/tiny-valid.bin" --split-after 10 -o tiny-valid 2>/dev/null \
  || fail "make_indexed.py tokens failed"
train base "$bin" train "${common[@]}"
train by-prefix "$bin" train "${common[@]}" --set data.train=tiny-train --set data.valid=tiny-valid.idx
train by-bin "$bin" train "${common[@]}" --set data.train=tiny-train.bin --set data.valid=tiny-valid
same "indexed by prefix and .idx = token files" base by-prefix
same "indexed by .bin and prefix = token files" base by-bin
train base-np2 mpirun -n 2 "$bin" train "${common[@]}"
train indexed-np2 mpirun -n 2 "$bin" train "${common[@]}" --set data.train=tiny-train --set data.valid=tiny-valid
same "2 ranks: indexed = token files" base-np2 indexed-np2

$py "$src/tools/text_to_tokens.py" --decode "$data/tiny-valid.bin" >valid.txt
"${tool[@]}" text valid.txt -o valid-text 2>/dev/null || fail "make_indexed.py text failed"
train text-base "$bin" train "${common[@]}" --set data.train="$data/tiny-valid.bin" --set data.valid=""
train text-indexed "$bin" train "${common[@]}" --set data.train=valid-text --set data.valid=""
same "text through make_indexed.py = the same text's token file" text-base text-indexed

# 2. The hand-written fixture.
fixture=$src/tests/data/indexed
mkdir -p regen && cp "$fixture/write_handmade.py" regen/
$py regen/write_handmade.py
for f in handmade.idx handmade.bin handmade.txt; do
  cmp -s "regen/$f" "$fixture/$f" && ok "write_handmade.py writes the checked-in $f" \
    || fail "tests/data/indexed/$f differs from what write_handmade.py writes"
done
$py "$src/tools/text_to_tokens.py" "$fixture/handmade.txt" handmade-tokens.bin >/dev/null
small=(--set model.seq_len=16 --set train.micro_batch=2 --set train.steps=5 --set train.val_every=2
       --set train.val_batches=2)
train hand-base "$bin" train "${common[@]}" "${small[@]}" --set data.train=handmade-tokens.bin \
  --set data.valid=handmade-tokens.bin
train hand-indexed "$bin" train "${common[@]}" "${small[@]}" --set data.train="$fixture/handmade" \
  --set data.valid="$fixture/handmade.bin"
same "the hand-written int32 fixture = its text's token file" hand-base hand-indexed

# 3. Bad input: exit 2, one message naming the file and the field.
# broken NAME PY_EXPR: copies the fixture to NAME.{idx,bin} and applies PY_EXPR to idx/bin
# (bytearrays; struct is imported).
broken() {
  cp "$fixture/handmade.idx" "$1.idx" && cp "$fixture/handmade.bin" "$1.bin"
  $py -c "import struct, sys
idx = bytearray(open(sys.argv[1] + '.idx', 'rb').read()); bin = bytearray(open(sys.argv[1] + '.bin', 'rb').read())
$2
open(sys.argv[1] + '.idx', 'wb').write(idx); open(sys.argv[1] + '.bin', 'wb').write(bin)" "$1"
}
expect() {  # NAME PATTERN [--set ...]: trains on NAME, expects exit 2 and PATTERN in one error
  local name=$1 pattern=$2 err rc
  shift 2
  err=$("$bin" train "${common[@]}" "${small[@]}" --set data.train="$name" --set data.valid="" \
        --set run.out_dir=bad "$@" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 2 ]; then fail "$name: exit $rc, expected 2: $err"; return; fi
  if ! grep -qE -e "$pattern" <<<"$err"; then fail "$name: message does not match /$pattern/: $err"; return; fi
  if [ "$(grep -c 'trident: error' <<<"$err")" -ne 1 ]; then fail "$name: not one error line: $err"; return; fi
  ok "$name: $(grep 'trident: error' <<<"$err")"
}
broken magic "idx[0:9] = b'MMIDIDX\x00\x01'"
expect magic "data.train: .*magic.idx: magic is 4d 4d 49 44 49 44 58 00 01"
broken version "idx[9:17] = struct.pack('<Q', 2)"
expect version "version.idx: version is 2, expected 1"
broken dtype-unknown "idx[17] = 11"
expect dtype-unknown "dtype-unknown.idx: dtype code 11 is unknown"
broken dtype-float "idx[17] = 7"
expect dtype-float "dtype-float.idx: dtype code 7 is float32: token ids must be integers"
broken seq-count "idx[18:26] = struct.pack('<Q', 5)"
expect seq-count "seq-count.idx: file is 114 bytes, but sequence_count 5 and document_count 4"
broken doc-count "idx[26:34] = struct.pack('<Q', 3)"
expect doc-count "doc-count.idx: .*document_count 3 .*trailing bytes"
broken bin-size "del bin[-4:]"
expect bin-size "bin-size.bin: file is 396 bytes, but the sizes in .*bin-size.idx add up to 100 tokens x 4 bytes"
broken pointer-range "idx[34 + 16 + 8 * 3:34 + 16 + 8 * 4] = struct.pack('<q', 380)"
expect pointer-range "pointer-range.idx: pointers\[3\] is 380, out of range"
broken pointer-order "idx[34 + 16 + 8 * 1:34 + 16 + 8 * 2] = struct.pack('<q', 100)"
expect pointer-order "pointer-order.idx: pointers\[1\] is 100, expected 96 .*back to back"
broken doc-idx "idx[34 + 48 + 8 * 3:34 + 48 + 8 * 4] = struct.pack('<q', 3)"
expect doc-idx "doc-idx.idx: doc_idx\[3\] is 3, expected sequence_count 4"
broken token "bin[4 * 30:4 * 31] = struct.pack('<i', 256)"
expect token "token.bin: token 256 at position 30 \(sequence 1, document 0\) is >= model.vocab 256"
expect vocab "handmade.bin: token 104 at position 1 \(sequence 0, document 0\) is >= model.vocab 100" \
  --set data.train="$fixture/handmade" --set model.vocab=100
expect missing-idx "nothing.idx: cannot open" --set data.train=nothing.idx
cp "$fixture/handmade.idx" lonely.idx
expect lonely "lonely.bin: cannot open"
finish
