#!/usr/bin/env bash
# Formats trident's tracked C++ and CUDA files with clang-format 14 and the repository's
# .clang-format, in place.
#   tools/format.sh [FILE...]          format every tracked source file (or only FILEs)
#   tools/format.sh --check [FILE...]  change nothing; exit 1 listing each file clang-format
#                                      would change and each line over 100 columns
# (tools/check-format.sh is the second form.) Exit 2: clang-format 14 is missing.
# CLANG_FORMAT=/path/to/clang-format picks the binary; it must still be version 14, since
# another version formats the same file differently.
set -euo pipefail
cd "$(dirname "$0")/.."

max_columns=100
patterns=('*.h' '*.hpp' '*.cpp' '*.cc' '*.cu' '*.cuh')
excluded='^tests/fuzz/corpus/'  # fuzz inputs, not code

check=0
if [ "${1:-}" = --check ]; then
  check=1
  shift
fi

major_version() {  # BINARY: prints its major version ("Debian clang-format version 14.0.6")
  "$1" --version 2>/dev/null | sed -n 's/.*clang-format version \([0-9]*\).*/\1/p' | head -n 1
}

find_clang_format() {
  local candidates=(clang-format-14 clang-format) c path
  [ -n "${CLANG_FORMAT:-}" ] && candidates=("$CLANG_FORMAT")
  for c in "${candidates[@]}"; do
    path=$(command -v "$c" 2>/dev/null) || continue
    if [ "$(major_version "$path")" = 14 ]; then
      echo "$path"
      return 0
    fi
  done
  echo "format: clang-format 14 not found (tried ${candidates[*]}); install Debian's" \
       "clang-format package (apt-get install clang-format, or bash tools/setup.sh)" >&2
  return 1
}

clang_format=$(find_clang_format) || exit 2
if [ ! -f .clang-format ]; then
  echo "format: no .clang-format at the repository root" >&2
  exit 2
fi

# The files: the arguments, or every tracked file matching the patterns.
files=()
if [ $# -gt 0 ]; then
  files=("$@")
else
  while IFS= read -r -d '' f; do
    [[ $f =~ $excluded ]] || [ ! -f "$f" ] || files+=("$f")
  done < <(git ls-files -z -- "${patterns[@]}")
fi
[ ${#files[@]} -gt 0 ] || exit 0

if [ $check -eq 0 ]; then
  printf '%s\0' "${files[@]}" | xargs -0 "$clang_format" -i --style=file
  echo "format: formatted ${#files[@]} files with $clang_format"
  exit 0
fi

failed=0

# clang-format's verdict: each finding is "path:line:col: error: code should be clang-formatted".
# The first three per file are shown, with the line as it stands.
rc=0
out=$(printf '%s\0' "${files[@]}" |
      xargs -0 "$clang_format" --dry-run --Werror --style=file 2>&1 >/dev/null) || rc=$?
findings=$(sed -n 's/^\(.*\):\([0-9]*\):[0-9]*: error: code should be clang-formatted.*/\1:\2/p' \
           <<<"$out" | uniq)
if [ $rc -ne 0 ] && [ -z "$findings" ]; then  # it failed for another reason: a bad config, ...
  echo "check-format: $clang_format failed:" >&2
  head -n 20 <<<"$out" >&2
  exit 2
fi
if [ -n "$findings" ]; then
  failed=1
  unformatted=$(cut -d: -f1 <<<"$findings" | uniq)
  echo "check-format: $(wc -l <<<"$unformatted") file(s) differ from clang-format's layout" \
       "(tools/format.sh fixes them):"
  while IFS= read -r f; do
    echo "  $f"
    awk -F: -v f="$f" '$1 == f && n++ < 3' <<<"$findings" |
      while IFS=: read -r path line; do
        printf '    %s:%s: %s\n' "$path" "$line" "$(sed -n "${line}p" "$path")"
      done
  done <<<"$unformatted"
fi

# Lines over the limit, counted in characters (C.UTF-8): clang-format does not break a long
# string literal without spaces, a URL, or a comment line that cites a Note (.clang-format).
long=$(printf '%s\0' "${files[@]}" |
       LC_ALL=C.UTF-8 xargs -0 grep -n -H -- ".\{$((max_columns + 1)),\}" || true)
if [ -n "$long" ]; then
  failed=1
  echo "check-format: $(wc -l <<<"$long") line(s) over $max_columns columns (shorten by hand):"
  cut -d: -f1,2 <<<"$long" | sed 's/^/  /'
fi

[ $failed -eq 0 ] && echo "check-format: ${#files[@]} files clean ($clang_format)"
exit $failed
