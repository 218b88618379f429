"""An engine's fast paths on one GPU, as both tiers read them: each path that decides speed
(the all-reduce and its fusion with the norm, the MoE backend and its kernel config, attention,
CUDA graphs, torch.compile, chunked prefill, quantisation) with its state and the evidence for
it from three sources:

- report: what the engine reports of its resolved configuration (vLLM's `/server_info`, as
  `domain.engine.vllm_args` flattens it to dotted keys);
- log: what its start-up log says (`log_rows`, vLLM's lines quoted with their time);
- source: the decision of the engine's own function for the GPU's compute capability, evaluated
  on the GPU host or the CLI (`tuning.engine_paths`), never a copy of its rules.

`merge_paths` makes one row per path of the three; `path_changes` names what differs between two
runs ("all-reduce + RMSNorm fusion on → off"). Pure: no engine, no Django.
"""

import re
from typing import Literal

from pydantic import BaseModel, Field

from domain.step_breakdown import StepBreakdown, top_names, unfused_all_reduce

SOURCES = ("report", "log", "source")
STATES = ("on", "off", "fell_back", "depends", "unknown")
STATE_WORDS = {
    "on": "on",
    "off": "off",
    "fell_back": "fell back",
    "depends": "depends",
    "unknown": "unknown",
}
# Each path that decides speed, in the order the run page lists them.
PATH_TITLES = {
    "allreduce": "all-reduce",
    "custom_allreduce": "custom all-reduce",
    "allreduce_rms_fusion": "all-reduce + RMSNorm fusion",
    "moe_backend": "MoE backend",
    "moe_kernel": "MoE experts kernel",
    "moe_config": "MoE kernel config",
    "deep_gemm": "DeepGEMM",
    "attention_backend": "attention backend",
    "cuda_graphs": "CUDA graphs",
    "compile": "torch.compile",
    "chunked_prefill": "chunked prefill",
    "quantization": "weight quantisation",
    "kv_cache_dtype": "KV-cache dtype",
}
# The compute capabilities a source decision is evaluated over to say where the engine enables
# a path: Volta to Blackwell (consumer 12.x included).
CAPABILITIES = ("7.0", "7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "10.3", "11.0", "12.0", "12.1")
# A log row that says the engine fell back outranks what the configuration asked for, which
# outranks what the source would decide, which outranks nothing known.
_RANK = {"fell_back": 4, "on": 3, "off": 3, "depends": 2, "unknown": 1}
_SOURCE_RANK = {"log": 3, "report": 2, "source": 1}


class Evidence(BaseModel):
    """One source's word on a path. source: report | log | source | profile; text: the reported
    key and value, the log line as the engine wrote it, the function's answer, or the kernels a
    profiled window ran; at: the log line's time ("12-06 04:53:44", as vLLM stamps it); where:
    the key, "engine.log line 49", "vllm/config/vllm.py enable_allreduce_rms_fusion, vLLM
    0.32.0" or "profile at concurrency 64"; verdict: whether a profile's kernels confirm or
    contradict the row's state (None: they say neither)."""

    source: Literal["report", "log", "source", "profile"]
    text: str
    at: str | None = None
    where: str = ""
    verdict: Literal["confirms", "contradicts"] | None = None


class PathRow(BaseModel):
    """A path's state with its reason in a sentence. value: what runs ("CPU", "FLASH_ATTN",
    "[1, 2, 4]"); enabled_on: the compute capabilities the engine's function enables it on
    (source rows only); link: "tune" where the MoE runs on a default config."""

    key: str
    state: Literal["on", "off", "fell_back", "depends", "unknown"]
    reason: str
    value: str | None = None
    evidence: list[Evidence] = Field(default_factory=list)
    enabled_on: list[str] | None = None
    link: str | None = None

    @property
    def title(self) -> str:
        return PATH_TITLES.get(self.key, self.key)

    @property
    def state_words(self) -> str:
        return STATE_WORDS[self.state]


class EnginePaths(BaseModel):
    """A run's engine paths: engine, version, the GPU's compute capability ("12.0"; None on a
    host without a CUDA GPU), TP, the rows, and notes on what could not be read."""

    engine: str = ""
    version: str | None = None
    capability: str | None = None
    tp: int | None = None
    rows: list[PathRow] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    @classmethod
    def read(cls, data) -> "EnginePaths | None":
        """The snapshot's engine_paths, or None when it holds none or an unreadable one."""
        if not isinstance(data, dict):
            return None
        try:
            return cls.model_validate(data)
        except ValueError:
            return None

    def row(self, key: str) -> PathRow | None:
        return next((row for row in self.rows if row.key == key), None)


def capability_words(capabilities: list[str]) -> str:
    """ "9.0 and 10.x" of ["9.0", "10.0", "10.3"]: a family of CAPABILITIES whose every member
    is listed is named as the family."""
    families: dict[str, list[str]] = {}
    for cap in CAPABILITIES:
        families.setdefault(cap.split(".")[0], []).append(cap)
    words = []
    for major in dict.fromkeys(cap.split(".")[0] for cap in capabilities):
        listed = [cap for cap in capabilities if cap.split(".")[0] == major]
        whole = len(families.get(major, [])) > 1 and listed == families[major]
        words.extend([f"{major}.x"] if whole else listed)
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]


def unknown(key: str, reason: str, source: str) -> PathRow:
    """A row that says why nothing is known of the path, from one source."""
    return PathRow(
        key=key, state="unknown", reason=reason, evidence=[Evidence(source=source, text=reason)]
    )


# ---------------------------------------------------------------------------- start-up log

# `(EngineCore pid=5541) INFO 12-06 04:52:23 [unquantized.py:364] Using CPU …`
_LOG_LINE = re.compile(
    r"^(?:\((?P<proc>[^)]*)\)\s+)?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+"
    r"(?P<at>\d\d-\d\d \d\d:\d\d:\d\d)\s+\[(?P<src>[^\]]+)\]\s+(?P<msg>.*)$"
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CONFIG_LINE = re.compile(r"Initializing a V1 LLM engine \(v(?P<version>[^)]+)\) with config: ")

# vLLM's start-up messages that decide a path: (key, pattern, state, reason; {name} from the
# pattern's groups). The first line of a key sets its state; a fell-back line outranks others.
_LOG_RULES = (
    (
        "moe_backend",
        r"Using (?P<v>.+?) Unquantized MoE backend out of potential backends: (?P<c>\[.*?\])",
        "on",
        "the engine chose the {v} MoE backend of {c}",
    ),
    (
        "moe_backend",
        r"Using (?P<v>\S+) (?:Fp8 )?MoE backend out of potential backends: (?P<c>\[.*?\])",
        "on",
        "the engine chose the {v} MoE backend of {c}",
    ),
    ("moe_kernel", r"Using (?P<v>\w+Experts\w*) MoE backend", "on", "the MoE runs {v}"),
    (
        "moe_config",
        r"Using default MoE config\. Performance might be sub-optimal!",
        "fell_back",
        "no tuned fused-MoE config for this shape and GPU: the engine runs its default tiles",
    ),
    (
        "allreduce_rms_fusion",
        r"AllReduce fusion pass is disabled for tp_size <= 1",
        "off",
        "one GPU: no all-reduce to fuse",
    ),
    (
        "allreduce_rms_fusion",
        r"Flashinfer is not installed or comm module not found, skipping allreduce fusion pass",
        "fell_back",
        "the fusion pass found no FlashInfer: each layer runs its all-reduce and its norm apart",
    ),
    (
        "allreduce_rms_fusion",
        r"Flashinfer allreduce fusion is not supported for world size (?P<v>\d+)",
        "fell_back",
        "FlashInfer's fused all-reduce does not support {v} GPUs: the pass turned itself off",
    ),
    (
        "allreduce_rms_fusion",
        r"Failed to initialize Flashinfer allreduce workspace\. Flashinfer allreduce-norm "
        r"fusion will be disabled",
        "fell_back",
        "the fusion pass could not set up FlashInfer's workspace and turned itself off",
    ),
    (
        "custom_allreduce",
        r"Custom allreduce is disabled (?P<v>(?:because|due to) .*?)(?:\. To silence|$)",
        "fell_back",
        "custom all-reduce is disabled {v}: NCCL runs the all-reduce",
    ),
    (
        "allreduce",
        r"CPU SHM communicator disabled for group (?P<v>\S+):\s",
        "fell_back",
        "the CPU build's shared-memory all-reduce is off for group {v}: torch.distributed runs it",
    ),
    (
        "allreduce",
        r"symmetric memory is not available",
        "fell_back",
        "symmetric-memory all-reduce is not available on this GPU",
    ),
    (
        "allreduce",
        r"(?P<v>.*symmetric-memory .*?); falling back to NCCL",
        "fell_back",
        "{v}: NCCL runs it",
    ),
    (
        "attention_backend",
        r"Using (?P<v>\S+) attention backend out of potential backends: (?P<c>\[.*?\])",
        "on",
        "the engine chose {v} of {c}",
    ),
    (
        "cuda_graphs",
        r"Graph capturing finished in (?P<s>\d+) secs, took (?P<v>[\d.]+) GiB",
        "on",
        "CUDA graphs captured in {s} s ({v} GiB)",
    ),
    (
        "compile",
        r"Inductor compilation was disabled by user settings",
        "off",
        "Inductor compilation is off (the launch's optimisation level)",
    ),
)
_COMPILED_RULES = tuple((k, re.compile(p), s, r) for k, p, s, r in _LOG_RULES)

# What the start-up config line says, by path: (key, pattern of its value, state of a value).
_CONFIG_KEYS = (
    ("allreduce_rms_fusion", r"'fuse_allreduce_rms': (\w+)", "pass_config.fuse_allreduce_rms"),
    ("custom_allreduce", r"\bdisable_custom_all_reduce=(\w+)", "disable_custom_all_reduce"),
    ("compile", r"'mode': <CompilationMode\.(\w+)", "compilation_config.mode"),
    (
        "cuda_graphs",
        r"'cudagraph_mode': <CUDAGraphMode\.(\w+)",
        "compilation_config.cudagraph_mode",
    ),
    ("chunked_prefill", r"\benable_chunked_prefill=(\w+)", "enable_chunked_prefill"),
    ("kv_cache_dtype", r"\bkv_cache_dtype=([\w.]+)", "kv_cache_dtype"),
    ("quantization", r"\bquantization=([\w.-]+)", "quantization"),
)
_CAPTURE_SIZES = re.compile(r"'cudagraph_capture_sizes': (\[[^\]]*\])")


def _config_state(key: str, value: str, capture_sizes: str | None) -> tuple[str, str, str]:
    """(state, value shown, reason) of one value of the start-up config line."""
    if key == "allreduce_rms_fusion":
        on = value == "True"
        return ("on" if on else "off", value, f"the resolved pass_config says {value}")
    if key == "custom_allreduce":
        if value == "True":
            return ("off", "disabled", "the configuration disables custom all-reduce")
        return ("depends", "allowed", "allowed by the configuration; the engine checks the GPUs")
    if key == "compile":
        return ("off" if value == "NONE" else "on", value, f"compilation mode {value}")
    if key == "cuda_graphs":
        if value == "NONE":
            return ("off", value, "cudagraph_mode NONE: every step runs eagerly")
        sizes = f", capture sizes {capture_sizes}" if capture_sizes else ""
        return ("on", value, f"cudagraph_mode {value}{sizes}")
    if key == "chunked_prefill":
        return ("on" if value == "True" else "off", value, f"enable_chunked_prefill={value}")
    if key == "kv_cache_dtype":
        quantized = value not in ("auto", "bfloat16", "float16", "float32")
        state = "on" if quantized else "off"
        return (state, value, f"kv_cache_dtype={value}" + ("" if quantized else " (not quantised)"))
    quantized = value not in ("None", "none")
    return ("on" if quantized else "off", value, f"quantization={value}")


def log_rows(text: str | None, *, missing: str = "", where: str = "engine.log") -> list[PathRow]:
    """Rows of what an engine's start-up log says (vLLM's lines), each quoting its line and time.

    text: the log's text, or None with missing saying why there is none (no managed engine, the
    file gone). A log without the engine's start-up config line (cut, rotated, another engine)
    gives "unknown" rows for what that line reports, with the reason.
    """
    if text is None:
        reason = missing or "no start-up log of the engine is kept"
        return [unknown(key, reason, "log") for key, _, _ in _CONFIG_KEYS]
    rows: dict[str, PathRow] = {}
    said: list[PathRow] = []
    config_line = None
    # numbered as the file's lines: a progress bar's carriage returns end no line
    for number, raw in enumerate(text.split("\n"), start=1):
        line = _ANSI.sub("", raw).rstrip()
        parsed = _LOG_LINE.match(line)
        if parsed is None:
            continue
        message, at = parsed["msg"], parsed["at"]
        evidence = Evidence(source="log", text=line, at=at, where=f"{where} line {number}")
        if config_line is None and _CONFIG_LINE.search(message):
            config_line = (message, evidence)
            continue
        for key, pattern, state, reason in _COMPILED_RULES:
            found = pattern.search(message)
            if found is None:
                continue
            groups = {k: v for k, v in found.groupdict().items() if v is not None}
            row = PathRow(
                key=key,
                state=state,
                value=groups.get("v"),
                reason=reason.format(**groups),
                evidence=[evidence],
                # the MoE on a default config: its cure is the kernel tune
                link="tune" if key == "moe_config" else None,
            )
            said.append(row)
            break
    if config_line is None:
        reason = (
            f"{where} holds no 'Initializing a V1 LLM engine … with config' line "
            "(the log was cut or rotated, or the engine no longer writes it)"
        )
        for key, _, _ in _CONFIG_KEYS:
            _add(rows, unknown(key, reason, "log"))
        for row in said:
            _add(rows, row)
        return _ordered(rows)
    message, evidence = config_line
    sizes = _CAPTURE_SIZES.search(message)
    for key, pattern, name in _CONFIG_KEYS:
        found = re.search(pattern, message)
        if found is None:
            _add(rows, unknown(key, f"the start-up config line no longer reports {name}", "log"))
            continue
        state, value, reason = _config_state(key, found[1], sizes[1] if sizes else None)
        _add(rows, PathRow(key=key, state=state, value=value, reason=reason, evidence=[evidence]))
    allreduce = _allreduce_of_config(message, evidence)
    if allreduce is not None:
        _add(rows, allreduce)
    # the config line decides a path it states; the lines after it add their evidence, and
    # a fall-back among them outranks it
    for row in said:
        _add(rows, row)
    return _ordered(rows)


def _allreduce_of_config(message: str, evidence: Evidence) -> PathRow | None:
    """The all-reduce the config line implies: none on one rank; the CPU build's shared-memory
    all-reduce over several, unless a later line says it fell back to torch.distributed."""
    tp = re.search(r"\btensor_parallel_size=(\d+)", message)
    if tp is None:
        return None
    if int(tp[1]) == 1:
        return PathRow(
            key="allreduce",
            state="off",
            value="none",
            reason="tensor_parallel_size=1: no all-reduce",
            evidence=[evidence],
        )
    if re.search(r"\bdevice_config=cpu\b", message):
        return PathRow(
            key="allreduce",
            state="on",
            value="shared memory (CPU build)",
            reason=f"the CPU build all-reduces over {tp[1]} ranks in shared memory; no line says "
            "it fell back to torch.distributed",
            evidence=[evidence],
        )
    return None


def _add(rows: dict[str, PathRow], row: PathRow) -> None:
    """One row per key: the first decides unless a later one ranks higher; evidence adds up."""
    held = rows.get(row.key)
    if held is None:
        rows[row.key] = row
        return
    if _RANK[row.state] > _RANK[held.state]:
        row.evidence = [*row.evidence, *held.evidence]
        rows[row.key] = row
    else:
        held.evidence.extend(row.evidence)


def _ordered(rows: dict[str, PathRow]) -> list[PathRow]:
    order = list(PATH_TITLES)
    return sorted(rows.values(), key=lambda r: order.index(r.key) if r.key in order else 99)


# ---------------------------------------------------------------------------- the report

# vLLM /server_info keys (as domain.engine.vllm_args flattens them) that state a path.
VLLM_REPORT_KEYS = {
    "allreduce_rms_fusion": "compilation_config.pass_config.fuse_allreduce_rms",
    "custom_allreduce": "parallel_config.disable_custom_all_reduce",
    "compile": "compilation_config.mode",
    "cuda_graphs": "compilation_config.cudagraph_mode",
    "chunked_prefill": "scheduler_config.enable_chunked_prefill",
    "kv_cache_dtype": "cache_config.cache_dtype",
    "quantization": "model_config.quantization",
    "moe_backend": "kernel_config.moe_backend",
}


def report_rows(args: dict | None, *, version: str | None, missing: str = "") -> list[PathRow]:
    """Rows of what vLLM reports in /server_info (args: its dotted keys). A key the engine no
    longer reports gives an "unknown" row naming it; args None: every row unknown with missing."""
    if not args:
        reason = missing or "the engine reported no configuration"
        return [unknown(key, reason, "report") for key in VLLM_REPORT_KEYS]
    rows = []
    title = f"vLLM {version}" if version else "the engine"
    for key, name in VLLM_REPORT_KEYS.items():
        if name not in args:
            rows.append(unknown(key, f"{title}'s /server_info no longer reports {name}", "report"))
            continue
        value = args[name]
        evidence = [Evidence(source="report", text=f"{name} = {value!r}", where=name)]
        state, shown, reason = _report_state(key, value, args)
        rows.append(PathRow(key=key, state=state, value=shown, reason=reason, evidence=evidence))
    return rows


def _report_state(key: str, value, args: dict) -> tuple[str, str, str]:
    if key in ("cuda_graphs", "compile"):
        # /server_info writes these enums as their values: 0 is NONE in both
        mode = "NONE" if value in (0, "NONE") else str(value)
        sizes = args.get("compilation_config.cudagraph_capture_sizes")
        return _config_state(key, mode, str(sizes) if sizes else None)
    if key == "moe_backend":
        return ("depends", str(value), f"the launch asks for the MoE backend {value!r}")
    return _config_state(key, str(value), None)


# SGLang /get_server_info arguments that state a path (the stand-in serves the same); of a
# tuple, the first reported: SGLang 0.5.23 reports the fusion it resolved as its backend
# (None: off), earlier versions a switch its auto-enable did not set.
SGLANG_REPORT_KEYS = {
    "allreduce_rms_fusion": (
        "flashinfer_allreduce_fusion_backend",
        "enable_flashinfer_allreduce_fusion",
    ),
    "custom_allreduce": "disable_custom_all_reduce",
    "attention_backend": "attention_backend",
    "moe_backend": "moe_runner_backend",
    "cuda_graphs": "disable_cuda_graph",
    "compile": "enable_torch_compile",
    "chunked_prefill": "chunked_prefill_size",
    "kv_cache_dtype": "kv_cache_dtype",
    "quantization": "quantization",
}


def sglang_report_rows(args: dict | None, *, version: str | None) -> list[PathRow]:
    """Rows of what SGLang reports in /get_server_info; a key it no longer reports: unknown."""
    title = f"SGLang {version}" if version else "the engine"
    if not args:
        reason = f"{title} reported no server arguments"
        return [unknown(key, reason, "report") for key in SGLANG_REPORT_KEYS]
    rows = []
    for key, names in SGLANG_REPORT_KEYS.items():
        names = (names,) if isinstance(names, str) else names
        name = next((n for n in names if n in args), None)
        if name is None:
            reason = f"{title}'s /get_server_info no longer reports {' or '.join(names)}"
            rows.append(unknown(key, reason, "report"))
            continue
        value = args[name]
        evidence = [Evidence(source="report", text=f"{name} = {value!r}", where=name)]
        if key == "allreduce_rms_fusion" and name == "flashinfer_allreduce_fusion_backend":
            state, shown = ("on", f"flashinfer ({value})") if value else ("off", "off")
        elif key == "cuda_graphs":
            state, shown = ("off", "disabled") if value else ("on", "enabled")
        elif key == "custom_allreduce":
            state, shown = ("off", "disabled") if value else ("depends", "allowed")
        elif key == "chunked_prefill":
            on = isinstance(value, int) and value > 0
            state, shown = ("on" if on else "off"), str(value)
        elif key in ("attention_backend", "moe_backend"):
            state, shown = ("depends" if value in (None, "auto") else "on"), str(value)
        elif key in ("kv_cache_dtype", "quantization"):
            plain = value in (None, "auto", "bfloat16", "float16")
            state, shown = ("off" if plain else "on"), str(value)
        else:
            state, shown = ("on" if value else "off"), str(value)
        reason = f"{title} reports {name}={value!r}"
        rows.append(PathRow(key=key, state=state, value=shown, reason=reason, evidence=evidence))
    return rows


# ---------------------------------------------------------------------------- one row a path


def merge_paths(*sources: list[PathRow]) -> list[PathRow]:
    """One row per path of the sources' rows (report, log, source): the state of the strongest
    word (a fall-back in the log, then what the engine resolved, then the source's decision,
    then unknown; on a tie the log before the report before the source), every evidence kept.
    Where the source's decision agrees with the stronger word, its reason (why the engine
    decided so on this GPU) follows that word's."""
    rows: dict[str, PathRow] = {}
    for row in (row for rows_of in sources for row in rows_of):
        held = rows.get(row.key)
        if held is None:
            rows[row.key] = row.model_copy(deep=True)
            continue
        winner, other = (row, held) if _outranks(row, held) else (held, row)
        merged = winner.model_copy(deep=True)
        merged.evidence = [*winner.evidence, *other.evidence]
        merged.enabled_on = winner.enabled_on or other.enabled_on
        merged.link = winner.link or other.link
        merged.value = winner.value if winner.value is not None else other.value
        if _said_by(other, "source") and other.state == winner.state and other.reason:
            merged.reason = f"{winner.reason}: {other.reason}"
        rows[row.key] = merged
    return _ordered(rows)


def _said_by(row: PathRow, source: str) -> bool:
    return bool(row.evidence) and all(e.source == source for e in row.evidence)


def _outranks(row: PathRow, held: PathRow) -> bool:
    if _RANK[row.state] != _RANK[held.state]:
        return _RANK[row.state] > _RANK[held.state]
    first = row.evidence[0].source if row.evidence else "source"
    then = held.evidence[0].source if held.evidence else "source"
    return _SOURCE_RANK[first] > _SOURCE_RANK[then]


def path_differences(a: EnginePaths | None, b: EnginePaths | None) -> list[tuple[str, str, str]]:
    """(path title, a's, b's) for each path whose state (or, at the same state, what runs)
    differs between two runs' engine paths. Unknown on either side is no difference."""
    if a is None or b is None:
        return []
    out = []
    for row in b.rows:
        before = a.row(row.key)
        if before is None or "unknown" in (before.state, row.state):
            continue
        if before.state != row.state:
            out.append((row.title, before.state_words, row.state_words))
        elif before.value != row.value and before.value and row.value:
            out.append((row.title, before.value, row.value))
    return out


def path_changes(a: EnginePaths | None, b: EnginePaths | None) -> list[str]:
    """Sentences naming each path that differs between two runs' engine paths:
    "all-reduce + RMSNorm fusion on → off"."""
    return [f"{title} {was} → {now}" for title, was, now in path_differences(a, b)]


def decision_changes(old: list[dict], new: list[dict]) -> list[str]:
    """Lines naming each source decision that differs between two versions' rows (as JSON:
    EnginePaths' rows), for engine-diff: "DeepGEMM: on where DeepGEMM is installed → on where
    DeepGEMM is installed and an nvcc of CUDA 12.9 or newer is found". A decision that only
    one version could evaluate says why the other could not."""
    before = {row.key: row for row in map(PathRow.model_validate, old)}
    after = {row.key: row for row in map(PathRow.model_validate, new)}
    lines = []
    for key in [*before, *(k for k in after if k not in before)]:
        was, now = before.get(key), after.get(key)
        if was is None or now is None:
            title = (was or now).title
            lines.append(f"{title}: {_decision(was)} → {_decision(now)}")
            continue
        if was.state == now.state == "unknown" or _decided(was) == _decided(now):
            continue
        if "unknown" in (was.state, now.state):
            why = (now if now.state == "unknown" else was).reason
            lines.append(f"{now.title}: {_decision(was)} → {_decision(now)} ({why})")
        elif (was.state, was.value) != (now.state, now.value):
            lines.append(f"{now.title}: {_decision(was)} → {_decision(now)}")
        else:
            lines.append(f"{now.title}: {_source_text(was)} → {_source_text(now)}")
    return lines


def _source_text(row: PathRow) -> str:
    """The source's answer: "_get_backend_priorities → [...]" as "[...]"."""
    text = next((e.text for e in row.evidence if e.source == "source"), "")
    return text.split(" → ", 1)[-1]


def _decided(row: PathRow) -> tuple:
    return row.state, row.value, _source_text(row)


def _decision(row: PathRow | None) -> str:
    if row is None:
        return "not evaluated"
    return row.value or row.state_words


# --------------------------------------------------------------------------- a profile's word

# The class of a step whose kernels show each path at work (domain.step_breakdown).
PROFILED_CLASS = {
    "allreduce": "communication",
    "custom_allreduce": "communication",
    "allreduce_rms_fusion": "communication",
    "moe_backend": "moe",
    "moe_kernel": "moe",
    "attention_backend": "attention",
}
# Words of a path's value and the kernel or op names that show that implementation running.
IMPLEMENTATION_NAMES = (
    ("shared memory", ("shm_",)),
    ("custom", ("cross_device_reduce",)),
    ("nccl", ("nccl", "onerankreduce")),
    ("cpu", ("cpu_fused_moe", "cpu_attention", "_c::cpu")),
    ("triton", ("fused_moe_kernel",)),
    ("flash_attn", ("flash_fwd", "flash::")),
    ("flashinfer", ("batchdecode", "batchprefill", "flashinfer")),
)


def with_profile(
    paths: EnginePaths, breakdown: StepBreakdown, where: str, kind: str = "decode"
) -> EnginePaths:
    """paths with each row the profiled window bears on given the window's word (Evidence of
    source "profile"): the kernels its class ran in a `kind` step, and whether they confirm or
    contradict the row's state. breakdown: a domain.step_breakdown.StepBreakdown; where: "profile
    at concurrency 64"."""
    rows = []
    for row in paths.rows:
        klass = PROFILED_CLASS.get(row.key)
        share = breakdown.mean_share(kind, klass) if klass else None
        if share is None:
            rows.append(row)
            continue
        names = top_names(breakdown, klass, kind)
        ran = ", ".join(names[:3]) or "no kernel"
        text = f"the window's {klass} in a {kind} step: {ran} ({share:.0%} of the step)"
        verdict = _profile_verdict(row, names, unfused_all_reduce(breakdown, kind))
        evidence = Evidence(source="profile", text=text, where=where, verdict=verdict)
        rows.append(row.model_copy(update={"evidence": [*row.evidence, evidence]}))
    return paths.model_copy(update={"rows": rows})


def _profile_verdict(row: PathRow, names: list[str], unfused) -> str | None:
    lowered = [n.lower() for n in names]
    if row.key == "allreduce_rms_fusion":
        fused = any("fusion" in n or "fused" in n for n in lowered)
        if row.state == "on":
            return "confirms" if fused else ("contradicts" if unfused else None)
        if row.state == "off":
            return "confirms" if unfused else ("contradicts" if fused else None)
        return None
    if row.key == "allreduce" and row.state == "off":
        return "contradicts" if names else "confirms"
    value = (row.value or "").lower()
    for words, kernel_names in IMPLEMENTATION_NAMES:
        if words in value:
            seen = any(k in n for n in lowered for k in kernel_names)
            if row.state in ("on", "fell_back"):
                return "confirms" if seen else ("contradicts" if names else None)
    return None
