#!/usr/bin/env python3
"""Checks the Note convention of trident's sources.

A Note is defined once by a comment line whose whole text is the word Note followed by
its title in square brackets (C, C++ and CUDA: after //; shell, Python and CMake: after #).
Its body is the run of comment lines right after it, up to the first line that is not a
comment or is an empty comment. Everywhere else the same text cites it, optionally followed
by "in PATH" (a file that must define it). The rules are listed where check() checks them.
Scanned: the source folders below, and the root's CMakeLists.txt.

Usage: python3 tools/check_notes.py [--root DIR] [--self-test]

Reports each problem as path:line: message and exits 1 if there is any; otherwise prints a
one-line summary and exits 0. --self-test runs the checker on synthetic files, one per kind
of problem, plus a clean one, and exits 0 when every problem is found and the clean tree passes.
"""

import argparse
import os
import re
import sys
import tempfile

SCANNED_DIRS = ("src", "include", "kernels", "tests", "tools", "examples")
SCANNED_TOP_FILES = ("CMakeLists.txt",)  # files at the root that define Notes too
C_LIKE = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
HASH_LIKE = (".sh", ".py", ".cmake", ".cmake.in")
SKIPPED_DIRS = ("tests/fuzz/corpus",)
MAX_BODY_LINES = 8

# The marker and document names are spelled in pieces so this file passes its own check.
WORD = "Note"
DOCS = "docs" + "/"
DESIGN_DOC = DOCS + "design" + ".md"
OPEN = WORD + " ["
TITLE_RE = re.compile(WORD + r" \[([^\]\n]+)\]")
SPLIT_WORD_RE = re.compile(r"\b" + WORD + r"\s*$")
IN_PATH_RE = re.compile(WORD + r" \[([^\]\n]+)\]\s+in(?:\s+(\S+)|\s*$)")
PATH_LIKE_RE = re.compile(r"^[\w.+-]+(/[\w.+-]+)*\.(h|hpp|cpp|cc|cu|cuh|sh|py|cmake|in|txt)$")
DESIGN_RE = re.compile(r"design\.md", re.IGNORECASE)
DOCS_RE = re.compile(r"docs/[\w./-]*?\.md")


def comment_marker(path):
    name = os.path.basename(path)
    if name.endswith(C_LIKE):
        return "//"
    if name.endswith(HASH_LIKE) or name == "CMakeLists.txt":
        return "#"
    return None


def scanned_files(root):
    """Source files under the scanned folders, and the scanned files at the root, as paths
    relative to root, sorted."""
    found = [f for f in SCANNED_TOP_FILES if os.path.isfile(os.path.join(root, f))]
    for top in SCANNED_DIRS:
        base = os.path.join(root, top)
        if not os.path.isdir(base):
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
            dirnames[:] = sorted(
                d for d in dirnames
                if not d.startswith((".", "build")) and d != "__pycache__"
                and f"{rel_dir}/{d}" not in SKIPPED_DIRS)
            for f in filenames:
                if comment_marker(f):
                    found.append(f"{rel_dir}/{f}")
    return sorted(found)


def comment_text(line, marker):
    """The text after the comment marker, or None if the line is not a comment line."""
    s = line.strip()
    if not s.startswith(marker):
        return None
    return s[len(marker):].strip()


def definition_title(line, marker):
    text = comment_text(line, marker)
    if text is None:
        return None
    m = TITLE_RE.fullmatch(text)
    return m.group(1) if m else None


class Checker:
    def __init__(self, root):
        self.root = root
        self.problems = []  # (path, line, message)
        self.files = {}  # path -> list of lines
        self.definitions = {}  # title -> [(path, line)]
        self.citations = []  # (path, line, title)
        self.in_path = []  # (path, line, title, cited path)

    def report(self, path, line, message):
        self.problems.append((path, line, message))

    def load(self):
        for path in scanned_files(self.root):
            with open(os.path.join(self.root, path), encoding="utf-8", errors="replace") as f:
                self.files[path] = f.read().split("\n")

    def scan_file(self, path, lines):
        marker = comment_marker(path)
        defined_here = {}  # line index -> title
        for i, line in enumerate(lines):
            title = definition_title(line, marker)
            if title is not None:
                defined_here[i] = title
        for i, title in defined_here.items():
            self.definitions.setdefault(title, []).append((path, i + 1))
            body = 0
            for j in range(i + 1, len(lines)):
                text = comment_text(lines[j], marker)
                if text is None or text == "" or j in defined_here:
                    break
                body += 1
            if body == 0:
                self.report(path, i + 1, f"{OPEN}{title}] has an empty body")
            elif body > MAX_BODY_LINES:
                self.report(path, i + 1, f"{OPEN}{title}] has a body of {body} lines "
                                         f"(at most {MAX_BODY_LINES})")
        for i, line in enumerate(lines):
            n = i + 1
            # 1. A title split across lines, or the word split from its bracket.
            start = 0
            while True:
                k = line.find(OPEN, start)
                if k < 0:
                    break
                if "]" not in line[k:]:
                    self.report(path, n, "a Note's title is split across lines")
                start = k + len(OPEN)
            if SPLIT_WORD_RE.search(line) and i + 1 < len(lines):
                nxt = comment_text(lines[i + 1], marker)
                if nxt is not None and nxt.startswith("["):
                    self.report(path, n, "a Note's name is split from its title across lines")
            if i not in defined_here:
                for m in TITLE_RE.finditer(line):
                    self.citations.append((path, n, m.group(1)))
            for m in IN_PATH_RE.finditer(line):
                cited = m.group(2)
                if cited is None and i + 1 < len(lines):
                    nxt = comment_text(lines[i + 1], marker)
                    cited = nxt.split()[0] if nxt else None
                if cited:
                    cited = cited.rstrip(").,;:'\"")
                    if PATH_LIKE_RE.match(cited):
                        self.in_path.append((path, n, m.group(1), cited))
            # 6. The design document's name, and documents that do not exist.
            for m in DESIGN_RE.finditer(line):
                if line[max(0, m.start() - 5):m.end()] != DESIGN_DOC:
                    self.report(path, n, f"'{line[max(0, m.start() - 5):m.end()]}': "
                                         f"the design document is {DESIGN_DOC}")
            for m in DOCS_RE.finditer(line):
                if not os.path.isfile(os.path.join(self.root, m.group(0))):
                    self.report(path, n, f"{m.group(0)} does not exist")

    def resolve(self, citing, cited):
        """Candidate files for a cited path: as given, under src/ or include/, or beside the
        citing file."""
        here = os.path.dirname(citing)
        candidates = [cited, f"src/{cited}", f"include/{cited}", f"include/trident/{cited}",
                      f"{here}/{cited}"]
        return [c for c in candidates if os.path.isfile(os.path.join(self.root, c))]

    def check(self):
        self.load()
        for path, lines in self.files.items():
            self.scan_file(path, lines)
        # 3. Defined more than once.
        for title, places in self.definitions.items():
            first = places[0]
            for path, n in places[1:]:
                self.report(path, n, f"{OPEN}{title}] is defined again "
                                     f"(first at {first[0]}:{first[1]})")
        # 4. Cited but never defined.
        lower = {t.lower(): t for t in self.definitions}
        for path, n, title in self.citations:
            if title not in self.definitions:
                hint = ""
                if title.lower() in lower:
                    hint = f" (did you mean {OPEN}{lower[title.lower()]}]?)"
                self.report(path, n, f"{OPEN}{title}] is cited but never defined{hint}")
        # 5. A citation "in PATH": PATH exists and defines the title.
        for path, n, title, cited in self.in_path:
            found = self.resolve(path, cited)
            if not found:
                self.report(path, n, f"{OPEN}{title}] is cited in {cited}, which does not exist")
            elif not any(p == cited_def for cited_def in found
                         for p, _ in self.definitions.get(title, [])):
                self.report(path, n, f"{OPEN}{title}] is cited in {cited}, which does not "
                                     "define it")
        self.problems.sort()
        return self.problems


def run(root):
    checker = Checker(root)
    problems = checker.check()
    for path, n, message in problems:
        print(f"{path}:{n}: {message}")
    if problems:
        print(f"check_notes: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    defined = sum(len(v) for v in checker.definitions.values())
    print(f"check_notes: {defined} notes, {len(checker.citations)} citations in "
          f"{len(checker.files)} files: ok")
    return 0


def self_test():
    """Each kind of problem in a synthetic tree must be reported; a clean tree must pass."""
    N = OPEN  # the marker, so the snippets below read close to real sources

    clean = {
        "src/a/rule.cpp": (
            f"// {N}Ordered sends]\n"
            "// Every rank posts its sends in the same order: MPI matches them by order.\n"
            "//\n"
            "int f();\n"
            f"int g();  // {N}Ordered sends]\n"),
        "include/trident/api.h": (
            f"// Sends in order ({N}Ordered sends] in a/rule.cpp); see {DOCS}perf.md.\n"
            f"// Also ({N}Ordered sends] in src/a/rule.cpp) and {DESIGN_DOC}.\n"),
        "tools/x.py": (
            f"# {N}Python rule]\n"
            "# A rule in a script.\n"
            f"x = 1  # {N}Python rule]\n"),
        "CMakeLists.txt": (
            f"# {N}Top-level rule]\n"
            "# A rule in the root's CMakeLists.txt.\n"
            "option(X \"x\" OFF)\n"),
        "tools/cmake/pkgConfig.cmake.in": (
            f"# ({N}Top-level rule] in CMakeLists.txt) and ({N}Template rule] there)\n"
            f"# {N}Template rule]\n"
            "# A rule in a package template.\n"),
        "tests/use.sh": f"# {N}Top-level rule] and ({N}Template rule] in "
                        "tools/cmake/pkgConfig.cmake.in)\n",
        DOCS + "perf.md": "figures\n",
        DESIGN_DOC: "design\n",
        "tests/fuzz/corpus/seed": f"{N}Never looked at\n",
        "build/gen.h": f"// {N}Never looked at\n",
    }
    bad = {
        "src/split.cpp": f"// see {N}Split\n// title] here\n",
        "src/split_word.cpp": f"// see {WORD}\n// [Split word] here\n",
        "src/long.cpp": f"// {N}Long]\n" + "// line\n" * 9 + "int x;\n",
        "src/empty.cpp": f"// {N}Empty]\nint y;\n",
        "src/empty2.cpp": f"// {N}Empty after blank]\n//\n// text\n",
        "src/dup1.cpp": f"// {N}Twice]\n// rule\n",
        "src/dup2.h": f"  // {N}Twice]\n  // rule\n",
        "src/cite.cpp": f"int z;  // {N}Nowhere]\n",
        "src/cite_in.cpp": (f"// ({N}Twice] in src/missing.h)\n"
                            f"// ({N}Twice] in src/long.cpp)\n"),
        "src/cite_in2.cpp": f"// ({N}Twice] in\n// src/other.cpp)\n",
        "src/other.cpp": "int w;\n",
        "src/design.cpp": "// see " + DESIGN_DOC[len(DOCS):].upper() + "\n",
        "src/docs.cpp": f"// see {DOCS}nothing.md\n",
        "tools/s.sh": f"# {N}Shell long]\n" + "# line\n" * 9,
        "CMakeLists.txt": (f"# {N}Top-level rule]\n# A rule.\n"
                           f"# {N}Top long]\n" + "# line\n" * 9),
        "tools/t.cmake.in": f"# ({N}Template rule] in CMakeLists.txt)\n",
    }
    expected = [
        ("src/split.cpp", 1, "split across lines"),
        ("src/split_word.cpp", 1, "split from its title"),
        ("src/long.cpp", 1, "body of 9 lines"),
        ("src/empty.cpp", 1, "empty body"),
        ("src/empty2.cpp", 1, "empty body"),
        ("src/dup2.h", 1, "defined again (first at src/dup1.cpp:1)"),
        ("src/cite.cpp", 1, "Nowhere] is cited but never defined"),
        ("src/cite_in.cpp", 1, "src/missing.h, which does not exist"),
        ("src/cite_in.cpp", 2, "src/long.cpp, which does not define it"),
        ("src/cite_in2.cpp", 1, "src/other.cpp, which does not define it"),
        ("src/design.cpp", 1, f"the design document is {DESIGN_DOC}"),
        ("src/docs.cpp", 1, f"{DOCS}nothing.md does not exist"),
        ("tools/s.sh", 1, "body of 9 lines"),
        ("CMakeLists.txt", 3, "body of 9 lines"),
        ("tools/t.cmake.in", 1, "CMakeLists.txt, which does not define it"),
    ]

    def make_tree(files):
        d = tempfile.mkdtemp(prefix="check_notes_")
        for rel, text in files.items():
            p = os.path.join(d, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w", encoding="utf-8") as f:
                f.write(text)
        return d

    failures = []
    clean_problems = Checker(make_tree(clean)).check()
    for p in clean_problems:
        failures.append(f"clean tree reported {p}")
    checker = Checker(make_tree({**clean, **bad}))
    problems = checker.check()
    for title in ("Ordered sends", "Top-level rule", "Template rule"):
        if len(checker.definitions.get(title, [])) != 1:
            failures.append(f"the clean definition of {title} was not found")
    for path, n, fragment in expected:
        if not any(p == path and ln == n and fragment in m for p, ln, m in problems):
            failures.append(f"not reported: {path}:{n}: ...{fragment}...")
    unexpected = [p for p in problems
                  if not any(p[0] == e[0] and p[1] == e[1] for e in expected)]
    for p in unexpected:
        failures.append(f"unexpected report {p}")
    for f in failures:
        print("self-test: " + f, file=sys.stderr)
    if failures:
        return 1
    print(f"check_notes self-test: {len(expected)} problems found, clean tree passes: ok")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--root", default=default_root,
                        help="the repository (default: %(default)s)")
    parser.add_argument("--self-test", action="store_true", help="check the checker")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    return run(args.root)


if __name__ == "__main__":
    sys.exit(main())
