"""Read an engine's torch-profiler traces and break each engine step down into time classes.

    read_breakdown(Path("traces/")) -> StepBreakdown

The input is a folder, a .zip or trace files (`*.pt.trace.json.gz`, `*.json.gz`, `*.json`), one
file per engine rank (vLLM also writes a front-end file, `*async_llm*`, with no steps: skipped
with a note). A trace is streamed with ijson, never loaded whole: a GPU rank's trace runs to GBs.
Rank files are read in parallel processes. How a step is cut, what each class holds and what idle
means on a GPU and a CPU trace: docs/metrics.md, "Inside the step".
"""

import bisect
import gzip
import multiprocessing
import re
import shutil
import tempfile
import zipfile
import zlib
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import ijson

from domain.latency_stats import percentile
from domain.step_breakdown import (
    CLASSES,
    STEP_KINDS,
    ClassTime,
    KindBreakdown,
    RankBreakdown,
    StepBreakdown,
    StepPoint,
    TopName,
)
from domain.step_classes import RuleTable, rule_table

DEFAULT_MAX_BYTES = 4 * 2**30
# StepPoints kept per rank; every step still counts in the kinds' figures
MAX_STEPS = 2000
# a rank (median decode step, communication share) this far from the others' median gets a note
RANK_SPREAD = 0.15
# ...and, for a share, at least this many points apart: 1 % against 2 % is noise, not a story
RANK_SHARE_FLOOR = 0.02
# a zip member inflating more than this is refused: JSON traces deflate some 10-30x
ZIP_MAX_RATIO = 500
TOP_NAMES = 5
MAX_NOTES = 50
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver")

# vLLM's gpu_worker names each step execute_context_<reqs>(<tokens>)_generation_<reqs>(<tokens>),
# or with detailed annotations execute_<n>_context_<reqs>(sq<tokens>sk..)_generation_<reqs>(sq..
VLLM_STEP = re.compile(
    r"^execute_(?:\d+_)?context_\d+\((?:sq)?(\d+)[^)]*\)_generation_\d+\((?:sq)?(\d+)"
)
# SGLang 0.5.23's model_runner wraps a forward in profile_range(build_step_span_name(...)):
# step[DECODE bs=8], step[EXTEND bs=4 toks=256], step[MIXED bs=6], step[VERIFY ...], ...
SGLANG_STEP = re.compile(r"^step\[([A-Z_0-9]+) bs=(\d+)(?: toks=(\d+))?")
RANK_IN_NAME = re.compile(r"(?:rank|TP-)(\d+)")


class TraceError(Exception):
    """Input that cannot be read as an engine's trace; the message names the file."""


class _NotATrace(TraceError):
    """A JSON file that is no torch-profiler trace: skipped beside other ranks' traces."""


@dataclass
class _Step:
    start: float
    end: float
    tid: object
    prefill: int
    decode: int
    kind: str


@dataclass
class _StepTime:
    start_us: float
    kind: str
    wall_us: float
    prefill: int
    decode: int
    classes: dict = field(default_factory=dict)
    names: dict = field(default_factory=dict)


@dataclass
class _RankResult:
    breakdown: RankBreakdown | None = None
    first_start_us: float = 0.0
    engine: str = ""
    version: str = ""
    rules: str = ""
    notes: list = field(default_factory=list)
    skipped: str = ""


def read_breakdown(
    paths: list[Path] | Path, *, max_bytes: int = DEFAULT_MAX_BYTES, workers: int = 2
) -> StepBreakdown:
    """The breakdown of a profiled window: a folder, a .zip or trace files, one per rank.

    max_bytes bounds each trace's uncompressed size (and a .zip's members); workers is how many
    rank files are read at once, each in a process of its own. Raises TraceError for input that
    is not an engine's trace, damaged, over the limit or of an engine moeops has no rules for.
    """
    with tempfile.TemporaryDirectory(prefix="moeops-trace-") as scratch:
        files = _trace_files(paths, Path(scratch), max_bytes)
        results = _read_all(files, max_bytes, workers)
    return _combine(results)


def _trace_files(paths, scratch: Path, max_bytes: int) -> list[tuple[Path, str]]:
    """(path on disk, name to show) of each trace file the input holds."""
    given = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if not given:
        raise TraceError("no trace files given")
    files = []
    for raw in given:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and _is_trace_name(p.name))
            if not found:
                raise TraceError(f"{path}: no trace files (*.json.gz, *.json) in this folder")
            files += [(p, str(p)) for p in found]
        elif not path.exists():
            raise TraceError(f"{path}: no such file or folder")
        elif path.suffix == ".zip":
            files += _unzip(path, scratch, max_bytes)
        elif _is_trace_name(path.name):
            files.append((path, str(path)))
        else:
            raise TraceError(f"{path}: not a trace file (.json.gz, .json) or a .zip of them")
    for path, shown in files:
        size = path.stat().st_size
        if size > max_bytes:
            raise TraceError(f"{shown}: {_size(size)}, over the {_size(max_bytes)} limit")
    return files


def _is_trace_name(name: str) -> bool:
    return name.endswith((".json.gz", ".json"))


# characters of a zip member's name kept on disk (file systems take 255 bytes)
MAX_NAME = 120


def _unzip(archive: Path, scratch: Path, max_bytes: int) -> list[tuple[Path, str]]:
    try:
        with zipfile.ZipFile(archive) as zipped:
            members = [m for m in zipped.infolist() if not m.is_dir()]
            files = []
            for member in members:
                parts = PurePosixPath(member.filename.replace("\\", "/")).parts
                if member.filename.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
                    raise TraceError(
                        f'{archive}: member "{member.filename}" points outside the archive'
                    )
                if not _is_trace_name(member.filename):
                    continue
                shown = f"{archive}:{member.filename}"
                if member.file_size > max_bytes:
                    raise TraceError(
                        f"{shown}: {_size(member.file_size)}, over the {_size(max_bytes)} limit"
                    )
                if member.file_size > ZIP_MAX_RATIO * max(member.compress_size, 1):
                    raise TraceError(
                        f"{shown}: inflates {member.file_size // max(member.compress_size, 1)}"
                        " times its packed size: refused as a zip bomb"
                    )
                name = PurePosixPath(*parts).name
                # a name past what the file system takes keeps its start (the rank) and its end
                # (the suffix); the breakdown names the member as the archive does
                if len(name) > MAX_NAME:
                    name = f"{name[: MAX_NAME // 2]}…{name[-MAX_NAME // 2 :]}"
                target = scratch / f"{len(files)}-{name}"
                # zipfile stops a member at its declared size, checked above
                with zipped.open(member) as source, open(target, "wb") as out:
                    shutil.copyfileobj(source, out, 1 << 20)
                files.append((target, shown))
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise TraceError(f"{archive}: not a readable zip ({exc})") from None
    except OSError as exc:
        raise TraceError(f"{archive}: could not unpack it here ({exc.strerror})") from None
    if not files:
        raise TraceError(f"{archive}: no trace files (*.json.gz, *.json) in this archive")
    return files


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _read_all(files, max_bytes: int, workers: int) -> list[_RankResult]:
    jobs = [(str(path), shown, max_bytes) for path, shown in files]
    # a daemonic process (a Celery prefork child) may not start processes of its own
    if workers <= 1 or len(jobs) == 1 or multiprocessing.current_process().daemon:
        return [_read_rank(*job) for job in jobs]
    # fork: the child only reads a file, and spawn would run a caller's unguarded main again
    context = multiprocessing.get_context("fork")
    try:
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=context) as pool:
            return list(pool.map(_read_rank, *zip(*jobs, strict=True)))
    except BrokenProcessPool:
        raise TraceError("a process reading the traces died (out of memory?)") from None


class _Limited:
    """A binary stream that raises once more than `limit` bytes were read from it."""

    def __init__(self, raw, limit: int, shown: str):
        self.raw, self.limit, self.shown, self.read_bytes = raw, limit, shown, 0

    def read(self, n=-1):
        chunk = self.raw.read(n)
        self.read_bytes += len(chunk)
        if self.read_bytes > self.limit:
            raise TraceError(f"{self.shown}: over the {_size(self.limit)} limit uncompressed")
        return chunk


@contextmanager
def _opened(path: str, shown: str, limit: int):
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    with gzip.open(path, "rb") if gzipped else open(path, "rb") as raw:
        yield _Limited(raw, limit, shown)


def _read_rank(path: str, shown: str, max_bytes: int) -> _RankResult:
    """One rank's file, read in a process of its own: its RankBreakdown, or why it was skipped."""
    try:
        header = _read_header(path, shown, max_bytes)
        return _breakdown_rank(path, shown, max_bytes, header)
    except _NotATrace as exc:
        return _RankResult(skipped=str(exc))
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceError(f"{shown}: a truncated or damaged gzip file ({exc})") from None
    except ijson.IncompleteJSONError:
        raise TraceError(f"{shown}: the JSON ends early (a truncated trace)") from None
    except ijson.JSONError as exc:
        raise TraceError(f"{shown}: not valid JSON ({str(exc).strip()})") from None
    except UnicodeDecodeError:
        raise TraceError(f"{shown}: not text (neither JSON nor gzip)") from None
    except (KeyError, TypeError, ValueError):
        raise TraceError(f"{shown}: an event without its name, ts or dur (not Kineto's)") from None


@dataclass
class _Header:
    engine: str = ""
    version: str = ""
    rank: int | None = None
    gpus: int = 0


def _read_header(path: str, shown: str, max_bytes: int) -> _Header:
    """The top-level keys before traceEvents: engine version, rank, devices."""
    header = _Header()
    with _opened(path, shown, max_bytes) as stream:
        events = ijson.parse(stream, use_float=True)
        first = next(events, None)
        if first is None or first[:2] != ("", "start_map"):
            raise _NotATrace(f"{shown}: not a torch-profiler trace (not a JSON object)")
        for prefix, event, value in events:
            if prefix == "traceEvents" and event == "start_array":
                return header
            if prefix == "" and event == "end_map":
                break
            if prefix == "vllm_version" and event == "string":
                header.engine, header.version = "vllm", value
            elif prefix == "distributedInfo.rank" and event == "number":
                header.rank = int(value)
            elif prefix == "deviceProperties.item" and event == "start_map":
                header.gpus += 1
    raise _NotATrace(f"{shown}: not a torch-profiler trace (no traceEvents)")


@dataclass
class _Scan:
    steps: list = field(default_factory=list)
    ops: list = field(default_factory=list)
    kernels: list = field(default_factory=list)
    launches: list = field(default_factory=list)
    engine: str = ""


def _scan(path: str, shown: str, max_bytes: int, keep_ops: bool) -> _Scan:
    """What the breakdown needs of a trace's events, as tuples; the rest is dropped on sight."""
    scan = _Scan()
    steps, ops, kernels, launches = scan.steps, scan.ops, scan.kernels, scan.launches
    names: dict[str, str] = {}
    with _opened(path, shown, max_bytes) as stream:
        for ev in ijson.items(stream, "traceEvents.item", use_float=True):
            if ev.get("ph") != "X":
                continue
            cat = ev.get("cat")
            if cat == "cpu_op":
                if keep_ops:
                    name = ev["name"]
                    ops.append((ev["ts"], ev["dur"], names.setdefault(name, name), ev["tid"]))
            elif cat in RUNTIME_CATEGORIES:
                corr = ev.get("args", {}).get("correlation")
                if corr is not None:
                    launches.append((ev["ts"], corr))
            elif cat in GPU_CATEGORIES:
                name = ev["name"]
                corr = ev.get("args", {}).get("correlation")
                start = ev["ts"]
                kernels.append((start, start + ev["dur"], names.setdefault(name, name), corr, cat))
            elif cat == "user_annotation" and (step := _parse_step(ev)) is not None:
                scan.engine = scan.engine or step[0]
                steps.append(step[1])
    return scan


def _breakdown_rank(path: str, shown: str, max_bytes: int, header: _Header) -> _RankResult:
    scan = _scan(path, shown, max_bytes, keep_ops=header.gpus == 0)
    steps, kernels = scan.steps, scan.kernels
    engine = header.engine or scan.engine
    result = _RankResult(engine=engine, version=header.version)
    if not steps:
        result.skipped = f"{shown}: no engine step annotations (not an engine rank's trace)"
        return result
    device = "gpu" if kernels else "cpu"
    if engine == "sglang" and not header.version:
        header.version = "0.5.23"
        result.version = ""
        result.notes.append(
            f"{shown}: SGLang traces name no version; read with SGLang 0.5.23's kernel names"
        )
    table = rule_table(engine, header.version, device)
    if table is None:
        raise TraceError(
            f"{shown}: {engine or 'an unknown engine'} {header.version or '(version unnamed)'} "
            f"on {device}: moeops has "
            "no kernel-name table for it (vLLM 0.32-0.34 GPU, vLLM 0.32 CPU, SGLang 0.5.23 GPU)"
        )
    result.rules = table.name
    steps.sort(key=lambda s: s.start)
    if device == "gpu":
        times, dropped = _gpu_steps(steps, kernels, scan.launches, table)
        if dropped:
            result.notes.append(f"{shown}: {dropped} step(s) launched no kernel and are left out")
    else:
        times = _cpu_steps(steps, scan.ops, table)
    if not times:
        result.skipped = f"{shown}: no engine step ran a kernel or an op"
        return result
    rank = header.rank
    if rank is None:
        found = RANK_IN_NAME.findall(Path(shown).name)
        rank = int(found[-1]) if found else 0
    result.first_start_us = times[0].start_us
    result.breakdown = _rank_breakdown(rank, shown, Path(path).stat().st_size, device, times)
    if len(times) > MAX_STEPS:
        result.notes.append(
            f"rank {rank}: {len(times):,} steps; the first {MAX_STEPS:,} are listed one by one "
            "(all count in the figures)"
        )
    return result


def _parse_step(ev) -> tuple[str, _Step] | None:
    name = ev.get("name", "")
    start, end, tid = ev["ts"], ev["ts"] + ev["dur"], ev.get("tid")
    if m := VLLM_STEP.match(name):
        prefill, decode = int(m[1]), int(m[2])
        kind = "mixed" if prefill and decode else "prefill" if prefill else "decode"
        return "vllm", _Step(start, end, tid, prefill, decode, kind)
    if m := SGLANG_STEP.match(name):
        mode, batch, tokens = m[1], int(m[2]), int(m[3] or 0)
        if mode == "DECODE":
            return "sglang", _Step(start, end, tid, 0, batch, "decode")
        if mode == "EXTEND":
            return "sglang", _Step(start, end, tid, tokens, 0, "prefill")
        if mode == "MIXED":
            # SGLang names no token split for a mixed step
            return "sglang", _Step(start, end, tid, 0, 0, "mixed")
    return None


def _cpu_steps(steps: list[_Step], ops: list, table: RuleTable) -> list[_StepTime]:
    """Each step's op self time by class. A step runs from its annotation's start to the next
    step's (the last: to its annotation's end), so the sampler, which vLLM runs after the
    annotated forward, is in it; idle is the step's time inside no op (host Python)."""
    by_thread = defaultdict(list)
    for op in ops:
        by_thread[op[3]].append(op)
    for thread_ops in by_thread.values():
        thread_ops.sort(key=lambda op: (op[0], -op[1]))
    starts = {tid: [op[0] for op in thread_ops] for tid, thread_ops in by_thread.items()}
    # each step runs until the next step of its thread starts
    next_start, seen = [0.0] * len(steps), {}
    for number in range(len(steps) - 1, -1, -1):
        next_start[number] = seen.get(steps[number].tid, steps[number].end)
        seen[steps[number].tid] = steps[number].start
    times = []
    for step, until in zip(steps, next_start, strict=True):
        thread_ops = by_thread.get(step.tid, [])
        lo = bisect.bisect_left(starts.get(step.tid, []), step.start)
        hi = bisect.bisect_left(starts.get(step.tid, []), until)
        time = _StepTime(step.start, step.kind, until - step.start, step.prefill, step.decode)
        # stack entries: [end, class, carrier name, children's time, duration]
        stack: list[list] = []
        selfs = []
        for ts, dur, name, _ in thread_ops[lo:hi]:
            end = min(ts + dur, until)
            while stack and ts >= stack[-1][0]:
                selfs.append(stack.pop())
            own = table.classify(name)
            if own is not None:
                klass, carrier = own, name
            elif stack and stack[-1][1] != "other":
                klass, carrier = stack[-1][1], stack[-1][2]
            else:
                klass, carrier = "other", name
            if stack:
                end = min(end, stack[-1][0])
                stack[-1][3] += end - ts
            stack.append([end, klass, carrier, 0.0, end - ts])
        selfs += stack
        busy = 0.0
        for _, klass, carrier, children, dur in selfs:
            own_time = max(dur - children, 0.0)
            busy += own_time
            time.classes[klass] = time.classes.get(klass, 0.0) + own_time
            key = (klass, carrier)
            time.names[key] = time.names.get(key, 0.0) + own_time
        time.classes["idle"] = max(time.wall_us - busy, 0.0)
        times.append(time)
    return times


def _gpu_steps(steps: list[_Step], kernels: list, launches: list, table: RuleTable):
    """Each step's GPU time by class. A step's kernels are those whose launch (a runtime call,
    by correlation id) falls inside the step's annotation; the step runs on the GPU from its first
    kernel's start to the next step's (the last step: to its last kernel's end). Overlapping
    kernels share each instant equally; time with no kernel running is idle."""
    step_starts = [s.start for s in steps]
    step_of_corr = {}
    for ts, corr in launches:
        i = bisect.bisect_right(step_starts, ts) - 1
        if i >= 0 and ts <= steps[i].end:
            step_of_corr[corr] = i
    first = [None] * len(steps)
    last = [None] * len(steps)
    for start, end, _, corr, _ in kernels:
        i = step_of_corr.get(corr)
        if i is None:
            continue
        first[i] = start if first[i] is None else min(first[i], start)
        last[i] = end if last[i] is None else max(last[i], end)
    ran = [i for i in range(len(steps)) if first[i] is not None]
    if not ran:
        return [], len(steps)
    bounds = [first[i] for i in ran] + [last[ran[-1]]]
    # the last step's window must hold its own kernels even if an earlier one ends later
    bounds[-1] = max(bounds[-1], bounds[-2])
    times = [
        _StepTime(
            bounds[k], steps[i].kind, bounds[k + 1] - bounds[k], steps[i].prefill, steps[i].decode
        )
        for k, i in enumerate(ran)
    ]
    _sweep(kernels, bounds, times, table)
    for time in times:
        for (klass, _), value in time.names.items():
            time.classes[klass] = time.classes.get(klass, 0.0) + value
        time.classes["idle"] = max(time.wall_us - sum(time.classes.values()), 0.0)
    return times, len(steps) - len(ran)


def _sweep(kernels: list, bounds: list, times: list[_StepTime], table: RuleTable) -> None:
    """Adds each kernel's time to the names of the step window it ran in (window k runs from
    bounds[k] to bounds[k + 1]), splitting each instant equally among the kernels running."""
    points = []
    for index, (start, end, *_) in enumerate(kernels):
        if end <= bounds[0] or start >= bounds[-1] or end <= start:
            continue
        points.append((start, 1, index))
        points.append((end, 0, index))
    points += [(b, 2, -1) for b in bounds]
    points.sort()
    klass_of = {}
    active: dict[int, tuple[str, str]] = {}
    window = -1
    previous = bounds[0]
    for t, what, index in points:
        if active and 0 <= window < len(times) and t > previous:
            share = (t - previous) / len(active)
            time = times[window]
            for key in active.values():
                time.names[key] = time.names.get(key, 0.0) + share
        previous = max(previous, t)
        if what == 2:
            window += 1
        elif what == 1:
            name, cat = kernels[index][2], kernels[index][4]
            klass = klass_of.get((name, cat))
            if klass is None:
                klass = "memory" if cat != "kernel" else table.classify(name) or "other"
                klass_of[(name, cat)] = klass
            active[index] = (klass, name)
        else:
            active.pop(index, None)


def _rank_breakdown(rank, shown, size, device, times: list[_StepTime]) -> RankBreakdown:
    kinds = []
    for kind in STEP_KINDS:
        chosen = [t for t in times if t.kind == kind]
        if not chosen:
            continue
        walls = [t.wall_us for t in chosen]
        mean_wall = sum(walls) / len(walls)
        totals, tops = defaultdict(float), defaultdict(lambda: defaultdict(float))
        for t in chosen:
            for klass, value in t.classes.items():
                totals[klass] += value
            for (klass, name), value in t.names.items():
                tops[klass][name] += value
        n = len(chosen)
        classes = [
            ClassTime(
                name=klass,
                time_us=totals[klass] / n,
                share=totals[klass] / n / mean_wall if mean_wall > 0 else 0.0,
                top=[
                    TopName(name=name[:400], time_us=value / n)
                    for name, value in sorted(tops[klass].items(), key=lambda kv: -kv[1])[
                        :TOP_NAMES
                    ]
                ],
            )
            for klass in CLASSES
        ]
        kinds.append(
            KindBreakdown(
                kind=kind,
                steps=n,
                step_us_median=percentile(walls, 50),
                step_us_p10=percentile(walls, 10),
                step_us_p90=percentile(walls, 90),
                classes=classes,
            )
        )
    origin = times[0].start_us
    points = [
        StepPoint(
            start_ms=(t.start_us - origin) / 1000,
            kind=t.kind,
            wall_us=t.wall_us,
            prefill_tokens=t.prefill,
            decode_tokens=t.decode,
            classes={k: v for k, v in t.classes.items() if v > 0},
        )
        for t in times[:MAX_STEPS]
    ]
    return RankBreakdown(
        rank=rank, file=shown[-400:], size_bytes=size, device=device, kinds=kinds, steps=points
    )


def _combine(results: list[_RankResult]) -> StepBreakdown:
    read = [r for r in results if r.breakdown is not None]
    notes = [r.skipped for r in results if r.skipped]
    if not read:
        raise TraceError(notes[0] if notes else "no trace files")
    notes = [f"skipped {note}" for note in notes]
    by_rank = {}
    for r in read:
        rank = r.breakdown.rank
        if rank in by_rank:
            raise TraceError(
                f"rank {rank} appears in two files, {by_rank[rank].breakdown.file} and "
                f"{r.breakdown.file}: give one profiled window's files"
            )
        by_rank[rank] = r
        notes += r.notes
    engines = {(r.engine, r.version, r.rules) for r in read}
    engine, version, rules = min(engines)
    if len(engines) > 1:
        notes.append(
            "the ranks name different engines or versions: "
            + ", ".join(sorted(f"{e} {v}".strip() for e, v, _ in engines))
        )
    origin = min(r.first_start_us for r in read)
    ranks = []
    for rank in sorted(by_rank):
        r = by_rank[rank]
        shift = (r.first_start_us - origin) / 1000
        breakdown = r.breakdown
        if shift:
            steps = [s.model_copy(update={"start_ms": s.start_ms + shift}) for s in breakdown.steps]
            breakdown = breakdown.model_copy(update={"steps": steps})
        ranks.append(breakdown)
    notes += _rank_spread(ranks)
    return StepBreakdown(
        engine=engine,
        engine_version=version,
        rules=rules,
        ranks=ranks,
        notes=notes[:MAX_NOTES],
    )


def _rank_spread(ranks: list[RankBreakdown]) -> list[str]:
    """Sentences for ranks whose decode steps differ from the others' (evidence, not verdicts)."""
    decode = [(r.rank, k) for r in ranks if (k := r.kind("decode"))]
    if len(decode) < 2:
        return []
    notes = []
    for rank, kind in decode:
        # the others' median, not mean: one slow rank must not make the rest look odd
        others = [k for other, k in decode if other != rank]
        median = percentile([k.step_us_median for k in others], 50)
        if median > 0 and abs(kind.step_us_median - median) / median > RANK_SPREAD:
            notes.append(
                f"rank {rank}'s median decode step is {kind.step_us_median / 1000:.2f} ms, the "
                f"others' {median / 1000:.2f} ms"
            )
        share = kind.share("communication")
        mean = percentile([k.share("communication") for k in others], 50)
        if abs(share - mean) > RANK_SHARE_FLOOR and (
            mean == 0 or abs(share - mean) / mean > RANK_SPREAD
        ):
            if len(decode) == 2 and share < mean:
                continue  # two ranks: the one waiting tells it; its mirror image adds nothing
            others_word, them = ("the other", "it") if len(decode) == 2 else ("the others", "them")
            reading = f"it likely waits on {them}" if share > mean else "they likely wait on it"
            notes.append(
                f"rank {rank} spends {_percent(share)} of a decode step in communication, "
                f"{others_word} {_percent(mean)}: {reading}"
            )
    return notes


def _percent(share: float) -> str:
    return f"{share * 100:.0f} %" if share >= 0.1 else f"{share * 100:.1f} %"
