"""The worker's engine supervisor (workers.engine_supervisor) with real processes: the stand-in
engine as a managed engine, and a small server that reports the environment it was given."""

import json
import os
import signal
import socket
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from workers import engine_supervisor
from workers.engine_supervisor import EngineSupervisor, Recipe, SupervisorError

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)

# /health answers 200 once it listens; it writes the variables it was given to a file first
ENV_SERVER = """
import http.server, json, os, sys
json.dump({k: os.environ.get(k) for k in sys.argv[3:]}, open(sys.argv[2], "w"))
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def standin(deployment, port, *, version=1, gpus=(), cap=16):
    argv = [sys.executable, "-m", "localstack.standin", "--port", str(port)]
    argv += ["--max-running-requests", str(cap)]
    return Recipe(
        deployment=deployment,
        version=version,
        argv=argv,
        base_url=f"http://127.0.0.1:{port}",
        gpu_indices=list(gpus),
        ready_timeout_s=60,
    )


def _cap(url):
    return httpx.get(url + "/get_server_info", timeout=5).json()["max_running_requests"]


def test_it_starts_an_engine_finds_it_again_and_stops_it(supervisor, free_port, tmp_path):
    recipe = standin(7, free_port())

    state = supervisor.start(recipe)

    assert _cap(recipe.base_url) == 16
    assert state["ready_after_s"] < 60
    # a worker that starts again finds the engines it manages that still run
    again = EngineSupervisor(tmp_path / "engines")
    (found,) = again.running()
    assert (found["pid"], found["recipe"]["version"]) == (state["pid"], 1)
    with pytest.raises(SupervisorError, match="deployment 7's engine already runs"):
        supervisor.start(recipe)

    assert again.stop(7, grace_s=10) is True
    assert supervisor.running() == [] and supervisor.state(7) is None
    with pytest.raises(httpx.ConnectError):
        httpx.get(recipe.base_url + "/health", timeout=2)
    assert "starting recipe v1" in supervisor.log_tail(7, lines=200)


def test_one_managed_engine_per_gpu(supervisor, free_port):
    supervisor.start(standin(1, free_port(), gpus=[0, 1]))

    with pytest.raises(SupervisorError, match="GPU 1 is held by deployment 1's engine"):
        supervisor.start(standin(2, free_port(), gpus=[1, 2]))
    supervisor.start(standin(3, free_port(), gpus=[2, 3]))
    assert sorted(s["recipe"]["deployment"] for s in supervisor.running()) == [1, 3]


def test_the_engine_gets_its_gpus_and_its_config_folder(supervisor, free_port, tmp_path):
    port, seen = free_port(), tmp_path / "env.json"
    names = ["CUDA_VISIBLE_DEVICES", "VLLM_TUNED_CONFIG_FOLDER", "RECIPE_FLAG"]
    recipe = Recipe(
        deployment=6,
        version=1,
        argv=[sys.executable, "-c", ENV_SERVER, str(port), str(seen), *names],
        base_url=f"http://127.0.0.1:{port}",
        env={"RECIPE_FLAG": "1"},
        gpu_indices=[2, 3],
        config_env="VLLM_TUNED_CONFIG_FOLDER",
        config_folder=str(tmp_path / "tuned"),
        ready_timeout_s=30,
    )

    supervisor.start(recipe)

    assert json.loads(seen.read_text()) == {
        "CUDA_VISIBLE_DEVICES": "2,3",
        "VLLM_TUNED_CONFIG_FOLDER": str(tmp_path / "tuned"),
        "RECIPE_FLAG": "1",
    }


def test_an_engine_that_never_answers_is_stopped_and_said_so(supervisor, free_port):
    recipe = Recipe(
        deployment=8,
        version=1,
        argv=[sys.executable, "-c", "import time; print('loading weights'); time.sleep(600)"],
        base_url=f"http://127.0.0.1:{free_port()}",
        ready_timeout_s=3,
    )

    with pytest.raises(SupervisorError, match="did not answer 200 within 3 s") as failed:
        supervisor.start(recipe)

    assert "loading weights" in str(failed.value)
    assert supervisor.running() == []


def test_an_engine_is_still_found_and_stopped_after_the_clock_is_set(
    supervisor, free_port, monkeypatch
):
    # the kernel's boot time moves with the wall clock: a clock set 5 s forward (NTP, a VM
    # resumed) moves every process's wall-clock start time by as much
    recipe = standin(9, free_port())
    state = supervisor.start(recipe)
    real_boot_time = psutil._pslinux.boot_time
    monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: real_boot_time() + 5.0)

    assert supervisor.state(9)["pid"] == state["pid"]
    assert [s["pid"] for s in supervisor.running()] == [state["pid"]]
    assert supervisor.stop(9, grace_s=5) is True
    assert not psutil.pid_exists(state["pid"]) or (
        psutil.Process(state["pid"]).status() == psutil.STATUS_ZOMBIE
    )


@pytest.fixture
def taken_port(free_port):
    """A port something else listens on."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", free_port()))
        listener.listen()
        yield listener.getsockname()[1]


def test_it_does_not_start_an_engine_on_a_port_another_process_holds(
    supervisor, taken_port, monkeypatch
):
    monkeypatch.setattr(engine_supervisor, "PORT_FREE_WAIT_S", 1.0)

    with pytest.raises(SupervisorError) as refused:
        supervisor.start(standin(4, taken_port))

    assert str(refused.value).startswith(
        f"port {taken_port} is already in use by another process (pid {os.getpid()}: "
    )
    assert supervisor.running() == [] and not supervisor.log_path(4).exists()


# serves /health on the port from a process of its own session (not the engine's group), then
# waits: as another engine that took the port while this one was loading
TAKER = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-m", "localstack.standin", "--port", sys.argv[1]],
                 start_new_session=True, stdout=open(sys.argv[2], "w"))
time.sleep(600)
"""


def test_an_engine_whose_port_another_process_answers_on_is_not_healthy(
    supervisor, free_port, tmp_path
):
    port = free_port()
    recipe = Recipe(
        deployment=5,
        version=1,
        argv=[sys.executable, "-c", TAKER, str(port), str(tmp_path / "taker.log")],
        base_url=f"http://127.0.0.1:{port}",
        cwd=str(ROOT),
        ready_timeout_s=30,
    )
    try:
        with pytest.raises(SupervisorError, match=f"port {port} is held by another process"):
            supervisor.start(recipe)
        assert supervisor.running() == []
    finally:
        for pid in engine_supervisor._listeners(port):
            os.killpg(pid, signal.SIGKILL)


def test_a_failed_start_tells_its_own_last_line_not_the_previous_engines(supervisor, free_port):
    port = free_port()
    supervisor.start(standin(3, port))
    supervisor.stop(3, grace_s=5)
    bad = Recipe(
        deployment=3,
        version=2,
        argv=[sys.executable, "-m", "localstack.standin", "--max-running-requests", "lots"],
        base_url=f"http://127.0.0.1:{port}",
        cwd=str(ROOT),
        ready_timeout_s=30,
    )

    with pytest.raises(SupervisorError) as failed:
        supervisor.start(bad)

    first_line, _, rest = str(failed.value).partition("\n")
    assert first_line == (
        "the engine exited with status 2 before it was healthy: python -m localstack.standin: "
        "error: argument --max-running-requests: invalid int value: 'lots'"
    )
    assert "usage:" in rest
    log = supervisor.log_tail(3, lines=200)
    assert log.startswith("== moeops: starting recipe v2") and "listening on" not in log


def test_a_state_write_cut_short_leaves_the_whole_earlier_one(supervisor, free_port, monkeypatch):
    recipe = standin(9, free_port())
    state = supervisor.start(recipe)
    real = Path.write_text

    def cut_short(path, text, *args, **kwargs):
        # the disk fills half-way through the new state
        real(path, text[: len(text) // 2], *args, **kwargs)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", cut_short)
    with pytest.raises(OSError, match="No space left"):
        supervisor._record(9, {**state, "ready_after_s": 99.0})
    monkeypatch.undo()

    # a heartbeat reading it now finds the engine as it was recorded, whole
    found = supervisor.state(9)
    assert found is not None and found["pid"] == state["pid"]
    assert found["ready_after_s"] == state["ready_after_s"]
