#!/usr/bin/python3
"""Byte-level tokenizer for trident: text -> trident token file, and back.

  tools/text_to_tokens.py INPUT.txt OUTPUT.bin [--valid-fraction 0.1 --valid-output VALID.bin]
  tools/text_to_tokens.py --decode FILE.bin [--head N]

Each byte of the input is one token (vocabulary 256, tokenizer id 0), written in the trident
token format (docs/data-format.md): a 64-byte header, then little-endian uint16 tokens.
With --valid-fraction the last part of the text (cut at the next line start) goes to
--valid-output. INPUT may be "-" for standard input. Python 3 standard library only.
"""
import os
import sys

import argparse
import array
import struct

MAGIC = b"TRIDTOK\0"
VERSION = 1
BYTE_VOCAB = 256
TOKENIZER_BYTE_LEVEL = 0
# magic, version, bytes_per_token, n_tokens, vocab_size, tokenizer, 32 reserved zero bytes
HEADER = struct.Struct("<8sIIQII32x")
assert HEADER.size == 64


def write_token_file(path, data):
    """Writes the bytes `data` as byte-level tokens; returns the file size in bytes."""
    tokens = array.array("H", list(data))  # one uint16 per byte
    if sys.byteorder != "little":
        tokens.byteswap()
    header = HEADER.pack(MAGIC, VERSION, 2, len(tokens), BYTE_VOCAB, TOKENIZER_BYTE_LEVEL)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(tokens.tobytes())
    os.replace(tmp, path)  # readers never see a half-written file
    return os.path.getsize(path)


def read_token_file(path):
    """Returns (tokens, tokenizer id) of a trident token file, checking what decode relies on."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        sys.exit(f"{path}: cannot read: {e.strerror}")
    if len(blob) < HEADER.size:
        sys.exit(f"{path}: {len(blob)} bytes, shorter than the 64-byte header")
    magic, version, width, n, vocab, tokenizer = HEADER.unpack_from(blob)
    if magic != MAGIC:
        sys.exit(f"{path}: not a trident token file (magic {magic!r})")
    if version != VERSION or width not in (2, 4):
        sys.exit(f"{path}: unsupported version {version} / bytes_per_token {width}")
    expected = HEADER.size + n * width
    if len(blob) != expected:
        sys.exit(f"{path}: file is {len(blob)} bytes, expected {expected}")
    tokens = array.array("H" if width == 2 else "I", blob[HEADER.size:])
    if sys.byteorder != "little":
        tokens.byteswap()
    return tokens, tokenizer


def split_point(data, fraction):
    """Index where the validation part starts: the first line start at or after the cut."""
    cut = len(data) - int(round(len(data) * fraction))
    newline = data.find(b"\n", cut)
    return newline + 1 if newline >= 0 and newline + 1 < len(data) else cut


def report(path, n_tokens, n_bytes):
    print(f"wrote {path}: {n_tokens} tokens, {n_bytes} bytes "
          f"(byte-level, vocab {BYTE_VOCAB}, 2-byte tokens)")


def encode(args, parser):
    if (args.valid_fraction is None) != (args.valid_output is None):
        parser.error("--valid-fraction and --valid-output go together")
    if args.valid_fraction is not None and not 0.0 < args.valid_fraction < 1.0:
        parser.error("--valid-fraction must be between 0 and 1")
    if args.input == "-":
        data = sys.stdin.buffer.read()
    else:
        try:
            with open(args.input, "rb") as f:
                data = f.read()
        except OSError as e:
            sys.exit(f"{args.input}: cannot read: {e.strerror}")
    parts = [(args.output, data)]
    if args.valid_fraction is not None:
        cut = split_point(data, args.valid_fraction)
        parts = [(args.output, data[:cut]), (args.valid_output, data[cut:])]
    for path, part in parts:
        if len(part) < 2:
            sys.exit(f"{path}: would hold {len(part)} tokens; a dataset needs at least 2")
    for path, part in parts:
        report(path, len(part), write_token_file(path, part))


def decode(args):
    tokens, tokenizer = read_token_file(args.decode)
    if tokenizer != TOKENIZER_BYTE_LEVEL:
        sys.exit(f"{args.decode}: tokenizer id {tokenizer}; --decode reads byte-level files only")
    if args.head is not None:
        tokens = tokens[:args.head]
    if any(t >= BYTE_VOCAB for t in tokens):
        sys.exit(f"{args.decode}: holds tokens >= {BYTE_VOCAB}; not byte-level text")
    sys.stdout.buffer.write(bytes(tokens.tolist()))  # bytes(array) would copy its raw buffer
    sys.stdout.buffer.flush()


def main():
    parser = argparse.ArgumentParser(
        description="Byte-level tokenizer writing trident token files (vocab 256).")
    parser.add_argument("input", nargs="?", help="text file to tokenize ('-' for stdin)")
    parser.add_argument("output", nargs="?", help="trident token file to write")
    parser.add_argument("--valid-fraction", type=float,
                        help="fraction of the text (its end) written to --valid-output")
    parser.add_argument("--valid-output", help="token file for the validation part")
    parser.add_argument("--decode", metavar="FILE.bin", help="print a token file's text")
    parser.add_argument("--head", type=int, metavar="N", help="with --decode: first N tokens only")
    args = parser.parse_args()
    if args.decode:
        if args.input or args.output or args.valid_output or args.valid_fraction is not None:
            parser.error("--decode takes only the token file (and --head)")
        decode(args)
    else:
        if not args.input or not args.output:
            parser.error("INPUT and OUTPUT are required (or use --decode FILE.bin)")
        encode(args, parser)


if __name__ == "__main__":
    main()
