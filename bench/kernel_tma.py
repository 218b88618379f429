"""Weight tiles by TMA descriptor against pointer loads, on the GPU, in one call.

`tuning.fused_moe.B_TMA` switches how the grouped GEMMs load each expert's weight tile: a TMA
descriptor over w [E·rows, cols] (the activation rows stay gathered by pointer loads) or the
engines' pointer loads. For GLM-5 TP8 (bf16 and fp8 block) this times, with the v4 tuned configs
(bench/results/kernel_device_h200_v4.json), the whole layer at the 18 batch sizes and GEMM 1 /
GEMM 2 alone at a few, both ways; it first checks that both ways give the same output bit for bit.

    python3 bench/kernel_tma.py --out "$OUT"

Prints a table per dtype; writes kernel_tma.json under --out.
"""

import argparse
import importlib
import json
import math
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
PARTS_M = (64, 1024, 4096)
REPLAYS = 20


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def with_tma(on: bool):
    fm = importlib.import_module("tuning.fused_moe")
    fm.B_TMA = on
    return fm


def same_output(shape, weights, m, config, down) -> bool:
    import torch

    from tuning.timing import LayerTimer

    timer = LayerTimer(shape, weights, m)
    args = (timer.x[0], weights.w1, weights.w2, timer.topk_weights[0], timer.topk_ids[0])
    kwargs = dict(config=config, down_config=down, **weights.layer_kwargs(shape))
    outs = []
    for on in (False, True):
        fm = with_tma(on)
        out = torch.full_like(timer.x[0], float("nan"))
        fm.fused_moe(*args, out=out, **kwargs)
        outs.append(out)
    torch.cuda.synchronize()
    return bool(torch.equal(outs[0], outs[1]))


def gemm_parts(shape, weights, m, config, down) -> dict:
    import torch

    from tuning.timing import LayerTimer

    fm = with_tma(False)
    scales = fm._scales_mode(shape.dtype, shape.block_shape)
    block_shape = list(shape.block_shape) if shape.block_shape else None
    timer = LayerTimer(shape, weights, m)
    pairs = m * shape.top_k
    blocks = [
        fm.sort_and_pad(timer.topk_ids[j], shape.E, config["BLOCK_SIZE_M"])
        for j in range(timer.calls)
    ]
    a1 = [fm._quantize_activations(x, scales, block_shape) for x in timer.x]
    h = [torch.randn((pairs, 2 * shape.N), dtype=torch.bfloat16, device="cuda") for _ in a1]
    a2 = [fm._silu_and_mul(t, scales, block_shape) for t in h]
    y = [torch.empty((pairs, shape.H), dtype=torch.bfloat16, device="cuda") for _ in h]
    w1s, w2s = weights.w1_scale, weights.w2_scale

    def gemm1(j):
        fm._expert_gemm(
            a1[j][0], weights.w1, h[j], blocks[j], config, scales, block_shape, a1[j][1], w1s,
            shape.top_k, None,
        )  # fmt: skip

    def gemm2(j):
        fm._expert_gemm(
            a2[j][0], weights.w2, y[j], blocks[j], down, scales, block_shape, a2[j][1], w2s, 1,
            timer.topk_weights[j].reshape(-1),
        )  # fmt: skip

    parts = {}
    for on in (False, True):
        with_tma(on)
        parts[on] = (timer.time_layer(gemm1, REPLAYS), timer.time_layer(gemm2, REPLAYS))
    return parts


def probe_item(item: str, record: dict) -> None:
    import torch

    from tuning.timing import LayerTimer, make_weights

    shape = ITEMS[item]
    weights = make_weights(shape)
    batches = json.loads(V4_RESULTS.read_text())["phases"][item]["tune"]["batches"]
    configs = {
        int(m): (b["config"], b.get("down_config") or b["config"]) for m, b in batches.items()
    }
    for m in (1, 256, 4096):
        config, down = configs[m]
        same = same_output(shape, weights, m, config, down)
        record.setdefault("bit_identical", {})[m] = same
        log(f"{item} M={m}: TMA output bit for bit the pointer-load one: {same}")
    rows = record.setdefault("rows", [])
    for m, (config, down) in sorted(configs.items()):
        timer = LayerTimer(shape, weights, m)
        row = {"M": m}
        for on in (False, True):
            with_tma(on)
            try:
                row["tma" if on else "pointer"] = timer.time_config(
                    config, REPLAYS, down_config=down
                )
            except Exception as exc:
                log(f"  M={m} tma={on} failed: {type(exc).__name__}: {exc}"[:300])
        if m in PARTS_M:
            try:
                parts = gemm_parts(shape, weights, m, config, down)
                row["gemm_pointer"], row["gemm_tma"] = parts[False], parts[True]
            except Exception as exc:
                log(f"  M={m} parts failed: {type(exc).__name__}: {exc}"[:300])
        rows.append(row)
        log(f"  {item} {row}")
        del timer
        torch.cuda.empty_cache()
    with_tma(True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--items", default=",".join(ITEMS))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    status = 0
    for item in args.items.split(","):
        record = results.setdefault(item, {})
        try:
            probe_item(item, record)
        except Exception:
            status = 1
            record["error"] = traceback.format_exc()
            log(f"ERROR {item}:\n{record['error']}")
        (out / "kernel_tma.json").write_text(json.dumps(results, indent=1) + "\n")
    for item, record in results.items():
        print(f"\n{item}: layer µs, pointer loads vs TMA weight tiles (v4 tuned configs)")
        ratios = []
        for row in record.get("rows", []):
            if "pointer" in row and "tma" in row:
                ratios.append(row["pointer"] / row["tma"])
                parts = ""
                if "gemm_tma" in row:
                    (p1, p2), (t1, t2) = row["gemm_pointer"], row["gemm_tma"]
                    parts = f"   GEMM1 {p1:7.1f} -> {t1:7.1f}   GEMM2 {p2:7.1f} -> {t2:7.1f}"
                print(
                    f"  M={row['M']:5d} {row['pointer']:8.1f} {row['tma']:8.1f}"
                    f"  {row['pointer'] / row['tma']:.3f}x{parts}"
                )
        if ratios:
            geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
            print(
                f"  geomean pointer/TMA {geomean:.3f}x,"
                f" min {min(ratios):.3f}, max {max(ratios):.3f}"
            )
    return status


if __name__ == "__main__":
    sys.exit(main())
