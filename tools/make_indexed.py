#!/usr/bin/python3
"""Writes a Megatron-LM / GPT-NeoX indexed dataset (PREFIX.bin + PREFIX.idx) for trident.

  tools/make_indexed.py text book.txt [more.txt ...] -o data/book [--document line|file]
      [--tokenizer tokenizer.json [--add-special-tokens]]
  tools/make_indexed.py tokens data/book-train.bin -o data/book-train [--split-after 10]
  tools/make_indexed.py show data/book [--head 3]

text: byte-level tokens (each byte is one token, vocabulary 256), or with --tokenizer the
tokens of a Hugging Face tokenizer.json (GPT-NeoX's, Llama's, ...) through the `tokenizers`
package, a tool-only dependency: run with tools/hf_venv.sh's python. The input is UTF-8 text;
--add-special-tokens applies the tokenizer's post-processor (Llama's adds BOS to every
document); the vocabulary is the tokenizer's, added tokens included (docs/data-format.md, "BOS
and EOD by family"). A document is one line,
its newline included (--document line, the default), or one whole input file (--document
file); either way the dataset's tokens, read in order, are exactly the input bytes, so it
trains like `tools/text_to_tokens.py` on the same text. tokens: the tokens of a trident token
file, as one document, or split into documents after every occurrence of --split-after.
--append-eod ID adds token ID after every document (as Megatron's preprocess_data.py
--append-eod does); trident itself never adds one. Tokens are uint16 when the vocabulary
fits (<= 65536), else int32 (--dtype chooses). Empty documents are left out.

The index is Megatron's "MMIDIDX" version 1 (docs/data-format.md): one sequence per document,
stored back to back. Needs numpy (Debian's python3-numpy: run with /usr/bin/python3).
"""
import argparse
import os
import struct
import sys

import numpy as np

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
# Megatron's dtype codes; the integer ones this tool writes.
DTYPE_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6,
               "float32": 7, "uint16": 8}
WRITABLE = ("uint16", "int32")

TRIDENT_MAGIC = b"TRIDTOK\0"
TRIDENT_HEADER = struct.Struct("<8sIIQII32x")  # magic, version, bytes/token, n, vocab, tokenizer


def text_documents(paths, per_file):
    """Byte-level documents: each line (with its newline) of each file, or each file."""
    docs = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise SystemExit(f"{path}: cannot read: {e.strerror}")
        parts = [data] if per_file else data.splitlines(keepends=True)
        docs += [np.frombuffer(p, dtype=np.uint8).astype(np.int64) for p in parts]
    return docs, 256


def tokenizer_documents(paths, per_file, tokenizer_path, special):
    """Documents as a tokenizer.json encodes them (the `tokenizers` package)."""
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        raise SystemExit(f"--tokenizer needs the tokenizers package ({e}): run this tool with "
                         f"the python tools/hf_venv.sh prints")
    try:
        tok = Tokenizer.from_file(tokenizer_path)
    except Exception as e:  # the package raises its own exception types
        raise SystemExit(f"{tokenizer_path}: not a tokenizer.json the tokenizers package reads: {e}")
    docs = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise SystemExit(f"{path}: cannot read as UTF-8 text: {e}")
        parts = [text] if per_file else text.splitlines(keepends=True)
        encoded = tok.encode_batch(parts, add_special_tokens=special)
        docs += [np.array(e.ids, dtype=np.int64) for e in encoded]
    return docs, tok.get_vocab_size(with_added_tokens=True)


def read_token_file(path):
    """(tokens as int64, vocab_size) of a trident token file; exits naming the file if not one."""
    try:
        with open(path, "rb") as f:
            header = f.read(TRIDENT_HEADER.size)
            payload = f.read()
    except OSError as e:
        raise SystemExit(f"{path}: cannot read: {e.strerror}")
    if len(header) < TRIDENT_HEADER.size or header[:8] != TRIDENT_MAGIC:
        raise SystemExit(f"{path}: not a trident token file (no \"TRIDTOK\\0\" header)")
    _, version, width, n, vocab, _ = TRIDENT_HEADER.unpack(header)
    if version != 1 or width not in (2, 4) or len(payload) != n * width:
        raise SystemExit(f"{path}: damaged trident token file (version {version}, {width}-byte "
                         f"tokens, {n} tokens in the header, {len(payload)} payload bytes)")
    return np.frombuffer(payload, dtype="<u2" if width == 2 else "<u4").astype(np.int64), vocab


def token_documents(path, split_after):
    tokens, vocab = read_token_file(path)
    if split_after is None:
        return [tokens], vocab
    ends = np.flatnonzero(tokens == split_after) + 1
    return np.split(tokens, ends), vocab


def write_indexed(prefix, docs, dtype_name):
    """Writes PREFIX.bin and PREFIX.idx (each beside the target, then renamed); returns
    (sequences, tokens)."""
    docs = [d for d in docs if len(d) > 0]
    dtype = np.dtype(dtype_name).newbyteorder("<")
    info = np.iinfo(dtype)
    for i, d in enumerate(docs):
        if d.min() < info.min or d.max() > info.max:
            raise SystemExit(f"document {i}: token {d.max()} does not fit {dtype_name}")
    sizes = np.array([len(d) for d in docs], dtype="<i4")
    pointers = np.zeros(len(docs), dtype="<i8")
    np.cumsum(sizes[:-1].astype(np.int64) * dtype.itemsize, out=pointers[1:])
    doc_idx = np.arange(len(docs) + 1, dtype="<i8")  # one sequence per document, then the end

    header = INDEX_MAGIC + struct.pack("<QBQQ", INDEX_VERSION, DTYPE_CODES[dtype_name],
                                       len(sizes), len(doc_idx))
    for suffix, parts in ((".bin", [d.astype(dtype).tobytes() for d in docs]),
                          (".idx", [header, sizes.tobytes(), pointers.tobytes(),
                                    doc_idx.tobytes()])):
        tmp = prefix + suffix + ".tmp"
        with open(tmp, "wb") as f:
            for p in parts:
                f.write(p)
        os.replace(tmp, prefix + suffix)
    return len(sizes), int(sizes.sum())


def show(prefix, head):
    """Prints the header and the first `head` sequences of PREFIX.idx / PREFIX.bin."""
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    if idx[:9] != INDEX_MAGIC:
        raise SystemExit(f"{prefix}.idx: magic is {idx[:9]!r}, expected {INDEX_MAGIC!r}")
    version, code, n_seq, n_doc = struct.unpack_from("<QBQQ", idx, 9)
    name = {v: k for k, v in DTYPE_CODES.items()}.get(code, f"unknown ({code})")
    sizes = np.frombuffer(idx, dtype="<i4", count=n_seq, offset=34)
    pointers = np.frombuffer(idx, dtype="<i8", count=n_seq, offset=34 + 4 * n_seq)
    print(f"{prefix}.idx: version {version}, dtype {name}, {n_seq} sequences, "
          f"{n_doc} doc_idx entries, {int(sizes.sum())} tokens")
    if name not in DTYPE_CODES:
        return
    tokens = np.fromfile(prefix + ".bin", dtype=np.dtype(name).newbyteorder("<"))
    width = np.dtype(name).itemsize
    for i in range(min(head, n_seq)):
        start = pointers[i] // width
        print(f"  sequence {i}: {sizes[i]} tokens at byte {pointers[i]}: "
              f"{tokens[start:start + min(sizes[i], 16)].tolist()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("text", help="byte-level text -> indexed dataset")
    t.add_argument("inputs", nargs="+")
    t.add_argument("--document", choices=("line", "file"), default="line")
    t.add_argument("--tokenizer", metavar="TOKENIZER_JSON",
                   help="encode with a Hugging Face tokenizer.json instead of bytes")
    t.add_argument("--add-special-tokens", action="store_true",
                   help="with --tokenizer: its post-processor's tokens (Llama: BOS first)")
    k = sub.add_parser("tokens", help="trident token file -> indexed dataset")
    k.add_argument("input")
    k.add_argument("--split-after", type=int, metavar="TOKEN",
                   help="end a document after each occurrence of TOKEN (10: lines of bytes)")
    for p in (t, k):
        p.add_argument("-o", "--output", required=True, metavar="PREFIX",
                       help="writes PREFIX.bin and PREFIX.idx")
        p.add_argument("--dtype", choices=("auto",) + WRITABLE, default="auto")
        p.add_argument("--append-eod", type=int, metavar="ID",
                       help="append token ID to every document (trident adds none itself)")
    s = sub.add_parser("show", help="print an indexed dataset's header and first sequences")
    s.add_argument("prefix")
    s.add_argument("--head", type=int, default=3)
    args = ap.parse_args()

    if args.command == "show":
        show(args.prefix[:-4] if args.prefix.endswith((".bin", ".idx")) else args.prefix,
             args.head)
        return
    if args.command == "text" and args.tokenizer:
        docs, vocab = tokenizer_documents(args.inputs, args.document == "file", args.tokenizer,
                                          args.add_special_tokens)
    elif args.command == "text":
        if args.add_special_tokens:
            raise SystemExit("--add-special-tokens needs --tokenizer")
        docs, vocab = text_documents(args.inputs, args.document == "file")
    else:
        if os.path.abspath(args.input) == os.path.abspath(args.output + ".bin"):
            raise SystemExit(f"{args.input}: the output {args.output}.bin would overwrite it")
        docs, vocab = token_documents(args.input, args.split_after)
    if args.append_eod is not None:
        docs = [np.append(d, args.append_eod) for d in docs]
        vocab = max(vocab, args.append_eod + 1)
    dtype = args.dtype if args.dtype != "auto" else ("uint16" if vocab <= 65536 else "int32")
    n_seq, n_tokens = write_indexed(args.output, docs, dtype)
    print(f"{args.output}.bin/.idx: {n_tokens} {dtype} tokens in {n_seq} documents",
          file=sys.stderr)


if __name__ == "__main__":
    main()
