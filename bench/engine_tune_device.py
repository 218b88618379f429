"""Tune in the engine's own kernel and check the file never loses to what the engine has.

On a GPU host, in one call: for each shape and dtype of --plan, a tune with --engine (the
engine's kernel read from --source, launched as that engine version launches it), then a
head-to-head at the 18 batch sizes of the written file's entry, the engine's default config and
the engine's shipped file's entry, all in the engine's kernel (tuning.tuner.head_to_head: five
rounds in turns, CUDA graphs, fresh routing per replay; µs are medians, ratios the median of the
rounds' paired ratios). --earlier SHAPE=JSON,.. adds to a shape's head-to-head the file an
earlier run of this bench wrote (tuned in another engine version's kernel, say).
--exhaustive-check SHAPE@M,.. also searches those sizes exhaustively in the engine's kernel
and compares with the tune's pick.

    python3 bench/engine_tune_device.py --engine vllm --source DIR --out OUT \\
        --plan glm5:bf16,glm5:fp8_block,kimi:bf16,kimi:fp8_block \\
        --exhaustive-check glm5:fp8_block@16,256,2048 \\
        --earlier glm5:fp8_block=bench/results/engine_tune_h200/vllm_glm5_fp8_block.json

--routings uniform,zipf:1.2 tunes each plan item under each routing (tuning.routing) and times
every written file under every routing beside the engine's default and shipped configs: whether
skew changes the picks, and where the file tuned under uniform routing loses to the one tuned
under the skew (OUT/engine_tune_routing.json, the files under OUT/configs/<routing>).

--deep-gemm-e8m0 tunes as for a launch with DeepGEMM and E8M0 on: in vLLM 0.34 fp8 block on
SM90 that is the sorted-A path, GEMM 2 searched apart and the _down file written; the
head-to-head then runs each candidate's pair (written up + _down, shipped up + _down).

Prints per shape the table (µs; default/written and shipped/written, above 1 where the written
file is faster; which config was written: the search's, or the engine's own when the search did
not beat it by more than the noise), the worst min(default, shipped)/written, the geometric means
and the tune's wall time; writes OUT/engine_tune.json (with each candidate's rounds), the
tuned files under OUT/configs and the log OUT/engine_tune.log.
"""

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tuning.config_files import TUNED_BATCH_SIZES, entry_for_batch  # noqa: E402
from tuning.search import KernelShape  # noqa: E402

SHAPES = {
    "glm5": {"E": 256, "N": 256, "H": 6144, "top_k": 8},
    "kimi": {"E": 384, "N": 256, "H": 7168, "top_k": 8},
}
DTYPES = {"bf16": ("bf16", None), "fp8_block": ("fp8_w8a8", (128, 128))}


def shape_of(name: str) -> KernelShape:
    shape_name, dtype_name = name.split(":")
    dtype, block = DTYPES[dtype_name]
    return KernelShape(**SHAPES[shape_name], dtype=dtype, block_shape=block)


def earlier_entries(path) -> dict[int, dict]:
    """{M: entry} of the file an earlier run of this bench wrote (its first plan item's)."""
    batches = json.loads(Path(path).read_text())["plan"][0]["tune"]["batches"]
    return {int(m): batch["config"] for m, batch in batches.items()}


def tune_and_compare(name, engine, out, log, sizes=TUNED_BATCH_SIZES, earlier=None):
    import torch

    from tuning.timing import LayerTimer, make_weights
    from tuning.tune_results import write_config_files
    from tuning.tuner import Tuner, head_to_head

    shape = shape_of(name)
    started = time.monotonic()
    with Tuner(shape, engine=engine) as tuner:
        result = tuner.tune(sizes)
        backend = tuner.backend
    wall = time.monotonic() - started
    style = engine["engine"]
    paths = write_config_files(result, out / "configs", style)
    entries = result.entries()
    device = torch.cuda.get_device_name()
    shipped = backend.shipped_configs(shape, device)
    shipped_down = backend.shipped_configs(shape, device, down=True)
    down_entries = result.down_entries() or None
    weights = make_weights(shape)
    rows = []
    for m in sizes:
        timer = LayerTimer(shape, weights, m, backend=backend)
        down = entry_for_batch(down_entries, m) if down_entries else None
        candidates = {
            "written": (entry_for_batch(entries, m), down),
            "default": (backend.default_config(shape, m), None),
        }
        if shipped is not None:
            candidates["shipped"] = (
                shipped.entry_for(m),
                shipped_down.entry_for(m) if shipped_down else None,
            )
        if earlier:
            candidates["earlier"] = (entry_for_batch(earlier, m), None)
        measured = head_to_head(timer, candidates)
        row = {"M": m, "picked": result.batches[m].picked}
        row.update({f"{k}_us": round(v.us, 2) for k, v in measured.items()})
        row.update({f"{k}_spread": round(v.spread, 4) for k, v in measured.items()})
        row.update({f"{k}_rounds": [round(t, 2) for t in v.rounds] for k, v in measured.items()})
        row.update(paired_ratios(measured))
        rows.append(row)
        del timer
        torch.cuda.empty_cache()
        print(json.dumps({"shape": name, **row}), file=log, flush=True)
    summary = _summary(rows)
    summary.update(
        shape=name,
        kernel=result.kernel,
        kernel_path=result.kernel_path,
        tune_wall_s=round(wall, 1),
        timeline={k: round(v, 1) for k, v in asdict(result.timeline).items()},
        files=[str(p) for p in paths],
    )
    return {"summary": summary, "rows": rows, "tune": result.to_dict()}


def routing_compare(name, engine, out, log, routings, sizes=TUNED_BATCH_SIZES):
    """Tune name under each of routings (tuning.routing.Routing), then time every written file
    under every routing, head to head with the engine's default and shipped configs (issue 42,
    item 5): per routing and M the µs of each, and where the file tuned under uniform routing
    loses to the one tuned under the skew, by how much (the median of the rounds' ratios)."""
    import torch

    from tuning.timing import LayerTimer, make_weights
    from tuning.tune_results import write_config_files
    from tuning.tuner import Tuner, head_to_head

    shape = shape_of(name)
    style = engine["engine"]
    tuned, summary = {}, {"shape": name, "tunes": {}}
    for routing in routings:
        started = time.monotonic()
        with Tuner(shape, engine=engine, routing=routing) as tuner:
            result = tuner.tune(sizes)
            backend = tuner.backend
        paths = write_config_files(result, out / "configs" / routing.slug, style)
        tuned[routing.label] = result
        summary["tunes"][routing.label] = {
            "wall_s": round(time.monotonic() - started, 1),
            "files": [str(p) for p in paths],
            "tune": result.to_dict(),
        }
    device = torch.cuda.get_device_name()
    shipped = backend.shipped_configs(shape, device)
    weights = make_weights(shape)
    labels = list(tuned)
    picks_differ = [
        m for m in sizes if len({json.dumps(tuned[k].batches[m].config) for k in labels}) > 1
    ]
    rows = []
    for routing in routings:
        for m in sizes:
            timer = LayerTimer(shape, weights, m, backend=backend, routing=routing)
            candidates = {
                f"tuned under {k}": (entry_for_batch(tuned[k].entries(), m), None) for k in labels
            }
            candidates["default"] = (backend.default_config(shape, m), None)
            if shipped is not None:
                candidates["shipped"] = (shipped.entry_for(m), None)
            measured = head_to_head(timer, candidates)
            row = {"timed_under": routing.label, "M": m}
            row.update({f"{k} us": round(v.us, 2) for k, v in measured.items()})
            uniform, skewed = (f"tuned under {k}" for k in (labels[0], labels[-1]))
            if len(labels) > 1 and uniform in measured and skewed in measured:
                # above 1 where the file tuned under uniform routing is slower here
                row["uniform_over_skew"] = round(
                    statistics.median(
                        u / k
                        for u, k in zip(
                            measured[uniform].rounds, measured[skewed].rounds, strict=True
                        )
                    ),
                    4,
                )
            rows.append(row)
            del timer
            torch.cuda.empty_cache()
            print(json.dumps({"shape": name, **row}), file=log, flush=True)
    summary["picks_differ_at"] = picks_differ
    # under the skew only: there the uniform-tuned file is the one at a disadvantage
    losses = [
        r for r in rows if r["timed_under"] != labels[0] and r.get("uniform_over_skew", 0) > 1.02
    ]
    summary["uniform_loses"] = [
        f"loses {round((r['uniform_over_skew'] - 1) * 100)} % at M={r['M']} under "
        f"{r['timed_under']}"
        for r in losses
    ]
    return {"summary": summary, "rows": rows}


def routing_table(result) -> str:
    """Per routing timed under and M: each file's µs, the default's and shipped's."""
    rows = result["rows"]
    names = [k for k in rows[0] if k.endswith(" us")]
    lines = [f"{result['summary']['shape']}: " + " | ".join(["timed under", "M", *names])]
    for r in rows:
        cells = [r["timed_under"], str(r["M"]), *(_n(r.get(k)) for k in names)]
        if "uniform_over_skew" in r:
            cells.append(f"uniform/skew-tuned {r['uniform_over_skew']:.3f}")
        lines.append(" | ".join(cells))
    summary = result["summary"]
    lines.append(f"picks differ at M = {summary['picks_differ_at']}")
    lines += summary["uniform_loses"] or ["the uniform-tuned file loses nowhere beyond 2 %"]
    return "\n".join(lines)


def paired_ratios(measured) -> dict:
    """default/written, shipped/written and min(default, shipped)/written, each the median over
    the head-to-head's rounds of that round's ratio. A round times the candidates back to back, so
    what drifts over seconds (the GPU's clocks after a heavy tune, say) cancels in a round's
    ratio where a ratio of medians would keep it."""
    if "written" not in measured:
        return {}
    written = measured["written"].rounds
    own = {k: measured[k].rounds for k in ("default", "shipped") if k in measured}
    others = {**own, **({"earlier": measured["earlier"].rounds} if "earlier" in measured else {})}
    ratios = {
        f"{k}_ratio": statistics.median(o / w for o, w in zip(rounds, written, strict=True))
        for k, rounds in others.items()
    }
    if own:
        best = [min(times) for times in zip(*own.values(), strict=True)]
        ratios["best_own_ratio"] = statistics.median(
            o / w for o, w in zip(best, written, strict=True)
        )
        if "earlier" in measured:
            # above 1 where the earlier file beats the engine's own; below, it slows the engine
            ratios["earlier_vs_best_own"] = statistics.median(
                o / e for o, e in zip(best, measured["earlier"].rounds, strict=True)
            )
    return {k: round(v, 4) for k, v in ratios.items()}


def _summary(rows):
    def geomean(key):
        ratios = [r[key] for r in rows if r.get(key)]
        return round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 4) if ratios else None

    worst = [(r["best_own_ratio"], r["M"]) for r in rows if r.get("best_own_ratio")]
    low = min(worst) if worst else (None, None)
    summary = {
        "worst_vs_best_own": round(low[0], 4) if low[0] else None,
        "worst_at_M": low[1],
        "geomean_vs_default": geomean("default_ratio"),
        "geomean_vs_shipped": geomean("shipped_ratio"),
    }
    if any("earlier_ratio" in r for r in rows):
        earlier = min((r["earlier_vs_best_own"], r["M"]) for r in rows)
        summary.update(
            geomean_written_vs_earlier=geomean("earlier_ratio"),
            geomean_earlier_vs_best_own=geomean("earlier_vs_best_own"),
            worst_earlier_vs_best_own=round(earlier[0], 4),
            worst_earlier_at_M=earlier[1],
        )
    return summary


def exhaustive_check(spec, engine, log):
    """{M: (coarse-to-fine pick µs, exhaustive best µs)} in the engine's kernel, head to head."""
    import torch

    from tuning.timing import LayerTimer, make_weights
    from tuning.tuner import Tuner, head_to_head

    name, sizes = spec.split("@")
    shape = shape_of(name)
    sizes = [int(m) for m in sizes.split(",")]
    with Tuner(shape, engine=engine) as tuner:
        quick = tuner.tune(sizes, down=False)
        full = tuner.tune(sizes, exhaustive=True, down=False)
        backend = tuner.backend
    weights = make_weights(shape)
    found = {}
    for m in sizes:
        timer = LayerTimer(shape, weights, m, backend=backend)
        measured = head_to_head(
            timer,
            {
                "coarse_to_fine": (quick.batches[m].config, None),
                "exhaustive": (full.batches[m].config, None),
            },
        )
        found[m] = {k: round(v[0], 2) for k, v in measured.items()}
        found[m]["tried"] = {
            "coarse_to_fine": quick.batches[m].candidates_tried,
            "exhaustive": full.batches[m].candidates_tried,
        }
        print(json.dumps({"exhaustive": name, "M": m, **found[m]}), file=log, flush=True)
        del timer
        torch.cuda.empty_cache()
    return {"shape": name, "sizes": found, "wall_s": [quick.wall_s, full.wall_s]}


# Relative error (norm) of the engine's layer against the float64 reference, per dtype.
TOLERANCE = {"bf16": 1e-2, "fp8_w8a8": 3e-2}
CHECKED_M = (1, 16, 200, 2048)


def check_correctness(names, engine, log) -> list[dict]:
    """The engine's layer (its default config) against tuning.reference at the real shapes;
    outputs poisoned with NaN first, so that an unwritten row shows."""
    import torch

    from tuning.backends import load_backend
    from tuning.reference import moe_reference
    from tuning.timing import make_weights, random_routing

    torch.backends.cuda.matmul.allow_tf32 = False
    backend = load_backend(
        engine["engine"], source_dir=engine["source_dir"], launch=engine.get("launch")
    )
    rows = []
    for name in names:
        shape = shape_of(name)
        weights = make_weights(shape, seed=7)
        for m in CHECKED_M:
            torch.manual_seed(m)
            x = torch.randn((m, shape.H), device="cuda", dtype=torch.bfloat16)
            topk_weights, topk_ids = (t[0] for t in random_routing(1, m, shape.E, shape.top_k))
            out = torch.full_like(x, float("nan"))
            backend.layer(
                x,
                weights,
                topk_weights,
                topk_ids,
                shape=shape,
                config=backend.default_config(shape, m),
                out=out,
            )
            ref = moe_reference(
                x, weights.w1, weights.w2, topk_weights, topk_ids, **weights.layer_kwargs(shape)
            ).float()
            out = out.float()
            error = float((out - ref).norm() / ref.norm())
            unwritten = int((~torch.isfinite(out)).sum())
            row = {"check": name, "M": m, "rel_error": error, "unwritten": unwritten}
            row["ok"] = unwritten == 0 and error <= TOLERANCE[shape.dtype]
            rows.append(row)
            print(json.dumps(row), file=log, flush=True)
            print(json.dumps(row), flush=True)
    return rows


def table(result) -> str:
    lines = [
        f"{result['summary']['shape']}: tune {result['summary']['tune_wall_s']} s, "
        f"kernel {result['summary']['kernel']}, {result['summary']['kernel_path']} path",
        f"where the seconds went: {result['summary']['timeline']}",
        f"{'M':>5} {'default':>9} {'shipped':>9} {'written':>9} {'w/def':>7} {'w/ship':>7} "
        f"{'earlier':>9} {'w/earl':>7} {'e/own':>7} picked",
    ]
    for r in result["rows"]:
        d, s, w = r.get("default_us"), r.get("shipped_us"), r.get("written_us")
        ratios = f"{_r(r.get('default_ratio')):>7} {_r(r.get('shipped_ratio')):>7}"
        earlier = f"{_n(r.get('earlier_us')):>9} {_r(r.get('earlier_ratio')):>7}"
        earlier += f" {_r(r.get('earlier_vs_best_own')):>7}"
        cells = f"{r['M']:>5} {_n(d):>9} {_n(s):>9} {_n(w):>9} {ratios} {earlier}"
        lines.append(f"{cells} {r['picked']}")
    summary = result["summary"]
    lines.append(
        f"worst min(default, shipped)/written {summary['worst_vs_best_own']} at M="
        f"{summary['worst_at_M']}; geomean /default {summary['geomean_vs_default']}, "
        f"/shipped {summary['geomean_vs_shipped']}"
    )
    return "\n".join(lines)


def _n(v):
    return "n/a" if v is None else f"{v:.1f}"


def _r(ratio):
    return "n/a" if ratio is None else f"{ratio:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("vllm", "sglang"), required=True)
    parser.add_argument("--source", required=True, help="the engine's package folder")
    parser.add_argument("--out", required=True)
    parser.add_argument("--plan", default="glm5:bf16,glm5:fp8_block,kimi:bf16,kimi:fp8_block")
    parser.add_argument("--exhaustive-check", default="")
    parser.add_argument(
        "--earlier",
        default="",
        help="SHAPE=JSON,..: an earlier run's engine_tune.json, its file timed beside SHAPE's",
    )
    parser.add_argument(
        "--deep-gemm-e8m0",
        action="store_true",
        help="tune as for a vLLM launch with DeepGEMM and E8M0 scales on (0.34's sorted-A path "
        "for GEMM 2 where its conditions hold: the _down file searched and compared too)",
    )
    parser.add_argument(
        "--routings",
        default="",
        help="uniform,zipf:1.2,..: tune each plan item under each routing (tuning.routing) and "
        "time every written file under every routing (issue 42, item 5) instead of the "
        "default/shipped comparison",
    )
    parser.add_argument(
        "--sizes",
        default=",".join(map(str, TUNED_BATCH_SIZES)),
        help="batch sizes to tune and compare (default: the 18 of the engines' files)",
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    engine = {"engine": args.engine, "source_dir": args.source}
    if args.deep_gemm_e8m0:
        engine["launch"] = {"deep_gemm_e8m0": True, "expert_parallel": False}
    results = {"plan": [], "exhaustive": [], "correctness": []}
    plan = list(filter(None, args.plan.split(",")))
    earlier = dict(item.split("=", 1) for item in filter(None, args.earlier.split(",")))
    if args.routings:
        from tuning.routing import parse_routing

        routings = [parse_routing(text) for text in args.routings.split(",")]
        sizes = [int(m) for m in args.sizes.split(",")]
        results = {"routing": []}
        with open(out / "engine_tune.log", "a") as log:
            for name in plan:
                found = routing_compare(name, engine, out, log, routings, sizes)
                results["routing"].append(found)
                print(routing_table(found), flush=True)
                (out / "engine_tune_routing.json").write_text(json.dumps(results, indent=1))
        return 0
    with open(out / "engine_tune.log", "a") as log:
        results["correctness"] = check_correctness(plan, engine, log)
        for name in plan:
            sizes = [int(m) for m in args.sizes.split(",")]
            files = earlier_entries(earlier[name]) if name in earlier else None
            result = tune_and_compare(name, engine, out, log, sizes, files)
            results["plan"].append(result)
            print(table(result), flush=True)
            (out / "engine_tune.json").write_text(json.dumps(results, indent=1))
        for spec in filter(None, args.exhaustive_check.split(";")):
            found = exhaustive_check(spec, engine, log)
            results["exhaustive"].append(found)
            print(json.dumps(found), flush=True)
            (out / "engine_tune.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
