"""The loop on a real engine: moeops starts a managed vLLM (its CPU build, the tiny MoE of
tests/engine) from a launch recipe through a real GPU-host Celery worker, restarts it with a
changed --max-num-seqs and re-sweeps, applies a kernel config from the deployment page in
Chromium and follows it to the comparison, and brings the previous recipe back when a new one
cannot start. Each restart of vLLM takes about a minute on 2 cores, so the loop is one test."""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from moeops.engines.models import EngineAction
from moeops.fleet.models import Host
from moeops.kernels.models import KernelConfig
from moeops.runs import services as run_services
from moeops.runs import snapshots
from moeops.runs.models import SweepRun
from tests.browser import log_in, shot
from tests.engine import (
    ENGINE_ENV,
    MODEL_DIR,
    TUNED_DEVICE,
    TUNED_FILE,
    VllmServer,
    ensure_model,
)
from tests.engine.managed import ACTION_TIMEOUT_S, act, wait
from tests.engine.plugin import TUNED_CONFIG
from tests.stack import ROOT, SweepStack
from workers import engine_supervisor
from workers.engine_info import identify_engine
from workers.engine_supervisor import EngineSupervisor, Recipe, SupervisorError

pytest_plugins = ["tests.stack", "tests.browser", "tests.engine.managed"]
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.engine,
    pytest.mark.browser,
    pytest.mark.timeout(1500),
]

# the heartbeat timeout of this test (s): minutes in production
RUN_STALE_S = 8
# ms a page operation may take here: the first page with charts compiles plotly (4.8 MB) beside a
# running vLLM, which took over the browser fixture's 10 s on 2 busy cores (load 15)
PAGE_TIMEOUT_MS = 60_000


@pytest.fixture
def managed(make_managed_vllm):
    return make_managed_vllm(max_num_seqs=4)


def _environ(pid):
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(part.decode().split("=", 1) for part in raw if b"=" in part)


def test_restart_resweep_apply_a_config_from_the_page_and_come_back_from_a_bad_recipe(
    managed,
    page,
    settings,
):
    settings.MOEOPS_RUN_STALE_S = RUN_STALE_S
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    deployment = managed.deployment

    first = act(managed, "restart")
    assert first.status == "succeeded", (first.error, first.steps)
    assert first.after_run is None  # nothing was swept before: nothing to repeat
    assert first.observed["max_running_requests"] == 4

    before = managed.wait_for_run(
        managed.start_sweep([4], input_len=32, output_len=32, prompts_per_level=16), timeout=300
    )
    assert before.status == "succeeded", before.error

    # restart with changed arguments, re-sweep with the same load, runs linked
    raised = act(managed, "restart_with_args", changes={"--max-num-seqs": "16"})
    assert raised.status == "succeeded", (raised.error, raised.steps)
    assert "the engine reports max_num_seqs = 16" in raised.observed["checks"][0]
    after = raised.after_run
    assert (raised.before_run, after.status) == (before, "succeeded")
    assert [lv.failed for lv in after.levels.all()] == [0]
    diff = snapshots.snapshot_diff(before.snapshot, after.snapshot)
    by_section = {}
    for change in diff["changes"]:
        by_section.setdefault(change["section"], []).append(
            (change["key"], change["a"], change["b"])
        )
    assert by_section["args"] == [("scheduler_config.max_num_seqs", 4, 16)]
    assert by_section["recipe"] == [("--max-num-seqs", "4", "16")]
    assert (
        "env" not in by_section and "kernel_config" not in by_section and "load" not in by_section
    )

    # apply a kernel config from the deployment page, follow the action to the comparison
    config = KernelConfig.objects.create(
        device_name=TUNED_DEVICE,
        E=8,
        N=64,
        dtype="bf16",
        triton_version=TUNED_CONFIG["triton_version"],
        entries={"1": TUNED_CONFIG["1"]},
        source="tuned",
    )
    pid_before = managed.engines.state(deployment.pk)["pid"]
    log_in(page, managed.staff)
    # the comparison the restart opens shows the changed argument, as the engine reported it
    page.goto(page.base + f"/compare/?run={before.uuid}&run={after.uuid}")
    changed = page.locator("#what-changed").inner_text()
    assert "scheduler_config.max_num_seqs: 4 → 16" in changed
    assert "--max-num-seqs: 4 → 16" in changed
    page.goto(page.base + deployment.get_absolute_url())
    page.select_option("#apply-config select[name=kernel_config]", str(config.pk))
    shot(page, "engine-panel")
    page.click("#apply-config button[type=submit]")
    page.wait_for_selector("h1:has-text('Apply')")
    page.wait_for_selector("#compare-link", timeout=ACTION_TIMEOUT_S * 1000)
    shot(page, "engine-action-succeeded")
    page.click("#compare-link")
    page.wait_for_selector("#what-changed")
    compare = page.locator("#what-changed").inner_text()
    differs = page.locator("#differs-in").inner_text()
    shot(page, "engine-action-compare")

    applied = EngineAction.objects.get(kind="apply_config")
    assert applied.status == "succeeded", (applied.error, applied.steps)
    assert applied.before_run == after and applied.after_run.status == "succeeded"
    folder = managed.engines.root / str(deployment.pk) / "kernel-configs"
    written = folder / TUNED_FILE
    assert json.loads(written.read_text()) == json.loads(config.engine_file_text("vllm"))
    state = managed.engines.state(deployment.pk)
    assert state["pid"] != pid_before
    assert _environ(state["pid"])["VLLM_TUNED_CONFIG_FOLDER"] == str(folder)
    kernel = applied.after_run.snapshot["kernel_config"]
    assert (kernel["state"], kernel["path"], kernel["folder"]) == (
        "file",
        str(written),
        "VLLM_TUNED_CONFIG_FOLDER",
    )
    assert applied.after_run.kernel_config_state() == "tuned"
    assert after.kernel_config_state() == "default"
    # the recipe put a kernel config where the engine reads it: its folder's variable, the
    # recipe's configs, the config the engine loads and the engine path of the MoE's config
    # (default → the file) are the one change
    factors = differs.split("differs in: ", 1)[1].split(", ")
    assert sorted(factors) == [
        "engine environment",
        "engine paths",
        "kernel config",
        "launch recipe",
    ]
    assert "state: engine_default → file" in compare
    assert "Launch recipe (managed engine)" in compare and "kernel configs: none →" in compare

    # a recipe that cannot start: the old engine is back, the action says why
    broken = act(managed, "restart_with_args", changes={"--no-such-flag": "1"})
    assert broken.status == "failed"
    assert "unrecognized arguments: --no-such-flag" in broken.error
    assert broken.steps[-1]["name"] == "revert" and broken.steps[-1]["status"] == "done"
    assert broken.after_run.status == "cancelled"
    back = identify_engine(deployment.endpoint_url)
    assert back["args"]["scheduler_config.max_num_seqs"] == 16
    assert deployment.recipe_in_force() == applied.recipe
    assert httpx.get(deployment.endpoint_url + "/health", timeout=5).status_code == 200

    # the worker dies mid-sweep: the run ends within the heartbeat timeout; a new worker finds
    # the engine it manages still running
    run = managed.start_sweep([4, 8], input_len=32, output_len=64, prompts_per_level=400)

    def mid_level(r):
        # requests answered in the first level: the sweep is under way, its level unfinished
        # (waiting for a finished level took some 35 s of the 400 prompts)
        return r.status == "running" and r.progress.get("requests_done", 0) > 0

    managed.wait_for_run(run, until=mid_level)
    managed.worker.kill()
    killed = time.monotonic()

    def ended():
        run_services.run_fail_stale()
        return SweepRun.objects.get(pk=run.pk).is_finished

    wait(ended, "the run's end", timeout=RUN_STALE_S + 30)
    run.refresh_from_db()
    assert run.status == "failed" and "stopped sending heartbeats" in run.error
    assert time.monotonic() - killed < RUN_STALE_S + 30
    engine = managed.engines.state(deployment.pk)
    managed.worker.start()

    def reported():
        found = Host.objects.get(pk=managed.host.pk).managed_engine(deployment.pk) or {}
        return found.get("pid") == engine["pid"]

    wait(reported, "the new worker's heartbeat naming the engine")


def test_a_vllm_whose_port_is_taken_is_never_called_healthy(free_port, tmp_path, monkeypatch):
    ensure_model()
    port = free_port()
    server = VllmServer(log_path=tmp_path / "unused.log", port=port, max_num_seqs=4)
    recipe = Recipe(
        deployment=1,
        version=1,
        argv=server.argv(),
        base_url=server.url,
        env=ENGINE_ENV,
        cwd=str(MODEL_DIR.parent),
        ready_timeout_s=ACTION_TIMEOUT_S,
    )
    engines = EngineSupervisor(tmp_path / "engines")
    other, answering = _other_server(port)
    try:
        # another server answers /health on the port: vLLM is not started
        with pytest.raises(SupervisorError, match=f"port {port} is already in use by another"):
            engines.start(recipe)
        # it took the port after the check: what answers is not the vLLM started
        monkeypatch.setattr(engine_supervisor, "_wait_port_free", lambda port: None)
        with pytest.raises(SupervisorError, match=f"port {port} is held by another process"):
            engines.start(recipe)
        assert engines.running() == [] and answering()
    finally:
        other.kill()
        other.wait()
    # a socket that never answers holds it: vLLM exits and says why in the first line
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        with pytest.raises(SupervisorError) as failed:
            engines.start(recipe)
    first_line = str(failed.value).splitlines()[0]
    assert first_line.startswith("the engine exited with status 1 before it was healthy: ")
    assert "Address already in use" in first_line
    assert engines.running() == []


def _other_server(port):
    """A stand-in serving on port, and whether it still answers."""
    argv = [sys.executable, "-m", "localstack.standin", "--port", str(port)]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, cwd=ROOT)

    def answering():
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    SweepStack.wait_until(lambda: True if answering() else None, 30, "the other server")
    return process, answering
