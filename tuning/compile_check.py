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

A file for a GPU not here (`--entries FILE --write DIR`): each entry of a config file (a tune's
on another GPU) compiled at its batch size for the target; an entry that asks for more shared
memory than the target has keeps its tile and loses pipeline stages until it fits (Triton's
figure, not the estimate's). The fitted entries are written under the names the target's GPUs
read them by in both engines (tuning.devices.FILE_DEVICES: the RTX PRO 6000 Blackwell's
editions for 12.0), with the check's record (compile_checked) for moeops: compile-checked, not
timed on that GPU until a worker on one times it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tuning.compile_only import GpuTarget, target_for
from tuning.compile_pool import CompilePool, default_workers
from tuning.config_files import (
    TUNED_BATCH_SIZES,
    ConfigEntryError,
    ConfigFileError,
    config_file_name,
    config_file_relpath,
    dumps_config,
    loads_config,
    parse_ints,
)
from tuning.devices import FILE_DEVICES, capability_text
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
# Beside the files compile-check writes: moeops' import requests of them.
IMPORTS = "moeops-imports.json"
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
        return asdict(self)


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
    backend, spec = _load_backend(engine, source_dir, target)
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


def _load_backend(engine: str, source_dir: str | None, target: GpuTarget):
    """(the engine's kernel backend for target, the compile processes' spec of it)."""
    from tuning.backends import load_backend

    backend = load_backend(engine, source_dir=source_dir, capability=target.capability)
    spec = None
    if engine != "builtin":
        spec = {"engine": engine, "source_dir": str(backend.package.package_dir)}
    return backend, spec


@dataclass
class CheckedEntry:
    """One entry of a config file compiled for the target at its batch size M: given, the
    file's; written, what fits (given, or given with fewer num_stages), None where no stage
    count does; error: why given, or its last try, did not compile (None: written compiles
    within the limit); shared_bytes: what written's kernels take (or the last try asked for)."""

    M: int
    given: dict
    written: dict | None
    error: str | None
    shared_bytes: int | None

    @property
    def changed(self) -> bool:
        return self.written is not None and self.written != self.given

    def as_dict(self) -> dict:
        return {
            "M": self.M,
            "given": self.given,
            "written": self.written,
            "changed": self.changed,
            "error": self.error,
            "shared_bytes": self.shared_bytes,
        }


@dataclass
class EntriesCheck:
    """A config file's entries compiled for target in kernel (KernelBackend.describe)."""

    target: GpuTarget
    shape: KernelShape
    kernel: dict
    triton_version: str
    entries: list[CheckedEntry]

    @property
    def fits(self) -> bool:
        """Whether every entry, as written, compiles within the limit."""
        return all(e.written is not None for e in self.entries)

    def written(self) -> dict[int, dict]:
        """{M: entry} to write (only when fits)."""
        return {e.M: e.written for e in self.entries if e.written is not None}

    def record(self) -> dict:
        """What moeops keeps with the written file (KernelConfig.compile_checked): compiled
        for this capability within this limit in this kernel, never timed there."""
        shared = [e.shared_bytes for e in self.entries if e.written and e.shared_bytes]
        return {
            "capability": capability_text(self.target.capability),
            "limit_bytes": self.target.shared_memory,
            "max_shared_bytes": max(shared, default=None),
            "entries": len(self.entries),
            "fewer_stages": [e.M for e in self.entries if e.changed],
            "kernel": {k: self.kernel.get(k) for k in ("engine", "version", "source_sha256")},
            "triton_version": self.triton_version,
        }

    def as_dict(self) -> dict:
        return {
            "capability": capability_text(self.target.capability),
            "limit_bytes": self.target.shared_memory,
            "kernel": self.kernel,
            "shape": self.shape.as_dict(),
            "fits": self.fits,
            "entries": [e.as_dict() for e in self.entries],
            "compile_checked": self.record(),
        }


def check_entries(
    entries: dict[int, dict],
    shape: KernelShape,
    target: GpuTarget,
    *,
    engine: str = "builtin",
    source_dir: str | None = None,
    workers: int | None = None,
) -> EntriesCheck:
    """Compile each entry {M: entry} at M for target in engine's kernel; an entry that needs
    more shared memory than the target has is tried again with one stage fewer, down to one
    (its tile is what was timed best elsewhere; its depth is what the GPU cannot hold)."""
    import triton

    backend, spec = _load_backend(engine, source_dir, target)
    tries = {m: dict(entry) for m, entry in entries.items()}
    done: dict[int, CheckedEntry] = {}
    pool = CompilePool(shape, workers or default_workers(), backend=spec)
    try:
        pending = sorted(tries)
        while pending:
            reports = pool.compile_reports([(tries[m], m) for m in pending], target)
            again = []
            for m, (error, launched) in zip(pending, reports, strict=True):
                too_big = _REQUIRED.search(error or "")
                if too_big and tries[m]["num_stages"] > 1:
                    tries[m] = {**tries[m], "num_stages": tries[m]["num_stages"] - 1}
                    again.append(m)
                    continue
                written = tries[m] if error is None else None
                shared = _shared_bytes(error, launched)
                done[m] = CheckedEntry(m, dict(entries[m]), written, error, shared)
            pending = again
    finally:
        pool.close()
    return EntriesCheck(
        target=target,
        shape=shape,
        kernel=backend.describe(),
        triton_version=triton.__version__,
        entries=[done[m] for m in sorted(done)],
    )


def write_files(check: EntriesCheck, folder: str | Path, device_names) -> list[dict]:
    """Write check's fitted entries under each of device_names' file names for both engines
    (vLLM's in folder, its VLLM_TUNED_CONFIG_FOLDER; SGLang's in folder/triton_X_Y_Z/, its
    SGLANG_MOE_CONFIG_DIR), and moeops' import requests of them, one a GPU name, with the
    check's record (folder/moeops-imports.json: each the body of POST
    /api/v1/kernel-configs/import). Returns [{device_name, style, path}]."""
    if not check.fits:
        raise ValueError("an entry does not fit the GPU at any stage count: nothing written")
    shape = check.shape
    dtype = "fp8_w8a8" if shape.dtype == "fp8_w8a8" else None
    written, imports = [], []
    for device_name in device_names:
        for style in ("vllm", "sglang"):
            name = config_file_name(shape.E, shape.N, device_name, dtype, shape.block_shape, style)
            relpath = config_file_relpath(name, style, check.triton_version)
            path = Path(folder) / relpath
            path.parent.mkdir(parents=True, exist_ok=True)
            version = check.triton_version if style == "vllm" else None
            text = dumps_config(check.written(), version)
            path.write_text(text)
            written.append({"device_name": device_name, "style": style, "path": str(path)})
            if style == "vllm":
                # one record a GPU name: SGLang's file holds the same entries under its name
                imports.append(
                    {"file_name": relpath, "content": text, "compile_checked": check.record()}
                )
    (Path(folder) / IMPORTS).write_text(json.dumps(imports, indent=1) + "\n")
    return written


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
    from tuning.tune_cli import add_shape_arguments

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
    add_shape_arguments(parser, device=False)
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
    parser.add_argument(
        "--entries",
        help="an engine config file (a tune's on another GPU): compile its entries instead of "
        "the grid, an entry that does not fit losing stages until it does",
    )
    parser.add_argument(
        "--write",
        metavar="DIR",
        help="with --entries: write the fitted entries under the capability's GPU names for "
        "both engines, and moeops' import requests (moeops-imports.json)",
    )
    parser.add_argument(
        "--for-device",
        action="append",
        help="a GPU name (NVML's) to write the files for; repeat it (default: the "
        "capability's, e.g. the RTX PRO 6000 Blackwell's editions for 12.0)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    """Compile and report; exit status 1 when a proposed config fails, 2 for bad arguments."""
    from tuning.tune_cli import shape_from_args

    if args.entries or args.write or args.for_device:
        return _run_entries(args)
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


def _run_entries(args: argparse.Namespace) -> int:
    """--entries [--write DIR]: exit status 1 when an entry fits at no stage count (nothing
    written), 2 for bad arguments."""
    from tuning.tune_cli import shape_from_args

    try:
        if not args.entries:
            raise ValueError("--write and --for-device go with --entries FILE")
        capability = _capability(args.capability)
        target = target_for(capability, args.shared_memory)
        shape = shape_from_args(args)
        devices = args.for_device or list(FILE_DEVICES.get(capability, ()))
        if args.write and not devices:
            raise ValueError(
                f"--write: no GPU names known for compute capability "
                f"{capability_text(capability)}: give them with --for-device"
            )
        for device in devices:
            # the names must make engine file names: validated before anything compiles
            config_file_name(shape.E, shape.N, device)
        entries = _read_entries(args.entries)
        check = check_entries(
            entries,
            shape,
            target,
            engine=args.engine,
            source_dir=args.source,
            workers=args.workers,
        )
    except ConfigFileError as exc:
        print(f"error: --for-device: {exc}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    files = write_files(check, args.write, devices) if args.write and check.fits else []
    if args.json:
        print(json.dumps({**check.as_dict(), "files": files}, indent=1))
    else:
        print_entries(check, files)
    return 0 if check.fits else 1


def _read_entries(path: str) -> dict[int, dict]:
    """{M: entry} of an engine config file; ValueError naming --entries and what is wrong."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"--entries: cannot read {path}: {exc.strerror}") from None
    try:
        return loads_config(text)[1]
    except ConfigEntryError as exc:
        raise ValueError(f"--entries {path}: {'; '.join(exc.errors)}") from None


def print_entries(check: EntriesCheck, files: list[dict]) -> None:
    """The entries' check in a few lines: each entry that lost stages or fits at none, the
    most shared memory, the files written."""
    record = check.record()
    print(
        f"compute capability {record['capability']}, {record['limit_bytes']} bytes of shared"
        f" memory per block; {check.kernel['engine']} {check.kernel.get('version') or ''}"
        f"'s kernel: {len(check.entries)} entries, the most shared memory"
        f" {record['max_shared_bytes']} bytes"
    )
    for entry in check.entries:
        if entry.written is None:
            print(f"  M={entry.M} {_short(entry.given)}: fits at no stage count: {entry.error}")
        elif entry.changed:
            print(
                f"  M={entry.M} {_short(entry.given)} → {entry.written['num_stages']} stages"
                f" ({entry.shared_bytes} bytes)"
            )
    if not check.fits:
        print("nothing written")
    for item in files:
        print(f"  wrote {item['path']}")


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
