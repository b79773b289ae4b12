#!/usr/bin/python3
"""Draws the largest model that fits per device count at ZeRO 0, 1, 2 and 3.

    tools/plot_zero_capacity.py --trident build/trident [--deck inputs/llama-3-8b.yaml]
        [--hardware dgx-h100] [--memory-gb 80] [--gpus 1024] --out docs/img/zero_capacity.png

Rajbhandari et al. 2020 (ZeRO), Figure 1 and Table 1, from trident's planner: the numbers come
from `trident plan DECK --zero-capacity --json` (zero_capacity in src/plan/memory.cpp, the
memory model the plans use), never computed here. The model is the deck's block and width with
its layers scaled to fit; the bytes are the model states per rank (parameters, gradients,
optimizer state and ZeRO-3's gathered pool), no activations, as in the paper's figure.
"""
import argparse
import json
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def capacity(args):
    cmd = [args.trident, "plan", args.deck, "--hardware", args.hardware, "--zero-capacity",
           "--json", "--gpus", str(args.gpus)]
    if args.memory_gb:
        cmd += ["--memory-gb", str(args.memory_gb)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"plot_zero_capacity.py: {' '.join(cmd)} exited {run.returncode}:\n{run.stderr}")
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
    if not rows:
        sys.exit(f"plot_zero_capacity.py: {' '.join(cmd)} printed nothing")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trident", default="build/trident", help="the trident binary")
    ap.add_argument("--deck", default="inputs/llama-3-8b.yaml", help="the model's block and width")
    ap.add_argument("--hardware", default="dgx-h100", help="trident plan --hardware")
    ap.add_argument("--memory-gb", type=float, default=80, help="one device's memory (GB)")
    ap.add_argument("--gpus", type=int, default=1024, help="the most devices (1, 2, 4, ... up to it)")
    ap.add_argument("--out", required=True, help="PNG to write")
    args = ap.parse_args()
    rows = capacity(args)
    fig, ax = plt.subplots(figsize=(7, 4.8))
    for zero in sorted({r["zero"] for r in rows}):
        mine = sorted((r for r in rows if r["zero"] == zero), key=lambda r: r["devices"])
        ax.plot([r["devices"] for r in mine], [r["params"] / 1e9 for r in mine], marker="o",
                label=f"ZeRO-{zero}" if zero else "ZeRO-0 (DDP)")
        last = mine[-1]
        ax.annotate(f"{last['params'] / 1e9:,.0f}B" if last["params"] >= 1e11
                    else f"{last['params'] / 1e9:.3g}B", (last["devices"], last["params"] / 1e9),
                    textcoords="offset points", xytext=(4, -3), fontsize=8)
    r0 = rows[0]
    ax.set_xscale("log", base=2)
    devices = sorted({r["devices"] for r in rows})
    ax.set_xticks(devices)
    ax.set_xticklabels([str(d) for d in devices])
    ax.set_yscale("log")
    ax.set_xlabel("devices (data parallel)")
    ax.set_ylabel("largest model that fits (billion parameters)")
    ax.set_title(f"Model states in {r0['memory_gb']:.0f} GB per device ({r0['hardware']}, "
                 f"{r0['dtype']}), no activations\n{args.deck.split('/')[-1]}'s block, "
                 f"d_model {r0['d_model']}, its layers scaled to fit", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"plot_zero_capacity.py: wrote {args.out}")
    for r in rows:
        if r["devices"] in (1, 8, 64, 1024):
            print(f"  zero {r['zero']} devices {r['devices']:>5}: {r['params'] / 1e9:8.3g} B "
                  f"parameters ({r['layers']} layers, {r['model_states_gb_per_rank']:.3g} GB)")


if __name__ == "__main__":
    main()
