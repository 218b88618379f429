"""What every fused-MoE kernel backend is: KernelBackend, the shipped config files it knows,
and the error a backend raises (tuning.backends loads one; tuning.backends.builtin,
tuning.backends.vllm and tuning.backends.sglang implement it)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from tuning.config_files import TRITON_LAUNCH_DEFAULTS, validate_entries
from tuning.search import config_key


class BackendError(RuntimeError):
    """A backend that cannot be loaded or cannot run a launch; the message says why."""


def refuse_unknown_parameters(engine, version, function, parameters, known, required):
    """A BackendError where the engine's function takes a parameter the backend does not know
    (not in known) or lacks one it passes (of required); engine: its title ("vLLM")."""
    unknown = [p for p in parameters if p not in known]
    missing = [p for p in required if p not in parameters]
    if unknown or missing:
        what = f"takes a parameter {unknown[0]!r}" if unknown else f"lacks {missing[0]!r}"
        raise BackendError(
            f"{engine} {version}'s {function} {what}, which moeops' {engine.lower()} backend "
            "does not know"
        )


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
        and run nothing): the torch work between them may be left out. Each engine runs it
        in its _layer, given every argument."""
        return self._layer(
            x, weights, topk_weights, topk_ids, shape, config, down_config, out, launch_only
        )

    def _layer(
        self, x, weights, topk_weights, topk_ids, shape, config, down_config, out, launch_only
    ):
        raise NotImplementedError

    def default_config(self, shape, M: int) -> dict:
        """The config the engine uses at batch size M when it finds no file."""
        raise NotImplementedError

    def kernel_path(self, shape) -> str:
        """Which launch of the kernel a tune of shape times (tuning.engines.KERNEL_PATHS)."""
        return "default"

    def down_config_applies(self, shape) -> bool:
        """Whether GEMM 2 of shape reads a config of its own (a `_down` file)."""
        return self.separate_down_config

    def down_switches(self, shape) -> dict:
        """As search_switches, for GEMM 2's own configs (vLLM's sorted-A `_down` entries)."""
        return {}

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
