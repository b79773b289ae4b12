#!/usr/bin/env python3
"""The Hugging Face oracle: transformers 4.36.2's own GPT2LMHeadModel, GPTNeoXForCausalLM,
LlamaForCausalLM and MixtralForCausalLM (run it with tools/hf_venv.sh's python), nothing from
trident.

  hf_oracle.py FAMILY OUT [--steps 5]      FAMILY: gpt2 | neox | llama | mixtral

builds the family's tiny model (L 2, C 64, NH 4; llama, mixtral KVH 2; mixtral 4 experts of width
48, top 2, the router's weights scaled up so that routing is decisive; vocab 300; T 16) from a
fixed seed with every tensor perturbed (so no bias or norm weight is a constant), and writes OUT/:

  hf/             save_pretrained, F32, one model.safetensors + config.json
  hf_sharded/     the same weights in several shards + model.safetensors.index.json
  hf_bf16/        the model cast to bfloat16 and saved (BF16 tensors)
  shard.bin       the tokens, an llm.c token shard (tests/oracle/llmc_write.py)
  params.npz      every tensor in trident's names and layout (Note [Hugging Face tensors]),
                  float64 from the F32 weights; wte/lmw with the real vocabulary's rows only;
                  mixtral's experts as h{l}.expfcw (each expert's w1 then w3), h{l}.expfcprojw
                  (each expert's w2) and h{l}.router (the gate)
  grads.npz       the first step's gradient of the mean loss, same names and shapes, float64
  params_final.npz  the weights after the AdamW steps, same names and shapes, float64
  oracle.json     {"family", "config" (the config.json), "B", "T", "train" (the deck's train.*
                  keys the steps used), "decayed" (names with weight decay), "loss" (first
                  step), "loss_float32" (transformers unpatched, a check of the patches),
                  "steps": [{"step", "lr", "loss", "grad_norm", "clipped"}],
                  mixtral: "router_margin", the smallest gap, over every token, layer and step,
                  between the k-th and the (k+1)-th largest router logit (float64)}

Everything is computed in float64. transformers keeps float32 islands even in a float64 model
(RoPE's inv_freq and cos/sin tables, LlamaRMSNorm's and MixtralRMSNorm's upcast, the attention
softmax's dtype, Mixtral's router softmax (dtype=torch.float), the logits' .float()); they are
recomputed, patched or bypassed here, so a difference from trident is trident's fp32 rounding.
Mixtral's auxiliary loss is off (output_router_logits False, transformers' default): the loss is
the cross-entropy alone. The router margin is checked to be far above fp32's rounding, so
trident's fp32 routing chooses the experts float64 does.
The batch: sample j is tokens[j*T : j*T + T + 1]; step s reads samples (s*B + i) mod S
(trident without shuffling, micro_batch B, accum 1, dp 1). AdamW as src/train/optimizer.cpp:
norm of all gradients before clipping, scale grad_clip / norm above it, m, v with bias
correction, p -= lr (mhat / (sqrt(vhat) + eps) + wd p), wd on matrices only.
"""
import argparse
import copy
import json
import math
import os
import sys

import numpy as np
import torch
import transformers
from transformers import (GPT2Config, GPT2LMHeadModel, GPTNeoXConfig, GPTNeoXForCausalLM,
                          LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llmc_write  # noqa: E402

L, C, NH, KVH, V, T, B, MAXT = 2, 64, 4, 2, 300, 16, 4, 32
EXPERTS, TOP_K, FE = 4, 2, 48
ROUTER_SCALE = 20.0  # the gate's init (std 0.02) times this: logits of order 1, decisive choices
MIN_MARGIN = 1e-3  # the smallest router logit gap accepted (fp32's error in the logits: ~1e-6)
SEED = 35
SAMPLES = 3 * B  # the shard wraps around within 5 steps
TRAIN = dict(lr=1e-3, lr_schedule="constant", warmup_steps=0, beta1=0.9, beta2=0.95, eps=1e-8,
             weight_decay=0.1, grad_clip=2.0, micro_batch=B, accum=1)


def make_model(family):
    common = dict(vocab_size=V)
    if family == "gpt2":
        cfg = GPT2Config(n_positions=MAXT, n_embd=C, n_layer=L, n_head=NH,
                         activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                         attn_pdrop=0.0, **common)
        cls = GPT2LMHeadModel
    elif family == "neox":
        cfg = GPTNeoXConfig(hidden_size=C, num_hidden_layers=L, num_attention_heads=NH,
                            intermediate_size=4 * C, max_position_embeddings=MAXT, rotary_pct=0.25,
                            rotary_emb_base=10000, hidden_act="gelu", use_parallel_residual=True,
                            tie_word_embeddings=False, hidden_dropout=0.0, attention_dropout=0.0,
                            **common)
        cls = GPTNeoXForCausalLM
    elif family == "llama":
        cfg = LlamaConfig(hidden_size=C, num_hidden_layers=L, num_attention_heads=NH,
                          num_key_value_heads=KVH, intermediate_size=160,
                          max_position_embeddings=MAXT, rms_norm_eps=1e-6, rope_theta=10000.0,
                          tie_word_embeddings=False, **common)
        cls = LlamaForCausalLM
    elif family == "mixtral":
        cfg = MixtralConfig(hidden_size=C, num_hidden_layers=L, num_attention_heads=NH,
                            num_key_value_heads=KVH, intermediate_size=FE,
                            max_position_embeddings=MAXT, rms_norm_eps=1e-5, rope_theta=1e6,
                            sliding_window=None, num_local_experts=EXPERTS,
                            num_experts_per_tok=TOP_K, output_router_logits=False,
                            router_aux_loss_coef=0.02, tie_word_embeddings=False, **common)
        cls = MixtralForCausalLM
    else:
        raise SystemExit(f"hf_oracle: unknown family {family} (gpt2, neox, llama, mixtral)")
    torch.manual_seed(SEED)
    model = cls(cfg).float().eval()
    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for n, p in model.named_parameters():  # no constant tensor: biases and norms load visibly
            if n.endswith("block_sparse_moe.gate.weight"):
                p.mul_(ROUTER_SCALE)
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model


def to_trident(family, sd, cfg):
    """transformers' state dict (numpy) → trident's global tensors, as
    Note [Hugging Face tensors] states them; written here from the two definitions, not from
    trident's converter."""
    out = {}
    if family == "gpt2":
        p = "transformer."
        out["wte"], out["wpe"] = sd[p + "wte.weight"], sd[p + "wpe.weight"]
        for l in range(L):
            h = f"{p}h.{l}."
            for ours, hf, conv1d in [("ln1w", "ln_1.weight", 0), ("ln1b", "ln_1.bias", 0),
                                     ("qkvw", "attn.c_attn.weight", 1), ("qkvb", "attn.c_attn.bias", 0),
                                     ("attprojw", "attn.c_proj.weight", 1), ("attprojb", "attn.c_proj.bias", 0),
                                     ("ln2w", "ln_2.weight", 0), ("ln2b", "ln_2.bias", 0),
                                     ("fcw", "mlp.c_fc.weight", 1), ("fcb", "mlp.c_fc.bias", 0),
                                     ("fcprojw", "mlp.c_proj.weight", 1), ("fcprojb", "mlp.c_proj.bias", 0)]:
                out[f"h{l}.{ours}"] = sd[h + hf].T.copy() if conv1d else sd[h + hf]
        out["lnfw"], out["lnfb"] = sd[p + "ln_f.weight"], sd[p + "ln_f.bias"]
    elif family == "neox":
        p = "gpt_neox."
        hs = C // NH
        out["wte"] = sd[p + "embed_in.weight"]
        for l in range(L):
            h = f"{p}layers.{l}."
            qkv = sd[h + "attention.query_key_value.weight"].reshape(NH, 3, hs, C)
            out[f"h{l}.qkvw"] = qkv.transpose(1, 0, 2, 3).reshape(3 * C, C)
            qkvb = sd[h + "attention.query_key_value.bias"].reshape(NH, 3, hs)
            out[f"h{l}.qkvb"] = qkvb.transpose(1, 0, 2).reshape(3 * C)
            for ours, hf in [("ln1w", "input_layernorm.weight"), ("ln1b", "input_layernorm.bias"),
                             ("ln2w", "post_attention_layernorm.weight"),
                             ("ln2b", "post_attention_layernorm.bias"),
                             ("attprojw", "attention.dense.weight"), ("attprojb", "attention.dense.bias"),
                             ("fcw", "mlp.dense_h_to_4h.weight"), ("fcb", "mlp.dense_h_to_4h.bias"),
                             ("fcprojw", "mlp.dense_4h_to_h.weight"), ("fcprojb", "mlp.dense_4h_to_h.bias")]:
                out[f"h{l}.{ours}"] = sd[h + hf]
        out["lnfw"], out["lnfb"] = sd[p + "final_layer_norm.weight"], sd[p + "final_layer_norm.bias"]
        out["lmw"] = sd["embed_out.weight"]
    else:
        p = "model."
        out["wte"] = sd[p + "embed_tokens.weight"]
        for l in range(L):
            h = f"{p}layers.{l}."
            out[f"h{l}.qkvw"] = np.concatenate([sd[h + f"self_attn.{x}_proj.weight"] for x in "qkv"])
            out[f"h{l}.attprojw"] = sd[h + "self_attn.o_proj.weight"]
            if family == "mixtral":  # Note [Expert tensors]: expert after expert
                e = h + "block_sparse_moe."
                out[f"h{l}.router"] = sd[e + "gate.weight"]
                out[f"h{l}.expfcw"] = np.concatenate([sd[e + f"experts.{x}.{w}.weight"]
                                                      for x in range(EXPERTS) for w in ("w1", "w3")])
                out[f"h{l}.expfcprojw"] = np.concatenate(
                    [sd[e + f"experts.{x}.w2.weight"] for x in range(EXPERTS)])
            else:
                out[f"h{l}.fcw"] = np.concatenate([sd[h + "mlp.gate_proj.weight"], sd[h + "mlp.up_proj.weight"]])
                out[f"h{l}.fcprojw"] = sd[h + "mlp.down_proj.weight"]
            out[f"h{l}.ln1w"] = sd[h + "input_layernorm.weight"]
            out[f"h{l}.ln2w"] = sd[h + "post_attention_layernorm.weight"]
        out["lnfw"] = sd[p + "norm.weight"]
        out["lmw"] = sd["lm_head.weight"]
    return out


_softmax = torch.nn.functional.softmax


def _softmax64(x, dim=None, _stacklevel=3, dtype=None):
    if dtype == torch.float32 and x.dtype == torch.float64:
        dtype = None  # Llama's eager attention asks for a float32 softmax
    return _softmax(x, dim=dim, _stacklevel=_stacklevel, dtype=dtype)


def _rmsnorm64(self, x):
    variance = x.pow(2).mean(-1, keepdim=True)
    return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))


def float64_model(model):
    """A float64 copy with transformers' float32 islands recomputed in float64."""
    m = copy.deepcopy(model).double()
    torch.set_default_dtype(torch.float64)  # the masks transformers builds at run time
    torch.nn.functional.softmax = _softmax64
    transformers.models.llama.modeling_llama.LlamaRMSNorm.forward = _rmsnorm64
    transformers.models.mixtral.modeling_mixtral.MixtralRMSNorm.forward = _rmsnorm64
    for mod in m.modules():
        if hasattr(mod, "inv_freq") and hasattr(mod, "_set_cos_sin_cache"):
            mod.inv_freq = 1.0 / (mod.base ** (torch.arange(0, mod.dim, 2, dtype=torch.float64) / mod.dim))
            mod._set_cos_sin_cache(mod.max_seq_len_cached, mod.inv_freq.device, torch.float64)
    return m


class RouterMargin:
    """The smallest gap between the k-th and the (k+1)-th largest router logit the model's gates
    produced while attached: how far every top-k choice is from going the other way."""

    def __init__(self, model):
        self.margin = math.inf
        for n, mod in model.named_modules():
            if n.endswith("block_sparse_moe.gate"):
                mod.register_forward_hook(self.hook)

    def hook(self, mod, inputs, logits):
        z = torch.sort(logits.detach().double(), dim=-1, descending=True).values
        self.margin = min(self.margin, float((z[:, TOP_K - 1] - z[:, TOP_K]).min()))


def loss_of(model, windows):
    x = torch.from_numpy(windows[:, :-1].astype(np.int64))
    y = torch.from_numpy(windows[:, 1:].astype(np.int64))
    # The head by hand: the *ForCausalLM classes return logits.float(), float32 even here.
    hidden = model.base_model(input_ids=x)[0]
    logits = model.get_output_embeddings()(hidden)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("family")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    model = make_model(args.family)
    model.save_pretrained(os.path.join(args.out, "hf"), safe_serialization=True)
    model.save_pretrained(os.path.join(args.out, "hf_sharded"), safe_serialization=True,
                          max_shard_size="100KB")
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(os.path.join(args.out, "hf_bf16"),
                                                            safe_serialization=True)
    rng = np.random.default_rng(SEED + 2)
    tokens = rng.integers(0, V, size=SAMPLES * T + 1)
    llmc_write.write_token_shard(os.path.join(args.out, "shard.bin"), tokens)

    first = np.stack([tokens[j * T: j * T + T + 1] for j in range(B)])
    with torch.no_grad():
        loss32 = float(loss_of(model, first))  # transformers as shipped, float32
    m = float64_model(model)
    router = RouterMargin(m) if args.family == "mixtral" else None
    cfg_json = json.load(open(os.path.join(args.out, "hf", "config.json")))
    params = dict(m.named_parameters())
    names = list(params)
    sd = lambda d: {k: v.detach().numpy() for k, v in d.items()}  # noqa: E731
    trident_params = to_trident(args.family, sd(params), cfg_json)
    np.savez(os.path.join(args.out, "params.npz"), **trident_params)
    decayed = sorted(n for n, a in trident_params.items() if a.ndim == 2)
    hf_decayed = {n for n, p in params.items() if p.ndim == 2}
    mom = {n: torch.zeros_like(p) for n, p in params.items()}
    vel = {n: torch.zeros_like(p) for n, p in params.items()}
    c = TRAIN
    steps = []
    for s in range(args.steps):
        windows = np.stack([tokens[j * T: j * T + T + 1] for j in ((s * B + i) % SAMPLES for i in range(B))])
        m.zero_grad()
        loss = loss_of(m, windows)
        loss.backward()
        for p in params.values():  # an expert no token chose: a zero gradient, as trident's
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if s == 0:
            grads = to_trident(args.family, {n: p.grad.numpy().copy() for n, p in params.items()}, cfg_json)
            np.savez(os.path.join(args.out, "grads.npz"), **grads)
        norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in params.values()))
        scale = c["grad_clip"] / norm if 0 < c["grad_clip"] < norm else 1.0
        t = s + 1
        with torch.no_grad():
            for n in names:
                p, g = params[n], params[n].grad * scale
                mom[n] = c["beta1"] * mom[n] + (1 - c["beta1"]) * g
                vel[n] = c["beta2"] * vel[n] + (1 - c["beta2"]) * g * g
                mhat = mom[n] / (1 - c["beta1"] ** t)
                vhat = vel[n] / (1 - c["beta2"] ** t)
                wd = c["weight_decay"] if n in hf_decayed else 0.0
                p -= c["lr"] * (mhat / (torch.sqrt(vhat) + c["eps"]) + wd * p)
        steps.append(dict(step=t, lr=c["lr"], loss=float(loss), grad_norm=norm, clipped=scale < 1.0))
    final = to_trident(args.family, sd(params), cfg_json)
    np.savez(os.path.join(args.out, "params_final.npz"), **final)
    # The float64 model (patches included) is the float32 one, up to float32's rounding: 1e-5
    # relative is ~100x float32's epsilon at loss ~6, far below what a wrong patch would move.
    rel = abs(loss32 - steps[0]["loss"]) / steps[0]["loss"]
    if rel > 1e-5:
        raise SystemExit(f"hf_oracle: float64 loss {steps[0]['loss']} vs float32 {loss32}")
    report = dict(family=args.family, loss_float32=loss32, config=cfg_json, B=B, T=T, train=dict(c, steps=args.steps),
                  decayed=decayed, loss=steps[0]["loss"], steps=steps)
    if router:
        # A choice closer than this could go the other way in trident's fp32 routing.
        if router.margin < MIN_MARGIN:
            raise SystemExit(f"hf_oracle: router margin {router.margin:.2e} < {MIN_MARGIN:.0e}: "
                             "change SEED or ROUTER_SCALE")
        report["router_margin"] = router.margin
    with open(os.path.join(args.out, "oracle.json"), "w") as f:
        json.dump(report, f, indent=1)
    norms = ", ".join("%.3f" % x["grad_norm"] for x in steps)
    print(f"hf_oracle {args.family}: loss {steps[0]['loss']:.6f}, norms {norms} -> {args.out}")


if __name__ == "__main__":
    main()
