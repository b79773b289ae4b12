"""Writers of llm.c's file formats, in numpy, written from llm.c's spec (train_gpt2.py's
write_model / write_tensors and dev/data's write_datafile), independently of trident's reader.

GPT-2 checkpoint, version 3 (fp32):
  int32[256] header: [0] magic 20240326, [1] version 3, [2] maxT, [3] V, [4] L, [5] NH, [6] C,
                     [7] Vp (V padded), the rest zero;
  then fp32 tensors, little-endian, each C-contiguous, in this order (every per-layer tensor is
  all L layers stacked, layer 0 first):
    wte[Vp,C] wpe[maxT,C] ln1w[L,C] ln1b[L,C] qkvw[L,3C,C] qkvb[L,3C] attprojw[L,C,C]
    attprojb[L,C] ln2w[L,C] ln2b[L,C] fcw[L,4C,C] fcb[L,4C] fcprojw[L,C,4C] fcprojb[L,C]
    lnfw[C] lnfb[C]
  Linear weights are PyTorch's layout [out, in]; qkvw's rows are q | k | v. wte's rows V..Vp-1
  are padding (llm.c writes zeros there).

Token shard, version 1:
  int32[256] header: [0] magic 20240520, [1] version 1, [2] n_tokens; then uint16 tokens.
"""
import numpy as np

CHECKPOINT_MAGIC = 20240326
CHECKPOINT_VERSION = 3
SHARD_MAGIC = 20240520
SHARD_VERSION = 1

# (name, shape given the config): llm.c's order.
def tensor_shapes(maxT, V, Vp, L, NH, C):
    del V, NH  # not part of any shape (V only through Vp)
    return [
        ("wte", (Vp, C)),
        ("wpe", (maxT, C)),
        ("ln1w", (L, C)),
        ("ln1b", (L, C)),
        ("qkvw", (L, 3 * C, C)),
        ("qkvb", (L, 3 * C)),
        ("attprojw", (L, C, C)),
        ("attprojb", (L, C)),
        ("ln2w", (L, C)),
        ("ln2b", (L, C)),
        ("fcw", (L, 4 * C, C)),
        ("fcb", (L, 4 * C)),
        ("fcprojw", (L, C, 4 * C)),
        ("fcprojb", (L, C)),
        ("lnfw", (C,)),
        ("lnfb", (C,)),
    ]

ORDER = [name for name, _ in tensor_shapes(1, 1, 1, 1, 1, 1)]


def random_gpt2(maxT, V, Vp, L, NH, C, seed, pad_fill=0.0):
    """A random GPT-2 in llm.c's tensor shapes (float32). Scales near GPT-2's initialisation,
    LayerNorm weights around 1 and biases non-zero, so that every term of the forward matters.
    wte's padded rows are set to `pad_fill` (llm.c: 0)."""
    assert Vp >= V and C % NH == 0
    rng = np.random.default_rng(seed)
    w = {}
    for name, shape in tensor_shapes(maxT, V, Vp, L, NH, C):
        if name in ("ln1w", "ln2w", "lnfw"):
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("b"):
            a = 0.02 * rng.standard_normal(shape)
        elif name in ("wte", "wpe"):
            a = 0.1 * rng.standard_normal(shape)
        else:
            fan_in = shape[-1]
            a = rng.standard_normal(shape) / np.sqrt(fan_in)
        w[name] = a.astype(np.float32)
    w["wte"][V:] = pad_fill
    return w


def write_checkpoint(path, weights, maxT, V, Vp, L, NH, C):
    header = np.zeros(256, dtype="<i4")
    header[:8] = [CHECKPOINT_MAGIC, CHECKPOINT_VERSION, maxT, V, L, NH, C, Vp]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for name, shape in tensor_shapes(maxT, V, Vp, L, NH, C):
            a = np.ascontiguousarray(weights[name], dtype="<f4")
            if a.shape != shape:
                raise ValueError(f"{name}: shape {a.shape}, expected {shape}")
            f.write(a.tobytes())


def write_token_shard(path, tokens):
    tokens = np.asarray(tokens)
    if tokens.min() < 0 or tokens.max() >= 1 << 16:
        raise ValueError("llm.c version 1 shards hold uint16 tokens")
    header = np.zeros(256, dtype="<i4")
    header[:3] = [SHARD_MAGIC, SHARD_VERSION, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())
