"""The fault suite, cancel: a sweep whose whole worker was killed is cancelled at once, not
left running until the reaper fails it minutes later."""

import time

import httpx

from domain.progress import HEARTBEAT_STALE_S
from moeops.runs.models import SweepRun
from tests.stack import FAULT_SUITE

pytest_plugins = ["tests.stack"]
pytestmark = FAULT_SUITE


def test_cancel_of_a_sweep_whose_worker_was_killed_ends_it_at_once(make_sweep_stack, settings):
    # the reaper's limit is far off: only the cancel can end the run within the test
    settings.MOEOPS_RUN_STALE_S = 300
    stack = make_sweep_stack()
    run = stack.start_sweep([8, 16, 32], output_len=64)
    run = stack.wait_for_run(
        run,
        until=lambda r: (
            r.progress.get("level_index") == 1 and r.progress.get("requests_done", 0) > 0
        ),
    )

    # the host's worker vanishes (SIGKILL to every process) mid-level
    stack.worker.kill()
    killed_at = time.time()
    time.sleep(HEARTBEAT_STALE_S + 1)
    assert SweepRun.objects.get(pk=run.pk).status == "running"

    answer = httpx.post(
        f"{stack.live_server_url}/api/v1/runs/{run.uuid}/cancel",
        headers={"Authorization": f"Bearer {stack.token}"},
        timeout=30,
    )

    assert answer.status_code == 200
    assert (answer.json()["status"], answer.json()["cancel_requested"]) == ("cancelled", False)
    assert time.time() - killed_at < 30
    run = SweepRun.objects.get(pk=run.pk)
    # the silence it was cancelled after, not the takeover rule's threshold
    silent = round(time.time() - killed_at)
    assert run.status == "cancelled" and run.error.startswith(
        "Cancelled while its worker was gone (its last heartbeat "
    )
    said = int(run.error.split("last heartbeat ")[1].split(" s ago")[0])
    assert said > HEARTBEAT_STALE_S and abs(said - silent) <= 3
    # the level finished before the kill is kept
    assert [(lv.concurrency, lv.completed, lv.failed) for lv in run.levels.all()] == [(8, 32, 0)]

    # a worker started again is handed the orphaned task and finds the run cancelled
    since = len(stack.worker.log())
    stack.worker.start(MOEOPS_VISIBILITY_TIMEOUT="3")
    stack.worker.wait_for_log("'cancelled'", 60, since=since)
    run = SweepRun.objects.get(pk=run.pk)
    assert run.status == "cancelled" and run.levels.count() == 1
