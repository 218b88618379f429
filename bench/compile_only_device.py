"""Do kernels compiled with no GPU (tuning.compile_only) serve the GPU's launches? One device call.

For GLM-5 TP8 bf16 and fp8 block: the tuner's compile pool compiles round one of batch sizes
1, 64 and 1024 (tuning.tuner.round_one_configs) for this GPU into an empty Triton cache, with no
CUDA context in its processes; then this process launches the layer on the GPU with every
config that compiled. Prints per shape the configs, the compile failures, the pool's seconds,
the kernels in Triton's cache, those the launches compiled (none: every launch found its
kernels in the cache) and the slowest first launch. Exits 1 when a launch compiled anything.
With --engine vllm --source DIR, the engine's kernel instead (tuning.backends), compiled at each
of the batch sizes as a tune compiles it: vLLM 0.34's TMA variants (USE_TMA true and false)
among them, whose path the launcher picks by where B lives.

    python3 bench/compile_only_device.py [--engine vllm --source DIR]
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


def launch_layer(shape, weights, x, topk_weights, topk_ids, config) -> None:
    """One layer call on the GPU with config, waited for."""
    import torch

    from tuning.fused_moe import fused_moe

    fused_moe(
        x,
        weights.w1,
        weights.w2,
        topk_weights,
        topk_ids,
        config=config,
        **weights.layer_kwargs(shape),
    )
    torch.cuda.synchronize()


def check(name: str, shape: KernelShape, cache: Path, engine: dict | None = None) -> bool:
    import torch

    from tuning import timing
    from tuning.backends import load_backend
    from tuning.compile_only import gpu_target
    from tuning.compile_pool import CompilePool, default_workers
    from tuning.tuner import round_one_configs

    backend = load_backend(engine["engine"], source_dir=engine["source_dir"]) if engine else None
    # an engine's kernel specialises on the batch size: one size, compiled and launched at it
    sizes = [64] if engine else [1, 64, 1024]
    target = gpu_target()
    configs = round_one_configs(shape, sizes, backend=backend, shared_memory=target.shared_memory)
    started = time.monotonic()
    pool = CompilePool(shape, default_workers(), backend=engine)
    try:
        errors = pool.compile(configs, target, tuple(sizes))
    finally:
        pool.close()
    pool_s = time.monotonic() - started
    before = kernel_binaries(cache)
    small = shape if engine else replace(shape, E=shape.top_k)
    weights = timing.make_weights(small)
    M = sizes[0] if engine else 16
    topk_weights, topk_ids = timing.random_routing(1, M, small.E, small.top_k)
    x = torch.randn((M, shape.H), device="cuda", dtype=timing.activation_dtype(shape))
    slowest = 0.0
    for config, error in zip(configs, errors, strict=True):
        if error is not None:
            continue
        launched = time.monotonic()
        if backend is None:
            launch_layer(small, weights, x, topk_weights[0], topk_ids[0], config)
        else:
            out = torch.empty_like(x)
            backend.layer(
                x, weights, topk_weights[0], topk_ids[0], shape=shape, config=config, out=out
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


def explain_fp8_block_miss() -> None:
    """For one fp8-block config at the real E and M: the specialisation of each kernel a GPU
    launch asks for beside the one compiled with no GPU (as a compile process does); prints what
    differs, i.e. why a launch cannot use what the compile processes built. Run in a process of
    its own (--explain): it switches Triton's driver back and forth."""
    import json

    import torch
    import triton
    from triton.runtime import driver

    from tuning import compile_pool, timing

    fm = sys.modules["tuning.fused_moe"]
    from tuning.compile_only import compile_only_driver, gpu_target

    shape = SHAPES["GLM-5 fp8 block"]
    config = {
        "BLOCK_SIZE_M": 64,
        "BLOCK_SIZE_N": 256,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 16,
        "num_warps": 4,
        "num_stages": 3,
    }
    kernels = [v for v in vars(fm).values() if isinstance(v, triton.runtime.jit.JITFunction)]
    seen: dict = {}

    def hook(**kwargs):
        data = json.loads(kwargs["compile"]["specialization_data"])
        seen.setdefault(kwargs["fn"].name.split(".")[-1], []).append(data)
        return False

    triton.knobs.runtime.jit_cache_hook = hook
    # the timing process: real E and M on the GPU
    target = gpu_target()
    weights = timing.make_weights(shape)
    topk_weights, topk_ids = timing.random_routing(1, 1024, shape.E, shape.top_k)
    x = torch.randn((1024, shape.H), device="cuda", dtype=torch.bfloat16)
    launch_layer(shape, weights, x, topk_weights[0], topk_ids[0], config)
    launched = {k: list(v) for k, v in seen.items()}
    seen.clear()
    for kernel in kernels:
        kernel.device_caches.clear()
    # a compile process: no GPU, small E, unset CPU tensors
    compile_pool.set_up_compile_worker(shape.as_dict())
    driver.set_active(compile_only_driver(target))
    error = compile_pool.compile_in_worker(config, target)
    print(f"compile-only: {error or 'compiled'}")
    triton.knobs.runtime.jit_cache_hook = None
    for name, launches in launched.items():
        for i, launch in enumerate(launches):
            others = seen.get(name, [])
            if launch in others:
                print(f"{name} #{i}: the same specialisation as a no-GPU compile")
                continue
            print(f"{name} #{i}: no no-GPU compile matches ({len(others)} of its name):")
            for other in others[:2]:
                for key in sorted(set(launch) | set(other)):
                    if launch.get(key) != other.get(key):
                        print(f"    {key}: launch {str(launch.get(key))[:400]}")
                        print(f"    {' ' * len(key)}  no GPU {str(other.get(key))[:400]}")


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        os.environ["TRITON_CACHE_DIR"] = folder
        import torch

        torch.cuda.set_device(0)
        if "--explain" in sys.argv:
            explain_fp8_block_miss()
            return 0
        engine = None
        if "--engine" in sys.argv:
            engine = {
                "engine": sys.argv[sys.argv.index("--engine") + 1],
                "source_dir": sys.argv[sys.argv.index("--source") + 1],
            }
        shapes = {"GLM-5 fp8 block": SHAPES["GLM-5 fp8 block"]} if engine else SHAPES
        ok = [check(name, shape, Path(folder), engine) for name, shape in shapes.items()]
    print("every launch found its kernels in the cache" if all(ok) else "a launch compiled")
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
