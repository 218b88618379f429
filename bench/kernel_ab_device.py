"""A kernel change against a base version, the layer timed side by side on one GPU (one call).

    git show REV:tuning/fused_moe.py > bench/ab_base_fused_moe.py   (here; git ignores it,
    so the device call names it in carry)
    python3 bench/kernel_ab_device.py --base bench/ab_base_fused_moe.py --configs DIR \
        [--plan glm5:fp8_block,kimi:fp8_block,glm5:bf16] [--sizes 64,256,1024,2048,4096]

Per shape, batch size M and config (the tuned one from DIR, SGLang's files with their _down
files as `python -m tuning tune --style sglang --out DIR` writes them under triton_X_Y_Z/; the
default; in fp8 block "wide", the tuned tile two weight-scale
blocks wide in both GEMMs): the base module's fused_moe and the current one
on the same inputs and weights, each timed three times in turn (tuning.timing.LayerTimer: CUDA
graphs of 4 calls, fresh routing per replay); prints the median µs of each, current/base, and
the relative difference of their outputs. --profile instead runs each case's layer once between
cudaProfilerStart/Stop after two warm-up calls, for `ncu --profile-from-start off`.
"""

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernel_device import DTYPES, SHAPES  # noqa: E402

from tuning.config_files import config_file_name, entry_for_batch, loads_config  # noqa: E402
from tuning.search import KernelShape  # noqa: E402

REPEATS = 3


def tuned_entries(shape: KernelShape, folder: Path, *, down: bool) -> dict[int, dict]:
    dtype = shape.dtype if shape.dtype == "fp8_w8a8" else None
    name = config_file_name(
        shape.E, shape.N, "NVIDIA H200", dtype, shape.block_shape, style="sglang", down_moe=down
    )
    return loads_config((folder / name).read_text())[1]


def load_base(path: str):
    spec = importlib.util.spec_from_file_location("ab_base_fused_moe", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def cases(plan: str, sizes: list[int], folder: Path, kinds=("tuned", "default", "wide")):
    """(label, shape, M, kind, config, down_config) for every plan item, size and config kind;
    tuned configs from the SGLang files in folder."""
    from tuning.fused_moe import default_config

    for item in plan.split(","):
        shape_name, dtype_name = item.split(":")
        dtype, block_shape = DTYPES[dtype_name]
        shape = KernelShape(**SHAPES[shape_name], dtype=dtype, block_shape=block_shape)
        block_shape = list(block_shape) if block_shape else None
        entries = tuned_entries(shape, folder, down=False)
        down_entries = tuned_entries(shape, folder, down=True)
        for m in sizes:
            tuned = entry_for_batch(entries, m)
            configs = {
                "tuned": (tuned, entry_for_batch(down_entries, m)),
                "default": (
                    default_config(m, shape.E, shape.N, shape.H, shape.top_k, dtype, block_shape),
                    None,
                ),
            }
            if block_shape:
                # the tuned tile two weight-scale blocks wide, in both GEMMs
                configs["wide"] = ({**tuned, "BLOCK_SIZE_N": 2 * block_shape[0]}, None)
            for kind in kinds:
                if kind in configs:
                    yield (item, shape, m, kind, *configs[kind])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="the base version's tuning/fused_moe.py")
    parser.add_argument("--plan", default="glm5:fp8_block,kimi:fp8_block,glm5:bf16")
    parser.add_argument("--sizes", default="64,256,1024,2048,4096")
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument(
        "--configs", required=True, help="folder of SGLang config files (its triton_X_Y_Z/)"
    )
    parser.add_argument("--kinds", default="tuned,default,wide", help="config kinds to time")
    parser.add_argument("--profile", action="store_true", help="one layer per case, for ncu")
    args = parser.parse_args()
    import torch

    from tuning import timing
    from tuning.fused_moe import fused_moe

    sizes = [int(v) for v in args.sizes.split(",")]
    base = None if args.profile else load_base(args.base)
    weights, current_shape = None, None
    print(f"{'case':16} {'M':>5} {'config':8} {'base µs':>9} {'current µs':>10} {'ratio':>6} diff")
    kinds = args.kinds.split(",")
    for item, shape, m, kind, config, down_config in cases(
        args.plan, sizes, Path(args.configs), kinds
    ):
        if shape != current_shape:
            # one shape's weights at a time (Kimi K2's bf16 experts are 4.2 GB)
            weights, current_shape = None, shape
            torch.cuda.empty_cache()
            weights = timing.make_weights(shape)
        timer = timing.LayerTimer(shape, weights, m)
        kwargs = {**weights.layer_kwargs(shape), "config": config, "down_config": down_config}
        if args.profile:
            if kind != "tuned":
                continue
            layer = layer_calls(fused_moe, timer, weights, kwargs)
            layer(0)
            layer(0)
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            layer(0)
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            print(f"{item:16} {m:>5} profiled {config} down {down_config}")
            continue
        outputs = []
        for module in (base, sys.modules["tuning.fused_moe"]):
            out = module.fused_moe(*timer_args(timer, weights, 0), **kwargs)
            outputs.append(out.double())
        diff = float((outputs[0] - outputs[1]).norm() / outputs[0].norm())
        times: dict[str, list[float]] = {"base": [], "current": []}
        for _ in range(REPEATS):
            for label, module in (("base", base), ("current", sys.modules["tuning.fused_moe"])):
                layer = layer_calls(module.fused_moe, timer, weights, kwargs)
                times[label].append(timer.time_layer(layer, args.replays))
        b, c = (sorted(times[k])[REPEATS // 2] for k in ("base", "current"))
        print(f"{item:16} {m:>5} {kind:8} {b:>9.1f} {c:>10.1f} {c / b:>6.3f} {diff:.1e}")
    return 0


def layer_calls(fused_moe, timer, weights, kwargs):
    """layer(j): call slot j of timer through fused_moe."""
    return lambda j: fused_moe(*timer_args(timer, weights, j), out=timer.out[j], **kwargs)


def timer_args(timer, weights, j: int) -> tuple:
    return timer.x[j], weights.w1, weights.w2, timer.topk_weights[j], timer.topk_ids[j]


if __name__ == "__main__":
    sys.exit(main())
