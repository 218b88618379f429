"""A sweep end to end: web tier → Redis → GPU-host Celery worker → stand-in engine → REST API.

Everything is really started (tests/stack.py); the stand-in caps its batch at
--max-running-requests 16, so throughput plateaus above concurrency 16 while requests queue.
"""

import json
import os
import signal
import time

import pytest

from moeops.runs.models import LevelResult, SweepRun

pytest_plugins = ["tests.stack"]
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def test_a_three_level_sweep_stores_levels_telemetry_status_and_engine_samples(
    sweep_stack, nvml_here
):
    run = sweep_stack.start_sweep([8, 16, 64], output_len=32)
    run = sweep_stack.wait_for_run(run)

    assert run.status == "succeeded", run.error
    levels = {level.concurrency: level for level in run.levels.all()}
    assert sorted(levels) == [8, 16, 64]
    for level in levels.values():
        assert level.failed == 0
        # prompts per level default to 4 per stream
        assert level.completed == 4 * level.concurrency
        assert level.total_output_tokens == 32 * level.completed
        assert level.usage_reported is True
        assert level.raw["concurrency"] == level.concurrency
    if nvml_here:
        assert run.telemetry_status == "recorded"
        assert {s.level_concurrency for s in run.telemetry.all()} >= {16, 64}
    else:
        # no NVML on this machine: the run says so, and no GPU number is made up
        assert run.telemetry_status == "unavailable"
        assert "NVML" in run.telemetry_detail
        assert not run.telemetry.exists()

    # the plateau: 64 streams on a batch capped at 16 give about what 16 streams give
    t8, t16, t64 = (levels[c].output_throughput for c in (8, 16, 64))
    assert t16 > 1.4 * t8
    assert abs(t64 - t16) / t16 < 0.15
    # ... and the extra streams wait: TTFT grows with the queue
    assert levels[64].median_ttft_ms > 3 * levels[16].median_ttft_ms

    samples = list(run.engine_samples.order_by("ts"))
    assert {s.level_concurrency for s in samples} >= {16, 64}
    at_64 = [s for s in samples if s.level_concurrency == 64]
    assert max(s.running for s in at_64) == 16
    assert max(s.queued for s in at_64) > 0
    # 8 streams fit the batch: a stream waits only between its arrival and the scheduler's next
    # step (a scrape can land there when the box is busy), never as a standing queue
    at_8 = sorted(s.queued for s in samples if s.level_concurrency == 8)
    if at_8:  # the first level is short: the sampler may not catch it
        assert at_8[len(at_8) // 2] == 0
        assert max(at_8) < max(s.queued for s in at_64)

    assert run.progress["levels_done"] == 3
    assert run.progress["levels_total"] == 3
    assert run.snapshot["engine"]["max_running_requests"] == 16
    assert run.is_standin and run.engine_label() == "stand-in"
    assert run.started_at is not None and run.finished_at is not None


def test_dropped_streams_are_counted_as_failures(make_sweep_stack):
    stack = make_sweep_stack(64, ["--drop-rate", "0.05", "--seed", "7"])
    run = stack.start_sweep([32], output_len=32, prompts_per_level=400)
    run = stack.wait_for_run(run)

    assert run.status == "succeeded", run.error
    level = LevelResult.objects.get(run=run)
    assert level.completed + level.failed == 400
    assert set(level.errors) == {"stream_dropped"}
    assert level.errors["stream_dropped"] == level.failed
    # 5% of 400 is 20; a binomial draw stays within 8..36 with overwhelming odds
    assert 8 <= level.failed <= 36
    # failed requests count in no latency or token figure
    assert level.total_output_tokens == 32 * level.completed


def _level_running(index):
    # the worker reports progress every second: level `index` (0-based) has requests done
    return lambda run: (
        run.progress.get("level_index") == index and run.progress.get("requests_done", 0) > 0
    )


def test_a_worker_killed_mid_sweep_resumes_without_repeating_a_level(make_sweep_stack):
    stack = make_sweep_stack()
    run = stack.start_sweep([8, 16, 32], output_len=64)
    run = stack.wait_for_run(run, until=_level_running(1))
    first = LevelResult.objects.get(run=run)
    assert first.concurrency == 8

    # the pool process running the task dies mid-level: Celery hands the task out again
    (task_pid,) = stack.worker.task_pids()
    os.kill(task_pid, signal.SIGKILL)
    run = stack.wait_for_run(run)

    assert run.status == "succeeded", run.error
    levels = list(run.levels.order_by("concurrency"))
    assert [level.concurrency for level in levels] == [8, 16, 32]
    # the level finished before the kill is the same row, not a second run of it
    assert (levels[0].pk, levels[0].started_at) == (first.pk, first.started_at)
    assert levels[1].started_at > first.finished_at
    assert all(level.completed == 4 * level.concurrency for level in levels)
    log = stack.worker.log()
    assert "WorkerLostError" in log or "SIGKILL" in log
    assert "resuming a run whose worker stopped" in log


def test_a_whole_worker_killed_is_replaced_and_the_sweep_resumes(make_sweep_stack):
    stack = make_sweep_stack()
    run = stack.start_sweep([8, 16, 32], output_len=64)
    run = stack.wait_for_run(run, until=_level_running(1))

    # the host's worker vanishes (SIGKILL to every process): its task stays unacked in Redis
    stack.worker.kill()
    time.sleep(2)
    assert SweepRun.objects.get(pk=run.pk).status == "running"
    # a new worker gives the orphaned task out again once its visibility timeout has passed
    stack.worker.start(MOEOPS_VISIBILITY_TIMEOUT="3")
    run = stack.wait_for_run(run)

    assert run.status == "succeeded", run.error
    assert [level.concurrency for level in run.levels.order_by("concurrency")] == [8, 16, 32]


def test_results_pushed_while_the_web_tier_is_down_arrive_once_it_is_back(make_sweep_stack):
    stack = make_sweep_stack(via_proxy=True)
    run = stack.start_sweep([8, 16, 32], output_len=64)
    run = stack.wait_for_run(run, until=lambda r: r.levels.exists())

    stack.proxy.down()
    stack.worker.wait_for_log("spooling", timeout=60)
    spooling = stack.worker.log().index("spooling")
    stack.worker.wait_for_log("Task workers.run_sweep", timeout=90, since=spooling)
    # the sweep ended on the worker, but the web tier has seen none of it yet
    run = SweepRun.objects.get(pk=run.pk)
    assert run.status == "running"
    stored = set(run.levels.values_list("concurrency", flat=True))
    spooled = [json.loads(path.read_text()) for path in stack.spooled()]
    spooled_levels = {
        e["body"]["concurrency"] for e in spooled if e["path"].rsplit("/", 1)[1] == "levels"
    }
    # every level is stored or waiting in the spool; a push cut off as the proxy went down can
    # be both (stored, but its answer lost), which the replay must not store twice
    assert 8 in stored and stored | spooled_levels == {8, 16, 32}
    assert spooled[-1]["method"] == "PATCH" and spooled[-1]["body"]["status"] == "succeeded"

    stack.proxy.up()
    run = stack.wait_for_run(run, timeout=60)

    assert run.status == "succeeded", run.error
    assert [level.concurrency for level in run.levels.order_by("concurrency")] == [8, 16, 32]
    # the last push is deleted from the spool just after the web tier took it
    assert stack.wait_for_empty_spool() == []
    assert not (stack.spool_dir / "rejected").exists()
    # every batch of engine samples is stored once: no sample appears twice
    stamps = list(run.engine_samples.values_list("ts", flat=True))
    assert stamps and len(stamps) == len(set(stamps))
    assert {c for c in run.engine_samples.values_list("level_concurrency", flat=True)} >= {
        16,
        32,
    }
