"""MoE shape of a model from its Hugging Face config.json, per rank for a given tp and ep.

The shape is what the fused-MoE kernel and its config-file name need: experts E, top-k, hidden
size H and the per-rank intermediate size N (the `N=` of vLLM's and SGLang's file names).
"""

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from domain.numbers import is_integer

# First key present wins; DBRX keeps its MoE fields under ffn_config.
EXPERTS_KEYS = (
    "n_routed_experts",
    "num_local_experts",
    "num_experts",
    "ffn_config.moe_num_experts",
)
TOPK_KEYS = ("num_experts_per_tok", "moe_top_k", "experts_per_token", "ffn_config.moe_top_k")
HIDDEN_KEYS = ("hidden_size", "d_model")
# Llama 4's intermediate_size is the experts' size; its dense layers use intermediate_size_mlp.
INTERMEDIATE_KEYS = ("moe_intermediate_size", "intermediate_size", "ffn_config.ffn_hidden_size")
LAYERS_KEYS = ("num_hidden_layers", "n_layers", "num_layers")
# Upper bounds of a model's sizes, each far above every published model (in brackets). At the
# bounds one expert (3·H·I weights, 4 bits at best) still fits one GPU: 3 · 2^17 · 2^17 / 2 bytes
# = 24 GiB of an H200's 141 GB; larger sizes are typos, and would overflow the 32-bit columns.
MAX_EXPERTS = 1 << 14  # 384 (Kimi K2), 512 (Qwen3-Next)
MAX_HIDDEN_SIZE = 1 << 17  # 7,168 (DeepSeek-V3), 16,384 (Llama 3.1 405B)
MAX_INTERMEDIATE_SIZE = 1 << 17  # 2,048 (DeepSeek-V3), 16,384 (Mixtral 8x22B)
MAX_LAYERS = 1 << 12  # 61 (DeepSeek-V3), 126 (Llama 3.1 405B)
MAX_VOCAB_SIZE = 1 << 24  # 163,840 (Kimi K2), 262,144 (Gemma 3)
# The longest names a model's row keeps (its architecture and model_type columns): class names
# such as "KimiK25ForConditionalGeneration" (31) and types such as "qwen3_moe" are far shorter.
MAX_ARCHITECTURE_CHARS = 200
MAX_MODEL_TYPE_CHARS = 100


class MoEConfigError(ValueError):
    """A config.json that yields no MoE shape; the message is one line naming the reason."""


@dataclass(frozen=True)
class MoEParams:
    """One MoE layer's shape as one rank of a tp × ep deployment sees it.

    num_experts is the model's total E, experts_per_rank = E / ep; hidden_size H and
    moe_intermediate_size I are the model's; N is the per-rank intermediate size after
    silu-and-mul (w1 is [experts_per_rank, 2N, H], w2 [experts_per_rank, H, N]).
    block_shape is the weight-quantization block [block_n, block_k] or None.
    SGLang by default fuses DeepSeek-style shared experts into the routed ones (its tuner then
    names files E+1); that is a serving option, not part of the model's shape here.
    """

    architecture: str | None
    model_type: str | None
    num_experts: int
    experts_per_rank: int
    topk: int
    hidden_size: int
    moe_intermediate_size: int
    N: int
    num_layers: int | None
    num_moe_layers: int | None
    quantization: str | None
    block_shape: tuple[int, int] | None

    def as_dict(self) -> dict:
        """The shape as JSON-ready values (block_shape as a list)."""
        out = asdict(self)
        out["block_shape"] = list(self.block_shape) if self.block_shape else None
        return out


def moe_params(
    config: dict | str | bytes,
    tp: int = 1,
    ep: int = 1,
    quant_config: dict | str | bytes | None = None,
) -> MoEParams:
    """Read the MoE shape from a config.json (a dict, or its JSON text) for tp and ep ranks.

    quant_config is a separate hf_quant_config.json (ModelOpt exports); when given (not empty)
    it names the quantization instead of config.json's quantization_config.
    Raises MoEConfigError with a one-line reason when the config is not JSON, not an MoE
    model, lacks a size, or when tp/ep do not divide its sizes.
    """
    config = _as_object(config, "config.json")
    text_config = config.get("text_config")
    # Multimodal wrappers (Llama 4, Kimi K2.5) nest the language model's fields.
    sections = [text_config, config] if isinstance(text_config, dict) else [config]

    experts_key, num_experts = _first(sections, EXPERTS_KEYS)
    if experts_key is None:
        raise MoEConfigError(
            "not a Mixture-of-Experts config: none of " + ", ".join(EXPERTS_KEYS) + " is set"
        )
    if isinstance(num_experts, int) and num_experts <= 1:
        raise MoEConfigError(f"not a Mixture-of-Experts config: {experts_key} is {num_experts}")
    num_experts = _positive_int(experts_key, num_experts, MAX_EXPERTS)
    topk = _required(sections, TOPK_KEYS, "top-k", MAX_EXPERTS)
    if topk > num_experts:
        raise MoEConfigError(f"top-k {topk} is larger than the {num_experts} experts")
    hidden_size = _required(sections, HIDDEN_KEYS, "hidden size", MAX_HIDDEN_SIZE)
    intermediate = _required(
        sections, INTERMEDIATE_KEYS, "MoE intermediate size", MAX_INTERMEDIATE_SIZE
    )

    experts_per_rank, n = _shard(num_experts, intermediate, tp, ep)
    num_layers = _optional_int(sections, LAYERS_KEYS, MAX_LAYERS)
    if quant_config:
        quantization, block_shape = _quantization(_as_object(quant_config, "quant config"))
    else:
        quantization, block_shape = _quantization_of_config(sections)

    _vocab_size(sections)
    return MoEParams(
        architecture=_architecture(config.get("architectures")),
        model_type=_name("model_type", config.get("model_type"), MAX_MODEL_TYPE_CHARS),
        num_experts=num_experts,
        experts_per_rank=experts_per_rank,
        topk=topk,
        hidden_size=hidden_size,
        moe_intermediate_size=intermediate,
        N=n,
        num_layers=num_layers,
        num_moe_layers=_num_moe_layers(sections, num_layers),
        quantization=quantization,
        block_shape=block_shape,
    )


def vocab_size(config: dict | str | bytes) -> int | None:
    """The model's vocabulary size from its config.json (text_config first), or None.

    A prompt token id must stay below it: engines answer 400 to an id outside the vocabulary.
    """
    try:
        config = _as_object(config, "config.json")
    except MoEConfigError:
        return None
    text_config = config.get("text_config")
    sections = [text_config, config] if isinstance(text_config, dict) else [config]
    try:
        return _vocab_size(sections)
    except MoEConfigError:
        return None


def _vocab_size(sections: list[dict]) -> int | None:
    key, value = _first(sections, ("vocab_size", "padded_vocab_size"))
    if key is None:
        return None
    if not is_integer(value) or not 2 <= value <= MAX_VOCAB_SIZE:
        raise MoEConfigError(
            f"{key} must be an integer from 2 to {MAX_VOCAB_SIZE:,}, got {json.dumps(value)}"
        )
    return value


def _architecture(architectures) -> str | None:
    """The first of config.json's `architectures` (class names), or None when there is none."""
    if architectures is None:
        return None
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise MoEConfigError(
            f"architectures must be a list of class names, got {json.dumps(architectures)}"
        )
    if not architectures:
        return None
    return _name("architectures[0]", architectures[0], MAX_ARCHITECTURE_CHARS)


def _name(key: str, value, max_chars: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise MoEConfigError(f"{key} must be a string, got {json.dumps(value)}")
    if len(value) > max_chars:
        raise MoEConfigError(f"{key} must be at most {max_chars} characters, got {len(value)}")
    return value


def _shard(num_experts: int, intermediate: int, tp: int, ep: int) -> tuple[int, int]:
    """Experts per rank and per-rank intermediate size N for tp × ep.

    SGLang's tuner (benchmark/kernels/fused_moe_triton/common_utils.py,
    calculate_shard_intermediate_size) splits the experts' intermediate size over the MoE
    tensor-parallel size tp / ep and the experts over ep; vLLM's benchmark_moe.py with
    --enable-expert-parallel is the case ep = tp (E / tp experts, N = I unsplit). When ep spans
    more ranks than tp (EP across data-parallel ranks) the MoE layer is not tensor-split: N = I.
    """
    for name, value in (("tp", tp), ("ep", ep)):
        if not is_integer(value) or value < 1:
            raise MoEConfigError(f"{name} must be a positive integer, got {value!r}")
    if num_experts % ep:
        raise MoEConfigError(f"num_experts {num_experts} is not divisible by ep {ep}")
    if tp % ep == 0:
        moe_tp = tp // ep
    elif ep % tp == 0:
        moe_tp = 1
    else:
        raise MoEConfigError(f"tp {tp} and ep {ep}: one must be a multiple of the other")
    if intermediate % moe_tp:
        raise MoEConfigError(
            f"moe_intermediate_size {intermediate} is not divisible by the MoE tensor-parallel "
            f"size {moe_tp} (tp {tp} / ep {ep})"
        )
    return num_experts // ep, intermediate // moe_tp


def _num_moe_layers(sections: list[dict], num_layers: int | None) -> int | None:
    """How many of the decoder layers hold routed experts (MTP layers not counted)."""
    if num_layers is None:
        return None
    _, moe_layers = _first(sections, ("moe_layers",))
    if isinstance(moe_layers, list):
        return min(len(moe_layers), num_layers)
    _, step = _first(sections, ("interleave_moe_layer_step",))
    if is_integer(step) and step >= 1:
        # Llama 4: layers step-1, 2·step-1, … are MoE.
        return num_layers // step
    _, first_dense = _first(sections, ("first_k_dense_replace",))
    _, freq = _first(sections, ("moe_layer_freq",))
    if is_integer(first_dense):
        # DeepSeek/GLM/Kimi: layer i is MoE when i >= first_k_dense_replace and i % freq == 0.
        freq = freq if is_integer(freq) and freq >= 1 else 1
        return len(range(-(-max(first_dense, 0) // freq) * freq, num_layers, freq))
    _, sparse_step = _first(sections, ("decoder_sparse_step",))
    if is_integer(sparse_step) and sparse_step >= 1:
        # Qwen2/3-MoE: layer i is MoE when (i + 1) % step == 0 and i is not in mlp_only_layers.
        _, dense = _first(sections, ("mlp_only_layers",))
        dense = {i for i in dense if is_integer(i)} if isinstance(dense, list) else set()
        dense_moe = sum(1 for i in dense if 0 <= i < num_layers and (i + 1) % sparse_step == 0)
        return num_layers // sparse_step - dense_moe
    return num_layers


def _quantization_of_config(sections: list[dict]) -> tuple[str | None, tuple[int, int] | None]:
    for section in reversed(sections):
        quantization_config = section.get("quantization_config")
        if isinstance(quantization_config, dict):
            return _quantization(quantization_config)
    return None, None


def _quantization(qc: dict) -> tuple[str | None, tuple[int, int] | None]:
    """Name the weight quantization ("fp8", "nvfp4", "mxfp4", …) and its block shape."""
    if isinstance(qc.get("quantization"), dict):
        # hf_quant_config.json (ModelOpt): {"producer": …, "quantization": {"quant_algo": …}}
        qc = qc["quantization"]
    method = qc.get("quant_method")
    algo = qc.get("quant_algo")
    if method == "compressed-tensors" or (method is None and "config_groups" in qc):
        return _compressed_tensors(qc)
    if isinstance(algo, str) and method in (None, "modelopt"):
        return algo.lower(), None
    if isinstance(method, str):
        return method.lower(), _block("weight_block_size", qc.get("weight_block_size"))
    return None, None


def _compressed_tensors(qc: dict) -> tuple[str | None, tuple[int, int] | None]:
    groups = qc.get("config_groups")
    weights = next(iter(groups.values()), {}).get("weights") if isinstance(groups, dict) else None
    if not isinstance(weights, dict):
        return "compressed-tensors", None
    bits, kind, group = weights.get("num_bits"), weights.get("type"), weights.get("group_size")
    block = _block("block_structure", weights.get("block_structure"))
    if kind == "float" and bits == 8:
        return "fp8", block
    if kind == "float" and bits == 4:
        # NVFP4 scales groups of 16 elements, MXFP4 groups of 32.
        return {16: "nvfp4", 32: "mxfp4"}.get(group, "fp4"), None
    if kind == "int" and bits in (4, 8):
        return f"int{bits}", block
    return "compressed-tensors", block


def _block(key: str, value) -> tuple[int, int] | None:
    """[block_n, block_k] of a weight block size (a list, or text such as "128x128"), None when
    not given; MoEConfigError naming `key` for anything else (the kernel divides by both)."""
    if value is None:
        return None
    sizes = value.split("x") if isinstance(value, str) else value
    if isinstance(sizes, list | tuple) and len(sizes) == 2:
        if isinstance(value, str):
            sizes = [int(v) if v.isascii() and v.isdigit() else None for v in sizes]
        if all(is_integer(v) and 0 < v <= MAX_HIDDEN_SIZE for v in sizes):
            return sizes[0], sizes[1]
    raise MoEConfigError(
        f"{key} must be two sizes [block_n, block_k], each from 1 to {MAX_HIDDEN_SIZE:,}, "
        f"got {json.dumps(value)}"
    )


def _lookup(section: dict, dotted: str):
    value = section
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _first(sections: list[dict], keys: tuple[str, ...]):
    """(key, value) of the first key set in any section, text_config before the top level."""
    for section in sections:
        for key in keys:
            value = _lookup(section, key)
            if value is not None:
                return key, value
    return None, None


def _required(sections: list[dict], keys: tuple[str, ...], what: str, maximum: int) -> int:
    key, value = _first(sections, keys)
    if key is None:
        raise MoEConfigError(f"missing {what}: none of " + ", ".join(keys) + " is set")
    return _positive_int(key, value, maximum)


def _optional_int(sections: list[dict], keys: tuple[str, ...], maximum: int) -> int | None:
    key, value = _first(sections, keys)
    return None if key is None else _positive_int(key, value, maximum)


def _positive_int(key: str, value, maximum: int) -> int:
    if not is_integer(value) or value < 1:
        raise MoEConfigError(f"{key} must be a positive integer, got {json.dumps(value)}")
    if value > maximum:
        raise MoEConfigError(
            f"{key} must be at most {maximum:,} (no model that runs on GPUs comes near), "
            f"got {value}"
        )
    return value


def _as_object(value: dict | str | bytes, what: str) -> dict:
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise MoEConfigError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise MoEConfigError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `python -m tuning params`."""
    parser.add_argument("config", metavar="CONFIG_JSON", help="the model's config.json")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel size (default 1)")
    parser.add_argument(
        "--quant-config", metavar="FILE", help="a separate hf_quant_config.json (ModelOpt)"
    )


def run(args: argparse.Namespace) -> int:
    """Print the MoE shape as one JSON object; on error one `error: …` line, exit status 2."""
    try:
        config = _read_json(args.config)
        quant_config = _read_json(args.quant_config) if args.quant_config else None
        params = moe_params(config, tp=args.tp, ep=args.ep, quant_config=quant_config)
    except MoEConfigError as exc:
        print("error: " + " ".join(str(exc).split()), file=sys.stderr)
        return 2
    print(json.dumps(params.as_dict(), indent=2))
    return 0


def _read_json(path: str):
    try:
        return json.loads(Path(path).read_bytes())
    except OSError as exc:
        raise MoEConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise MoEConfigError(f"{path} is not valid JSON: {exc}") from None
