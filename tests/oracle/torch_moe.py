"""Two mixture-of-experts layers in PyTorch float64, written from the definition
(Note [Mixture of experts] in include/trident/model_config.h, Note [Expert capacity] and
Note [Auxiliary losses] in src/model/moe.h), not from trident's code: y1 = moe(x),
y2 = moe(y1), and autograd of

    J = <y2, dout> + loss_scale · (Σ_l switch_l + hf + Σ_l z_l)

with the routing decisions (each token's top k, the capacity's drops, the counts) constants.

cfg keys: C E k Fe activation (swiglu | gelu_tanh | gelu_erf) router (softmax | sigmoid)
norm_topk capacity_factor shared_experts shared_gate aux (none | switch | hf) aux_coeff z_coeff
N loss_scale. Tensors per layer, trident's layout: expfcw [E·fcr, C] (expert e's rows
[e·fcr, (e+1)·fcr), SwiGLU's gate | up), expfcprojw [E·C, Fe], router [E, C], routerbias [E]
(sigmoid), shfcw [fcr(Fs), C], shfcprojw [C, Fs], shgate [1, C].
"""
import math

import numpy as np
import torch

GRAD_NAMES = ("expfcw", "expfcprojw", "router", "shfcw", "shfcprojw", "shgate")


def gelu_tanh(h):
    return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h**3)))


def gelu_erf(h):
    return 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))


def silu(h):
    return h / (1.0 + torch.exp(-h))


def activation(h, kind, width):
    if kind == "swiglu":
        return silu(h[..., :width]) * h[..., width:]
    return gelu_tanh(h) if kind == "gelu_tanh" else gelu_erf(h)


def fc_rows(cfg, width):
    return 2 * width if cfg["activation"] == "swiglu" else width


def mlp(x, w1, w2, kind, width):
    """act(x · w1ᵀ) · w2ᵀ, no biases."""
    return activation(x @ w1.T, kind, width) @ w2.T


def top_k(score, k):
    """Each row's k largest scores, ties to the lower index (a stable sort keeps index order)."""
    s = score.detach().numpy()
    return np.argsort(-s, axis=1, kind="stable")[:, :k]


def capacity_keep(top, E, N, k, factor):
    """Note [Expert capacity]: cap = ceil(f·N·k/E) choices an expert, in token order then choice
    order; f = 0 keeps all. factor is the fp32 value trident reads."""
    cap = math.ceil(float(np.float32(factor)) * N * k / E) if factor > 0 else N * k
    kept = np.zeros(E, dtype=np.int64)
    keep = np.zeros(top.shape, dtype=bool)
    for t in range(N):
        for j in range(k):
            e = top[t, j]
            if kept[e] < cap:
                keep[t, j] = True
                kept[e] += 1
    return keep, cap


def moe_layer(cfg, x, w):
    """One mixture layer: its output and what the losses and the checks read."""
    E, k, Fe, N = cfg["E"], cfg["k"], cfg["Fe"], x.shape[0]
    C, kind = cfg["C"], cfg["activation"]
    logits = x @ w["router"].T
    if cfg["router"] == "softmax":
        p = torch.softmax(logits, dim=1)
        score = p
    else:
        p = torch.sigmoid(logits)
        score = p + w["routerbias"]
    top = top_k(score, k)
    plain_top = top_k(p, k)  # without the bias: the sigmoid case checks that the bias mattered
    topt = torch.from_numpy(top)
    weight = torch.gather(p, 1, topt)
    if cfg["norm_topk"]:
        weight = weight / weight.sum(dim=1, keepdim=True)  # over all k, dropped ones too
    keep, cap = capacity_keep(top, E, N, k, cfg["capacity_factor"])
    fcr = fc_rows(cfg, Fe)
    # Every expert on every token, [E, N, C]; each token then reads its chosen ones.
    ys = torch.stack([
        mlp(x, w["expfcw"][e * fcr:(e + 1) * fcr], w["expfcprojw"][e * C:(e + 1) * C], kind, Fe)
        for e in range(E)
    ])
    rows = torch.arange(N)
    out = torch.zeros_like(x)
    keep_t = torch.from_numpy(keep).to(x.dtype)
    for j in range(k):
        out = out + (keep_t[:, j] * weight[:, j])[:, None] * ys[topt[:, j], rows]
    if cfg["shared_experts"] > 0:
        Fs = cfg["shared_experts"] * Fe
        shared = mlp(x, w["shfcw"], w["shfcprojw"], kind, Fs)
        if cfg["shared_gate"]:
            shared = shared * torch.sigmoid(x @ w["shgate"].T)
        out = out + shared
    count = np.bincount(top.ravel(), minlength=E)
    psum = p.sum(dim=0)
    sorted_scores = np.sort(score.detach().numpy(), axis=1)[:, ::-1]
    margin = (sorted_scores[:, k - 1] - sorted_scores[:, k]).min() if k < E else float("inf")
    return {
        "out": out, "logits": logits, "p": p, "psum": psum, "top": top,
        "plain_top": plain_top, "keep": keep, "cap": cap, "count": count,
        "dropped": int((~keep).sum()), "margin": float(margin)
    }


def switch_aux(cfg, r, N):
    """Per layer: coeff · E/(N²k) · Σᵢ (Σₜ pₜᵢ) · countᵢ."""
    E, k = cfg["E"], cfg["k"]
    count = torch.from_numpy(r["count"]).to(torch.float64)
    return cfg["aux_coeff"] * E / (N * N * k) * (r["psum"] * count).sum()


def hf_aux(cfg, rs, N):
    """Across the L layers: coeff · E/(LN)² · Σᵢ (Σₗ countₗᵢ)(Σₗ Σₜ pₗₜᵢ)."""
    E, L = cfg["E"], len(rs)
    count = torch.from_numpy(sum(r["count"] for r in rs)).to(torch.float64)
    psum = sum(r["psum"] for r in rs)
    return cfg["aux_coeff"] * E / (L * N)**2 * (count * psum).sum()


def z_loss(cfg, r):
    """z_coeff · mean over tokens of logsumexp(logits)²."""
    return cfg["z_coeff"] * (torch.logsumexp(r["logits"], dim=1)**2).mean()


def run(cfg, x, weights, dout, aux_form=None):
    """x, dout [N, C] and weights (two dicts of numpy arrays) → the outputs, gradients and figures
    the probe writes, in float64. aux_form overrides cfg["aux"] (the test's alternatives)."""
    N = x.shape[0]
    aux = cfg["aux"] if aux_form is None else aux_form
    t = lambda a: torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True)
    xt = t(x)
    ws = [{name: t(a) for name, a in w.items()} for w in weights]
    r1 = moe_layer(cfg, xt, ws[0])
    y1 = r1["out"]
    y1.retain_grad()
    r2 = moe_layer(cfg, y1, ws[1])
    rs = [r1, r2]
    terms = {"switch": [0.0, 0.0], "z": [0.0, 0.0], "hf": 0.0}
    extra = torch.zeros((), dtype=torch.float64)
    for l, r in enumerate(rs):
        if aux == "switch":
            terms["switch"][l] = switch_aux(cfg, r, N)
        elif aux == "switch_times_k":  # the alternative the hf case must differ from
            terms["switch"][l] = cfg["k"] * switch_aux(cfg, r, N)
        if cfg["z_coeff"] > 0:
            terms["z"][l] = z_loss(cfg, r)
        extra = extra + terms["switch"][l] + terms["z"][l]
    if aux == "hf":
        terms["hf"] = hf_aux(cfg, rs, N)
        extra = extra + terms["hf"]
    J = (r2["out"] * torch.from_numpy(np.asarray(dout, dtype=np.float64))).sum()
    J = J + cfg["loss_scale"] * extra
    J.backward()
    f = lambda v: float(v.detach()) if torch.is_tensor(v) else float(v)
    res = {
        "y1": y1.detach().numpy(), "y2": r2["out"].detach().numpy(),
        "dy1": y1.grad.numpy(), "dx": xt.grad.numpy(),
        "switch": [f(v) for v in terms["switch"]], "z": [f(v) for v in terms["z"]],
        "hf": f(terms["hf"]), "layers": rs
    }
    for l, w in enumerate(ws):
        for name in GRAD_NAMES:
            if name in w:
                res[f"l{l + 1}.d{name}"] = w[name].grad.numpy()
    return res
