"""Compile the MoE layer's Triton kernels for a GPU without touching one: no CUDA context.

The tuner's compile processes (tuning.compile_pool) fill Triton's on-disk cache ahead of timing. A
CUDA context per compile process would cost seconds of set-up and GPU memory, and contexts opened at
once slow each other, the tuning process's own among them (docs/decisions.md, "compile processes").
So they compile against `CompileOnlyDriver`, a Triton driver that names the timing process's GPU
(its architecture and shared-memory limit, `gpu_target()`), and run the layer on CPU tensors of a
few experts with unset values (tuning.timing.unset_weights): every kernel is compiled exactly as a
launch on that GPU would compile it, into the same cache entry (Triton's key is the source, the
target and the options; tensors specialise on dtype and 16-byte alignment, which CPU tensors share
with the GPU's), and then launches nothing. Launching is left to the timing process, which builds
Triton's small launcher modules itself on its first launches. (Meta tensors would need no memory at
all, but their first use imports sympy and their fp8 quantisation runs slowly, so the pool starts
later with them.)

Found at compile time: Triton's compile errors and a kernel needing more shared memory than the
GPU has. Not found: too many registers for the thread count, which only loading the binary on
the GPU tells; the timing process records that candidate as failed when it launches it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuTarget:
    """What compiling for a GPU needs to know of it: compute capability as Triton writes it
    (90 for sm_90) and Triton's device properties (max_shared_mem above all)."""

    capability: int
    properties: dict


def gpu_target() -> GpuTarget:
    """The current CUDA GPU's target, read through Triton's own driver (needs its context)."""
    from triton.runtime import driver

    device = driver.active.get_current_device()
    properties = dict(driver.active.utils.get_device_properties(device))
    return GpuTarget(driver.active.get_current_target().arch, properties)


class _Utils:
    def __init__(self, properties: dict):
        self.properties = properties

    def get_device_properties(self, device) -> dict:
        return self.properties

    def load_binary(self, name, kernel, shared, device):
        # module, function, registers, spills, most threads per block: nothing is loaded
        return 0, 0, 0, 0, 1024


def _launch_nothing(*args, **kwargs) -> None:
    return None


def _make_launcher(src, metadata):
    return _launch_nothing


def compile_only_driver(target: GpuTarget):
    """A Triton driver that compiles for target and launches nothing (set it with
    triton.runtime.driver.set_active)."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase

    class CompileOnlyDriver(DriverBase):
        def __init__(self):
            self.target = GPUTarget("cuda", target.capability, 32)
            self.utils = _Utils(target.properties)
            self.launcher_cls = _make_launcher

        @classmethod
        def is_active(cls) -> bool:
            return False

        def map_python_to_cpp_type(self, ty: str) -> str:
            return ty

        def get_current_target(self):
            return self.target

        def get_active_torch_device(self):
            return torch.device("cpu")

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device=None) -> int:
            return 0

        def get_benchmarker(self):
            raise RuntimeError("a compile-only driver times nothing")

        def get_device_interface(self):
            return torch.cuda

    return CompileOnlyDriver()
