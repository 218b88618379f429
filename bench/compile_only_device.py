"""Do kernels compiled with no GPU (tuning.compile_only) serve the GPU's launches? One device call.

For GLM-5 TP8 bf16 and fp8 block: the tuner's compile pool compiles round one of batch sizes
1, 64 and 1024 (tuning.tuner.round_one_configs) for this GPU into an empty Triton cache, with no
CUDA context in its processes; then this process launches the layer on the GPU with every
config that compiled. Prints per shape the configs, the compile failures, the pool's seconds,
the kernels in Triton's cache, those the launches compiled (none: every launch found its
kernels in the cache) and the slowest first launch. Exits 1 when a launch compiled anything.

    python3 bench/compile_only_device.py
"""

import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuning.search import KernelShape  # noqa: E402

SHAPES = {
    "GLM-5 bf16": KernelShape(E=256, N=256, H=6144, top_k=8),
    "GLM-5 fp8 block": KernelShape(
        E=256, N=256, H=6144, top_k=8, dtype="fp8_w8a8", block_shape=(128, 128)
    ),
}


def kernel_binaries(cache: Path) -> set[Path]:
    """The compiled kernels in Triton's cache (its launcher modules, built on a process's first
    launches, are not kernels)."""
    return set(cache.rglob("*.cubin"))


def check(name: str, shape: KernelShape, cache: Path) -> bool:
    import torch

    from tuning import timing
    from tuning.compile_only import gpu_target
    from tuning.fused_moe import fused_moe
    from tuning.tuner import _CompilePool, _default_workers, round_one_configs

    configs = round_one_configs(shape, [1, 64, 1024])
    started = time.monotonic()
    pool = _CompilePool(shape, _default_workers())
    try:
        errors = pool.compile(configs, gpu_target())
    finally:
        pool.close()
    pool_s = time.monotonic() - started
    before = kernel_binaries(cache)
    small = replace(shape, E=shape.top_k)
    weights = timing.make_weights(small)
    topk_weights, topk_ids = timing.random_routing(1, 16, small.E, small.top_k)
    x = torch.randn((16, shape.H), device="cuda", dtype=timing.activation_dtype(shape))
    slowest = 0.0
    for config, error in zip(configs, errors, strict=True):
        if error is not None:
            continue
        launched = time.monotonic()
        fused_moe(
            x,
            weights.w1,
            weights.w2,
            topk_weights[0],
            topk_ids[0],
            config=config,
            **weights.layer_kwargs(small),
        )
        torch.cuda.synchronize()
        slowest = max(slowest, time.monotonic() - launched)
    added = sorted(p.name for p in kernel_binaries(cache) - before)
    failed = [e for e in errors if e is not None]
    print(
        f"{name:16} {len(configs)} configs, {len(failed)} failed to compile, pool {pool_s:.1f} s;"
        f" {len(before)} kernels in the cache, {len(added)} compiled by the launches"
        f" {added}; slowest first launch {1000 * slowest:.0f} ms"
    )
    for error in sorted(set(failed)):
        print(f"  failure: {error}")
    return not added


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        os.environ["TRITON_CACHE_DIR"] = folder
        import torch

        torch.cuda.set_device(0)
        ok = [check(name, shape, Path(folder)) for name, shape in SHAPES.items()]
    print("every launch found its kernels in the cache" if all(ok) else "a launch compiled")
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
