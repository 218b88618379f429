"""The fault suite: real processes (tests/stack.py) broken the way production breaks them, and
for each the run's final state with its exact level and sample counts.

The stand-in caps its batch at 16 (tests/stack.py); a level sends 4 prompts per stream.
"""

import json
import os
import signal
import time

from django.utils.html import escape

from domain.jobs import FINISHED_STATUSES
from moeops import jobs
from moeops.fleet.models import Host
from moeops.runs import services as run_services
from moeops.runs.models import LevelResult, SweepRun
from moeops.runs.samples import TelemetryBatch
from tests import page_base as pb
from tests.stack import FAULT_SUITE
from workers.client import Spool

pytest_plugins = ["tests.stack"]
pytestmark = FAULT_SUITE

QUEUEING = ("queueing", "running-cap")


def _counts(run):
    """[(concurrency, completed, failed)] of the run's levels."""
    return [(lv.concurrency, lv.completed, lv.failed) for lv in run.levels.order_by("concurrency")]


def _engine_batches_stored_once(run):
    # every batch the worker pushed is stored once, whole: its count is its rows
    counts = TelemetryBatch.objects.filter(run=run, kind="engine").values_list("count", flat=True)
    assert run.engine_samples.count() == sum(counts) > 0
    stamps = list(run.engine_samples.values_list("ts", flat=True))
    assert len(stamps) == len(set(stamps))


def _level_running(index):
    # the worker reports progress every second: level `index` (0-based) has requests done
    return lambda run: (
        run.progress.get("level_index") == index and run.progress.get("requests_done", 0) > 0
    )


def test_a_pool_process_killed_mid_level_resumes_it_and_keeps_each_attempts_samples_apart(
    make_sweep_stack,
):
    stack = make_sweep_stack()
    # level 64 runs 16 waves of 64 steps (about 12 s): the reporter pushes its engine samples
    # every 5 s, so a batch of them is stored well before it ends
    run = stack.start_sweep([8, 64], output_len=64)
    run = stack.wait_for_run(
        run, until=lambda r: r.engine_samples.filter(level_concurrency=64).exists()
    )
    first = LevelResult.objects.get(run=run)
    assert first.concurrency == 8

    # the pool process running the task dies mid-level: Celery hands the task out again
    (task_pid,) = stack.worker.task_pids()
    os.kill(task_pid, signal.SIGKILL)
    killed_at = time.time()
    assert not run.levels.filter(concurrency=64).exists()
    run = stack.wait_for_run(run)

    assert run.status == "succeeded", run.error
    levels = list(run.levels.order_by("concurrency"))
    assert [(lv.concurrency, lv.completed, lv.failed, lv.attempt) for lv in levels] == [
        (8, 32, 0, 1),
        (64, 256, 0, 2),
    ]
    # the level finished before the kill is the same row, not a second run of it
    assert (levels[0].pk, levels[0].started_at) == (first.pk, first.started_at)
    assert levels[1].started_at > killed_at
    log = stack.worker.log()
    assert "WorkerLostError" in log or "SIGKILL" in log
    assert "resuming a run whose worker stopped" in log

    # the samples the killed attempt took of level 64 stay stored, but describe no level: the
    # analysis counts the others only
    samples = list(run.engine_samples.all())
    cut_short = [s for s in samples if s.level_concurrency == 64 and s.ts < killed_at]
    assert cut_short and any(s.level_concurrency == 64 and s.ts > killed_at for s in samples)
    assert {s.attempt for s in samples if s.ts < killed_at} == {1}
    assert {s.attempt for s in samples if s.ts > killed_at} == {2}
    findings = stack.wait_for_findings(run, [QUEUEING])
    assert findings[QUEUEING].evidence["engine_samples"] == len(samples) - len(cut_short)
    kept = run.samples_of_stored_attempts(run.engine_samples)
    assert kept.count() == len(samples) - len(cut_short)
    # the API hands out each sample's attempt
    listed = stack.api_get(f"/runs/{run.uuid}/engine-samples?limit=1000")["items"]
    assert sorted(s["attempt"] for s in listed) == sorted(s.attempt for s in samples)


def test_a_whole_worker_killed_is_replaced_and_the_sweep_resumes(make_sweep_stack):
    stack = make_sweep_stack(MOEOPS_HEARTBEAT_S="0.5")
    run = stack.start_sweep([8, 16, 32], output_len=64)
    run = stack.wait_for_run(run, until=_level_running(1))

    # the host's worker vanishes (SIGKILL to every process): its task stays unacked in Redis,
    # which would hand it out again only after the visibility timeout (hours)
    stack.worker.kill()
    time.sleep(2)
    assert jobs.fail_stale_jobs()["runs resent"] == 0
    assert SweepRun.objects.get(pk=run.pk).status == "running"
    # the worker started again; the web tier's reaper, as beat runs it, sends the sweep again
    stack.worker.start()

    def resumed(run):
        jobs.fail_stale_jobs()
        return run.status in FINISHED_STATUSES

    run = stack.wait_for_run(run, until=resumed)

    assert run.status == "succeeded", run.error
    assert _counts(run) == [(8, 32, 0), (16, 64, 0), (32, 128, 0)]
    assert [lv.attempt for lv in run.levels.order_by("concurrency")] == [1, 2, 2]
    assert run.progress["attempt"] == 2 and run.progress["levels_done"] == 3
    _engine_batches_stored_once(run)


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
    spooled_batches = {
        e["body"]["batch_id"]: len(e["body"]["samples"])
        for e in spooled
        if e["path"].endswith("/engine-samples")
    }
    assert spooled_batches

    stack.proxy.up()
    run = stack.wait_for_run(run, timeout=60)

    assert run.status == "succeeded", run.error
    assert _counts(run) == [(8, 32, 0), (16, 64, 0), (32, 128, 0)]
    # the last push is deleted from the spool just after the web tier took it
    assert stack.wait_for_empty_spool() == []
    assert not (stack.spool_dir / "rejected").exists()
    # each batch that waited in the spool is stored once with every sample it held
    stored_batches = dict(
        TelemetryBatch.objects.filter(run=run, batch_id__in=spooled_batches).values_list(
            "batch_id", "count"
        )
    )
    assert stored_batches == spooled_batches
    _engine_batches_stored_once(run)
    assert set(run.engine_samples.values_list("level_concurrency", flat=True)) >= {16, 32}


def _poison(spool, run, refusals):
    """A spooled level the API refuses (a negative duration: 400), refused `refusals` times
    an hour ago (spool's clock), so that it is due now."""
    entry = spool.append("POST", f"/runs/{run.uuid}/levels", {"concurrency": 8, "duration": -3})
    for _ in range(refusals):
        spool.failed(entry, spool.read(entry), "400: duration: must not be negative", refused=True)
    return entry


def test_a_poison_push_is_moved_aside_and_holds_back_no_other_result(make_sweep_stack, client):
    stack = make_sweep_stack(start_worker=False, MOEOPS_HEARTBEAT_S="0.5")
    # two pushes an older sweep of this host left in its spool, which the API refuses; laid
    # before the worker starts, since its start-up probe pushes and so replays the spool
    older = [run_services.run_create(deployment=stack.deployment)[0] for _ in range(2)]
    spool = Spool(stack.spool_dir, clock=lambda: time.time() - 3600)
    spent = _poison(spool, older[0], refusals=4)
    fresh = _poison(spool, older[1], refusals=0)
    stack.worker.start()

    run = stack.start_sweep([8, 16], output_len=32)
    run = stack.wait_for_run(run)

    assert run.status == "succeeded", run.error
    assert _counts(run) == [(8, 32, 0), (16, 64, 0)]
    _engine_batches_stored_once(run)
    assert not LevelResult.objects.filter(run__in=older).exists()
    # the fifth refusal moved the spent one aside, with the API's reason
    assert not spent.exists()
    rejected = stack.spool_dir / "rejected"
    assert [p.name for p in rejected.glob("*.json")] == [spent.name]
    reason = (rejected / f"{spent.stem}.reason.txt").read_text()
    assert reason.startswith("400: ") and "duration" in reason and "(5 failures since" in reason
    # the other waits its backoff, refused fewer than five times; nothing else waits
    assert stack.spooled() == [fresh]
    record = json.loads(fresh.read_bytes())
    assert 1 <= record["failures"] < 5 and record["error"].startswith("400: ")

    # the host's heartbeat says so, and its page shows it
    def reported():
        host = Host.objects.get(pk=stack.host.pk)
        spool = host.worker_status.get("spool")
        return host if spool == {"waiting": 1, "rejected": 1} else None

    host = stack.wait_until(reported, 10, "heartbeat counting the rejected push")
    pb.sign_in(client)
    page = client.get(f"/hosts/{host.name}/").content.decode()
    assert "1 rejected pushes" in page


def test_an_engine_stopped_mid_level_fails_the_sweep_at_the_next_level(make_sweep_stack):
    stack = make_sweep_stack()
    run = stack.start_sweep([8, 32, 64], output_len=64)
    run = stack.wait_for_run(run, until=_level_running(1))

    # the engine dies mid-level (SIGKILL, as an OOM kill does): streams break, connects fail
    stack.standin.kill()
    stack.standin.wait(10)
    killed_at = time.time()
    run = stack.wait_for_run(run)

    assert run.status == "failed"
    levels = {lv.concurrency: lv for lv in run.levels.all()}
    assert (levels[8].completed, levels[8].failed) == (32, 0)
    cut = levels[32]
    assert cut.completed > 0 and cut.failed > 0 and cut.completed + cut.failed == 128
    # the streams in flight broke mid-body (at most the 32 of the level); the requests sent
    # after met a kept-alive connection the dead engine had closed, or nothing listening
    assert set(cut.errors) <= {"stream_dropped", "connection_closed", "connect_error"}
    assert sum(cut.errors.values()) == cut.failed and cut.errors.get("stream_dropped", 0) <= 32
    assert (levels[64].completed, levels[64].failed, levels[64].errors) == (
        0,
        256,
        {"connect_error": 256},
    )
    engine = stack.standin_url.removeprefix("http://")
    assert run.error.startswith(
        f"every request at concurrency 64 failed: connect error: connecting to {engine}: "
    )
    assert run.error.endswith(". The sweep stopped there.")
    # no engine sample is made up once the engine is gone
    assert not run.engine_samples.filter(ts__gt=killed_at).exists()
    _engine_batches_stored_once(run)


def test_a_worker_cut_off_from_its_broker_says_so_and_sweeps_once_it_is_back(
    make_sweep_stack, client
):
    stack = make_sweep_stack(broker_via_proxy=True, start_worker=False, MOEOPS_HEARTBEAT_S="0.5")
    # the worker's broker port refuses connections; the web tier reaches Redis and enqueues
    stack.broker_proxy.down()
    stack.worker.start(wait_ready=False)
    run = stack.start_sweep([8, 16], output_len=32)
    broker = f"127.0.0.1:{stack.broker_proxy.port}"
    # Celery's own retries, which alone said nothing to anyone but this log
    stack.worker.wait_for_log(f"Cannot connect to redis://:**@{broker}", 30)

    def cut_off():
        host = Host.objects.get(pk=stack.host.pk)
        return host if host.worker_alive() and host.worker_absence() else None

    host = stack.wait_until(cut_off, 30, "heartbeat saying the broker is out of reach")
    absence = host.worker_absence()
    assert absence.startswith(f"The worker of host {host.name} is running but cannot reach")
    assert broker in absence and "Connection refused" in absence
    pb.sign_in(client)
    status = client.get(f"/runs/{run.uuid}/status.json").json()
    assert status["status"] == "queued"
    assert status["progress"]["text"] == f"queued: {absence}"
    assert escape(absence) in client.get(f"/hosts/{host.name}/").content.decode()
    assert not run.levels.exists() and not run.engine_samples.exists()

    stack.broker_proxy.up()
    run = stack.wait_for_run(run, timeout=90)

    assert run.status == "succeeded", run.error
    assert _counts(run) == [(8, 32, 0), (16, 64, 0)]
    _engine_batches_stored_once(run)
    # the next heartbeat takes it back
    stack.wait_until(
        lambda: Host.objects.get(pk=host.pk).worker_absence() == "" or None,
        10,
        "heartbeat saying the broker is reached again",
    )
