"""The fault suite for managed engines: the stand-in as a deployment's managed engine, started
by a real GPU-host Celery worker (tests/stack.py), with the engine's port taken by another
process, and with the worker's pool process killed while it starts an engine. What the action
and the supervisor say afterwards is what runs."""

import os
import signal
import subprocess
import sys
import time

import httpx
import psutil

from moeops.engines import services
from moeops.fleet.models import Host
from tests.stack import FAULT_SUITE, SweepStack

pytest_plugins = ["tests.stack"]
pytestmark = FAULT_SUITE


def _cap(port):
    return httpx.get(f"http://127.0.0.1:{port}/get_server_info", timeout=5).json()[
        "max_running_requests"
    ]


def test_a_restart_onto_a_port_another_engine_holds_fails_naming_it(managed_standin):
    managed = managed_standin
    # the managed engine dies; another engine (cap 64) takes its port, as a `serve` left behind
    pid = managed.engines.state(managed.deployment.pk)["pid"]
    os.killpg(pid, signal.SIGKILL)
    SweepStack.wait_until(
        lambda: True if managed.engines.state(managed.deployment.pk) is None else None, 10
    )
    taker = [sys.executable, "-m", "localstack.standin", "--port", str(managed.port)]
    taker = psutil.Popen([*taker, "--max-running-requests", "64"], stdout=subprocess.DEVNULL)
    try:
        SweepStack.wait_until(lambda: _cap(managed.port) if _try(managed.port) else None, 10)

        action = managed.act("restart")

        assert action.status == "failed", action.steps
        assert action.error.startswith(
            f"port {managed.port} is already in use by another process (pid {taker.pid}: "
        )
        assert [(s["name"], s["status"]) for s in action.steps] == [
            ("stop", "done"),
            ("kernel configs", "done"),
            ("start", "failed"),
            ("revert", "failed"),
        ]
        assert not any("healthy" in step["detail"] for step in action.steps)
        # nothing of moeops' runs, and the other engine was left as it was
        assert managed.engines.running() == []
        assert _cap(managed.port) == 64 and taker.is_running()
        host = Host.objects.get(pk=managed.host.pk)
        assert host.managed_engine(managed.deployment.pk) is None
    finally:
        taker.kill()
        taker.wait()


def _try(port):
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_pool_process_killed_mid_restart_leaves_one_engine_and_its_state_names_it(
    managed_standin,
):
    managed = managed_standin
    # a recipe that takes 3 s before it listens: the pool process dies while it waits
    slow = [
        "sh",
        "-c",
        f"sleep 3; exec {sys.executable} -m localstack.standin --port {managed.port} "
        "--max-running-requests 8",
    ]
    services.recipe_create(
        deployment=managed.deployment, argv=slow, ready_timeout_s=60, author=managed.staff
    )
    action = managed.act("restart", wait=False)

    def starting():
        state = managed.engines.state(managed.deployment.pk)
        return state if state and state["recipe"]["version"] == 2 else None

    started = SweepStack.wait_until(starting, 30, "the new recipe's start")
    for pool_pid in managed.worker.task_pids():
        os.kill(pool_pid, signal.SIGKILL)

    # Celery hands the action out again: the new delivery takes it over from the dead one
    # (workers.job), stops the engine left starting and starts one
    action = managed.action_end(action)
    assert action.status == "succeeded", (action.error, action.steps)
    assert action.progress["attempt"] == 2
    state = managed.engines.state(managed.deployment.pk)
    assert state["pid"] != started["pid"]
    assert not psutil.pid_exists(started["pid"]) or (
        psutil.Process(started["pid"]).status() == psutil.STATUS_ZOMBIE
    )
    assert _cap(managed.port) == 8
    listening = {
        os.getpgid(conn.pid)
        for conn in psutil.net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == managed.port
    }
    assert listening == {state["pid"]}
    time.sleep(2)  # a heartbeat or two later, it is still the engine recorded
    assert managed.engines.state(managed.deployment.pk)["pid"] == state["pid"]
