"""Persistent GEMM launches against one program per tile, on the GPU, in one call.

The kernel's two grouped GEMMs either launch one program per (M-block, N-tile), as the engines
do, or a few programs per SM that loop over the filled tiles (`fused_moe(persistent=(p1, p2))`),
so that one tile's epilogue overlaps the next tile's loads. For GLM-5 TP8 (bf16 and fp8 block)
at large batch sizes this times, with the v4 tuned configs (bench/results/
kernel_device_h200_v4.json) and a few other GEMM-2 tiles: GEMM 1 alone, GEMM 2 alone and the
whole layer, per launch mode; checks first that persistent and per-tile outputs are bit for bit
the same at the real shapes.

    python3 bench/kernel_persistent.py --out "$OUT" [--sizes 512,1024,2048,3072,4096]

Prints a table per dtype; writes kernel_persistent.json under --out.
"""

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuning.search import KernelShape  # noqa: E402

V4_RESULTS = ROOT / "bench" / "results" / "kernel_device_h200_v4.json"
ITEMS = {
    "glm5:bf16": KernelShape(E=256, N=256, H=6144, top_k=8),
    "glm5:fp8_block": KernelShape(
        E=256, N=256, H=6144, top_k=8, dtype="fp8_w8a8", block_shape=(128, 128)
    ),
}
# (GEMM 1, GEMM 2) programs per SM; (0, 0) is the engines' launch
MODES = [(0, 0), (0, 1), (0, 2), (1, 1), (2, 2)]
# other GEMM-2 tiles worth a look once the launch is persistent (BLOCK_SIZE_M stays the tuned one)
DOWN_TILES = [(128, 64, 4, 3), (128, 64, 8, 3), (256, 64, 8, 3), (64, 128, 4, 3), (128, 128, 8, 2)]
REPLAYS = 20


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def tuned_configs(item: str) -> dict[int, tuple[dict, dict]]:
    batches = json.loads(V4_RESULTS.read_text())["phases"][item]["tune"]["batches"]
    return {int(m): (b["config"], b.get("down_config") or b["config"]) for m, b in batches.items()}


def check_same_output(shape, weights, m, config, down) -> bool:
    import torch

    from tuning.fused_moe import fused_moe
    from tuning.timing import LayerTimer

    timer = LayerTimer(shape, weights, m)
    kwargs = dict(config=config, down_config=down, **weights.layer_kwargs(shape))
    args = (timer.x[0], weights.w1, weights.w2, timer.topk_weights[0], timer.topk_ids[0])
    per_tile = fused_moe(*args, **kwargs)
    outputs = []
    for mode in MODES[1:]:
        out = torch.full_like(per_tile, float("nan"))
        fused_moe(*args, out=out, persistent=mode, **kwargs)
        outputs.append(torch.equal(out, per_tile))
    torch.cuda.synchronize()
    return all(outputs)


def gemm_parts(shape, weights, m, config, down, mode) -> tuple[float, float]:
    """µs of GEMM 1 and GEMM 2 alone (graphs of 4 calls, fresh routing per replay)."""
    import importlib

    import torch

    from tuning.timing import LayerTimer

    fm = importlib.import_module("tuning.fused_moe")
    scales = fm._scales_mode(shape.dtype, shape.block_shape)
    block_shape = list(shape.block_shape) if shape.block_shape else None
    timer = LayerTimer(shape, weights, m)
    pairs = m * shape.top_k
    blocks = [
        fm.sort_and_pad(timer.topk_ids[j], shape.E, config["BLOCK_SIZE_M"])
        for j in range(timer.calls)
    ]
    a1 = [fm._quantize_activations(x, scales, block_shape) for x in timer.x]
    h = [
        torch.randn((pairs, 2 * shape.N), dtype=torch.bfloat16, device="cuda")
        for _ in range(timer.calls)
    ]
    a2 = [fm._silu_and_mul(t, scales, block_shape) for t in h]
    y = [torch.empty((pairs, shape.H), dtype=torch.bfloat16, device="cuda") for _ in h]
    w1s, w2s = weights.w1_scale, weights.w2_scale

    def gemm1(j):
        fm._expert_gemm(
            a1[j][0], weights.w1, h[j], blocks[j], config, scales, block_shape, a1[j][1], w1s,
            shape.top_k, None, mode[0],
        )  # fmt: skip

    def gemm2(j):
        fm._expert_gemm(
            a2[j][0], weights.w2, y[j], blocks[j], down, scales, block_shape, a2[j][1], w2s, 1,
            timer.topk_weights[j].reshape(-1), mode[1],
        )  # fmt: skip

    return timer.time_layer(gemm1, REPLAYS), timer.time_layer(gemm2, REPLAYS)


def probe_item(item: str, sizes: list[int], record: dict) -> None:
    import torch

    from tuning.timing import LayerTimer, make_weights

    shape = ITEMS[item]
    weights = make_weights(shape)
    configs = tuned_configs(item)
    import tuning.fused_moe as fm

    m_check = sizes[-1]
    same = check_same_output(shape, weights, m_check, *configs[m_check])
    record["bit_identical"] = same
    log(f"{item}: persistent outputs bit for bit the per-tile ones at M={m_check}: {same}")
    rows = record.setdefault("rows", [])
    # the tile loop not flattened: is the cross-tile pipelining what moves the time?
    config, down = configs[m_check]
    fm.FLATTEN_PERSISTENT_LOOP = False
    try:
        timer = LayerTimer(shape, weights, m_check)
        for mode in MODES[1:3]:
            layer = timer.time_config(config, REPLAYS, down_config=down, persistent=mode)
            rows.append({"M": m_check, "mode": mode, "down": down, "layer": layer, "flat": False})
            log(f"  M={m_check} mode {mode} loop not flattened: layer {layer:.1f} µs")
    except Exception as exc:
        log(f"  not flattened failed: {type(exc).__name__}: {exc}"[:300])
    finally:
        fm.FLATTEN_PERSISTENT_LOOP = True
    for m in sizes:
        config, down = configs[m]
        timer = LayerTimer(shape, weights, m)
        for mode in MODES:
            try:
                layer = timer.time_config(config, REPLAYS, down_config=down, persistent=mode)
                g1, g2 = gemm_parts(shape, weights, m, config, down, mode)
            except Exception as exc:
                log(f"  M={m} {mode} failed: {type(exc).__name__}: {exc}"[:300])
                continue
            rows.append({"M": m, "mode": mode, "down": down, "layer": layer, "g1": g1, "g2": g2})
            log(f"  M={m} mode {mode}: layer {layer:.1f} µs, GEMM1 {g1:.1f}, GEMM2 {g2:.1f}")
        for bn, bk, warps, stages in DOWN_TILES:
            other = {
                **down,
                "BLOCK_SIZE_N": bn,
                "BLOCK_SIZE_K": bk,
                "num_warps": warps,
                "num_stages": stages,
            }
            if shape.block_shape and 128 % bk:
                continue
            for mode in [(0, 0), (0, 1)]:
                try:
                    layer = timer.time_config(config, REPLAYS, down_config=other, persistent=mode)
                except Exception as exc:
                    log(f"  M={m} down {other} {mode} failed: {type(exc).__name__}"[:300])
                    continue
                rows.append({"M": m, "mode": mode, "down": other, "layer": layer})
                log(f"  M={m} mode {mode} down {bn}x{bk} w{warps} s{stages}: layer {layer:.1f}")
        del timer
        torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", default="512,1024,2048,3072,4096")
    parser.add_argument("--items", default=",".join(ITEMS))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = [int(v) for v in args.sizes.split(",")]
    results: dict = {}
    status = 0
    for item in args.items.split(","):
        record = results.setdefault(item, {})
        try:
            probe_item(item, sizes, record)
        except Exception:
            status = 1
            record["error"] = traceback.format_exc()
            log(f"ERROR {item}:\n{record['error']}")
        (out / "kernel_persistent.json").write_text(json.dumps(results, indent=1) + "\n")
    for item, record in results.items():
        print(f"\n{item}: layer µs by launch mode (GEMM 1, GEMM 2 programs per SM; tuned configs)")
        by_m: dict = {}
        for row in record.get("rows", []):
            if "g1" in row:
                by_m.setdefault(row["M"], {})[tuple(row["mode"])] = row
        print("    M " + "".join(f"{str(m):>22}" for m in MODES))
        for m, modes in sorted(by_m.items()):
            cells = "".join(
                f"{modes[mode]['layer']:8.1f} ({modes[mode]['g1']:5.0f}/{modes[mode]['g2']:4.0f})"
                if mode in modes
                else f"{'-':>22}"
                for mode in MODES
            )
            print(f"{m:5d} {cells}")
    return status


if __name__ == "__main__":
    sys.exit(main())
