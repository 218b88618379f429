"""A deployment's plan in Chromium: the stand-in's plateau item offers the restart that raises
its cap, and once a restart from the panel has put that cap in force the item reads done, with a
link to the action that did it and no button offering what already runs."""

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from moeops.engines import services as engine_services
from moeops.examples import load_standin_deployment
from moeops.insights import services as insights_services
from moeops.runs import services as run_services
from moeops.runs.models import SweepRun
from tests import page_base as pb
from tests import queues
from tests.browser import PASSWORD, log_in, shot

pytest_plugins = ["tests.browser"]
pytestmark = pytest.mark.browser

CAP = 8
ITEM = f"Raise --max-running-requests above {CAP} and re-sweep"
BUTTON = "Restart with --max-running-requests 32 and re-sweep"
# the stand-in's curve against a cap of 8 (tests/web/test_analysis_standin.py measures one)
CURVE = ((4, 410.0), (8, 800.0), (16, 806.0), (32, 809.0))


@pytest.fixture
def staff(db):
    return User.objects.create_user("ops", password=PASSWORD, is_staff=True)


@pytest.fixture
def broker(monkeypatch, redis_url):
    queues.send_to(monkeypatch, redis_url)
    queues.clear(redis_url, "host.local")
    yield redis_url
    queues.clear(redis_url, "host.local")


def managed_standin(staff, port):
    """The example stand-in deployment, managed by a recipe capped at CAP and in force, with a
    sweep of it analysed."""
    deployment = load_standin_deployment(port=port)
    deployment.management = "managed"
    deployment.save()
    deployment.host.worker_seen_at = timezone.now()
    deployment.host.save()
    argv = ["python", "-m", "localstack.standin", "--port", str(port)]
    recipe = engine_services.recipe_create(
        deployment=deployment, argv=[*argv, "--max-running-requests", str(CAP)], author=staff
    )
    recipe.applied_at = timezone.now()
    recipe.save()
    run = SweepRun.objects.create(
        deployment=deployment,
        status="succeeded",
        source="worker",
        parameters={"levels": [c for c, _ in CURVE], "input_len": 32, "output_len": 20},
        snapshot={"engine": {"engine": "standin", "max_running_requests": CAP}},
    )
    for concurrency, throughput in CURVE:
        pb.level(run, concurrency, output_throughput=throughput)
    insights_services.run_analyze(run=run)
    return deployment


def test_the_stand_in_plateau_item_offers_its_restart_and_is_done_once_the_cap_runs(
    page, staff, broker, free_port
):
    deployment = managed_standin(staff, free_port())
    item = deployment.plan_items.get(title=ITEM)
    assert item.finding.kind == "plateau"  # the plateau proposed it first: its finding carries it

    log_in(page, staff)
    page.goto(page.base + deployment.get_absolute_url())
    row = page.locator("ol.plan > li", has=page.locator("textarea.plan-title", has_text=ITEM))
    assert row.locator(f"button:has-text('{BUTTON}')").count() == 1
    shot(page, "plan-01-stand-in-plateau-item")

    # the panel's restart, not the item's button: the same change by another path
    panel = page.locator("#engine form:has(button:has-text('Restart with this argument'))")
    panel.locator("input[name=flag]").fill("--max-running-requests")
    panel.locator("input[name=value]").fill("32")
    panel.locator("button:has-text('Restart with this argument')").click()
    page.wait_for_selector("text=Restart with --max-running-requests 32")
    action = deployment.engine_actions.get()
    assert action.plan_item is None

    # what the host's worker reports: the engine up with the new cap, then its re-sweep
    engine_services.engine_action_report(action=action, status="running")
    engine_services.engine_action_report(
        action=action,
        status="sweeping",
        observed={"engine": "standin", "max_running_requests": 32},
    )
    run_services.run_transition(run=action.after_run, status="running")
    run_services.run_transition(run=action.after_run, status="succeeded")

    page.goto(page.base + deployment.get_absolute_url())
    row = page.locator("ol.plan > li", has=page.locator("textarea.plan-title", has_text=ITEM))
    assert "plan-completed" in row.get_attribute("class")
    assert row.locator("select[name=status]").input_value() == "completed"
    assert page.locator(f"button:has-text('{BUTTON}')").count() == 0
    link = row.locator(".plan-done-by a", has_text="Restart with --max-running-requests 32")
    shot(page, "plan-02-stand-in-plateau-item-done")
    link.click()
    page.wait_for_url(page.base + action.get_absolute_url())
