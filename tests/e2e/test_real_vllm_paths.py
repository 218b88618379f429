"""The engine paths of the real vLLM (its CPU build on the tiny MoE, tests/engine): what the
worker records when a sweep starts (workers.engine_info.observe) from the engine's /server_info,
its start-up log and its installed source, stored on a run and shown on its page."""

import pytest

from moeops.runs import services as run_services
from tests import page_base as pb
from tests.engine import PYTHON, shm_allreduce_built
from workers import engine_info

pytest_plugins = ["tests.engine.plugin"]
pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.timeout(600)]


@pytest.fixture
def engine_python(monkeypatch):
    monkeypatch.setenv("MOEOPS_VLLM_PYTHON", str(PYTHON))


def _rows(observed):
    return {row["key"]: row for row in observed["engine_paths"]["rows"]}


def _sources(row):
    return {e["source"] for e in row["evidence"]}


def test_the_real_engine_at_tp2_gives_its_paths_from_all_three_sources(
    vllm_profiled_tp2, engine_python
):
    server = vllm_profiled_tp2

    observed = engine_info.observe(server.url, kernel_shape=None, engine_log=server.log_path)

    paths = observed["engine_paths"]
    assert (paths["engine"], paths["version"], paths["tp"]) == ("vllm", "0.32.0", 2)
    assert paths["capability"] is None  # this machine has no CUDA GPU: the CPU build's paths
    rows = _rows(observed)
    moe = rows["moe_backend"]
    assert (moe["state"], moe["value"]) == ("on", "CPU")
    assert _sources(moe) == {"log", "report", "source"}
    line = next(e for e in moe["evidence"] if e["source"] == "log")
    assert line["text"].endswith(
        "Using CPU Unquantized MoE backend out of potential backends: ['CPU']."
    )
    assert line["at"] and line["where"].startswith(str(server.log_path))
    # the CPU build prefers its x86 kernel where the CPU has AMX tiles and its portable one
    # elsewhere (vLLM's oracle/unquantized.py): the row names the one its log says it ran
    kernel = rows["moe_kernel"]
    assert kernel["value"] in {"X86CPUUnquantizedExperts", "CPUUnquantizedExperts"}
    logged = next(e for e in kernel["evidence"] if e["source"] == "log")
    assert logged["text"].endswith(f"Using {kernel['value']} MoE backend")
    allreduce = rows["allreduce"]
    if shm_allreduce_built():
        assert (allreduce["state"], allreduce["value"]) == ("on", "shared memory (CPU build)")
    else:
        # a CPU without AVX-512: the engine's log says it fell back, and the row says so
        assert (allreduce["state"], allreduce["value"]) == ("fell_back", "tp:0")
        logged = next(e for e in allreduce["evidence"] if e["source"] == "log")
        assert "CPU SHM communicator disabled for group tp:0" in logged["text"]
    fusion = rows["allreduce_rms_fusion"]
    assert fusion["state"] == "off" and _sources(fusion) == {"log", "report", "source"}


@pytest.mark.django_db(transaction=True)
def test_a_run_shows_the_real_engines_paths(client, vllm_profiled_tp2, engine_python):
    server = vllm_profiled_tp2
    observed = engine_info.observe(server.url, kernel_shape=None, engine_log=server.log_path)
    pb.sign_in(client)
    run = pb.run(pb.deployment(tp=2), levels=[{"concurrency": 4}], status="running")
    run.snapshot = pb.measured(run.deployment)
    run.save(update_fields=["snapshot"])

    run_services.run_record_observed(run=run, observed={"engine_paths": observed["engine_paths"]})

    html = client.get(f"/runs/{run.uuid}/").content.decode()
    assert '<section id="engine-paths">' in html
    assert 'data-path="moe_backend" data-state="on"' in html
    assert "Using CPU Unquantized MoE backend out of potential backends" in html
    assert "vllm/model_executor/layers/fused_moe/oracle/unquantized.py" in html
