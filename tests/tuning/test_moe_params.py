import json
import subprocess

import pytest

from tests.fakes import FIXTURES, ROOT, tuning_cli
from tuning.moe_params import MoEConfigError, moe_params

CONFIGS = FIXTURES / "hf_configs"
REPO = ROOT


def load(name: str) -> dict:
    return json.loads((CONFIGS / name).read_text())


# Numbers as they stand in each published config.json: E, top-k, H, I, layers, MoE layers.
FAMILIES = {
    "deepseek-v3_config.json": ("DeepseekV3ForCausalLM", 256, 8, 7168, 2048, 61, 58),
    "deepseek-r1_config.json": ("DeepseekV3ForCausalLM", 256, 8, 7168, 2048, 61, 58),
    "deepseek-coder-v2-lite-base_config.json": ("DeepseekV2ForCausalLM", 64, 6, 2048, 1408, 27, 26),
    "kimi-k2-instruct_config.json": ("DeepseekV3ForCausalLM", 384, 8, 7168, 2048, 61, 60),
    "nvidia-kimi-k2.5-nvfp4_config.json": (
        "KimiK25ForConditionalGeneration", 384, 8, 7168, 2048, 61, 60,
    ),
    "glm-5-fp8_config.json": ("GlmMoeDsaForCausalLM", 256, 8, 6144, 2048, 78, 75),
    "glm-4.7_config.json": ("Glm4MoeForCausalLM", 160, 8, 5120, 1536, 92, 89),
    "glm-4.7-fp8_config.TRIMMED.json": ("Glm4MoeForCausalLM", 160, 8, 5120, 1536, 92, 89),
    "qwen1.5-moe-a2.7b-wikihow_config.json": ("Qwen2MoeForCausalLM", 60, 4, 2048, 1408, 24, 24),
    "qwen3-30b-a3b_config.json": ("Qwen3MoeForCausalLM", 128, 8, 2048, 768, 48, 48),
    "qwen3-235b-a22b-fp8_config.json": ("Qwen3MoeForCausalLM", 128, 8, 4096, 1536, 94, 94),
    "mixtral-8x7b-v0.1_config.json": ("MixtralForCausalLM", 8, 2, 4096, 14336, 32, 32),
    "mixtral-8x22b-v0.1_config.json": ("MixtralForCausalLM", 8, 2, 6144, 16384, 56, 56),
    "llama-4-scout-17b-16e-instruct_config.json": (
        "Llama4ForConditionalGeneration", 16, 1, 5120, 8192, 48, 48,
    ),
    "llama-4-maverick-17b-128e-instruct_config.json": (
        "Llama4ForConditionalGeneration", 128, 1, 5120, 8192, 48, 24,
    ),
    "gpt-oss-120b_config.json": ("GptOssForCausalLM", 128, 4, 2880, 2880, 36, 36),
    "dbrx-instruct_config.json": ("DbrxForCausalLM", 16, 4, 6144, 10752, 40, 40),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_it_reads_each_family_shape(name):
    architecture, experts, topk, hidden, intermediate, layers, moe_layers = FAMILIES[name]

    params = moe_params(load(name))

    assert params.architecture == architecture
    assert (params.num_experts, params.topk) == (experts, topk)
    assert (params.hidden_size, params.moe_intermediate_size) == (hidden, intermediate)
    assert (params.num_layers, params.num_moe_layers) == (layers, moe_layers)
    assert (params.experts_per_rank, params.N) == (experts, intermediate)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_it_splits_the_intermediate_size_over_tp(name):
    experts, intermediate = FAMILIES[name][1], FAMILIES[name][4]

    params = moe_params(load(name), tp=8)

    assert (params.N, params.experts_per_rank) == (intermediate // 8, experts)


def test_it_gives_the_glm5_shape_of_the_write_up_at_tp8():
    params = moe_params(load("glm-5-fp8_config.json"), tp=8)

    assert (params.num_experts, params.topk, params.hidden_size) == (256, 8, 6144)
    assert (params.moe_intermediate_size, params.N) == (2048, 256)
    assert params.model_type == "glm_moe_dsa"


def test_it_uses_the_experts_intermediate_size_not_the_dense_one_for_llama4():
    config = load("llama-4-scout-17b-16e-instruct_config.json")

    params = moe_params(config, tp=8)

    assert config["text_config"]["intermediate_size_mlp"] == 16384
    assert params.moe_intermediate_size == config["text_config"]["intermediate_size"] == 8192
    assert params.N == 1024


def test_it_reads_the_text_config_of_a_multimodal_wrapper():
    config = load("nvidia-kimi-k2.5-nvfp4_config.json")

    params = moe_params(config, tp=8)

    assert "n_routed_experts" not in config
    assert params.model_type == "kimi_k25"
    assert (params.num_experts, params.N) == (384, 256)


def test_it_reads_dbrx_fields_under_ffn_config():
    config = load("dbrx-instruct_config.json")

    params = moe_params(config, tp=4)

    assert "hidden_size" not in config and "num_hidden_layers" not in config
    assert params.hidden_size == config["d_model"]
    assert params.num_layers == config["n_layers"]
    assert params.N == 10752 // 4


def test_it_returns_exactly_the_documented_keys():
    out = moe_params(load("deepseek-v3_config.json"), tp=8).as_dict()

    assert set(out) == {
        "architecture",
        "model_type",
        "num_experts",
        "experts_per_rank",
        "topk",
        "hidden_size",
        "moe_intermediate_size",
        "N",
        "num_layers",
        "num_moe_layers",
        "quantization",
        "block_shape",
    }
    assert out["block_shape"] == [128, 128]
    assert json.loads(json.dumps(out)) == out


@pytest.mark.parametrize(
    ("name", "quantization", "block_shape"),
    [
        ("deepseek-v3_config.json", "fp8", (128, 128)),
        ("kimi-k2-instruct_config.json", "fp8", (128, 128)),
        ("glm-5-fp8_config.json", "fp8", (128, 128)),
        ("qwen3-235b-a22b-fp8_config.json", "fp8", (128, 128)),
        ("amd-dbrx-instruct-fp8-kv_config.json", "fp8", None),
        ("gpt-oss-120b_config.json", "mxfp4", None),
        ("nvidia-kimi-k2.5-nvfp4_config.json", "nvfp4", None),
        ("mixtral-8x22b-v0.1_config.json", None, None),
        ("glm-4.7-fp8_config.TRIMMED.json", None, None),
    ],
)
def test_it_names_the_weight_quantization(name, quantization, block_shape):
    params = moe_params(load(name))

    assert (params.quantization, params.block_shape) == (quantization, block_shape)


def test_it_takes_the_quantization_from_a_separate_hf_quant_config():
    quant_config = load("nvidia-glm-5-nvfp4_hf_quant_config.json")

    params = moe_params(load("glm-5-fp8_config.json"), tp=8, quant_config=quant_config)

    assert (params.quantization, params.block_shape) == ("nvfp4", None)
    assert params.N == 256


def test_it_reads_compressed_tensors_schemes():
    # config_groups as in nm-testing/DeepSeek-Coder-V2-Lite-Instruct-W8A8 (FP8 per tensor)
    # and RedHatAI/GLM-4.6-NVFP4 (4-bit float, groups of 16).
    fp8 = {"type": "float", "num_bits": 8, "group_size": None, "block_structure": None}
    nvfp4 = {"type": "float", "num_bits": 4, "group_size": 16, "block_structure": None}
    config = load("deepseek-coder-v2-lite-base_config.json")

    for weights, expected in ((fp8, "fp8"), (nvfp4, "nvfp4")):
        config["quantization_config"] = {
            "quant_method": "compressed-tensors",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
        }
        assert moe_params(config).quantization == expected


@pytest.mark.parametrize(
    ("tp", "ep", "experts_per_rank", "n"),
    [(8, 1, 256, 256), (8, 8, 32, 2048), (8, 2, 128, 512), (4, 4, 64, 2048), (1, 8, 32, 2048)],
)
def test_it_shards_experts_over_ep_and_the_rest_of_tp_over_the_intermediate(
    tp, ep, experts_per_rank, n
):
    params = moe_params(load("glm-5-fp8_config.json"), tp=tp, ep=ep)

    assert (params.experts_per_rank, params.N) == (experts_per_rank, n)
    assert params.num_experts == 256


def test_it_accepts_json_text():
    text = (CONFIGS / "mixtral-8x7b-v0.1_config.json").read_text()

    assert moe_params(text, tp=2).N == 7168


def test_it_rejects_text_that_is_not_json():
    with pytest.raises(MoEConfigError, match="not valid JSON"):
        moe_params('{"n_routed_experts": 8,')


def test_it_rejects_json_that_is_not_an_object():
    with pytest.raises(MoEConfigError, match="must be a JSON object, got list"):
        moe_params("[1, 2]")


def test_it_rejects_a_dense_model():
    config = load("mixtral-8x7b-v0.1_config.json")
    del config["num_local_experts"]

    with pytest.raises(MoEConfigError, match="not a Mixture-of-Experts config: none of"):
        moe_params(config)


def test_it_rejects_a_single_expert_as_not_moe():
    config = load("mixtral-8x7b-v0.1_config.json")
    config["num_local_experts"] = 1

    with pytest.raises(MoEConfigError, match="num_local_experts is 1"):
        moe_params(config)


@pytest.mark.parametrize(
    ("key", "named"),
    [
        ("num_experts_per_tok", "missing top-k: none of num_experts_per_tok"),
        ("hidden_size", "missing hidden size: none of hidden_size, d_model"),
    ],
)
def test_it_names_the_missing_key(key, named):
    config = load("qwen3-30b-a3b_config.json")
    del config[key]

    with pytest.raises(MoEConfigError, match=named):
        moe_params(config)


def test_it_names_the_missing_intermediate_size():
    config = load("glm-5-fp8_config.json")
    del config["moe_intermediate_size"], config["intermediate_size"]

    with pytest.raises(MoEConfigError, match="missing MoE intermediate size: none of"):
        moe_params(config)


def test_it_rejects_experts_not_divisible_by_ep():
    with pytest.raises(MoEConfigError, match="num_experts 60 is not divisible by ep 8"):
        moe_params(load("qwen1.5-moe-a2.7b-wikihow_config.json"), tp=8, ep=8)


def test_it_rejects_an_intermediate_size_not_divisible_by_tp():
    with pytest.raises(MoEConfigError, match="moe_intermediate_size 16384 is not divisible by"):
        moe_params(load("mixtral-8x22b-v0.1_config.json"), tp=3)


@pytest.mark.parametrize(("tp", "ep"), [(0, 1), (8, -1), (True, 1)])
def test_it_rejects_parallel_sizes_that_are_not_positive_integers(tp, ep):
    with pytest.raises(MoEConfigError, match="must be a positive integer"):
        moe_params(load("glm-5-fp8_config.json"), tp=tp, ep=ep)


def test_it_rejects_tp_and_ep_that_do_not_nest():
    with pytest.raises(MoEConfigError, match="one must be a multiple of the other"):
        moe_params(load("glm-5-fp8_config.json"), tp=3, ep=2)


def test_it_rejects_a_non_integer_size():
    config = load("glm-5-fp8_config.json")
    config["hidden_size"] = "6144"

    with pytest.raises(MoEConfigError, match='hidden_size must be a positive integer, got "6144"'):
        moe_params(config)


def cli(*args: str) -> subprocess.CompletedProcess:
    return tuning_cli("params", *args)


def test_cli_prints_one_json_object():
    result = cli(str(CONFIGS / "kimi-k2-instruct_config.json"), "--tp", "8")

    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert (out["num_experts"], out["N"], out["topk"], out["hidden_size"]) == (384, 256, 8, 7168)
    assert result.stderr == ""


def test_cli_reads_a_separate_quant_config():
    result = cli(
        str(CONFIGS / "glm-5-fp8_config.json"),
        "--tp",
        "8",
        "--quant-config",
        str(CONFIGS / "nvidia-glm-5-nvfp4_hf_quant_config.json"),
    )

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["quantization"] == "nvfp4"


def test_cli_fails_with_one_line_for_a_file_that_is_not_json(tmp_path):
    broken = tmp_path / "config.json"
    broken.write_text("{'n_routed_experts': 256}")

    result = cli(str(broken))

    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: {broken} is not valid JSON")
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["glm-5-fp8_config.json", "--tp", "3"], "error: moe_intermediate_size 2048 is not"),
        (["qwen1.5-moe-a2.7b-wikihow_config.json", "--ep", "8", "--tp", "8"], "error: num_exp"),
        (["nvidia-glm-5-nvfp4_hf_quant_config.json"], "error: not a Mixture-of-Experts config"),
        (["no-such-file.json"], "error: cannot read"),
    ],
)
def test_cli_fails_with_exit_status_2_and_one_error_line(args, message):
    result = cli(str(CONFIGS / args[0]), *args[1:])

    assert result.returncode == 2
    assert result.stderr.startswith(message)
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("empty", [None, {}, ""])
def test_it_reads_config_json_quantization_when_the_quant_config_is_empty(empty):
    params = moe_params(load("glm-5-fp8_config.json"), quant_config=empty)

    assert (params.quantization, params.block_shape) == ("fp8", (128, 128))


def test_it_rejects_a_quant_config_that_is_not_an_object():
    with pytest.raises(MoEConfigError, match="quant config must be a JSON object, got list"):
        moe_params(load("glm-5-fp8_config.json"), quant_config=[1])


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("num_hidden_layers", 2**31),
        ("num_hidden_layers", 10**7),
        ("hidden_size", 2**31),
        ("moe_intermediate_size", 2**31),
        ("n_routed_experts", 2**31),
        ("num_experts_per_tok", 2**31),
    ],
)
def test_it_rejects_a_size_no_gpu_could_hold_at_once(key, value):
    config = load("glm-5-fp8_config.json")
    config[key] = value

    with pytest.raises(MoEConfigError, match=f"^{key} .*at most"):
        moe_params(config)


def test_it_counts_moe_layers_without_walking_them():
    config = load("glm-5-fp8_config.json")
    config.update(num_hidden_layers=4096, first_k_dense_replace=3, moe_layer_freq=2)
    assert moe_params(config).num_moe_layers == len(range(4, 4096, 2))
    qwen = load("qwen3-30b-a3b_config.json")
    qwen.update(num_hidden_layers=4096, decoder_sparse_step=3, mlp_only_layers=[2, 3, 5, 9000])
    assert moe_params(qwen).num_moe_layers == 4096 // 3 - 2


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "architectures",
            [{"a": 1}],
            'architectures must be a list of class names, got [{"a": 1}]',
        ),
        ("architectures", "DeepseekV3ForCausalLM", "architectures must be a list of class names"),
        ("architectures", ["X" * 201], "architectures[0] must be at most 200 characters, got 201"),
        ("model_type", 5, "model_type must be a string, got 5"),
        ("model_type", "x" * 101, "model_type must be at most 100 characters, got 101"),
        ("vocab_size", -5, "vocab_size must be an integer from 2 to 16,777,216, got -5"),
        ("vocab_size", "129280", 'vocab_size must be an integer from 2 to 16,777,216, got "129'),
    ],
)
def test_it_rejects_names_and_sizes_a_model_row_cannot_hold(key, value, message):
    config = {**load("deepseek-v3_config.json"), key: value}

    with pytest.raises(MoEConfigError) as caught:
        moe_params(config)
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize("block", [[0, 0], "ab", [128], [128, 128.5], [True, 128], "0x128"])
def test_it_rejects_a_weight_block_size_that_is_no_block(block):
    config = load("deepseek-v3_config.json")
    config["quantization_config"]["weight_block_size"] = block

    with pytest.raises(MoEConfigError, match=r"^weight_block_size must be two sizes"):
        moe_params(config)


def test_it_reads_a_block_size_written_as_text_and_no_block_at_all():
    config = load("deepseek-v3_config.json")
    config["quantization_config"]["weight_block_size"] = "128x64"
    assert moe_params(config).block_shape == (128, 64)
    config["quantization_config"]["weight_block_size"] = None
    assert moe_params(config).block_shape is None
