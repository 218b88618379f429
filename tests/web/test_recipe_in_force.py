"""What a managed deployment shows follows the launch recipe in force (issue 40, item 14): the
headline says when the engine runs another recipe than its run measured, and a deployment-wide
finding that follows from a recipe is superseded when another one comes in force, and opened
again when the recipe in force shows it again (decision 55)."""

import pytest

from moeops.engines import services
from moeops.insights import services as insights
from moeops.insights.models import IncompatibilityRule
from moeops.runs import snapshots
from moeops.runs.keys import level_key
from moeops.runs.models import LevelResult, SweepRun
from tests import page_base as pb

RECIPE = {
    "management": "managed",
    "argv": "vllm\nserve\n/models/glm-5\n--port\n8000\n--max-num-seqs\n4\n",
    "env": "",
    "cwd": "",
    "gpu_indices": "0, 1",
    "config_folder": "",
    "ready_timeout_s": "900",
    "reason": "first recipe",
}


@pytest.fixture
def deployment(db):
    return pb.vllm_deployment(tp=2)


def _bring_up(deployment, staff, client):
    client.post(f"/deployments/{deployment.pk}/recipe/", RECIPE)
    deployment.refresh_from_db()
    action = services.engine_action_start(deployment=deployment, kind="restart", user=staff)
    services.engine_action_report(action=action, status="running")
    services.engine_action_report(action=action, status="succeeded")


def _restart_with(deployment, staff, seqs):
    pb.restarted_with_seqs(deployment, staff, seqs, int(seqs))


def _swept(deployment, peak, seqs):
    """A finished sweep of the engine as it runs now: the recipe in force, which reported its
    --max-num-seqs."""
    snapshot = {
        "recipe": snapshots.recipe_record(deployment.recipe_in_force()),
        "engine": {"engine": "vllm", "args": {"max_num_seqs": seqs}},
    }
    run = SweepRun.objects.create(
        deployment=deployment, label=f"sweep at {seqs}", status="succeeded", snapshot=snapshot
    )
    LevelResult.objects.create(
        run=run, key=level_key(8, None), concurrency=8, output_throughput=peak
    )
    return run


def _headline(client):
    html = client.get("/").content.decode()
    return html.split("<h2>Deployments</h2>")[1].split("</table>")[0]


def test_the_headline_says_when_the_engine_runs_another_recipe_than_its_run_measured(
    client, deployment, staff
):
    _bring_up(deployment, staff, client)
    _swept(deployment, 912.0, 4)
    row = _headline(client)
    assert "912" in row and "not swept yet" not in row

    _restart_with(deployment, staff, "8")
    row = _headline(client)
    assert "912" in row
    assert "measured under launch recipe v1; the engine runs v2 now, not swept yet" in row
    deployments_page = client.get("/deployments/").content.decode()
    assert "the engine runs v2 now, not swept yet" in deployments_page

    # back to what the run measured (a new version, as a bisection's restore makes): in force
    _restart_with(deployment, staff, "4")
    assert deployment.recipe_in_force().version == 3
    assert "not swept yet" not in _headline(client)

    _restart_with(deployment, staff, "8")
    _swept(deployment, 640.0, 8)
    row = _headline(client)
    assert "640" in row and "not swept yet" not in row


def test_a_deployment_wide_finding_of_a_flag_is_superseded_when_the_flag_goes_and_back_with_it(
    client, deployment, staff
):
    IncompatibilityRule.objects.create(
        name="Four sequences starve the scheduler",
        launch_argument="--max-num-seqs",
        launch_value="4",
        finding_text="At --max-num-seqs 4 the scheduler idles.",
    )
    _bring_up(deployment, staff, client)
    run = _swept(deployment, 300.0, 4)
    [finding] = [f for f in insights.run_analyze(run=run) if f.kind == "incompatibility"]
    assert finding.run is None and finding.state == "open"

    _restart_with(deployment, staff, "8")
    finding.refresh_from_db()
    assert finding.state == "superseded" and finding.state_changed_at is not None
    page = client.get(deployment.get_absolute_url()).content.decode()
    assert "Four sequences starve the scheduler" in page  # kept, in history
    assert "Four sequences starve the scheduler" not in client.get("/").content.decode()

    # the engine's run under the new recipe does not show it: it stays superseded
    insights.run_analyze(run=_swept(deployment, 900.0, 8))
    finding.refresh_from_db()
    assert finding.state == "superseded"

    # back to 4, the analysis shows it again: open again
    _restart_with(deployment, staff, "4")
    insights.run_analyze(run=_swept(deployment, 310.0, 4))
    finding.refresh_from_db()
    assert finding.state == "open"
