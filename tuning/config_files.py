"""The fused-MoE kernel-config files vLLM and SGLang load: their names and their content.

Name: `E={E},N={N},device_name={dev}[,dtype={dtype}][,block_shape=[bn,bk]].json`, as
vLLM's `get_config_file_name` (vllm/model_executor/layers/fused_moe/fused_moe.py) and SGLang's
(python/sglang/srt/layers/moe/fused_moe_triton/fused_moe_triton_config.py) build it. SGLang
writes the block shape as `[128, 128]`, may add `,per_channel_quant=True` and a `_down` suffix
(its separate down-projection config), and looks the file up under `configs/triton_X_Y_Z/`.
vLLM 0.34 reads a `_down` file too, on its sorted-A path for fp8 block [128, 128] only
(`get_moe_configs(..., down_moe=True)`: the up file's name ending `_down.json`, no space in the
block shape), whose entry may be only `{"USE_TMA": false}`: that path off at that batch size.
Content: `{"triton_version": "3.6.0", "1": {"BLOCK_SIZE_M": 16, …}, …}`, keys are batch sizes M.
"""

import argparse
import importlib.metadata
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from domain.numbers import is_integer
from tuning.moe_params import MAX_EXPERTS, MAX_HIDDEN_SIZE, MAX_INTERMEDIATE_SIZE

# The batch sizes both engines' tuners sweep by default (benchmark_moe.py, common_utils.py).
TUNED_BATCH_SIZES = (
    1,
    2,
    4,
    8,
    16,
    24,
    32,
    48,
    64,
    96,
    128,
    256,
    512,
    1024,
    1536,
    2048,
    3072,
    4096,
)

STYLES = ("vllm", "sglang")
# Dtype parts the engines' get_config_dtype_str produce; bf16/fp16 have none.
KNOWN_DTYPES = ("fp8_w8a8", "int8_w8a8", "int8_w8a16", "int4_w4a16", "mxfp4_w4a4", "float32")
UNQUANTIZED_DTYPES = ("bf16", "bfloat16", "fp16", "float16", "half", "auto")

REQUIRED_FIELDS = (
    "BLOCK_SIZE_M",
    "BLOCK_SIZE_N",
    "BLOCK_SIZE_K",
    "GROUP_SIZE_M",
    "num_warps",
    "num_stages",
)
# Triton's launch defaults, which an engine runs an entry naming neither with (a few of SGLang's
# shipped files have such entries).
TRITON_LAUNCH_DEFAULTS = {"num_warps": 4, "num_stages": 3}
# Extra fields the engines' tuners write: ROCm's waves_per_eu, matrix_instr_nonkdim and kpack,
# vLLM's SPLIT_K, USE_TMA (SGLang's down-projection configs, vLLM 0.34's TMA read of B); in
# their sort_config order.
OPTIONAL_FIELDS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack", "SPLIT_K", "USE_TMA")
NUM_WARPS = (1, 2, 4, 8, 16)
NUM_STAGES = range(1, 9)

_NAME = re.compile(
    r"E=(?P<E>\d+),N=(?P<N>\d+),device_name=(?P<device>[^,]+?)"
    r"(?:,dtype=(?P<dtype>\w+))?"
    r"(?:,block_shape=\[(?P<bn>\d+),(?P<space> ?)(?P<bk>\d+)\])?"
    r"(?P<per_channel>,per_channel_quant=True)?"
    r"(?P<down>_down)?\.json"
)
_TRITON_FOLDER = re.compile(r"triton_(\w+)")
# What a file may name, as the model's sizes bound them (tuning.moe_params): E experts per rank,
# N the per-rank intermediate size, block sizes as the weights' block shape.
SHAPE_BOUNDS = {"E": MAX_EXPERTS, "N": MAX_INTERMEDIATE_SIZE, "block_shape": MAX_HIDDEN_SIZE}


class ConfigFileError(ValueError):
    """A kernel-config file name that is not one the engines produce."""


class ConfigEntryError(ValueError):
    """Invalid kernel-config content; `errors` lists every problem, each naming its batch size."""

    def __init__(self, errors: list[str]):
        super().__init__("; ".join(errors))
        self.errors = errors


@dataclass(frozen=True)
class ConfigFileName:
    """The parts of a kernel-config file name.

    style is "vllm" or "sglang" when the name shows which engine wrote it (the block-shape
    spacing, SGLang-only parts), None when both engines would write this exact name.
    triton_version comes from an SGLang `triton_X_Y_Z/` folder in front of the name.
    """

    E: int
    N: int
    device_name: str
    dtype: str | None
    block_shape: tuple[int, int] | None
    style: str | None
    per_channel_quant: bool = False
    down_moe: bool = False
    triton_version: str | None = None

    @property
    def name(self) -> str:
        """The file name again, in the detected style (vLLM's when either fits)."""
        return config_file_name(
            self.E,
            self.N,
            self.device_name,
            self.dtype,
            self.block_shape,
            style=self.style or "vllm",
            per_channel_quant=self.per_channel_quant,
            down_moe=self.down_moe,
        )


def shape_problems(E, N, block_shape=None) -> dict[str, str]:
    """{"E" | "N" | "block_shape": why} for each part no engine names a file with; {} when all
    fit. The one bound of a config's shape, whether it comes from a file name or from fields."""
    problems = {}
    for label, value in (("E", E), ("N", N)):
        bound = SHAPE_BOUNDS[label]
        if not is_integer(value) or not 1 <= value <= bound:
            problems[label] = f"must be an integer from 1 to {bound:,}, got {_show(value)}"
    if block_shape is not None:
        bound = SHAPE_BOUNDS["block_shape"]
        sizes = list(block_shape) if isinstance(block_shape, list | tuple) else None
        if not sizes or len(sizes) != 2 or not all(_size(v, bound) for v in sizes):
            problems["block_shape"] = (
                f"must be [block_n, block_k], each from 1 to {bound:,}, got {_show(block_shape)}"
            )
    return problems


def _said(problems: dict[str, str]) -> str:
    return "; ".join(f"{label} {why}" for label, why in problems.items())


def _size(value, bound: int) -> bool:
    return is_integer(value) and 1 <= value <= bound


def file_device_name(device_name: str) -> str:
    """The device part of an engine file name: the NVML name with spaces → "_"."""
    return device_name.strip().replace(" ", "_")


def nvml_device_name(file_device: str) -> str:
    """The NVML name back from a file name's device part (NVML names have no "_")."""
    return file_device.replace("_", " ")


def config_file_name(
    E: int,
    N: int,
    device_name: str,
    dtype: str | None = None,
    block_shape: Sequence[int] | None = None,
    style: str = "vllm",
    *,
    per_channel_quant: bool = False,
    down_moe: bool = False,
) -> str:
    """The file name the engine looks up for E experts and per-rank intermediate size N.

    device_name is the NVML/torch name ("NVIDIA H200"); spaces become `_`, and vLLM files
    every H200 variant (e.g. "NVIDIA H200 NVL") under NVIDIA_H200. dtype is the engine's dtype
    string ("fp8_w8a8", "int8_w8a16", …); None and bf16/fp16 add no dtype part. block_shape is
    [block_n, block_k] (omitted when absent or containing 0, as the engines do).
    per_channel_quant exists only in SGLang's names; down_moe: the `_down` file of GEMM 2's
    own configs (SGLang's; vLLM 0.34's on its sorted-A path, for a block shape only).
    """
    if style not in STYLES:
        raise ConfigFileError(f"style must be one of {', '.join(STYLES)}, got {style!r}")
    problems = shape_problems(E, N)
    if problems:
        raise ConfigFileError(_said(problems))
    if style == "vllm" and per_channel_quant:
        raise ConfigFileError("per_channel_quant is a part of SGLang names only")
    if style == "vllm" and down_moe and not (block_shape and all(block_shape)):
        raise ConfigFileError("vLLM reads a _down file for a block-quantised shape only")
    device = file_device_name(device_name)
    if not device or "," in device or "/" in device:
        raise ConfigFileError(f"not a device name: {device_name!r}")
    if style == "vllm" and "H200" in device.split("_"):
        device = "NVIDIA_H200"
    name = f"E={E},N={N},device_name={device}"
    if dtype is not None and dtype not in UNQUANTIZED_DTYPES:
        if not re.fullmatch(r"\w+", dtype):
            raise ConfigFileError(f"not a dtype part: {dtype!r}")
        name += f",dtype={dtype}"
    if block_shape is not None and len(block_shape) != 2:
        raise ConfigFileError(f"block_shape must be [block_n, block_k], got {block_shape!r}")
    if block_shape and all(block_shape):
        bn, bk = (int(v) for v in block_shape)
        name += f",block_shape=[{bn},{bk}]" if style == "vllm" else f",block_shape=[{bn}, {bk}]"
    if per_channel_quant:
        name += ",per_channel_quant=True"
    return name + ("_down" if down_moe else "") + ".json"


def kernel_dtype(quantization: str) -> str | None:
    """The kernel-config dtype for a weight quantization, or None when none applies (FP4)."""
    quantization = (quantization or "").lower()
    if quantization in ("", "bf16", "bfloat16", "auto", "none"):
        return "bf16"
    if quantization in ("fp16", "float16", "half"):
        return "fp16"
    if "fp8" in quantization:
        return "fp8_w8a8"
    return None


def triton_config_unread(quantization: str) -> str | None:
    """Why the engines read no fused-MoE Triton config for MoE weights of this quantization
    (FP4: nvfp4, mxfp4), or None where a tuned file is what they load."""
    quantization = (quantization or "").lower()
    if "fp4" not in quantization:
        return None
    return (
        f"{quantization} experts run on SGLang's and vLLM's FP4 MoE kernels (CUTLASS, "
        "FlashInfer, TRT-LLM), which read no Triton config: a tuned file would not be used."
    )


def parse_config_file_name(name: str) -> ConfigFileName:
    """Split a kernel-config file name (optionally `triton_X_Y_Z/` in front) into its parts."""
    path = PurePosixPath(name.replace("\\", "/"))
    match = _NAME.fullmatch(path.name)
    if match is None:
        raise ConfigFileError(
            f"{path.name!r} is not a fused-MoE config file name: expected "
            "E={E},N={N},device_name={device}[,dtype={dtype}][,block_shape=[{n},{k}]].json"
        )
    block_shape = None
    if match["bn"] is not None:
        block_shape = (int(match["bn"]), int(match["bk"]))
    E, N = int(match["E"]), int(match["N"])
    problems = shape_problems(E, N, block_shape)
    if problems:
        raise ConfigFileError(f"{path.name!r}: {_said(problems)}")
    device = match["device"]
    style = None
    # vLLM files every H200 variant as NVIDIA_H200, so another H200 name is SGLang's.
    h200_variant = "H200" in device.split("_") and device != "NVIDIA_H200"
    # vLLM's _down files are for a block shape only
    sglang_down = match["down"] and block_shape is None
    if match["per_channel"] or sglang_down or match["space"] or h200_variant:
        style = "sglang"
    elif block_shape is not None:
        style = "vllm"
    folder = _TRITON_FOLDER.fullmatch(path.parent.name)
    return ConfigFileName(
        E=E,
        N=N,
        device_name=device,
        dtype=match["dtype"],
        block_shape=block_shape,
        style=style,
        per_channel_quant=bool(match["per_channel"]),
        down_moe=bool(match["down"]),
        triton_version=folder[1].replace("_", ".") if folder else None,
    )


def sglang_folder(triton_version: str) -> str:
    """SGLang's per-Triton-version config folder: "3.7.1" → "triton_3_7_1"."""
    if not triton_version or not re.fullmatch(r"[\w.+-]+", triton_version):
        raise ConfigFileError(f"not a Triton version: {triton_version!r}")
    return f"triton_{triton_version.replace('.', '_')}"


def config_file_relpath(file_name: str, style: str, triton_version: str | None = None) -> str:
    """Where the engine looks for the file, relative to its configs folder.

    vLLM keeps every file in one folder (its configs/ or VLLM_TUNED_CONFIG_FOLDER); SGLang
    looks under configs/triton_X_Y_Z/ for the running Triton, so it needs triton_version.
    """
    if style == "vllm":
        return file_name
    if style != "sglang":
        raise ConfigFileError(f"style must be one of {', '.join(STYLES)}, got {style!r}")
    if triton_version is None:
        raise ConfigFileError("SGLang files live in a per-Triton-version folder: give the version")
    return f"{sglang_folder(triton_version)}/{file_name}"


# Where each engine looks for tuned fused-MoE config files (docs/engines.md): first a folder
# named by its environment variable, then the folder shipped in its package. One statement for
# the web tier (the variable a launch recipe sets), the worker's reader (the file an engine would
# load) and its writer (where an engine action puts a file).
CONFIG_ENV = {"vllm": "VLLM_TUNED_CONFIG_FOLDER", "sglang": "SGLANG_MOE_CONFIG_DIR"}
PACKAGE_CONFIGS = {
    "vllm": "model_executor/layers/fused_moe/configs",
    "sglang": "srt/layers/moe/moe_runner/triton_utils/configs",
}


def configs_root(engine: str, env_folder) -> Path:
    """The folder config_file_relpath's paths start from when the engine's variable
    (CONFIG_ENV) names env_folder: vLLM reads env_folder itself, SGLang env_folder/configs."""
    return Path(env_folder) / "configs" if engine == "sglang" else Path(env_folder)


def search_path(
    engine: str,
    file_name: str,
    *,
    env_folder: str | None,
    package_dir: str | None,
    triton_version: str | None,
) -> list[tuple[str, Path, bool]]:
    """(which folder, path, shipped with the engine) of each place `engine` looks for
    file_name, in the order it looks.

    vLLM: env_folder (its VLLM_TUNED_CONFIG_FOLDER), then its package's configs folder. SGLang:
    under env_folder/configs (its SGLANG_MOE_CONFIG_DIR), else its package's configs folder, the
    triton_<its Triton> folder, then the other Triton folders there, newest first; SGLang's
    path needs triton_version (none: nothing is searched). package_dir: the installed engine
    package (None when unknown). Raises ConfigFileError for another engine.
    """
    if engine not in CONFIG_ENV:
        raise ConfigFileError(f"style must be one of {', '.join(STYLES)}, got {engine!r}")
    if engine == "vllm":
        found = []
        if env_folder:
            found.append((CONFIG_ENV["vllm"], configs_root("vllm", env_folder) / file_name, False))
        if package_dir:
            shipped = Path(package_dir) / PACKAGE_CONFIGS["vllm"] / file_name
            found.append(("vLLM's own configs folder", shipped, True))
        return found
    if env_folder:
        configs, where = configs_root("sglang", env_folder), CONFIG_ENV["sglang"]
    elif package_dir:
        configs = Path(package_dir) / PACKAGE_CONFIGS["sglang"]
        where = "SGLang's own configs folder"
    else:
        return []
    if not triton_version:
        return []
    own = sglang_folder(triton_version)
    others = sorted(
        (p for p in configs.glob("triton_*") if p.name != own),
        key=lambda p: [int(x) if x.isdigit() else 0 for x in p.name[7:].split("_")],
        reverse=True,
    )
    shipped = not env_folder
    found = [(f"{where}, {own}", configs / own / file_name, shipped)]
    found.extend((f"{where}, {p.name} (fallback)", p / file_name, shipped) for p in others)
    return found


# The one entry vLLM 0.34's `_down` file may hold without a tile: its sorted-A path off there.
PATH_OFF = {"USE_TMA": False}


def validate_entries(obj, *, vllm_down: bool = False) -> dict[int, dict]:
    """The per-batch-size entries of a config file's JSON object, checked.

    Keys are batch sizes M (positive integers, as strings in JSON); a `triton_version` key is
    skipped (read it with `triton_version_of`). vllm_down: vLLM's `_down` file, whose entry may
    be only PATH_OFF. Returns {M: entry} sorted by M.
    Raises ConfigEntryError listing every problem, e.g.
    "batch size 64: BLOCK_SIZE_N must be a power of two, got 48".
    """
    if not isinstance(obj, dict):
        raise ConfigEntryError(
            [f"a kernel config must be a JSON object of batch sizes, got {_kind(obj)}"]
        )
    errors: list[str] = []
    entries: dict[int, dict] = {}
    for key, entry in obj.items():
        if key == "triton_version":
            continue
        batch_size = _batch_size(key)
        if batch_size is None:
            errors.append(f"batch size {_show(key)}: not a positive integer")
            continue
        if batch_size in entries:
            errors.append(f"batch size {batch_size}: given twice")
            continue
        entries[batch_size] = entry
    if not entries and not errors:
        errors.append("no batch-size entries")
    for batch_size in sorted(entries):
        if vllm_down and entries[batch_size] == PATH_OFF:
            continue
        errors += [f"batch size {batch_size}: {e}" for e in _entry_errors(entries[batch_size])]
    if errors:
        raise ConfigEntryError(errors)
    return {m: dict(entries[m]) for m in sorted(entries)}


def triton_version_of(obj) -> str | None:
    """The `triton_version` recorded in a config file's JSON object, None when absent."""
    version = obj.get("triton_version") if isinstance(obj, dict) else None
    if version is not None and not isinstance(version, str):
        raise ConfigEntryError([f"triton_version must be a string, got {_show(version)}"])
    return version


def dumps_config(
    entries: dict[int, dict], triton_version: str | None, *, vllm_down: bool = False
) -> str:
    """The exact text the engines' tuners write for these entries.

    vLLM's benchmark_moe.py save_configs: json.dump({"triton_version": …, **configs},
    indent=4) + "\\n", batch sizes ascending, fields in its sort_config order. SGLang's tuner
    writes no triton_version (its loader int()s every key; the folder names the version):
    pass None for an SGLang file. vllm_down: vLLM's `_down` file (validate_entries).
    """
    entries = validate_entries(entries, vllm_down=vllm_down)
    body: dict = {} if triton_version is None else {"triton_version": triton_version}
    for batch_size, entry in entries.items():
        order = REQUIRED_FIELDS + OPTIONAL_FIELDS
        body[str(batch_size)] = {field: entry[field] for field in order if field in entry}
    return json.dumps(body, indent=4) + "\n"


def loads_config(
    text: str | bytes, *, vllm_down: bool = False
) -> tuple[str | None, dict[int, dict]]:
    """(triton_version or None, {M: entry}) of a config file's text; raises ConfigEntryError.
    vllm_down: vLLM's `_down` file (validate_entries)."""
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise ConfigEntryError([f"not valid JSON: {exc}"]) from None
    except RecursionError:
        raise ConfigEntryError(["not a config: nested too deep to read"]) from None
    return triton_version_of(obj), validate_entries(obj, vllm_down=vllm_down)


def entry_for_batch(entries: dict[int, dict], M: int) -> dict:
    """The entry the engine runs for batch size M: the nearest key, the smaller one on a tie.

    Both engines take `configs[min(configs.keys(), key=lambda x: abs(x - M))]` over keys in
    file order, which is ascending in the files their tuners write.
    """
    if not entries:
        raise ConfigEntryError(["no batch-size entries"])
    return entries[min(sorted(entries), key=lambda m: abs(m - M))]


def _entry_errors(entry) -> list[str]:
    if not isinstance(entry, dict):
        return [f"entry must be an object of kernel parameters, got {_kind(entry)}"]
    errors = [f"{field} is missing" for field in REQUIRED_FIELDS if field not in entry]
    known = REQUIRED_FIELDS + OPTIONAL_FIELDS
    for field, value in entry.items():
        if field not in known:
            errors.append(f"unknown field {_show(field)} (allowed: {', '.join(known)})")
        elif field == "USE_TMA":
            if not isinstance(value, bool):
                errors.append(f"USE_TMA must be true or false, got {_show(value)}")
        elif not is_integer(value):
            errors.append(f"{field} must be an integer, got {_show(value)}")
        else:
            problem = _value_problem(field, value)
            if problem:
                errors.append(f"{field} must be {problem}, got {value}")
    return errors


def _value_problem(field: str, value: int) -> str | None:
    if field.startswith("BLOCK_SIZE_"):
        return None if value >= 1 and value & (value - 1) == 0 else "a power of two"
    if field in ("GROUP_SIZE_M", "SPLIT_K"):
        return None if value >= 1 else "at least 1"
    if field == "num_warps":
        return None if value in NUM_WARPS else "one of " + ", ".join(map(str, NUM_WARPS))
    if field == "num_stages":
        return None if value in NUM_STAGES else "between 1 and 8"
    if field == "waves_per_eu":
        return None if value >= 0 else "at least 0"
    if field == "matrix_instr_nonkdim":
        return None if value in (16, 32) else "16 or 32"
    if field == "kpack":
        return None if value in (1, 2) else "1 or 2"
    return None


def _batch_size(key) -> int | None:
    if isinstance(key, bool):
        return None
    if isinstance(key, int):
        return key if key >= 1 else None
    if isinstance(key, str) and key.isascii() and key.isdigit() and int(key) >= 1:
        return int(key)
    return None


def _show(value) -> str:
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


def _kind(value) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), f"a {type(value).__name__}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `python -m tuning filename`."""
    parser.description = (
        "Print the kernel-config file name the engine loads. With --style sglang the name is "
        "printed under its triton_X_Y_Z/ folder (SGLang looks the file up there, relative to "
        "its configs folder); the version is --triton-version, else the installed Triton's."
    )
    parser.add_argument("--E", type=int, required=True, help="number of experts (per rank)")
    parser.add_argument(
        "--N", type=int, required=True, help="per-rank intermediate size after silu-and-mul"
    )
    parser.add_argument("--device", required=True, help='NVML device name, e.g. "NVIDIA H200"')
    parser.add_argument("--dtype", help="fp8_w8a8, int8_w8a16, … (none for bf16/fp16)")
    parser.add_argument("--block-shape", help="weight block shape, e.g. 128,128")
    parser.add_argument("--style", choices=STYLES, default="vllm", help="engine (default vllm)")
    parser.add_argument("--triton-version", help="SGLang folder version (default: installed)")
    parser.add_argument(
        "--per-channel-quant", action="store_true", help="SGLang per-channel quant file"
    )
    parser.add_argument(
        "--down",
        action="store_true",
        help="the down-projection (_down) file: SGLang's, or vLLM 0.34's sorted-A one",
    )


def run(args: argparse.Namespace) -> int:
    """Print the file name (SGLang: folder/name); on error one `error: …` line, status 2."""
    try:
        block_shape = _parse_block_shape(args.block_shape) if args.block_shape else None
        name = config_file_name(
            args.E,
            args.N,
            args.device,
            args.dtype,
            block_shape,
            style=args.style,
            per_channel_quant=args.per_channel_quant,
            down_moe=args.down,
        )
        if args.style == "sglang":
            name = config_file_relpath(name, "sglang", args.triton_version or _installed_triton())
    except ConfigFileError as exc:
        print("error: " + " ".join(str(exc).split()), file=sys.stderr)
        return 2
    print(name)
    return 0


def parse_ints(text: str) -> tuple[int, ...]:
    """ "1,2,4" → (1, 2, 4); ValueError unless every value is a positive integer."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise ValueError(f"expected positive integers, got {text!r}")
    return values


def _parse_block_shape(text: str) -> tuple[int, int]:
    parts = text.strip().strip("[]").split(",")
    try:
        bn, bk = (int(p) for p in parts)
    except ValueError:
        raise ConfigFileError(
            f"--block-shape must be two integers like 128,128, got {text!r}"
        ) from None
    return bn, bk


def _installed_triton() -> str:
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        raise ConfigFileError("Triton is not installed here: give --triton-version") from None
