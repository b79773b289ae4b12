"""GPT-2 in PyTorch, written from the GPT-2 definition (Radford et al. 2019; OpenAI's gpt-2
model.py), as an oracle for trident's maths:
  x = wte[tokens] + wpe[0..T-1]
  per block (pre-LN):  x = x + attproj(causal_self_attention(ln1(x)))
                       x = x + fcproj(gelu_tanh(fc(ln2(x))))
  logits = lnf(x) @ wte[:V]^T   (LM head tied to the token embedding; padded rows unused)
  loss = mean over the B*T tokens of cross-entropy(logits, targets)
Attention scores are q.k / sqrt(head_dim) with a causal mask; LayerNorm has eps 1e-5 and the
biased variance; GELU is the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
Each operation is spelled out (no nn.LayerNorm, F.gelu or scaled_dot_product_attention), so
the constants are the ones written here.
"""
import math

import numpy as np
import torch

LN_EPS = 1e-5
GELU_CUBIC = 0.044715


def layernorm(x, w, b):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # biased, as GPT-2
    return (x - mean) / torch.sqrt(var + LN_EPS) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + GELU_CUBIC * x ** 3)))


def linear(x, w, b):  # w is [out, in] as PyTorch's nn.Linear
    return x @ w.t() + b


def causal_self_attention(x, qkvw, qkvb, NH):
    B, T, C = x.shape
    hs = C // NH
    q, k, v = linear(x, qkvw, qkvb).split(C, dim=-1)
    q = q.view(B, T, NH, hs).transpose(1, 2)  # [B, NH, T, hs]
    k = k.view(B, T, NH, hs).transpose(1, 2)
    v = v.view(B, T, NH, hs).transpose(1, 2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(future, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v
    return y.transpose(1, 2).reshape(B, T, C)


class GPT2:
    """Parameters are leaf tensors named as llm.c's checkpoint (per-layer tensors stacked
    [L, ...]), so gradients and AdamW state line up with the file, tensor by tensor."""

    def __init__(self, weights, V, NH, dtype=torch.float32):
        self.V, self.NH = V, NH
        self.params = {name: torch.tensor(np.asarray(a), dtype=dtype, requires_grad=True)
                       for name, a in weights.items()}

    def loss(self, inputs, targets):
        p, V = self.params, self.V
        inputs = torch.as_tensor(np.asarray(inputs), dtype=torch.long)
        targets = torch.as_tensor(np.asarray(targets), dtype=torch.long)
        B, T = inputs.shape
        x = p["wte"][inputs] + p["wpe"][:T]
        for l in range(p["ln1w"].shape[0]):
            h = layernorm(x, p["ln1w"][l], p["ln1b"][l])
            h = causal_self_attention(h, p["qkvw"][l], p["qkvb"][l], self.NH)
            x = x + linear(h, p["attprojw"][l], p["attprojb"][l])
            h = layernorm(x, p["ln2w"][l], p["ln2b"][l])
            h = gelu_tanh(linear(h, p["fcw"][l], p["fcb"][l]))
            x = x + linear(h, p["fcprojw"][l], p["fcprojb"][l])
        x = layernorm(x, p["lnfw"], p["lnfb"])
        logits = x @ p["wte"][:V].t()
        logp = torch.log_softmax(logits, dim=-1)
        return -logp.gather(-1, targets.unsqueeze(-1)).mean()

    def zero_grad(self):
        for t in self.params.values():
            t.grad = None

    def loss_and_grads(self, inputs, targets):
        self.zero_grad()
        loss = self.loss(inputs, targets)
        loss.backward()
        return loss.item(), {n: t.grad.detach().numpy().copy() for n, t in self.params.items()}
