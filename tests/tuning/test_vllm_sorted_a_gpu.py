"""vLLM 0.34's sorted-A path for GEMM 2 on a real H100/H200 (gpu tests): the layer launched as
TritonExperts.apply launches it, against the float64 reference; a `_down` entry of only
`{"USE_TMA": false}` running the default path exactly; and a short tune that writes the up
file and its `_down` file. The 0.34 source comes from its wheel (tests.engine)."""

import json

import pytest
import torch

from tests.engine import engine_source
from tests.fakes import KERNEL_ENTRY
from tuning.backends import current_capability, load_backend
from tuning.config_files import PATH_OFF, loads_config
from tuning.reference import moe_reference
from tuning.search import KernelShape
from tuning.timing import make_weights, random_routing
from tuning.tune_results import write_config_files
from tuning.tuner import tune

pytestmark = pytest.mark.gpu

# GLM-5 TP8's layer at 64 experts: its H and N, which the sorted-A path's conditions need
SHAPE = KernelShape(E=64, N=256, H=6144, top_k=8, dtype="fp8_w8a8", block_shape=(128, 128))
UP = {**KERNEL_ENTRY, "BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128}
DOWN = {**UP, "BLOCK_SIZE_N": 64, "USE_TMA": True}
LAUNCH = {"deep_gemm_e8m0": True, "expert_parallel": False}


@pytest.fixture(scope="module")
def vllm034():
    if current_capability() != 90:
        pytest.fail("vLLM 0.34's sorted-A path runs on a GPU of compute capability 9.0 only")
    return load_backend("vllm", source_dir=engine_source("vllm", "0.34.0"), launch=LAUNCH)


def _layer(backend, M, down_config):
    weights = make_weights(SHAPE, seed=7)
    torch.manual_seed(M)
    x = torch.randn((M, SHAPE.H), device="cuda", dtype=torch.bfloat16)
    topk_weights, topk_ids = (t[0] for t in random_routing(1, M, SHAPE.E, SHAPE.top_k))
    out = torch.full_like(x, float("nan"))
    backend.layer(
        x, weights, topk_weights, topk_ids, shape=SHAPE, config=UP, down_config=down_config,
        out=out,
    )  # fmt: skip
    expected = moe_reference(
        x, weights.w1, weights.w2, topk_weights, topk_ids, **weights.layer_kwargs(SHAPE)
    ).float()
    return out.float(), expected


def test_the_deployment_takes_the_sorted_a_path_here(vllm034):
    assert vllm034.kernel_path(SHAPE) == "sorted_a"


@pytest.mark.parametrize("M", [3, 64, 600])
def test_the_sorted_a_layer_matches_the_reference(vllm034, monkeypatch, M):
    launches = []
    launcher = vllm034.source.module.invoke_fused_moe_triton_kernel

    def recorded(*args, **kwargs):
        launches.append((kwargs.get("C_is_sorted", False), kwargs.get("A_is_sorted", False)))
        return launcher(*args, **kwargs)

    monkeypatch.setattr(vllm034.source.module, "invoke_fused_moe_triton_kernel", recorded)

    out, expected = _layer(vllm034, M, DOWN)

    # GEMM 1 writes sorted rows, GEMM 2 reads them: the path the engine takes
    assert launches == [(True, False), (False, True)]
    assert torch.isfinite(out).all()
    # E8M0 (power-of-two) scales of the intermediate: a little more error than per-group fp32
    assert float((out - expected).norm() / expected.norm()) < 5e-2


def test_a_batch_whose_experts_are_assigned_naively_stays_on_the_default_path(vllm034):
    # M * top_k * 4 <= E: no sorted ids, so vLLM runs GEMM 2 with GEMM 1's config
    on, _ = _layer(vllm034, 1, DOWN)
    default, _ = _layer(vllm034, 1, None)

    assert torch.equal(on, default)


def test_a_down_entry_that_turns_the_path_off_runs_the_default_path_exactly(vllm034):
    off, _ = _layer(vllm034, 64, dict(PATH_OFF))
    default, _ = _layer(vllm034, 64, None)

    assert torch.equal(off, default)


def test_a_sorted_a_tune_writes_the_up_file_and_its_down_file(tmp_path):
    spec = {"engine": "vllm", "source_dir": str(engine_source("vllm", "0.34.0")), "launch": LAUNCH}

    result = tune(SHAPE, [64, 1024], compile_workers=4, engine=spec)

    assert result.kernel_path == "sorted_a"
    up_path, down_path = write_config_files(result, tmp_path, "vllm")
    assert down_path.name == up_path.name.removesuffix(".json") + "_down.json"
    _, up = loads_config(up_path.read_text())
    _, down = loads_config(down_path.read_text(), vllm_down=True)
    assert sorted(up) == sorted(down) == [64, 1024]
    for m, entry in down.items():
        assert entry == PATH_OFF or (
            entry["USE_TMA"] is True and entry["BLOCK_SIZE_M"] == up[m]["BLOCK_SIZE_M"]
        )
        # never slower than the engine's own configs, head to head
        batch = result.batches[m]
        assert batch.tuned_us <= min(filter(None, (batch.default_us, batch.shipped_us))) * 1.0001
    assert json.loads(down_path.read_text())["triton_version"] == result.triton_version
