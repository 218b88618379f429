"""vLLM's own fused-MoE kernel, launched as the installed vLLM launches it.

From the installed vLLM (tuning.engine_source) this backend takes, unchanged:
`fused_moe_kernel` and its helper `write_zeros_to_output`, the launcher
`invoke_fused_moe_triton_kernel` (grid, the small-batch EM bound, SPLIT_K, BLOCK_SIZE_K capped
by the quantisation block, swap-AB through `enable_swap_ab`), `_prepare_expert_assignment` and
the `moe_align_block_size` wrapper (the engine's buffer sizes and its naive one-token-per-block
path for tiny batches), the default-config rule `get_default_config` and the config file name
`get_config_file_name`.

What vLLM runs as compiled extensions is done here with the same semantics, graph-safe:
`ops.moe_align_block_size` (moeops' sort-and-pad kernels writing vLLM's buffers, padding slots
holding the pair count), silu-and-mul and the fp8 quantisation of activations (per token group
of block_shape[1] columns, or one dynamic scale per tensor: tuning.moe_ops) and
`ops.moe_sum` (a sum over the top-k rows). The layer runs as vLLM's `fused_experts_impl` runs it
(bf16, fp8 per tensor and fp8 block, silu): quantise, align, GEMM 1, silu-and-mul, quantise,
GEMM 2 with the router weights, sum; one config for both GEMMs.

vLLM 0.34's launcher reads B through a TMA tensor descriptor for fp8 block on SM90 and SM100
unless the entry says `"USE_TMA": false`; the search tries both (`search_switches`). Its
sorted-A path for GEMM 2, the only reader of a `_down` file, runs as TritonExperts.apply runs
it for a deployment whose launch makes vLLM take it (`sorted_a_path`, from the launch's
`tuning.engines.VllmLaunch`): GEMM 1 writes its rows in sorted order (C_is_sorted), the
engine's `_silu_mul_quant_sorted_kernel` quantises them, and GEMM 2 reads them through a TMA
descriptor (A_is_sorted) with the `_down` entry, BLOCK_SIZE_M taken from GEMM 1's entry. A batch
size whose `_down` entry does not say `"USE_TMA": true` runs the default path (sorted_a_entry).

The names those functions use from the rest of vLLM are provided by `stand_ins` below
(platform, environment, logger, ops, small math helpers). A vLLM whose functions use another
name, or whose launcher takes another parameter, fails to load with a sentence naming the
version and the name.
"""

from __future__ import annotations

import inspect
import json
from types import SimpleNamespace

import torch

from tuning.backends.base import (
    BackendError,
    KernelBackend,
    ShippedConfigs,
    read_shipped,
    refuse_unknown_parameters,
)
from tuning.config_files import PACKAGE_CONFIGS
from tuning.engine_source import EnginePackage, load_functions

FUSED_MOE = "model_executor/layers/fused_moe/fused_moe.py"
TRITON_EXPERTS = "model_executor/layers/fused_moe/experts/triton_moe.py"
UTILS = "model_executor/layers/fused_moe/utils.py"
ALIGN = "model_executor/layers/fused_moe/moe_align_block_size.py"
CONFIGS = PACKAGE_CONFIGS["vllm"]
WANTED = {
    FUSED_MOE: [
        "write_zeros_to_output",
        "fused_moe_kernel",
        "invoke_fused_moe_triton_kernel",
        "_prepare_expert_assignment",
        "get_default_config",
        "get_config_file_name",
    ],
    UTILS: ["enable_swap_ab", "resolve_moe_use_td", "warn_if_moe_use_td_ineffective"],
    ALIGN: ["moe_align_block_size"],
}
# The launcher's parameters this backend knows (vLLM 0.32 and 0.33; 0.34 adds SORTED_PARAMETERS,
# which it leaves at their default, False: the default path).
LAUNCHER_PARAMETERS = (
    "A",
    "B",
    "C",
    "A_scale",
    "B_scale",
    "topk_weights",
    "sorted_token_ids",
    "expert_ids",
    "num_tokens_post_padded",
    "mul_routed_weight",
    "top_k",
    "config",
    "compute_type",
    "use_fp8_w8a8",
    "use_int8_w8a8",
    "use_int8_w8a16",
    "use_int4_w4a16",
    "per_channel_quant",
    "block_shape",
    "B_bias",
)
SORTED_PARAMETERS = ("A_is_sorted", "C_is_sorted")
PREAMBLE = """
import functools
from typing import Any

import torch
import triton
import triton.language as tl

from tuning.backends.vllm import stand_ins as _stand_ins

logger = _stand_ins.logger
envs = _stand_ins.envs
current_platform = _stand_ins.current_platform
ops = _stand_ins.ops
next_power_of_2 = _stand_ins.next_power_of_2
round_up = _stand_ins.round_up
should_moe_wna16_use_cuda = _stand_ins.should_moe_wna16_use_cuda
set_triton_allocator = _stand_ins.set_triton_allocator
get_device_name_as_file_name = _stand_ins.get_device_name_as_file_name
_warned_moe_use_td_ineffective = False
"""


class _Logger:
    """vLLM's logger calls, dropped: a tune reports through its own progress."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class _Platform:
    """vLLM's current_platform, for a CUDA GPU of compute capability `capability` (90)."""

    def __init__(self):
        self.capability: int | None = None

    def is_device_capability(self, capability: int) -> bool:
        return self.capability == capability

    def is_device_capability_family(self, capability: int, device_id: int = 0) -> bool:
        return self.capability is not None and self.capability // 10 == capability // 10

    def has_device_capability(self, capability: int) -> bool:
        return self.capability is not None and self.capability >= capability

    def is_cuda(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def fp8_dtype(self):
        return torch.float8_e4m3fn


class _Ops:
    """vLLM's compiled ops the taken functions call, with vLLM's semantics."""

    @staticmethod
    def moe_align_block_size(
        topk_ids,
        num_experts,
        block_size,
        sorted_ids,
        expert_ids,
        num_tokens_post_pad,
        expert_map=None,
        scatter_idx=None,
    ):
        if expert_map is not None or scatter_idx is not None:
            raise BackendError("moeops times one rank's experts: no expert map, no scatter index")
        from tuning.moe_ops import sort_and_pad

        # padding slots hold the pair count, which the kernel masks out
        sorted_ids.fill_(topk_ids.numel())
        sort_and_pad(
            topk_ids, num_experts, block_size, out=(sorted_ids, expert_ids, num_tokens_post_pad)
        )


def _set_triton_allocator(device):
    """vLLM's set_triton_allocator: Triton's scratch memory from torch on device."""
    import triton

    def alloc_fn(size: int, alignment: int, stream: int | None):
        return torch.empty(size, device=device, dtype=torch.int8)

    triton.set_allocator(alloc_fn)


class _CompiledForGpu(torch.Tensor):
    """A compile process's CPU weights, answering `.device` as the timing process's GPU: vLLM
    0.34 takes its TMA path only for a B on CUDA, and the kernel the compile process caches must
    be the one the timing process launches (else each is compiled there, one after another)."""

    @property
    def device(self):
        return torch.device("cuda", 0)


def _unavailable(name):
    def call(*args, **kwargs):
        raise BackendError(f"moeops' vllm backend does not run vLLM's {name}")

    return call


stand_ins = SimpleNamespace(
    logger=_Logger(),
    envs=SimpleNamespace(VLLM_BATCH_INVARIANT=False, VLLM_TRITON_USE_TD=None),
    current_platform=_Platform(),
    ops=_Ops(),
    next_power_of_2=lambda n: 1 << (n - 1).bit_length() if n > 0 else 1,
    round_up=lambda x, y: ((x + y - 1) // y) * y,
    should_moe_wna16_use_cuda=_unavailable("wna16 kernels"),
    set_triton_allocator=_set_triton_allocator,
    get_device_name_as_file_name=lambda: stand_ins.device_file_name,
    device_file_name="",
)


class VllmBackend(KernelBackend):
    """vLLM's fused-MoE layer from the installed package (see the module docstring)."""

    engine = "vllm"
    separate_down_config = False

    def __init__(
        self, package: EnginePackage, *, capability: int | None, launch: dict | None = None
    ):
        """launch: the deployment's {"deep_gemm_e8m0": bool, "expert_parallel": bool}
        (tuning.engines.vllm_launch, DeepGEMM's presence on the host included); None: a launch
        that takes vLLM's default path (no DeepGEMM)."""
        self.package = package
        self.launch = {"deep_gemm_e8m0": False, "expert_parallel": False, **(launch or {})}
        self.version = package.version
        self.capability = capability
        provided = {name for name in vars(stand_ins) if name != "device_file_name"}
        provided |= {"functools", "Any", "torch", "triton", "tl", "_warned_moe_use_td_ineffective"}
        self.source = load_functions(package, WANTED, PREAMBLE, provided)
        self.source_sha256 = self.source.sha256
        launcher = inspect.signature(self.source.invoke_fused_moe_triton_kernel).parameters
        # the sorted-A parameters come together, with the launcher's TMA read of B (0.34)
        self.sorted_launch = all(p in launcher for p in SORTED_PARAMETERS)
        known = LAUNCHER_PARAMETERS + (SORTED_PARAMETERS if self.sorted_launch else ())
        refuse_unknown_parameters(
            "vLLM",
            self.version,
            "invoke_fused_moe_triton_kernel",
            launcher,
            known,
            required=LAUNCHER_PARAMETERS,
        )
        self.reads_use_tma = '"USE_TMA"' in self.source.functions["invoke_fused_moe_triton_kernel"]
        self._sorted_quant = None

    def kernel_path(self, shape) -> str:
        """Which launch of vLLM's kernel a tune of shape times for this deployment
        (tuning.engines.KERNEL_PATHS): "sorted_a" where vLLM runs GEMM 2 on its sorted-A path
        (sorted_a_path), "tma" where the launcher reads B through TMA (USE_TMA searched), else
        "default"."""
        if self.sorted_launch and self.sorted_a_why_not(shape) is None:
            return "sorted_a"
        return "tma" if self.search_switches(shape) else "default"

    def sorted_a_why_not(self, shape) -> str | None:
        """Why this vLLM runs GEMM 2 of shape with GEMM 1's config on this deployment, None
        where it takes the sorted-A path (sorted_a_path)."""
        if not self.sorted_launch:
            return f"vLLM {self.version} has no sorted-A path"
        return sorted_a_path(shape, capability=self.capability, **self.launch)

    def down_config_applies(self, shape) -> bool:
        """GEMM 2 reads a `_down` file of its own on the sorted-A path only."""
        return self.kernel_path(shape) == "sorted_a"

    def down_switches(self, shape) -> dict:
        """A `_down` entry takes the sorted-A path only when it says `"USE_TMA": true`."""
        return {"USE_TMA": (True,)} if self.down_config_applies(shape) else {}

    def _sorted_quant_kernel(self):
        # the engine's own silu-and-mul + E8M0 quantisation of GEMM 1's sorted rows
        if self._sorted_quant is None:
            provided = {"triton", "tl", "torch"}
            wanted = {TRITON_EXPERTS: ["_silu_mul_quant_sorted_kernel"]}
            loaded = load_functions(self.package, wanted, PREAMBLE, provided)
            self._sorted_quant = loaded.module._silu_mul_quant_sorted_kernel
        return self._sorted_quant

    def search_switches(self, shape) -> dict:
        """USE_TMA (true first, the launcher's default) where this vLLM reads it and its TMA
        path applies to shape on this GPU (tma_b_applies)."""
        if self.reads_use_tma and tma_b_applies(shape, self.capability):
            return {"USE_TMA": (True, False)}
        return {}

    def _platform(self):
        stand_ins.current_platform.capability = self.capability

    def _layer(
        self, x, weights, topk_weights, topk_ids, shape, config, down_config, out, launch_only
    ):
        sorted_a = down_config is not None and down_config != config
        if sorted_a and not self.down_config_applies(shape):
            raise BackendError(
                f"vLLM {self.version} runs GEMM 2 with GEMM 1's config here: "
                f"{self.sorted_a_why_not(shape)}"
            )
        # a `_down` entry that does not say "USE_TMA": true leaves GEMM 2 on the default path
        sorted_a = sorted_a and sorted_a_entry(down_config, config, shape.H)
        from tuning.moe_ops import quantize_activations, scales_mode, silu_and_mul

        self._platform()
        vllm = self.source
        M, H = x.shape
        E, two_n, _ = weights.w1.shape
        top_k = topk_ids.shape[1]
        fp8 = shape.dtype == "fp8_w8a8"
        block = list(shape.block_shape) if shape.block_shape else None
        scales = scales_mode(shape.dtype, block)
        w1, w2 = weights.w1, weights.w2
        if launch_only and w1.device.type == "cpu":
            w1, w2 = w1.as_subclass(_CompiledForGpu), w2.as_subclass(_CompiledForGpu)
        w1_scale, w2_scale = weights.w1_scale, weights.w2_scale
        if fp8 and block is None:
            w1_scale, w2_scale = w1_scale.reshape(-1).float(), w2_scale.reshape(-1).float()
        # vLLM reuses one buffer for GEMM 1's and GEMM 2's outputs
        cache13 = torch.empty(M * top_k * max(two_n, H), device=x.device, dtype=x.dtype)
        cache1 = cache13[: M * top_k * two_n].view(M, top_k, two_n)
        cache3 = cache13[: M * top_k * H].view(M, top_k, H)
        compute_type = _compute_type(x.dtype)
        flags = {
            "compute_type": compute_type,
            "use_fp8_w8a8": fp8,
            "use_int8_w8a8": False,
            "use_int8_w8a16": False,
            "use_int4_w4a16": False,
            "per_channel_quant": False,
            "block_shape": block,
            "B_bias": None,
        }
        a1, a1_scale = quantize_activations(x, scales, block)
        sorted_ids, expert_ids, num_padded = vllm._prepare_expert_assignment(
            topk_ids, config, M, top_k, E, None, block_shape=block, ignore_invalid_experts=True
        )
        # the naive assignment of tiny batches has no sorted ids: vLLM keeps the default path
        if sorted_a and sorted_ids is not None:
            self._sorted_a_gemms(
                a1, a1_scale, (w1, w2), weights, topk_weights, (sorted_ids, expert_ids, num_padded),
                cache3, top_k, config, down_config, flags,
            )  # fmt: skip
            if launch_only:
                return out
            return torch.sum(cache3, dim=1, out=out)
        vllm.invoke_fused_moe_triton_kernel(
            a1, w1, cache1, a1_scale, w1_scale, topk_weights, sorted_ids, expert_ids,
            num_padded, False, top_k, config, **flags,
        )  # fmt: skip
        a2, a2_scale = silu_and_mul(cache1.view(-1, two_n), scales, block)
        vllm.invoke_fused_moe_triton_kernel(
            a2, w2, cache3, a2_scale, w2_scale, topk_weights, sorted_ids, expert_ids,
            num_padded, True, 1, config, **flags,
        )  # fmt: skip
        if launch_only:
            return out
        return torch.sum(cache3, dim=1, out=out)

    def _sorted_a_gemms(
        self, a1, a1_scale, w, weights, topk_weights, aligned, cache3, top_k, config, down, flags
    ):
        """GEMM 1 into sorted rows, the engine's sorted silu-and-mul quantisation, GEMM 2 reading
        them through TMA with the `_down` entry (BLOCK_SIZE_M GEMM 1's), as
        TritonExperts.apply launches them on its sorted-A path."""
        import triton

        vllm = self.source
        sorted_ids, expert_ids, num_padded = aligned
        w1, w2 = w
        two_n, n = w1.shape[1], w1.shape[1] // 2
        rows = sorted_ids.numel()
        cache1 = torch.empty((rows, 1, two_n), device=a1.device, dtype=cache3.dtype)
        vllm.invoke_fused_moe_triton_kernel(
            a1, w1, cache1, a1_scale, weights.w1_scale, topk_weights, sorted_ids, expert_ids,
            num_padded, False, top_k, config, **flags, C_is_sorted=True,
        )  # fmt: skip
        a2 = torch.empty((rows, n), device=a1.device, dtype=torch.float8_e4m3fn)
        a2_scale = torch.empty((rows, n // 128), device=a1.device, dtype=torch.float32)
        self._sorted_quant_kernel()[(triton.cdiv(rows, 16), n // 128)](
            cache1, a2, a2_scale, num_padded, n, BLOCK_M=16, GROUP_K=128
        )
        down_config = {k: v for k, v in down.items() if k != "USE_TMA"}
        down_config["BLOCK_SIZE_M"] = config["BLOCK_SIZE_M"]
        vllm.invoke_fused_moe_triton_kernel(
            a2, w2, cache3, a2_scale, weights.w2_scale, topk_weights, sorted_ids, expert_ids,
            num_padded, True, 1, down_config, **flags, A_is_sorted=True,
        )  # fmt: skip

    def default_config(self, shape, M: int) -> dict:
        self._platform()
        dtype = "fp8_w8a8" if shape.dtype == "fp8_w8a8" else None
        block = list(shape.block_shape) if shape.block_shape else None
        config = self.source.get_default_config(
            M, shape.E, shape.N, shape.H, shape.top_k, dtype, block
        )
        # vLLM's launch sets SPLIT_K itself; the file format has no such key
        return {k: v for k, v in config.items() if k != "SPLIT_K"}

    def file_name(self, shape, device_name: str) -> str:
        """The file name this vLLM looks up for shape on device_name, by vLLM's own rule."""
        stand_ins.device_file_name = device_name.replace(" ", "_")
        dtype = "fp8_w8a8" if shape.dtype == "fp8_w8a8" else None
        block = list(shape.block_shape) if shape.block_shape else None
        return self.source.get_config_file_name(shape.E, shape.N, dtype, block)

    def shipped_configs(self, shape, device_name: str, *, down=False):
        if down:
            # read only on the sorted-A path; elsewhere GEMM 2 runs with GEMM 1's config
            entries = self.shipped_down(shape, device_name)
            if entries is None or not self.down_config_applies(shape):
                return None
            name = self.down_file_name(shape, device_name)
            return ShippedConfigs(str(self.package.package_dir / CONFIGS / name), entries)
        path = self.package.package_dir / CONFIGS / self.file_name(shape, device_name)
        return read_shipped(path)

    def down_file_name(self, shape, device_name: str) -> str | None:
        """The `_down` file this vLLM looks up for shape beside the up file (get_moe_configs
        with down_moe: the up file's name ending `_down.json`), None before 0.34."""
        if not self.sorted_launch:
            return None
        return self.file_name(shape, device_name).removesuffix(".json") + "_down.json"

    def shipped_down(self, shape, device_name: str) -> dict[int, dict] | None:
        """{M: entry} of this vLLM's own `_down` file for shape, None where it ships none. An
        entry may be only `{"USE_TMA": false}` (the sorted-A path off at that batch size)."""
        name = self.down_file_name(shape, device_name)
        path = self.package.package_dir / CONFIGS / name if name else None
        if path is None or not path.exists():
            return None
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise BackendError(f"vLLM's own config file {path} cannot be read: {exc}") from None
        data.pop("triton_version", None)
        return {int(m): entry for m, entry in data.items()}


def tma_b_applies(shape, capability: int | None) -> bool:
    """Whether vLLM 0.34's invoke_fused_moe_triton_kernel reads B through a TMA descriptor for
    shape on a GPU of compute capability `capability` (90 for sm_90), unless the entry says
    `"USE_TMA": false`. The launcher decides inline; this mirrors the part of it that depends
    on the shape and GPU (fp8 w8a8 with both block sizes set, a CUDA GPU of the SM90 or SM100
    family). The part that depends on the config (N and K divisible by the tile, B contiguous
    on the GPU) it checks at each launch, and then reads B by pointers as before."""
    return (
        shape.dtype == "fp8_w8a8"
        and shape.block_shape is not None
        and all(shape.block_shape)
        and capability is not None
        and capability // 10 in (9, 10)
    )


# vLLM 0.34's least hidden size for its sorted-A path (TritonExperts.apply: w2.size(1) >= 4096)
SORTED_A_MIN_HIDDEN = 4096


def sorted_a_path(
    shape, *, capability: int | None, deep_gemm_e8m0: bool, expert_parallel: bool = False
) -> str | None:
    """Why vLLM 0.34 runs GEMM 2 with GEMM 1's config for shape on a deployment, or None where
    it takes its sorted-A TMA path, the only one that reads a `_down` file (then at each batch
    size whose `_down` entry says `"USE_TMA": true`: sorted_a_entry).

    TritonExperts.apply decides inline; this mirrors the conditions that depend on the shape
    and the deployment: fp8 w8a8 with block [128, 128], DeepGEMM in use with E8M0 scales
    (`is_deep_gemm_e8m0_used()`: DeepGEMM present and VLLM_USE_DEEP_GEMM_E8M0 on), no expert
    map (expert parallelism), a GPU of compute capability exactly 9.0, H ≥ 4096 and N (one
    rank's intermediate size) a multiple of 128. deep_gemm_e8m0, expert_parallel: the
    deployment's, from its recipe's environment and flags.
    """
    if shape.dtype != "fp8_w8a8" or list(shape.block_shape or ()) != [128, 128]:
        return "only fp8 w8a8 with block [128, 128] takes it"
    if not deep_gemm_e8m0:
        return "the deployment does not run DeepGEMM with E8M0 scales (VLLM_USE_DEEP_GEMM_E8M0)"
    if expert_parallel:
        return "the deployment runs expert parallelism (an expert map)"
    if capability != 90:
        return "only a GPU of compute capability 9.0 (H100, H200) takes it"
    if shape.H < SORTED_A_MIN_HIDDEN:
        return f"H {shape.H} is under {SORTED_A_MIN_HIDDEN}"
    if shape.N % 128:
        return f"N {shape.N} is not a multiple of 128"
    return None


def sorted_a_entry(down_entry: dict | None, up_config: dict, H: int) -> bool:
    """Whether vLLM 0.34 takes the sorted-A path at a batch size where the deployment allows it
    (sorted_a_path): its `_down` entry there says `"USE_TMA": true` (absent means false, so an
    entry of only `{"USE_TMA": false}` turns the path off), GEMM 1's BLOCK_SIZE_M is a multiple
    of 16 and H a multiple of the `_down` entry's BLOCK_SIZE_N. Mirrors TritonExperts.apply."""
    if not down_entry or not down_entry.get("USE_TMA", False):
        return False
    return up_config["BLOCK_SIZE_M"] % 16 == 0 and H % down_entry["BLOCK_SIZE_N"] == 0


def _compute_type(dtype):
    import triton.language as tl

    types = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}
    if dtype not in types:
        raise BackendError(f"vLLM's kernel computes in bf16, fp16 or fp32, not {dtype}")
    return types[dtype]
