#!/usr/bin/python3
"""Draws one training step of trident Chrome traces as a PNG timeline.

  tools/plot_trace.py runs/bench-overlap/trace.rank0.json [trace.rank1.json ...] \
      --step -1 --out docs/img/overlap-on.png --title "overlap on"

For each rank: one row for compute (forward/backward per block, zb-h1's weight passes,
optimizer) and one for the all-reduces (each bucket a bar); a pipeline's bubble is the blank. --step picks the step by its optimizer span (-1: the last).
Needs Debian's python3-matplotlib (run with /usr/bin/python3).
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"forward": "#4c78a8", "backward": "#f58518", "weight": "#e45756", "optimizer": "#54a24b",
          "comm": "#b279a2"}
LABELS = ["forward", "backward (B with zb-h1)", "weight gradients (W, zb-h1)", "optimizer",
          "all-reduce"]


def load(path):
    """(thread names by tid, complete events) of a Chrome trace; exits naming the file if it
    is not one."""
    try:
        with open(path) as f:
            trace = json.load(f)
        events = trace["traceEvents"]
        threads = {}
        for e in events:
            if e.get("ph") == "M" and e.get("name") == "thread_name":
                threads[e["tid"]] = e["args"]["name"]
        spans = [e for e in events if e.get("ph") == "X"]
        for e in spans:
            e["ts"], e["dur"], e["tid"] = float(e["ts"]), float(e["dur"]), int(e["tid"])
            e["name"] = str(e["name"])
    except OSError as e:
        raise SystemExit(f"{path}: cannot read: {e.strerror}")
    except json.JSONDecodeError as e:
        raise SystemExit(f"{path}: not JSON ({e}): is it a trace written by log.trace?")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SystemExit(f"{path}: not a Chrome trace (no traceEvents list with named tracks "
                         f"and ts/dur/tid spans: {e!r})")
    return threads, spans


def step_window(path, spans, step):
    """[begin, end) in microseconds of training step `step` (0-based; negative from the end)."""
    opts = sorted((e for e in spans if e["name"] == "optimizer"), key=lambda e: e["ts"])
    if not opts:
        raise SystemExit(f"{path}: no optimizer spans: is it a trident training trace?")
    if not -len(opts) <= step < len(opts):
        raise SystemExit(f"{path}: no step {step}: the trace has {len(opts)} steps "
                         f"(--step 0..{len(opts) - 1}, or -1 for the last)")
    index = step if step >= 0 else len(opts) + step
    end = opts[index]["ts"] + opts[index]["dur"]
    begin = opts[index - 1]["ts"] + opts[index - 1]["dur"] if index > 0 else 0.0
    return begin, end


def color(name, category):
    if category == "comm":
        return COLORS["comm"]
    for key in ("forward", "backward", "weight", "optimizer"):
        if name.startswith(key):
            return COLORS[key]
    return "#999999"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--step", type=int, default=-1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="")
    args = ap.parse_args()

    rows = []
    for path in args.traces:
        threads, spans = load(path)
        begin, end = step_window(path, spans, args.step)
        rank = spans[0]["pid"] if spans else 0
        for tid in sorted(threads):
            mine = [e for e in spans if e["tid"] == tid and e["ts"] >= begin and e["ts"] < end]
            rows.append((f"rank {rank} {threads[tid]}", mine, begin))
    fig, ax = plt.subplots(figsize=(12, 0.6 * len(rows) + 1.2))
    for i, (label, spans, begin) in enumerate(rows):
        y = len(rows) - 1 - i
        for e in spans:
            start_ms = (e["ts"] - begin) / 1e3
            ax.barh(y, e["dur"] / 1e3, left=start_ms, height=0.6,
                    color=color(e["name"], e.get("cat", "")), edgecolor="white", linewidth=0.5)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in reversed(rows)])
    ax.set_xlabel("time since the step began (ms)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, LABELS, loc="upper left", ncol=5, fontsize=8)
    ax.set_title(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
