"""Engine actions in Chromium, on a managed stand-in started by a real worker: a cap flag with a
value that is no count is refused on the page naming the flag; a restart whose engine exits
says the engine's own last line and shows its own log, not the old engine's; the next restart
that succeeds shows only its own start's log."""

import pytest

from moeops.engines.models import EngineAction
from tests.browser import PASSWORD, log_in, shot

pytest_plugins = ["tests.stack", "tests.browser"]
pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(240)]


def _restart_with(page, flag, value):
    page.fill("#engine form.inline input[name=flag]", flag)
    page.fill("#engine form.inline input[name=value]", value)
    page.click("#engine form.inline button:has-text('Restart with this argument')")


def _followed(page, stack):
    """The action page once the action finished (it reloads itself until then)."""
    page.wait_for_selector("h1:has-text('Restart with')")
    action = EngineAction.objects.order_by("-created", "-id").first()
    stack.action_end(action)
    page.wait_for_selector("#action-status.status-succeeded, #action-status.status-failed")
    return page.locator("#action-status").inner_text()


def test_a_bad_flag_is_refused_and_a_failed_restart_shows_its_own_cause_and_log(
    managed_standin, page
):
    stack = managed_standin
    stack.staff.set_password(PASSWORD)
    stack.staff.save()
    log_in(page, stack.staff)
    deployment_page = page.base + stack.deployment.get_absolute_url()

    # a count flag given "lots": refused before anything restarts, naming the flag
    page.goto(deployment_page)
    _restart_with(page, "--max-running-requests", "lots")
    page.wait_for_selector("text=--max-running-requests takes a whole number, 1 or more")
    shot(page, "engine-action-bad-flag")
    assert EngineAction.objects.count() == 1  # the fixture's first restart only

    # a flag the engine does not know: it exits; the page says its own words for it
    page.goto(deployment_page)
    _restart_with(page, "--no-such-flag", "1")
    assert _followed(page, stack) == "Failed"
    shot(page, "engine-action-failed")
    sentence = page.locator(".error-sentence").inner_text()
    assert sentence.startswith("The engine action failed: the engine exited with status 2")
    assert sentence.endswith("error: unrecognized arguments: --no-such-flag 1.")
    failed_log = page.locator("pre.log").inner_text()
    assert failed_log.startswith("== moeops: starting recipe v2")
    assert "unrecognized arguments: --no-such-flag 1" in failed_log
    # neither the old engine's lines nor the reverted one's
    assert "listening on" not in failed_log and "recipe v1" not in failed_log

    # the next restart succeeds: its log pane holds its own start, not the failed recipe's
    page.goto(deployment_page)
    _restart_with(page, "--max-running-requests", "8")
    assert _followed(page, stack) == "Succeeded"
    shot(page, "engine-action-succeeded-after-a-failure")
    log = page.locator("pre.log").inner_text()
    assert log.startswith("== moeops: starting recipe v3") and "listening on" in log
    assert "unrecognized arguments" not in log and "usage:" not in log
