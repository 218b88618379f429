"""Check and time the fused-MoE kernel on the GPU in one call.

Correctness (bf16, fp8 per-tensor, fp8 block; GLM-5 and Kimi K2 at TP8; outputs poisoned first;
relative error against the float64 reference; a second run compared bit for bit), the ceilings
behind the floor (copy bandwidth, matrix rates), the 18-size tune per shape and dtype (GEMM 1's
config, then GEMM 2's own) with its wall time, the torch._grouped_mm baseline, the table (floor,
default, tuned, tuned with one config for both GEMMs, _grouped_mm µs, % of floor), where the time
goes at a few batch sizes, and the coarse-to-fine search against the exhaustive one at 3 sizes.

    python3 bench/kernel_device.py --out "$OUT" [--plan glm5:bf16,glm5:fp8_block] [--budget-s 540]

Prints the tables last; writes kernel_device.log and results.json (every figure, the config
files' text) under --out. A phase that would not fit in what is left of --budget-s is skipped.
"""

import argparse
import json
import math
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tuning.config_files import TUNED_BATCH_SIZES  # noqa: E402
from tuning.search import KernelShape, is_viable  # noqa: E402

SHAPES = {
    "glm5": {"E": 256, "N": 256, "H": 6144, "top_k": 8},
    "kimi": {"E": 384, "N": 256, "H": 7168, "top_k": 8},
}
DTYPES = {
    "bf16": ("bf16", None),
    "fp8_tensor": ("fp8_w8a8", None),
    "fp8_block": ("fp8_w8a8", (128, 128)),
}
# Relative-error bounds: bf16 operands (METHOD.md: 1e-3..1e-2); fp8 against the reference that
# applies the same fp8 rounding, where intermediate roundings still flip a few values.
TOLERANCE = {"bf16": 1e-2, "fp8_w8a8": 3e-2}
CORRECTNESS_M = (1, 37, 333)
ALTERNATE_CONFIG = {
    "BLOCK_SIZE_M": 32,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 16,
    "num_warps": 4,
    "num_stages": 4,
}
ALTERNATE_DOWN_CONFIG = {
    "BLOCK_SIZE_M": 32,
    "BLOCK_SIZE_N": 128,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 1,
    "num_warps": 8,
    "num_stages": 2,
}
# tiles two fp8 weight-scale blocks wide (a scale per column, as the engines rescale)
WIDE_CONFIG = {
    "BLOCK_SIZE_M": 64,
    "BLOCK_SIZE_N": 256,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 8,
    "num_warps": 8,
    "num_stages": 3,
}
BREAKDOWN_M = (1, 8, 64, 256, 1024, 4096)
# Rough seconds a phase needs, to skip what cannot finish inside the budget.
PHASE_COST_S = {"tune": 50, "exhaustive": 45, "correctness": 25, "baseline": 30}


class Run:
    """Log lines to stdout and kernel_device.log; results accumulate into results.json."""

    def __init__(self, out: Path, budget_s: float):
        self.out = out
        self.started = time.monotonic()
        self.budget_s = budget_s
        self.results: dict = {"phases": {}}
        self.tables: list[str] = []
        out.mkdir(parents=True, exist_ok=True)
        self._log = open(out / "kernel_device.log", "a")  # noqa: SIM115

    def log(self, message: str) -> None:
        line = f"[{time.monotonic() - self.started:6.1f}s] {message}"
        print(line, flush=True)
        self._log.write(line + "\n")
        self._log.flush()

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def fits(self, phase: str, name: str) -> bool:
        if self.left_s() >= PHASE_COST_S[phase]:
            return True
        self.log(f"SKIPPED {phase} {name}: {self.left_s():.0f} s left")
        self.results["phases"].setdefault("skipped", []).append(f"{phase} {name}")
        return False

    def save(self) -> None:
        (self.out / "results.json").write_text(json.dumps(self.results, indent=1) + "\n")


def environment(run: Run) -> None:
    import os

    import torch
    import triton

    props = torch.cuda.get_device_properties(0)
    info = {
        "device": torch.cuda.get_device_name(0),
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }
    run.results["environment"] = info
    run.log(f"environment {info}")


def check_correctness(run: Run) -> None:
    """Kernel vs float64 reference at the real shapes; poisoned outputs; a second run."""
    import torch

    from tuning.fused_moe import default_config, fused_moe
    from tuning.reference import moe_reference
    from tuning.timing import make_weights, random_routing

    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for shape_name, dims in SHAPES.items():
        for dtype_name, (dtype, block_shape) in DTYPES.items():
            shape = KernelShape(**dims, dtype=dtype, block_shape=block_shape)
            weights = make_weights(shape, seed=len(rows) + 1)
            kwargs = weights.layer_kwargs(shape)
            configs = {"default": (None, None)}
            if shape_name == "glm5" and is_viable(ALTERNATE_CONFIG, shape):
                configs["alternate"] = (ALTERNATE_CONFIG, ALTERNATE_DOWN_CONFIG)
            if is_viable(WIDE_CONFIG, shape):
                configs["wide"] = (WIDE_CONFIG, None)
            for M in CORRECTNESS_M:
                torch.manual_seed(1000 + M)
                x = torch.randn((M, shape.H), device="cuda", dtype=torch.bfloat16)
                topk_weights, topk_ids = random_routing(1, M, shape.E, shape.top_k, seed=M)
                topk_weights, topk_ids = topk_weights[0], topk_ids[0]
                ref = moe_reference(
                    x, weights.w1, weights.w2, topk_weights, topk_ids, **kwargs
                ).float()
                for config_name, (config, down_config) in configs.items():
                    outs = []
                    for _ in range(2):
                        out = torch.full_like(x, float("nan"))
                        fused_moe(
                            x,
                            weights.w1,
                            weights.w2,
                            topk_weights,
                            topk_ids,
                            config=config,
                            down_config=down_config,
                            out=out,
                            **kwargs,
                        )
                        outs.append(out)
                    torch.cuda.synchronize()
                    out = outs[0].float()
                    unwritten = int((~torch.isfinite(out)).sum())
                    error = float((out - ref).norm() / ref.norm())
                    repeat_differs = int((outs[0] != outs[1]).sum())
                    used = config or default_config(
                        M, shape.E, shape.N, shape.H, shape.top_k, dtype, block_shape
                    )
                    ok = unwritten == 0 and error <= TOLERANCE[dtype] and repeat_differs == 0
                    row = {
                        "shape": shape_name,
                        "dtype": dtype_name,
                        "M": M,
                        "config": config_name,
                        "rel_error": error,
                        "unwritten": unwritten,
                        "repeat_differs": repeat_differs,
                        "ok": ok,
                        "used": used,
                        "down": down_config,
                    }
                    rows.append(row)
                    run.log(
                        f"{'PASS' if ok else 'FAIL'} {shape_name} {dtype_name} M={M} {config_name}:"
                        f" rel err {error:.2e} (≤ {TOLERANCE[dtype]:.0e}), unwritten {unwritten},"
                        f" repeat differs {repeat_differs}"
                    )
            del weights
            torch.cuda.empty_cache()
    run.results["correctness"] = rows
    failed = sum(not r["ok"] for r in rows)
    run.tables.append(f"correctness: {len(rows) - failed}/{len(rows)} checks pass")
    run.save()


def measure(run: Run) -> dict:
    from tuning.timing import measure_ceilings

    ceilings = vars(measure_ceilings())
    run.results["ceilings"] = ceilings
    run.log(
        f"ceilings: copy {ceilings['bandwidth_tbps']:.2f} TB/s, bf16 {ceilings['bf16_tflops']:.0f}"
        f" TFLOP/s, fp8 {ceilings['fp8_tflops'] or float('nan'):.0f} TFLOP/s"
    )
    run.save()
    return ceilings


def tune_plan_item(run: Run, item: str, ceilings: dict):
    """Tune one shape:dtype over the 18 sizes; baseline, table, breakdown. Returns the result."""
    import torch

    from tuning.bench import BenchRow, format_table
    from tuning.timing import DeviceCeilings, LayerTimer, layout_floor_us, make_weights
    from tuning.tune_results import write_config_files
    from tuning.tuner import Tuner

    shape_name, dtype_name = item.split(":")
    dtype, block_shape = DTYPES[dtype_name]
    shape = KernelShape(**SHAPES[shape_name], dtype=dtype, block_shape=block_shape)
    record: dict = {"shape": shape.as_dict()}
    run.results["phases"][item] = record
    started = time.monotonic()

    def progress(done: int, total: int, message: str) -> None:
        if done == total or done % 10 == 0:
            run.log(f"  {item} tune {done}/{total} {message}")

    with Tuner(shape, ceilings=ceilings) as tuner:
        record["setup_s"] = round(time.monotonic() - started, 1)
        result = tuner.tune(TUNED_BATCH_SIZES, progress_callback=progress)
        record["tune_wall_s"] = round(time.monotonic() - started, 1)
        record["compile_s"] = round(tuner.compile_s, 1)
        record["tune"] = result.to_dict()
        out_dir = run.out / "configs"
        record["config_files"] = {}
        for style in ("vllm", "sglang"):
            for path in write_config_files(result, out_dir, style):
                record["config_files"][str(path.relative_to(out_dir))] = path.read_text()
                path.unlink()
        run.log(
            f"{item}: tuned 18 sizes in {record['tune_wall_s']} s (compile {record['compile_s']}"
            f" s), geomean default/tuned {result.speedup_geomean() or float('nan'):.2f}x"
        )
        run.save()

        rows = []
        bf16_shape = replace(shape, dtype="bf16", block_shape=None)
        bf16_weights = (
            tuner.measurements.weights if shape == bf16_shape else make_weights(bf16_shape)
        )
        for m, b in sorted(result.batches.items()):
            gmm = None
            if run.left_s() > 20:
                try:
                    gmm = round(LayerTimer(bf16_shape, bf16_weights, m).time_grouped_mm(20), 2)
                except Exception as exc:
                    run.log(f"  grouped_mm M={m} failed: {type(exc).__name__}: {exc}"[:300])
            rows.append(
                BenchRow(
                    m,
                    b.floor_us,
                    b.default_us,
                    b.tuned_us,
                    gmm,
                    b.config,
                    shared_config_us=b.shared_config_us,
                    down_config=b.down_config,
                    layout_floor_us=round(layout_floor_us(shape, m, DeviceCeilings(**ceilings)), 2),
                )
            )
        del bf16_weights
        torch.cuda.empty_cache()
        record["table"] = [
            vars(r)
            | {
                "percent_of_floor": r.percent_of_floor,
                "percent_of_layout_floor": r.percent_of_layout_floor,
            }
            for r in rows
        ]
        table = format_table(rows)
        summary = _summary(rows, result)
        record["summary"] = summary
        run.tables.append(
            f"{item} ({shape.as_dict()}), tune wall {record['tune_wall_s']} s\n{table}"
        )
        run.tables.append(f"{item} summary: {summary}")
        run.log("\n" + table)
        run.save()

        if run.left_s() > 40:
            record["breakdown"] = breakdown(run, tuner, shape, result)
            run.save()
    return result


def exhaustive_check(run: Run, item: str, smart, ceilings: dict, sizes) -> None:
    """The exhaustive search at `sizes` for a shape tuned earlier (its own process state last,
    so that nothing it does can disturb the other figures)."""
    from tuning.tuner import Tuner

    with Tuner(smart.shape, ceilings=ceilings) as tuner:
        run.results["phases"][f"exhaustive {item}"] = check_search(run, tuner, smart, sizes)


def check_search(run: Run, tuner, smart, sizes) -> list[dict]:
    """Exhaustive search at `sizes`; both winners re-timed side by side (40 replays)."""
    started = time.monotonic()
    exhaustive = tuner.tune(sizes, exhaustive=True)
    run.results["exhaustive_tune"] = exhaustive.to_dict()
    run.save()
    rows = []
    for m in sizes:
        smart_config = smart.batches[m].config
        best_config = exhaustive.batches[m].config
        smart_us, best_us = tuner.time_configs(
            m,
            [smart_config, best_config],
            replays=40,
            down_configs=[smart.batches[m].down_config, exhaustive.batches[m].down_config],
        )
        if smart_us is None or best_us is None:
            run.log(f"search check M={m}: a winner failed to run again ({smart_us}, {best_us})")
            continue
        row = {
            "M": m,
            "coarse_to_fine": smart_config,
            "exhaustive": best_config,
            "down": [smart.batches[m].down_config, exhaustive.batches[m].down_config],
            "coarse_to_fine_us": smart_us,
            "exhaustive_us": best_us,
            "ratio": smart_us / best_us,
            "tried": [smart.batches[m].candidates_tried, exhaustive.batches[m].candidates_tried],
        }
        rows.append(row)
        run.log(
            f"search check M={m}: coarse-to-fine {smart_us:.1f} µs ({row['tried'][0]} tried),"
            f" exhaustive {best_us:.1f} µs ({row['tried'][1]} tried): ratio {row['ratio']:.3f}"
        )
    run.tables.append(
        "search vs exhaustive: "
        + ", ".join(f"M={r['M']} {100 * (r['ratio'] - 1):+.1f}%" for r in rows)
        + f" (exhaustive took {time.monotonic() - started:.0f} s)"
    )
    return rows


def breakdown(run: Run, tuner, shape, result) -> list[dict]:
    """Time sort-and-pad, GEMM 1 and GEMM 2 alone with the tuned configs; the rest is
    activation, quantisation and the top-k sum. Achieved TB/s of each GEMM's weight bytes."""
    import torch

    rows = []
    for m in BREAKDOWN_M:
        row = _breakdown_at(m, tuner.measurements.weights, shape, result.batches[m])
        rows.append(row)
        run.log(f"breakdown {row}")
        torch.cuda.empty_cache()
    run.tables.append(
        "where the time goes (µs): "
        + "; ".join(
            f"M={r['M']}: layer {r['layer_us']:.0f} = align {r['sort_and_pad']:.0f} + gemm1"
            f" {r['gemm1']:.0f} ({r['gemm1_tbps']} TB/s, {r['gemm1_tflops']} TFLOP/s) + gemm2"
            f" {r['gemm2']:.0f} ({r['gemm2_tbps']} TB/s, {r['gemm2_tflops']} TFLOP/s) + rest"
            f" {r['rest_us']:.0f}"
            for r in rows
        )
    )
    return rows


def _breakdown_at(m, weights, shape, batch) -> dict:
    import importlib

    import torch

    from tuning.timing import LayerTimer, routed_experts

    fm = importlib.import_module("tuning.fused_moe")
    ops = importlib.import_module("tuning.moe_ops")
    config = batch.config
    down = batch.down_config or config
    scales = ops.scales_mode(shape.dtype, shape.block_shape)
    block_shape = list(shape.block_shape) if shape.block_shape else None
    timer = LayerTimer(shape, weights, m)
    pairs = m * shape.top_k
    bm = config["BLOCK_SIZE_M"]
    blocks = [ops.sort_and_pad(timer.topk_ids[j], shape.E, bm) for j in range(timer.calls)]
    a1 = [ops.quantize_activations(x, scales, block_shape) for x in timer.x]
    h = [
        torch.randn((pairs, 2 * shape.N), dtype=torch.bfloat16, device="cuda")
        for _ in range(timer.calls)
    ]
    a2 = [ops.silu_and_mul(t, scales, block_shape) for t in h]
    y = [torch.empty((pairs, shape.H), dtype=torch.bfloat16, device="cuda") for _ in h]
    w1s, w2s = weights.w1_scale, weights.w2_scale
    if scales == 1:
        w1s, w2s = w1s.reshape(-1).float(), w2s.reshape(-1).float()

    def gemm1(j):
        a, a_scale = a1[j]
        fm.expert_gemm(
            a,
            weights.w1,
            h[j],
            blocks[j],
            config,
            scales,
            block_shape,
            a_scale,
            w1s,
            shape.top_k,
            None,
        )

    def gemm2(j):
        a, a_scale = a2[j]
        fm.expert_gemm(
            a,
            weights.w2,
            y[j],
            blocks[j],
            down,
            scales,
            block_shape,
            a_scale,
            w2s,
            1,
            timer.topk_weights[j].reshape(-1),
        )

    def align(j):
        ops.sort_and_pad(timer.topk_ids[j], shape.E, bm)

    parts = {
        "sort_and_pad": timer.time_layer(align, 20),
        "gemm1": timer.time_layer(gemm1, 20),
        "gemm2": timer.time_layer(gemm2, 20),
    }
    w_bytes = routed_experts(shape, m) * shape.N * shape.H * shape.operand_bytes
    return {
        "M": m,
        "config": config,
        "down_config": down,
        "layer_us": batch.tuned_us,
        **{k: round(v, 2) for k, v in parts.items()},
        "rest_us": round(batch.tuned_us - sum(parts.values()), 2),
        "gemm1_tbps": round(2 * w_bytes / parts["gemm1"] / 1e6, 2),
        "gemm2_tbps": round(w_bytes / parts["gemm2"] / 1e6, 2),
        "gemm1_tflops": round(2 * pairs * 2 * shape.N * shape.H / parts["gemm1"] / 1e6, 1),
        "gemm2_tflops": round(2 * pairs * shape.N * shape.H / parts["gemm2"] / 1e6, 1),
    }


def _summary(rows, result) -> dict:
    gmm_ratios = [r.grouped_mm_us / r.best_us for r in rows if r.grouped_mm_us and r.best_us]
    floor_pct = {r.M: round(r.percent_of_floor, 1) for r in rows if r.percent_of_floor}
    speedup = result.speedup_geomean()
    return {
        "geomean_default_over_tuned": round(speedup, 3) if speedup else None,
        "min_grouped_mm_over_tuned": round(min(gmm_ratios), 2) if gmm_ratios else None,
        "geomean_grouped_mm_over_tuned": round(
            math.exp(sum(map(math.log, gmm_ratios)) / len(gmm_ratios)), 2
        )
        if gmm_ratios
        else None,
        "min_percent_of_floor_M_ge_64": min(
            (p for m, p in floor_pct.items() if m >= 64), default=None
        ),
        "percent_of_floor": floor_pct,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget-s", type=float, default=540)
    parser.add_argument(
        "--plan",
        default="glm5:bf16,glm5:fp8_block,kimi:bf16,kimi:fp8_block",
        help="shape:dtype items to tune, in order",
    )
    parser.add_argument("--exhaustive-sizes", default="16,256,1024")
    parser.add_argument("--exhaustive-item", default="glm5:bf16")
    parser.add_argument("--skip-correctness", action="store_true")
    args = parser.parse_args()
    run = Run(Path(args.out), args.budget_s)
    sizes = [int(v) for v in args.exhaustive_sizes.split(",") if v]
    status = 0
    phases = [("environment", lambda: environment(run))]
    if not args.skip_correctness:
        phases.append(("correctness", lambda: check_correctness(run)))
    ceilings: dict = {}
    tuned: dict = {}
    phases.append(("ceilings", lambda: ceilings.update(measure(run))))
    for item in args.plan.split(","):
        phases.append(
            (item, lambda item=item: tuned.update({item: tune_plan_item(run, item, ceilings)}))
        )
    if sizes and args.exhaustive_item in args.plan.split(","):
        item = args.exhaustive_item
        phases.append(
            ("exhaustive", lambda: exhaustive_check(run, item, tuned[item], ceilings, sizes))
        )
    for name, phase in phases:
        cost = "tune" if ":" in name else name
        if cost in PHASE_COST_S and not run.fits(cost, name):
            continue
        try:
            phase()
        except Exception:
            status = 1
            run.log(f"ERROR in {name}:\n{traceback.format_exc()}")
            run.results["phases"].setdefault("errors", []).append(
                {"phase": name, "traceback": traceback.format_exc()}
            )
        run.save()
    run.log(f"total {time.monotonic() - run.started:.0f} s")
    print("\n" + "\n\n".join(run.tables), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
