"""The worker's engine supervisor (workers.engine_supervisor) with real processes: the stand-in
engine as a managed engine, and a small server that reports the environment it was given."""

import json
import sys

import httpx
import pytest

from workers.engine_supervisor import EngineSupervisor, Recipe, SupervisorError

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


@pytest.fixture
def supervisor(tmp_path):
    supervisor = EngineSupervisor(tmp_path / "engines")
    yield supervisor
    for state in supervisor.running():
        supervisor.stop(state["recipe"]["deployment"], grace_s=5)


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
