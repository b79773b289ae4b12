#!/usr/bin/python3
"""Draws the predicted step split of `trident plan --json` layouts as stacked bars.

    trident plan DECK --hardware H --gpus N --json > plan.jsonl
    tools/plot_plan.py plan.jsonl --out plan.png        (trident plan --png does both)

One bar per layout (in the file's order, best first), one colour per time term (seconds per
step), the layout and its predicted tokens/s under the bar.
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def label(p):
    first = f"dp{p['dp']} tp{p['tp']} pp{p['pp']}" + (f" v{p['v']}" if p["v"] > 1 else "")
    zero = f"zero{p['zero']}"
    if p["zero"] == 3 and p.get("dp_replicate", 1) > 1:  # HSDP: replicas × shard group
        zero += f" {p['dp_replicate']}x{p['dp_shard']}"
    second = [f"mb{p['micro_batch']}", zero]
    if p["recompute"] != "none":
        second.append(f"rc {p['recompute']}")
    lines = [first, " ".join(second)]
    if p["pp"] > 1:
        lines.append(p["schedule"])
    return "\n".join(lines) + f"\n{p['tokens_per_s']:.3g} tok/s"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("jsonl", help="trident plan --json output (one layout per line)")
    ap.add_argument("--out", required=True, help="PNG to write")
    args = ap.parse_args()
    layouts = []
    with open(args.jsonl) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                layouts.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"plot_plan.py: {args.jsonl}:{n}: not JSON ({e})")
    if not layouts:
        sys.exit(f"plot_plan.py: {args.jsonl}: no layouts")
    terms = []
    for p in layouts:
        for k in p["time_s"]:
            if k not in terms:
                terms.append(k)
    terms = [t for t in terms if any(p["time_s"].get(t, 0) > 0 for p in layouts)]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(layouts)), 5))
    bottoms = [0.0] * len(layouts)
    cmap = plt.get_cmap("tab20")
    for i, t in enumerate(terms):
        values = [p["time_s"].get(t, 0.0) for p in layouts]
        ax.bar(range(len(layouts)), values, bottom=bottoms, label=t, color=cmap(i % 20))
        bottoms = [b + v for b, v in zip(bottoms, values)]
    ax.set_xticks(range(len(layouts)))
    ax.set_xticklabels([label(p) for p in layouts], fontsize=7)
    ax.set_ylabel("predicted seconds per step")
    hw = layouts[0].get("hardware", "")
    ax.set_title(f"trident plan: predicted step split ({hw})")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"plot_plan.py: wrote {args.out}")


if __name__ == "__main__":
    main()
