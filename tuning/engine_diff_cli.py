"""`python -m tuning engine-diff`: what changed in an engine's fused-MoE kernel between versions,
for one MoE shape and GPU: does a new release need a re-tune?

    python -m tuning engine-diff --engine vllm --from DIR --to DIR --model-config config.json --tp 8

DIR is an engine package folder (installed, or unpacked from its wheel). Prints, for the two
versions side by side: the launcher's parameters (added, removed), the kernel's parameters and a
hash of its source, the launch switches a config entry may set (vLLM 0.34's USE_TMA), the default
rule's config at each batch size, and the shipped files for the shape and GPU (the `_down` file
too where the engine reads one), entry by entry where they differ; and the decisions of the
engine's fast paths for --capability and --tp that changed (tuning.engine_paths: all-reduce +
RMSNorm fusion, the MoE and attention backends' order, DeepGEMM, custom all-reduce).
The comparison and the report's check are pure and read by the web tier too:
domain.engine_diff_report.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
from pathlib import Path

from domain.engine_diff_report import compare
from tuning.backends import load_backend
from tuning.backends.base import BackendError
from tuning.config_files import TUNED_BATCH_SIZES, parse_ints
from tuning.engine_paths import source_paths

# The kernel and its launcher, by engine (the names the backends take from the engine's files).
KERNELS = {"vllm": ("fused_moe_kernel", "invoke_fused_moe_triton_kernel")}


def parameters(source: str) -> list[str]:
    """The parameter names of the one function defined in source, in order."""
    (function,) = ast.parse(source).body
    arguments = function.args
    return [a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]]


def describe(backend, shape, device_name: str, batch_sizes) -> dict:
    """JSON-ready: what engine-diff compares of one engine version."""
    kernel, launcher = KERNELS[backend.engine]
    functions = backend.source.functions
    shipped = backend.shipped_configs(shape, device_name)
    down_name = getattr(backend, "down_file_name", lambda *a: None)(shape, device_name)
    down = getattr(backend, "shipped_down", lambda *a: None)(shape, device_name)
    return {
        "version": backend.version,
        "launcher": parameters(functions[launcher]),
        "kernel": parameters(functions[kernel]),
        "kernel_sha256": hashlib.sha256(functions[kernel].encode()).hexdigest(),
        "source_sha256": backend.source_sha256,
        "switches": {k: list(v) for k, v in backend.search_switches(shape).items()},
        "defaults": {m: backend.default_config(shape, m) for m in batch_sizes},
        "file": backend.file_name(shape, device_name),
        "shipped": {m: shipped.entry_for(m) for m in batch_sizes} if shipped else None,
        "down_file": down_name,
        # the file's own keys: an entry may be only {"USE_TMA": false}
        "shipped_down": down,
    }


def path_decisions(engine: str, folder, *, capability: int, tp: int, model_config) -> dict:
    """JSON-ready: the engine's path decisions for a capability (90: 9.0) and TP, its rows."""
    paths = source_paths(
        engine,
        capability=f"{capability // 10}.{capability % 10}",
        tp=tp,
        source_dir=folder,
        model_config=model_config,
    )
    return {"capability": paths.capability, "tp": tp, "rows": paths.model_dump(mode="json")["rows"]}


def report(engine: str, shape, device_name: str, old: dict, new: dict) -> dict:
    """JSON-ready: the two versions' describe() records with the engine, shape and GPU they are
    for, as the engine-diff page stores them (domain.engine_diff_report.checked_report)."""
    return {
        "engine": engine,
        "shape": shape.as_dict(),
        "device_name": device_name,
        "old": json.loads(json.dumps(old)),
        "new": json.loads(json.dumps(new)),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `python -m tuning engine-diff`."""
    from tuning.tune_cli import add_shape_arguments

    parser.add_argument("--engine", choices=tuple(KERNELS), default="vllm")
    parser.add_argument("--from", dest="old", required=True, help="the older package folder")
    parser.add_argument("--to", dest="new", required=True, help="the newer package folder")
    add_shape_arguments(parser)
    parser.add_argument(
        "--gpu-name", default="NVIDIA H200", help="the GPU the files are for (default H200)"
    )
    parser.add_argument(
        "--json",
        help="also write the two versions' records here, for the web app's engine-diff page"
        " (upload it there, or POST it to /api/v1/engine-diffs)",
    )
    parser.add_argument(
        "--capability",
        type=int,
        default=90,
        help="the GPU's compute capability, 90 for sm_90 (default), which some launches read, "
        "and the one the path decisions are evaluated for",
    )


def run(args: argparse.Namespace) -> int:
    """Print what differs between the two versions for the shape and GPU."""
    from tuning.tune_cli import shape_from_args

    try:
        shape = shape_from_args(args)
        batch_sizes = parse_ints(args.batch_sizes) if args.batch_sizes else TUNED_BATCH_SIZES
        old, new = (
            describe(
                load_backend(args.engine, source_dir=folder, capability=args.capability),
                shape,
                args.gpu_name,
                batch_sizes,
            )
            for folder in (args.old, args.new)
        )
        config = json.loads(Path(args.model_config).read_text()) if args.model_config else None
        for record, folder in ((old, args.old), (new, args.new)):
            record["paths"] = path_decisions(
                args.engine, folder, capability=args.capability, tp=args.tp, model_config=config
            )
    except (ValueError, BackendError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(compare(old, new)))
    if args.json:
        data = report(args.engine, shape, args.gpu_name, old, new)
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    return 0
