#!/usr/bin/python3
"""Predicted against measured: `trident plan --layout` next to `trident bench` for a list of
layouts on this machine (docs/plan.md, "On this machine").

    tools/plan_validate.py --trident build/trident --hardware this-machine \
        [--cases default|quick] [--rounds 1] [--max-median 0.10 --max-worst 0.20] [--out T.md]

--hardware takes a path or a name, as `trident plan` does: `this-machine` is your own
calibration where there is one (`trident plan --calibrate` writes it outside the repository:
Note [User hardware files]), else the shipped reference inputs/hardware/this-machine.yaml.
The calibrations of --calibrate-each-round and --bracket go to a temporary directory (--out).

Each case is a deck, a rank count, deck overrides and the layout the planner is given (the
same layout in the planner's words). bench's median step time and its memory figures are
compared with the prediction's step_s and memory terms. With --rounds > 1 the cases run
interleaved, round by round, and each case's median over rounds is used. Exits 1 when the
median or the worst step-time error is above the limits.

With --calibrate-each-round every round starts with its own calibration (`mpirun -n 2 trident
plan --calibrate --emulate-gbps 1 --emulate-latency-us 50`, about 15 s), each bench of the
round is predicted with the file calibrated minutes before it, and a case's error is the
median over rounds of predicted/measured: on a machine whose speed drifts from one minute to
the next this compares the model with the machine as it was, not as it was at another time.

With --published megatron-h100 it checks the planner against a published table instead of
this machine: Megatron-Core's own weak-scaling runs on H100 (below, MEGATRON_H100), searched
and checked as tools/plan_narayanan.py checks Narayanan et al.'s rows (every row within
--max-error, 15%; the TFLOP/s trend from one model size to the next in the published direction
wherever the table moves by 5% or more). Exits 1 when either misses (docs/plan.md, "Issue 45").
The hardware file is laid over with --software's keys (default inputs/plan/megatron-core-2024.yaml:
what Megatron-Core ran where trident differs, each key cited there).

With --bracket the calibrations sit at every round boundary (rounds + 1 of them), and each
bench is predicted with both calibrations around it, interpolated by time in log space
(prediction = p_before^(1-t) * p_after^t, t the bench's position between the two calibrations):
a drift between the calibrations is then followed as far as it is linear in time.
"""
import time
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

# (name, deck, ranks, overrides, layout for the planner)
CASES = [
    ("tiny 1 rank, 2 threads", "gpt-tiny.yaml", 1, ["run.threads=2"], "accum=1,threads=2"),
    ("tiny dp=2", "gpt-tiny.yaml", 2, ["run.threads=1"], "dp=2,accum=1"),
    ("tiny tp=2", "gpt-tiny.yaml", 2, ["run.threads=1", "parallel.tp=2"], "tp=2,accum=1"),
    ("tiny pp=2, 4 micro-batches", "gpt-tiny.yaml", 2,
     ["run.threads=1", "parallel.pp=2", "train.accum=4", "train.micro_batch=2"],
     "pp=2,micro=2,accum=4"),
    ("tiny dp=4 on 2 cores", "gpt-tiny.yaml", 4, ["run.threads=1"], "dp=4,accum=1,node=4"),
    ("tiny dp=2 pp=2 on 2 cores", "gpt-tiny.yaml", 4,
     ["run.threads=1", "parallel.pp=2", "train.accum=2", "train.micro_batch=4"],
     "dp=2,pp=2,micro=4,accum=2,node=4"),
    ("tiny dp=2, 1 Gbit/s link", "gpt-tiny.yaml", 2,
     ["run.threads=1", "comm.emulate_gbps=1", "comm.emulate_latency_us=50"], "dp=2,accum=1"),
    ("124M 1 rank, 2 threads", "gpt2-124m.yaml", 1, ["run.threads=2"], "micro=4,accum=1,threads=2"),
    ("124M dp=2", "gpt2-124m.yaml", 2, ["run.threads=1"], "dp=2,micro=4,accum=1"),
    ("124M dp=2, 1 Gbit/s link", "gpt2-124m.yaml", 2,
     ["run.threads=1", "comm.emulate_gbps=1", "comm.emulate_latency_us=50"], "dp=2,micro=4,accum=1"),
    ("124M tp=2", "gpt2-124m.yaml", 2, ["run.threads=1", "parallel.tp=2"], "tp=2,micro=4,accum=1"),
    ("124M pp=2, 2 micro-batches", "gpt2-124m.yaml", 2,
     ["run.threads=1", "parallel.pp=2", "train.accum=2", "train.micro_batch=2"],
     "pp=2,micro=2,accum=2"),
]
# Megatron-Core on H100 (Megatron-LM README, "Training Speed and Scalability", the table image
# images/model_table.png added in NVIDIA/Megatron-LM commit 937571cf, 2024-07-15,
# https://github.com/NVIDIA/Megatron-LM/blob/937571cfd49d0194c06123af93e310cd3637cf50/images/model_table.png):
# GPT models with vocabulary 131,072 and sequence 4096, data parallel 48, distributed optimizer,
# dp, tp (--tp-comm-overlap) and pp communication overlapped. Per row: parameters (billions),
# heads, hidden, layers, tp, pp, GPUs, batch, published TFLOP/s per GPU (MFU 41-49%).
MEGATRON_H100 = [
    (1.7, 16, 2048, 24, 1, 1, 48, 192, 408.8),
    (7.1, 32, 4096, 30, 2, 1, 96, 192, 465.9),
    (16, 48, 6144, 32, 4, 1, 192, 192, 489.1),
    (32, 56, 7168, 48, 8, 1, 384, 192, 459.6),
    (70, 64, 8192, 84, 8, 2, 768, 384, 419.7),
    (119, 80, 10240, 92, 8, 4, 1536, 768, 420.5),
    (177, 96, 12288, 96, 8, 6, 2304, 1152, 432.8),
    (314, 128, 16384, 96, 8, 8, 3072, 1536, 474.4),
    (462, 144, 18432, 112, 8, 16, 6144, 3072, 459.9),
]
MEGATRON_SEQ, MEGATRON_VOCAB = 4096, 131072
QUICK = ["tiny dp=2", "tiny tp=2", "tiny dp=2 pp=2 on 2 cores", "tiny dp=2, 1 Gbit/s link"]

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_MCA_mpi_yield_when_idle": "1"}
MIB = 1024.0 * 1024.0


def run(cmd, env=None):
    """Runs cmd; its stdout, or exit naming the command and its stderr when it fails."""
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"plan_validate: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc.stdout


def emit(text, out):
    """Prints a report, and writes it to `out` too when given."""
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")


def bench(args, deck, ranks, overrides, out_dir):
    # A rank of several threads needs their cores: mpirun binds up to 2 ranks to one core each
    # by default, and 2 threads on one core ran at half speed (Note [Threads and binding]).
    threaded = any(o.startswith("run.threads=") and o != "run.threads=1" for o in overrides)
    cmd = ["mpirun", "-n", str(ranks), *(["--bind-to", "none"] if threaded else []),
           args.trident, "bench", deck, "--steps", str(args.steps),
           "--set", f"run.out_dir={out_dir}", *[x for o in overrides for x in ("--set", o)]]
    run(cmd, env=dict(os.environ, **MPI_ENV))
    with open(os.path.join(out_dir, "bench.json")) as f:
        return json.load(f)


def calibrate(args, out):
    cmd = ["mpirun", "-n", "2", args.trident, "plan", "--calibrate", "--name", "this-machine",
           "--emulate-gbps", "1", "--emulate-latency-us", "50", "--out", out]
    run(cmd, env=dict(os.environ, **MPI_ENV))
    return out


def plan(args, deck, overrides, layout, hardware):
    cmd = [args.trident, "plan", deck, "--hardware", hardware, "--layout", layout, "--json",
           *[x for o in overrides for x in ("--set", o)]]
    return json.loads(run(cmd).strip().splitlines()[-1])


def megatron_flops(batch, layers, hidden):
    """Megatron-LM's own count (num_floating_point_operations in megatron/training/training.py at
    937571cf): 4h MLP, no GQA, the full attention square, the logits; no recomputation."""
    s, l, h, v = MEGATRON_SEQ, layers, hidden, MEGATRON_VOCAB
    return 12.0 * batch * s * l * h * h * (6 + s / h + v / (2.0 * l * h))


def megatron_last_bucket_mib(tp, hidden):
    """Megatron-Core's last gradient bucket on the first stage, MiB of fp32 parameters: its DDP
    fills buckets in reverse parameter order and closes one at bucket_size = max(40M, 1M x dp)
    parameters (megatron/core/distributed/param_and_grad_buffer.py and distributed_data_parallel.py
    at 937571cf), so the embeddings, the last parameters backward reaches, end the last bucket:
    the vocab-parallel word embedding (V/tp rows) and the learned positions (Megatron's default
    --position-embedding-type learned_absolute), at least; what of layer 0 joins them is left out.
    The planner's first bucket is that bucket (the last to reduce, the first to gather)."""
    return (MEGATRON_VOCAB // tp + MEGATRON_SEQ) * hidden * 4 / (1024 * 1024)


def software_hardware(args, tmp):
    """The hardware file (--hardware, a path or a name under inputs/hardware; dgx-h100) with the
    keys of --software laid over it and its sources appended: what Megatron-Core ran on that
    machine (inputs/plan/megatron-core-2024.yaml). Written to tmp; its path."""
    import yaml  # only --published needs it (PyYAML)
    name = args.hardware or "dgx-h100"
    path = name if os.path.exists(name) else os.path.join(args.inputs, "hardware", name + ".yaml")
    with open(path) as f:
        hw = yaml.safe_load(f)
    if args.software:
        with open(args.software) as f:
            over = yaml.safe_load(f)
        sources = hw.get("sources", []) + over.pop("sources", [])
        hw.update(over, sources=sources)
        hw["name"] = f"{hw['name']} + {os.path.splitext(os.path.basename(args.software))[0]}"
    out = os.path.join(tmp, "hardware.yaml")
    with open(out, "w") as f:
        yaml.safe_dump(hw, f, sort_keys=False, width=1000)
    return out


def check_published(args):
    """The planner's best layout per row of MEGATRON_H100 against the published TFLOP/s.
    The search keeps the table's tp, pp and GPUs and leaves open what it does not give:
    micro-batch, schedule, recompute, ZeRO 0/1, sequence parallelism."""
    deck = os.path.join(args.inputs, "plan", "megatron-gpt.yaml")
    tmpdir = tempfile.TemporaryDirectory()  # removed when the check ends
    hardware = software_hardware(args, tmpdir.name)
    lines = ["| model | tp | pp | GPUs | batch | published TFLOP/s | predicted | error | layout | "
             "largest predicted terms |", "|---|---|---|---|---|---|---|---|---|---|"]
    predicted, failed = [], False
    for params, heads, hidden, layers, tp, pp, gpus, batch, pub in MEGATRON_H100:
        print(f"plan_validate: Megatron-Core H100, {params}B ...", flush=True)
        cmd = [args.trident, "plan", deck, "--hardware", hardware,
               "--gpus", str(gpus), "--global-batch", str(batch), "--json", "--top", "50",
               "--tp", str(tp), "--pp", str(pp), "--zero", "0", "1",
               "--schedules", "1f1b", "interleaved", "--micro", "1", "2", "4", "8"]
        for key, value in (("model.layers", layers), ("model.d_model", hidden),
                           ("model.heads", heads), ("model.vocab", MEGATRON_VOCAB),
                           ("model.seq_len", MEGATRON_SEQ), ("model.tied_head", "false"),
                           ("comm.overlap", "true"), ("comm.grad_dtype", "fp32"),
                           ("comm.first_bucket_mb", megatron_last_bucket_mib(tp, hidden)),
                           ("parallel.tp_overlap", "true")):
            cmd += ["--set", f"{key}={value}"]
        ranked = [json.loads(x) for x in run(cmd).splitlines() if x.startswith("{")]
        best = next((p for p in ranked if p["fits"]), None)
        if best is None:
            lines.append(f"| {params}B | {tp} | {pp} | {gpus} | {batch} | {pub} | refused | | | "
                         f"{ranked[0].get('why_not', '') if ranked else ''} |")
            predicted.append(None)
            failed = True
            continue
        tflops = megatron_flops(batch, layers, hidden) / best["step_s"] / gpus / 1e12
        err = tflops / pub - 1
        failed |= abs(err) > args.max_error
        predicted.append(tflops)
        split = sorted(best["time_s"].items(), key=lambda kv: -kv[1])[:4]
        layout = (f"micro {best['micro_batch']}, {best['schedule']}"
                  f"{' v=' + str(best['v']) if best['v'] > 1 else ''}, recompute "
                  f"{best['recompute']}, zero {best['zero']}, sp {int(best['sequence_parallel'])}")
        lines.append(f"| {params}B | {tp} | {pp} | {gpus} | {batch} | {pub} | {tflops:.0f} | "
                     f"{100 * err:+.1f}% | {layout} | " +
                     ", ".join(f"{k} {100 * v / best['step_s']:.0f}%" for k, v in split) + " |")
    lines += ["", "| from | to | published change | predicted change | direction |",
              "|---|---|---|---|---|"]
    for a, b, pa, pb in zip(MEGATRON_H100, MEGATRON_H100[1:], predicted, predicted[1:]):
        published = b[-1] / a[-1] - 1
        if pa is None or pb is None:
            continue
        change = pb / pa - 1
        checked = abs(published) >= 0.05  # smaller moves are within the table's own noise
        agrees = (published > 0) == (change > 0)
        failed |= checked and not agrees
        verdict = ("agrees" if agrees else "DISAGREES") if checked else "not checked (< 5%)"
        lines.append(f"| {a[0]}B | {b[0]}B | {100 * published:+.1f}% | {100 * change:+.1f}% | "
                     f"{verdict} |")
    emit("\n".join(lines), args.out)
    if failed:
        print(f"plan_validate: FAIL: a row misses by more than {100 * args.max_error:.0f}% or a "
              "trend disagrees")
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trident", required=True)
    ap.add_argument("--hardware", help="the hardware file (required without "
                    "--calibrate-each-round)")
    ap.add_argument("--calibrate-each-round", action="store_true",
                    help="calibrate at the start of every round and predict that round's "
                         "benches with it")
    ap.add_argument("--bracket", action="store_true",
                    help="calibrate at every round boundary and predict each bench from the two "
                         "calibrations around it, interpolated by time (implies "
                         "--calibrate-each-round)")
    ap.add_argument("--inputs", default=os.path.join(os.path.dirname(__file__), "..", "inputs"))
    ap.add_argument("--cases", default="default", choices=["default", "quick"])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--max-median", type=float, default=0.10)
    ap.add_argument("--max-worst", type=float, default=0.20)
    ap.add_argument("--within-factor", type=float, metavar="F",
                    help="instead of the two limits: every layout's predicted/measured within "
                         "[1/F, F] (CI's check on a noisy machine)")
    ap.add_argument("--out", help="also write the table (markdown) here")
    ap.add_argument("--measured", help="JSON file: bench results are saved here, and read "
                    "instead of running bench when it exists (to re-predict only)")
    ap.add_argument("--published", choices=["megatron-h100"],
                    help="check against a published table instead of this machine (hardware: "
                         "--hardware, default dgx-h100)")
    ap.add_argument("--software", default=os.path.join(os.path.dirname(__file__), "..", "inputs",
                                                    "plan", "megatron-core-2024.yaml"),
                    help="--published: hardware-file keys for the software the table ran, laid "
                         "over --hardware ('' for none)")
    ap.add_argument("--max-error", type=float, default=0.15,
                    help="--published: the largest |error| a row may have")
    args = ap.parse_args()
    if args.published:
        return check_published(args)
    if args.bracket:
        args.calibrate_each_round = True
    if not args.hardware and not args.calibrate_each_round:
        ap.error("--hardware is required without --calibrate-each-round")
    if args.calibrate_each_round and args.measured:
        ap.error("--measured re-predicts with one --hardware; not with --calibrate-each-round")
    cases = [c for c in CASES if args.cases == "default" or c[0] in QUICK]

    measured = {c[0]: [] for c in cases}
    # --calibrate-each-round: each round's prediction (its own calibration) and its ratio
    preds_by_round = {c[0]: [] for c in cases}
    ratios_by_round = {c[0]: [] for c in cases}
    memory = {}
    if args.measured and os.path.exists(args.measured):
        with open(args.measured) as f:
            saved = json.load(f)
        measured, memory = saved["measured"], saved["bench"]
        cases = [c for c in cases if c[0] in measured]
        args.rounds = 0
    tmpdir = tempfile.TemporaryDirectory()  # removed when the script ends
    tmp = tmpdir.name
    # --bracket: the calibrations (file, mid time) at the round boundaries, and every bench's
    # (case, round, mid time, measured seconds), predicted once the calibration after it exists.
    boundaries, benched = [], []

    def timed_calibration(label, index):
        print(f"plan_validate: {label}: calibrating ...", flush=True)
        t0 = time.monotonic()
        path = calibrate(args, os.path.join(tmp, f"hardware-{index}.yaml"))
        return path, (t0 + time.monotonic()) / 2

    if args.bracket and args.rounds > 0:
        boundaries.append(timed_calibration("before round 1", 0))
    for r in range(args.rounds):
        hardware = args.hardware
        if args.calibrate_each_round and not args.bracket:
            print(f"plan_validate: round {r + 1}/{args.rounds}: calibrating ...", flush=True)
            hardware = calibrate(args, os.path.join(tmp, f"hardware-{r + 1}.yaml"))
        for name, deck, ranks, overrides, layout in cases:
            print(f"plan_validate: round {r + 1}/{args.rounds}: {name} ...", flush=True)
            t0 = time.monotonic()
            b = bench(args, os.path.join(args.inputs, deck), ranks, overrides,
                      os.path.join(tmp, "run"))
            measured[name].append(b["ms_per_step"] / 1000.0)
            memory[name] = b
            if args.bracket:
                benched.append((name, deck, overrides, layout, r, (t0 + time.monotonic()) / 2,
                                measured[name][-1]))
            elif args.calibrate_each_round:
                p = plan(args, os.path.join(args.inputs, deck), overrides, layout, hardware)
                preds_by_round[name].append(p["step_s"])
                ratios_by_round[name].append(p["step_s"] / measured[name][-1])
        if args.bracket:
            boundaries.append(timed_calibration(f"after round {r + 1}", r + 1))
            hardware = boundaries[-1][0]
    for name, deck, overrides, layout, r, mid, m in benched:
        (before, t_before), (after, t_after) = boundaries[r], boundaries[r + 1]
        t = min(1.0, max(0.0, (mid - t_before) / (t_after - t_before)))
        p0 = plan(args, os.path.join(args.inputs, deck), overrides, layout, before)["step_s"]
        p1 = plan(args, os.path.join(args.inputs, deck), overrides, layout, after)["step_s"]
        pred = p0 ** (1 - t) * p1 ** t
        preds_by_round[name].append(pred)
        ratios_by_round[name].append(pred / m)
    if args.calibrate_each_round and args.rounds > 0:
        # Memory and the split come from the last round's file (a case's time and error are its
        # rounds' medians); the file is kept beside the table as the machine's latest.
        args.hardware = os.path.join(tmp, "hardware-last.yaml")
        os.replace(hardware, args.hardware)
        if args.out:
            shutil.copy(args.hardware, os.path.splitext(args.out)[0] + ".hardware.yaml")
    if args.measured and args.rounds > 0:
        with open(args.measured, "w") as f:
            json.dump({"measured": measured, "bench": memory}, f)
    rows, errors, ratios = [], [], []
    for name, deck, ranks, overrides, layout in cases:
        p = plan(args, os.path.join(args.inputs, deck), overrides, layout, args.hardware)
        m = statistics.median(measured[name])
        err = p["step_s"] / m - 1
        predicted = p["step_s"]
        if ratios_by_round[name]:  # each round against its own calibration
            err = statistics.median(ratios_by_round[name]) - 1
            predicted = statistics.median(preds_by_round[name])
        errors.append(abs(err))
        ratios.append(1 + err)
        b = memory[name]
        mem_pred = p["memory_bytes"]
        mem_meas = (b["param_mib"] + b["grad_mib"] + b["optimizer_mib"] + b["activation_mib"]) * MIB
        mem_p = sum(mem_pred.values())
        split = sorted(p["time_s"].items(), key=lambda kv: -kv[1])[:3]
        rows.append((name, ranks, predicted * 1e3, m * 1e3, 100 * err, mem_p / MIB,
                     mem_meas / MIB, 100 * (mem_p / mem_meas - 1),
                     ", ".join(f"{k} {100 * v / p['step_s']:.0f}%" for k, v in split)))
    head = ("| case | ranks | predicted ms | measured ms | error | predicted MiB | bench MiB "
            "| memory error | largest predicted terms |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head] + [f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.1f} | {r[4]:+.1f}% | {r[5]:.1f} "
                      f"| {r[6]:.1f} | {r[7]:+.1f}% | {r[8]} |" for r in rows]
    med, worst = statistics.median(errors), max(errors)
    lines.append(f"\nstep time: median |error| {100 * med:.1f}%, worst {100 * worst:.1f}% over "
                 f"{len(rows)} layouts ({args.rounds} round(s) of {args.steps} timed steps)")
    if args.within_factor is not None:
        lines.append(f"predicted/measured {min(ratios):.2f} .. {max(ratios):.2f} (limit "
                     f"{1 / args.within_factor:.2f} .. {args.within_factor:.2f})")
    emit("\n".join(lines), args.out)
    if args.within_factor is not None:
        if min(ratios) < 1 / args.within_factor or max(ratios) > args.within_factor:
            print("plan_validate: FAIL: a prediction is off by more than the factor")
            return 1
        return 0
    if med > args.max_median or worst > args.max_worst:
        print(f"plan_validate: FAIL: median {100 * med:.1f}% (limit {100 * args.max_median:.0f}%)"
              f", worst {100 * worst:.1f}% (limit {100 * args.max_worst:.0f}%)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
