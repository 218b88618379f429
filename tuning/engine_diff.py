"""`python -m tuning engine-diff`: what changed in an engine's fused-MoE kernel between versions,
for one MoE shape and GPU: does a new release need a re-tune?

    python -m tuning engine-diff --engine vllm --from DIR --to DIR --model-config config.json --tp 8

DIR is an engine package folder (installed, or unpacked from its wheel). Prints, for the two
versions side by side: the launcher's parameters (added, removed), the kernel's parameters and a
hash of its source, the launch switches a config entry may set (vLLM 0.34's USE_TMA), the default
rule's config at each batch size, and the shipped files for the shape and GPU (the `_down` file
too where the engine reads one), entry by entry where they differ.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import sys

from tuning.backends import load_backend
from tuning.config_files import TUNED_BATCH_SIZES, parse_ints
from tuning.kernel_backend import BackendError

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


def compare(old: dict, new: dict) -> list[str]:
    """Lines of text: what differs between two describe() results, the newer second."""
    title = f"{old['version']} → {new['version']}"
    lines = [f"engine-diff {title}"]
    for label, key in (("launcher", "launcher"), ("kernel", "kernel")):
        added = [p for p in new[key] if p not in old[key]]
        removed = [p for p in old[key] if p not in new[key]]
        if added or removed:
            change = ", ".join([*(f"+{p}" for p in added), *(f"-{p}" for p in removed)])
            lines.append(f"{label} parameters: {change}")
        else:
            lines.append(f"{label} parameters: unchanged")
    same = old["kernel_sha256"] == new["kernel_sha256"]
    lines.append(
        "kernel source: "
        + ("unchanged" if same else f"{old['kernel_sha256'][:12]} → {new['kernel_sha256'][:12]}")
    )
    lines.append(f"entry switches: {old['switches'] or 'none'} → {new['switches'] or 'none'}")
    renamed = "" if old["file"] == new["file"] else f" → {new['file']}"
    lines.append(f"file: {old['file']}{renamed}")
    if old["down_file"] != new["down_file"]:
        lines.append(f"_down file: {old['down_file'] or 'none'} → {new['down_file'] or 'none'}")
    for label, key in (
        ("default rule", "defaults"),
        ("shipped file", "shipped"),
        ("shipped _down file", "shipped_down"),
    ):
        lines += _entries(label, old[key], new[key])
    return lines


def _entries(label: str, old: dict | None, new: dict | None) -> list[str]:
    if old is None and new is None:
        return [f"{label}: none in either"]
    if old is None or new is None:
        lines = [f"{label}: {_present(old)} → {_present(new)}"]
        return lines + [f"  M={m}: {_entry(e)}" for m, e in (old or new).items()]
    changed = [m for m in new if old.get(m) != new[m]]
    if not changed:
        return [f"{label}: the same at every batch size"]
    lines = [f"{label}: differs at M = {', '.join(map(str, changed))}"]
    for m in changed:
        lines.append(f"  M={m}: {_entry(old.get(m))} → {_entry(new[m])}")
    return lines


def _present(entries: dict | None) -> str:
    return "none" if entries is None else "present"


def _entry(entry: dict | None) -> str:
    if entry is None:
        return "none"
    return " ".join(f"{k}={v}" for k, v in entry.items())


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
        "--capability",
        type=int,
        default=90,
        help="the GPU's compute capability, 90 for sm_90 (default), which some launches read",
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
    except (ValueError, BackendError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(compare(old, new)))
    return 0
