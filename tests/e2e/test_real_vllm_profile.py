"""A level's profiled pass against the real vLLM CPU build (tests/engine/plugin.py): the engine's
own torch profiler records a bounded window of its steps, every rank's trace is read on this
host, and the breakdown says where a step's time goes: no communication at TP 1, the CPU build's
all-reduce at TP 2 (in shared memory, or torch.distributed's on a CPU without AVX-512)."""

import asyncio
import json
import statistics
import subprocess
import sys

import pytest
from django.test import Client

from domain.step_breakdown import CLASSES, LevelProfile
from moeops.fleet.models import ModelSpec
from tests import page_base as pb
from tests.engine import MODEL_DIR, SERVED_MODEL, VOCAB_SIZE, shm_allreduce_built
from workers import loadgen, step_profile
from workers.loadgen import ClientConfig, LevelConfig

pytest_plugins = ["tests.stack", "tests.engine.plugin"]
pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.timeout(900)]

# 64-token prompts and 48 tokens out: a decode-heavy level of 4 streams (about 2 s a round here)
LEVEL = LevelConfig(concurrency=4, input_len=64, output_len=48, num_prompts=16, warmup=4)
STEPS = 20


def _all_reduce_op() -> str:
    """The all-reduce op a TP-2 rank's trace names: the CPU build's shared-memory one where the
    kernel library it loads here has it, else torch.distributed's (shm_allreduce_built)."""
    return "_C::shm_allreduce" if shm_allreduce_built() else "c10d::allreduce_"


def _client(server, seed=11):
    return ClientConfig(
        base_url=server.url, model=SERVED_MODEL, vocab_size=VOCAB_SIZE, timeout_s=120.0, seed=seed
    )


def _round(server, seed):
    result = asyncio.run(loadgen.run_level(_client(server, seed), LEVEL))
    assert result["completed"] == LEVEL.num_prompts, result["errors"]
    return result


def _profiled(server, unprofiled_tok_s=None):
    body = step_profile.profile_level(
        _client(server, seed=99), LEVEL, steps=STEPS, unprofiled_tok_s=unprofiled_tok_s
    )
    return LevelProfile.model_validate(body)


def _steps_add_up(rank):
    for step in rank.steps:
        total = sum(step.classes.values())
        assert total == pytest.approx(step.wall_us, rel=0.05), step


def test_a_profiled_level_at_tp_1_breaks_its_decode_steps_down_with_no_communication(
    vllm_profiled,
):
    before = _round(vllm_profiled, seed=1)
    profile = _profiled(vllm_profiled, unprofiled_tok_s=before["output_throughput"])

    assert profile.status == "captured", profile.reason
    breakdown = profile.breakdown
    assert (breakdown.engine, breakdown.engine_version) == ("vllm", "0.32.0")
    assert [r.rank for r in breakdown.ranks] == [0]
    rank = breakdown.ranks[0]
    assert rank.device == "cpu"
    decode = rank.kind("decode")
    assert decode is not None and decode.steps >= STEPS // 2
    assert sum(k.steps for k in rank.kinds) <= STEPS
    assert [c.name for c in decode.classes] == list(CLASSES)
    assert decode.share("communication") == 0
    assert decode.share("moe") > 0 and decode.share("gemm") > 0 and decode.share("attention") > 0
    assert sum(c.share for c in decode.classes) == pytest.approx(1, abs=0.05)
    _steps_add_up(rank)
    # every rank's trace stays on this host, named with its size
    assert profile.traces and all(t.size_bytes > 0 for t in profile.traces)
    assert any("rank0" in t.path for t in profile.traces)
    # the window's cost, beside the breakdown
    assert profile.cost.unprofiled_tok_s == before["output_throughput"]
    assert profile.cost.ratio == pytest.approx(
        before["output_throughput"] / profile.cost.profiled_tok_s
    )
    assert profile.window_s > 0


def test_at_tp_2_each_rank_spends_a_share_of_its_decode_step_in_the_all_reduce(
    vllm_profiled_tp2,
):
    profile = _profiled(vllm_profiled_tp2)

    assert profile.status == "captured", profile.reason
    ranks = profile.breakdown.ranks
    assert [r.rank for r in ranks] == [0, 1]
    for rank in ranks:
        communication = next(c for c in rank.kind("decode").classes if c.name == "communication")
        assert communication.share > 0, rank.rank
        assert any(_all_reduce_op() in top.name for top in communication.top), communication.top
        _steps_add_up(rank)
    # about a quarter of a decode step, the mean of the ranks: the rank that arrives first at
    # each all-reduce waits there for the other, so one rank's share can be far above the other's
    mean = profile.breakdown.mean_share("decode", "communication")
    assert 0.05 < mean < 0.6, mean


def test_an_engine_started_without_the_profiler_gets_a_sentence_saying_how(vllm_capped):
    profile = _profiled(vllm_capped)

    assert profile.status == "unavailable"
    assert profile.breakdown is None
    assert "was not started with a torch profiler" in profile.reason
    assert "--profiler-config" in profile.reason and "torch_profiler_dir" in profile.reason
    assert "Traceback" not in profile.reason


@pytest.mark.quiet
def test_the_window_ends_when_asked_the_level_after_it_runs_as_before(vllm_profiled):
    before = [_round(vllm_profiled, seed=200 + n)["output_throughput"] for n in range(5)]
    profile = _profiled(vllm_profiled)
    after = [_round(vllm_profiled, seed=300 + n)["output_throughput"] for n in range(5)]

    assert profile.status == "captured", profile.reason
    # a window left open would slow every later step by the profiler's cost: ×2.8 on this
    # build (bench/RESULTS.md); the rounds of one level here vary by about 10 %
    assert statistics.median(after) >= 0.7 * statistics.median(before), (before, after)


def test_the_load_generator_profiles_a_level_into_its_output_file(vllm_profiled, tmp_path):
    out = tmp_path / "sweep.json"
    argv = [
        sys.executable,
        "-m",
        "workers.loadgen",
        "--base-url",
        vllm_profiled.url,
        "--model",
        SERVED_MODEL,
        "--vocab-size",
        str(VOCAB_SIZE),
        "--concurrency",
        "2,4",
        "--input-len",
        "64",
        "--output-len",
        "48",
        "--prompts-per-level",
        "8",
        "--profile-levels",
        "4",
        "--profile-steps",
        str(STEPS),
        "--output",
        str(out),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)

    assert done.returncode == 0, done.stderr
    written = json.loads(out.read_text())
    assert [level["concurrency"] for level in written["levels"]] == [2, 4]
    (profile,) = [LevelProfile.model_validate(p) for p in written["profiles"]]
    assert (profile.concurrency, profile.status) == (4, "captured")
    assert "concurrency 4: profile captured" in done.stdout
    assert "decode" in done.stdout and "communication"[:6] in done.stdout


@pytest.fixture
def tiny_model(transactional_db):
    config = json.loads((MODEL_DIR / "config.json").read_text())
    return ModelSpec.objects.create(name="tiny-moe (random weights)", config_json=config)


def _stack(make_sweep_stack, tiny_model, server, tp):
    return make_sweep_stack(
        engine_url=server.url,
        model=tiny_model,
        deployment_fields={"engine": "vllm", "tp": tp, "served_model_name": SERVED_MODEL},
    )


def _profiled_sweep(stack, label):
    run = stack.start_sweep(
        (2, 4),
        input_len=64,
        output_len=48,
        prompts_per_level=16,
        label=label,
        profile={"levels": [4], "steps": STEPS},
    )
    run = stack.wait_for_run(run, timeout=500)
    assert run.status == "succeeded", run.error
    return run


def _decode_bars(html, profile):
    """{class: [mean µs per rank]} of the run page's decode-step bars of that profile."""
    bars = pb.figure(html, f"step-{profile.pk}-decode-data")["data"]
    return {bar["name"]: bar["x"] for bar in bars}


def test_a_newcomer_reads_where_a_decode_step_goes_per_rank_at_tp_1_and_tp_2_and_compares_them(
    make_sweep_stack, tiny_model, vllm_profiled, vllm_profiled_tp2
):
    one = _profiled_sweep(_stack(make_sweep_stack, tiny_model, vllm_profiled, 1), "TP 1")
    two = _profiled_sweep(_stack(make_sweep_stack, tiny_model, vllm_profiled_tp2, 2), "TP 2")
    browser = Client()
    pb.sign_in(browser)

    (profile_one,) = one.profiles.all()
    (profile_two,) = two.profiles.all()
    assert (profile_one.status, profile_two.status) == ("captured", "captured")
    # the profiled pass is no round of its level: the level keeps the rounds the sweep asked for
    assert [lv.concurrency for lv in one.levels.order_by("concurrency")] == [2, 4]
    page_one = browser.get(f"/runs/{one.uuid}/").content.decode()
    page_two = browser.get(f"/runs/{two.uuid}/").content.decode()
    assert "Inside the step at concurrency 4" in page_one
    bars_one, bars_two = _decode_bars(page_one, profile_one), _decode_bars(page_two, profile_two)
    # one bar per rank; communication appears at TP 2 and not at TP 1
    assert len(bars_one["moe"]) == 1 and len(bars_two["moe"]) == 2
    assert bars_one["communication"] == [0]
    assert sum(bars_two["communication"]) > 0
    assert "Profiling cost: the profiled pass ran at" in page_one
    assert _all_reduce_op() in page_two

    compare = browser.get(f"/compare/?run={one.uuid},{two.uuid}").content.decode()
    assert "communication" in compare and "of a decode step" in compare
    change = profile_two.step_breakdown().mean_share("decode", "communication")
    assert f"0 % → {round(100 * change)} %" in compare
