"""SGLang's own fused-MoE kernel, launched as the installed SGLang launches it.

From the installed SGLang (tuning.engine_source) this backend takes, unchanged:
- the kernels: `fused_moe_kernel` (with `write_zeros_to_output`; `fused_moe_kernel_gptq_awq`
  beside it, which the launcher names), `act_and_mul_kernel` and `_moe_sum_reduce_kernel`, and
  the single-launch align `_moe_align_small_numel_kernel` for tiny batches of many experts;
- the launcher `invoke_fused_moe_kernel` (grid over the whole sorted buffer, even_Ks, swap-AB
  through `should_enable_swap_ab`, programmatic dependent launch where SGLang's PDL check says so,
  the TMA descriptors and their allocator and cache) and its glue launchers
  `act_and_mul_triton`, `moe_sum_reduce_triton`, `moe_align_small_numel`;
- the layer's sequence as `fused_experts_impl` runs it: `_prepare_fused_moe_run` (USE_TMA taken
  out of the config and the down config, one `moe_align_block_size` sort for both GEMMs) and
  `_fused_moe_kernel_sequence` (GEMM 1, silu-and-mul, GEMM 2 with `down_config or config` and the
  router weights, `moe_combine_topk`), with their small helpers;
- the `moe_align_block_size` wrapper (SGLang's buffer sizes, the "+1 bucket" convention);
- the default-config rule `get_default_config`, the file name `get_config_file_name` and the
  dtype part `get_config_dtype_str`.

The names those functions use from the rest of SGLang come from `SglangStandIns`: the
platform checks answered for the GPU the backend is told of (`capability`, read at every call;
sm_90: swap-AB, PDL), SGLang's runtime flags at their defaults (no deterministic or batch-invariant
mode, no fused sum all-reduce, no symmetric memory, no LoRA, no MoE padding), and the compiled
ops done with their semantics: `sgl_kernel.moe_align_block_size` by moeops' sort-and-pad
kernels writing SGLang's buffers, silu-and-mul and the fp8 quantisation of activations (per
token group, or one dynamic scale per tensor) by tuning.moe_ops, and sgl_kernel's
`moe_sum_reduce` by SGLang's own Triton `moe_sum_reduce_triton`. The config the layer times
stands in for `try_get_optimal_moe_config`. A SGLang whose functions use another name, or whose
launcher or sequence takes another parameter, fails to load with a sentence naming the version
and the name.

As SGLang runs it (inplace), the layer writes its output over its input activations: `layer`
copies x into out and runs the sequence on out.
"""

from __future__ import annotations

import contextlib
import inspect
from pathlib import Path
from types import SimpleNamespace

from tuning.backends.base import (
    BackendError,
    KernelBackend,
    read_shipped,
    refuse_unknown_parameters,
)
from tuning.compile_only import SHARED_MEMORY_PER_BLOCK_OPTIN
from tuning.engine_source import EnginePackage, load_functions, top_level_constants

KERNELS = "kernels/ops/moe/fused_moe_triton_kernels.py"
SMALL_ALIGN = "kernels/ops/moe/moe_align_small_numel.py"
TRITON_UTILS = "srt/layers/moe/moe_runner/triton_utils"
RUNNER = f"{TRITON_UTILS}/fused_moe.py"
CONFIG = f"{TRITON_UTILS}/fused_moe_triton_config.py"
ALIGN = f"{TRITON_UTILS}/moe_align_block_size.py"
CONFIGS = f"{TRITON_UTILS}/configs"
WANTED = {
    KERNELS: [
        "support_tensor_descriptor",
        "should_enable_swap_ab",
        "write_zeros_to_output",
        "fused_moe_kernel_gptq_awq",
        "fused_moe_kernel",
        "_set_triton_tma_allocator",
        "_get_b_tma_desc_cached",
        "invoke_fused_moe_kernel",
        "tanh",
        "_apply_activation",
        "act_and_mul_kernel",
        "act_and_mul_triton",
        "_moe_sum_reduce_kernel",
        "moe_sum_reduce_triton",
    ],
    SMALL_ALIGN: ["_moe_align_small_numel_kernel", "moe_align_small_numel"],
    ALIGN: ["moe_align_block_size"],
    RUNNER: [
        "_validate_fused_swiglu_interleaved",
        "_activation_row_filter",
        "_use_moe_sum_reduce_torch_compile",
        "moe_sum_reduce_torch_compile",
        "_swiglu_silu_clamp_mul",
        "swiglu_gpt_oss_sigmoid_alpha",
        "swiglu_no_interleaved_with_alpha_and_limit",
        "_moe_support_tma",
        "_prepare_fused_moe_run",
        "_fused_moe_kernel_sequence",
        "moe_combine_topk",
    ],
    CONFIG: [
        "get_config_file_name",
        "get_default_config",
        "_use_low_smem_fp8_default",
        "get_config_dtype_str",
    ],
}
# Module-level constants of SGLang's the taken functions read.
CONSTANTS = {
    KERNELS: ["_TMA_ALLOCATOR_SET", "_B_DESC_CACHE_MAX"],
    SMALL_ALIGN: ["SMALL_NUMEL_LIMIT"],
    ALIGN: ["_CUDA_SMALL_BATCH_MAX_BUCKETS"],
    CONFIG: ["_LOW_SMEM_FP8_DEFAULT_CUTOFF_BYTES"],
}
# The parameters of SGLang 0.5.23's functions this backend calls or relies on: another SGLang's
# launch may differ in ways moeops does not know.
PARAMETERS = {
    "invoke_fused_moe_kernel": (
        "A", "B", "bias", "C", "A_scale", "B_scale", "B_zp", "topk_weights", "topk_ids",
        "sorted_token_ids", "expert_ids", "num_tokens_post_padded", "mul_routed_weight",
        "top_k", "config", "compute_type", "use_fp8_w8a8", "use_int8_w8a8", "use_int8_w8a16",
        "use_int4_w4a16", "per_channel_quant", "block_shape", "no_combine", "a_use_tma",
        "b_use_tma", "c_sorted", "filter_expert", "fuse_sum_all_reduce", "router_topk",
        "fuse_add_to_output", "add_output_mask", "mask_output", "lora_preserve_base",
        "fuse_swiglu", "a_output_slices",
    ),
    "_prepare_fused_moe_run": (
        "hidden_states", "w1", "w2", "topk_ids", "use_fp8_w8a8", "use_int8_w8a8",
        "use_int8_w8a16", "use_int4_w4a16", "per_channel_quant", "block_shape",
    ),
    "_fused_moe_kernel_sequence": (
        "hidden_states", "w1", "w2", "topk_weights", "topk_ids", "sorted_token_ids",
        "expert_ids", "num_tokens_post_padded", "config", "down_config", "down_moe_use_tma",
        "up_moe_use_tma", "b1", "b2", "use_fp8_w8a8", "use_int8_w8a8", "use_int8_w8a16",
        "use_int4_w4a16", "per_channel_quant", "w1_scale", "w2_scale", "w1_zp", "w2_zp",
        "a1_scale", "a2_scale", "block_shape", "activation", "is_gated", "no_combine",
        "inplace", "apply_router_weight_on_input", "routed_scaling_factor", "gemm1_alpha",
        "gemm1_limit", "filter_expert", "hooks", "swiglu_limit", "gate_up_interleaved", "a1_q",
        "fuse_swiglu_interleaved", "defer_sum", "no_combine_keep_router_weight",
    ),
}  # fmt: skip
# SGLang's platform and environment flags on a CUDA GPU with SGLang's defaults: not ROCm, XPU
# or MUSA, no aiter, no vLLM ops, SGLANG_MOE_PADDING and the experimental LoRA path unset.
FLAGS = {
    "_is_cuda": True,
    "_is_hip": False,
    "_is_xpu": False,
    "_is_musa": False,
    "_use_aiter": False,
    "_has_vllm_ops": False,
    "_SGLANG_EXPERIMENTAL_LORA_OPTI": False,
    "padding_size": 0,
}
STAND_INS = (
    "logger",
    "get_exec",
    "get_parallel",
    "use_symmetric_memory",
    "is_allocation_symmetric",
    "is_batch_invariant_mode_enabled",
    "is_sm90_supported",
    "is_arch_support_pdl",
    "_get_cuda_shared_memory_per_block_optin",
    "get_device_name",
    "try_get_optimal_moe_config",
    "sgl_moe_align_block_size",
    "silu_and_mul",
    "per_token_group_quant",
    "sglang_per_token_group_quant_fp8",
    "scaled_fp8_quant",
    "per_token_group_quant_fp8",
    "per_token_quant_int8",
    "sglang_per_token_group_quant_int8",
    "per_token_group_quant_int8",
    "silu_and_mul_with_activation_rounding",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "_silu_and_mul_musa",
    "moe_sum",
    "vllm_ops",
)
PREAMBLE = """
import functools
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tuning.backends.sglang import SglangStandIns

try:
    from triton.tools.tensor_descriptor import TensorDescriptor

    _support_tensor_descriptor = True
except ImportError:
    TensorDescriptor = None
    _support_tensor_descriptor = False

_stand_ins = SglangStandIns()
{lines}
_B_DESC_CACHE = OrderedDict()


# sgl_kernel's CUDA moe_sum_reduce, done by SGLang's own Triton kernel of the same semantics
def moe_sum_reduce(input, output, routed_scaling_factor):
    moe_sum_reduce_triton(input, output, routed_scaling_factor)
"""
PREAMBLE_NAMES = {
    "functools",
    "OrderedDict",
    "Any",
    "Dict",
    "List",
    "Optional",
    "Tuple",
    "torch",
    "F",
    "triton",
    "tl",
    "TensorDescriptor",
    "_support_tensor_descriptor",
    "_B_DESC_CACHE",
    "moe_sum_reduce",
}


class _Logger:
    """SGLang's logger calls, dropped: a tune reports through its own progress."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class _Unavailable:
    """An SGLang op or module moeops does not run; using it fails saying so."""

    def __init__(self, name):
        self.name = name

    def __call__(self, *args, **kwargs):
        raise BackendError(f"moeops' sglang backend does not run SGLang's {self.name}")

    def __getattr__(self, name):
        return _Unavailable(f"{self.name}.{name}")


class SglangStandIns:
    """What SGLang's taken functions use from the rest of SGLang and from sgl_kernel, for a CUDA
    GPU of compute capability `capability` (90 for sm_90; None: no GPU known), which the
    backend sets before every call."""

    def __init__(self):
        self.capability: int | None = None
        self.device_name = ""
        # (config, down_config) of the layer call in progress
        self.timed: tuple[dict, dict | None] | None = None
        self.logger = _Logger()
        self.per_token_group_quant_fp8 = _Unavailable("non-CUDA per_token_group_quant_fp8")
        self.per_token_quant_int8 = _Unavailable("int8 quantisation")
        self.sglang_per_token_group_quant_int8 = _Unavailable("int8 quantisation")
        self.per_token_group_quant_int8 = _Unavailable("int8 quantisation")
        self.silu_and_mul_with_activation_rounding = _Unavailable("silu_rounded activation")
        self.gelu_and_mul = _Unavailable("gelu activation")
        self.gelu_tanh_and_mul = _Unavailable("gelu_tanh activation")
        self._silu_and_mul_musa = _Unavailable("MUSA activation")
        self.moe_sum = _Unavailable("aiter moe_sum")
        self.vllm_ops = _Unavailable("vLLM ops")

    # runtime context, at SGLang's defaults for one rank without expert parallelism

    def get_exec(self):
        return SimpleNamespace(
            moe=SimpleNamespace(enable_fused_moe_sum_all_reduce=False),
            deterministic=SimpleNamespace(enable_deterministic_inference=False),
        )

    def get_parallel(self):
        return SimpleNamespace(tp_group=None)

    def use_symmetric_memory(self, group, disabled=False):
        return contextlib.nullcontext()

    def is_allocation_symmetric(self) -> bool:
        return False

    def is_batch_invariant_mode_enabled(self) -> bool:
        return False

    # platform checks, answered for the GPU this backend is told of

    def is_sm90_supported(self) -> bool:
        # SGLang also wants CUDA 12.3, which every build for sm_90 it supports has
        return self.capability is not None and self.capability // 10 == 9

    def is_arch_support_pdl(self) -> bool:
        return self.capability is not None and self.capability >= 90

    def _get_cuda_shared_memory_per_block_optin(self) -> int | None:
        return SHARED_MEMORY_PER_BLOCK_OPTIN.get(self.capability)

    def get_device_name(self) -> str:
        return self.device_name

    def try_get_optimal_moe_config(
        self,
        w1_shape,
        w2_shape,
        top_k,
        dtype,
        M,
        is_marlin=False,
        block_shape=None,
        per_channel_quant=False,
        return_down_config=False,
    ):
        # copies: SGLang's caller pops USE_TMA out of what it gets
        config, down_config = self.timed
        down_config = dict(down_config) if down_config is not None else None
        if return_down_config:
            return dict(config), (down_config, None)
        return dict(config)

    # compiled ops, with sgl_kernel's and SGLang's JIT kernels' semantics

    def sgl_moe_align_block_size(
        self,
        topk_ids,
        num_experts,
        block_size,
        sorted_token_ids,
        expert_ids,
        num_tokens_post_pad,
        cumsum_buffer,
        pad_sorted_token_ids=False,
        ignore_invalid_expert=False,
    ):
        from tuning.moe_ops import sort_and_pad

        # num_experts counts SGLang's bucket for the filtered id -1, which one rank never routes to
        sorted_token_ids.fill_(topk_ids.numel())
        sort_and_pad(
            topk_ids,
            num_experts - 1,
            block_size,
            out=(sorted_token_ids, expert_ids, num_tokens_post_pad),
        )

    def silu_and_mul(
        self,
        input,
        out=None,
        expert_ids=None,
        expert_step=1,
        *,
        sorted_token_ids=None,
        num_tokens_post_padded=None,
        num_valid_tokens=0,
    ):
        from tuning.moe_ops import launch_activation

        # rows the filter would skip are computed too; GEMM 2 never uses them
        n = input.shape[-1] // 2
        if out is None:
            out = input.new_empty(*input.shape[:-1], n)
        launch_activation(input, out, None, n, silu_and_mul=True, group=None)
        return out

    def per_token_group_quant(self, input, output_q=None, output_s=None, group_size=128, **rows):
        if output_q is not None or output_s is not None:
            raise BackendError("moeops' sglang backend quantises into buffers of its own")
        return self._group_quant(input, group_size)

    def sglang_per_token_group_quant_fp8(self, x, group_size, eps=1e-10, *args, **kwargs):
        if args or any(kwargs.values()):
            raise BackendError("moeops' sglang backend quantises per token group only")
        return self._group_quant(x, group_size)

    def scaled_fp8_quant(
        self, input, scale=None, num_token_padding=None, use_per_token_if_dynamic=False
    ):
        from tuning.moe_ops import FP8_DTYPE, FP8_MAX, quantize_per_tensor

        if num_token_padding or use_per_token_if_dynamic:
            raise BackendError("moeops' sglang backend quantises fp8 per tensor only")
        if scale is None:
            return quantize_per_tensor(input)
        return (input.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale

    def _group_quant(self, x, group_size):
        from tuning.moe_ops import SCALES_BLOCK, quantize_activations

        return quantize_activations(x.contiguous(), SCALES_BLOCK, [group_size, group_size])


class SglangBackend(KernelBackend):
    """SGLang's fused-MoE layer from the installed package (see the module docstring)."""

    engine = "sglang"
    separate_down_config = True

    def __init__(self, package: EnginePackage, *, capability: int | None):
        self.package = package
        self.version = package.version
        self.capability = capability
        constants = {}
        for relpath, names in CONSTANTS.items():
            text = package.read(relpath)
            constants |= top_level_constants(text, names, where=f"{package.title}'s {relpath}")
        values = {**FLAGS, **constants}
        lines = [f"{name} = _stand_ins.{name}" for name in STAND_INS]
        lines += [f"{name} = {value!r}" for name, value in values.items()]
        preamble = PREAMBLE.format(lines="\n".join(lines))
        provided = PREAMBLE_NAMES | set(STAND_INS) | set(values)
        self.source = load_functions(package, WANTED, preamble, provided)
        self.source_sha256 = self.source.sha256
        self.stand_ins: SglangStandIns = self.source._stand_ins
        self._swap_ab_rule = self.source.should_enable_swap_ab
        for function, known in PARAMETERS.items():
            parameters = inspect.signature(getattr(self.source, function)).parameters
            refuse_unknown_parameters("SGLang", self.version, function, parameters, known, known)

    def _platform(self):
        """Point SGLang's platform checks at this backend's GPU (capability may be reassigned)."""
        if self.stand_ins.capability != self.capability:
            self.stand_ins.capability = self.capability
            # SGLang caches its swap-AB answers (lru_cache), which depend on the GPU
            clear = getattr(self._swap_ab_rule, "cache_clear", None)
            if clear is not None:
                clear()

    def _layer(
        self, x, weights, topk_weights, topk_ids, shape, config, down_config, out, launch_only
    ):
        """One MoE layer as SGLang's fused_experts runs it, GEMM 2 with down_config (SGLang's
        `_down` entry) when given, else config; both GEMMs read one sort, so down_config's
        BLOCK_SIZE_M must be config's. launch_only: out is not given x's values first (the
        torch work inside SGLang's sequence is SGLang's and runs)."""
        if down_config is not None and down_config["BLOCK_SIZE_M"] != config["BLOCK_SIZE_M"]:
            raise BackendError(
                f"the down config's BLOCK_SIZE_M {down_config['BLOCK_SIZE_M']} is not the up "
                f"config's {config['BLOCK_SIZE_M']}: SGLang sorts the tokens once for both GEMMs"
            )
        sglang = self.source
        block = list(shape.block_shape) if shape.block_shape else None
        quantization = {
            "use_fp8_w8a8": shape.dtype == "fp8_w8a8",
            "use_int8_w8a8": False,
            "use_int8_w8a16": False,
            "use_int4_w4a16": False,
            "per_channel_quant": False,
        }
        self._platform()
        if not launch_only:
            out.copy_(x)
        self.stand_ins.timed = (config, down_config)
        (
            up_config,
            gemm2_config,
            down_moe_use_tma,
            up_moe_use_tma,
            sorted_token_ids,
            expert_ids,
            num_tokens_post_padded,
        ) = sglang._prepare_fused_moe_run(
            out, weights.w1, weights.w2, topk_ids, **quantization, block_shape=block
        )
        sglang._fused_moe_kernel_sequence(
            hidden_states=out,
            w1=weights.w1,
            w2=weights.w2,
            topk_weights=topk_weights,
            topk_ids=topk_ids,
            sorted_token_ids=sorted_token_ids,
            expert_ids=expert_ids,
            num_tokens_post_padded=num_tokens_post_padded,
            config=up_config,
            down_config=gemm2_config,
            down_moe_use_tma=down_moe_use_tma,
            up_moe_use_tma=up_moe_use_tma,
            b1=None,
            b2=None,
            **quantization,
            w1_scale=weights.w1_scale,
            w2_scale=weights.w2_scale,
            w1_zp=None,
            w2_zp=None,
            a1_scale=None,
            a2_scale=None,
            block_shape=block,
            activation="silu",
            is_gated=True,
            no_combine=False,
            inplace=True,
            apply_router_weight_on_input=False,
            routed_scaling_factor=None,
            gemm1_alpha=None,
            gemm1_limit=None,
            # one rank holding every expert: SGLang filters only under expert parallelism
            filter_expert=False,
            hooks=None,
            swiglu_limit=None,
            gate_up_interleaved=True,
            a1_q=None,
            fuse_swiglu_interleaved=False,
            defer_sum=False,
            no_combine_keep_router_weight=False,
        )
        return out

    def _dtype(self, shape) -> str | None:
        """The dtype part of SGLang's file names and rules ("fp8_w8a8", "float32" or None)."""
        from tuning.timing import activation_dtype

        return self.source.get_config_dtype_str(
            activation_dtype(shape), use_fp8_w8a8=shape.dtype == "fp8_w8a8"
        )

    def default_config(self, shape, M: int) -> dict:
        """SGLang's get_default_config, with Triton's launch defaults (4 warps, 3 stages) where
        its rule names none."""
        from tuning.moe_ops import full_config

        self._platform()
        block = list(shape.block_shape) if shape.block_shape else None
        config = self.source.get_default_config(
            M, shape.E, shape.N, shape.H, shape.top_k, self._dtype(shape), False, block
        )
        return full_config(config)

    def file_name(self, shape, device_name: str, *, down: bool = False) -> str:
        """The file name this SGLang looks up for shape on device_name (down: GEMM 2's)."""
        self.stand_ins.device_name = device_name
        block = list(shape.block_shape) if shape.block_shape else [0, 0]
        return self.source.get_config_file_name(
            shape.E, shape.N, self._dtype(shape), block, False, down_moe=down
        )

    def shipped_configs(self, shape, device_name: str, *, down=False, triton_version=None):
        """SGLang's own file for shape on device_name, found as its get_moe_configs finds it:
        under configs/triton_<version>/ (triton_version, default the Triton running here), else
        under the other triton_* folders, newest first. down=True: GEMM 2's `_down` file, else,
        as SGLang falls back, the up-projection file. None where SGLang finds none."""
        import triton

        version = triton_version or triton.__version__
        root = self.package.package_dir / CONFIGS
        names = [self.file_name(shape, device_name, down=down)]
        if down:
            names.append(self.file_name(shape, device_name))
        for name in names:
            for folder in _version_folders(root, version):
                path = folder / name
                if path.exists():
                    return read_shipped(path)
        return None


def _version_folders(root: Path, version: str) -> list[Path]:
    """SGLang's search order of its config folders: this Triton's, then the others newest first."""
    others = sorted(
        (
            folder.name.removeprefix("triton_").replace("_", ".")
            for folder in root.iterdir()
            if folder.name.startswith("triton_")
        ),
        key=lambda v: tuple(int(x) for x in v.split(".")),
        reverse=True,
    )
    versions = [version, *(v for v in others if v != version)]
    return [root / f"triton_{v.replace('.', '_')}" for v in versions]
