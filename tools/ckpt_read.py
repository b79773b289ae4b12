#!/usr/bin/python3
"""Read a global tensor of a trident checkpoint with h5py, through index.h5's virtual datasets.

usage: tools/ckpt_read.py CKPT [NAME] [--count N | --all]

  CKPT   a checkpoint directory (.../step_00000100) or a checkpoint.dir (its `latest` is used)
  NAME   a global tensor, e.g. params/h0.qkvw; without it, the tensors are listed

Prints, for NAME:
  tensor params/h0.qkvw
  shape 12 4
  nan 0                   elements that read as NaN (the index's fill value: a shard missing)
  values 0 1 2 ...        the first N elements in row-major order (default 8), %.9g

Needs h5py (Debian: python3-h5py, hence /usr/bin/python3). The shards are found next to
index.h5 whatever the working directory (HDF5 >= 1.10.2 resolves relative VDS source names
against the directory of the file holding the virtual dataset).
"""
import argparse
import os
import sys

import h5py
import numpy as np


def checkpoint_dir(path):
    if os.path.exists(os.path.join(path, "index.h5")):
        return path
    latest = os.path.join(path, "latest")
    if os.path.exists(os.path.join(latest, "index.h5")):
        return latest
    sys.exit(f"ckpt_read.py: {path}: neither a checkpoint (no index.h5) nor a checkpoint.dir")


def list_tensors(index):
    names = []
    index.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    for name in names:
        print(f"{name} {' '.join(str(d) for d in index[name].shape)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("name", nargs="?")
    ap.add_argument("--count", type=int, default=8)
    ap.add_argument("--all", action="store_true")
    args = ap.parse_args()
    with h5py.File(os.path.join(checkpoint_dir(args.ckpt), "index.h5"), "r") as index:
        if args.name is None:
            list_tensors(index)
            return
        if args.name not in index:
            sys.exit(f"ckpt_read.py: no tensor {args.name} in {args.ckpt}")
        data = np.asarray(index[args.name][()], dtype=np.float32)
        flat = data.reshape(-1)
        shown = flat if args.all else flat[: args.count]
        print(f"tensor {args.name}")
        print(f"shape {' '.join(str(d) for d in data.shape)}")
        print(f"nan {int(np.isnan(flat).sum())}")
        print("values " + " ".join("%.9g" % v for v in shown))


if __name__ == "__main__":
    main()
