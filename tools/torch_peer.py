"""The torch peer's settings, shared by tools/bench_torch.py and tools/bench_llama.py (and
tools/bench_mixtral.py): our benchmarks compare trident with Debian's torch 1.13 at the best
setting found for torch on the machine, not as it ships (issue 46, part 5).

Two environment variables decide torch's speed on the CPU here, and both are read once, when
the libraries load (libopenblas's constructor, libgomp's), so they must be in the environment
before `import torch`; setting them after has no effect. `with_env` therefore re-executes the
script with them set, before anything imports torch.

- OMP_WAIT_POLICY=passive: torch's idle OpenMP workers otherwise spin beside OpenBLAS's own
  pthreads on the same cores (Debian's OpenBLAS is the pthread build); docs/perf.md measured
  torch's Llama step up to 3.5x faster with it.
- OPENBLAS_CORETYPE: OpenBLAS 0.3.21 does not know this CPU (family 6 model 207) and picks
  Prescott (SSE3) by itself. FAIR_CORE is the core measured fastest for torch here
  (docs/perf.md, "Against the fair torch peer").

This module imports nothing heavy: it must be importable before torch is.
"""
import ctypes
import os
import sys

# The best setting measured for torch on this machine
# (docs/perf.md, "Against the fair torch peer").
FAIR_CORE = "SkylakeX"
FAIR_WAIT = "passive"
KEYS = ("OPENBLAS_CORETYPE", "OMP_WAIT_POLICY")
# Set in the re-executed process, so that it does not re-execute again.
MARK = "TRIDENT_TORCH_PEER_ENV"


def wanted(blas_core, wait_policy):
    """The environment {key: value or None (unset)} for the options' values; 'default' unsets."""
    return {"OPENBLAS_CORETYPE": None if blas_core == "default" else blas_core,
            "OMP_WAIT_POLICY": None if wait_policy == "default" else wait_policy}


def with_env(env):
    """Makes this process run with env (from `wanted`): returns at once when the environment
    already says so, else re-executes the same command with it (never returns). Exits when
    torch or OpenBLAS is already loaded: the settings could no longer take effect."""
    now = {k: os.environ.get(k) or None for k in KEYS}
    if now == env:
        return
    if os.environ.get(MARK):
        sys.exit(f"torch_peer: the re-executed process still has {now}, not {env}")
    if "torch" in sys.modules or "numpy" in sys.modules:
        sys.exit("torch_peer: torch (or numpy, hence OpenBLAS) is already imported; "
                 "set the environment before importing it")
    new = {k: v for k, v in os.environ.items() if k not in KEYS}
    new.update({k: v for k, v in env.items() if v is not None})
    new[MARK] = "1"
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable] + sys.argv, new)


def blas_core_loaded():
    """The OpenBLAS core this process runs (after torch is imported), or 'unknown'."""
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return "unknown"


def describe():
    """`OPENBLAS_CORETYPE=... OMP_WAIT_POLICY=...` as this process has them ('unset': not set)."""
    return " ".join(f"{k}={os.environ.get(k) or 'unset'}" for k in KEYS)
