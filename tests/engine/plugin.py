"""Real vLLM servers for the tests: `pytest_plugins = ["tests.engine.plugin"]`.

Two servers of the tiny MoE, started once per test session the first time a test asks for
either (both start together; each takes about 90 s on 2 cores), stopped when the session ends:

- `vllm_capped`: --max-num-seqs 4
- `vllm_wide`:   --max-num-seqs 16

Both run with prefix caching on (`--enable-prefix-caching`: the prefix-cache tests read its
counters), with FlashInfer's allreduce fusion switched on in their compilation config
(`fuse_allreduce_rms`, which vLLM reports in /server_info) and with VLLM_TUNED_CONFIG_FOLDER
pointing at tests.engine.TUNED_FOLDER, which holds a kernel config for the tiny model's shape
on tests.engine.TUNED_DEVICE; apart from --max-num-seqs they are the same. If the engine
cannot be installed or started, every test that asks for it fails with the reason: none is
skipped.
"""

import os

import pytest

from tests.engine import (
    ENGINE_DIR,
    TUNED_FILE,
    TUNED_FOLDER,
    EngineUnavailable,
    VllmServer,
    ensure_model,
)
from tuning.config_files import dumps_config
from workers.engine_process import EngineStartError

TUNED_CONFIG = {
    "triton_version": "3.7.1",
    "1": {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 32,
        "BLOCK_SIZE_K": 64,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 3,
    },
}
FUSION = '{"pass_config": {"fuse_allreduce_rms": true}}'
SERVERS = {"capped": 4, "wide": 16}

_servers: dict[str, VllmServer] = {}
_failure: list[str] = []


def _start_all():
    folder = TUNED_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    # as moeops writes a config it holds (and vLLM's tuner writes its files)
    entries = {int(m): entry for m, entry in TUNED_CONFIG.items() if m != "triton_version"}
    (folder / TUNED_FILE).write_text(dumps_config(entries, TUNED_CONFIG["triton_version"]))
    logs = ENGINE_DIR / "logs"
    for name, max_num_seqs in SERVERS.items():
        _servers[name] = VllmServer(
            log_path=logs / f"{name}-{os.getpid()}.log",
            max_num_seqs=max_num_seqs,
            extra_args=("--compilation-config", FUSION, "--enable-prefix-caching"),
            env={"VLLM_TUNED_CONFIG_FOLDER": str(folder)},
        ).start()


def _server(name) -> VllmServer:
    if _failure:
        pytest.fail(_failure[0], pytrace=False)
    try:
        if not _servers:
            ensure_model()
            _start_all()
        return _servers[name].wait()
    except (EngineUnavailable, EngineStartError) as exc:
        _failure.append(f"the real vLLM could not be started: {exc}")
        pytest.fail(_failure[0], pytrace=False)


@pytest.fixture(scope="session")
def vllm_capped() -> VllmServer:
    """The real vLLM with --max-num-seqs 4 (see the module docstring)."""
    return _server("capped")


@pytest.fixture(scope="session")
def vllm_wide() -> VllmServer:
    """The real vLLM with --max-num-seqs 16 (see the module docstring)."""
    return _server("wide")


def pytest_sessionfinish(session, exitstatus):
    for server in _servers.values():
        server.stop()
