"""`python -m tuning compile-check`: compile, for a GPU that need not be here, every config a tune
would propose for a shape, and report which fit.

A tune on a GPU compiles its candidates ahead of timing in compile processes that open no CUDA
context (tuning.compile_pool, tuning.compile_only). The same processes compile here for a
target named by its compute capability (`--capability 12.0`) and its shared memory per block
(tuning.compile_only.SHARED_MEMORY_PER_BLOCK_OPTIN, or `--shared-memory`), in the engine's own
kernel read from its package, and launch nothing: each config's kernels are compiled and checked
against the limit as a launch on that GPU would check them (Triton's OutOfResources), and each
launch the layer asks for notes its kernel's shared memory.

What is proposed: every config a search could time at the batch sizes (tuning.search: each size's
space, and the configs its climbs may step to from those and from the engine's own, which are
still within the grid and the limit), each compiled once, at the first batch size whose space
holds it (an engine's kernel specialises on the batch size; what it needs of shared memory does
not depend on it). The engine's own configs (its default at each size, its shipped file's
entries) enter a tune's first round unpruned: they are compiled and reported beside, not counted.
GEMM 2's own configs (a `_down` file) are not compiled here: the compile processes compile the
layer with one config.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field

from tuning.compile_only import GpuTarget, target_for
from tuning.compile_pool import CompilePool, default_workers
from tuning.config_files import TUNED_BATCH_SIZES, parse_ints
from tuning.engines import ENGINES
from tuning.search import (
    SWITCHES,
    KernelShape,
    compile_key,
    config_key,
    config_of,
    neighbours,
    search_space,
    shared_memory_bytes,
    switched,
)

# How many neighbourhood rounds a search climbs at most (CoarseToFineSearch's two, a
# DownProjectionSearch's three: the grid GEMM 1's configs come from is reached in two).
CLIMBS = 2
# Triton's OutOfResources message: "out of resource: shared memory, Required: 148480, ..."
_REQUIRED = re.compile(r"shared memory, Required: (\d+)")


@dataclass
class CheckedConfig:
    """One config compiled for the target at batch size M: None or why it failed, the most
    shared memory one of its layer's kernels takes (bytes; for a kernel that did not fit, what
    it asked for), the search's estimate of its GEMMs' (tuning.search.shared_memory_bytes), and
    kernels {name: bytes} of those its layer launched (the GEMMs, and the sort-and-pad and
    activation kernels, whose shared memory does not follow the config)."""

    config: dict
    M: int | None
    error: str | None
    shared_bytes: int | None
    estimate_bytes: int
    source: str = "search"
    kernels: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "config": self.config,
            "M": self.M,
            "error": self.error,
            "shared_bytes": self.shared_bytes,
            "estimate_bytes": self.estimate_bytes,
            "source": self.source,
            "kernels": self.kernels,
        }


@dataclass
class CompileCheck:
    """What compiling a shape's proposed configs for a target found.

    proposed: how many configs the searches could propose (proposed_configs); configs: those
    compiled (all of them, or the sample asked for), engine_configs: the engine's own.
    """

    target: GpuTarget
    shape: KernelShape
    kernel: dict
    batch_sizes: list[int]
    proposed: int
    configs: list[CheckedConfig] = field(default_factory=list)
    engine_configs: list[CheckedConfig] = field(default_factory=list)
    sample: int | None = None

    @property
    def failed(self) -> list[CheckedConfig]:
        return [c for c in self.configs if c.error is not None]

    @property
    def compiled(self) -> int:
        return len(self.configs) - len(self.failed)

    @property
    def max_shared_bytes(self) -> int | None:
        """The most shared memory a compiled config takes (bytes)."""
        fitting = [c.shared_bytes for c in self.configs if c.error is None and c.shared_bytes]
        return max(fitting, default=None)

    def as_dict(self) -> dict:
        """The report `--json` prints."""
        capability = self.target.capability
        return {
            "capability": f"{capability // 10}.{capability % 10}",
            "limit_bytes": self.target.shared_memory,
            "kernel": self.kernel,
            "shape": self.shape.as_dict(),
            "batch_sizes": self.batch_sizes,
            "proposed": self.proposed,
            "checked": len(self.configs),
            "sample": self.sample,
            "compiled": self.compiled,
            "failed": [c.as_dict() for c in self.failed],
            "max_shared_bytes": self.max_shared_bytes,
            "configs": [c.as_dict() for c in self.configs],
            "engine_configs": [c.as_dict() for c in self.engine_configs],
        }


def proposed_configs(
    shape: KernelShape,
    batch_sizes: list[int],
    target: GpuTarget,
    switches: dict,
    engine_own: dict[int, list[dict]],
) -> dict[tuple, tuple[dict, int]]:
    """{config key: (config, batch size to compile it at)} of every config a search could
    propose at batch_sizes for target: each size's space, then CLIMBS steps of neighbours from
    those and from the engine's own configs engine_own {M: configs}."""
    limits = {"shared_memory": target.shared_memory, "capability": target.capability}
    found: dict[tuple, tuple[dict, int]] = {}
    for m in batch_sizes:
        for config in search_space(m, shape, switches=switches, **limits):
            found.setdefault(config_key(config), (config, m))
    frontier = [(config, m) for config, m in found.values()]
    frontier += [(switched(c, switches), m) for m in batch_sizes for c in engine_own.get(m, ())]
    for _ in range(CLIMBS):
        stepped = []
        for config, m in frontier:
            for near in neighbours(config, shape, switches=switches, **limits):
                if config_key(near) not in found:
                    found[config_key(near)] = (near, m)
                    stepped.append((near, m))
        frontier = stepped
    return found


def riskiest(
    configs: list[tuple[dict, int]], shape: KernelShape, n: int, capability: int = 90
) -> list[tuple[dict, int]]:
    """The configs likeliest not to fit: the n with the deepest pipelines (the search's estimate
    of their shared memory), then the n with the biggest output tiles (BM × BN, which the
    epilogue may stage through shared memory) and the shallowest pipelines; one GROUP_SIZE_M of
    each, which orders the tiles and takes no memory."""

    def estimate(config: dict) -> int:
        return shared_memory_bytes(config, shape.operand_bytes, capability)

    by_pipeline = sorted(configs, key=lambda c: -estimate(c[0]))
    by_tile = sorted(
        configs,
        key=lambda c: (
            -c[0]["BLOCK_SIZE_M"] * c[0]["BLOCK_SIZE_N"],
            estimate(c[0]),
        ),
    )
    chosen: dict[tuple, tuple[dict, int]] = {}
    for ranked in (by_pipeline, by_tile):
        taken = 0
        for config, m in ranked:
            if taken == n:
                break
            if compile_key(config) not in chosen:
                chosen[compile_key(config)] = (config, m)
                taken += 1
    return list(chosen.values())


def compile_check(
    shape: KernelShape,
    target: GpuTarget,
    *,
    engine: str = "builtin",
    source_dir: str | None = None,
    batch_sizes: list[int] = TUNED_BATCH_SIZES,
    device_name: str | None = None,
    sample: int | None = None,
    workers: int | None = None,
) -> CompileCheck:
    """Compile shape's proposed configs for target in engine's kernel (its package at
    source_dir, else where its Python finds it); device_name: the GPU whose shipped file the
    engine would read (None: none looked up); sample: only the 2·sample riskiest configs."""
    from tuning.backends import load_backend

    backend = load_backend(engine, source_dir=source_dir, capability=target.capability)
    spec = None
    if engine != "builtin":
        spec = {"engine": engine, "source_dir": str(backend.package.package_dir)}
    shipped = backend.shipped_configs(shape, device_name) if device_name else None
    engine_own: dict[int, list[dict]] = {}
    own_jobs: dict[tuple, CheckedConfig] = {}
    # each once, as the search's configs, at the first size that uses it
    for m in batch_sizes:
        default = backend.default_config(shape, m)
        engine_own[m] = [default, *(shipped.entries.values() if shipped else ())]
        key = ("default", *config_key(default))
        own_jobs.setdefault(key, _unchecked(default, m, shape, target))
    for m, entry in (shipped.entries if shipped else {}).items():
        key = ("shipped", *config_key(entry))
        own_jobs.setdefault(key, _unchecked(entry, m, shape, target, "shipped"))
    switches = backend.search_switches(shape)
    proposed = proposed_configs(shape, batch_sizes, target, switches, engine_own)
    jobs = list(proposed.values())
    if sample is not None:
        jobs = riskiest(jobs, shape, sample, target.capability)
    checked = [_unchecked(config, m, shape, target, "search") for config, m in jobs]
    pool = CompilePool(shape, workers or default_workers(), backend=spec)
    try:
        everything = checked + list(own_jobs.values())
        reports = pool.compile_reports([(c.config, c.M) for c in everything], target)
    finally:
        pool.close()
    for item, (error, launched) in zip(everything, reports, strict=True):
        item.error = error
        item.shared_bytes = _shared_bytes(error, launched)
        item.kernels = launched
    return CompileCheck(
        target=target,
        shape=shape,
        kernel=backend.describe(),
        batch_sizes=list(batch_sizes),
        proposed=len(proposed),
        configs=checked,
        engine_configs=list(own_jobs.values()),
        sample=sample,
    )


def _unchecked(
    config: dict, M: int, shape: KernelShape, target: GpuTarget, source: str = "default"
) -> CheckedConfig:
    config = config_of(config_key(config)) if source == "search" else dict(config)
    estimate = shared_memory_bytes(config, shape.operand_bytes, target.capability)
    return CheckedConfig(config, M, None, None, estimate, source)


def _shared_bytes(error: str | None, launched: dict[str, int]) -> int | None:
    """The most shared memory one of the layer's kernels took, or the kernel that did not fit
    asked for (Triton's message)."""
    asked = _REQUIRED.search(error or "")
    if asked:
        return int(asked[1])
    return max(launched.values(), default=None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `python -m tuning compile-check`."""
    parser.add_argument(
        "--capability", required=True, help="the GPU's compute capability, e.g. 12.0, 10.0, 9.0"
    )
    parser.add_argument(
        "--shared-memory",
        type=int,
        help="bytes of shared memory one block may opt into (default: the capability's)",
    )
    parser.add_argument("--engine", choices=ENGINES, default="vllm", help="whose kernel")
    parser.add_argument(
        "--source", help="the engine's package folder (default: the installed engine's)"
    )
    parser.add_argument("--model-config", required=True, help="the model's HF config.json")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (default 1)")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel ranks (default 1)")
    parser.add_argument(
        "--dtype",
        choices=("bf16", "fp8_w8a8"),
        help="kernel dtype (default: fp8_w8a8 for fp8 checkpoints, else bf16)",
    )
    parser.add_argument(
        "--block-shape", help="fp8 weight-scale block, e.g. 128,128 (default: the model's)"
    )
    parser.add_argument(
        "--batch-sizes", help="comma-separated batch sizes (default: the 18 the engines tune)"
    )
    parser.add_argument(
        "--device-name",
        help="the GPU's name as torch gives it, for the engine's shipped file (default: none)",
    )
    parser.add_argument(
        "--sample",
        type=int,
        help="compile only the riskiest: the N deepest pipelines and the N biggest tiles",
    )
    parser.add_argument(
        "--workers", type=int, help="parallel compile processes (default: CPUs − 1, at most 32)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    """Compile and report; exit status 1 when a proposed config fails, 2 for bad arguments."""
    from tuning.tune_cli import shape_from_args

    try:
        capability = _capability(args.capability)
        target = target_for(capability, args.shared_memory)
        shape = shape_from_args(args)
        batch_sizes = parse_ints(args.batch_sizes) if args.batch_sizes else TUNED_BATCH_SIZES
        check = compile_check(
            shape,
            target,
            engine=args.engine,
            source_dir=args.source,
            batch_sizes=batch_sizes,
            device_name=args.device_name,
            sample=args.sample,
            workers=args.workers,
        )
    except (ValueError, RuntimeError) as exc:
        # RuntimeError: a BackendError, or compile processes that could not compile
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(check.as_dict(), indent=1))
    else:
        print_report(check)
    return 1 if check.failed else 0


def _capability(text: str) -> int:
    """12.0 → 120 (Triton's and the engines' integer form)."""
    major, dot, minor = text.partition(".")
    if not (major.isdigit() and (not dot or minor.isdigit()) and len(minor) <= 1):
        raise ValueError(f"--capability {text}: a compute capability, e.g. 12.0")
    return int(major) * 10 + int(minor or 0)


def print_report(check: CompileCheck) -> None:
    """The check in a few lines: counts, the largest shared memory, each failure, the engine's
    own configs."""
    report = check.as_dict()
    kernel = check.kernel
    what = f"{kernel['engine']} {kernel.get('version') or ''}".strip()
    sampled = f" (the {report['checked']} riskiest)" if check.sample is not None else ""
    print(
        f"compute capability {report['capability']}, {report['limit_bytes']} bytes of shared"
        f" memory per block; {what}'s kernel"
    )
    print(
        f"proposed {report['proposed']}, compiled {report['checked']}{sampled}: "
        f"{report['compiled']} fit, {len(report['failed'])} failed; the most shared memory"
        f" {report['max_shared_bytes']} bytes"
    )
    for item in check.failed:
        print(f"  failed M={item.M} {_short(item.config)}: {item.error}")
    for item in check.engine_configs:
        state = item.error or f"fits ({item.shared_bytes} bytes)"
        print(f"  engine's {item.source} M={item.M} {_short(item.config)}: {state}")


def _short(config: dict) -> str:
    """64x128x128 g32 w4 s3 (BLOCK_SIZE_M x N x K, GROUP_SIZE_M, warps, stages), then switches."""
    bm, bn, bk, group, warps, stages, *switches = config_key(config)
    said = [f"{name}={value}" for name, value in zip(SWITCHES, switches, strict=False)]
    return " ".join([f"{bm}x{bn}x{bk} g{group} w{warps} s{stages}", *said])
