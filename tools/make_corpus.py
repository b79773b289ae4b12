#!/usr/bin/python3
"""Generates trident's tiny English-like corpus: short stories from a small seeded grammar.

  tools/make_corpus.py [--bytes 1100000] [--seed 1] [-o corpus.txt]

Each line is one story of 4 to 8 simple sentences about a child, a friend, a thing and a place
chosen at the start of the line; later sentences refer back to them ("Tom has a red kite. ...
He gives the kite to Mia."). About 120 words, fixed spelling and punctuation: a small byte-level
transformer learns the spelling within tens of steps and the grammar and the references back
within a few hundred. The text is the same for the same arguments on any machine and Python 3
version (the generator is written out here, it does not use the `random` module).
"""
import argparse
import sys

MASK64 = (1 << 64) - 1


class SplitMix64:
    """A small, fully specified PRNG, so the corpus never depends on the Python version."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n  # bias ~n/2^64: irrelevant here

    def pick(self, items):
        return items[self.below(len(items))]

    def chance(self, percent):
        return self.below(100) < percent


NAMES = [("Tom", "He", "his"), ("Sam", "He", "his"), ("Ben", "He", "his"), ("Max", "He", "his"),
         ("Anna", "She", "her"), ("Mia", "She", "her"), ("Lily", "She", "her"),
         ("Zoe", "She", "her")]
THINGS = ["ball", "kite", "book", "hat", "cup", "box", "boat", "cake", "apple", "drum", "key",
          "map"]
COLOURS = ["red", "blue", "green", "yellow", "black", "white"]
SIZES = ["big", "small", "little", "old", "new"]
PLACES = ["park", "garden", "house", "school", "river", "forest", "shop", "hill", "beach"]
ANIMALS = ["cat", "dog", "bird", "fox", "frog", "duck", "horse", "fish"]
ANIMAL_ACTS = ["runs", "jumps", "sleeps", "sings", "sits", "plays", "swims", "eats"]
OPENINGS = ["One day", "In the morning", "After school", "On Sunday", "At noon", "Last summer"]
FEELINGS = ["happy", "sad", "tired", "hungry", "glad", "surprised"]
LIKES = ["likes", "loves", "wants", "sees", "finds"]
ANIMAL_WHERE = ["near the", "in the", "behind the", "under a tree in the"]


def story(rng):
    """One line: the cast is fixed first, then every sentence draws from it."""
    hero, pron, poss = rng.pick(NAMES)
    friend = rng.pick([n for n in NAMES if n[0] != hero])[0]
    thing, colour, size = rng.pick(THINGS), rng.pick(COLOURS), rng.pick(SIZES)
    place = rng.pick(PLACES)
    animal = rng.pick(ANIMALS)
    lower = pron.lower()

    last = [-1]

    def sentence():
        k = rng.below(12)
        while k == last[0]:  # no sentence kind twice in a row
            k = rng.below(12)
        last[0] = k
        if k == 0:
            return f"{hero} goes to the {place} with {friend}."
        if k == 1:
            return f"The {thing} is {colour}."
        if k == 2:
            return f"{pron} gives the {thing} to {friend}."
        if k == 3:
            return f"{friend} {rng.pick(LIKES)} the {colour} {thing}."
        if k == 4:
            return f"A {animal} {rng.pick(ANIMAL_ACTS)} {rng.pick(ANIMAL_WHERE)} {place}."
        if k == 5:
            return f"{hero} and {friend} play with the {thing}."
        if k == 6:
            return f"Then {hero} is {rng.pick(FEELINGS)}."
        if k == 7:
            return f"Where is the {thing}? It is in the {place}."
        if k == 8:
            return f"{friend} says, \"I like your {thing}, {hero}.\""
        if k == 9:
            return f"The {animal} looks at the {size} {thing}."
        if k == 10:
            n = 2 + rng.below(4)
            words = ["one", "two", "three", "four", "five"][:n]
            return f"{hero} counts: {', '.join(words)}."
        if thing == "box":
            return f"{pron} opens the box."
        return f"{pron} puts {poss} {thing} in the {rng.pick(['box', 'bag', 'car'])}."

    first = f"{rng.pick(OPENINGS)}, {hero} has a {size} {colour} {thing}."
    body = [sentence() for _ in range(3 + rng.below(5))]
    if rng.chance(50):
        ending = f"At night {lower} sleeps and dreams of the {thing}."
    else:
        ending = "The end."
    return " ".join([first] + body + [ending])


def generate(n_bytes, seed):
    rng = SplitMix64(seed)
    lines, size = [], 0
    while size < n_bytes:
        line = story(rng) + "\n"
        lines.append(line)
        size += len(line)
    return "".join(lines)


def main():
    parser = argparse.ArgumentParser(description="Generate trident's tiny English-like corpus.")
    parser.add_argument("--bytes", type=int, default=1_100_000,
                        help="stop after the story that reaches this many bytes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("-o", "--output", help="text file to write (default: stdout)")
    args = parser.parse_args()
    text = generate(args.bytes, args.seed).encode("ascii")
    if args.output:
        with open(args.output, "wb") as f:
            f.write(text)
        stories = text.count(b"\n")
        print(f"wrote {args.output}: {len(text)} bytes, {stories} stories", file=sys.stderr)
    else:
        sys.stdout.buffer.write(text)


if __name__ == "__main__":
    main()
