"""The managed-engine panel of the deployment page, the launch recipe form (staff only), the
actions started from the page and a plan item's cap change, and the action's own page."""

import re

import pytest

from moeops.engines import services
from moeops.engines.models import EngineAction
from moeops.insights.models import Finding, PlanItem
from moeops.runs import services as run_services
from moeops.runs.models import SweepRun
from tests import page_base, queues

QUEUE = "host.h200-x8"


@pytest.fixture
def deployment(db):
    return page_base.vllm_deployment(endpoint_url="http://127.0.0.1:8000")


RECIPE = {
    "management": "managed",
    "argv": "vllm\nserve\n/models/glm-5\n--port\n8000\n--max-num-seqs\n4\n",
    "env": "VLLM_SERVER_DEV_MODE=1",
    "cwd": "",
    "gpu_indices": "0, 1",
    "config_folder": "",
    "ready_timeout_s": "900",
    "reason": "first recipe",
}


def test_an_external_deployment_says_moeops_never_touches_its_engine(client, deployment):
    page_base.sign_in(client)
    html = client.get(deployment.get_absolute_url()).content.decode()

    assert "External: moeops measures this engine but never starts" in html
    assert "Give it a launch recipe" not in html  # a member, not staff


def test_only_staff_write_a_recipe_and_it_makes_the_deployment_managed(client, deployment):
    member = page_base.sign_in(client, "member")
    url = f"/deployments/{deployment.pk}/recipe/"
    assert client.post(url, RECIPE).status_code == 302  # to the admin login
    assert not deployment.launch_recipes.exists()

    member.is_staff = True
    member.save()
    answer = client.post(url, RECIPE)

    assert answer.status_code == 302 and answer["Location"].endswith("#engine")
    [recipe] = deployment.launch_recipes.all()
    assert recipe.argv[-2:] == ["--max-num-seqs", "4"] and recipe.author == member
    assert recipe.env == {"VLLM_SERVER_DEV_MODE": "1"} and recipe.gpu_indices == [0, 1]
    deployment.refresh_from_db()
    assert deployment.is_managed
    html = client.get(deployment.get_absolute_url()).content.decode()
    assert "Launch recipe v1" in html
    assert "vllm serve /models/glm-5 --port 8000 --max-num-seqs 4" in html
    assert "not started by moeops yet" in html


def test_a_bad_recipe_keeps_what_was_typed_and_names_the_field(client, deployment, staff):
    answer = client.post(
        f"/deployments/{deployment.pk}/recipe/", {**RECIPE, "env": "NOT A VARIABLE"}
    )

    assert answer.status_code == 400
    html = answer.content.decode()
    assert "“NOT A VARIABLE” is not NAME=value" in html
    assert "/models/glm-5" in html
    assert not deployment.launch_recipes.exists()


def test_an_action_from_the_page_opens_its_page(
    client, deployment, staff, broker, django_capture_on_commit_callbacks
):
    client.post(f"/deployments/{deployment.pk}/recipe/", RECIPE)
    SweepRun.objects.create(
        deployment=deployment, status="succeeded", parameters={"levels": [4], "input_len": 8,
                                                               "output_len": 8}
    )  # fmt: skip

    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(
            f"/deployments/{deployment.pk}/actions/",
            {"kind": "restart_with_args", "flag": "--max-num-seqs", "value": "16"},
        )

    action = EngineAction.objects.get()
    assert answer["Location"] == action.get_absolute_url()
    html = client.get(action.get_absolute_url()).content.decode()
    assert "Restart with --max-num-seqs 16" in html
    assert '<meta http-equiv="refresh"' in html  # follows the action while it runs
    assert "Waiting for the host's worker to take the action." in html
    assert [q.task for q in queues.queued(broker, QUEUE)] == ["workers.engine_action"]


def test_an_action_the_host_cannot_take_is_refused_with_a_sentence(client, deployment, staff):
    client.post(f"/deployments/{deployment.pk}/recipe/", RECIPE)
    deployment.host.worker_seen_at = None
    deployment.host.save()

    answer = client.post(f"/deployments/{deployment.pk}/actions/", {"kind": "restart"}, follow=True)

    html = answer.content.decode()
    assert "No worker of host h200-x8 has been seen" in html
    assert not EngineAction.objects.exists()


def _queue_cap_finding(deployment):
    """The analysis found requests queueing behind the engine's --max-num-seqs 4 at 8."""
    return Finding.objects.create(
        deployment=deployment,
        kind="queueing",
        key="running-cap",
        title="Requests queue behind --max-num-seqs 4",
        evidence={"cap": 4, "flag": "--max-num-seqs", "tested_concurrency": 8},
    )


def test_the_queue_cap_plan_item_offers_the_restart_that_raises_the_cap(client, deployment, staff):
    client.post(f"/deployments/{deployment.pk}/recipe/", RECIPE)
    finding = _queue_cap_finding(deployment)
    PlanItem.objects.create(
        deployment=deployment, finding=finding, title="Raise --max-num-seqs above 4 and re-sweep"
    )

    html = client.get(deployment.get_absolute_url()).content.decode()

    assert "Restart with --max-num-seqs 8 and re-sweep" in html


def test_the_action_page_shows_its_steps_error_and_log(client, deployment, staff, broker):
    client.post(f"/deployments/{deployment.pk}/recipe/", RECIPE)
    deployment.refresh_from_db()
    action = services.engine_action_start(deployment=deployment, kind="restart", user=staff)
    services.engine_action_report(
        action=action,
        status="running",
        steps=[{"name": "start", "status": "failed", "detail": "exited with status 2"}],
    )
    services.engine_action_report(
        action=action,
        status="failed",
        error="the engine exited with status 2 before it was healthy",
        log_tail="vllm: error: unrecognized arguments: --no-such-flag",
    )

    html = client.get(action.get_absolute_url()).content.decode()

    assert "the engine exited with status 2 before it was healthy" in html
    assert "unrecognized arguments: --no-such-flag" in html
    assert "exited with status 2" in html and '<meta http-equiv="refresh"' not in html


def test_the_plan_item_moves_with_its_action_and_links_its_runs(
    client, deployment, staff, broker, django_capture_on_commit_callbacks
):
    client.post(f"/deployments/{deployment.pk}/recipe/", RECIPE)
    deployment.refresh_from_db()
    started = services.engine_action_start(deployment=deployment, kind="restart", user=staff)
    services.engine_action_report(action=started, status="running")
    services.engine_action_report(action=started, status="succeeded")
    SweepRun.objects.create(
        deployment=deployment,
        status="succeeded",
        parameters={"levels": [4], "input_len": 8, "output_len": 8},
    )
    finding = _queue_cap_finding(deployment)
    item = PlanItem.objects.create(deployment=deployment, finding=finding, title="Raise the cap")

    with django_capture_on_commit_callbacks(execute=True):
        client.post(
            f"/deployments/{deployment.pk}/actions/",
            {"kind": "restart_with_args", "flag": "--max-num-seqs", "value": "8",
             "plan_item": item.pk},
        )  # fmt: skip

    item.refresh_from_db()
    action = item.engine_actions.get()
    assert item.status == "in_progress" and action.changes == {"--max-num-seqs": "8"}
    html = client.get(deployment.get_absolute_url()).content.decode()
    compare = f"?run={action.before_run.uuid}&amp;run={action.after_run.uuid}"
    assert "Restart with --max-num-seqs 8</a>" in html and compare in html


def test_before_after_links_ask_for_the_standin_runs_they_name(client, deployment, staff):
    client.post(f"/deployments/{deployment.pk}/recipe/", RECIPE)
    standin = {"engine": {"engine": "standin"}}
    before = page_base.run(deployment, "before", snapshot=standin)
    after = page_base.run(deployment, "after", snapshot=standin)
    EngineAction.objects.create(
        deployment=deployment,
        kind="restart",
        status="succeeded",
        recipe=deployment.launch_recipes.get(),
        before_run=before,
        after_run=after,
    )
    link = f"?run={before.uuid}&amp;run={after.uuid}&amp;standin=1"
    action = EngineAction.objects.get()
    for page in (action.get_absolute_url(), deployment.get_absolute_url(), f"/runs/{after.uuid}/"):
        assert link in client.get(page).content.decode(), page
    # the compare page then shows both (stand-in runs are left out unless asked)
    html = client.get(f"/compare/{link.replace('&amp;', '&')}").content.decode()
    assert 'id="standin-left-out"' not in html


def test_the_host_page_says_when_its_worker_was_seen_and_what_its_spool_refused(client, deployment):
    page_base.sign_in(client)
    host = deployment.host
    host.worker_status = {"spool": {"waiting": 0, "rejected": 3}}
    host.save()

    html = client.get(f"/hosts/{host.name}/").content.decode()
    assert "worker seen 0\xa0minutes ago" in html and "3 rejected pushes" in html

    host.worker_seen_at = None
    host.save()
    html = client.get(f"/hosts/{host.name}/").content.decode()
    assert "No worker of host h200-x8 has been seen" in html
    assert "never" in client.get("/hosts/").content.decode()


def test_the_engine_panel_costs_no_query_per_action(
    client, deployment, staff, django_assert_num_queries
):
    client.post(f"/deployments/{deployment.pk}/recipe/", RECIPE)
    deployment.refresh_from_db()

    def act():
        action = services.engine_action_start(deployment=deployment, kind="restart", user=staff)
        services.engine_action_report(action=action, status="running")
        services.engine_action_report(action=action, status="succeeded")

    act()
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as one:
        client.get(deployment.get_absolute_url())
    for _ in range(4):
        act()
    with django_assert_num_queries(len(one.captured_queries)):
        html = client.get(deployment.get_absolute_url()).content.decode()
    assert html.count("Restart with the newest recipe</a>") == 5


def test_the_action_page_names_its_two_runs_once_each(
    client, deployment, staff, broker, django_capture_on_commit_callbacks
):
    client.post(f"/deployments/{deployment.pk}/recipe/", RECIPE)
    deployment.refresh_from_db()
    SweepRun.objects.create(
        deployment=deployment,
        status="succeeded",
        source="worker",
        parameters={"levels": [4], "input_len": 8, "output_len": 8},
    )
    actions = []
    for value in ("8", "16"):
        action = services.engine_action_start(
            deployment=deployment,
            kind="restart_with_args",
            user=staff,
            changes={"--max-num-seqs": value},
        )
        services.engine_action_report(action=action, status="running")
        services.engine_action_report(action=action, status="sweeping")
        run_services.run_transition(run=action.after_run, status="running")
        # the re-sweep's end ends the action once it is committed
        with django_capture_on_commit_callbacks(execute=True):
            run_services.run_transition(run=action.after_run, status="succeeded")
        actions.append(action)

    html = client.get(actions[1].get_absolute_url()).content.decode()

    text = re.sub(r"<[^>]+>", "", html)
    assert "Before: after:" not in text and "after: after:" not in text
    assert (
        "Before: <a" in html and "Restart with --max-num-seqs 8 (recipe v2)</a> · after: <a" in html
    )
    assert "Restart with --max-num-seqs 16 (recipe v3)</a>" in html


def test_the_panel_names_the_cap_the_engine_reported_after_its_restart(client, deployment, staff):
    client.post(f"/deployments/{deployment.pk}/recipe/", RECIPE)
    deployment.refresh_from_db()
    action = services.engine_action_start(deployment=deployment, kind="restart", user=staff)
    services.engine_action_report(action=action, status="running")
    # the recipe passes 4; the engine said it runs 8 (what runs is what the engine reports)
    services.engine_action_report(
        action=action, status="succeeded", observed={"max_running_requests": 8}
    )

    html = client.get(deployment.get_absolute_url()).content.decode()

    assert "now --max-num-seqs 8</span>" in html


def test_restart_with_this_argument_offers_the_cap_flag_an_sglang_style_engine_takes(
    client, deployment, staff
):
    deployment.engine = "other"
    deployment.save()
    sglang_style = {**RECIPE, "argv": "python\n-m\nmy_server\n--max-running-requests\n64\n"}
    client.post(f"/deployments/{deployment.pk}/recipe/", sglang_style)
    deployment.refresh_from_db()
    action = services.engine_action_start(deployment=deployment, kind="restart", user=staff)
    services.engine_action_report(action=action, status="running")
    services.engine_action_report(action=action, status="succeeded")

    html = client.get(deployment.get_absolute_url()).content.decode()

    assert re.search(r'<input[^>]*name="flag"[^>]*value="--max-running-requests"', html)
    assert "--max-num-seqs" not in html
    assert "now --max-running-requests 64</span>" in html


def test_the_engine_card_names_the_cap_the_engine_runs_with_after_each_restart(
    client, deployment, staff
):
    deployment.max_running_requests = 64
    deployment.save()
    client.post(f"/deployments/{deployment.pk}/recipe/", RECIPE)
    deployment.refresh_from_db()

    for cap in (128, 16):
        page_base.restarted_with_seqs(deployment, staff, str(cap), cap)
        html = client.get(deployment.get_absolute_url()).content.decode()
        card = html.split("<h2>Engine</h2>")[1].split("</section>")[0]
        assert f"<dt>max_running_requests</dt><dd><code>{cap}</code></dd>" in card
        assert "<code>64</code>" not in card


def test_findings_of_a_recipe_that_no_longer_runs_are_closed_as_superseded(
    client, deployment, staff
):
    from moeops.runs import snapshots

    client.post(f"/deployments/{deployment.pk}/recipe/", RECIPE)
    deployment.refresh_from_db()
    first = services.engine_action_start(deployment=deployment, kind="restart", user=staff)
    services.engine_action_report(action=first, status="running")
    services.engine_action_report(action=first, status="succeeded")
    recorded = {"recipe": snapshots.recipe_record(deployment.recipe_in_force())}
    old = SweepRun.objects.create(
        deployment=deployment, status="succeeded", source="worker", snapshot=recorded
    )
    stale = Finding.objects.create(
        deployment=deployment, run=old, kind="plateau", title="Throughput plateaus from 4"
    )
    mine = Finding.objects.create(
        deployment=deployment, run=old, kind="plateau", key="b", title="Said by a person",
        source="human",
    )  # fmt: skip

    page_base.restarted_with_seqs(deployment, staff, "8", 8)

    stale.refresh_from_db()
    mine.refresh_from_db()
    assert stale.state == "superseded" and stale.state_changed_at is not None
    assert mine.state == "open"
    html = client.get("/").content.decode()
    assert "Throughput plateaus from 4" not in html.split("<h2>Open findings</h2>")[1]
    # a restart that brings back what the run ran closes nothing of a later run
    again = SweepRun.objects.create(
        deployment=deployment,
        status="succeeded",
        source="worker",
        snapshot={"recipe": snapshots.recipe_record(deployment.recipe_in_force())},
    )
    current = Finding.objects.create(
        deployment=deployment, run=again, kind="plateau", title="Throughput plateaus from 8"
    )
    restart = services.engine_action_start(
        deployment=deployment, kind="restart", user=staff, resweep=False
    )
    services.engine_action_report(action=restart, status="running")
    services.engine_action_report(action=restart, status="succeeded")
    current.refresh_from_db()
    assert current.state == "open"
