"""The tuner's CLIs on a real GPU, as a user runs them, at GLM-5's shape (gpu tests).

`make test` covers the tuner with fake measurements and the kernel in Triton's interpreter; here
the compile processes, the CUDA-graph timing, the resume and the bench table run for real.
Run on a GPU host with `make test-gpu` (no Django needed).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

from tests.fakes import ROOT, compile_only_device
from tuning.config_files import config_file_name, config_file_relpath, loads_config
from tuning.fused_moe import fused_moe
from tuning.reference import moe_reference
from tuning.search import KernelShape
from tuning.timing import make_weights, random_routing

pytestmark = pytest.mark.gpu

GLM5 = ROOT / "tests" / "fixtures" / "hf_configs" / "glm-5-fp8_config.json"
SHAPE = KernelShape(E=256, N=256, H=6144, top_k=8)
TUNE = ("tune", "--model-config", str(GLM5), "--tp", "8", "--dtype", "bf16", "--style", "sglang")


def _tuning_cli(*args) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "tuning", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _engine_file(out: Path, *, down=False) -> Path:
    name = config_file_name(
        SHAPE.E, SHAPE.N, torch.cuda.get_device_name(), style="sglang", down_moe=down
    )
    return out / config_file_relpath(name, "sglang", triton.__version__)


def _tuned_us(out: Path) -> dict[str, float]:
    (log,) = out.glob("*.tuning-log.json")
    return {m: b["tuned_us"] for m, b in json.loads(log.read_text())["batches"].items()}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tuned")
    _tuning_cli(*TUNE, "--batch-sizes", "1,64", "--out", out)
    return out


def test_a_tune_writes_the_engines_files_whose_configs_compute_the_layer(tuned):
    entries = loads_config(_engine_file(tuned).read_text())[1]
    down_entries = loads_config(_engine_file(tuned, down=True).read_text())[1]

    assert sorted(entries) == sorted(down_entries) == [1, 64]
    weights = make_weights(SHAPE)
    for m in (1, 64):
        x = torch.randn((m, SHAPE.H), device="cuda", dtype=torch.bfloat16)
        topk_weights, topk_ids = random_routing(1, m, SHAPE.E, SHAPE.top_k, seed=m)
        args = (x, weights.w1, weights.w2, topk_weights[0], topk_ids[0])
        out = torch.full_like(x, float("nan"))

        fused_moe(*args, config=entries[m], down_config=down_entries[m], out=out)

        ref = moe_reference(*args)
        error = float((out.double() - ref.double()).norm() / ref.double().norm())
        assert error < 1e-2, (m, entries[m], down_entries[m], error)


def test_a_second_tune_resumes_the_finished_batch_sizes_and_tunes_the_new_one(tuned):
    before = _tuned_us(tuned)

    _tuning_cli(*TUNE, "--batch-sizes", "1,2,64", "--out", tuned)

    after = _tuned_us(tuned)
    # times measured again would differ in their last digits; resumed ones are the log's
    assert {m: after[m] for m in before} == before
    assert sorted(map(int, after)) == [1, 2, 64]
    assert sorted(loads_config(_engine_file(tuned).read_text())[1]) == [1, 2, 64]


def test_the_bench_times_the_tuned_files_beside_the_default_and_grouped_mm(tuned):
    done = _tuning_cli(
        "bench",
        "--model-config",
        GLM5,
        "--tp",
        "8",
        "--dtype",
        "bf16",
        "--batch-sizes",
        "1,64",
        "--config",
        _engine_file(tuned),
        "--down-config",
        _engine_file(tuned, down=True),
        "--replays",
        "20",
    )

    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["M"])
    rows = [line.split() for line in lines[header + 1 :]]
    assert [row[0] for row in rows] == ["1", "64"]
    for row in rows:
        # M, floor, default, shipped, tuned, 1-config, grouped_mm, tuned/def, tuned/ship, …:
        # moeops' builtin kernel has no shipped file, every other cell is timed
        assert (row[3], row[8]) == ("n/a", "n/a"), row
        assert "n/a" not in row[:3] + row[4:8] + row[9:], row
        floor, default, _, tuned_us, one_config, grouped_mm = row[1:7]
        assert min(map(float, (floor, default, tuned_us, one_config, grouped_mm))) > 0


def test_kernels_compiled_with_no_gpu_serve_the_gpus_launches():
    """bf16 then fp8 block in one process: the order that exposed cache keys depending on which
    kernel a process hashed first (68 kernels compiled again by the launches)."""
    done = compile_only_device()

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "every launch found its kernels in the cache" in done.stdout


def test_the_tuning_gpus_limits_are_read_from_the_device():
    from tuning.compile_only import SHARED_MEMORY_PER_BLOCK_OPTIN, gpu_target

    target = gpu_target()

    properties = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert target.capability == properties.major * 10 + properties.minor
    assert target.shared_memory == properties.shared_memory_per_block_optin
    # the table compile-check uses for GPUs not here says what the device says
    known = SHARED_MEMORY_PER_BLOCK_OPTIN.get(target.capability)
    assert known in (None, target.shared_memory)
