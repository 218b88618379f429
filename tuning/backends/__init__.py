"""Which fused-MoE kernel a tune times: the engine's own, or moeops' builtin one.

A config file is for the engine that loads it, so `--engine vllm` and `--engine sglang` time
that engine's own Triton kernel and launcher, read from the installed engine
(tuning.engine_source) and launched the way that engine version launches them
(tuning.backends.vllm, tuning.backends.sglang). The builtin kernel (tuning.fused_moe) stays for
hosts without an engine and for the CPU tests.

Every backend runs one MoE layer the way its engine's fused_experts does, and knows its engine's
default-config rule and shipped config files:

    backend = load_backend("vllm", capability=90)
    backend.layer(x, weights, topk_weights, topk_ids, shape=shape, config=config, out=out)
    backend.default_config(shape, M)
    backend.shipped_configs(shape, "NVIDIA H200")   # ShippedConfigs or None
"""

from __future__ import annotations

from tuning.backends.base import BackendError, KernelBackend
from tuning.backends.builtin import BuiltinBackend
from tuning.engines import ENGINES


def load_backend(
    engine: str,
    *,
    source_dir=None,
    python=None,
    capability: int | None = None,
    launch: dict | None = None,
) -> KernelBackend:
    """The backend of engine ("builtin", "vllm", "sglang").

    source_dir: the engine's package folder (default: where the engine's Python finds it, see
    tuning.engine_source.locate_package); capability: the GPU's compute capability as an
    integer (90 for sm_90), which decides some engines' launches (default: the current GPU's);
    launch: what the deployment's launch sets that decides vLLM's kernel path
    (tuning.backends.vllm.VllmBackend's launch).
    """
    if engine == "builtin":
        return BuiltinBackend()
    if engine not in ENGINES:
        raise BackendError(f"no kernel backend named {engine!r}: one of {', '.join(ENGINES)}")
    from tuning.engine_source import EngineSourceError, locate_package

    if capability is None:
        capability = current_capability()
    try:
        package = locate_package(engine, source_dir=source_dir, python=python)
        if engine == "vllm":
            from tuning.backends.vllm import VllmBackend

            return VllmBackend(package, capability=capability, launch=launch)
        from tuning.backends.sglang import SglangBackend

        return SglangBackend(package, capability=capability)
    except EngineSourceError as exc:
        raise BackendError(str(exc)) from None


def current_capability() -> int | None:
    """The current CUDA GPU's compute capability as 90 for sm_90, or None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor
