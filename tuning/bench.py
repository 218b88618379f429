"""Time one MoE layer per batch size: floor, the engine's default and shipped configs, a tuned
config, torch._grouped_mm.

Every figure is µs per layer on this GPU, timed as tuning.timing does (CUDA graphs, fresh routing
per replay, median of the replays), in the kernel of the chosen backend (tuning.backends: the
engine's own, or moeops' builtin); the floor comes from bandwidth and matrix rate measured here.
The _grouped_mm pipeline runs in bf16, also as the baseline for fp8 shapes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from tuning.backends import load_backend
from tuning.backends.base import BackendError
from tuning.config_files import TUNED_BATCH_SIZES, entry_for_batch, loads_config, parse_ints
from tuning.engines import ENGINES
from tuning.search import KernelShape
from tuning.tune_cli import add_shape_arguments, engine_spec, routing_for, shape_from_args
from tuning.tuner import FINAL_REPLAYS


@dataclass
class BenchRow:
    """One batch size M: µs per layer of the floor, each implementation, and the tuned configs.

    tuned_us: with the tuned config and GEMM 2's down config where there is one;
    shared_config_us: with the tuned config for both GEMMs.
    """

    M: int
    floor_us: float
    default_us: float | None
    tuned_us: float | None
    grouped_mm_us: float | None
    tuned_config: dict | None = None
    shared_config_us: float | None = None
    down_config: dict | None = None
    layout_floor_us: float | None = None
    shipped_us: float | None = None

    @property
    def best_us(self) -> float | None:
        """The kernel's time with the tuned config, else with the default."""
        return self.tuned_us if self.tuned_us is not None else self.default_us

    @property
    def percent_of_floor(self) -> float | None:
        """floor / kernel time, in %: 100 means at the floor."""
        return None if not self.best_us else 100.0 * self.floor_us / self.best_us

    @property
    def percent_of_layout_floor(self) -> float | None:
        """layout floor / kernel time, in %: how near the kernel is to what its layout allows."""
        if not self.best_us or self.layout_floor_us is None:
            return None
        return 100.0 * self.layout_floor_us / self.best_us


def bench(
    shape: KernelShape,
    batch_sizes: Iterable[int] = TUNED_BATCH_SIZES,
    *,
    entries: dict[int, dict] | None = None,
    down_entries: dict[int, dict] | None = None,
    ceilings: dict | None = None,
    replays: int = FINAL_REPLAYS,
    grouped_mm: bool = True,
    backend=None,
    routing=None,
) -> list[BenchRow]:
    """Time the layer at each batch size on the current GPU.

    entries: a config file's {M: config} (the engine's nearest-M choice is timed as tuned);
    down_entries: a `_down` file's, for GEMM 2 beside it (the tuned config alone is timed too);
    ceilings: measured {bandwidth_tbps, bf16_tflops, fp8_tflops}, measured here when None;
    backend: whose layer (tuning.backends; default moeops' builtin); where the engine ships a
    config file for this shape and GPU, its entries are timed too. routing: what the router
    choices are drawn under (tuning.routing.Routing; default uniform).
    """
    import torch

    from tuning import timing
    from tuning.backends.builtin import BuiltinBackend

    backend = backend or BuiltinBackend()
    device_name = torch.cuda.get_device_name()
    shipped = backend.shipped_configs(shape, device_name)
    shipped_down = backend.shipped_configs(shape, device_name, down=True)
    if ceilings is None:
        ceilings = vars(timing.measure_ceilings())
    device_ceilings = timing.DeviceCeilings(**ceilings)
    weights = timing.make_weights(shape)
    bf16_shape = replace(shape, dtype="bf16", block_shape=None)
    bf16_weights = weights if shape == bf16_shape else None
    rows = []
    for m in sorted(set(batch_sizes)):
        timer = timing.LayerTimer(shape, weights, m, backend=backend, routing=routing)
        default = backend.default_config(shape, m)
        tuned = entry_for_batch(entries, m) if entries else None
        down = entry_for_batch(down_entries, m) if entries and down_entries else None
        row = BenchRow(
            M=m,
            floor_us=round(timing.moe_floor_us(shape, m, device_ceilings), 2),
            layout_floor_us=round(timing.layout_floor_us(shape, m, device_ceilings), 2),
            default_us=_time_or_none(timer.time_config, default, replays),
            tuned_us=None,
            grouped_mm_us=None,
            tuned_config=tuned,
            down_config=down,
        )
        if tuned is not None:
            row.tuned_us = _time_or_none(timer.time_config, tuned, replays, down_config=down)
        if down is not None:
            row.shared_config_us = _time_or_none(timer.time_config, tuned, replays)
        if shipped is not None:
            shipped_down_entry = shipped_down.entry_for(m) if shipped_down else None
            row.shipped_us = _time_or_none(
                timer.time_config, shipped.entry_for(m), replays, down_config=shipped_down_entry
            )
        if grouped_mm:
            if bf16_weights is None:
                bf16_weights = timing.make_weights(bf16_shape)
            bf16_timer = timing.LayerTimer(bf16_shape, bf16_weights, m, routing=routing)
            row.grouped_mm_us = _time_or_none(bf16_timer.time_grouped_mm, replays)
            del bf16_timer
        rows.append(row)
        del timer
        torch.cuda.empty_cache()
    return rows


def format_table(rows: list[BenchRow]) -> str:
    """A fixed-width table: M, floor, default, tuned, tuned with one config for both GEMMs,
    _grouped_mm (µs), speed-ups, % of floor, % of the layout's floor (timing.layout_floor_us)."""
    header = (
        f"{'M':>5} {'floor µs':>9} {'default µs':>10} {'shipped µs':>10} {'tuned µs':>9}"
        f" {'1-config µs':>11} {'grouped_mm µs':>13} {'tuned/def':>9} {'tuned/ship':>10}"
        f" {'gmm/tuned':>9} {'% floor':>7} {'% layout':>8}"
    )
    lines = [header]
    for r in rows:
        lines.append(
            f"{r.M:>5} {r.floor_us:>9.1f} {_num(r.default_us, 10)} {_num(r.shipped_us, 10)}"
            f" {_num(r.tuned_us, 9)} {_num(r.shared_config_us, 11)} {_num(r.grouped_mm_us, 13)}"
            f" {_ratio(r.default_us, r.tuned_us, 9)} {_ratio(r.shipped_us, r.tuned_us, 10)}"
            f" {_ratio(r.grouped_mm_us, r.best_us, 9)}"
            f" {_num(r.percent_of_floor, 7)} {_num(r.percent_of_layout_floor, 8)}"
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `python -m tuning bench`."""
    add_shape_arguments(parser)
    parser.add_argument("--config", help="a tuned config file to time (its nearest-M entries)")
    parser.add_argument("--down-config", help="its SGLang _down file, for GEMM 2")
    parser.add_argument("--replays", type=int, default=FINAL_REPLAYS, help="graph replays per time")
    parser.add_argument(
        "--no-grouped-mm", action="store_true", help="skip the torch._grouped_mm baseline"
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="builtin",
        help="whose kernel to time (default: moeops' builtin)",
    )
    parser.add_argument("--engine-source", help="the engine's package folder (see tune)")
    parser.add_argument(
        "--routing",
        default="uniform",
        help="the routing to time under: uniform, zipf:S, dirichlet:A or a file of top-k ids"
        " (see tune)",
    )


def run(args: argparse.Namespace) -> int:
    """Print the table for the shape of --model-config on GPU --device."""
    try:
        shape = shape_from_args(args)
        batch_sizes = parse_ints(args.batch_sizes) if args.batch_sizes else TUNED_BATCH_SIZES
        entries = _read_entries("--config", args.config)
        down_entries = _read_entries("--down-config", args.down_config)
        routing = routing_for(args.routing, shape)
        spec = engine_spec(args.engine, "vllm", args.engine_source)
    except (ValueError, BackendError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("error: bench needs a CUDA GPU", file=sys.stderr)
        return 1
    torch.cuda.set_device(args.device)
    spec = spec or {"engine": "builtin"}
    backend = load_backend(spec["engine"], source_dir=spec.get("source_dir"))
    rows = bench(
        shape,
        batch_sizes,
        entries=entries,
        down_entries=down_entries,
        replays=args.replays,
        grouped_mm=not args.no_grouped_mm,
        backend=backend,
        routing=routing,
    )
    print(f"{torch.cuda.get_device_name(args.device)}  {shape.as_dict()}  {routing.label} routing")
    print(format_table(rows))
    return 0


def _read_entries(option: str, path: str | None) -> dict[int, dict] | None:
    """The entries of the config file an option names; ValueError naming the option."""
    if path is None:
        return None
    try:
        return loads_config(Path(path).read_text())[1]
    except OSError as exc:
        raise ValueError(f"{option}: cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ValueError(f"{option}: {path}: {exc}") from None


def _time_or_none(measure, *args, **kwargs) -> float | None:
    try:
        return round(measure(*args, **kwargs), 2)
    except Exception as exc:
        print(f"warning: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}", file=sys.stderr)
        return None


def _num(value: float | None, width: int) -> str:
    return f"{value:>{width}.1f}" if value is not None else f"{'n/a':>{width}}"


def _ratio(numerator: float | None, denominator: float | None, width: int) -> str:
    if not numerator or not denominator:
        return f"{'n/a':>{width}}"
    return f"{numerator / denominator:>{width - 1}.2f}x"
