#!/usr/bin/python3
"""Strong and weak scaling studies of one deck: every point is a `trident bench` job.

    tools/scaling_study.py run DECK --mode weak --ranks 1,2,4 --out runs/study-weak
    tools/scaling_study.py run DECK --mode strong --layouts 1x1x1,2x1x1,1x2x1,1x1x2 --out DIR
    tools/scaling_study.py plot DIR/study.csv          # draws the plots again from the CSV

A point is a layout dp x tp x pp. `--ranks 1,2,4` varies one axis (`--vary dp|tp|pp`, dp by
default); `--layouts` lists them. Weak scaling keeps the deck's per-replica batch (micro_batch x
accum), so the global batch grows with dp; strong scaling keeps the smallest point's global
batch and divides it over dp (accum first, then micro_batch). tp and pp split the model and
leave the batch alone in both modes.

Each point runs as a job: with Slurm (`--launcher slurm`, or `auto` when `sinfo` answers) it is
submitted with sbatch (jobs/slurm/bench-point.sbatch, srun inside); otherwise it runs under
mpirun (`--mpirun` gives the command before `-n`, e.g. the emulated nodes' prefix). Points run
one after another, never together, so they do not disturb each other's timing.

Output in DIR: points/<layout>/ (bench.json, metrics.jsonl, the job's log), tensorboard/<layout>/
(each point a run of `tensorboard --logdir DIR/tensorboard`: its steps, and its bench.json
figures as bench/* at the last step), study.csv (a row
per point: the layout, the medians of the timed steps from bench.json, the speedup and
efficiency against the smallest point, the step split into compute, tp communication, exposed
dp communication and pipeline bubble), study.json (what was run, on what CPU), and the plots
throughput.png (tokens/s and efficiency against ranks, with the ideal), breakdown.png (each
point's step split) and mfu.png. Efficiency = (tokens/s / tokens/s of the first point) /
(ranks / ranks of the first point), for weak and strong scaling alike.
"""
import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = [
    "point", "ranks", "dp", "tp", "pp", "threads", "micro_batch", "accum", "tokens_per_step",
    "ms_per_step", "tokens_per_s", "speedup", "ideal_speedup", "efficiency",
    "forward_ms", "backward_ms", "optimizer_ms", "compute_ms", "tp_comm_ms", "exposed_comm_ms",
    "bubble_ms", "comm_ms", "overlap", "comm_cpu_ms", "mfu", "timed_steps", "blas_core",
    "launcher", "job", "metrics",
]


def die(msg):
    print(f"scaling_study: {msg}", file=sys.stderr)
    sys.exit(2)


def parse_layouts(args):
    if args.layouts:
        out = []
        for item in args.layouts.split(","):
            try:
                dp, tp, pp = (int(x) for x in item.lower().split("x"))
            except ValueError:
                die(f"--layouts: '{item}' is not DPxTPxPP (e.g. 2x1x1)")
            if min(dp, tp, pp) < 1:
                die(f"--layouts: '{item}' has a size below 1")
            out.append((dp, tp, pp))
        return out
    try:
        ranks = [int(r) for r in args.ranks.split(",")]
    except ValueError:
        die(f"--ranks: '{args.ranks}' is not a list of integers")
    axis = {"dp": 0, "tp": 1, "pp": 2}[args.vary]
    out = []
    for r in ranks:
        layout = [1, 1, 1]
        layout[axis] = r
        out.append(tuple(layout))
    return out


def deck_batch(deck, sets):
    """The deck's train.micro_batch and train.accum after the --set overrides."""
    import yaml  # Debian's python3-yaml
    with open(deck) as f:
        data = yaml.safe_load(f) or {}
    train = data.get("train", {}) or {}
    mb, accum = int(train.get("micro_batch", 1)), int(train.get("accum", 1))
    for s in sets:
        key, _, value = s.partition("=")
        if key == "train.micro_batch":
            mb = int(value)
        elif key == "train.accum":
            accum = int(value)
    return mb, accum


def point_batches(mode, layouts, mb, accum):
    """(micro_batch, accum) per point: weak keeps them, strong divides the global batch."""
    if mode == "weak":
        return [(mb, accum) for _ in layouts]
    dp0 = layouts[0][0]
    out = []
    for dp, tp, pp in layouts:
        samples = mb * accum * dp0  # the global batch, in samples
        if samples % dp != 0:
            die(f"strong scaling: the global batch of {samples} samples (micro_batch {mb} x accum "
                f"{accum} x dp {dp0}) does not divide over dp {dp}")
        per_replica = samples // dp
        # Keep the micro-batch (and its GEMM shapes) while it fits; else one smaller micro-batch.
        out.append((mb, per_replica // mb) if per_replica % mb == 0 else (per_replica, 1))
    return out


def slurm_available():
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (subprocess.TimeoutExpired, OSError):
        return False


def cpu_model():
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def bench_args(args, layout, batch, out_dir):
    dp, tp, pp = layout
    mb, accum = batch
    # Each point is its own TensorBoard run, DIR/tensorboard/<layout>, side by side.
    tensorboard = Path(out_dir).parent.parent / "tensorboard" / Path(out_dir).name
    sets = [f"parallel.dp={dp}", f"parallel.tp={tp}", f"parallel.pp={pp}",
            f"train.micro_batch={mb}", f"train.accum={accum}", f"run.out_dir={out_dir}",
            f"log.tensorboard={tensorboard}"]
    rest = ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    for s in list(args.set) + sets:  # the layout's keys last: they win
        rest += ["--set", s]
    return rest


class Progress:
    """Shows a running point: its label, seconds so far and the last `bench: step` line of its
    log; rewritten in place on a terminal, a new line per change otherwise (logs, CI)."""

    def __init__(self, label):
        self.label, self.started, self.last = label, time.time(), None
        self.tty = sys.stdout.isatty()

    def update(self, log, state=""):
        step = ""
        try:
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("bench: step "):
                    step = line.split(":")[1].strip()
        except OSError:
            pass
        text = f"  {self.label}{state}: {time.time() - self.started:4.0f} s {step}"
        if self.tty:
            sys.stdout.write("\r" + text.ljust(110))
        elif (state, step) != self.last:
            print(text)
        self.last = (state, step)
        sys.stdout.flush()

    def done(self):
        if self.tty:
            print()


def run_point_mpirun(args, layout, batch, pdir, label):
    ranks = layout[0] * layout[1] * layout[2]
    prefix = args.mpirun.split() if args.mpirun else ["mpirun"]
    cmd = prefix + ["-n", str(ranks), str(args.bin), "bench", str(args.deck)]
    cmd += bench_args(args, layout, batch, pdir)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    if os.geteuid() == 0:  # Open MPI as root, and more ranks than cores (README)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1")
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    log = pdir / "bench.log"
    shown = Progress(label)
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        while proc.poll() is None:
            shown.update(log)
            time.sleep(1)
    shown.done()
    return proc.returncode, log, ""


def run_point_slurm(args, layout, batch, pdir, label):
    ranks = layout[0] * layout[1] * layout[2]
    script = ROOT / "jobs" / "slurm" / "bench-point.sbatch"
    cmd = ["sbatch", "--parsable", f"--ntasks={ranks}", f"--cpus-per-task={args.threads}",
           f"--time={args.time_limit}", f"--output={pdir}/slurm-%j.out",
           f"--job-name=study-{label}", str(script), str(args.deck)]
    cmd += bench_args(args, layout, batch, pdir)
    env = dict(os.environ, TRIDENT_HOME=str(ROOT), TRIDENT_BIN=str(args.bin))
    sub = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if sub.returncode != 0:
        die(f"sbatch failed for {label}: {sub.stderr.strip()}")
    job = sub.stdout.strip().split(";")[0]
    log = pdir / f"slurm-{job}.out"
    shown = Progress(f"{label}, job {job}")
    while True:
        q = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True)
        if q.returncode != 0 or not q.stdout.strip():
            break
        shown.update(log, f" {q.stdout.strip().lower()}")
        time.sleep(1)
    shown.done()
    state = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    ok = "JobState=COMPLETED" in state
    return (0 if ok else 1), log, job


def row_for(point, layout, batch, threads, bench, metrics, launcher, job):
    dp, tp, pp = layout
    timed = [json.loads(l) for l in metrics.read_text().splitlines() if l.strip()]
    timed = [r for r in timed if r.get("timed")]
    bubble_ms = statistics.median([r.get("pipeline_wait_ms", 0.0) for r in timed]) if pp > 1 else 0.0
    step = bench["ms_per_step"]
    compute = max(0.0, step - bench["exposed_comm_ms"] - bench["tp_comm_ms"] - bubble_ms)
    return {
        "point": point, "ranks": dp * tp * pp, "dp": dp, "tp": tp, "pp": pp, "threads": threads,
        "micro_batch": batch[0], "accum": batch[1], "tokens_per_step": bench["tokens_per_step"],
        "ms_per_step": step, "tokens_per_s": bench["tokens_per_s"],
        "forward_ms": bench["forward_ms"], "backward_ms": bench["backward_ms"],
        "optimizer_ms": bench["optimizer_ms"], "compute_ms": compute,
        "tp_comm_ms": bench["tp_comm_ms"], "exposed_comm_ms": bench["exposed_comm_ms"],
        "bubble_ms": bubble_ms, "comm_ms": bench["comm_ms"], "overlap": bench["overlap"],
        "comm_cpu_ms": bench["comm_cpu_ms"],
        "mfu": "" if bench["mfu"] is None else bench["mfu"], "timed_steps": len(timed),
        "blas_core": bench["blas_core"], "launcher": launcher, "job": job,
        "metrics": str(metrics),
    }


def add_efficiency(rows):
    r0 = rows[0]
    for r in rows:
        r["speedup"] = r["tokens_per_s"] / r0["tokens_per_s"]
        r["ideal_speedup"] = r["ranks"] / r0["ranks"]
        r["efficiency"] = r["speedup"] / r["ideal_speedup"]


def cmd_run(args):
    args.deck = Path(args.deck).resolve()
    args.bin = Path(args.bin).resolve()
    if not args.deck.is_file():
        die(f"deck {args.deck} not found")
    if not os.access(args.bin, os.X_OK):
        die(f"trident binary {args.bin} not found (build it: tools/build.sh, or --bin)")
    layouts = parse_layouts(args)
    mb, accum = deck_batch(args.deck, args.set)
    batches = point_batches(args.mode, layouts, mb, accum)
    launcher = args.launcher
    if launcher == "auto":
        launcher = "slurm" if slurm_available() else "mpirun"
    if launcher == "slurm" and not slurm_available():
        die("--launcher slurm, but sinfo does not answer (is SLURM_CONF set? "
            "tools/slurm-local.sh starts a local one)")
    out = Path(args.out).resolve()
    (out / "points").mkdir(parents=True, exist_ok=True)
    meta = {"deck": str(args.deck), "mode": args.mode, "launcher": launcher,
            "layouts": ["x".join(map(str, l)) for l in layouts], "steps": args.steps,
            "warmup": args.warmup, "threads": args.threads, "set": args.set,
            "cpu": cpu_model(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    (out / "study.json").write_text(json.dumps(meta, indent=1) + "\n")
    cores = os.cpu_count() or 1
    most = max(l[0] * l[1] * l[2] for l in layouts) * args.threads
    if launcher == "mpirun" and not args.mpirun and most > cores:
        print(f"scaling_study: note: up to {most} threads on this machine's {cores} cores: "
              f"those points are oversubscribed, their efficiency measures the sharing")
    meta["cores"] = cores
    (out / "study.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"scaling_study: {args.mode} scaling of {args.deck.name}, {len(layouts)} points "
          f"({', '.join(meta['layouts'])} as dp x tp x pp), {launcher}, {args.steps} timed steps "
          f"after {args.warmup} warm-up each, {args.threads} thread(s) per rank, into {out}")
    rows = []
    for i, (layout, batch) in enumerate(zip(layouts, batches)):
        name = "dp{}_tp{}_pp{}".format(*layout)
        pdir = out / "points" / name
        if pdir.exists():
            shutil.rmtree(pdir)
        shutil.rmtree(out / "tensorboard" / name, ignore_errors=True)  # a rerun's point anew
        pdir.mkdir(parents=True)
        ranks = layout[0] * layout[1] * layout[2]
        label = f"point {i + 1}/{len(layouts)} {name} ({ranks} ranks, micro_batch {batch[0]} x accum {batch[1]})"
        run = run_point_slurm if launcher == "slurm" else run_point_mpirun
        rc, log, job = run(args, layout, batch, pdir, label)
        bench_file, metrics = pdir / "bench.json", pdir / "metrics.jsonl"
        if rc != 0 or not bench_file.is_file() or not metrics.is_file():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-8:]) if log.is_file() else ""
            die(f"{name} failed (status {rc}); its log {log}:\n{tail}")
        bench = json.loads(bench_file.read_text())
        rows.append(row_for(name, layout, batch, args.threads, bench, metrics, launcher, job))
        r = rows[-1]
        print(f"  {name}: {r['ms_per_step']:.1f} ms/step, {r['tokens_per_s']:.0f} tokens/s, "
              f"exposed comm {r['exposed_comm_ms']:.1f} ms, bubble {r['bubble_ms']:.1f} ms")
    add_efficiency(rows)
    csv_path = out / "study.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in r.items()})
    for r in rows:
        print(f"  {r['point']}: efficiency {r['efficiency']:.3f} (speedup {r['speedup']:.2f} of "
              f"{r['ideal_speedup']:.0f})")
    print(f"scaling_study: {csv_path}")
    plot(csv_path, out)


def read_csv(path):
    with open(path) as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            die(f"{path}: not a study CSV (no column {', '.join(missing[:4])}"
                f"{' ...' if len(missing) > 4 else ''})")
        rows = list(reader)
    if not rows:
        die(f"{path}: no points")
    return rows


def plot(csv_path, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    csv_path, out = Path(csv_path), Path(out)
    rows = read_csv(csv_path)
    meta = {}
    if (csv_path.parent / "study.json").is_file():
        meta = json.loads((csv_path.parent / "study.json").read_text())
    title = (f"{meta.get('mode', '?')} scaling of {Path(meta.get('deck', '?')).name} "
             f"({meta.get('launcher', '?')}; {meta.get('cpu', '')})")
    f = lambda r, k: float(r[k]) if r[k] != "" else float("nan")
    ranks = [int(r["ranks"]) for r in rows]
    names = [r["point"] for r in rows]

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    tps = [f(r, "tokens_per_s") for r in rows]
    ideal = [tps[0] * n / ranks[0] for n in ranks]
    a1.plot(ranks, ideal, "--", color="grey", label="ideal")
    a1.plot(ranks, tps, "o-", label="measured")
    for x, y, n in zip(ranks, tps, names):
        a1.annotate(n, (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7)
    a1.set(xlabel="ranks", ylabel="tokens/s", title="throughput")
    a1.legend()
    a2.axhline(1.0, ls="--", color="grey", label="ideal")
    a2.plot(ranks, [f(r, "efficiency") for r in rows], "o-", label="measured")
    a2.set(xlabel="ranks", ylabel="efficiency", title="efficiency vs the first point", ylim=(0, 1.15))
    a2.legend()
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        a.set_xticks(sorted(set(ranks)), [str(n) for n in sorted(set(ranks))])
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(rows) + 2) + 2, 4.2))
    bottom = [0.0] * len(rows)
    for key, label, color in (("compute_ms", "compute", "#4c72b0"),
                              ("tp_comm_ms", "tp communication", "#dd8452"),
                              ("exposed_comm_ms", "exposed dp communication", "#c44e52"),
                              ("bubble_ms", "pipeline bubble", "#8c8c8c")):
        vals = [f(r, key) for r in rows]
        ax.bar(names, vals, bottom=bottom, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set(ylabel="ms per step", title="where each point's step goes")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    plt.setp(ax.get_xticklabels(), rotation=20, fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "breakdown.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(rows) + 2), 4))
    mfu = [f(r, "mfu") for r in rows]
    ax.bar(names, [0 if m != m else m for m in mfu], color="#55a868")
    for i, m in enumerate(mfu):
        ax.annotate("n/a" if m != m else f"{m:.3f}", (i, 0 if m != m else m),
                    ha="center", va="bottom", fontsize=8)
    ax.set(ylabel="MFU (against the measured GEMM peak)", ylim=(0, 1), title="MFU per point")
    plt.setp(ax.get_xticklabels(), rotation=20, fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "mfu.png", dpi=110)
    plt.close(fig)
    print(f"scaling_study: plots {out / 'throughput.png'}, {out / 'breakdown.png'}, {out / 'mfu.png'}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a study and plot it")
    r.add_argument("deck")
    r.add_argument("--mode", choices=["weak", "strong"], required=True)
    r.add_argument("--ranks", default="1,2,4", help="rank counts along --vary (default 1,2,4)")
    r.add_argument("--vary", choices=["dp", "tp", "pp"], default="dp")
    r.add_argument("--layouts", help="DPxTPxPP,... instead of --ranks/--vary")
    r.add_argument("--launcher", choices=["auto", "slurm", "mpirun"], default="auto")
    r.add_argument("--mpirun", help="mpirun command and options before -n (default: mpirun)")
    r.add_argument("--steps", type=int, default=5, help="timed steps per point")
    r.add_argument("--warmup", type=int, default=2, help="warm-up steps per point")
    r.add_argument("--threads", type=int, default=1, help="threads per rank")
    r.add_argument("--time-limit", default="20", help="Slurm time limit per point (minutes)")
    r.add_argument("--bin", default=str(ROOT / "build" / "trident"))
    r.add_argument("--set", action="append", default=[], help="deck override a.b=value")
    r.add_argument("--out", required=True)
    q = sub.add_parser("plot", help="draw the plots again from a study's CSV")
    q.add_argument("csv")
    q.add_argument("--out", help="where the PNGs go (default: next to the CSV)")
    args = p.parse_args()
    if args.cmd == "run":
        cmd_run(args)
    else:
        if not Path(args.csv).is_file():
            die(f"{args.csv} not found")
        plot(args.csv, args.out or Path(args.csv).parent)


if __name__ == "__main__":
    main()
