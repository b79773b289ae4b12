#!/usr/bin/python3
"""Writes handmade.idx / handmade.bin / handmade.txt in this directory: a Megatron indexed
dataset made field by field from the format description (docs/data-format.md), with struct
only, independent of tools/make_indexed.py. Checked in; tests/cli/test_indexed_data.sh checks
that this script still writes the same bytes.

int32 tokens (dtype code 4), byte-level; 4 sequences in 3 documents: document 0 holds
sequences 0 and 1 (two sentences), documents 1 and 2 one each. No EOD tokens. handmade.txt
is the same bytes as text, for tools/text_to_tokens.py.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
SEQUENCES = [b"The cat sat on the mat. ", b"It did not move all day.\n",
             b"A dog ran through the fog and barked twice.\n", b"The end"]
DOC_IDX = [0, 2, 3, 4]  # first sequence of each document, then the sequence count
ITEM = 4  # int32

idx = b"MMIDIDX\x00\x00"                    # magic, 9 bytes
idx += struct.pack("<Q", 1)                 # version
idx += struct.pack("<B", 4)                 # dtype code 4: int32
idx += struct.pack("<Q", len(SEQUENCES))    # sequence count
idx += struct.pack("<Q", len(DOC_IDX))      # document count (doc_idx entries)
for s in SEQUENCES:
    idx += struct.pack("<i", len(s))        # sizes, int32
offset = 0
for s in SEQUENCES:
    idx += struct.pack("<q", offset)        # pointers, int64 byte offsets into .bin
    offset += len(s) * ITEM
for d in DOC_IDX:
    idx += struct.pack("<q", d)             # doc_idx, int64
assert len(idx) == 34 + 12 * len(SEQUENCES) + 8 * len(DOC_IDX)

binary = b"".join(struct.pack("<i", byte) for s in SEQUENCES for byte in s)

for name, data in (("handmade.idx", idx), ("handmade.bin", binary),
                   ("handmade.txt", b"".join(SEQUENCES))):
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(data)
