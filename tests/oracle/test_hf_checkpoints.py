#!/usr/bin/python3
"""trident and transformers' checkpoints, against transformers 4.36.2 itself (tools/hf_venv.sh):

  1. tests/oracle/hf_oracle.py saves a tiny gpt2, GPT-NeoX, Llama and Mixtral (F32, sharded,
     BF16);
  2. hf_tensors (trident's reader, no model) takes from each the config transformers wrote
     (family, shape, every option) and every tensor, converted to trident's layout exactly as
     the oracle's own numpy conversion does: F32 and sharded bitwise, BF16 as the F32 weights
     rounded to bfloat16 (round to nearest even, as torch casts); padded vocabulary rows zero;
     and writes them back with export's writer, without a model (hf_tensors EXPORT), which
     transformers loads with the original's logits;
  3. for each family of --model-families (all four by default and in CTest): `trident
     export` of model.init_from DIR into a directory reads back bitwise, and transformers'
     from_pretrained loads it and gives the same logits as the original model (same weights,
     same code: bitwise); oracle_grads (trident's loader and CPU model) on the saved directory
     gives the first step's loss and every gradient of hf_oracle.py's float64 transformers
     run; and `trident train` from it, on 1 rank and at tp 2 (mixtral: ep 2), the losses and
     gradient norms of its AdamW steps, and, from its last checkpoint exported, the weights the
     steps made;
  4. configs and files trident does not implement exit 2 from `trident export`, naming the key
     or the tensor (another model_type, rope_scaling, a missing tensor, a missing shard,
     Mixtral's sliding window, ...);
  5. tools/make_indexed.py --tokenizer (a BPE tokenizer.json trained here by `tokenizers`, with
     Llama's BOS post-processor) writes each line's tokenizer ids as a document, BOS first
     with --add-special-tokens.
Exit 77 (skip) only when tools/hf_venv.sh cannot install transformers.
usage: test_hf_checkpoints.py --trident BIN --hf-tensors BIN --oracle-grads BIN --source DIR
       --scratch DIR
       [--model-families gpt2,neox,llama,mixtral]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
import safetensors_check  # noqa: E402  (numpy's safetensors reader and writer)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle_report  # noqa: E402
from oracle_report import check, fail  # noqa: E402

FAMILIES = ["gpt2", "neox", "llama", "mixtral"]
DECK = "inputs/gpt-tiny.yaml"
SET = ["--set", "model.seq_len=16", "--set", "run.threads=1"]
# What trident must take from each config.json hf_oracle.py writes.
EXPECTED = {
    "gpt2": dict(family="gpt2", layers=2, channels=64, heads=4, kv_heads=4, vocab=300,
                 padded_vocab=384, max_seq_len=32, norm="layernorm", position="learned",
                 activation="gelu_tanh", mlp_hidden=256, bias=True, tied_head=True,
                 parallel_residual=False),
    "neox": dict(family="neox", layers=2, channels=64, heads=4, kv_heads=4, vocab=300,
                 padded_vocab=384, max_seq_len=32, norm="layernorm", position="rotary",
                 rotary_dims=4, rope_base=10000.0, activation="gelu_erf", mlp_hidden=256,
                 bias=True, tied_head=False, parallel_residual=True),
    "llama": dict(family="llama", layers=2, channels=64, heads=4, kv_heads=2, vocab=300,
                  padded_vocab=384, max_seq_len=32, norm="rmsnorm", position="rotary",
                  rotary_dims=16, rope_base=10000.0, activation="swiglu", mlp_hidden=160,
                  bias=False, tied_head=False, parallel_residual=False, experts=0),
    # Llama's block, every MLP a mixture; the auxiliary loss off (output_router_logits false).
    "mixtral": dict(family="llama", layers=2, channels=64, heads=4, kv_heads=2, vocab=300,
                    padded_vocab=384, max_seq_len=32, norm="rmsnorm", norm_eps=1e-5,
                    position="rotary", rotary_dims=16, rope_base=1e6, activation="swiglu",
                    mlp_hidden=48, bias=False, tied_head=False, parallel_residual=False,
                    experts=4, top_k=2, ffn_width=48, moe_layers=2, aux_loss="none"),
}


def run(cmd, cwd=None, timeout=300):
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout


def bf16_round(x):
    """float32 → bfloat16 → float32, round to nearest even (torch's cast)."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32)


def read_tensors(folder):
    cfg = json.load(open(os.path.join(folder, "config.json")))
    out = {}
    for f in os.listdir(folder):
        if f.endswith(".f32"):
            out[f[:-4]] = np.fromfile(os.path.join(folder, f), dtype="<f4")
    return cfg, out


def compare_tensors(label, got, ref, rounding=None):
    """got: trident's flat tensors (padded); ref: the oracle's float64 of F32 weights."""
    bad = []
    if set(got) != set(ref):
        fail(f"{label}: names differ: missing {sorted(set(ref) - set(got))}, extra "
             f"{sorted(set(got) - set(ref))}")
        return
    for n, r in ref.items():
        want = r.astype(np.float32).ravel()
        if rounding:
            want = rounding(want)
        g = got[n]
        if g.size < want.size or not np.array_equal(g[:want.size], want) or np.any(g[want.size:] != 0):
            bad.append(n)
    check(not bad, f"{label}: all {len(ref)} tensors in trident's layout equal the oracle's "
          f"conversion bitwise{' (bf16-rounded)' if rounding else ''}"
          + (f"; differ: {bad[:6]}" if bad else ""))


def check_reader(args, fam, d):
    ref = dict(np.load(os.path.join(d, "params.npz")))
    for variant, rounding in [("hf", None), ("hf_sharded", None), ("hf_bf16", bf16_round)]:
        out = os.path.join(d, "read_" + variant)
        rc, text = run([args.hf_tensors, os.path.join(d, variant), out])
        if not check(rc == 0, f"{fam} {variant}: trident reads it"):
            print(text[-800:])
            continue
        cfg, got = read_tensors(out)
        wrong = {k: (cfg.get(k), v) for k, v in EXPECTED[fam].items()
                 if cfg.get(k) != v and not (isinstance(v, float) and abs(cfg.get(k, 0) - v) < 1e-6 * v)}
        check(not wrong, f"{fam} {variant}: the config trident took: {cfg['describe']}"
              + (f"; wrong (got, want): {wrong}" if wrong else ""))
        compare_tensors(f"{fam} {variant}", got, ref, rounding)


def check_writer(args, venv_py, fam, d):
    """Export's writer without a model: hf_tensors reads the F32 directory and writes it back;
    that reads back bitwise and transformers loads it with the original's logits."""
    src, out = os.path.join(d, "hf"), os.path.join(d, "written")
    rc, text = run([args.hf_tensors, src, os.path.join(d, "read_for_writer"), out])
    if rc == 0:
        rc, text = run([args.hf_tensors, out, os.path.join(d, "read_written")])
    if not check(rc == 0, f"{fam}: export's writer (no model) wrote the tensors and config.json, "
                 "and trident reads them"):
        print(text[-800:])
        return
    cfg, got = read_tensors(os.path.join(d, "read_written"))
    compare_tensors(f"{fam} written", got, dict(np.load(os.path.join(d, "params.npz"))))
    check_logits(venv_py, fam, src, out, "export's writer")


LOGITS = """
import sys, torch, numpy as np
from transformers import AutoModelForCausalLM
torch.manual_seed(0)
a = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
b = AutoModelForCausalLM.from_pretrained(sys.argv[2]).eval()
x = torch.randint(0, a.config.vocab_size, (2, 16))
with torch.no_grad():
    la, lb = a(input_ids=x).logits, b(input_ids=x).logits
print(type(b).__name__, float((la - lb).abs().max()), float(la.abs().max()))
"""


# trident in fp32 against transformers in float64, the bounds of tests/oracle/test_torch_oracle.py
# (same sizes, same rounding): loss relative 3e-7, per tensor max |diff| / max |g| 3e-6.
LOSS_REL = 3e-7
GRAD_REL = 3e-6


def check_first_step(args, fam, d):
    report = json.load(open(os.path.join(d, "oracle.json")))
    B, T = report["B"], report["T"]
    tokens = safetensors_check_tokens(os.path.join(d, "shard.bin"))
    windows = np.stack([tokens[j * T: j * T + T + 1] for j in range(B)])
    tok_path = os.path.join(d, "step_tokens.i32")
    np.concatenate([windows[:, :-1].ravel(), windows[:, 1:].ravel()]).astype("<i4").tofile(tok_path)
    out = os.path.join(d, "trident_grads")
    rc, text = run([args.oracle_grads, os.path.join(d, "hf"), tok_path, str(B), str(T), out])
    if not check(rc == 0, f"{fam}: oracle_grads ran on the transformers directory"):
        print(text[-800:])
        return
    loss = float(open(os.path.join(out, "loss.txt")).read())
    rel = abs(loss - report["loss"]) / report["loss"]
    check(rel < LOSS_REL, f"{fam}: first-step loss: trident {loss:.7f}, transformers (float64) "
          f"{report['loss']:.7f} nats/token (relative {rel:.1e}, bound {LOSS_REL:.0e})")
    grads = dict(np.load(os.path.join(d, "grads.npz")))
    worst, worst_name, bad = 0.0, "", []
    for n, ref in grads.items():
        g = np.load(os.path.join(out, n + ".npy")).astype(np.float64)
        if n in ("wte", "lmw"):
            if np.any(g[ref.shape[0]:] != 0):
                bad.append(n + " (padded rows)")
            g = g[:ref.shape[0]]
        r = float(np.max(np.abs(g - ref)) / max(np.max(np.abs(ref)), 1e-30))
        if r > worst:
            worst, worst_name = r, n
        if r >= GRAD_REL:
            bad.append(f"{n} {r:.1e}")
    check(not bad, f"{fam}: all {len(grads)} gradients match transformers: worst max |diff| / "
          f"max |g| {worst:.1e} ({worst_name}, bound {GRAD_REL:.0e})" + (f"; over: {bad}" if bad else ""))


DECK_TEXT = """\
model: {layers: 3, d_model: 96, heads: 3, vocab: 256, seq_len: %(T)d}
train: {micro_batch: %(micro_batch)d, accum: %(accum)d, steps: %(steps)d, lr: %(lr)r,
        lr_schedule: %(lr_schedule)s, warmup_steps: %(warmup_steps)d, weight_decay: %(weight_decay)r,
        grad_clip: %(grad_clip)r, beta1: %(beta1)r, beta2: %(beta2)r, eps: %(eps)r, seed: 7,
        val_every: 0}
data: {train: %(shard)s, shuffle: false}
log: {every: 1}
run: {threads: 1}
"""
# Losses and norms of the steps, relative: test_torch_oracle.py's bounds for 8 steps.
TRAIN_LOSS_REL = 1e-6
TRAIN_NORM_REL = 2e-6
# Note [Key bias]
# Softmax ignores a constant added to one query's scores, so the key bias's gradient is exactly
# zero on every dimension RoPE does not rotate (all of GPT-2's): transformers' float64 gives
# ~1e-19, trident's fp32 ~1e-10, and AdamW, which divides by |g| + 1e-8, turns that rounding
# into updates up to lr. Those rows of qkvb carry no information; the update check leaves them.

# The weights' updates after the steps, per tensor, |trident - transformers| / |transformers'|
# in the 2-norm: measured at most 2e-4 (AdamW's m / sqrt(v) magnifies fp32's gradient rounding
# on elements with small gradients). Weight decay dropped from any one matrix moves it by
# 5 steps · lr · wd · |p|, 7e-3 to 9e-3 of its update in these models: the bound sits between.
UPDATE_REL = 1e-3


def check_training(args, fam, d):
    report = json.load(open(os.path.join(d, "oracle.json")))
    deck = os.path.join(d, "deck.yaml")
    with open(deck, "w") as f:
        f.write(DECK_TEXT % dict(report["train"], T=report["T"], shard=os.path.join(d, "shard.bin")))
    ref = report["steps"]
    # A mixture runs at tp 1 (Note [Mixtures in the layouts]): its second layout is ep 2, the
    # experts split over 2 data-parallel ranks, each with half of every step's batch.
    second = ("tp 2", [args.mpiexec, "-n", "2"], ["--set", "parallel.tp=2"])
    if fam == "mixtral":
        second = ("ep 2", [args.mpiexec, "-n", "2"],
                  ["--set", "parallel.ep=2", "--set", f"train.micro_batch={report['B'] // 2}"])
    for label, launcher, extra in [("1 rank", [], []), second]:
        out = os.path.join(d, "train_" + label.replace(" ", ""))
        init = ["--set", f"model.init_from={os.path.join(d, 'hf')}"]
        rc, text = run(launcher + [args.trident, "train", deck] + init +
                       ["--set", f"run.out_dir={out}", "--set", f"checkpoint.dir={out}/ckpt"] + extra)
        if not check(rc == 0, f"{fam} {label}: trident train from the transformers directory"):
            print(text[-800:])
            continue
        check("its block too: " + EXPECTED[fam]["family"] in text,
              f"{fam} {label}: the run says which block it took")
        rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
        if not check(len(rows) == len(ref), f"{fam} {label}: {len(rows)} steps, {len(ref)} expected"):
            continue
        loss_rel = max(abs(r["loss"] - x["loss"]) / x["loss"] for r, x in zip(rows, ref))
        norm_rel = max(abs(r["grad_norm"] - x["grad_norm"]) / x["grad_norm"] for r, x in zip(rows, ref))
        clipped = sum(x["clipped"] for x in ref)
        check(loss_rel < TRAIN_LOSS_REL and norm_rel < TRAIN_NORM_REL,
              f"{fam} {label}: {len(ref)} AdamW steps ({clipped} clipped) match transformers: "
              f"losses relative {loss_rel:.1e} (bound {TRAIN_LOSS_REL:.0e}), norms {norm_rel:.1e} "
              f"(bound {TRAIN_NORM_REL:.0e})")
        check_final_weights(args, fam, label, d, deck, init, out)


def check_final_weights(args, fam, label, d, deck, init, out):
    """The weights after the steps (the run's checkpoint, exported as safetensors and read back)
    against the oracle's: per tensor, |trident's update - transformers' update| / |transformers'
    update| in the 2-norm over the tensor."""
    rc, text = run([args.trident, "export", deck] + init +
                   ["--ckpt", os.path.join(out, "ckpt"), "--format", "safetensors", out + "/export/"])
    if rc == 0:
        rc, text = run([args.hf_tensors, out + "/export", out + "/read_export"])
    if not check(rc == 0, f"{fam} {label}: the checkpoint after the steps exports and reads back"):
        print(text[-800:])
        return
    _, got = read_tensors(out + "/read_export")
    start = dict(np.load(os.path.join(d, "params.npz")))
    final = dict(np.load(os.path.join(d, "params_final.npz")))
    heads, rot = EXPECTED[fam]["heads"], EXPECTED[fam].get("rotary_dims", 0)
    hs = EXPECTED[fam]["channels"] // heads
    worst, worst_name, bad = 0.0, "", []
    for n, ref in final.items():
        keep = np.ones(ref.size, dtype=bool)
        if n.endswith(".qkvb"):  # Note [Key bias]: drop the rows without a gradient
            keep[heads * hs: 2 * heads * hs] = np.tile(np.arange(hs) < rot, heads)
        g = got[n][:ref.size].astype(np.float64)[keep]
        want = (ref - start[n]).ravel()[keep]
        began = start[n].ravel().astype(np.float32)[keep]  # as trident loaded it
        r = float(np.linalg.norm(g - began - want) / np.linalg.norm(want))
        if r > worst:
            worst, worst_name = r, n
        if r >= UPDATE_REL:
            bad.append(f"{n} {r:.1e}")
    check(not bad, f"{fam} {label}: every tensor's update over the steps matches transformers': "
          f"worst |diff| / |update| {worst:.1e} ({worst_name}, bound {UPDATE_REL:.0e})"
          + (f"; over: {bad[:6]}" if bad else ""))


def safetensors_check_tokens(path):
    """The tokens of an llm.c token shard (tests/oracle/llmc_write.py's format)."""
    blob = open(path, "rb").read()
    n = int(np.frombuffer(blob, dtype="<i4", count=3)[2])
    return np.frombuffer(blob, dtype="<u2", count=n, offset=1024).astype(np.int64)


def check_export(args, venv_py, fam, d):
    src = os.path.join(d, "hf")
    out = os.path.join(d, "export") + "/"
    rc, text = run([args.trident, "export", os.path.join(args.source, DECK), "--set",
                    f"model.init_from={src}"] + SET + ["--format", "safetensors", out])
    if not check(rc == 0, f"{fam}: trident export of model.init_from {src} into a directory"):
        print(text[-800:])
        return
    check(os.path.exists(out + "config.json") and os.path.exists(out + "model.safetensors"),
          f"{fam}: the export wrote model.safetensors and config.json")
    rc, text = run([args.hf_tensors, out, os.path.join(d, "read_export")])
    if check(rc == 0, f"{fam}: trident reads its own export"):
        _, got = read_tensors(os.path.join(d, "read_export"))
        compare_tensors(f"{fam} export", got, dict(np.load(os.path.join(d, "params.npz"))))
    check_logits(venv_py, fam, src, out, "trident's export")


def check_logits(venv_py, fam, src, out, what):
    rc, text = run([venv_py, "-c", LOGITS, src, out])
    m = re.search(r"^(\w+) (\S+) (\S+)$", text.strip().splitlines()[-1]) if rc == 0 else None
    # The same fp32 weights through the same transformers code: the logits are bitwise equal.
    if check(m is not None and float(m.group(2)) == 0.0,
             f"{fam}: transformers loads {what}"
             + (f" as {m.group(1)}; logits equal the original's (max |diff| {m.group(2)}, max "
                f"|logit| {float(m.group(3)):.2f})" if m else "")):
        return
    print(text[-1500:])


def bad_configs(args, d_llama, d_neox, d_mixtral, scratch):
    """(case, source dir, edit(dir), regex the message must match)"""
    def config_edit(**kv):
        def edit(d):
            p = os.path.join(d, "config.json")
            c = json.load(open(p))
            c.update(kv)
            json.dump(c, open(p, "w"))
        return edit

    def drop_key(key, **kv):
        def edit(d):
            p = os.path.join(d, "config.json")
            c = json.load(open(p))
            del c[key]
            c.update(kv)
            json.dump(c, open(p, "w"))
        return edit

    def drop_tensor(name):
        def edit(d):
            path = os.path.join(d, "model.safetensors")
            header, tensors, _ = safetensors_check.read_safetensors(path)
            del tensors[name]
            safetensors_check.write_safetensors(path, tensors, header.get("__metadata__"))
        return edit

    def drop_shard(name):  # the shard file the index names for tensor `name`
        def edit(d):
            index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
            os.remove(os.path.join(d, index["weight_map"][name]))
        return edit

    cases = [
        ("model_type", "hf", d_llama, config_edit(model_type="mistral"), r"model_type \"mistral\": not a model trident reads"),
        ("rope_scaling", "hf", d_llama, config_edit(rope_scaling={"type": "linear", "factor": 2.0}), r"rope_scaling .*: trident's RoPE has no scaling"),
        ("attention_bias", "hf", d_llama, config_edit(attention_bias=True), r"attention_bias true: trident's Llama attention has no biases"),
        ("mlp_bias", "hf", d_llama, config_edit(mlp_bias=True), r"mlp_bias true: trident's Llama MLP has no biases"),
        ("hidden_act", "hf", d_llama, config_edit(hidden_act="gelu"), r"hidden_act \"gelu\": trident's Llama MLP is SwiGLU"),
        ("head_dim", "hf", d_llama, config_edit(head_dim=32), r"head_dim 32: trident's head size is hidden_size / num_attention_heads"),
        ("kv_heads", "hf", d_llama, config_edit(num_key_value_heads=3), r"kv_heads 3 must divide"),
        ("neox_act", "hf", d_neox, config_edit(hidden_act="relu"), r"hidden_act \"relu\": not an activation trident implements"),
        ("neox_eps", "hf", d_neox, config_edit(layer_norm_eps=1e-6), r"LayerNorm eps 1e-06 .*: trident's LayerNorm has eps 1e-5 only"),
        ("rotary_odd", "hf", d_neox, config_edit(rotary_pct=0.1), r"rotates 1 dimensions: RoPE needs an even number"),
        ("misshapen", "hf", d_llama, config_edit(intermediate_size=128), r"tensor model\.layers\.0\.mlp\.gate_proj\.weight: shape \[160, 64\], .* needs \[128, 64\]"),
        ("missing", "hf", d_neox, drop_tensor("gpt_neox.layers.1.attention.dense.bias"),
         r"no tensor layers\.1\.attention\.dense\.bias \(nor gpt_neox\.layers\.1\.attention\.dense\.bias\)"),
        ("missing_part", "hf", d_llama, drop_tensor("model.layers.0.self_attn.k_proj.weight"),
         r"no tensor layers\.0\.self_attn\.k_proj\.weight \(nor model\.layers\.0\.self_attn\.k_proj\.weight\)"),
        ("missing_shard", "hf_sharded", d_llama, drop_shard("model.norm.weight"),
         r"cannot open .*/model-\d+-of-\d+\.safetensors"),
        ("unknown", "hf", d_llama, config_edit(num_hidden_layers=1), r"tensor model\.layers\.1\.[a-z_.]+: not a Llama parameter"),
        ("no_config", "hf", d_llama, lambda d: os.remove(os.path.join(d, "config.json")), r"not a GPT-2 state dict; a GPT-NeoX or Llama checkpoint needs its config.json"),
        ("sliding_window", "hf", d_mixtral, config_edit(sliding_window=8), r"sliding_window 8: trident's attention has no sliding window: .* max_position_embeddings \(32\)"),
        ("sliding_window_default", "hf", d_mixtral, drop_key("sliding_window", max_position_embeddings=8192),
         r"sliding_window absent \(4096\): .* max_position_embeddings \(8192\)"),
        ("router_jitter", "hf", d_mixtral, config_edit(router_jitter_noise=0.01), r"router_jitter_noise 0.01: trident's router adds no noise"),
        ("top_k", "hf", d_mixtral, config_edit(num_experts_per_tok=5), r"model.moe.top_k 5 must be in \[1, model.moe.experts 4\]"),
        ("experts", "hf", d_mixtral, config_edit(num_local_experts=3), r"tensor model\.layers\.\d\.block_sparse_moe\.experts\.3\.w\d\.weight: not a Mixtral parameter"),
        ("misshapen_expert", "hf", d_mixtral, config_edit(intermediate_size=40), r"tensor model\.layers\.0\.block_sparse_moe\.experts\.0\.w1\.weight: shape \[48, 64\], a Mixtral .*, 4 experts needs \[40, 64\]"),
        ("missing_expert", "hf", d_mixtral, drop_tensor("model.layers.1.block_sparse_moe.experts.2.w3.weight"),
         r"no tensor layers\.1\.block_sparse_moe\.experts\.2\.w3\.weight"),
    ]
    for case, variant, src, edit, expect in cases:
        d = os.path.join(scratch, "bad", case)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(os.path.join(src, variant), d)
        edit(d)
        rc, text = run([args.trident, "export", os.path.join(args.source, DECK), "--set",
                        f"model.init_from={d}"] + SET + ["--format", "llmc", os.path.join(d, "x.bin")])
        line = next((l for l in text.splitlines() if "model.init_from" in l), text.strip()[-200:])
        check(rc == 2 and re.search(expect, text) is not None,
              f"{case}: exit {rc} (want 2): {line[:220]}")


TOKENIZER = """
import sys
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.train([sys.argv[1]], trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"]))
tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
tok.save(sys.argv[2])
lines = open(sys.argv[1], encoding="utf-8").read().splitlines(keepends=True)
for e in tok.encode_batch(lines, add_special_tokens=False):
    print(" ".join(map(str, e.ids)))
"""


def check_tokenizer(args, venv_py, scratch):
    d = os.path.join(scratch, "tokenizer")
    os.makedirs(d, exist_ok=True)
    text = os.path.join(args.source, "docs", "data-format.md")
    rc, out = run([venv_py, "-c", TOKENIZER, text, os.path.join(d, "tokenizer.json")])
    if not check(rc == 0, "tokenizers trained a BPE tokenizer.json"):
        print(out[-800:])
        return
    want = [[int(x) for x in line.split()] for line in out.strip().splitlines()]
    want = [w for w in want if w]
    tool = os.path.join(args.source, "tools", "make_indexed.py")
    for special in (False, True):
        prefix = os.path.join(d, "bos" if special else "plain")
        rc, out = run([venv_py, tool, "text", text, "--tokenizer", os.path.join(d, "tokenizer.json"),
                       "-o", prefix] + (["--add-special-tokens"] if special else []))
        if not check(rc == 0, f"make_indexed.py text --tokenizer{' --add-special-tokens' if special else ''}"):
            print(out[-800:])
            continue
        idx = open(prefix + ".idx", "rb").read()
        n = int(np.frombuffer(idx, dtype="<u8", count=1, offset=18)[0])
        sizes = np.frombuffer(idx, dtype="<i4", count=n, offset=34)
        tokens = np.fromfile(prefix + ".bin", dtype="<u2")
        docs = np.split(tokens, np.cumsum(sizes)[:-1])
        expect = [([1] if special else []) + w for w in want]
        check(len(docs) == len(expect) and all(list(a) == b for a, b in zip(docs, expect)),
              f"{len(docs)} documents, one per line, hold the tokenizer's ids"
              + (", each after BOS (id 1)" if special else "") + f" ({len(tokens)} tokens)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trident", required=True)
    ap.add_argument("--hf-tensors", required=True)
    ap.add_argument("--oracle-grads", required=True)
    ap.add_argument("--mpiexec", default="mpirun")
    ap.add_argument("--source", required=True)
    ap.add_argument("--scratch", required=True)
    ap.add_argument("--model-families", default=",".join(FAMILIES))
    args = ap.parse_args()
    rc, text = run(["bash", os.path.join(args.source, "tools", "hf_venv.sh")], timeout=1200)
    if rc == 77:
        print(f"SKIP: {text.strip()}")
        return 77
    if rc != 0:
        print(text)
        return 1
    venv_py = text.strip().splitlines()[-1]
    shutil.rmtree(args.scratch, ignore_errors=True)
    os.makedirs(args.scratch)
    oracle = os.path.join(args.source, "tests", "oracle", "hf_oracle.py")
    dirs = {}
    for fam in FAMILIES:
        d = os.path.join(args.scratch, fam)
        rc, text = run([venv_py, oracle, fam, d])
        if not check(rc == 0, f"{fam}: transformers saved the model ({text.strip().splitlines()[-1][:120]})"):
            print(text[-1500:])
            continue
        dirs[fam] = d
        check_reader(args, fam, d)
        check_writer(args, venv_py, fam, d)
        if fam in args.model_families.split(","):
            check_export(args, venv_py, fam, d)
            check_first_step(args, fam, d)
            check_training(args, fam, d)
    check_tokenizer(args, venv_py, args.scratch)
    if "llama" in dirs and "neox" in dirs and "mixtral" in dirs:
        bad_configs(args, dirs["llama"], dirs["neox"], dirs["mixtral"], args.scratch)
    print(f"{oracle_report.failures} failure(s)")
    return 1 if oracle_report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
