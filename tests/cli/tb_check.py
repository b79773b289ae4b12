"""Reads a run's TensorBoard event files with TensorBoard's own event accumulator and compares
every scalar with the run's metrics.jsonl. Run with tools/tb_venv.sh's python.

    tb_check.py equal DIR METRICS    every step of METRICS (its last record per step, as a
                                     resumed run appends) is in DIR, each once, equal
    tb_check.py prefix DIR METRICS   DIR holds steps 1..n once each (n >= 3, n >= the lines of
                                     METRICS less one: a kill between the two writes), equal
    tb_check.py bench DIR METRICS    as equal, and every number of bench.json (beside METRICS)
                                     is bench/<key> at the last step

Equal means exactly equal to the JSON number rounded to float32 (TensorBoard's simple_value
is a float32; both sides round the same double to nearest). Prints what is wrong, exit 1.
"""
import json
import math
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

# metrics.jsonl key -> TensorBoard tag, as README documents them (written out here, not read
# from trident).
TAGS = {
    "loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
    "val_loss": "val/loss",
    "tokens_per_s": "perf/tokens_per_s", "ms_per_step": "perf/ms_per_step", "mfu": "perf/mfu",
    "forward_ms": "time/forward_ms", "backward_ms": "time/backward_ms",
    "optimizer_ms": "time/optimizer_ms", "exposed_comm_ms": "time/exposed_comm_ms",
    "bubble": "time/bubble",
    "comm_ms": "comm/comm_ms", "overlap": "comm/overlap", "gather_comm_ms": "comm/gather_comm_ms",
    "gather_exposed_ms": "comm/gather_exposed_ms", "tp_comm_ms": "comm/tp_comm_ms",
    "tp_exposed_ms": "comm/tp_exposed_ms",
    "param_mib": "memory/param_mib", "grad_mib": "memory/grad_mib",
    "grad_resident_mib": "memory/grad_resident_mib", "optimizer_mib": "memory/optimizer_mib",
    "activation_mib": "memory/activation_mib",
    "ckpt_block_ms": "ckpt/block_ms", "ckpt_write_ms": "ckpt/write_ms",
    "ckpt_writing": "ckpt/writing", "ckpt_failed": "ckpt/failed",
}


def f32(x):
    import numpy
    return float(numpy.float32(x))


def main():
    mode, logdir, metrics = sys.argv[1:4]
    rows = {}
    lines = 0
    for line in open(metrics):
        r = json.loads(line)
        rows[r["step"]] = r  # a resumed run's record of a step replaces the earlier one
        lines += 1
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}
    problems = []
    loss_steps = [e.step for e in scalars.get("train/loss", [])]
    if mode in ("equal", "bench"):
        steps = sorted(rows)
        if loss_steps != steps:
            problems.append(f"train/loss steps {loss_steps}, metrics.jsonl steps {steps}")
    else:
        n = len(loss_steps)
        if loss_steps != list(range(1, n + 1)) or n < 3 or n < lines - 1:
            problems.append(f"train/loss steps {loss_steps} after a kill; metrics.jsonl has "
                            f"{lines} lines")
        steps = loss_steps
    for key, tag in TAGS.items():
        want = {s: rows[s][key] for s in steps
                if isinstance(rows[s].get(key), (int, float)) and math.isfinite(rows[s][key])}
        got = {}
        for e in scalars.get(tag, []):
            if e.step in got:
                problems.append(f"{tag}: step {e.step} shown twice")
            got[e.step] = e.value
        if not want and not got:
            continue
        if sorted(got) != sorted(want):
            problems.append(f"{tag}: steps {sorted(got)}, metrics.jsonl {sorted(want)}")
            continue
        for s in want:
            if got[s] != f32(want[s]):
                problems.append(f"{tag} step {s}: {got[s]!r}, metrics.jsonl {want[s]!r}")
    skipped = [e.step for e in scalars.get("train/skipped", []) if e.value != 0]
    if skipped != [s for s in steps if rows[s].get("skipped")]:
        problems.append(f"train/skipped is 1 at {skipped}")
    missing = [t for t in ("train/loss", "perf/tokens_per_s", "memory/param_mib")
               if t not in scalars]
    texts = acc.Tags()["tensors"]
    texts_wanted = ("run/deck",) if mode == "bench" else ("run/deck", "run/layout")
    missing += [t for t in texts_wanted if t not in texts]
    if missing:
        problems.append(f"missing tags {missing}")
    elif b"train:" not in acc.Tensors("run/deck")[0].tensor_proto.string_val[0]:
        problems.append("run/deck does not hold the deck")
    if mode == "bench":
        figures = json.load(open(metrics.rsplit("/", 1)[0] + "/bench.json"))
        for key, value in figures.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            got = [(e.step, e.value) for e in scalars.get("bench/" + key, [])]
            if got != [(steps[-1], f32(value))]:
                problems.append(f"bench/{key}: {got}, bench.json {value!r} at step {steps[-1]}")
    for p in problems[:20]:
        print(f"tb_check: {p}")
    if problems:
        sys.exit(1)
    print(f"tb_check: {len(steps)} steps, {len(scalars)} scalar tags, equal to {metrics}")


if __name__ == "__main__":
    main()
