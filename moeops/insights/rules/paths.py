"""Diagnosis rules of a run's engine paths (domain.engine_paths: what the engine reported, its
start-up log and its own source's decisions for the GPU's compute capability), applied after
the analysis' RULES:

- a fast path this engine version enables on other GPUs but not on this one, the capabilities
  named from evaluating the engine's own function over each (never from moeops' words);
- a path that fell back at start-up, quoting the engine's log line with its time;
- the MoE on the engine's default kernel config.
"""

from domain.engine_paths import EnginePaths, PathRow, capability_words
from moeops.insights.rules.evidence import _key
from moeops.insights.rules.run_data import Proposal

ENGINE_TITLES = {"vllm": "vLLM", "sglang": "SGLang"}
# What a path left off costs, said after "so" (the finding's sentence).
APART = {
    "allreduce_rms_fusion": "each layer runs its all-reduce and its norm apart",
    "deep_gemm": "its fp8 block-quantised GEMMs run on other kernels",
}


def _paths(data) -> EnginePaths | None:
    return EnginePaths.read(data.engine_paths)


def _title(paths: EnginePaths) -> str:
    engine = ENGINE_TITLES.get(paths.engine, paths.engine or "the engine")
    return f"{engine} {paths.version}" if paths.version else engine


def _source_where(row: PathRow) -> str:
    return next((e.where for e in row.evidence if e.source == "source"), "")


def path_not_enabled_here(data) -> list:
    """A path the engine's own function enables on some compute capabilities but not on this
    GPU's, at a TP where it would apply: "vLLM 0.32.0 enables the all-reduce + RMSNorm fusion
    only on compute capability 9.0 and 10.x; this GPU is 12.0, so each layer runs its
    all-reduce and its norm apart"."""
    paths = _paths(data)
    if paths is None or not paths.capability:
        return []
    proposals = []
    for row in paths.rows:
        if row.state != "off" or not row.enabled_on or paths.capability in row.enabled_on:
            continue
        if row.key == "allreduce_rms_fusion" and (paths.tp or 1) < 2:
            continue
        where = _source_where(row)
        so = APART.get(row.key, f"it runs without {row.title}")
        text = (
            f"{_title(paths)} enables {row.title} only on compute capability "
            f"{capability_words(row.enabled_on)}; this GPU is {paths.capability}, so {so}. "
            f"Decided by the engine's own {where or 'function'}, evaluated for each capability."
        )
        proposals.append(
            Proposal(
                kind="other",
                key=_key("path-not-here", row.key, paths.capability),
                severity="warning",
                title=f"{_title(paths)} runs no {row.title} on compute capability "
                f"{paths.capability}",
                text=text,
                evidence={
                    "path": row.key,
                    "capability": paths.capability,
                    "enabled_on": row.enabled_on,
                    "source": where,
                    "chart": None,
                },
            )
        )
    return proposals


def path_fell_back(data) -> list:
    """A path the engine's start-up log says fell back (the MoE's default config aside: its
    own rule), quoting the line with its time."""
    paths = _paths(data)
    if paths is None:
        return []
    proposals = []
    for row in paths.rows:
        if row.state != "fell_back" or row.key == "moe_config":
            continue
        line = next((e for e in row.evidence if e.source == "log"), None)
        if line is None:
            continue
        proposals.append(
            Proposal(
                kind="other",
                key=_key("path-fell-back", row.key),
                severity="warning",
                title=f"{row.title} fell back at start-up",
                text=f"{row.reason[:1].upper()}{row.reason[1:]}. The engine's log at "
                f"{line.at}: “{line.text}”",
                evidence={"path": row.key, "line": line.text, "at": line.at, "chart": None},
            )
        )
    return proposals


def moe_default_config(data) -> list:
    """The MoE runs the engine's default tile config: its log says so, or no tuned file was
    where the engine looks."""
    paths = _paths(data)
    row = paths.row("moe_config") if paths else None
    if row is None or row.state != "fell_back":
        return []
    line = next((e for e in row.evidence if e.source == "log"), None)
    said = f" The engine's log at {line.at}: “{line.text}”" if line else ""
    return [
        Proposal(
            kind="other",
            key=_key("path-moe-default-config"),
            severity="info",
            title="The MoE runs on the engine's default kernel config",
            text=f"{row.reason[:1].upper()}{row.reason[1:]}.{said} A tune of the fused-MoE "
            "kernel for this shape and GPU writes the file the engine looks for.",
            evidence={"path": row.key, "line": line.text if line else None, "chart": None},
        )
    ]


RULES = (path_not_enabled_here, path_fell_back, moe_default_config)
