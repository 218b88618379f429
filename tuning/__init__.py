"""Fused-MoE tuning library: MoE shapes, kernel-config files, the Triton kernel and its tuner.

Importing the package stays cheap (the web tier imports tuning.moe_params and
tuning.config_files): torch and Triton load only when `tuning.fused_moe` is first used.
"""

import importlib
import sys
import types


def __getattr__(name: str):
    if name == "fused_moe":
        return importlib.import_module("tuning.fused_moe").fused_moe
    raise AttributeError(f"module 'tuning' has no attribute {name!r}")


class _TuningPackage(types.ModuleType):
    def __setattr__(self, name: str, value) -> None:
        # The import system binds the submodule tuning.fused_moe here once it loads; keep the
        # package attribute the function, so `from tuning import fused_moe` never depends on
        # import order. The module's other names: `from tuning.fused_moe import …`.
        if name == "fused_moe" and isinstance(value, types.ModuleType):
            value = getattr(value, "fused_moe", value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _TuningPackage
