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
import shutil

import pytest

from domain.launch import PROFILER_FLAG, profiler_flag_value
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
        if name not in _servers:
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


def profiler_args(folder) -> tuple[str, ...]:
    """The --profiler-config moeops asks for (domain.launch), writing into folder."""
    return (PROFILER_FLAG, profiler_flag_value(str(folder)))


def _profiled(name, tensor_parallel_size) -> VllmServer:
    """A server of its own started with the torch profiler (started when first asked for):
    at TP 2 its two ranks share the machine's two cores, one each."""
    if name not in _servers:
        if _failure:
            pytest.fail(_failure[0], pytrace=False)
        folder = ENGINE_DIR / "profiles" / f"{name}-{os.getpid()}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        env = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"} if tensor_parallel_size == 2 else {}
        try:
            ensure_model()
            _servers[name] = VllmServer(
                log_path=ENGINE_DIR / "logs" / f"{name}-{os.getpid()}.log",
                extra_args=profiler_args(folder),
                env=env,
                tensor_parallel_size=tensor_parallel_size,
            ).start()
        except (EngineUnavailable, EngineStartError) as exc:
            pytest.fail(f"the real vLLM could not be started: {exc}", pytrace=False)
    try:
        return _servers[name].wait()
    except EngineStartError as exc:
        pytest.fail(f"the real vLLM could not be started: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def vllm_profiled() -> VllmServer:
    """The real vLLM at TP 1, --max-num-seqs 16, started with the torch profiler."""
    return _profiled("profiled-tp1", 1)


@pytest.fixture(scope="session")
def vllm_profiled_tp2() -> VllmServer:
    """The real vLLM at TP 2 (two rank processes, one core each), with the torch profiler."""
    return _profiled("profiled-tp2", 2)


def pytest_sessionfinish(session, exitstatus):
    for server in _servers.values():
        server.stop()
