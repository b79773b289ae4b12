#!/usr/bin/python3
"""Draws training curves of one or more trident runs into one PNG, to compare them.

  tools/plot_metrics.py runs/a/metrics.jsonl runs/b/metrics.jsonl --out compare.png
  tools/plot_metrics.py runs/*/metrics.jsonl --labels "lr 3e-3,lr 1e-3" --title "gpt-tiny"

Four panels against the step: training loss, validation loss (the steps that validated),
tokens/s and MFU, one line per file. A line is labelled with the run's name (the directory of
a metrics.jsonl, else the file name; --labels overrides, comma-separated, in file order).
Reads what `trident train` and `trident bench` write to log.jsonl (one JSON object per step):
a step written twice (a resumed run appends) keeps its last record; skipped steps
("skipped": true) have no loss, warm-up steps of bench ("timed": false) no speed, and an
"mfu" of null (trident refused to report it) leaves a gap. Needs Debian's
python3-matplotlib (run with /usr/bin/python3).
"""
import argparse
import json
import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# (field, panel title, y label, scale)
PANELS = [("loss", "training loss", "loss", 1.0),
          ("val_loss", "validation loss", "loss", 1.0),
          ("tokens_per_s", "throughput", "tokens/s", 1.0),
          ("mfu", "model FLOPs utilisation", "MFU (%)", 100.0)]


def number(value):
    """A finite float, or None (null, NaN, missing, not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def load(path):
    """{step: record} of a metrics.jsonl; exits naming the file and line if it is not one."""
    records = {}
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SystemExit(f"{path}:{n}: not JSON ({e}): is it a trident metrics.jsonl?")
                if not isinstance(r, dict) or not isinstance(r.get("step"), int):
                    raise SystemExit(f"{path}:{n}: a record without an integer \"step\": is it a "
                                     f"trident metrics.jsonl?")
                records[r["step"]] = r
    except OSError as e:
        raise SystemExit(f"{path}: cannot read: {e.strerror}")
    if not records:
        raise SystemExit(f"{path}: no step records")
    return records


def series(records, field):
    """(steps, values) of one field, leaving out steps without a value."""
    steps, values = [], []
    for step in sorted(records):
        r = records[step]
        if field in ("loss", "val_loss") and r.get("skipped"):
            continue
        if field in ("tokens_per_s", "mfu") and r.get("timed") is False:
            continue
        v = number(r.get(field))
        if v is not None:
            steps.append(step)
            values.append(v)
    return steps, values


def with_gaps(records, field):
    """(steps, values) to draw: every step of the run, NaN where the field has no value so the
    line breaks there; validation loss only at the steps that validated."""
    steps, values = series(records, field)
    if field == "val_loss":
        return steps, values
    have = dict(zip(steps, values))
    return sorted(records), [have.get(step, math.nan) for step in sorted(records)]


def run_labels(paths, given):
    if given:
        labels = [s.strip() for s in given.split(",")]
        if len(labels) != len(paths):
            raise SystemExit(f"--labels has {len(labels)} names for {len(paths)} files")
        return labels
    labels = []
    for p in paths:
        parent = os.path.basename(os.path.dirname(os.path.abspath(p)))
        name = os.path.basename(p)
        labels.append(parent if name == "metrics.jsonl" and parent else os.path.splitext(name)[0])
    if len(set(labels)) < len(labels):  # two runs of the same name: say which file
        labels = [os.path.relpath(p) for p in paths]
    return labels


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics", nargs="+", help="metrics.jsonl files")
    ap.add_argument("--out", required=True, help="the PNG to write")
    ap.add_argument("--labels", help="comma-separated names, one per file")
    ap.add_argument("--title", default="")
    ap.add_argument("--dpi", type=int, default=100, help="resolution (the figure is 11 x 7 in)")
    args = ap.parse_args()

    runs = [load(p) for p in args.metrics]
    labels = run_labels(args.metrics, args.labels)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    for ax, (field, title, ylabel, scale) in zip(axes.flat, PANELS):
        drawn = 0
        for records, label in zip(runs, labels):
            if not series(records, field)[0]:
                continue
            steps, values = with_gaps(records, field)
            marker = "o" if field == "val_loss" or len(steps) < 20 else None  # sparse: points
            ax.plot(steps, [v * scale for v in values], marker=marker, markersize=3,
                    linewidth=1.2, label=label)
            drawn += 1
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, f"no {field} in these runs", ha="center", va="center",
                    transform=ax.transAxes, color="#777777")
    for ax in axes[1]:
        ax.set_xlabel("step")
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=args.dpi)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
