"""A tune's results: per batch size the picked configs and their µs, the tuning log they are
resumed from, and the engine's config files written from them."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from tuning.config_files import PATH_OFF, config_file_name, config_file_relpath, dumps_config
from tuning.search import KernelShape


@dataclass
class BatchResult:
    """The outcome at one batch size M: the chosen configs and the layer's µs with them.

    config: GEMM 1's (and the engines' single) config; down_config: GEMM 2's (SGLang's `_down`
    entry), None where no down search ran. tuned_us: the layer with both; shared_config_us: the
    layer with config for both GEMMs (what vLLM, which has no down files, runs).
    failures: configs that failed, those of the down search marked "down": true.
    picked: where the written config comes from: "tuned" (the search), "default" (the engine's
    own rule) or "shipped" (the engine's own file): the search's best replaces the engine's
    only when faster by more than the timings' noise, head to head; tuned_us, default_us and
    shipped_us are from that head-to-head, search_us the search's best there. also_under: the
    written config, the default and the shipped entry timed head to head again under another
    routing than the tune's ({routing, tuned_us, default_us, shipped_us}; a skewed tune's under
    uniform routing), None where not asked.
    """

    M: int
    config: dict[str, int]
    tuned_us: float
    default_us: float | None
    floor_us: float
    candidates_tried: int
    failures: list[dict] = field(default_factory=list)
    down_config: dict[str, int] | None = None
    shared_config_us: float | None = None
    shipped_us: float | None = None
    search_us: float | None = None
    picked: str = "tuned"
    also_under: dict | None = None

    @classmethod
    def from_dict(cls, data: dict) -> BatchResult:
        """Inverse of dataclasses.asdict."""
        return cls(**data)


@dataclass
class ProcessTimeline:
    """Where one tuning process's seconds went (s). setup_s: building the Tuner (imports,
    weights; in tuning.spread's processes counted from their launch); tune_s: Tuner.tune
    (waiting for the compile processes to start, measuring the ceilings, searching); compile_s:
    the part of tune_s spent waiting on compiles; timing_s: the part spent timing configs on the
    GPU (a kernel's first launch in this process included), `timings` of them. pool_start_s:
    from the compile processes' creation, first thing in the set-up, until all had started; it
    overlaps setup_s and, where longer, the start of tune_s. Parts of setup_s: import_s (torch,
    Triton, the kernel), cuda_s (this process's CUDA context), weights_s; of tune_s: ceilings_s
    (measuring them; 0 when read from the cache).
    """

    setup_s: float = 0.0
    pool_start_s: float = 0.0
    compile_s: float = 0.0
    timing_s: float = 0.0
    timings: int = 0
    tune_s: float = 0.0
    import_s: float = 0.0
    cuda_s: float = 0.0
    weights_s: float = 0.0
    ceilings_s: float = 0.0


@dataclass
class TuneResult:
    """A tune of one shape on one GPU: per batch size config and µs (tuned, default, floor).

    ceilings: the measured bandwidth_tbps, bf16_tflops and fp8_tflops behind floor_us.
    search: "coarse-to-fine" or "exhaustive". wall_s: seconds the tune took. kernel: whose
    kernel was timed (tuning.backends.base: engine, version, source_sha256). limits: the GPU's
    that the search pruned with (capability, shared_memory_bytes: GpuTarget.limits); {} in logs
    written before they were recorded, whose searches pruned with the H100's. routing: what
    the timings drew their router choices under (tuning.routing.Routing.as_dict; logs from
    before routings: uniform).
    timeline: where this run's seconds went: a ProcessTimeline from Tuner.tune, per GPU index
    its process's from tuning.spread.spread_tune; not in the log, None when read from one.
    """

    shape: KernelShape
    device_name: str
    triton_version: str
    search: str
    ceilings: dict
    batches: dict[int, BatchResult] = field(default_factory=dict)
    wall_s: float = 0.0
    kernel: dict = field(default_factory=lambda: {"engine": "builtin"})
    limits: dict = field(default_factory=dict)
    routing: dict = field(default_factory=lambda: {"kind": "uniform"})
    timeline: ProcessTimeline | dict[int, ProcessTimeline] | None = field(
        default=None, compare=False
    )

    def entries(self) -> dict[int, dict]:
        """{M: config} as the engines' config files hold them, M ascending."""
        return {m: dict(self.batches[m].config) for m in sorted(self.batches)}

    @property
    def kernel_path(self) -> str:
        """Which launch of the kernel was tuned (tuning.engines.KERNEL_PATHS)."""
        return self.kernel.get("path") or "default"

    def down_entries(self) -> dict[int, dict]:
        """{M: down config} for the `_down` file. SGLang's: batch sizes without one left out.
        vLLM's (sorted-A path): every batch size, `{"USE_TMA": false}` where GEMM 2 runs best
        with GEMM 1's config, so that no neighbour's entry turns the path on there."""
        if self.kernel_path == "sorted_a":
            return {m: self._sorted_a_entry(self.batches[m]) for m in sorted(self.batches)}
        return {
            m: dict(self.batches[m].down_config)
            for m in sorted(self.batches)
            if self.batches[m].down_config is not None
        }

    @staticmethod
    def _sorted_a_entry(batch: BatchResult) -> dict:
        down = batch.down_config
        if down is None or down == batch.config or not down.get("USE_TMA"):
            return dict(PATH_OFF)
        return dict(down)

    def writes_down_file(self, style: str) -> bool:
        """Whether the engine of style reads a `_down` file this tune wrote entries for."""
        if style == "vllm":
            return self.kernel_path == "sorted_a" and bool(self.batches)
        return bool(self.down_entries())

    def limits_phrase(self) -> str | None:
        """The limits the search pruned with, in a phrase ("searched within compute capability
        12.0's 101376 bytes of shared memory per block"); None for a log without them."""
        if not self.limits:
            return None
        capability = self.limits["capability"]
        return (
            f"searched within compute capability {capability // 10}.{capability % 10}'s"
            f" {self.limits['shared_memory_bytes']} bytes of shared memory per block"
        )

    def speedup_geomean(self, over: str = "default") -> float | None:
        """Geometric mean over batch sizes of the default's (or "shipped") µs / tuned µs."""
        key = f"{over}_us"
        ratios = [getattr(b, key) / b.tuned_us for b in self.batches.values() if getattr(b, key)]
        return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None

    def to_dict(self) -> dict:
        """JSON-ready form (the tuning log)."""
        return {
            "shape": self.shape.as_dict(),
            "device_name": self.device_name,
            "triton_version": self.triton_version,
            "search": self.search,
            "ceilings": self.ceilings,
            "wall_s": self.wall_s,
            "kernel": self.kernel,
            "limits": self.limits,
            "routing": self.routing,
            "batches": {str(m): vars(self.batches[m]) for m in sorted(self.batches)},
        }

    @classmethod
    def from_dict(cls, data: dict) -> TuneResult:
        """Inverse of to_dict."""
        return cls(
            shape=KernelShape.from_dict(data["shape"]),
            device_name=data["device_name"],
            triton_version=data["triton_version"],
            search=data["search"],
            ceilings=data["ceilings"],
            batches={int(m): BatchResult.from_dict(b) for m, b in data["batches"].items()},
            wall_s=data.get("wall_s", 0.0),
            kernel=data.get("kernel") or {"engine": "builtin"},
            limits=data.get("limits") or {},
            routing=data.get("routing") or {"kind": "uniform"},
        )

    def same_run_as(self, other: TuneResult) -> bool:
        """Whether two results tune the same shape of the same kernel on the same GPU model and
        Triton, under the same routing."""
        mine = (
            self.shape,
            self.device_name,
            self.triton_version,
            self.search,
            self.kernel,
            self.routing,
        )
        return mine == (
            other.shape,
            other.device_name,
            other.triton_version,
            other.search,
            other.kernel,
            other.routing,
        )


# How much slower than the better of the engine's own configs the written one may be under
# another routing before it is said to lose there: the head-to-heads' noise.
LOSS_NOISE = 0.02


def loss_under(also_under: dict | None) -> float | None:
    """How much slower the written config is than the better of the engine's default and
    shipped under the other routing (0.09: 9 %), None where it is not slower beyond
    LOSS_NOISE or nothing was timed."""
    if not also_under or not also_under.get("tuned_us"):
        return None
    own = [also_under.get(k) for k in ("default_us", "shipped_us")]
    own = [us for us in own if us]
    if not own:
        return None
    loss = also_under["tuned_us"] / min(own) - 1
    return loss if loss > LOSS_NOISE else None


def losses_under_other_routing(result: TuneResult) -> list[str]:
    """ "loses 9 % at M=64 under Zipf 1.2" for each batch size where the written config, timed
    under the other routing, is slower than the engine's own there beyond the noise."""
    said = []
    for m, batch in sorted(result.batches.items()):
        loss = loss_under(batch.also_under)
        if loss is not None:
            under = routing_label(batch.also_under["routing"])
            said.append(f"loses {round(loss * 100)} % at M={m} under {under}")
    return said


def routing_label(routing: dict) -> str:
    """A result's routing in words ("Zipf 1.2"; tuning.routing.Routing.label, without numpy)."""
    kind, parameter = routing.get("kind", "uniform"), routing.get("parameter")
    if kind == "zipf":
        return f"Zipf {parameter:g}"
    if kind == "dirichlet":
        return f"Dirichlet α={parameter:g}"
    if kind == "file":
        return f"top-k ids from {Path(routing['file']).name}"
    return "uniform"


def merge_results(results: Iterable[TuneResult]) -> TuneResult:
    """One result from parts tuned side by side (e.g. one process per GPU, disjoint M).

    The parts must agree on shape, device name, Triton version and search; a batch size
    in several parts keeps the last. wall_s is the longest part's (they ran in parallel).
    """
    results = list(results)
    if not results:
        raise ValueError("nothing to merge")
    first = results[0]
    for other in results[1:]:
        if not first.same_run_as(other):
            raise ValueError("results disagree on shape, device, Triton version or search")
    merged = replace(first, batches={}, wall_s=max(r.wall_s for r in results), timeline=None)
    for result in results:
        merged.batches.update(result.batches)
    return merged


def config_path(
    result: TuneResult, out_dir: str | Path, style: str = "vllm", *, down: bool = False
) -> Path:
    """Where the engine's config file for this result goes under out_dir (SGLang: its folder);
    down: the `_down` file of GEMM 2's configs."""
    name = engine_file_name(result.shape, result.device_name, style, down=down)
    return Path(out_dir) / config_file_relpath(name, style, result.triton_version)


def engine_file_name(shape: KernelShape, device_name: str, style: str, *, down=False) -> str:
    """The engine's file name for shape on device_name (bf16 names carry no dtype part)."""
    return config_file_name(
        shape.E,
        shape.N,
        device_name,
        "fp8_w8a8" if shape.dtype == "fp8_w8a8" else None,
        shape.block_shape,
        style=style,
        down_moe=down,
    )


def write_config_file(
    result: TuneResult, out_dir: str | Path, style: str = "vllm", *, down: bool = False
) -> Path:
    """Write the engine's config file (exact name and content); returns its path.

    vLLM's files record triton_version inside; SGLang's name it by their folder instead.
    down: the `_down` file of GEMM 2's configs (SGLang's, or vLLM's on its sorted-A path).
    """
    path = config_path(result, out_dir, style, down=down)
    path.parent.mkdir(parents=True, exist_ok=True)
    version = result.triton_version if style == "vllm" else None
    entries = result.down_entries() if down else result.entries()
    path.write_text(dumps_config(entries, version, vllm_down=down and style == "vllm"))
    return path


def write_config_files(result: TuneResult, out_dir: str | Path, style: str = "vllm") -> list[Path]:
    """The engine's config file, and its `_down` file where the engine reads one this tune
    wrote entries for (writes_down_file): never a file the engine will not read."""
    paths = [write_config_file(result, out_dir, style)]
    if result.writes_down_file(style):
        paths.append(write_config_file(result, out_dir, style, down=True))
    return paths


class TuningLogError(ValueError):
    """A tuning log that cannot be read back; the message names it."""


def load_log(path: str | Path | None) -> TuneResult | None:
    """The log at path, None where there is none yet; TuningLogError if it cannot be read."""
    if path is None or not Path(path).exists():
        return None
    return read_log(path)


def read_log(path: str | Path) -> TuneResult:
    try:
        return TuneResult.from_dict(json.loads(Path(path).read_text()))
    except OSError as exc:
        raise TuningLogError(f"cannot read {path}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise TuningLogError(f"{path} is not a tuning log ({type(exc).__name__}: {exc})") from None


def save_log(path: str | Path | None, result: TuneResult) -> None:
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(result.to_dict(), indent=1) + "\n")
    partial.replace(path)


def print_summary(result: TuneResult) -> None:
    """Which kernel; per batch size the written config's µs and where it comes from, the
    engine's default and shipped µs, floor and tries; speedups and wall."""
    kernel = result.kernel
    version = f" {kernel.get('version')}" if kernel.get("version") else ""
    print(f"kernel: {kernel.get('engine')}{version}")
    if result.limits:
        print(result.limits_phrase())
    if result.routing.get("kind", "uniform") != "uniform":
        print(f"timed under {routing_label(result.routing)} routing")
    for m, b in sorted(result.batches.items()):
        shared = "" if b.shared_config_us is None else f"  one config {b.shared_config_us:9.1f} µs"
        shipped = "" if b.shipped_us is None else f"  shipped {b.shipped_us:9.1f} µs"
        print(
            f"M={m:>5}  {b.picked:<7} {b.tuned_us:9.1f} µs{shared}  default"
            f" {b.default_us or float('nan'):9.1f} µs{shipped}  floor {b.floor_us:9.1f} µs"
            f"  tried {b.candidates_tried}"
        )
    for line in losses_under_other_routing(result):
        print(line)
    for over in ("default", "shipped"):
        speedup = result.speedup_geomean(over)
        if speedup is not None:
            print(f"written/{over} geomean speedup {speedup:.3f}x")
    print(f"wall {result.wall_s:.0f} s")
