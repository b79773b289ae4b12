#!/usr/bin/python3
"""The mixture-of-experts benchmark of issue 44: `trident bench` on inputs/mixtral-134m.yaml
against one training step (forward, backward, AdamW) of transformers' MixtralForCausalLM on
Debian's torch, and trident's dense Llama (inputs/llama-124m.yaml) in the same rounds for the
MFU comparison; interleaved, medians.

    python3 tools/bench_mixtral.py [--rounds 3] [--steps 5]

Each round runs, one after another: trident on the Mixtral deck, trident on the Llama deck,
then transformers once per setting (tools/bench_llama.py's finding: Debian's torch is at its
best with OpenBLAS's kernel named and OMP_WAIT_POLICY=passive, its idle OpenMP workers
otherwise spinning beside OpenBLAS's threads). Each run's figure is the median of its timed
steps; the summary gives each variant's median over the rounds, the ratio of trident's tokens/s
to the best torch setting's, both MFUs (on active parameters for the mixture: the experts a
token is routed to, GPTConfig::matmul_params), and from trident's metrics.jsonl the mixture
layers' wall time (moe_ms, forward and backward) and the routing's share of it (moe_route_ms:
router, top-k, permutation, combine and their backward), medians over the timed steps.

`--torch-only` is the peer's side alone, run by the driver under the venv's python
(tools/hf_venv.sh): MixtralForCausalLM in the deck's shape (8 experts of width 1024, top 2,
renormalised; output_router_logits False, so no auxiliary loss, as the deck), eager attention
(torch 1.13 has no fused CPU attention), fp32, AdamW(lr 6e-4, weight decay 0.1), the loss as
trident takes it (T inputs, the next T targets). Its tokens are the deck's data
(inputs/data/tiny-train.bin, consecutive windows as trident reads them with shuffle false), so
the router sees the same byte-level text and skews the same way (`--tokens random` draws them
uniformly from the vocabulary instead). It ends with `torch_bench: key=value ...`.
"""
import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

import torch_peer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The fair setting (tools/torch_peer.py) and the same wait policy with the other AVX-512 core.
TORCH_ENVS = [f"OPENBLAS_CORETYPE={torch_peer.FAIR_CORE} OMP_WAIT_POLICY={torch_peer.FAIR_WAIT}",
              "OPENBLAS_CORETYPE=Cooperlake OMP_WAIT_POLICY=passive"]
DATA = os.path.join(ROOT, "inputs", "data", "tiny-train.bin")


def read_tokens(path, n):
    """The first n tokens of a trident token file (docs/data-format.md)."""
    import numpy as np
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:8] != b"TRIDTOK\0":
            sys.exit(f"bench_mixtral: {path} is not a trident token file")
        width = int.from_bytes(head[12:16], "little")
        count = int.from_bytes(head[16:24], "little")
        if count < n:
            sys.exit(f"bench_mixtral: {path} has {count} tokens, {n} needed")
        return np.frombuffer(f.read(n * width), dtype=np.uint16 if width == 2 else np.uint32)


def torch_only(a):
    import torch
    import torch.nn.functional as F
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = MixtralConfig(vocab_size=a.vocab, hidden_size=a.d_model, intermediate_size=a.ffn_width,
                        num_hidden_layers=a.layers, num_attention_heads=a.heads,
                        num_key_value_heads=a.kv_heads, max_position_embeddings=a.seq_len,
                        num_local_experts=a.experts, num_experts_per_tok=a.top_k,
                        output_router_logits=False, rms_norm_eps=1e-5, rope_theta=10000.0,
                        sliding_window=None, tie_word_embeddings=False, hidden_act="silu")
    model = MixtralForCausalLM(cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1)
    B, T = a.micro_batch, a.seq_len
    steps = a.warmup + a.steps
    if a.tokens == "data":
        stream = torch.from_numpy(read_tokens(DATA, steps * B * T + 1).astype("int64"))
        batches = [torch.stack([stream[(s * B + b) * T:(s * B + b + 1) * T + 1] for b in range(B)])
                   for s in range(steps)]
    else:
        batches = [torch.randint(0, a.vocab, (B, T + 1)) for _ in range(steps)]
    n_params = sum(p.numel() for p in model.parameters())
    core = os.environ.get("OPENBLAS_CORETYPE", "default")
    wait = os.environ.get("OMP_WAIT_POLICY", "default")
    loaded = torch_peer.blas_core_loaded()
    print(f"torch {torch.__version__}, {a.threads} threads, OPENBLAS_CORETYPE={core} (OpenBLAS "
          f"core loaded: {loaded}), "
          f"OMP_WAIT_POLICY={wait}, {n_params / 1e6:.2f} M parameters, micro-batch {B} x {T}, "
          f"tokens {a.tokens}", flush=True)
    times = []
    for step in range(steps):
        idx, targets = batches[step][:, :-1].contiguous(), batches[step][:, 1:].contiguous()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=idx, use_cache=False).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))
        loss.backward()
        opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        if step >= a.warmup:
            times.append(ms)
        print(f"torch step {step + 1} {'timed' if step >= a.warmup else 'warm-up'}: "
              f"{ms:.1f} ms loss {loss.item():.4f}", flush=True)
    step_ms = statistics.median(times)
    print(f"torch_bench: tokens_per_s={B * T / (step_ms / 1e3):.1f} ms_per_step={step_ms:.2f} "
          f"params_m={n_params / 1e6:.2f} threads={a.threads} coretype={core} blas_core={loaded} "
          f"omp_wait_policy={wait} tokens={a.tokens}")


def run(cmd, env=None):
    """Runs cmd; returns the key=value pairs of its last `...bench:` line and its stdout."""
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("OPENBLAS_CORETYPE", "OMP_WAIT_POLICY")}
    full_env.update(env or {})
    p = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True)
    lines = [ln for ln in p.stdout.splitlines() if re.match(r"^(torch_)?bench: \w+=", ln)]
    if p.returncode != 0 or not lines:
        sys.exit(f"bench_mixtral: `{shlex.join(cmd)}` failed (exit {p.returncode}):\n"
                 f"{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return dict(kv.split("=", 1) for kv in lines[-1].split()[1:] if "=" in kv), p.stdout


def moe_figures(stdout):
    """Medians over the timed steps of the mixture's times, from the metrics.jsonl bench names."""
    m = re.search(r"steps in (\S+metrics\.jsonl)", stdout)
    if not m:
        return {}
    rows = [json.loads(ln) for ln in open(m.group(1)) if ln.strip()]
    rows = [r for r in rows if r.get("timed") and "moe_ms" in r]
    if not rows:
        return {}
    med = lambda key: statistics.median(float(r[key]) for r in rows)
    return {"moe_ms": med("moe_ms"), "moe_route_ms": med("moe_route_ms"),
            "route_share": statistics.median(r["moe_route_ms"] / r["moe_ms"] for r in rows),
            "moe_share": statistics.median(r["moe_ms"] / r["ms_per_step"] for r in rows),
            "load_max_over_mean": med("moe_load_max_over_mean")}


def load():
    return os.getloadavg()[0]


def busy(seconds=2.0):
    """The machine's busy fraction over the next `seconds` (/proc/stat): the load average lags
    by a minute, and the other jobs on these cores come and go in bursts of seconds."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # idle + iowait
    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def driver(a):
    trident = [a.trident, "bench"]
    steps = ["--warmup", str(a.warmup), "--steps", str(a.steps)]
    torch_cmd = [a.python, os.path.abspath(__file__), "--torch-only", "--threads",
                 str(a.threads), "--warmup", str(a.warmup), "--steps", str(a.steps),
                 "--tokens", a.tokens]
    variants = [("trident mixtral", trident + ["inputs/mixtral-134m.yaml"] + steps, {}),
                ("trident llama", trident + ["inputs/llama-124m.yaml"] + steps, {})]
    for e in a.torch_env:
        env = dict(kv.split("=", 1) for kv in e.split())
        variants.append((f"torch mixtral {e or 'as shipped'}", torch_cmd, env))
    results = {name: [] for name, _, _ in variants}
    moe = []
    loads = []
    for r in range(a.rounds):
        for name, cmd, env in variants:
            waited = 0
            while (load() > a.max_load or busy() > a.max_busy) and waited < a.max_wait:
                time.sleep(3)
                waited += 5
            before = load()
            kv, out = run(cmd, env)
            loads.append(before)
            results[name].append(kv)
            extra = (f" mfu={kv.get('mfu')} peak={kv.get('peak_gflops')} "
                     f"blas_core={kv.get('blas_core')}" if "mfu" in kv else "")
            if name == "trident mixtral":
                f = moe_figures(out)
                moe.append(f)
                extra += "".join(f" {k}={v:.3f}" for k, v in f.items())
            print(f"round {r + 1} {name}: {float(kv['tokens_per_s']):.1f} tok/s "
                  f"{float(kv['ms_per_step']):.0f} ms/step{extra} (load {before:.2f})", flush=True)

    def med(name, key):
        vals = [float(kv[key]) for kv in results[name] if kv.get(key) not in (None, "n/a")]
        return statistics.median(vals) if vals else float("nan")

    print("\nmedians over rounds (tok/s; ms/step):")
    for name, _, _ in variants:
        runs = ", ".join(f"{float(kv['tokens_per_s']):.1f}" for kv in results[name])
        print(f"  {name:52s} {med(name, 'tokens_per_s'):7.1f}  {med(name, 'ms_per_step'):7.0f}"
              f"   [{runs}]")
    torch_names = [n for n, _, _ in variants if n.startswith("torch")]
    best = max(torch_names, key=lambda n: med(n, "tokens_per_s"))
    ratio = med("trident mixtral", "tokens_per_s") / med(best, "tokens_per_s")
    print(f"trident mixtral / {best}: {ratio:.2f}x (target >= 1.5)")
    print(f"MFU (active parameters): mixtral {med('trident mixtral', 'mfu'):.3f}, "
          f"dense llama {med('trident llama', 'mfu'):.3f}")
    if moe and all(moe):
        for key in moe[0]:
            vals = [f[key] for f in moe]
            print(f"mixtral {key}: median {statistics.median(vals):.3f} over rounds "
                  f"{[round(v, 3) for v in vals]}" + (" (target <= 0.10)" if key == "route_share"
                                                       else ""))
    print(f"load average (1 min) before the runs: min {min(loads):.2f}, median "
          f"{statistics.median(loads):.2f}, max {max(loads):.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--torch-only", action="store_true", help="run the transformers side only")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", choices=["data", "random"], default="data",
                    help="torch's inputs: the deck's data (default) or uniform over the vocabulary")
    ap.add_argument("--max-load", type=float, default=1e9,
                    help="before each run, wait while the 1-minute load average is above this")
    ap.add_argument("--max-busy", type=float, default=1.0,
                    help="before each run, wait while the cores were busier than this fraction "
                         "over 2 s (/proc/stat)")
    ap.add_argument("--max-wait", type=int, default=300,
                    help="seconds to wait for --max-load at most, then run anyway")
    ap.add_argument("--trident", default=os.path.join(ROOT, "build", "trident"))
    ap.add_argument("--python", default=None,
                    help="the python with transformers 4.36.2 (default: tools/hf_venv.sh's)")
    ap.add_argument("--torch-env", default=";".join(TORCH_ENVS),
                    help="torch's settings, ';'-separated, each 'K=V K=V' (empty: as shipped)")
    # The shape (the deck's; only --torch-only reads these).
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--ffn-width", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=4)
    a = ap.parse_args()
    if a.torch_only:
        return torch_only(a)
    a.torch_env = a.torch_env.split(";")
    if a.python is None:
        p = subprocess.run(["bash", os.path.join(ROOT, "tools", "hf_venv.sh")],
                           capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"bench_mixtral: no transformers venv (tools/hf_venv.sh exit "
                     f"{p.returncode}): {p.stderr.strip()[-500:]}")
        a.python = p.stdout.strip().splitlines()[-1]
    if not os.access(a.trident, os.X_OK):
        sys.exit(f"bench_mixtral: {a.trident} is not an executable (build it: tools/build.sh)")
    driver(a)


if __name__ == "__main__":
    main()
