#!/usr/bin/python3
"""The peer benchmark: one GPT-2 training step (forward, backward, AdamW) in Debian's PyTorch,
on the same shape trident's `bench` runs, so docs/perf.md can put the two side by side.

    /usr/bin/python3 tools/bench_torch.py --layers 12 --d-model 768 --heads 12 --seq-len 64 \
        --micro-batch 4 --threads 2 [--torch-defaults]

The model is written here for this purpose (pre-LayerNorm blocks, tanh GELU, tied embedding,
causal attention as matmul + masked softmax: torch 1.13 has no fused attention on the CPU);
the vocabulary is padded to a multiple of 128 as trident pads it, so both do the same FLOPs.
fp32 throughout. Prints one line per step and ends with `torch_bench: key=value ...`
(medians of the timed steps). Debian's torch runs its GEMMs in OpenBLAS, so the BLAS core
(OPENBLAS_CORETYPE) matters as much as it does for trident.

torch runs at the best setting found for it on this machine (tools/torch_peer.py: OpenBLAS's
core named, OMP_WAIT_POLICY=passive), put into the environment by re-executing the script
before torch is imported; `--blas-core` and `--omp-wait-policy` choose others,
`--torch-defaults` runs torch as Debian ships it (both variables unset) for comparison. The
header and the last line print the settings, and the core OpenBLAS actually loaded.
"""
import argparse
import math
import os
import statistics
import time

import torch_peer


def peer_options(ap):
    ap.add_argument("--blas-core", default=torch_peer.FAIR_CORE,
                    help="OPENBLAS_CORETYPE for torch ('default': unset, OpenBLAS detects)")
    ap.add_argument("--omp-wait-policy", default=torch_peer.FAIR_WAIT,
                    help="OMP_WAIT_POLICY for torch ('default': unset)")
    ap.add_argument("--torch-defaults", action="store_true",
                    help="torch as shipped: both variables unset (overrides the two above)")


def peer_env(a):
    if a.torch_defaults:
        a.blas_core = a.omp_wait_policy = "default"
    return torch_peer.wanted(a.blas_core, a.omp_wait_policy)


if __name__ == "__main__":
    # Before `import torch`: OpenBLAS and libgomp read their variables when they load.
    _pre = argparse.ArgumentParser(add_help=False)
    peer_options(_pre)
    torch_peer.with_env(peer_env(_pre.parse_known_args()[0]))

import torch  # noqa: E402
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.attproj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.fcproj = nn.Linear(4 * c, c)

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (y.view(shape).transpose(1, 2) for y in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        att = F.softmax(att.masked_fill(mask[:t, :t], float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.attproj(y)
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, c, heads, vocab, seq_len):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(seq_len, c)
        self.blocks = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(c)
        self.register_buffer("mask", torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1))
        # GPT-2's initialisation (as trident's): with PyTorch's defaults the loss diverges
        # within steps and the run slows to a crawl on denormal numbers.
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p) if name.endswith(("ln1.weight", "ln2.weight", "lnf.weight")) \
                    else nn.init.zeros_(p)
            else:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for block in self.blocks:
            x = block(x, self.mask)
        logits = self.lnf(x) @ self.wte.weight.t()  # tied LM head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    peer_options(ap)
    a = ap.parse_args()
    peer_env(a)
    core = torch_peer.blas_core_loaded()

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    padded = (a.vocab + 127) // 128 * 128
    model = GPT(a.layers, a.d_model, a.heads, padded, a.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1)
    tokens = torch.randint(0, a.vocab, (a.micro_batch, a.seq_len + 1))
    idx, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"torch {torch.__version__}, {a.threads} threads, {n_params / 1e6:.2f} M parameters "
          f"(vocab padded to {padded}), micro-batch {a.micro_batch} x {a.seq_len} tokens; "
          f"{torch_peer.describe()} (OpenBLAS core loaded: {core})"
          f"{' -- torch as shipped' if a.torch_defaults else ''}", flush=True)

    times = []
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(idx, targets)
        loss.backward()
        opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        timed = step >= a.warmup
        if timed:
            times.append(ms)
        print(f"torch step {step + 1} {'timed' if timed else 'warm-up'}: {ms:.1f} ms "
              f"loss {loss.item():.4f}", flush=True)
    step_ms = statistics.median(times)
    tokens_per_step = a.micro_batch * a.seq_len
    print(f"torch_bench: tokens_per_s={tokens_per_step / (step_ms / 1e3):.1f} "
          f"ms_per_step={step_ms:.2f} params_m={n_params / 1e6:.2f} threads={a.threads} "
          f"torch={torch.__version__} blas_core={core} "
          f"omp_wait_policy={os.environ.get('OMP_WAIT_POLICY') or 'unset'}")


if __name__ == "__main__":
    main()
