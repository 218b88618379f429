"""moeops' builtin kernel (tuning.fused_moe) as a backend, for hosts without an engine and for
the CPU tests."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tuning.backends.base import KernelBackend
from tuning.search import compile_key


class BuiltinBackend(KernelBackend):
    """moeops' own kernel (tuning.fused_moe); its launch is the engines' fused_moe_kernel
    without swap-AB (one grid over the padded pairs)."""

    engine = "builtin"
    version = "moeops"
    separate_down_config = True

    def __init__(self):
        # the layer runs the kernels of both files
        tuning_dir = Path(__file__).parents[1]
        files = ("fused_moe.py", "moe_ops.py")
        kernel = b"".join((tuning_dir / name).read_bytes() for name in files)
        self.source_sha256 = hashlib.sha256(kernel).hexdigest()

    def _layer(
        self, x, weights, topk_weights, topk_ids, shape, config, down_config, out, launch_only
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
