#!/usr/bin/env python3
"""The planner's GEMM curve from a measurement on the machine (issue 45, part 4).

usage: gemm_curve.py BENCH_JSON [--hardware FILE] [--device NAME]

BENCH_JSON is Google Benchmark's JSON output of bench_kernels' BM_gemm_curve
(tests/cuda/bench_gemm_curve.cpp: the CUDA backend's bf16 GEMM with two dimensions 4096 and the
third, min_dim, in each of three places), as tools/gpu-check.sh writes it. For each min_dim the
point is the mean TFLOP/s of the places measured. Prints the `gemm:` list; with --hardware,
rewrites that hardware file's `gemm:` list in place and adds a line to its `sources:` saying
where the points came from, so that `trident plan --hardware FILE` uses the measured curve.
Exits 1 naming the problem when the file holds no measured point (every run failed or skipped).
"""
import argparse
import datetime
import json
import re
import sys


def points(bench):
    by_dim = {}
    for b in bench.get("benchmarks", []):
        if not b.get("name", "").startswith("BM_gemm_curve/") or b.get("error_occurred"):
            continue
        if "min_dim" not in b or "TFLOP/s" not in b:
            continue
        by_dim.setdefault(int(b["min_dim"]), []).append(float(b["TFLOP/s"]))
    return {d: sum(v) / len(v) for d, v in sorted(by_dim.items())}, by_dim


def gemm_lines(curve):
    return ["gemm:"] + [f"  - {{min_dim: {d}, tflops: {t:.0f}}}" for d, t in curve.items()]


def rewrite(path, curve, source):
    lines = open(path).read().splitlines()
    try:
        start = lines.index("gemm:")
    except ValueError:
        sys.exit(f"gemm_curve.py: {path} has no 'gemm:' list to replace")
    end = start + 1
    while end < len(lines) and lines[end].startswith("  - {min_dim:"):
        end += 1
    lines[start:end] = gemm_lines(curve)
    if "sources:" not in lines:
        lines.append("sources:")
    # The sources list is the file's last block: the new line goes at its end.
    lines.append(f'  - "{source}"')
    open(path, "w").write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_json")
    ap.add_argument("--hardware", help="a hardware yaml whose gemm: list to replace")
    ap.add_argument("--device", default="", help="the device's name, for the sources line")
    a = ap.parse_args()
    try:
        bench = json.load(open(a.bench_json))
    except (OSError, ValueError) as e:
        sys.exit(f"gemm_curve.py: cannot read {a.bench_json}: {e}")
    curve, by_dim = points(bench)
    if not curve:
        errors = [b.get("error_message", "") for b in bench.get("benchmarks", [])
                  if b.get("error_occurred")]
        why = f" (first error: {errors[0]})" if errors else ""
        sys.exit(f"gemm_curve.py: {a.bench_json} holds no measured BM_gemm_curve point{why}")
    print("\n".join(gemm_lines(curve)))
    if a.hardware:
        places = ", ".join(f"{d}: {len(v)}" for d, v in by_dim.items())
        when = datetime.date.today().isoformat()
        source = (f"gemm: MEASURED by tools/gpu-check.sh on {a.device or 'the check machine'}, "
                  f"{when}: bench_kernels BM_gemm_curve (matmul_forward_bf16, cuBLASLt, two "
                  f"dimensions 4096), the mean TFLOP/s of the places measured per min_dim "
                  f"({places}); replaces the points the lines above describe")
        rewrite(a.hardware, curve, re.sub(r'"', "'", source))
        print(f"gemm_curve.py: {a.hardware}: gemm: replaced by {len(curve)} measured points")


if __name__ == "__main__":
    main()
