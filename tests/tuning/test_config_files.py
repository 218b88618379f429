import json
import subprocess
import sys
from pathlib import Path

import pytest

import tuning.__main__ as cli_main
from tests.fakes import (
    FIXTURES,
    KERNEL_ENTRY,
    MI300X_FILE,
    ROOT,
    RTX_PRO_6000_FP8_FILE,
    tuning_cli,
)
from tuning.config_files import (
    TUNED_BATCH_SIZES,
    ConfigEntryError,
    ConfigFileError,
    config_file_name,
    config_file_relpath,
    configs_root,
    dumps_config,
    entry_for_batch,
    file_device_name,
    loads_config,
    nvml_device_name,
    parse_config_file_name,
    search_path,
    sglang_folder,
    shape_problems,
    triton_version_of,
    validate_entries,
)

KERNEL_CONFIGS = FIXTURES / "kernel_configs"
REPO = ROOT


def test_tuned_batch_sizes_are_the_18_of_the_design():
    assert TUNED_BATCH_SIZES == (
        1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096,
    )  # fmt: skip


def test_it_names_the_vllm_file_for_glm5_fp8_block_at_tp8_on_h200():
    name = config_file_name(256, 256, "NVIDIA H200", "fp8_w8a8", [128, 128])

    assert name == "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"


def test_it_names_the_sglang_file_with_a_space_in_the_block_shape():
    name = config_file_name(256, 256, "NVIDIA H200", "fp8_w8a8", [128, 128], style="sglang")

    assert name == "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"


@pytest.mark.parametrize("dtype", [None, "bf16", "bfloat16", "fp16", "float16"])
def test_it_adds_no_dtype_part_for_unquantized_weights(dtype):
    name = config_file_name(384, 256, "NVIDIA RTX PRO 6000 Blackwell Server Edition", dtype)

    assert name == "E=384,N=256,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition.json"


def test_it_omits_a_block_shape_with_a_zero_as_the_engines_do():
    assert config_file_name(8, 7168, "NVIDIA A100-SXM4-80GB", "int4_w4a16", [0, 128]) == (
        "E=8,N=7168,device_name=NVIDIA_A100-SXM4-80GB,dtype=int4_w4a16.json"
    )


def test_vllm_files_every_h200_variant_under_one_name_and_sglang_does_not():
    assert config_file_name(128, 192, "NVIDIA H200 NVL").startswith(
        "E=128,N=192,device_name=NVIDIA_H200.json"
    )
    assert config_file_name(128, 192, "NVIDIA H200 NVL", style="sglang") == (
        "E=128,N=192,device_name=NVIDIA_H200_NVL.json"
    )


def test_it_adds_sglang_only_parts():
    name = config_file_name(
        257, 256, "NVIDIA B200", "fp8_w8a8", style="sglang", per_channel_quant=True, down_moe=True
    )

    assert (
        name
        == "E=257,N=256,device_name=NVIDIA_B200,dtype=fp8_w8a8,per_channel_quant=True_down.json"
    )


def test_it_refuses_sglang_only_parts_in_a_vllm_name():
    with pytest.raises(ConfigFileError, match="SGLang names only"):
        config_file_name(256, 256, "NVIDIA H200", per_channel_quant=True)
    with pytest.raises(ConfigFileError, match="block-quantised shape only"):
        config_file_name(256, 256, "NVIDIA H200", down_moe=True)


def test_vllms_down_file_is_the_up_files_name_ending_down_json():
    # as vLLM 0.34's get_moe_configs(..., down_moe=True) builds it, and its shipped GLM-5 file
    up = config_file_name(256, 256, "NVIDIA H200", "fp8_w8a8", (128, 128))
    down = config_file_name(256, 256, "NVIDIA H200", "fp8_w8a8", (128, 128), down_moe=True)

    assert down == up.removesuffix(".json") + "_down.json"
    assert (
        down == "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128]_down.json"
    )
    parsed = parse_config_file_name(down)
    assert parsed.style == "vllm" and parsed.down_moe and parsed.name == down
    # SGLang's spells the block with a space; one without a block shape is SGLang's too
    assert parse_config_file_name(down.replace("[128,128]", "[128, 128]")).style == "sglang"
    assert parse_config_file_name("E=8,N=64,device_name=NVIDIA_H200_down.json").style == "sglang"


def test_a_vllm_down_file_may_turn_its_path_off_at_a_batch_size():
    entry = {
        "BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 64,
        "num_warps": 4, "num_stages": 3, "USE_TMA": True,
    }  # fmt: skip
    text = dumps_config({512: {"USE_TMA": False}, 1024: entry}, "3.6.0", vllm_down=True)

    assert json.loads(text)["512"] == {"USE_TMA": False}
    assert loads_config(text, vllm_down=True)[1] == {512: {"USE_TMA": False}, 1024: entry}
    # only there: an up file's entry needs its tile, and so does any other _down entry
    with pytest.raises(ConfigEntryError, match="batch size 512: BLOCK_SIZE_M is missing"):
        loads_config(text)
    with pytest.raises(ConfigEntryError, match="batch size 512: BLOCK_SIZE_M is missing"):
        loads_config(json.dumps({"512": {"USE_TMA": True}}), vllm_down=True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 256, "NVIDIA H200"), "E must be an integer from 1 to 16,384, got 0"),
        ((256, 2**17 + 1, "NVIDIA H200"), "N must be an integer from 1 to 131,072, got 131073"),
        ((256, 256, "NVIDIA H200", "fp8-w8a8"), "not a dtype part"),
        ((256, 256, "NVIDIA H200", None, [128]), r"block_shape must be \[block_n, block_k\]"),
        ((256, 256, "  "), "not a device name"),
    ],
)
def test_it_rejects_parts_that_would_not_make_an_engine_name(args, message):
    with pytest.raises(ConfigFileError, match=message):
        config_file_name(*args)


# Names as they stand in the engines' repositories.
REAL_NAMES = [
    ("E=128,N=384,device_name=NVIDIA_H100_PCIe,block_shape=[128,128].json", "vllm"),
    ("E=10,N=512,device_name=Intel(R)_Arc(TM)_Pro_B60_Graphics.json", None),
    ("E=1,N=14336,device_name=NVIDIA_A100-SXM4-80GB,dtype=int8_w8a16.json", None),
    (RTX_PRO_6000_FP8_FILE, "vllm"),
    ("E=257,N=128,device_name=NVIDIA_H100_80GB_HBM3,block_shape=[128, 128].json", "sglang"),
]


@pytest.mark.parametrize(("name", "style"), REAL_NAMES)
def test_it_parses_real_names_and_writes_them_back_identically(name, style):
    parsed = parse_config_file_name(name)

    assert parsed.style == style
    assert parsed.name == name


def test_it_parses_every_part():
    parsed = parse_config_file_name(
        "triton_3_4_0/E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,"
        "block_shape=[128, 128],per_channel_quant=True_down.json"
    )

    assert (parsed.E, parsed.N, parsed.device_name) == (257, 256, "NVIDIA_H200")
    assert (parsed.dtype, parsed.block_shape) == ("fp8_w8a8", (128, 128))
    assert (parsed.per_channel_quant, parsed.down_moe) == (True, True)
    assert (parsed.style, parsed.triton_version) == ("sglang", "3.4.0")


def test_it_recognises_an_h200_variant_as_an_sglang_name():
    assert parse_config_file_name("E=8,N=64,device_name=NVIDIA_H200_NVL.json").style == "sglang"


@pytest.mark.parametrize(
    "name",
    [
        "E=256,N=256,device_name=NVIDIA_H200",
        "N=256,E=256,device_name=NVIDIA_H200.json",
        "E=abc,N=256,device_name=NVIDIA_H200.json",
        "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128].json",
        "config.json",
    ],
)
def test_it_rejects_names_the_engines_do_not_write(name):
    with pytest.raises(ConfigFileError, match="is not a fused-MoE config file name"):
        parse_config_file_name(name)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "E=99999999999999999999,N=64,device_name=NVIDIA_H200.json",
            "E must be an integer from 1 to 16,384, got 99999999999999999999",
        ),
        (
            "E=8,N=1099511627776,device_name=NVIDIA_H200.json",
            "N must be an integer from 1 to 131,072, got 1099511627776",
        ),
        ("E=0,N=64,device_name=NVIDIA_H200.json", "E must be an integer from 1 to 16,384, got 0"),
        (
            "E=8,N=64,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[0,0].json",
            "block_shape must be [block_n, block_k], each from 1 to 131,072, got [0, 0]",
        ),
    ],
)
def test_it_bounds_the_shape_a_name_gives_as_the_fields_are_bounded(name, message):
    with pytest.raises(ConfigFileError) as caught:
        parse_config_file_name(name)
    assert str(caught.value) == f"{name!r}: {message}"
    assert shape_problems(16384, 2**17, [128, 128]) == {}


def test_it_names_the_sglang_folder_per_triton_version():
    assert sglang_folder("3.7.1") == "triton_3_7_1"
    assert config_file_relpath("E=8,N=64,device_name=X.json", "sglang", "3.4.0") == (
        "triton_3_4_0/E=8,N=64,device_name=X.json"
    )
    assert (
        config_file_relpath("E=8,N=64,device_name=X.json", "vllm") == "E=8,N=64,device_name=X.json"
    )
    with pytest.raises(ConfigFileError, match="give the version"):
        config_file_relpath("E=8,N=64,device_name=X.json", "sglang")


NAME = "E=8,N=64,device_name=X.json"
VLLM_CONFIGS = "model_executor/layers/fused_moe/configs"


def test_vllm_looks_in_its_variables_folder_then_its_own(tmp_path):
    found = search_path(
        "vllm", NAME, env_folder=str(tmp_path / "tuned"), package_dir="/pkg", triton_version=None
    )

    assert found == [
        ("VLLM_TUNED_CONFIG_FOLDER", tmp_path / "tuned" / NAME, False),
        ("vLLM's own configs folder", Path(f"/pkg/{VLLM_CONFIGS}/{NAME}"), True),
    ]
    assert [
        p
        for _, p, _ in search_path(
            "vllm", NAME, env_folder=None, package_dir=None, triton_version=None
        )
    ] == []


def test_sglang_looks_under_its_triton_folder_then_the_others_newest_first(tmp_path):
    for folder in ("triton_3_2_0", "triton_3_10_0", "triton_3_7_1"):
        (tmp_path / "configs" / folder).mkdir(parents=True)

    found = search_path(
        "sglang", NAME, env_folder=str(tmp_path), package_dir="/pkg", triton_version="3.7.1"
    )

    assert [
        (where, path.relative_to(tmp_path).as_posix(), shipped) for where, path, shipped in found
    ] == [
        ("SGLANG_MOE_CONFIG_DIR, triton_3_7_1", f"configs/triton_3_7_1/{NAME}", False),
        ("SGLANG_MOE_CONFIG_DIR, triton_3_10_0 (fallback)", f"configs/triton_3_10_0/{NAME}", False),
        ("SGLANG_MOE_CONFIG_DIR, triton_3_2_0 (fallback)", f"configs/triton_3_2_0/{NAME}", False),
    ]
    # the writer puts a file where the reader looks first
    assert (
        configs_root("sglang", tmp_path) / config_file_relpath(NAME, "sglang", "3.7.1")
        == (found[0][1])
    )
    shipped = search_path(
        "sglang", NAME, env_folder=None, package_dir="/pkg", triton_version="3.7.1"
    )
    assert shipped[0][0] == "SGLang's own configs folder, triton_3_7_1" and shipped[0][2] is True
    assert (
        search_path("sglang", NAME, env_folder=str(tmp_path), package_dir=None, triton_version=None)
        == []
    )
    with pytest.raises(ConfigFileError, match="got 'trtllm'"):
        search_path("trtllm", NAME, env_folder=None, package_dir=None, triton_version=None)


@pytest.mark.parametrize("name", [RTX_PRO_6000_FP8_FILE, MI300X_FILE])
def test_real_engine_files_validate(name):
    version, entries = loads_config((KERNEL_CONFIGS / name).read_text())

    assert all(isinstance(m, int) for m in entries)
    assert list(entries) == sorted(entries)
    assert version == ("3.6.0" if name == RTX_PRO_6000_FP8_FILE else None)


@pytest.mark.parametrize("name", [RTX_PRO_6000_FP8_FILE, MI300X_FILE])
def test_it_writes_byte_for_byte_what_the_engine_tuner_wrote(name):
    text = (KERNEL_CONFIGS / name).read_text()
    version, entries = loads_config(text)

    assert dumps_config(entries, version) == text


def test_it_writes_fields_and_batch_sizes_in_the_engine_order_whatever_the_input_order():
    text = (KERNEL_CONFIGS / RTX_PRO_6000_FP8_FILE).read_text()
    version, entries = loads_config(text)
    # As a database may hand a JSON column back: keys sorted differently.
    shuffled = {m: dict(sorted(e.items())) for m, e in sorted(entries.items(), reverse=True)}

    assert dumps_config(shuffled, version) == text


def test_it_omits_the_triton_version_for_an_sglang_file():
    text = dumps_config({1: KERNEL_ENTRY, 2: KERNEL_ENTRY}, None)

    assert "triton_version" not in text
    assert [int(k) for k in json.loads(text)] == [1, 2]


def test_it_returns_the_triton_version_separately():
    obj = {"triton_version": "3.7.1", "1": KERNEL_ENTRY}

    assert triton_version_of(obj) == "3.7.1"
    assert validate_entries(obj) == {1: KERNEL_ENTRY}
    with pytest.raises(ConfigEntryError, match="triton_version must be a string, got 3.7"):
        triton_version_of({"triton_version": 3.7, "1": KERNEL_ENTRY})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("BLOCK_SIZE_N", 48, "batch size 64: BLOCK_SIZE_N must be a power of two, got 48"),
        ("BLOCK_SIZE_M", 0, "batch size 64: BLOCK_SIZE_M must be a power of two, got 0"),
        ("BLOCK_SIZE_K", "128", 'batch size 64: BLOCK_SIZE_K must be an integer, got "128"'),
        ("GROUP_SIZE_M", 0, "batch size 64: GROUP_SIZE_M must be at least 1, got 0"),
        ("GROUP_SIZE_M", 1.5, "batch size 64: GROUP_SIZE_M must be an integer, got 1.5"),
        ("num_warps", 3, "batch size 64: num_warps must be one of 1, 2, 4, 8, 16, got 3"),
        ("num_warps", True, "batch size 64: num_warps must be an integer, got true"),
        ("num_stages", 9, "batch size 64: num_stages must be between 1 and 8, got 9"),
        ("num_stages", 0, "batch size 64: num_stages must be between 1 and 8, got 0"),
        ("kpack", 3, "batch size 64: kpack must be 1 or 2, got 3"),
        ("matrix_instr_nonkdim", 8, "batch size 64: matrix_instr_nonkdim must be 16 or 32, got 8"),
        ("USE_TMA", 1, "batch size 64: USE_TMA must be true or false, got 1"),
        ("BLOCK_M", 64, 'batch size 64: unknown field "BLOCK_M" (allowed: BLOCK_SIZE_M,'),
    ],
)
def test_it_rejects_each_kind_of_bad_entry_naming_batch_size_and_field(field, value, message):
    with pytest.raises(ConfigEntryError) as caught:
        validate_entries({"1": KERNEL_ENTRY, "64": {**KERNEL_ENTRY, field: value}})

    assert len(caught.value.errors) == 1
    assert caught.value.errors[0].startswith(message)


def test_it_names_a_missing_field():
    entry = {k: v for k, v in KERNEL_ENTRY.items() if k != "num_stages"}

    with pytest.raises(ConfigEntryError, match="batch size 8: num_stages is missing"):
        validate_entries({"8": entry})


@pytest.mark.parametrize("key", ["0", "-4", "abc", "1.5", "", "٣"])
def test_it_rejects_batch_size_keys_that_are_not_positive_integers(key):
    with pytest.raises(ConfigEntryError) as caught:
        validate_entries({"1": KERNEL_ENTRY, key: KERNEL_ENTRY})

    assert caught.value.errors == [f"batch size {json.dumps(key)}: not a positive integer"]


def test_it_collects_every_error_rather_than_the_first():
    bad = {
        "16": {**KERNEL_ENTRY, "BLOCK_SIZE_N": 48, "num_warps": 3},
        "x": KERNEL_ENTRY,
        "4": "not an entry",
        "1": KERNEL_ENTRY,
    }

    with pytest.raises(ConfigEntryError) as caught:
        validate_entries(bad)

    assert caught.value.errors == [
        'batch size "x": not a positive integer',
        "batch size 4: entry must be an object of kernel parameters, got a string",
        "batch size 16: BLOCK_SIZE_N must be a power of two, got 48",
        "batch size 16: num_warps must be one of 1, 2, 4, 8, 16, got 3",
    ]
    assert str(caught.value) == "; ".join(caught.value.errors)


def test_it_rejects_a_batch_size_given_twice():
    with pytest.raises(ConfigEntryError, match="batch size 1: given twice"):
        validate_entries({"1": KERNEL_ENTRY, "01": KERNEL_ENTRY})


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ([KERNEL_ENTRY], "got a list"),
        ({}, "no batch-size entries"),
        ({"triton_version": "3.7.1"}, "no"),
    ],
)
def test_it_rejects_content_with_no_entries(obj, message):
    with pytest.raises(ConfigEntryError, match=message):
        validate_entries(obj)


def test_it_keeps_the_engines_extra_fields():
    entry = {
        **KERNEL_ENTRY,
        "waves_per_eu": 0,
        "matrix_instr_nonkdim": 16,
        "kpack": 2,
        "SPLIT_K": 1,
    }

    assert validate_entries({"1": entry, "2": {**KERNEL_ENTRY, "USE_TMA": True}}) == {
        1: entry,
        2: {**KERNEL_ENTRY, "USE_TMA": True},
    }


def test_it_rejects_text_that_is_not_json():
    with pytest.raises(ConfigEntryError, match="not valid JSON"):
        loads_config('{"1": {')


@pytest.mark.parametrize("M", [1, 3, 5, 20, 40, 100, 200, 383, 384, 385, 5000, 10**6])
def test_it_picks_the_entry_the_engine_picks(M):
    _, entries = loads_config((KERNEL_CONFIGS / MI300X_FILE).read_text())
    tagged = {m: {**e, "M": m} for m, e in entries.items()}
    # The engines' own expression, over the keys in file order.
    engine = tagged[min(tagged.keys(), key=lambda x: abs(x - M))]

    assert entry_for_batch(tagged, M) is engine


def test_it_breaks_a_tie_towards_the_smaller_batch_size():
    entries = {256: {"M": 256}, 128: {"M": 128}}

    assert entry_for_batch(entries, 192) == {"M": 128}
    assert entry_for_batch(entries, 193) == {"M": 256}


def filename_cli(*args: str) -> subprocess.CompletedProcess:
    return tuning_cli("filename", *args)


GLM5_ON_H200 = ("--E", "256", "--N", "256", "--device", "NVIDIA H200")


def printed_file_name(*args: str) -> str:
    """What the CLI prints for GLM-5's block-quantised shape on the H200 and args."""
    result = filename_cli(*GLM5_ON_H200, "--block-shape", "128,128", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_cli_prints_the_vllm_file_name():
    assert printed_file_name("--dtype", "fp8_w8a8") == (
        "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json\n"
    )


def test_cli_prints_the_sglang_file_under_its_triton_folder():
    assert printed_file_name("--style", "sglang", "--triton-version", "3.4.0") == (
        "triton_3_4_0/E=256,N=256,device_name=NVIDIA_H200,block_shape=[128, 128].json\n"
    )


def test_cli_fails_with_one_error_line():
    result = filename_cli(*GLM5_ON_H200, "--block-shape", "x")

    assert result.returncode == 2
    assert result.stderr == "error: --block-shape must be two integers like 128,128, got 'x'\n"


def test_cli_registers_params_and_filename():
    parser = cli_main.build_parser()

    assert parser.parse_args(["params", "config.json"]).run.__module__ == "tuning.moe_params"
    args = parser.parse_args(["filename", "--E", "8", "--N", "64", "--device", "X"])
    assert args.run.__module__ == "tuning.config_files"


def test_cli_does_not_hide_a_missing_subcommand_module(monkeypatch):
    def import_module(name):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setattr(cli_main.importlib, "import_module", import_module)

    with pytest.raises(ModuleNotFoundError, match="torch"):
        cli_main.build_parser()


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_importing_the_package_loads_no_torch_triton_or_django():
    result = run_python(
        "import sys, tuning, tuning.moe_params, tuning.config_files, tuning.engines\n"
        "import tuning.__main__\n"
        "tuning.__main__.build_parser()\n"
        "print(sorted(m for m in ('torch', 'triton', 'django') if m in sys.modules))"
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"


def test_fused_moe_is_the_function_whatever_the_import_order():
    # A stand-in tuning.fused_moe: the package must load it on first use and keep
    # `tuning.fused_moe` the function even after the import system binds the submodule.
    result = run_python(
        "import sys, types, tuning\n"
        "module = types.ModuleType('tuning.fused_moe')\n"
        "def fused_moe(): return 'ran'\n"
        "module.fused_moe = fused_moe\n"
        "sys.modules['tuning.fused_moe'] = module\n"
        "from tuning import fused_moe as first\n"
        "setattr(tuning, 'fused_moe', module)\n"
        "from tuning import fused_moe as second\n"
        "print(first(), second is fused_moe)\n"
        "print(tuning.__getattr__('fused_moe') is fused_moe)\n"
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout == "ran True\nTrue\n"


@pytest.mark.parametrize("nvml", ["NVIDIA H200", "NVIDIA RTX PRO 6000 Blackwell Server Edition"])
def test_device_names_go_to_file_names_and_back(nvml):
    part = file_device_name(nvml)
    assert " " not in part
    assert part in config_file_name(256, 256, nvml)
    assert nvml_device_name(part) == nvml
