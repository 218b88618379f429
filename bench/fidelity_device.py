"""Do the configs moeops tunes suit the engines' layer? One device call.

Our GEMM 1 computes silu-and-mul (in fp8 block also its quantisation, with BLOCK_SIZE_N 256) in
its epilogue; the engines' GEMM 1 writes gate and up and a separate kernel does the activation.
Per shape: tune as moeops does, tune again with that fusion off (the engines' layer), and time
both picks with the fusion off. regret = the engines' layer with our pick / with its own pick − 1:
what a config file from moeops costs an engine against one tuned on the engines' layer. (The
fusion-off tune compiles its kernels in this process: the compile processes build fused ones.)

    python3 bench/fidelity_device.py [--plan glm5:bf16,glm5:fp8_block] [--sizes 1,64,...]
"""

import argparse
import contextlib
import importlib
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernel_device import DTYPES, SHAPES  # noqa: E402

from tuning.search import KernelShape  # noqa: E402

REPLAYS = 40


@contextlib.contextmanager
def engines_layer():
    """fused_moe with GEMM 1 and the activation kernel apart, as the engines run them."""
    fm = importlib.import_module("tuning.fused_moe")
    fuses = fm.fuses_silu_and_mul
    fm.fuses_silu_and_mul = lambda *args: False
    try:
        yield
    finally:
        fm.fuses_silu_and_mul = fuses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", default="glm5:bf16,glm5:fp8_block")
    parser.add_argument("--sizes", default="1,8,64,256,1024,2048,4096")
    args = parser.parse_args()
    import torch

    from tuning import timing, tuner

    torch.cuda.set_device(0)
    sizes = [int(v) for v in args.sizes.split(",")]
    for item in args.plan.split(","):
        shape_name, dtype_name = item.split(":")
        dtype, block_shape = DTYPES[dtype_name]
        shape = KernelShape(**SHAPES[shape_name], dtype=dtype, block_shape=block_shape)
        started = time.monotonic()
        ours = tuner.tune(shape, sizes)
        ours_s = time.monotonic() - started
        with engines_layer():
            theirs = tuner.tune(shape, sizes)
        print(
            f"{item}: tuned in {ours_s:.0f} s,"
            f" fusion off in {time.monotonic() - started - ours_s:.0f} s"
        )
        weights = timing.make_weights(shape)
        print(
            f"{'M':>5} {'same':>5} {'our pick µs':>11} {'their pick µs':>13} {'regret':>7}"
            "  our pick"
        )
        ratios = []
        for m in sizes:
            a, b = ours.batches[m], theirs.batches[m]
            same = (a.config, a.down_config) == (b.config, b.down_config)
            timer = timing.LayerTimer(shape, weights, m)
            with engines_layer():
                t_ours = timer.time_config(a.config, REPLAYS, down_config=a.down_config)
                t_theirs = (
                    t_ours
                    if same
                    else timer.time_config(b.config, REPLAYS, down_config=b.down_config)
                )
            ratios.append(t_ours / t_theirs)
            print(
                f"{m:>5} {str(same):>5} {t_ours:>11.1f} {t_theirs:>13.1f}"
                f" {100 * (t_ours / t_theirs - 1):>+6.1f}%  {a.config} / {a.down_config}"
            )
        geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(
            f"{item}: regret geomean {100 * (geomean - 1):+.1f}%,"
            f" max {100 * (max(ratios) - 1):+.1f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
