"""A run's engine paths on the web side: the findings that come from them (path_rules), the run
page's "Engine paths" panel, and what changed between two runs. The paths are the installed
vLLM 0.32's own decisions for the GPU (tuning.engine_paths) with the real CPU build's log."""

from pathlib import Path

import pytest

from domain.engine_paths import EnginePaths, Evidence, PathRow, log_rows, merge_paths
from moeops.insights.rules import paths as path_rules
from moeops.insights.rules import run_data
from moeops.insights.services import run_analyze
from moeops.runs import snapshots
from moeops.watches import factors
from tests import page_base as pb
from tests.engine import ensure_installed
from tuning.engine_paths import source_paths

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "engine_logs"
FALLBACK = (
    "(Worker_TP0 pid=7001) WARNING 12-06 05:10:02 [allreduce_rms_fusion.py:1045] Failed to "
    "initialize Flashinfer allreduce workspace. Flashinfer allreduce-norm fusion will be disabled."
)
DEFAULT_MOE = (
    "(Worker pid=7001) WARNING 12-06 05:10:03 [fused_moe.py:1163] Using default MoE config. "
    "Performance might be sub-optimal! Config file not found at /x/E=8,N=64.json"
)


@pytest.fixture(scope="module")
def python():
    return str(ensure_installed())


def _paths(python, capability="12.0", tp=8, log=None) -> dict:
    paths = source_paths("vllm", capability=capability, tp=tp, python=python)
    if log is not None:
        paths.rows = merge_paths(log_rows(log), paths.rows)
    return paths.model_dump(mode="json")


def _titles(rule, paths):
    return [p.title for p in rule(run_data.RunData(engine_paths=paths))]


def test_a_fusion_the_engine_enables_elsewhere_is_named_from_its_own_function(python):
    [finding] = path_rules.path_not_enabled_here(run_data.RunData(engine_paths=_paths(python)))

    assert finding.title == (
        "vLLM 0.32.0 runs no all-reduce + RMSNorm fusion on compute capability 12.0"
    )
    assert finding.text.startswith(
        "vLLM 0.32.0 enables all-reduce + RMSNorm fusion only on compute capability 9.0 and "
        "10.x; this GPU is 12.0, so each layer runs its all-reduce and its norm apart."
    )
    assert "vllm/config/vllm.py enable_allreduce_rms_fusion, vLLM 0.32.0" in finding.text
    assert finding.evidence["enabled_on"] == ["9.0", "10.0", "10.3"]


def test_no_such_finding_where_the_engine_enables_it_or_on_one_gpu(python):
    assert _titles(path_rules.path_not_enabled_here, _paths(python, capability="9.0")) == []
    assert _titles(path_rules.path_not_enabled_here, _paths(python, tp=1)) == []
    assert _titles(path_rules.path_not_enabled_here, _paths(python, capability=None)) == []


def test_a_path_that_fell_back_quotes_its_log_line(python):
    log = (LOGS / "vllm-0.32.0-cpu-tp2.log").read_bytes().decode() + FALLBACK + "\n"

    [finding] = path_rules.path_fell_back(
        run_data.RunData(engine_paths=_paths(python, capability="9.0", log=log))
    )

    assert finding.title == "all-reduce + RMSNorm fusion fell back at start-up"
    assert finding.evidence == {
        "path": "allreduce_rms_fusion",
        "line": FALLBACK,
        "at": "12-06 05:10:02",
        "chart": None,
    }
    assert f"The engine's log at 12-06 05:10:02: “{FALLBACK}”" in finding.text


def test_the_moe_on_its_default_config_is_a_finding(python):
    log = (LOGS / "vllm-0.32.0-cpu-tp1.log").read_bytes().decode() + DEFAULT_MOE + "\n"

    [finding] = path_rules.moe_default_config(
        run_data.RunData(engine_paths=_paths(python, capability=None, tp=1, log=log))
    )

    assert finding.title == "The MoE runs on the engine's default kernel config"
    assert "12-06 05:10:03" in finding.text


def test_no_paths_recorded_proposes_nothing():
    data = run_data.RunData()

    assert [p for rule in path_rules.RULES for p in rule(data)] == []


@pytest.fixture
def measured_run(python):
    def make(paths, **fields):
        deployment = pb.deployment(tp=8)
        snapshot = pb.measured(deployment, engine=pb.vllm_identity())
        snapshot["engine_paths"] = paths
        return pb.run(deployment, levels=[{"concurrency": 64}], snapshot=snapshot, **fields)

    return make


@pytest.mark.django_db
def test_the_runs_analysis_reads_its_engine_paths(python, measured_run):
    run = measured_run(_paths(python))

    findings = run_analyze(run=run)

    [fusion] = [f for f in findings if f.key.startswith("path-not-here")]
    assert fusion.run == run and fusion.evidence["capability"] == "12.0"


@pytest.mark.django_db
def test_the_run_page_shows_each_path_with_its_evidence(client, python, measured_run):
    pb.sign_in(client)
    log = (LOGS / "vllm-0.32.0-cpu-tp1.log").read_bytes().decode() + DEFAULT_MOE + "\n"
    run = measured_run(_paths(python, log=log))

    html = client.get(f"/runs/{run.uuid}/").content.decode()

    assert '<section id="engine-paths">' in html
    assert 'data-path="allreduce_rms_fusion" data-state="off"' in html
    assert "it is enabled only on compute capability 9.0 and 10.x" in html
    assert "vllm/config/vllm.py enable_allreduce_rms_fusion, vLLM 0.32.0" in html
    assert "<time>12-06 04:52:23</time>" in html  # the MoE backend's log line
    assert f'href="/deployments/{run.deployment_id}/#tune">Tune the MoE kernel</a>' in html


@pytest.mark.django_db
def test_a_run_without_paths_shows_no_panel(client):
    pb.sign_in(client)
    run = pb.run(pb.deployment(), levels=[{"concurrency": 64}])

    assert 'id="engine-paths"' not in client.get(f"/runs/{run.uuid}/").content.decode()


def _snapshot(state):
    row = PathRow(
        key="allreduce_rms_fusion",
        state=state,
        reason="",
        evidence=[Evidence(source="report", text="x")],
    )
    return {"engine_paths": EnginePaths(engine="vllm", rows=[row]).model_dump(mode="json")}


def test_what_changed_names_a_path_whose_state_differs():
    diff = snapshots.snapshot_diff(_snapshot("on"), _snapshot("off"))

    [change] = [c for c in diff["changes"] if c["section"] == "engine_paths"]
    assert snapshots.describe_change(change) == "all-reduce + RMSNorm fusion on → off"
    assert "engine paths" in snapshots.differing_factors(diff)
    assert "all-reduce + RMSNorm fusion on → off" in factors.phrases(
        _snapshot("on"), _snapshot("off")
    )


@pytest.mark.django_db
def test_an_external_deployments_engine_log_reaches_the_runs_snapshot():
    deployment = pb.deployment(engine_log="/var/log/vllm/serve.log")

    snapshot = snapshots.initial_snapshot(
        deployment=deployment, parameters={}, topology=None, source="worker"
    )

    assert snapshot["deployment"]["engine_log"] == "/var/log/vllm/serve.log"
    # where the worker reads it is no serving field: editing it changes no run's comparison
    deployment.engine_log = "/elsewhere.log"
    assert snapshots.deployment_edits(snapshot, deployment) == []
