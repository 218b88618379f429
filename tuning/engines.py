"""The kernels a tune can time: moeops' builtin one, or an engine's own, and the engines' names
as messages give them; the kernel paths vLLM 0.34 launches and what in a deployment's launch
decides between them. Cheap to import: the web tier reads it."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from domain.wire.tunes import KERNEL_PATHS

ENGINE_TITLES = {"vllm": "vLLM", "sglang": "SGLang"}
ENGINES = ("builtin", *ENGINE_TITLES)

# vLLM 0.34's environment switches of DeepGEMM with E8M0 scales (vllm/envs.py: each
# `bool(int(os.getenv(name, "1")))`, so on unless the launch sets it to 0).
DEEP_GEMM_ENV = ("VLLM_USE_DEEP_GEMM", "VLLM_USE_DEEP_GEMM_E8M0")
# `vllm serve` flags that shard experts over ranks: an expert map, which keeps GEMM 2 off the
# sorted-A path
EXPERT_PARALLEL_FLAGS = ("--enable-expert-parallel", "-ep")


@dataclass(frozen=True)
class VllmLaunch:
    """What a vLLM launch (a recipe's environment and argv) sets that decides its MoE kernel
    path: DeepGEMM with E8M0 scales switched on, expert parallelism, and why, in a sentence."""

    deep_gemm_e8m0: bool
    expert_parallel: bool
    why: str


def vllm_launch(env: Mapping[str, str] | None, argv: Sequence[str] | None) -> VllmLaunch:
    """VllmLaunch of a launch recipe's env (variable → value) and argv; None for either: the
    launch sets nothing there (vLLM's defaults). DeepGEMM itself must also be installed beside
    the engine (vLLM 0.34's wheel carries it), which the worker checks on its host."""
    env = dict(env or {})
    argv = list(argv or ())
    expert_parallel = any(
        part in EXPERT_PARALLEL_FLAGS or part.startswith("--enable-expert-parallel=")
        for part in argv
    )
    off = []
    for name in DEEP_GEMM_ENV:
        value = str(env.get(name, "1")).strip()
        try:
            on = int(value) != 0
        except ValueError:
            on = False
            off.append(f"{name}={value!r} is not an integer (vLLM would not start)")
            continue
        if not on:
            off.append(f"{name}={value}")
    if off:
        why = f"the launch turns DeepGEMM's E8M0 scales off ({', '.join(off)})"
    else:
        named = [f"{n}={env[n]}" for n in DEEP_GEMM_ENV if n in env]
        why = (
            f"the launch sets {', '.join(named)}"
            if named
            else f"the launch leaves {' and '.join(DEEP_GEMM_ENV)} at vLLM's default, on"
        )
        why = "DeepGEMM with E8M0 scales is on: " + why
    if expert_parallel:
        why += "; it runs expert parallelism (an expert map)"
    return VllmLaunch(deep_gemm_e8m0=not off, expert_parallel=expert_parallel, why=why)


# The first vLLM release whose launcher reads USE_TMA and has the sorted-A path (0.34.0)
VLLM_TMA_SINCE = (0, 34)


def release(version: str) -> tuple[int, ...]:
    """(major, minor) of a version string: "0.34.0" → (0, 34)."""
    parts = []
    for part in version.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def path_in_engine(
    path: str, *, engine: str, version: str, tma_shape: bool, sorted_a: bool | None = None
) -> str:
    """A sentence: whether `engine` `version` runs a config tuned for kernel path `path`
    (KERNEL_PATHS; "" not recorded) as it was tuned. tma_shape: the config's shape is fp8 with a
    block shape (vLLM 0.34 reads its B through TMA on SM90/SM100); sorted_a: whether the
    deployment's launch takes the sorted-A path (None: not known)."""
    if not path:
        return "Which kernel path this file was tuned for is not recorded."
    if engine != "vllm":
        title = ENGINE_TITLES.get(engine, engine)
        if path == "default":
            return f"{title} reads this file; it was tuned on vLLM's default path."
        return f"{title} runs its own launch, not vLLM's {dict(KERNEL_PATHS)[path].split(':')[0]}."
    if not version:
        return "The engine's version is not recorded: whether it runs this path is not known."
    new = release(version) >= VLLM_TMA_SINCE
    label = f"vLLM {version}"
    if path == "default":
        if new and tma_shape:
            return (
                f"{label} reads this file but reads B through TMA, which these entries were "
                f"not timed with: re-tune on {version}."
            )
        return f"{label} runs this file as it was tuned: one config for both GEMMs."
    if not new:
        return (
            f"{label} has neither the TMA read of B nor the sorted-A path: these entries are "
            f"for a launch it does not have, and it fails on their USE_TMA; re-tune on {version}."
        )
    if path == "tma":
        return f"{label} runs this file as it was tuned, USE_TMA entry by entry."
    if sorted_a is False:
        return (
            f"{label} with this launch does not take its sorted-A path: it runs GEMM 2 with the "
            "up file's entries and never reads the _down file; re-tune for this launch."
        )
    if sorted_a is None:
        return (
            f"{label} reads the up file and, where its launch runs DeepGEMM with E8M0 scales, "
            "the _down file for GEMM 2, as tuned."
        )
    return f"{label} reads both files as tuned: the up file, and the _down file for GEMM 2."
