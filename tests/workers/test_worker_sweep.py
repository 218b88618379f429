"""workers.sweep.run_sweep without Celery: a live Django server, the real REST client and an
in-process stand-in engine; NVML is the fake of tests/fakes.py where a test needs GPUs."""

import json
import socket
import statistics
import subprocess
import sys
import threading
import time

import pytest

from domain.intervals import median_interval
from localstack.standin import StandinConfig, start_standin_in_thread
from moeops.api.models import ApiToken
from moeops.fleet.models import Deployment, Host, ModelSpec
from moeops.runs import measurements, services
from moeops.runs.models import SweepRun
from tests.fakes import ROOT, FakeNVML, h200
from workers import loadgen, sweep
from workers.client import MoeopsClient

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]
CONFIG = ROOT / "moeops/examples/glm-5-fp8_config.json"


@pytest.fixture
def standin():
    # 2 ms a step, not the stand-in's 8: these tests count what a sweep stores, not its speed
    url, stop = start_standin_in_thread(
        StandinConfig(model="m", max_running_requests=16, step_ms_base=2.0)
    )
    yield url
    stop()


@pytest.fixture
def world(live_server, standin, tmp_path):
    host = Host.objects.create(name="gpu-1")
    _, token = ApiToken.issue(name="worker", host=host)
    model = ModelSpec.objects.create(name="GLM-5", config_json=json.loads(CONFIG.read_text()))
    deployment = Deployment.objects.create(
        name="glm", model=model, host=host, endpoint_url=standin, served_model_name="m"
    )
    client = MoeopsClient(
        live_server.url, token, spool_dir=tmp_path / "spool", retries=1, backoff_s=0.05
    )
    yield deployment, client
    client.close()


def _run(deployment, levels=(4, 8), **extra):
    parameters = {
        "base_url": deployment.endpoint_url,
        "model": "m",
        "levels": list(levels) or None,
        "input_len": 8,
        "output_len": 16,
        "vocab_size": 154880,
        **extra,
    }
    run, _ = services.run_create(deployment=deployment, parameters=parameters)
    return run


def _sweep(run, client, **kwargs):
    return sweep.run_sweep(str(run.uuid), run.parameters, client=client, **kwargs)


def test_a_run_without_a_vocabulary_the_server_cannot_tell_fails_saying_what_to_give(world):
    deployment, client = world
    run = _run(deployment, vocab_size=None)

    assert _sweep(run, client) == "failed"

    run.refresh_from_db()
    assert run.levels.count() == 0
    assert "the model's vocabulary is unknown" in run.error
    assert "--tokenizer PATH" in run.error


def test_it_records_what_the_engine_said_of_itself_once(world):
    deployment, client = world
    run = _run(deployment, levels=(4,))
    recorded_before = run.snapshot["deployment"]

    assert _sweep(run, client) == "succeeded"

    run.refresh_from_db()
    engine = run.snapshot["engine"]
    assert (engine["engine"], engine["max_running_requests"]) == ("standin", 16)
    assert engine["args_source"] == "/get_server_info"
    assert run.snapshot["kernel_config"]["state"] == "not_applicable"
    assert run.snapshot["client"]["host"] == socket.gethostname()
    assert run.snapshot["deployment"] == recorded_before
    # a second report (a resumed sweep) does not rewrite the first
    assert not services.run_record_observed(run=run, observed={"engine": {"engine": "vllm"}})
    run.refresh_from_db()
    assert run.snapshot["engine"]["engine"] == "standin"


def test_it_claims_the_run_and_stores_each_level_once(world):
    deployment, client = world
    run = _run(deployment)

    assert _sweep(run, client) == "succeeded"

    run.refresh_from_db()
    assert run.status == "succeeded"
    assert [lv.concurrency for lv in run.levels.order_by("concurrency")] == [4, 8]
    assert run.progress["levels_done"] == run.progress["levels_total"] == 2
    assert run.progress["attempt"] == 1 and {lv.attempt for lv in run.levels.all()} == {1}
    # a second delivery of a finished run does nothing
    assert _sweep(run, client) == "succeeded"
    assert run.levels.count() == 2


def test_gpu_telemetry_is_stored_tagged_with_its_level(world):
    deployment, client = world
    run = _run(deployment, levels=(4, 8), gpu_indices=[1], prompts_per_level=48)
    nvml = FakeNVML([h200(), h200(util=93, power_mw=580_000)])

    assert _sweep(run, client, nvml=nvml, telemetry_hz=10) == "succeeded"

    run.refresh_from_db()
    assert run.telemetry_status == "recorded"
    samples = list(run.telemetry.order_by("ts"))
    assert samples and {s.gpu_index for s in samples} == {1}
    assert {s.level_concurrency for s in samples} >= {4, 8}
    assert samples[0].power_w == 580.0 and samples[0].power_limit_w == 700.0
    assert nvml.inits == nvml.shutdowns == 1


def test_without_nvml_the_run_says_why_and_has_no_samples(world):
    deployment, client = world
    run = _run(deployment, levels=(4,))
    nvml = FakeNVML([], init_error="Driver Not Loaded")

    _sweep(run, client, nvml=nvml)

    run.refresh_from_db()
    assert run.telemetry_status == "unavailable"
    assert run.telemetry_detail == "NVML did not initialise: Driver Not Loaded"
    assert not run.telemetry.exists()
    assert run.engine_samples.exists()


def test_a_cancel_stops_at_the_next_request_and_keeps_every_finished_request(world):
    deployment, client = world
    # 16 then 4 streams, 32 prompts each: the second level runs 8 waves of ~0.5 s
    run = _run(deployment, levels=(16, 4, 8), output_len=192, prompts_per_level=32)
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(status=_sweep(run, client)))
    thread.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        progress = SweepRun.objects.get(pk=run.pk).progress
        if progress.get("concurrency") == 4 and progress.get("requests_done"):
            break
        time.sleep(0.05)
    services.run_cancel(run=SweepRun.objects.get(pk=run.pk))
    thread.join(30)

    run.refresh_from_db()
    assert outcome["status"] == run.status == "cancelled"
    levels = {lv.concurrency: lv for lv in run.levels.all()}
    # the finished level stays whole; the one the cancel cut short keeps its finished requests
    assert set(levels) == {16, 4}
    assert levels[16].completed == 32 and not levels[16].is_partial
    assert levels[4].is_partial and levels[4].requests_planned() == 32
    assert 0 < levels[4].completed < 32 and levels[4].output_throughput > 0


def test_a_redelivered_run_skips_the_levels_already_stored(world):
    deployment, client = world
    run = _run(deployment, levels=(4, 8))
    services.run_transition(run=run, status="running")
    kept, _ = measurements.level_record(run=run, concurrency=4, completed=1, output_throughput=1.0)
    # its worker's last heartbeat is long gone
    SweepRun.objects.filter(pk=run.pk).update(progress={"heartbeat": time.time() - 60})

    assert _sweep(run, client) == "succeeded"

    levels = list(run.levels.order_by("concurrency"))
    assert [lv.concurrency for lv in levels] == [4, 8]
    assert levels[0].pk == kept.pk and levels[0].output_throughput == 1.0
    assert levels[1].completed == 32


def _left_by_a_gone_worker(run, attempt=1):
    """The run running as `attempt`, whose worker's heartbeat is long gone."""
    services.run_transition(run=run, status="running")
    progress = {"heartbeat": time.time() - 60, "attempt": attempt}
    SweepRun.objects.filter(pk=run.pk).update(progress=progress)


def test_a_resumed_run_marks_its_levels_and_samples_with_the_next_attempt(world):
    deployment, client = world
    run = _run(deployment, levels=(4, 8), gpu_indices=[0], prompts_per_level=48)
    # the second delivery died in level 8, after the first had stored level 4
    _left_by_a_gone_worker(run, attempt=2)
    measurements.level_record(run=run, concurrency=4, completed=1, output_throughput=1.0)

    assert _sweep(run, client, nvml=FakeNVML([h200()]), telemetry_hz=10) == "succeeded"

    run.refresh_from_db()
    assert run.progress["attempt"] == 3
    assert {lv.concurrency: lv.attempt for lv in run.levels.all()} == {4: 1, 8: 3}
    assert run.telemetry.exists() and run.engine_samples.exists()
    assert set(run.telemetry.values_list("attempt", flat=True)) == {3}
    assert set(run.engine_samples.values_list("attempt", flat=True)) == {3}


def test_of_two_deliveries_that_found_the_worker_gone_one_takes_the_run_over(world):
    deployment, client = world
    run = _run(deployment, levels=(4,))
    _left_by_a_gone_worker(run)
    stale = client.get_run(str(run.uuid))
    other = {"host": "another-host", "pid": 1}
    reads = []

    def get_run(ref):
        # the other delivery takes the run over between this one's first read and its write
        reads.append(ref)
        if len(reads) == 1:
            progress = {"heartbeat": time.time(), "worker": other}
            services.run_take_over(run=run, attempt=2, progress=progress)
            return stale
        return MoeopsClient.get_run(client, ref)

    client.get_run = get_run
    assert _sweep(run, client) == sweep.BUSY

    run.refresh_from_db()
    assert len(reads) == 2
    assert (run.progress["attempt"], run.progress["worker"]) == (2, other)
    assert not run.levels.exists()


def test_a_takeover_whose_answer_was_lost_is_recognised_as_this_deliverys(world):
    deployment, client = world
    run = _run(deployment, levels=(4,))
    _left_by_a_gone_worker(run)

    def take_over_run(ref, attempt, progress):
        # the takeover is stored, but its answer is lost and the retry is refused (409)
        MoeopsClient.take_over_run(client, ref, attempt, progress)
        return MoeopsClient.take_over_run(client, ref, attempt, progress)

    client.take_over_run = take_over_run
    assert _sweep(run, client) == "succeeded"

    run.refresh_from_db()
    assert run.progress["attempt"] == 2 and [lv.attempt for lv in run.levels.all()] == [2]


def _swept_with(run, client, monkeypatch, meanwhile):
    """The run swept with meanwhile() done as each of its levels starts, progress pushed every
    0.05 s: (the sweep's outcome, the seconds it took)."""
    run_level = sweep.loadgen.run_level

    def meanwhile_then_run(*args, **kwargs):
        meanwhile()
        return run_level(*args, **kwargs)

    monkeypatch.setattr(sweep.loadgen, "run_level", meanwhile_then_run)
    started = time.monotonic()
    outcome = _sweep(run, client, progress_interval_s=0.05)
    return outcome, time.monotonic() - started


def test_a_delivery_taken_over_mid_level_stops_and_leaves_the_run_be(world, monkeypatch):
    deployment, client = world
    run = _run(deployment, levels=(4, 8), prompts_per_level=400, output_len=64)

    def taken_over():
        # the worker was thought gone: another delivery takes the run over as attempt 2
        progress = {"heartbeat": time.time(), "worker": {"host": "another-host", "pid": 1}}
        services.run_take_over(run=run, attempt=2, progress=progress)

    outcome, seconds = _swept_with(run, client, monkeypatch, taken_over)
    assert outcome == sweep.TAKEN_OVER

    # its next progress push was refused: it stopped the level at once, stored none of it
    # and left the run's end to the delivery that took it over
    assert seconds < 5
    run.refresh_from_db()
    assert (run.status, run.progress["attempt"]) == ("running", 2)
    assert run.progress["worker"]["host"] == "another-host"
    assert not run.levels.exists()


def test_a_delivery_whose_run_was_cancelled_as_gone_stops_and_stores_nothing_more(
    world, monkeypatch
):
    deployment, client = world
    run = _run(deployment, levels=(4, 8), prompts_per_level=400, output_len=64)

    def cancelled():
        # the worker's heartbeat looked stale to a cancel, which ended the run at once
        running = SweepRun.objects.get(pk=run.pk)
        services.run_transition(run=running, status="cancelled", error="cancelled as gone")

    outcome, seconds = _swept_with(run, client, monkeypatch, cancelled)
    assert outcome == sweep.TAKEN_OVER

    # its progress, its cut level and its samples are refused (409): it stops at once, with
    # nothing spooled to retry, and the run stays as the cancel left it
    assert seconds < 5
    run.refresh_from_db()
    assert (run.status, run.error) == ("cancelled", "cancelled as gone")
    assert not run.levels.exists() and not run.engine_samples.exists()
    assert client.spool.entries() == []


def test_a_run_another_worker_is_sweeping_is_left_alone(world):
    deployment, client = world
    run = _run(deployment, levels=(4,))
    services.run_transition(run=run, status="running")
    SweepRun.objects.filter(pk=run.pk).update(progress={"heartbeat": time.time()})

    assert _sweep(run, client) == sweep.BUSY
    assert not run.levels.exists()


def test_a_cancelled_queued_run_is_not_swept(world):
    deployment, client = world
    run = _run(deployment, levels=(4,))
    services.run_cancel(run=run)

    assert _sweep(run, client) == "cancelled"
    assert not run.levels.exists()


def test_an_engine_that_fails_every_request_fails_the_run_with_the_evidence(world):
    deployment, client = world
    run = _run(deployment, levels=(4, 8), base_url="http://127.0.0.1:9")

    assert _sweep(run, client) == "failed"

    run.refresh_from_db()
    assert run.status == "failed"
    assert "every request at concurrency 4 failed" in run.error
    (level,) = run.levels.all()
    assert level.completed == 0 and level.failed == 16
    assert set(level.errors) == {"connect_error"}


def test_a_sweep_out_of_time_ends_failed_keeping_its_levels(world):
    deployment, client = world
    run = _run(deployment, levels=(4, 8))

    assert _sweep(run, client, deadline=time.monotonic()) == "failed"

    run.refresh_from_db()
    assert "ran out of time" in run.error
    assert not run.levels.exists()


def test_a_run_whose_worker_process_died_on_this_host_is_taken_over_at_once(world):
    deployment, client = world
    run = _run(deployment, levels=(4,))
    services.run_transition(run=run, status="running")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    worker = {"host": socket.gethostname(), "pid": dead.pid}
    SweepRun.objects.filter(pk=run.pk).update(progress={"heartbeat": time.time(), "worker": worker})

    assert _sweep(run, client) == "succeeded"
    assert run.levels.count() == 1


def test_each_level_runs_its_rounds_and_stores_each_with_its_own_figures(world):
    deployment, client = world
    run = _run(deployment, levels=(4, 8), rounds=3)

    assert _sweep(run, client) == "succeeded"

    run.refresh_from_db()
    assert run.progress["levels_done"] == 2 and run.progress["rounds"] == 3
    for level in run.levels.order_by("concurrency"):
        rounds = list(level.rounds.all())
        assert [r.round for r in rounds] == [1, 2, 3] and level.round_count == 3
        # each round sent the level's own requests: 4 per stream
        assert [r.figures["completed"] for r in rounds] == [4 * level.concurrency] * 3
        assert level.completed == 12 * level.concurrency
        throughputs = [r.figures["output_throughput"] for r in rounds]
        assert level.output_throughput == sorted(throughputs)[1]
        assert level.interval("output_throughput") == pytest.approx(median_interval(throughputs))


def test_a_redelivered_run_skips_the_rounds_already_stored(world):
    deployment, client = world
    run = _run(deployment, levels=(4,), rounds=3)
    services.run_transition(run=run, status="running")
    kept, _ = measurements.level_record(run=run, concurrency=4, completed=1, output_throughput=1.0)
    SweepRun.objects.filter(pk=run.pk).update(progress={"heartbeat": time.time() - 60})

    assert _sweep(run, client) == "succeeded"

    (level,) = run.levels.all()
    rounds = list(level.rounds.all())
    assert [r.round for r in rounds] == [1, 2, 3]
    assert rounds[0].figures["completed"] == 1 and rounds[1].figures["completed"] == 16
    assert [r.attempt for r in rounds] == [1, 2, 2]


def test_a_redelivered_run_reruns_its_cut_round_with_prompts_the_first_delivery_never_sent(
    world, monkeypatch
):
    deployment, client = world
    run = _run(deployment, levels=(4,), rounds=3, seed=5)
    services.run_transition(run=run, status="running")
    measurements.level_record(run=run, concurrency=4, completed=1, output_throughput=1.0)
    SweepRun.objects.filter(pk=run.pk).update(progress={"heartbeat": time.time() - 60})
    seeds = []
    real = loadgen.run_level

    async def run_level(client_cfg, level, **kwargs):
        seeds.append(client_cfg.seed)
        return await real(client_cfg, level, **kwargs)

    monkeypatch.setattr(loadgen, "run_level", run_level)

    assert _sweep(run, client) == "succeeded"

    # rounds 2 and 3 of the second delivery; the first sent rounds 1-3 from 5, 6 and 7, and the
    # engine's prefix cache holds what round 2 of it had finished when it was cut
    assert len(seeds) == 2 and seeds[1] == seeds[0] + 1
    assert not {5, 6, 7} & set(seeds)


def test_a_resumed_capacity_search_judges_the_levels_stored_and_finishes_the_cut_one(world):
    deployment, client = world
    slo = {"profile": "loose", "limits": {"tpot": ["p99", 10000.0]}, "max_failed_percent": 1.0}
    run = _run(deployment, levels=(), kind="capacity", slo=slo, start=2, end=4, rounds=3)
    services.run_transition(run=run, status="running")
    for number in (1, 2, 3):
        measurements.level_record(
            run=run, round=number, concurrency=2, completed=8, p99_tpot_ms=5.0 + number
        )
    cut, _ = measurements.level_record(run=run, concurrency=4, completed=16, p99_tpot_ms=6.0)
    SweepRun.objects.filter(pk=run.pk).update(progress={"heartbeat": time.time() - 60})

    assert _sweep(run, client) == "succeeded"

    levels = {lv.concurrency: lv for lv in run.levels.all()}
    assert sorted(levels) == [2, 4]
    # level 2 was judged as stored, level 4 ran its two missing rounds
    assert [r.attempt for r in levels[2].rounds.all()] == [1, 1, 1]
    assert [(r.round, r.attempt) for r in levels[4].rounds.all()] == [(1, 1), (2, 2), (3, 2)]
    run.refresh_from_db()
    assert run.progress["capacity"]["probes"] == [
        {"load": 2, "met": True, "met_on_medians": True},
        {"load": 4, "met": True, "met_on_medians": True},
    ]
    assert run.progress["capacity"]["end"] == "end_met"
    assert run.capacity["load"] == 4 and run.capacity["end"] == "end_met"


def _slow_rounds(monkeypatch, concurrency, slow):
    """The load generator with the p99 TPOT of the `slow` rounds (1-based, counted per level
    at `concurrency`) of that level read as 150 ms, a busy machine's odd round, and every other
    round's as 9 ms: the stand-in's own figure on a loaded machine is no part of what these
    tests judge (at load 12 on 2 cores it passed 100 ms)."""
    real = loadgen.run_level
    count = {"n": 0}

    async def run_level(client, level, **kwargs):
        result = await real(client, level, **kwargs)
        if level.concurrency == concurrency:
            count["n"] += 1
            if slow(count["n"]):
                return {**result, "p99_tpot_ms": 150.0}
        return {**result, "p99_tpot_ms": 9.0}

    monkeypatch.setattr(loadgen, "run_level", run_level)


def _straddles(figures, limit_ms):
    return median_interval(figures)[1] > limit_ms >= statistics.median(figures)


def _search_at_2(deployment):
    """A capacity search of the one load 2, 3 rounds of 8 requests of 4 tokens out, TPOT p99
    within 100 ms."""
    slo = {"profile": "p", "limits": {"tpot": ["p99", 100.0]}, "max_failed_percent": 1.0}
    return _run(
        deployment, levels=(), kind="capacity", slo=slo, start=2, end=2, rounds=3,
        prompts_per_level=8, output_len=4,
    )  # fmt: skip


def test_a_capacity_level_straddling_its_limit_runs_more_rounds_until_it_does_not(
    world, monkeypatch
):
    deployment, client = world
    run = _search_at_2(deployment)
    _slow_rounds(monkeypatch, 2, lambda n: n == 2)

    assert _sweep(run, client) == "succeeded"

    (level,) = run.levels.all()
    figures = [r.figures["p99_tpot_ms"] for r in level.rounds.all()]
    assert 3 < len(figures) < 10 and figures[1] == 150.0
    # one more round while the rounds so far straddle 100 ms, none once they do not
    assert all(_straddles(figures[:n], 100.0) for n in range(3, len(figures)))
    assert not _straddles(figures, 100.0)
    run.refresh_from_db()
    assert run.capacity["probes"] == [{"load": 2, "met": True, "met_on_medians": True}]
    assert run.capacity["load"] == 2 and level.round_count == len(figures)


def test_a_level_straddling_its_limit_after_ten_rounds_fails(world, monkeypatch):
    deployment, client = world
    run = _search_at_2(deployment)
    # every other round slow: the median meets 100 ms, the interval never comes under it
    _slow_rounds(monkeypatch, 2, lambda n: n % 2 == 0)

    assert _sweep(run, client) == "succeeded"

    levels = {lv.concurrency: lv for lv in run.levels.all()}
    assert levels[2].round_count == 10 and levels[1].round_count == 3
    run.refresh_from_db()
    assert run.capacity["probes"] == [
        {"load": 2, "met": False, "met_on_medians": True},
        {"load": 1, "met": True, "met_on_medians": True},
    ]
    assert run.capacity["load"] == 1


def test_a_resumed_search_goes_on_with_the_more_rounds_of_a_straddling_level(world, monkeypatch):
    deployment, client = world
    run = _search_at_2(deployment)
    _slow_rounds(monkeypatch, 2, lambda n: False)
    services.run_transition(run=run, status="running")
    for number, tpot in enumerate((9.0, 150.0, 9.0, 9.0), 1):
        measurements.level_record(
            run=run, round=number, concurrency=2, completed=8, p99_tpot_ms=tpot
        )
    SweepRun.objects.filter(pk=run.pk).update(progress={"heartbeat": time.time() - 60})

    assert _sweep(run, client) == "succeeded"

    (level,) = run.levels.all()
    rounds = list(level.rounds.all())
    assert [r.attempt for r in rounds[:4]] == [1, 1, 1, 1] and len(rounds) > 4
    assert {r.attempt for r in rounds[4:]} == {2}
    figures = [r.figures["p99_tpot_ms"] for r in rounds]
    assert all(_straddles(figures[:n], 100.0) for n in range(4, len(figures)))
    assert not _straddles(figures, 100.0)


def test_a_request_rate_capacity_search_sends_every_rate_with_the_runs_burstiness(world):
    deployment, client = world
    slo = {"profile": "loose", "limits": {"tpot": ["p99", 10000.0]}, "max_failed_percent": 1.0}
    run = _run(
        deployment,
        levels=(),
        kind="capacity",
        mode="request_rate",
        slo=slo,
        start=10.0,
        end=20.0,
        rounds=1,
        prompts_per_level=16,
        burstiness=0.25,
    )

    assert _sweep(run, client) == "succeeded"

    levels = list(run.levels.order_by("request_rate"))
    assert [lv.request_rate for lv in levels] == [10.0, 20.0]
    assert all(lv.raw["burstiness"] == 0.25 for lv in levels)
    run.refresh_from_db()
    assert run.capacity["load"] == 20.0


def test_a_rate_sweep_stores_a_level_per_rate_with_its_requests_and_engine_counters(world):
    deployment, client = world
    run = _run(
        deployment,
        levels=(8,),
        request_rates=[20.0, 40.0],
        burstiness=0.5,
        prompts_per_level=16,
        warmup=2,
    )

    assert _sweep(run, client) == "succeeded"

    levels = list(run.levels.order_by("request_rate"))
    assert [(lv.concurrency, lv.request_rate) for lv in levels] == [(8, 20.0), (8, 40.0)]
    for level in levels:
        assert level.achieved_request_rate > 0
        assert level.raw["burstiness"] == 0.5
        [log] = level.request_logs.all()
        assert log.count == 16 == len(log.requests())
        # the stand-in counts the generated tokens of the warm-up too, as an engine does
        figures = level.engine_figures()
        assert figures["engine"] == "standin"
        assert figures["engine_generation_tokens"] == (16 + 2) * 16
        assert figures["generation_tokens_gap"] == 0
