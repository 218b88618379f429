"""workers.engine_defaults where the defaults cannot be read, each said in a sentence; the
build itself against the real vLLM is in tests/e2e/test_real_vllm.py."""

import socket
import sys

from workers.engine_defaults import _interpreter, defaults_differing

VLLM = {
    "engine": "vllm",
    "version": "0.32.0",
    "args_source": "/server_info",
    "args": {"model_config.model": "m", "scheduler_config.max_num_seqs": 4},
}


def test_an_engine_on_another_host_is_not_asked():
    said = defaults_differing({**VLLM, "url": "http://gpu-7.internal:8000"})
    assert said == {"error": "the engine runs on gpu-7.internal, not on this worker's host"}


def test_a_port_nobody_listens_on_is_said(free_port):
    port = free_port()
    said = defaults_differing({**VLLM, "url": f"http://127.0.0.1:{port}"})
    assert said == {"error": f"no process of this worker's user listens on port {port}"}


def test_a_listener_that_is_no_vllm_cannot_build_them():
    # this test's own Python listens: it has no vLLM to build defaults with
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        said = defaults_differing({**VLLM, "url": f"http://127.0.0.1:{port}"})
    assert said["error"].startswith("the engine's Python could not build its defaults: ")
    assert "No module named 'vllm'" in said["error"]


def test_only_a_vllm_reporting_its_server_info_is_asked():
    assert defaults_differing({**VLLM, "engine": "sglang"}) == {
        "error": "moeops reads the defaults of a vLLM that serves /server_info only"
    }
    no_model = {**VLLM, "args": {}}
    assert defaults_differing(no_model) == {"error": "the engine reported no model_config.model"}


def test_the_interpreter_is_the_one_the_engine_was_started_with(tmp_path):
    assert _interpreter(["venv/bin/python", "-m", "vllm"], "/srv", {}) == "/srv/venv/bin/python"
    assert _interpreter(["/opt/v/bin/python3", "/opt/v/bin/vllm"], "/", {}) == "/opt/v/bin/python3"
    found = _interpreter(["python3"], "/", {"PATH": str(tmp_path)})
    assert found is None
    assert _interpreter([], "/", {}) is None
    here = sys.executable.rsplit("/", 1)
    assert _interpreter([here[1]], "/", {"PATH": here[0]}) == sys.executable
