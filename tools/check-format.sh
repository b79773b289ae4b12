#!/usr/bin/env bash
# Fails (exit 1) when a tracked C++ or CUDA file is not as clang-format 14 would lay it out with
# .clang-format, or has a line over 100 columns; lists the files and the first offending lines.
# Exit 2: clang-format 14 is missing (Debian's clang-format package). Arguments: FILEs to check
# instead of every tracked one. The check lives in tools/format.sh (--check).
exec bash "$(dirname "$0")/format.sh" --check "$@"
