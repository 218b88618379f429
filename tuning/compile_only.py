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

The GPU need not be here at all: `target_for(120)` names an sm_120 GPU by its compute capability
and the shared memory its blocks may opt into (`python -m tuning compile-check`).
"""

from __future__ import annotations

from dataclasses import dataclass

# Bytes of shared memory one block may opt into, by compute capability (CUDA C++ Programming
# Guide, technical specifications): what Triton reads as max_shared_mem on such a GPU.
SHARED_MEMORY_PER_BLOCK_OPTIN = {
    70: 96 * 1024,
    72: 96 * 1024,
    75: 64 * 1024,
    80: 163 * 1024,
    86: 99 * 1024,
    87: 163 * 1024,
    89: 99 * 1024,
    90: 227 * 1024,
    100: 227 * 1024,
    103: 227 * 1024,
    120: 99 * 1024,
    121: 99 * 1024,
}


@dataclass(frozen=True)
class GpuTarget:
    """What compiling for a GPU needs to know of it: compute capability as Triton writes it
    (90 for sm_90) and Triton's device properties (max_shared_mem above all)."""

    capability: int
    properties: dict

    @property
    def shared_memory(self) -> int:
        """Bytes of shared memory one block may opt into: what a kernel is checked against
        when it is loaded, and what the search prunes with."""
        return self.properties["max_shared_mem"]

    def limits(self) -> dict:
        """JSON-ready: the limits a search pruned with (kept with a tune's record)."""
        return {"capability": self.capability, "shared_memory_bytes": self.shared_memory}


def target_for(capability: int, shared_memory: int | None = None) -> GpuTarget:
    """A GPU of compute capability `capability` (120 for sm_120) that need not be here: its
    shared memory per block from SHARED_MEMORY_PER_BLOCK_OPTIN unless given (bytes)."""
    if shared_memory is None:
        if capability not in SHARED_MEMORY_PER_BLOCK_OPTIN:
            known = ", ".join(f"{c // 10}.{c % 10}" for c in SHARED_MEMORY_PER_BLOCK_OPTIN)
            raise ValueError(
                f"no shared-memory limit known for compute capability "
                f"{capability // 10}.{capability % 10} ({known}): give it"
            )
        shared_memory = SHARED_MEMORY_PER_BLOCK_OPTIN[capability]
    return GpuTarget(capability, {"max_shared_mem": shared_memory})


def gpu_target() -> GpuTarget:
    """The current CUDA GPU's target: its compute capability and the shared memory a block may
    opt into as torch reads them (get_device_properties: major, minor,
    shared_memory_per_block_optin), cross-checked with Triton's driver, whose properties the
    compile processes hand on (needs the CUDA context)."""
    import torch
    from triton.runtime import driver

    device = driver.active.get_current_device()
    properties = dict(driver.active.utils.get_device_properties(device))
    return device_target(
        torch.cuda.get_device_properties(device),
        driver.active.get_current_target().arch,
        properties,
    )


def device_target(torch_properties, triton_arch: int, triton_properties: dict) -> GpuTarget:
    """The GPU's target from torch's device properties, which must agree with Triton's (its
    arch, its max_shared_mem): Triton checks each kernel it loads against its own figure, so a
    search pruning with another would propose what cannot launch, or leave out what can."""
    capability = torch_properties.major * 10 + torch_properties.minor
    shared_memory = torch_properties.shared_memory_per_block_optin
    said = (triton_arch, triton_properties.get("max_shared_mem"))
    if (capability, shared_memory) != said:
        raise RuntimeError(
            f"torch reads compute capability {capability // 10}.{capability % 10} with "
            f"{shared_memory} bytes of shared memory per block, Triton {said[0] // 10}."
            f"{said[0] % 10} with {said[1]}: not one GPU's limits"
        )
    return GpuTarget(capability, {**triton_properties, "max_shared_mem": shared_memory})


class _Utils:
    def __init__(self, properties: dict):
        self.properties = properties

    def get_device_properties(self, device) -> dict:
        return self.properties

    def load_binary(self, name, kernel, shared, device):
        # module, function, registers, spills, most threads per block: nothing is loaded
        return 0, 0, 0, 0, 1024


def _launcher(launched: dict):
    """Triton's launcher_cls for a compile-only driver: each launch notes the kernel's shared
    memory in launched {kernel name: bytes} and runs nothing."""

    def make_launcher(src, metadata):
        def launch(*args, **kwargs) -> None:
            launched[metadata.name] = max(launched.get(metadata.name, 0), metadata.shared)

        return launch

    return make_launcher


def compile_only_driver(target: GpuTarget):
    """A Triton driver that compiles for target and launches nothing (set it with
    triton.runtime.driver.set_active); `launched` {kernel name: shared memory bytes} of the
    kernels whose launches it was asked for since it was last cleared."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase

    class CompileOnlyDriver(DriverBase):
        def __init__(self):
            self.target = GPUTarget("cuda", target.capability, 32)
            self.utils = _Utils(target.properties)
            self.launched: dict[str, int] = {}
            self.launcher_cls = _launcher(self.launched)

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
