#!/usr/bin/python3
"""The mixture-of-experts oracle (issue 44): trident's MoeLayer (moe_probe, CPU backend, fp32)
against torch_moe.py (PyTorch float64, written from the definition), for the options
transformers 4.36 lacks. Each case draws its inputs with numpy (seeded, fp32 values, so both
sides read the same numbers), runs two mixture layers forward and backward on both sides and
compares the outputs, the input gradients, every weight gradient and the figures take_stats
reports (aux and z terms, drops, load), plus the transformers-form totals.

Routing is discontinuous: a choice whose score margin fp32 rounding could flip would make a
case fail for the wrong reason, so every case checks that its margins (k-th minus (k+1)-th
score) are at least MIN_MARGIN, except where a tie is built exactly (dyadic values, exact in
fp32). Exit 77 (skip) only when torch cannot be imported.
usage: test_moe_oracle.py --probe BIN --scratch DIR
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np

try:
    import torch
except ImportError as e:
    print(f"SKIP: cannot import torch ({e}); install python3-torch (tools/setup.sh)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_report  # noqa: E402
import torch_moe  # noqa: E402
from oracle_report import check, fail  # noqa: E402

# Tolerances: trident computes in fp32 (sums of at most 24 products, exp_fast in SwiGLU), the
# oracle in float64, so a difference is trident's rounding. Each bound sits above what was
# measured and far below what the smallest wrong formula tried gives (made in moe.cpp, not kept).
#   REL      per tensor, max |diff| / max |reference|: measured at most 1.3e-6 (layer 2's router
#            gradient, hf case). Wrong formulas: switch's gradient without 1/k moves the router
#            gradient by 3.1e-3; hf from 2·(this layer's counts) by 6.9e-3; a z-loss gradient
#            without its 2, the gate without σ', ties to the higher index by 1e-2 or more.
#   LOSS_REL aux, z and hf terms, relative: measured at most 1.5e-7 (layer 2's z-loss).
#   DISTINCT what a check that must be able to fail needs: the alternative (no aux and z terms;
#            k·switch per layer for hf) moves the router's gradients by at least this, relative,
#            200x REL. Measured 3.1e-3 to 1.1e-2.
REL = 5e-6
LOSS_REL = 1e-6
DISTINCT = 1e-3
MIN_MARGIN = 1e-4  # scores are probabilities: fp32 moves them by ~1e-7

BASE = dict(C=16, E=4, k=2, Fe=12, activation="swiglu", router="softmax", norm_topk=1,
            capacity_factor=0.0, shared_experts=0, shared_gate=0, aux="none", aux_coeff=0.0,
            z_coeff=0.0, N=24, loss_scale=0.5)


def rel_max(a, ref):
    """max |a - ref| / max |ref|: a tensor's worst error against its own scale."""
    return float(np.max(np.abs(a - ref)) / max(np.max(np.abs(ref)), 1e-30))


def draw(cfg, rng):
    """x, dout and two layers' tensors, as fp32 values, scaled so that activations stay O(1)
    and the router's probabilities spread (router rows ~ N(0, 4/C))."""
    C, E, Fe = cfg["C"], cfg["E"], cfg["Fe"]
    fcr = torch_moe.fc_rows(cfg, Fe)
    Fs = cfg["shared_experts"] * Fe
    f32 = lambda a: np.asarray(a, dtype=np.float32)
    x = f32(rng.standard_normal((cfg["N"], C)))
    dout = f32(rng.standard_normal((cfg["N"], C)))
    layers = []
    for _ in range(2):
        w = {
            "expfcw": f32(rng.standard_normal((E * fcr, C)) / math.sqrt(C)),
            "expfcprojw": f32(rng.standard_normal((E * C, Fe)) / math.sqrt(Fe)),
            "router": f32(2.0 * rng.standard_normal((E, C)) / math.sqrt(C)),
        }
        if cfg["router"] == "sigmoid":
            w["routerbias"] = f32(0.3 * rng.standard_normal(E))
        if Fs > 0:
            w["shfcw"] = f32(rng.standard_normal((torch_moe.fc_rows(cfg, Fs), C)) / math.sqrt(C))
            w["shfcprojw"] = f32(rng.standard_normal((C, Fs)) / math.sqrt(Fs))
            if cfg["shared_gate"]:
                w["shgate"] = f32(rng.standard_normal((1, C)) / math.sqrt(C))
        layers.append(w)
    return x, layers, dout


def crowd(x, w, ranks):
    """x's column 0 set to 1 and the router's column 0 to `ranks` (other columns shrunk to
    ±0.1·...): every token then orders the experts as `ranks` does."""
    x[:, 0] = 1.0
    w["router"] *= 0.1
    w["router"][:, 0] = ranks


def prep_crowd_two(x, layers, rng):
    crowd(x, layers[0], [4.0, 2.0, -1.0, -1.0])  # experts 0 then 1 for every token


def prep_crowd_one(x, layers, rng):
    crowd(x, layers[0], [3.0, -1.0, -1.0, -1.0])  # expert 0 for every token


def prep_tie(x, layers, rng):
    """Dyadic x (multiples of 1/8) and router (multiples of 1/16, rows 1 = 2 = 3, row 0 their
    logit minus 1): every logit is exact in fp32 in any summation order, so experts 1, 2, 3
    tie exactly for every token and rank above 0; top 2 must be (1, 2)."""
    x[:] = rng.integers(-8, 9, size=x.shape) / 8.0
    x[:, 0] = 1.0
    row = rng.integers(-4, 5, size=x.shape[1]) / 16.0
    r = np.stack([row, row, row, row]).astype(np.float32)
    r[0, 0] -= 1.0
    layers[0]["router"] = r


# name, config overrides, seed, input preparation, layer-1 routing built exactly (no margin)
CASES = [
    ("softmax norm_topk, swiglu, top 2", dict(), 1, None, False),
    ("softmax unnormalised, gelu tanh, top 2", dict(norm_topk=0, activation="gelu_tanh"), 2,
     None, False),
    ("softmax unnormalised, gelu erf, top 1 of 8", dict(norm_topk=0, activation="gelu_erf", E=8,
                                                         k=1), 3, None, False),
    ("sigmoid + choice bias, norm_topk, top 2", dict(router="sigmoid"), 4, None, False),
    ("sigmoid + choice bias, unnormalised, gelu tanh, top 1",
     dict(router="sigmoid", norm_topk=0, activation="gelu_tanh", k=1), 5, None, False),
    ("switch aux", dict(aux="switch", aux_coeff=1.0), 6, None, False),
    ("hf aux (across both layers)", dict(aux="hf", aux_coeff=1.0), 7, None, False),
    ("z-loss", dict(z_coeff=0.05), 8, None, False),
    ("capacity 1.0, every token on experts 0 and 1, shared expert",
     dict(capacity_factor=1.0, N=16, shared_experts=1), 9, prep_crowd_two, False),
    ("capacity 1.0, random routing, gelu tanh", dict(capacity_factor=1.0,
                                                     activation="gelu_tanh"), 10, None, False),
    ("dropless, every token on expert 0, top 1", dict(k=1, norm_topk=0), 11, prep_crowd_one,
     False),
    ("shared experts (2), no gate, gelu tanh", dict(shared_experts=2, activation="gelu_tanh"), 12,
     None, False),
    ("shared expert with gate, swiglu", dict(shared_experts=1, shared_gate=1), 13, None, False),
    ("tie: experts 1, 2, 3 equal, top 2", dict(), 14, prep_tie, True),
]


def write_inputs(folder, cfg, x, layers, dout):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.txt"), "w") as f:
        for key, v in cfg.items():
            f.write(f"{key}={v}\n")
    x.astype("<f4").tofile(os.path.join(folder, "x.bin"))
    dout.astype("<f4").tofile(os.path.join(folder, "dout.bin"))
    for l, w in enumerate(layers):
        for name, a in w.items():
            a.astype("<f4").tofile(os.path.join(folder, f"l{l + 1}.{name}.bin"))


def router_grads(res):
    return np.concatenate([res["l1.drouter"].ravel(), res["l2.drouter"].ravel()])


def run_case(args, index, name, overrides, seed, prepare, exact_tie):
    cfg = dict(BASE, **overrides)
    N, E, k = cfg["N"], cfg["E"], cfg["k"]
    rng = np.random.default_rng(20240044 + seed)
    x, layers, dout = draw(cfg, rng)
    if prepare:
        prepare(x, layers, rng)
    folder = os.path.join(args.scratch, f"case{index}")
    write_inputs(os.path.join(folder, "in"), cfg, x, layers, dout)
    print(f"-- {name} (case{index}, seed {seed})")
    with open(os.path.join(folder, "probe.log"), "w") as log:
        rc = subprocess.run([args.probe, os.path.join(folder, "in"), os.path.join(folder, "out")],
                            stdout=log, stderr=subprocess.STDOUT, timeout=60).returncode
    if not check(rc == 0, f"moe_probe ran (rc {rc})"):
        print(open(os.path.join(folder, "probe.log")).read())
        return
    out = os.path.join(folder, "out")
    with open(os.path.join(out, "stats.json")) as f:
        stats = json.load(f)
    ref = torch_moe.run(cfg, x, layers, dout)
    r1, r2 = ref["layers"]

    # The case itself: routing far from fp32's reach, except ties built exactly.
    margins = [r1["margin"], r2["margin"]]
    if exact_tie:
        margins = margins[1:]
    check(min(margins) >= MIN_MARGIN,
          f"routing margins {', '.join(f'{m:.1e}' for m in margins)} >= {MIN_MARGIN:g}")

    # Every tensor against the oracle.
    worst, worst_name = 0.0, ""
    for key in ["y1", "y2", "dy1", "dx"] + [
            f"l{l}.d{n}" for l in (1, 2) for n in torch_moe.GRAD_NAMES if f"l{l}.d{n}" in ref]:
        got = np.load(os.path.join(out, f"{key}.npy")).astype(np.float64)
        if got.shape != ref[key].shape or not np.all(np.isfinite(got)):
            fail(f"{key}: shape {got.shape} (oracle {ref[key].shape}), or not finite")
            continue
        e = rel_max(got, ref[key])
        if e > worst:
            worst, worst_name = e, key
        if e > REL:
            fail(f"{key}: max |diff| / max |ref| = {e:.2e} > {REL:g}")
    check(worst <= REL, f"outputs and gradients match, worst {worst_name} {worst:.2e} <= {REL:g}")

    # take_stats' figures.
    for l, (r, s) in enumerate([(r1, stats["l1"]), (r2, stats["l2"])]):
        tag = f"layer {l + 1}"
        check(s["dropped"] == r["dropped"] and s["choices"] == N * k,
              f"{tag}: dropped {s['dropped']} (rule: {r['dropped']}), choices {s['choices']}")
        load = r["count"].max() / (N * k / E)
        check(abs(s["load_max_over_mean"] - load) <= 1e-12 * load,
              f"{tag}: load max/mean {s['load_max_over_mean']:.6g} (oracle {load:.6g})")
        for term, got, want in [("switch aux", s["aux_loss"], ref["switch"][l]),
                                ("z-loss", s["z_loss"], ref["z"][l])]:
            if want == 0.0:
                check(got == 0.0, f"{tag}: {term} {got:g} is 0")
            else:
                e = abs(got - want) / abs(want)
                check(e <= LOSS_REL, f"{tag}: {term} {got:.9g} (oracle {want:.9g}, rel {e:.1e})")
    if cfg["aux"] == "hf":
        hf = stats["hf"]
        count = r1["count"] + r2["count"]
        psum = (r1["psum"] + r2["psum"]).detach().numpy()
        check(hf["layers"] == 2 and hf["count"] == count.tolist(),
              f"hf totals: {hf['layers']} layers, counts {hf['count']} (oracle {count.tolist()})")
        check(rel_max(np.array(hf["psum"]), psum) <= LOSS_REL, "hf totals: probability sums")
        e = abs(hf["aux"] - ref["hf"]) / ref["hf"]
        check(e <= LOSS_REL, f"hf aux {hf['aux']:.9g} (oracle {ref['hf']:.9g}, rel {e:.1e})")

    # What makes each case able to fail.
    if cfg["router"] == "sigmoid":
        differ = sum(int((r["top"] != r["plain_top"]).any(axis=1).sum()) for r in (r1, r2))
        check(differ > 0, f"the choice bias changes {differ} tokens' choices (vs plain s)")
    if cfg["aux"] != "none" or cfg["z_coeff"] > 0:
        alternatives = [("without the aux and z terms", dict(aux="none", z_coeff=0.0), None)]
        if cfg["aux"] == "hf":
            alternatives.append(("with k·switch per layer", dict(), "switch_times_k"))
        for what, change, form in alternatives:
            alt = torch_moe.run(dict(cfg, **change), x, layers, dout, aux_form=form)
            e = rel_max(router_grads(alt), router_grads(ref))
            check(e >= DISTINCT, f"the router's gradient {what} differs by {e:.1e} >= "
                  f"{DISTINCT:g}")
    if cfg["capacity_factor"] > 0:
        check(r1["dropped"] + r2["dropped"] > 0,
              f"capacity {r1['cap']}: the rule drops {r1['dropped']} + {r2['dropped']} choices")
    if prepare is prep_crowd_two:
        # Every token picks experts 0 and 1; each keeps cap = ceil(1.0·N·k/E) of its N choices.
        cap = math.ceil(1.0 * N * k / E)
        check(stats["l1"]["dropped"] == 2 * (N - cap) == 16,
              f"layer 1 drops 2·(N - cap) = 2·({N} - {cap}) = 16: {stats['l1']['dropped']}")
    if prepare is prep_crowd_one:
        check((r1["top"] == 0).all() and stats["l1"]["dropped"] == 0 and
              stats["l1"]["load_max_over_mean"] == E,
              f"layer 1: all {N} tokens on expert 0, none dropped, load max/mean "
              f"{stats['l1']['load_max_over_mean']:g} = E")
    if exact_tie:
        check((r1["top"] == [1, 2]).all(), "oracle: every token's top 2 is (1, 2)")


def check_reference_ops():
    """The oracle's activations against torch's built-ins: a wrong constant in torch_moe.py
    would otherwise agree with a wrong trident."""
    h = torch.tensor(np.random.default_rng(1).standard_normal((8, 64)) * 3, dtype=torch.float64)
    F = torch.nn.functional
    d = [(torch_moe.gelu_tanh(h) - F.gelu(h, approximate="tanh")).abs().max().item(),
         (torch_moe.gelu_erf(h) - F.gelu(h)).abs().max().item(),
         (torch_moe.silu(h) - F.silu(h)).abs().max().item()]
    # float64 in other orders: ~1e-15; a wrong constant moves them by ~1e-5.
    check(max(d) < 1e-12, f"oracle's GELU (tanh, erf) and SiLU match torch.nn.functional "
          f"(max |diff| {max(d):.1e})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", required=True)
    ap.add_argument("--scratch", required=True)
    ap.add_argument("--only", type=int, default=None, help="run one case (its index)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    shutil.rmtree(args.scratch, ignore_errors=True)
    os.makedirs(args.scratch)
    check_reference_ops()
    for i, case in enumerate(CASES):
        if args.only is None or args.only == i:
            run_case(args, i, *case)
    print(f"{oracle_report.failures} failure(s)")
    return 1 if oracle_report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
