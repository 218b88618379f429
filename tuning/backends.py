"""Which fused-MoE kernel a tune times: the engine's own, or moeops' builtin one.

A config file is for the engine that loads it, so `--engine vllm` and `--engine sglang` time
that engine's own Triton kernel and launcher, read from the installed engine
(tuning.engine_source) and launched the way that engine version launches them
(tuning.backend_vllm, tuning.backend_sglang). The builtin kernel (tuning.fused_moe) stays for
hosts without an engine and for the CPU tests.

Every backend runs one MoE layer the way its engine's fused_experts does, and knows its engine's
default-config rule and shipped config files:

    backend = load_backend("vllm", capability=90)
    backend.layer(x, weights, topk_weights, topk_ids, shape=shape, config=config, out=out)
    backend.default_config(shape, M)
    backend.shipped_configs(shape, "NVIDIA H200")   # ShippedConfigs or None
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tuning.config_files import TRITON_LAUNCH_DEFAULTS, validate_entries
from tuning.search import compile_key, config_key

ENGINES = ("builtin", "vllm", "sglang")


class BackendError(RuntimeError):
    """A backend that cannot be loaded or cannot run a launch; the message says why."""


@dataclass(frozen=True)
class ShippedConfigs:
    """The config file an engine ships for a shape and device: where, and its entries."""

    path: str
    entries: dict[int, dict]

    def entry_for(self, M: int) -> dict:
        """The entry the engine picks at batch size M: the key nearest to M."""
        return self.entries[min(self.entries, key=lambda key: abs(key - M))]


class KernelBackend:
    """One engine's fused-MoE layer. engine: "builtin", "vllm" or "sglang"; version: the
    engine's; source_sha256: a hash of the engine code it runs (None for builtin);
    separate_down_config: whether GEMM 2 reads a config of its own (SGLang's `_down` files)."""

    engine = "builtin"
    version = ""
    source_sha256: str | None = None
    separate_down_config = False

    def layer(
        self,
        x,
        weights,
        topk_weights,
        topk_ids,
        *,
        shape,
        config,
        down_config=None,
        out,
        launch_only=False,
    ):
        """One MoE layer into out [M, H]; weights: a tuning.timing.MoEWeights of shape.

        launch_only: only the Triton launches matter (a compile process, whose launches compile
        and run nothing): the torch work between them may be left out."""
        raise NotImplementedError

    def default_config(self, shape, M: int) -> dict:
        """The config the engine uses at batch size M when it finds no file."""
        raise NotImplementedError

    def search_switches(self, shape) -> dict:
        """{name: values, the engine's default first} of the launch switches a config entry may
        set for shape, which the search tries beside the grid (vLLM 0.34's USE_TMA); {}: none."""
        return {}

    def compile_key(self, config: dict, M: int | None) -> tuple:
        """What one compile of config for batch size M stands for. The engines' kernels take
        every field of a config, GROUP_SIZE_M too, as a compile-time constant, and specialise on
        the batch size (their sizes are not exempt from Triton's specialisation)."""
        return config_key(config), M

    def shipped_configs(self, shape, device_name: str, *, down=False) -> ShippedConfigs | None:
        """The engine's own config file for this shape and GPU (down: its file for GEMM 2,
        SGLang's `_down` file), or None."""
        return None

    def describe(self) -> dict:
        """JSON-ready: which kernel this is (kept with a tuned file's record)."""
        return {
            "engine": self.engine,
            "version": self.version,
            "source_sha256": self.source_sha256,
        }


class BuiltinBackend(KernelBackend):
    """moeops' own kernel (tuning.fused_moe); its launch mirrors the engines' fused_moe_kernel
    as it was before vLLM 0.32 added swap-AB (one grid over the padded pairs)."""

    engine = "builtin"
    version = "moeops"
    separate_down_config = True

    def __init__(self):
        import hashlib
        from pathlib import Path

        kernel = Path(__file__).with_name("fused_moe.py").read_bytes()
        self.source_sha256 = hashlib.sha256(kernel).hexdigest()

    def layer(
        self,
        x,
        weights,
        topk_weights,
        topk_ids,
        *,
        shape,
        config,
        down_config=None,
        out,
        launch_only=False,
    ):
        from tuning.fused_moe import fused_moe

        return fused_moe(
            x,
            weights.w1,
            weights.w2,
            topk_weights,
            topk_ids,
            config=config,
            down_config=down_config,
            out=out,
            **weights.layer_kwargs(shape),
        )

    def default_config(self, shape, M: int) -> dict:
        from tuning.fused_moe import default_config

        block = list(shape.block_shape) if shape.block_shape else None
        return default_config(M, shape.E, shape.N, shape.H, shape.top_k, shape.dtype, block)

    def compile_key(self, config: dict, M: int | None) -> tuple:
        """GROUP_SIZE_M is a run-time argument of moeops' kernel, and its sizes are exempt from
        specialisation: one compile serves every group size and batch size."""
        return compile_key(config), None


def read_shipped(path) -> ShippedConfigs | None:
    """A shipped config file's entries (None when there is no such file)."""
    try:
        with open(path) as file:
            data = json.load(file)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise BackendError(f"the engine's own config file {path} cannot be read: {exc}") from None
    data.pop("triton_version", None)
    entries = {
        key: {**TRITON_LAUNCH_DEFAULTS, **entry} if isinstance(entry, dict) else entry
        for key, entry in data.items()
    }
    return ShippedConfigs(str(path), validate_entries(entries))


def load_backend(
    engine: str, *, source_dir=None, python=None, capability: int | None = None
) -> KernelBackend:
    """The backend of engine ("builtin", "vllm", "sglang").

    source_dir: the engine's package folder (default: where the engine's Python finds it, see
    tuning.engine_source.locate_package); capability: the GPU's compute capability as an
    integer (90 for sm_90), which decides some engines' launches (default: the current GPU's).
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
            from tuning.backend_vllm import VllmBackend

            return VllmBackend(package, capability=capability)
        from tuning.backend_sglang import SglangBackend

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
