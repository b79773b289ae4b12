#!/usr/bin/python3
"""Uniformly random tokens as a trident token file: throughput benchmarks' mock data.

  tools/mock_tokens.py OUTPUT.bin --vocab 32000 --tokens 200000 [--seed 1]

Megatron-LM benchmarks with `--mock-data` (random ids over the vocabulary): text that routes
as real text does after training, not as the bundled byte-level corpus does at initialisation,
where a mixture's router sends nearly every token to the same two experts (docs/perf.md,
"Mixture of experts (issue 44)"). The ids come from Python's seeded Mersenne Twister, so a
seed gives the same file on any machine. The format is docs/data-format.md's, the same writer
conventions as tools/text_to_tokens.py. Python 3 standard library only.
"""
import argparse
import array
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from text_to_tokens import HEADER, MAGIC, VERSION  # noqa: E402

TOKENIZER_OTHER = 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output")
    ap.add_argument("--vocab", type=int, required=True, help="ids are uniform in [0, vocab)")
    ap.add_argument("--tokens", type=int, default=200000, help="how many tokens")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if not 2 <= a.vocab <= 1 << 32 or a.tokens < 1:
        sys.exit(f"mock_tokens.py: --vocab {a.vocab} must be in [2, 2^32], --tokens {a.tokens} >= 1")
    wide = a.vocab > 65536
    rng = random.Random(a.seed)
    tokens = array.array("I" if wide else "H", (rng.randrange(a.vocab) for _ in range(a.tokens)))
    if tokens.itemsize != (4 if wide else 2):
        sys.exit("mock_tokens.py: this Python's array sizes differ from uint16/uint32")
    if sys.byteorder != "little":
        tokens.byteswap()
    tmp = a.output + ".tmp"
    with open(tmp, "wb") as f:
        f.write(HEADER.pack(MAGIC, VERSION, tokens.itemsize, len(tokens), a.vocab, TOKENIZER_OTHER))
        f.write(tokens.tobytes())
    os.replace(tmp, a.output)
    print(f"{a.output}: {len(tokens)} tokens uniform over {a.vocab} ids, seed {a.seed}")


if __name__ == "__main__":
    main()
