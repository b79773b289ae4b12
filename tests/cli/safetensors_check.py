#!/usr/bin/python3
"""What tests/cli/test_export.sh checks outside trident, with numpy and h5py only.

  safetensors_check.py compare CKPT OUT.safetensors OUT.bin
      every tensor of trident's safetensors export and of its llm.c export against the HDF5
      checkpoint CKPT (index.h5's global tensors), bitwise, with GPT-2's names, Conv1D's
      [in, out] orientation and the real vocabulary's wte rows; the padded rows are zero.
  safetensors_check.py variants GOOD.safetensors DIR
      writes DIR/<case>/model.safetensors files made from GOOD (bad ones, and good ones in
      other spellings: no prefix, F16, BF16, a tied lm_head) and DIR/cases.tsv: one line per
      case, `case<TAB>expect`, expect being `ok` or a regex trident's error must match.
  safetensors_check.py widened A.safetensors B.safetensors DTYPE
      B (trident's re-export of the DTYPE variant) holds A's tensors rounded to DTYPE.

The safetensors reader here is written from the format's description (8-byte little-endian
header length, JSON header, raw little-endian data after it), not from any library.
"""
import json
import os
import re
import struct
import sys

import numpy as np

BLOCK = [("ln1w", "ln_1.weight", False), ("ln1b", "ln_1.bias", False),
         ("qkvw", "attn.c_attn.weight", True), ("qkvb", "attn.c_attn.bias", False),
         ("attprojw", "attn.c_proj.weight", True), ("attprojb", "attn.c_proj.bias", False),
         ("ln2w", "ln_2.weight", False), ("ln2b", "ln_2.bias", False),
         ("fcw", "mlp.c_fc.weight", True), ("fcb", "mlp.c_fc.bias", False),
         ("fcprojw", "mlp.c_proj.weight", True), ("fcprojb", "mlp.c_proj.bias", False)]
DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": None}


def read_safetensors(path):
    """(header dict, {name: numpy array}, raw bytes) of a safetensors file."""
    blob = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    tensors = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = np.frombuffer(data[b:end], dtype=np.uint16 if e["dtype"] == "BF16" else DTYPES[e["dtype"]])
        if e["dtype"] == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = raw.reshape(e["shape"])
    return header, tensors, blob


def write_safetensors(path, tensors, metadata, dtype="F32"):
    """Writes {name: float32 array} as DTYPE (F32, F16, or BF16 by truncation)."""
    header, chunks, offset = {}, [], 0
    for name, a in tensors.items():
        if dtype == "F32":
            raw = a.astype("<f4").tobytes()
        elif dtype == "F16":
            raw = a.astype("<f2").tobytes()
        else:
            raw = (a.astype("<f4").view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def read_llmc(path):
    blob = open(path, "rb").read()
    h = np.frombuffer(blob[:1024], dtype="<i4")
    assert h[0] == 20240326 and h[1] == 3, f"{path}: header {h[:8]}"
    maxT, V, L, NH, C, Vp = (int(x) for x in h[2:8])
    shapes = [("wte", (Vp, C)), ("wpe", (maxT, C))]
    per_layer = {"ln1w": (C,), "ln1b": (C,), "qkvw": (3 * C, C), "qkvb": (3 * C,), "attprojw": (C, C),
                 "attprojb": (C,), "ln2w": (C,), "ln2b": (C,), "fcw": (4 * C, C), "fcb": (4 * C,),
                 "fcprojw": (C, 4 * C), "fcprojb": (C,)}
    out, at = {}, 1024
    for name, shape in shapes + [(k, (L,) + s) for k, s in per_layer.items()] + [("lnfw", (C,)), ("lnfb", (C,))]:
        count = int(np.prod(shape))
        a = np.frombuffer(blob[at:at + 4 * count], dtype="<f4").reshape(shape)
        at += 4 * count
        if len(shape) > 0 and name in per_layer:
            for l in range(L):
                out[f"h{l}.{name}"] = a[l]
        else:
            out[name] = a
    assert at == len(blob), f"{path}: {len(blob)} bytes, tensors end at {at}"
    return (maxT, V, L, NH, C, Vp), out


def checkpoint_params(ckpt):
    import h5py
    path = os.path.join(ckpt, "index.h5")
    if not os.path.exists(path):
        path = os.path.join(ckpt, "latest", "index.h5")
    with h5py.File(path, "r") as index:
        return {name: np.array(index["params"][name]) for name in index["params"]}


def bitwise(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def compare(ckpt, st_path, llmc_path):
    params = checkpoint_params(ckpt)
    (maxT, V, L, NH, C, Vp), llmc = read_llmc(llmc_path)
    header, tensors, blob = read_safetensors(st_path)
    errors = []
    meta = header.get("__metadata__")
    if meta != {"format": "pt", "n_head": str(NH)}:
        errors.append(f"__metadata__ {meta}, expected format pt and n_head {NH}")
    (n,) = struct.unpack_from("<Q", blob, 0)
    if (8 + n) % 8:
        errors.append(f"the data starts at byte {8 + n}, not 8-byte aligned")
    expected = {"wte.weight": ("wte", False), "wpe.weight": ("wpe", False),
                "ln_f.weight": ("lnfw", False), "ln_f.bias": ("lnfb", False)}
    for l in range(L):
        for ours, hf, transposed in BLOCK:
            expected[f"h.{l}.{hf}"] = (f"h{l}.{ours}", transposed)
    names = {"transformer." + k for k in expected}
    if set(tensors) != names:
        errors.append(f"names: missing {sorted(names - set(tensors))}, extra {sorted(set(tensors) - names)}")
    # The checkpoint keeps wte's real vocabulary (docs/decisions.md, Checkpoints), llm.c's file
    # the padded rows, which must be zero.
    if params["wte"].shape[0] != V:
        errors.append(f"checkpoint wte {params['wte'].shape}, expected {V} rows")
    if np.any(llmc["wte"][V:] != 0):
        errors.append(f"llm.c wte: padded rows {V}..{Vp} are not zero")
    for hf, (ours, transposed) in expected.items():
        ref = params[ours]
        got = tensors.get("transformer." + hf)
        want = ref.T.copy() if transposed else ref
        if got is None or not bitwise(got, want):
            errors.append(f"safetensors {hf}: {None if got is None else got.shape} differs from checkpoint {ours} {want.shape}")
        mine = llmc[ours][:V] if ours == "wte" else llmc[ours]
        if not bitwise(mine, ref):
            errors.append(f"llm.c {ours} {mine.shape} differs from checkpoint {ref.shape}")
    if errors:
        sys.exit("\n".join(errors))
    print(f"{len(expected)} tensors bitwise equal to the checkpoint in both files (layers {L}, "
          f"vocab {V} of {Vp} padded, heads {NH}, Conv1D weights transposed)")


def variants(good, out):
    header, tensors, blob = read_safetensors(good)
    meta = header["__metadata__"]
    (n,) = struct.unpack_from("<Q", blob, 0)
    text = blob[8:8 + n].decode()
    data = blob[8 + n:]
    cases = []

    def raw(case, content, expect):
        path = os.path.join(out, case, "model.safetensors")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "wb").write(content)
        cases.append((case, expect))

    def edited(case, edit, expect):
        h = json.loads(text)
        edit(h)
        t = json.dumps(h).encode()
        raw(case, struct.pack("<Q", len(t)) + t + data, expect)

    def rebuilt(case, ts, metadata, expect, dtype="F32", config=None):
        write_safetensors(os.path.join(out, case, "model.safetensors"), ts, metadata, dtype)
        if config is not None:
            json.dump(config, open(os.path.join(out, case, "config.json"), "w"))
        cases.append((case, expect))

    qkv = "transformer.h.0.attn.c_attn.weight"
    last = max((e["data_offsets"][1], k) for k, e in header.items() if k != "__metadata__")[1]
    raw("header_length", struct.pack("<Q", len(blob)) + blob[8:], r"header length [0-9]+ runs past the end of the file")
    raw("short", blob[:5], r"shorter than the 8-byte header length")
    broken = text.replace('"dtype"', '"dtype', 1).encode()
    raw("bad_json", struct.pack("<Q", len(broken)) + broken + data, r"header is not valid JSON")
    edited("dtype", lambda h: h[qkv].update(dtype="I32"), re.escape(qkv) + r": dtype I32 not supported")
    edited("unknown_dtype", lambda h: h[qkv].update(dtype="F31"), re.escape(qkv) + r': unknown dtype "F31"')
    edited("shape", lambda h: h[qkv].update(shape=h[qkv]["shape"][::-1]),
           re.escape(qkv) + r": shape \[[0-9]+, [0-9]+\], .* needs \[[0-9]+, [0-9]+\] \(Conv1D")
    edited("size", lambda h: h[qkv].update(shape=[h[qkv]["shape"][0], 1]),
           re.escape(qkv) + r": data_offsets \[[0-9]+, [0-9]+\] hold [0-9]+ bytes")
    edited("past_end", lambda h: h[last].update(data_offsets=[x + 8 for x in h[last]["data_offsets"]]),
           re.escape(last) + r": data_offsets \[[0-9]+, [0-9]+\] run past the end of the data")
    edited("overlap", lambda h: h[qkv].update(data_offsets=[x - 4 for x in h[qkv]["data_offsets"]]),
           r": data_offsets begin at [0-9]+, inside the tensor before it")
    edited("offsets_type", lambda h: h[qkv].update(data_offsets=[-1, 5]), re.escape(qkv) + r": data_offsets must hold")
    edited("no_heads", lambda h: h.pop("__metadata__"), r"number of attention heads is neither in __metadata__")
    edited("heads_divide", lambda h: h["__metadata__"].update(n_head="7"), r"__metadata__ n_head = 7 does not divide")
    bare = {k[len("transformer."):]: v for k, v in tensors.items()}
    missing = dict(bare)
    missing.pop("h.1.mlp.c_proj.bias")
    rebuilt("missing", missing, meta, r"no tensor h\.1\.mlp\.c_proj\.bias")
    rebuilt("unknown", {**bare, "h.0.attn.c_attn.lora": bare["h.0.ln_1.bias"]}, meta,
            r"tensor h\.0\.attn\.c_attn\.lora: not a GPT-2 parameter")
    rebuilt("twice", {**bare, "transformer.wpe.weight": bare["wpe.weight"]}, meta, r"the same GPT-2 parameter twice")
    wrong_head = bare["wte.weight"].copy()
    wrong_head[0, 0] += 1
    rebuilt("untied_head", {**bare, "lm_head.weight": wrong_head}, meta, r"lm_head\.weight differs from wte\.weight")
    # Good files: the hub's spelling (no prefix, heads in config.json, mask buffers, a tied
    # lm_head), and widened dtypes.
    T = bare["wpe.weight"].shape[0]
    hub = dict(bare)
    for l in range(sum(1 for k in bare if k.endswith(".ln_1.weight"))):
        hub[f"h.{l}.attn.bias"] = np.tril(np.ones((T, T), np.float32)).reshape(1, 1, T, T)
    hub["lm_head.weight"] = bare["wte.weight"]
    rebuilt("hub", hub, {"format": "pt"}, "ok", config={"n_head": int(meta["n_head"]), "model_type": "gpt2"})
    rebuilt("f16", tensors, meta, "ok", dtype="F16")
    rebuilt("bf16", tensors, meta, "ok", dtype="BF16")
    with open(os.path.join(out, "cases.tsv"), "w") as f:
        for case, expect in cases:
            f.write(f"{case}\t{expect}\n")
    print(f"{len(cases)} cases in {out}")


def widened(a_path, b_path, dtype):
    _, a, _ = read_safetensors(a_path)
    _, b, _ = read_safetensors(b_path)
    bad = []
    for name, x in a.items():
        if dtype == "F16":
            want = x.astype(np.float16).astype(np.float32)
        else:
            want = ((x.view(np.uint32) >> 16) << 16).view(np.float32)
        if name not in b or not bitwise(b[name], want):
            bad.append(name)
    if bad:
        sys.exit(f"{dtype}: {len(bad)} tensors differ from the rounded originals: {bad[:4]}")
    print(f"{dtype}: all {len(a)} tensors read back as the {dtype} values, widened exactly")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"compare": compare, "variants": variants, "widened": widened}[cmd](*args)
