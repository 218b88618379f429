"""Where does a tune's time go in the timing process? Kernels Triton builds or loads there.

Tunes GLM-5 TP8 in bf16 and fp8 block at a few batch sizes (coarse-to-fine with the down
search, compile pool as in production, an empty Triton cache) and records, through Triton's JIT
hooks, every kernel the timing process itself had to produce (a miss of Triton's in-memory
cache): its name, its constexprs and the seconds until it was ready (a kernel the compile pool
built loads from disk in milliseconds; one it did not is compiled here, in seconds). Prints per
shape the tune's wall time, the pool's compile seconds, and those kernels grouped by name.

    python3 bench/jit_in_tune_device.py [--sizes 64,1024,2048]   (device)
"""

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from compile_only_device import SHAPES  # noqa: E402

from tuning.search import KernelShape  # noqa: E402

# a kernel ready within this many seconds came from the disk cache
LOADED_S = 0.3


class JitLog:
    """Triton's jit_cache_hook (before a kernel is produced) and jit_post_compile_hook (after)."""

    def __init__(self):
        self.pending: dict = {}
        self.kernels: list[tuple[str, float, str]] = []

    def before(self, **kwargs) -> bool:
        self.pending[id(kwargs["key"])] = time.monotonic()
        return False

    def after(self, **kwargs) -> bool:
        started = self.pending.pop(id(kwargs["key"]), None)
        name = kwargs["fn"].name.split(".")[-1]
        compiled = kwargs["compile"]
        params = [p.name for p in kwargs["fn"].jit_function.params]
        named = {
            params[k[0]] if isinstance(k, tuple) and len(k) == 1 else str(k): v
            for k, v in compiled.get("constants", {}).items()
        }
        described = ", ".join(f"{k}={v}" for k, v in named.items() if k.isupper())
        described += f", warps={compiled.get('num_warps')}, stages={compiled.get('num_stages')}"
        self.kernels.append((name, time.monotonic() - (started or time.monotonic()), described))
        return False


def tune_one(name: str, shape: KernelShape, sizes: list[int]) -> None:
    import triton

    from tuning.tuner import Tuner

    log = JitLog()
    triton.knobs.runtime.jit_cache_hook = log.before
    triton.knobs.runtime.jit_post_compile_hook = log.after
    started = time.monotonic()
    with Tuner(shape) as tuner:
        tuner.tune(sizes)
        compile_s = tuner.compile_s
    wall = time.monotonic() - started
    triton.knobs.runtime.jit_cache_hook = None
    triton.knobs.runtime.jit_post_compile_hook = None
    by_name: dict = defaultdict(lambda: [0, 0.0, 0, 0.0])
    for kernel, seconds, _ in log.kernels:
        row = by_name[kernel]
        if seconds < LOADED_S:
            row[0] += 1
            row[1] += seconds
        else:
            row[2] += 1
            row[3] += seconds
    print(f"{name}: sizes {sizes}, tune {wall:.1f} s, pool compiles {compile_s:.1f} s")
    print(f"  {'kernel':28} {'loaded':>7} {'s':>6} {'compiled here':>14} {'s':>6}")
    for kernel, (loaded, loaded_s, built, built_s) in sorted(by_name.items()):
        print(f"  {kernel:28} {loaded:>7} {loaded_s:>6.1f} {built:>14} {built_s:>6.1f}")
    slow = sorted((k for k in log.kernels if k[1] >= LOADED_S), key=lambda k: -k[1])
    for kernel, seconds, described in slow[:12]:
        print(f"    {seconds:5.1f} s {kernel} {described[:220]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,1024,2048")
    args = parser.parse_args()
    sizes = [int(v) for v in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        os.environ["TRITON_CACHE_DIR"] = folder
        for name, shape in SHAPES.items():
            tune_one(name, shape, sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
