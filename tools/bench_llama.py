#!/usr/bin/python3
"""The Llama benchmark of issue 35: `trident bench` on inputs/llama-124m.yaml against one
training step (forward, backward, AdamW) of transformers' LlamaForCausalLM on Debian's torch,
and trident's GPT-2 124M in the same rounds for the MFU comparison; interleaved, medians.

    python3 tools/bench_llama.py [--rounds 3] [--steps 5] [--torch-defaults | --torch-sweep]

Each round runs, one after another: trident on the Llama deck, trident on inputs/gpt2-124m.yaml,
then transformers once per torch setting. By default that is the one setting found best for
torch on this machine (tools/torch_peer.py: OPENBLAS_CORETYPE named, OMP_WAIT_POLICY=passive:
Debian's torch runs its fp32 GEMMs in OpenBLAS, whose kernel choice matters, on OpenBLAS's
threads beside its own OpenMP team). `--torch-defaults` adds torch as Debian ships it (both
variables unset) for comparison; `--torch-sweep` runs the six settings that found the best
(OPENBLAS_CORETYPE unset, SkylakeX, Cooperlake, each with and without passive); `--torch-env`
any list. The summary gives each variant's median over the rounds (each run itself the median
of its timed steps), the ratio of trident's median to the best torch setting's median, and both
MFUs.

`--torch-only` is the peer's side alone, run by the driver under the venv's python
(tools/hf_venv.sh): the same shape as the deck (vocabulary 32000 is already a multiple of 128,
so both do the same FLOPs), eager attention (torch 1.13 has no fused CPU attention), fp32,
AdamW(lr 6e-4, weight decay 0.1), the loss as trident takes it (T inputs, the next T targets).
Run by hand it takes the fair setting too (re-executing itself before torch is imported;
`--torch-defaults`, `--blas-core`, `--omp-wait-policy` as in tools/bench_torch.py); the driver
passes `--env-as-given` with each variant's environment. It prints the settings and the core
OpenBLAS loaded, and ends with `torch_bench: key=value ...`.
"""
import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

import torch_peer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# torch's settings tried, each `K=V ...` for its environment ("": as Debian ships it). Besides
# OpenBLAS's kernel, OpenMP's wait policy: torch's idle OpenMP workers spin next to OpenBLAS's
# own threads, and with the cores shared `passive` made its step 3.5x faster in a trial.
FAIR_ENV = (f"OPENBLAS_CORETYPE={torch_peer.FAIR_CORE} "
            f"OMP_WAIT_POLICY={torch_peer.FAIR_WAIT}")
TORCH_SWEEP = ["", "OPENBLAS_CORETYPE=SkylakeX", "OPENBLAS_CORETYPE=Cooperlake",
              "OMP_WAIT_POLICY=passive", "OPENBLAS_CORETYPE=SkylakeX OMP_WAIT_POLICY=passive",
              "OPENBLAS_CORETYPE=Cooperlake OMP_WAIT_POLICY=passive"]
# BENCH_AUTOCAST=bf16 (read by --torch-only, not by torch) runs the forward under
# torch.autocast("cpu", bfloat16): oneDNN's bf16 GEMMs (AMX where the CPU has it). Not a BLAS
# setting and not trident's precision (fp32), so the ratio is taken over the fp32
# settings only; the summary also prints the ratio to the fastest torch run of any precision.


def torch_only(a):
    import torch
    import torch.nn.functional as F
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.d_model, intermediate_size=a.mlp_hidden,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, max_position_embeddings=a.seq_len,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                      attention_bias=False, hidden_act="silu")
    model = LlamaForCausalLM(cfg)
    model.train()
    autocast = os.environ.get("BENCH_AUTOCAST", "")
    if autocast not in ("", "bf16"):
        sys.exit(f"BENCH_AUTOCAST={autocast}: only bf16 (or unset) is known")
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1)
    tokens = torch.randint(0, a.vocab, (a.micro_batch, a.seq_len + 1))
    idx, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    n_params = sum(p.numel() for p in model.parameters())
    core = os.environ.get("OPENBLAS_CORETYPE") or "unset"
    wait = os.environ.get("OMP_WAIT_POLICY") or "unset"
    loaded = torch_peer.blas_core_loaded()
    print(f"torch {torch.__version__}, {a.threads} threads, OPENBLAS_CORETYPE={core} (OpenBLAS "
          f"core loaded: {loaded}), OMP_WAIT_POLICY={wait}, autocast={autocast or 'off'}, {n_params / 1e6:.2f} M parameters, micro-batch {a.micro_batch} x {a.seq_len}",
          flush=True)
    times = []
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast == "bf16"):
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
    print(f"torch_bench: tokens_per_s={a.micro_batch * a.seq_len / (step_ms / 1e3):.1f} "
          f"ms_per_step={step_ms:.2f} params_m={n_params / 1e6:.2f} threads={a.threads} "
          f"coretype={core} blas_core={loaded} omp_wait_policy={wait} autocast={autocast or 'off'}")


def run(cmd, env=None):
    """Runs cmd, returns the key=value pairs of its last `...bench:` line (exits if none)."""
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("OPENBLAS_CORETYPE", "OMP_WAIT_POLICY")}
    full_env.update(env or {})
    p = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True)
    lines = [ln for ln in p.stdout.splitlines() if re.match(r"^(torch_)?bench: \w+=", ln)]
    if p.returncode != 0 or not lines:
        sys.exit(f"bench_llama: `{shlex.join(cmd)}` failed (exit {p.returncode}):\n"
                 f"{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return dict(kv.split("=", 1) for kv in lines[-1].split()[1:] if "=" in kv)


def load():
    return os.getloadavg()[0]


def driver(a):
    trident = [a.trident, "bench"]
    steps = ["--warmup", str(a.warmup), "--steps", str(a.steps)]
    torch_cmd = [a.python, os.path.abspath(__file__), "--torch-only", "--env-as-given", "--threads",
                 str(a.threads), "--warmup", str(a.warmup), "--steps", str(a.steps)]
    variants = [("trident llama", trident + ["inputs/llama-124m.yaml"] + steps, {}),
                ("trident gpt2", trident + ["inputs/gpt2-124m.yaml"] + steps, {})]
    for e in a.torch_env:
        env = dict(kv.split("=", 1) for kv in e.split())
        variants.append((f"torch llama {e or 'as shipped'}", torch_cmd, env))
    results = {name: [] for name, _, _ in variants}
    loads = []
    for r in range(a.rounds):
        for name, cmd, env in variants:
            waited = 0
            while load() > a.max_load and waited < a.max_wait:
                time.sleep(10)
                waited += 10
            before = load()
            kv = run(cmd, env)
            loads.append(before)
            results[name].append(kv)
            extra = (f" mfu={kv.get('mfu')} peak={kv.get('peak_gflops')} "
                     f"blas_core={kv.get('blas_core')}" if "mfu" in kv else "")
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
    fp32_names = [n for n in torch_names if "BENCH_AUTOCAST" not in n]
    best = max(fp32_names, key=lambda n: med(n, "tokens_per_s"))
    fastest = max(torch_names, key=lambda n: med(n, "tokens_per_s"))
    ratio = med("trident llama", "tokens_per_s") / med(best, "tokens_per_s")
    # MFU per round, both models measured minutes apart; the difference is taken round by round.
    diffs = [float(g["mfu"]) - float(l["mfu"])
             for l, g in zip(results["trident llama"], results["trident gpt2"])
             if "n/a" not in (l.get("mfu"), g.get("mfu"))]
    print(f"trident llama / {best}: {ratio:.2f}x (target >= 2.5; fp32 against fp32)")
    fair = f"torch llama {FAIR_ENV}"
    if fair in results and fair != best:
        print(f"trident llama / {fair} (the fair peer): "
              f"{med('trident llama', 'tokens_per_s') / med(fair, 'tokens_per_s'):.2f}x")
    shipped = "torch llama as shipped"
    if shipped in results:
        print(f"trident llama / {shipped}: "
              f"{med('trident llama', 'tokens_per_s') / med(shipped, 'tokens_per_s'):.2f}x "
              f"(not the fair figure: torch's defaults)")
    if fastest != best:
        print(f"trident llama (fp32) / {fastest}: "
              f"{med('trident llama', 'tokens_per_s') / med(fastest, 'tokens_per_s'):.2f}x "
              f"(the fastest torch run, in another precision)")
    print(f"MFU: llama {med('trident llama', 'mfu'):.3f}, gpt2 {med('trident gpt2', 'mfu'):.3f}, "
          f"gpt2 - llama by round {[round(d, 3) for d in diffs]} (target within 0.05)")
    print(f"load average (1 min) before the runs: min {min(loads):.2f}, median "
          f"{statistics.median(loads):.2f}, max {max(loads):.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--torch-only", action="store_true", help="run the transformers side only")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-load", type=float, default=1e9,
                    help="before each run, wait while the 1-minute load average is above this")
    ap.add_argument("--max-wait", type=int, default=300,
                    help="seconds to wait for --max-load at most, then run anyway")
    ap.add_argument("--trident", default=os.path.join(ROOT, "build", "trident"))
    ap.add_argument("--python", default=None,
                    help="the python with transformers 4.36.2 (default: tools/hf_venv.sh's)")
    ap.add_argument("--torch-env", default=FAIR_ENV,
                    help="torch's settings, ';'-separated, each 'K=V K=V' (empty: as shipped); "
                         "default: the fair one, " + FAIR_ENV)
    ap.add_argument("--torch-defaults", action="store_true",
                    help="driver: also run torch as shipped (both variables unset); "
                         "--torch-only: run it so")
    ap.add_argument("--torch-sweep", action="store_true",
                    help="torch at the six settings that found the fair one: " + ";".join(TORCH_SWEEP))
    ap.add_argument("--env-as-given", action="store_true",
                    help="--torch-only: keep the environment's settings (the driver's)")
    ap.add_argument("--blas-core", default=torch_peer.FAIR_CORE,
                    help="--torch-only: OPENBLAS_CORETYPE ('default': unset)")
    ap.add_argument("--omp-wait-policy", default=torch_peer.FAIR_WAIT,
                    help="--torch-only: OMP_WAIT_POLICY ('default': unset)")
    # The shape (the deck's; only --torch-only reads these).
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--mlp-hidden", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=4)
    a = ap.parse_args()
    if a.torch_only:
        if not a.env_as_given:
            if a.torch_defaults:
                a.blas_core = a.omp_wait_policy = "default"
            torch_peer.with_env(torch_peer.wanted(a.blas_core, a.omp_wait_policy))
        return torch_only(a)
    a.torch_env = TORCH_SWEEP if a.torch_sweep else a.torch_env.split(";")
    if a.torch_defaults and "" not in a.torch_env:
        a.torch_env = a.torch_env + [""]
    if a.python is None:
        p = subprocess.run(["bash", os.path.join(ROOT, "tools", "hf_venv.sh")],
                           capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"bench_llama: no transformers venv (tools/hf_venv.sh exit "
                     f"{p.returncode}): {p.stderr.strip()[-500:]}")
        a.python = p.stdout.strip().splitlines()[-1]
    if not os.access(a.trident, os.X_OK):
        sys.exit(f"bench_llama: {a.trident} is not an executable (build it: tools/build.sh)")
    driver(a)


if __name__ == "__main__":
    main()
