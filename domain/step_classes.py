"""Which class of a step's time (domain.step_breakdown.CLASSES) a kernel or an op belongs to.

One rule table per engine and version family. A rule is (class, pattern): the pattern is searched
in the kernel name (GPU trace) or op name (CPU trace); the first rule that matches wins, so the
specific rules come before the broad ones (the MoE's grouped GEMMs before "gemm", the router's
top-k before the sampler's). A name that matches no rule is "other", kept with its name.

Each rule names `source`: a string of the engine's own Python that calls or defines what emits
the kernel or op (CUDA kernels live in .cu files outside the wheel, so for them it is the
registered op the Python calls, e.g. `torch.ops._C.rms_norm(` for `rms_norm_kernel`), and
`example`: a kernel or op name as the trace spells it. tests/domain/test_step_classes.py checks
that every pattern matches its example and every source is still in the engine's package, for
each version a table claims.
"""

import re
from dataclasses import dataclass, field

from domain.step_breakdown import CLASSES


@dataclass(frozen=True)
class StepRule:
    klass: str
    pattern: str
    source: str
    example: str

    def __post_init__(self):
        if self.klass not in CLASSES or self.klass == "idle":
            raise ValueError(f"{self.klass}: not a class a kernel or op can have")


@dataclass(frozen=True)
class RuleTable:
    """The rules of one engine and version family on one kind of device ("gpu" or "cpu")."""

    name: str
    engine: str
    versions: tuple[str, ...]
    device: str
    rules: tuple[StepRule, ...]
    _compiled: tuple = field(init=False, repr=False, compare=False)
    _cache: dict = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self):
        compiled = tuple((re.compile(r.pattern), r.klass) for r in self.rules)
        object.__setattr__(self, "_compiled", compiled)

    def classify(self, name: str) -> str | None:
        """The class of a kernel or op name, None when no rule matches (the caller decides:
        an op may inherit its caller's class, a kernel is "other")."""
        try:
            return self._cache[name]
        except KeyError:
            found = next((klass for regex, klass in self._compiled if regex.search(name)), None)
            self._cache[name] = found
            return found


R = StepRule

# vLLM 0.32–0.34 on NVIDIA GPUs: kernel names as Kineto records them (demangled C++ names, Triton
# kernels by their function name, cuBLAS/cuBLASLt/NCCL kernels by their library's names).
VLLM_GPU = RuleTable(
    name="vllm 0.32-0.34 gpu",
    engine="vllm",
    versions=("0.32", "0.33", "0.34"),
    device="gpu",
    rules=(
        # Triton fused MoE (fused_moe/fused_moe.py), also its GPTQ/AWQ variant
        R("moe", r"fused_moe_kernel", "def fused_moe_kernel", "fused_moe_kernel"),
        # routing: csrc/moe/topk_softmax_kernels.cu (topkGatingSoftmax, moeSoftmax, moeTopK)
        R(
            "moe",
            r"topkGating|moeSoftmax|moeTopK",
            "_moe_C.topk_softmax(",
            "void vllm::moe::topkGatingSoftmax<8, 128, 4, 16, 32, int, float>(float const*, bool "
            "const*, float*, int, int*, int, int, int)",
        ),
        # routing of DeepSeek-style models: csrc/moe/grouped_topk_kernels.cu
        R("moe", r"grouped_topk", "grouped_topk", "void vllm::moe::grouped_topk_fused_kernel"),
        # token sorting for the fused MoE: csrc/moe/moe_align_sum_kernels.cu
        R(
            "moe",
            r"moe_align_block_size|count_and_sort_expert_tokens",
            "_moe_C.moe_align_block_size(",
            "void vllm::moe::moe_align_block_size_kernel<int>",
        ),
        R("moe", r"moe_sum", "_moe_C.moe_sum(", "void vllm::moe::moe_sum_kernel<c10::BFloat16, 8>"),
        # permute/unpermute around grouped GEMMs (moe_permute_unpermute.py, cutlass_moe.py)
        R(
            "moe",
            r"moe_permute|moe_unpermute|shuffle_rows|shuffleInputRows",
            "shuffle_rows",
            "void vllm::shuffleInputRowsKernel<__nv_bfloat16>",
        ),
        # CUTLASS grouped GEMM of the MoE (cutlass_moe.py): CUTLASS 3 grouped kernels carry
        # GroupProblemShape / PtrArray in their template names
        R(
            "moe",
            r"GroupProblemShape|KernelPtrArray|PtrArray",
            "cutlass_moe_mm(",
            "void cutlass::device_kernel<vllm::cutlass_3x_group_gemm<cutlass::gemm::"
            "GroupProblemShape<cute::tuple<int, int, int>>, KernelPtrArrayTmaWarpSpecialized>>",
        ),
        # DeepGEMM's grouped FP8 GEMM (deep_gemm_moe.py: m_grouped_fp8_gemm_nt_contiguous)
        R(
            "moe",
            r"m_grouped|MGrouped",
            "m_grouped_fp8_gemm_nt_contiguous",
            "void deep_gemm::sm90_fp8_gemm_1d2d_impl<GemmType::MGroupedContiguous>",
        ),
        # FlashInfer / TensorRT-LLM MoE (flashinfer_cutlass_moe.py, trtllm_fp8_moe.py)
        R(
            "moe",
            r"expandInputRows|finalizeMoeRouting|moe_gemm|MoeGemm|trtllm.*moe|fusedMoe",
            "flashinfer_cutlass_fused_moe",
            "void tensorrt_llm::kernels::cutlass_kernels::expandInputRowsKernel",
        ),
        # NCCL: every collective kernel is ncclDevKernel_*/ncclKernel_* (pynccl.py calls
        # ncclAllReduce); a one-rank communicator runs oneRankReduce, without "nccl" in its name
        R(
            "communication",
            r"nccl|oneRankReduce",
            "ncclAllReduce",
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        ),
        # vLLM's custom all-reduce (csrc/custom_all_reduce.cuh, custom_all_reduce.py)
        R(
            "communication",
            r"cross_device_reduce",
            "_C_custom_ar.all_reduce(",
            "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>",
        ),
        # torch symmetric memory (symm_mem.py: two_shot_all_reduce / multimem all-reduce)
        R(
            "communication",
            r"two_shot|one_shot|multimem|symm_mem",
            "two_shot_all_reduce",
            "void c10d::symmetric_memory::two_shot_all_reduce_kernel<__nv_bfloat16, 16>",
        ),
        # FlashInfer's all-reduce (+ RMSNorm) fusion (flashinfer_all_reduce.py)
        R(
            "communication",
            r"allreduce_fusion|allreduce|all_reduce|AllReduce",
            "allreduce_fusion",
            "void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport",
        ),
        # expert-parallel all-to-all (all2all.py, DeepEP)
        R(
            "communication",
            r"deep_ep|intranode::|internode::",
            "deep_ep",
            "void deep_ep::intranode::dispatch<8, 768, 8192>",
        ),
        # MLA decode (flashmla.py, cutlass_mla.py): before FlashAttention, whose names they share
        R(
            "attention",
            r"flash_mla|FlashMLA",
            "flash_mla_with_kvcache",
            "void flash_mla::flash_fwd_splitkv_mla_kernel<cutlass::bfloat16_t, 64>",
        ),
        R("attention", r"cutlass_mla|Sm100FmhaMla", "cutlass_mla_decode", "cutlass_mla_decode"),
        # FlashAttention 2/3 (vllm_flash_attn via flash_attn_varlen_func)
        R(
            "attention",
            r"flash_fwd|flash::|FlashAttn",
            "flash_attn_varlen_func",
            "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>",
        ),
        # FlashInfer attention (v1/attention/backends/flashinfer.py)
        R(
            "attention",
            r"BatchPrefill|BatchDecode|flashinfer::.*Attention|MergeStates|fmha",
            "BatchDecodeWithPagedKVCacheWrapper",
            "void flashinfer::BatchDecodeWithPagedKVCacheKernel<PosEncodingMode::kNone, 2u>",
        ),
        # Triton attention backend (v1/attention/ops/triton_unified_attention.py)
        R(
            "attention",
            r"kernel_unified_attention|_fwd_kernel|paged_attention",
            "def kernel_unified_attention",
            "kernel_unified_attention_2d",
        ),
        # KV-cache writes (csrc/cache_kernels.cu) and rotary embedding (pos_encoding_kernels.cu)
        R(
            "attention",
            r"reshape_and_cache|concat_and_cache",
            "reshape_and_cache_flash",
            "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16>",
        ),
        R(
            "attention",
            r"rotary_embedding",
            "torch.ops._C.rotary_embedding(",
            "void vllm::rotary_embedding_kernel<c10::BFloat16, true>",
        ),
        # csrc/layernorm_kernels.cu (rms_norm_kernel, fused_add_rms_norm_kernel) and its quantising
        # variants
        R(
            "norm",
            r"rms_norm|rmsnorm|RMSNorm",
            "torch.ops._C.rms_norm(",
            "void vllm::rms_norm_kernel<c10::BFloat16, 8, 4>",
        ),
        # csrc/activation_kernels.cu (act_and_mul_kernel behind silu_and_mul)
        R(
            "norm",
            r"act_and_mul|silu_and_mul|gelu_and_mul",
            "_C.silu_and_mul",
            "void vllm::act_and_mul_kernel<c10::BFloat16, &vllm::silu_kernel<c10::BFloat16>, true>",
        ),
        # activation quantisation before FP8 GEMMs (csrc/quantization/, fp8_utils.py)
        R(
            "norm",
            r"per_token_group_quant|segmented_max_reduction",
            "per_token_group_quant_fp8",
            "_per_token_group_quant_fp8",
        ),
        R(
            "norm",
            r"scaled_fp8_quant|per_token_quant",
            "scaled_fp8_quant(",
            "void vllm::dynamic_per_token_scaled_fp8_quant_kernel<c10::BFloat16>",
        ),
        # torch.compile (Inductor) fuses RMSNorm into one Triton kernel whose name lists its ops:
        # rsqrt is RMSNorm's (ir/ops/layernorm.py: torch.rsqrt)
        R(
            "norm",
            r"^triton_\w*fused\w*rsqrt",
            "torch.rsqrt",
            "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0",
        ),
        # the sampler (v1/sample/): FlashInfer's top-k/top-p, the Gumbel trick, log_softmax and
        # argmax, PyTorch's softmax and top-k kernels behind them
        R(
            "sampling",
            r"SamplingFromProb|sampling|gumbel|Gumbel",
            "top_k_top_p_sampling_from",
            "void flashinfer::sampling::TopKTopPSamplingFromProbKernel<1024u>",
        ),
        R(
            "sampling",
            r"SoftMax|softmax|ArgMax|argmax|gatherTopK|bitonicSort|radixSort",
            "log_softmax(",
            "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float>",
        ),
        # cuBLAS / cuBLASLt (nvjet, *_xmma_gemm) behind F.linear, CUTLASS scaled GEMMs
        R(
            "gemm",
            r"nvjet|xmma|gemm|Gemm|gemv|cublas|cutlass|splitKreduce",
            "torch.nn.functional.linear",
            "nvjet_tst_128x64_64x8_1x2_h_bz_coopA_NNT",
        ),
        # copies and fills of PyTorch itself (the runner's host-to-device input copies)
        R(
            "memory",
            r"copy_kernel|CatArrayBatchedCopy|FillFunctor|Memcpy|Memset",
            "non_blocking=True",
            "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>",
        ),
    ),
)

# vLLM's CPU build 0.32: op names of the engine thread (`cpu_op` events). Native RMSNorm and the
# other elementwise aten ops (pow, mean, rsqrt, mul, add, ...) carry no name of their own: the
# engine calls them bare, with no record_function around them, so they stay "other" by name.
VLLM_CPU = RuleTable(
    name="vllm 0.32 cpu",
    engine="vllm",
    versions=("0.32",),
    device="cpu",
    rules=(
        # the CPU fused MoE (fused_moe/experts/cpu_moe.py -> _custom_ops.cpu_fused_moe)
        R("moe", r"^_C::cpu_fused_moe", "torch.ops._C.cpu_fused_moe(", "_C::cpu_fused_moe"),
        # the CPU router (fused_moe/router/cpu_router.py: torch.topk, then torch.logsumexp when
        # the top-k is not renormalised); the sampler's logprobs also call logsumexp, rarely
        R("moe", r"^aten::topk$", "torch.topk(router_logits", "aten::topk"),
        R("moe", r"^aten::logsumexp$", "torch.logsumexp(router_logits", "aten::logsumexp"),
        R(
            "moe",
            r"^_C::(biased_topk_cpu|hash_topk_cpu|grouped_topk)",
            "biased_topk_cpu",
            "_C::biased_topk_cpu",
        ),
        # oneDNN GEMMs (layers/utils.py dispatch_cpu_unquantized_gemm -> ops.onednn_mm)
        R("gemm", r"^_C::onednn_", "torch.ops._C.onednn_mm(", "_C::onednn_mm"),
        # on a CPU with AMX tiles, weights up to 1 MiB go to the sgl kernel instead
        # (check_cpu_sgl_kernel -> ops.weight_packed_linear_cpu)
        R(
            "gemm",
            r"^_C::weight_packed_linear",
            "torch.ops._C.weight_packed_linear(",
            "_C::weight_packed_linear",
        ),
        # small weights fall back to F.linear (layers/utils.py)
        R(
            "gemm",
            r"^aten::(linear|addmm|mm|matmul|bmm)$",
            "torch.nn.functional.linear",
            "aten::addmm",
        ),
        # the attention layer's custom ops (layers/attention/attention.py)
        R(
            "attention",
            r"^vllm::unified_(attention|kv_cache_update)",
            "torch.ops.vllm.unified_attention_with_output",
            "vllm::unified_attention_with_output",
        ),
        # the CPU attention backend (v1/attention/backends/cpu_attn.py)
        R(
            "attention",
            r"^_C::cpu_att",
            "torch.ops._C.cpu_attention_with_kv_cache(",
            "_C::cpu_attention_with_kv_cache",
        ),
        R(
            "attention",
            r"^_C::get_scheduler_metadata",
            "torch.ops._C.get_scheduler_metadata",
            "_C::get_scheduler_metadata",
        ),
        R(
            "attention",
            r"^_C::compute_slot_mapping",
            "torch.ops._C.compute_slot_mapping_kernel_impl(",
            "_C::compute_slot_mapping_kernel_impl",
        ),
        R(
            "attention",
            r"^_C::rotary_embedding",
            "torch.ops._C.rotary_embedding(",
            "_C::rotary_embedding",
        ),
        # shared-memory collectives between TP ranks (device_communicators/cpu_communicator.py)
        R("communication", r"^_C::shm_", "torch.ops._C.shm_allreduce(", "_C::shm_allreduce"),
        # gloo through torch.distributed when the shared-memory path is off
        R("communication", r"^(c10d::|gloo:)", "dist.all_reduce", "c10d::allreduce_"),
        # the CPU build's fused kernels, when the layer uses them (_custom_ops.py)
        R("norm", r"^_C::(fused_add_)?rms_norm", "torch.ops._C.rms_norm(", "_C::rms_norm"),
        R("norm", r"^_C::(silu|gelu)_and_mul", "_C.silu_and_mul", "_C::silu_and_mul"),
        # the sampler (v1/sample/ops/topk_topp_sampler.py)
        R(
            "sampling",
            r"^_C::fused_gumbel_argmax",
            "torch.ops._C.fused_gumbel_argmax(",
            "_C::fused_gumbel_argmax",
        ),
        # PyTorch's own allocations, copies, casts and views: the runner's input preparation and
        # every layer's reshapes (the source is the runner's non-blocking input copies)
        R(
            "memory",
            r"^aten::(copy_|_to_copy|to|clone|contiguous|empty|empty_strided|empty_like|new_empty"
            r"|zeros|zeros_like|fill_|zero_|index_select|cat|slice|view|_unsafe_view|reshape"
            r"|as_strided|select|narrow|split|split_with_sizes|chunk|flatten|unsqueeze|squeeze"
            r"|permute|transpose|t|alias|detach|lift_fresh|expand|movedim|resolve_conj"
            r"|resolve_neg|item|_local_scalar_dense)$",
            "non_blocking=True",
            "aten::copy_",
        ),
    ),
)

# SGLang 0.5.23 on NVIDIA GPUs (sgl-kernel, FlashInfer, Triton kernels). Read from its sources
# (sglang/kernels/ops/, sglang/srt/layers/); no SGLang trace was at hand to check names against.
SGLANG_GPU = RuleTable(
    name="sglang 0.5.23 gpu",
    engine="sglang",
    versions=("0.5.23",),
    device="gpu",
    rules=(
        # Triton fused MoE (kernels/ops/moe/fused_moe_triton_kernels.py)
        R("moe", r"fused_moe_kernel", "def fused_moe_kernel", "fused_moe_kernel"),
        R("moe", r"topkGating|moeSoftmax|moeTopK", "topk_softmax", "void moe::topkGatingSoftmax"),
        R(
            "moe",
            r"moe_align_block_size|count_and_sort_expert_tokens",
            "moe_align_block_size",
            "moe_align_block_size_kernel",
        ),
        R("moe", r"moe_sum_reduce|moe_sum", "moe_sum_reduce", "_moe_sum_reduce_kernel"),
        R(
            "moe",
            r"m_grouped|MGrouped",
            "m_grouped_fp8_gemm_nt_contiguous",
            "deep_gemm::sm90_m_grouped_fp8_gemm",
        ),
        # NCCL (srt/distributed/device_communicators/pynccl.py) and the custom all-reduce
        # (kernels/ops/communication/all_reduce.py)
        R(
            "communication",
            r"nccl|oneRankReduce",
            "ncclAllReduce",
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
        ),
        R(
            "communication",
            r"two_shot|one_shot|multimem|symm_mem",
            "two_shot_all_reduce",
            "two_shot_all_reduce_kernel",
        ),
        R(
            "communication",
            r"cross_device_reduce|allreduce|all_reduce|AllReduce",
            "custom_all_reduce",
            "cross_device_reduce_1stage",
        ),
        R(
            "communication",
            r"deep_ep|intranode::|internode::",
            "deep_ep",
            "deep_ep::intranode::dispatch",
        ),
        # FlashInfer (srt/layers/attention/flashinfer_backend.py), FlashAttention 3
        # (kernels/ops/attention/flash_attention_v3.py), Triton (decode_attention.py)
        R(
            "attention",
            r"BatchPrefill|BatchDecode|MergeStates|flashinfer::.*Attention",
            "BatchDecodeWithPagedKVCacheWrapper",
            "BatchDecodeWithPagedKVCacheKernel",
        ),
        R(
            "attention",
            r"flash_fwd|flash::|FlashAttn",
            "flash_attn_with_kvcache",
            "flash::flash_fwd_kernel",
        ),
        R(
            "attention",
            r"_fwd_kernel|_fwd_grouped_kernel",
            "_fwd_grouped_kernel_stage1",
            "_fwd_grouped_kernel_stage1",
        ),
        R(
            "attention",
            r"reshape_and_cache|store_kvcache|set_kv_buffer",
            "reshape_and_cache_flash",
            "reshape_and_cache_flash_kernel",
        ),
        # kernels/ops/layernorm/norm.py (rmsnorm, fused_add_rmsnorm), activation
        R("norm", r"rms_norm|rmsnorm|RMSNorm", "fused_add_rmsnorm", "FusedAddRMSNormKernel"),
        R("norm", r"act_and_mul|silu_and_mul|gelu_and_mul", "silu_and_mul", "act_and_mul_kernel"),
        R(
            "norm",
            r"per_token_group_quant|scaled_fp8_quant",
            "per_token_group_quant",
            "per_token_group_quant_8bit_kernel",
        ),
        R(
            "norm",
            r"^triton_\w*fused\w*rsqrt",
            "torch.rsqrt",
            "triton_red_fused_add_mean_mul_pow_rsqrt_0",
        ),
        # the sampler (srt/layers/sampler.py)
        R(
            "sampling",
            r"SamplingFromProb|sampling",
            "top_k_top_p_sampling_from_probs",
            "TopKTopPSamplingFromProbKernel",
        ),
        R(
            "sampling",
            r"SoftMax|softmax|ArgMax|argmax|gatherTopK|bitonicSort|radixSort",
            "log_softmax",
            "cunn_SoftMaxForward",
        ),
        R(
            "gemm",
            r"nvjet|xmma|gemm|Gemm|gemv|cublas|cutlass|splitKreduce",
            "torch.nn.functional.linear",
            "nvjet_tst_128x64_64x8_1x2_h_bz_coopA_NNT",
        ),
        R(
            "memory",
            r"copy_kernel|CatArrayBatchedCopy|FillFunctor|Memcpy|Memset",
            "copy_(",
            "direct_copy_kernel_cuda",
        ),
    ),
)

TABLES = (VLLM_GPU, VLLM_CPU, SGLANG_GPU)


def rule_table(engine: str, version: str, device: str) -> RuleTable | None:
    """The table for an engine, its version ("0.33.1": the "0.33" family) and device, None when
    moeops has none."""
    for table in TABLES:
        if table.engine != engine or table.device != device:
            continue
        if any(version == v or version.startswith(v + ".") for v in table.versions):
            return table
    return None
