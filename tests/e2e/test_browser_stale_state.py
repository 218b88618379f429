"""Stale state in Chromium, on a managed stand-in started by a real worker: after restarts with
another cap the engine card names the cap the engine runs with, the findings of the recipe that
no longer runs leave the dashboard's open list (kept on the deployment page, superseded), and the
dashboard's headline says its run measured another recipe than the one in force."""

import pytest

from moeops.engines.models import EngineAction
from moeops.fleet.models import Deployment
from moeops.insights.models import Finding
from moeops.runs import snapshots
from moeops.runs.keys import level_key
from moeops.runs.models import LevelResult, SweepRun
from tests.browser import PASSWORD, log_in, shot

pytest_plugins = ["tests.stack", "tests.browser"]
pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(240)]


def _restart_with(page, stack, value):
    page.fill("#engine form.inline input[name=flag]", "--max-running-requests")
    page.fill("#engine form.inline input[name=value]", value)
    page.click("#engine form.inline button:has-text('Restart with this argument')")
    page.wait_for_selector("h1:has-text('Restart with')")
    stack.action_end(EngineAction.objects.order_by("-created", "-id").first())
    page.wait_for_selector("#action-status.status-succeeded")


def _engine_card(page):
    return page.locator("section.card:has(h2:text-is('Engine')) dl").inner_text()


def test_the_card_follows_the_cap_and_superseded_findings_leave_the_open_list(
    managed_standin, page
):
    stack = managed_standin
    Deployment.objects.filter(pk=stack.deployment.pk).update(max_running_requests=64)
    stack.deployment.refresh_from_db()
    ran = SweepRun.objects.create(
        deployment=stack.deployment,
        label="on recipe v1",
        status="succeeded",
        # entered by hand: no re-sweep repeats its load
        source="manual",
        snapshot={"recipe": snapshots.recipe_record(stack.deployment.recipe_in_force())},
    )
    LevelResult.objects.create(
        run=ran, key=level_key(8, None), concurrency=8, output_throughput=912
    )
    Finding.objects.create(
        deployment=stack.deployment,
        run=ran,
        kind="plateau",
        severity="critical",
        title="Requests queue behind the cap of 16",
    )
    stack.staff.set_password(PASSWORD)
    stack.staff.save()
    log_in(page, stack.staff)
    assert "Requests queue behind the cap of 16" in page.locator("body").inner_text()
    deployment_page = page.base + stack.deployment.get_absolute_url()

    for cap in ("128", "16"):
        page.goto(deployment_page)
        _restart_with(page, stack, cap)
        page.goto(deployment_page)
        card = _engine_card(page)
        assert f"max_running_requests\n{cap}" in card, card
        assert "64" not in card
        if cap == "128":
            # the dashboard's headline says its run measured another recipe than the one in force
            page.goto(page.base + "/")
            headline = page.locator("section:has(h2:text-is('Deployments')) table").inner_text()
            assert "912" in headline
            assert "measured under launch recipe v1; the engine runs v2 now, not swept yet" in (
                headline
            )
    shot(page, "stale-state-engine-card")

    page.goto(page.base + "/")
    open_list = page.locator("section:has(h2:text-is('Open findings'))").inner_text()
    assert "Requests queue behind the cap of 16" not in open_list
    # back at v1's cap of 16 (as v3): the run's figure is the headline of the recipe in force
    headline = page.locator("section:has(h2:text-is('Deployments')) table").inner_text()
    assert "912" in headline and "not swept yet" not in headline
    page.goto(deployment_page)
    kept = page.locator(".finding:has-text('Requests queue behind the cap of 16')")
    assert kept.locator(".badge.state").inner_text() == "Superseded"
    shot(page, "stale-state-superseded-finding")
