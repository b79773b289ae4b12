#!/usr/bin/python3
"""An independent oracle for trident's GPT-2 maths: PyTorch (torch_gpt2.py, written from the
GPT-2 definition) against trident, on a checkpoint and a token shard written by numpy
(llmc_write.py, written from llm.c's format): nothing on the reference side comes from
trident.

  1. The oracle's hand-written LayerNorm and GELU agree with torch.nn.functional's.
  2. oracle_grads (trident's loader, CPU backend): the loaded weights equal the file's, and the
     first forward/backward's loss and every parameter's gradient match torch's.
  3. `trident train --set model.init_from=FILE` (a deck of another shape) on an llm.c token
     shard, on 1 rank and with `mpirun -n 2 ... --set parallel.tp=2`: the run says the file's
     shape replaced the deck's and pads the vocabulary to a multiple of 128·tp, and the lr,
     gradient norm and loss of each of the first 8 steps match the same steps in torch.
     The shard's 20 samples wrap around during the 8 steps; the first 3 steps clip.

The reference runs in float64, so a difference is trident's fp32 rounding (or a bug), and each
tolerance below is set from the rounding alone. Exit 77 (skip) only when torch cannot be
imported.
usage: test_torch_oracle.py --trident BIN --oracle-grads BIN --mpiexec MPIEXEC --scratch DIR
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np

try:
    import torch
except ImportError as e:
    print(f"SKIP: cannot import torch ({e}); install python3-torch (tools/setup.sh)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llmc_write  # noqa: E402
import oracle_report  # noqa: E402
import torch_gpt2  # noqa: E402
from oracle_report import check, fail, ok  # noqa: E402

# The file's model: V = 300 is no multiple of 128, so Vp = 384 has 84 padding rows (and tp 2
# pads again, to 512); maxT > T leaves rows of wpe unused.
MAXT, V, VP, L, NH, C = 40, 300, 384, 2, 4, 64
B, T = 4, 32
SEED = 20240326

# Tolerances: trident computes in fp32, the oracle in float64, so a difference is trident's
# rounding. Each bound sits well above what was measured and below the smallest error the
# checks must catch (measured by changing the constant in the oracle, and again in trident;
# see the commit message).
#   LOSS_REL   first-step loss, relative: measured 3.1e-8 (under half an fp32 ulp at 6.0);
#              LayerNorm eps 1e-6 moves it by 1.0e-6, an attention scale of 1/head_dim by more.
#   GRAD_REL   per tensor, max |diff| / max |g|: measured at most 8.0e-7 (qkvw). GELU's
#              0.044715 -> 0.0447 gives 9.3e-6 (ln2b; 3.1e-6 to 9.5e-6 per tensor when made
#              in trident) while the loss moves by only 1.1e-7: the gradients catch it.
#              LayerNorm eps 1e-6 gives 6.9e-4. 3e-6 is 3.7x the noise, a third of the GELU
#              change.
#   TRAIN_*    losses and gradient norms of 8 AdamW steps, relative: measured 5.1e-8 and 1.3e-7
#              (1 rank), 2.4e-8 and 9.0e-8 (tp 2); weight decay 0.09 for 0.1 moves the losses by
#              3.3e-6 and the norms by 2.9e-5, weight decay on every tensor by 3.3e-5 and 6.9e-4.
LOSS_REL = 3e-7
GRAD_REL = 3e-6
TRAIN_LOSS_REL = 1e-6
TRAIN_NORM_REL = 2e-6
GRAD_CLIP = 2.0  # the reference norms fall from 2.4 to 1.7: the first 3 steps clip


def torch_float64(x):
    return torch.tensor(np.asarray(x), dtype=torch.float64)


def check_reference_ops():
    """The oracle's own ops against torch's built-ins (float64): a typo in torch_gpt2.py's
    constants would otherwise make the oracle agree with a wrong trident."""
    rng = np.random.default_rng(1)
    x = torch_float64(2.0 * rng.standard_normal((8, 64)))
    w, b = torch_float64(rng.standard_normal(64)), torch_float64(rng.standard_normal(64))
    ln = torch.nn.functional.layer_norm(x, (64,), w, b, eps=1e-5)
    gelu = torch.nn.functional.gelu(x, approximate="tanh")
    d_ln = (torch_gpt2.layernorm(x, w, b) - ln).abs().max().item()
    d_gelu = (torch_gpt2.gelu_tanh(x) - gelu).abs().max().item()
    # float64 with different operation orders: ~1e-15; 1e-12 is far below what a wrong
    # constant gives (eps 1e-6 moves LayerNorm by ~1e-6, GELU's 0.0447 by ~1e-5).
    check(d_ln < 1e-12 and d_gelu < 1e-12,
          f"oracle's LayerNorm and GELU match torch.nn.functional (max |diff| {d_ln:.1e}, "
          f"{d_gelu:.1e}, dimensionless)")


def run(cmd, log_path, timeout=120):
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
    return rc, time.monotonic() - t0


def tail(path, n=5):
    with open(path) as f:
        return "".join(f.readlines()[-n:]).strip()


def rel_max(a, ref):
    """max |a - ref| / max |ref|: a tensor's worst error against its own scale."""
    return float(np.max(np.abs(a - ref)) / max(np.max(np.abs(ref)), 1e-30))


def check_first_step(args, weights, scratch):
    rng = np.random.default_rng(SEED + 1)
    tokens = rng.integers(0, V, size=(B, T + 1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    tok_path = os.path.join(scratch, "step_tokens.i32")
    np.concatenate([inputs.ravel(), targets.ravel()]).astype("<i4").tofile(tok_path)
    out = os.path.join(scratch, "grads")
    rc, secs = run([args.oracle_grads, os.path.join(scratch, "model.bin"), tok_path, str(B),
                    str(T), out], os.path.join(scratch, "oracle_grads.log"))
    if not check(rc == 0, f"oracle_grads ran ({secs:.1f} s)"):
        print(tail(os.path.join(scratch, "oracle_grads.log")))
        return

    def trident_tensor(folder, name):
        """Trident's tensors restacked in llm.c's layout: per-layer ones from h0.x, h1.x, ..."""
        if name in ("wte", "wpe", "lnfw", "lnfb"):
            return np.load(os.path.join(folder, f"{name}.npy"))
        return np.stack([np.load(os.path.join(folder, f"h{l}.{name}.npy")) for l in range(L)])

    # The loader: every tensor exactly as the file has it (the same fp32 bits).
    wrong = [n for n in llmc_write.ORDER
             if not np.array_equal(trident_tensor(os.path.join(out, "weights"), n), weights[n])]
    check(not wrong, "trident's loader reads every tensor of the numpy-written file bitwise"
          + (f"; differ: {', '.join(wrong)}" if wrong else ""))

    model = torch_gpt2.GPT2(weights, V, NH, dtype=torch.float64)
    loss, grads = model.loss_and_grads(inputs, targets)
    with open(os.path.join(out, "loss.txt")) as f:
        t_loss = float(f.read())
    rel = abs(t_loss - loss) / abs(loss)
    check(rel < LOSS_REL, f"first-step loss: trident {t_loss:.7f}, torch {loss:.7f} nats/token "
          f"(relative diff {rel:.1e}, bound {LOSS_REL:.0e})")

    worst, worst_name = 0.0, ""
    for n in llmc_write.ORDER:
        g = trident_tensor(out, n).astype(np.float64)
        ref = grads[n]
        if n == "wte":  # padded rows: excluded from the softmax, so exactly zero
            pad = g[V:]
            check(not pad.any(), f"wte's {VP - V} padded rows get no gradient "
                  f"(max |g| {np.abs(pad).max():.1e} nats/token per unit weight)")
            g, ref = g[:V], ref[:V]
        r = rel_max(g, ref)
        if r > worst:
            worst, worst_name = r, n
        if r >= GRAD_REL:
            fail(f"gradient of {n}: max |diff| / max |g| = {r:.1e}, dimensionless "
                 f"(bound {GRAD_REL:.0e})")
    if worst < GRAD_REL:
        ok(f"all {len(llmc_write.ORDER)} gradients match torch: worst max |diff| / max |g| "
           f"{worst:.1e}, dimensionless ({worst_name}, bound {GRAD_REL:.0e})")


# Training: the deck's shape is not the file's (the file's must replace it); the model.*
# keys other than seq_len are ignored with init_from.
DECK = """\
model: {layers: 3, d_model: 96, heads: 3, vocab: 256, seq_len: %(T)d}
train:
  micro_batch: %(micro_batch)d
  accum: %(accum)d
  steps: %(steps)d
  lr: %(lr)r
  lr_schedule: cosine
  warmup_steps: %(warmup)d
  min_lr_ratio: %(min_lr_ratio)r
  weight_decay: %(weight_decay)r
  grad_clip: %(grad_clip)r
  beta1: %(beta1)r
  beta2: %(beta2)r
  eps: %(eps)r
  seed: 7
  val_every: 0
data: {train: shard.bin, shuffle: false}
log: {every: 1}
run: {threads: 1}
"""
TRAIN = dict(T=T, micro_batch=2, accum=2, steps=8, lr=1e-3, warmup=2, min_lr_ratio=0.1,
             weight_decay=0.1, grad_clip=GRAD_CLIP, beta1=0.9, beta2=0.95, eps=1e-8)
# 20 samples of T + 1 tokens (plus 5 never read): 8 steps of 4 samples wrap around the file.
SHARD_SAMPLES = 20

# Trident's conventions mirrored here (from docs/data-format.md, src/train/optimizer.cpp,
# src/backend/optimizer.cpp, src/train/trainer.cpp, src/io/deck_schema.cpp):
#  - sample j is tokens[j*T : j*T + T + 1]; without shuffling, global position g reads sample
#    g mod S, S = (n_tokens - 1) // T; step s reads positions s*G .. s*G + G - 1, G =
#    micro_batch * accum * dp, and its loss and gradient are the mean over those G*T tokens;
#  - lr(s) (0-based s): lr*(s+1)/warmup during warm-up, then cosine from lr to lr*min_lr_ratio
#    with progress (s - warmup)/(steps - warmup - 1);
#  - the gradient norm is the global L2 norm before clipping; clipping scales every gradient
#    by grad_clip/norm when norm > grad_clip;
#  - AdamW, t = s + 1: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
#    p -= lr (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p), with wd only on wte, wpe and the
#    four weight matrices (not biases, not LayerNorms).
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}


def lr_at(s, c):
    if s < c["warmup"]:
        return c["lr"] * (s + 1) / c["warmup"]
    decay_steps = c["steps"] - c["warmup"]
    if decay_steps <= 1:
        return c["lr"]
    progress = (s - c["warmup"]) / (decay_steps - 1)
    min_lr = c["lr"] * c["min_lr_ratio"]
    return min_lr + 0.5 * (c["lr"] - min_lr) * (1 + math.cos(math.pi * progress))


def torch_training(weights, tokens, c):
    """[(lr, grad_norm, loss)] per step, float64."""
    model = torch_gpt2.GPT2(weights, V, NH, dtype=torch.float64)
    p = model.params
    m = {n: torch.zeros_like(t) for n, t in p.items()}
    v = {n: torch.zeros_like(t) for n, t in p.items()}
    S = (len(tokens) - 1) // T
    G = c["micro_batch"] * c["accum"]
    out = []
    for s in range(c["steps"]):
        windows = np.stack([tokens[j * T: j * T + T + 1]
                            for j in ((s * G + i) % S for i in range(G))])
        loss, grads = model.loss_and_grads(windows[:, :-1], windows[:, 1:])
        norm = math.sqrt(sum(float((g ** 2).sum()) for g in grads.values()))
        scale = c["grad_clip"] / norm if 0 < c["grad_clip"] < norm else 1.0
        lr, t = lr_at(s, c), s + 1
        with torch.no_grad():
            for n in p:
                g = torch.from_numpy(grads[n]) * scale
                m[n] = c["beta1"] * m[n] + (1 - c["beta1"]) * g
                v[n] = c["beta2"] * v[n] + (1 - c["beta2"]) * g * g
                mhat = m[n] / (1 - c["beta1"] ** t)
                vhat = v[n] / (1 - c["beta2"] ** t)
                wd = c["weight_decay"] if n in DECAYED else 0.0
                p[n] -= lr * (mhat / (torch.sqrt(vhat) + c["eps"]) + wd * p[n])
        out.append((lr, norm, loss))
    return out


def check_training(args, weights, scratch):
    rng = np.random.default_rng(SEED + 2)
    tokens = rng.integers(0, V, size=SHARD_SAMPLES * T + 1 + 5)
    llmc_write.write_token_shard(os.path.join(scratch, "shard.bin"), tokens)
    deck = os.path.join(scratch, "deck.yaml")
    with open(deck, "w") as f:
        f.write(DECK % TRAIN)
    ref = torch_training(weights, tokens, TRAIN)
    clipped = [norm > GRAD_CLIP for _, norm, _ in ref]
    # Both branches of clipping are exercised (a property of the reference, not of trident).
    check(any(clipped) and not all(clipped),
          f"the reference clips {sum(clipped)} of {len(ref)} steps (gradient norms "
          f"{ref[0][1]:.2f} .. {ref[-1][1]:.2f}, grad_clip {GRAD_CLIP}, nats/token per unit "
          f"weight)")

    model_file = os.path.join(scratch, "model.bin")
    layouts = [("1 rank", [], []),
               ("tp 2", [args.mpiexec, "-n", "2"], ["--set", "parallel.tp=2"])]
    for label, launcher, extra in layouts:
        out_dir = os.path.join(scratch, "run_" + label.replace(" ", ""))
        log = out_dir + ".log"
        rc, secs = run(launcher + [args.trident, "train", deck, "--set",
                                   f"model.init_from={model_file}", "--set",
                                   f"run.out_dir={out_dir}"] + extra, log)
        if not check(rc == 0, f"{label}: trident train ran ({secs:.1f} s)"):
            print(tail(log))
            continue
        with open(log) as f:
            text = f.read()
        shape = f"layers={L} d_model={C} heads={NH} vocab={V} (padded {VP}) max_seq_len={MAXT}"
        check("its shape replaces the deck's" in text and shape in text,
              f"{label}: the run says the file's shape replaced the deck's ({shape})")
        tp = 2 if extra else 1
        vp_run = -(-V // (128 * tp)) * 128 * tp  # the vocab padded to a multiple of 128·tp
        header = f"model: {L} layers, d_model {C}, {NH} heads, vocab {V} (padded {vp_run})"
        check(header in text and f"tp {tp} x" in text,
              f"{label}: runs with tp {tp} and the vocab padded to {vp_run}")
        with open(os.path.join(out_dir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        if not check(len(rows) == len(ref), f"{label}: {len(rows)} steps logged, "
                     f"expected {len(ref)}"):
            continue
        lr_bad = [i + 1 for i, (r, (lr, _, _)) in enumerate(zip(rows, ref))
                  if abs(r["lr"] - lr) > 1e-12 * lr]
        check(not lr_bad, f"{label}: lr of every step follows the schedule"
              + (f"; differs at steps {lr_bad}" if lr_bad else ""))
        loss_rel = max(abs(r["loss"] - x) / x for r, (_, _, x) in zip(rows, ref))
        norm_rel = max(abs(r["grad_norm"] - n) / n for r, (_, n, _) in zip(rows, ref))
        worst = max(range(len(ref)), key=lambda i: abs(rows[i]["loss"] - ref[i][2]) / ref[i][2])
        check(loss_rel < TRAIN_LOSS_REL,
              f"{label}: losses of {len(ref)} steps match torch, worst relative diff "
              f"{loss_rel:.1e} (step {worst + 1}: trident {rows[worst]['loss']:.7f}, torch "
              f"{ref[worst][2]:.7f} nats/token; bound {TRAIN_LOSS_REL:.0e})")
        check(norm_rel < TRAIN_NORM_REL,
              f"{label}: gradient norms match torch, worst relative diff {norm_rel:.1e} "
              f"(bound {TRAIN_NORM_REL:.0e})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trident", required=True)
    ap.add_argument("--oracle-grads", required=True)
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--scratch", required=True)
    args = ap.parse_args()
    shutil.rmtree(args.scratch, ignore_errors=True)
    os.makedirs(args.scratch)
    torch.set_num_threads(1)
    t0 = time.monotonic()

    check_reference_ops()
    weights = llmc_write.random_gpt2(MAXT, V, VP, L, NH, C, SEED)
    llmc_write.write_checkpoint(os.path.join(args.scratch, "model.bin"), weights,
                                MAXT, V, VP, L, NH, C)
    check_first_step(args, weights, args.scratch)
    check_training(args, weights, args.scratch)

    print(f"{oracle_report.failures} failure(s) ({time.monotonic() - t0:.1f} s)")
    return 1 if oracle_report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
