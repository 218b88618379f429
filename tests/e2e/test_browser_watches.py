"""The watch section in Chromium: a watch added from the deployment page (a cron that does not
parse refused on its field, then every 6 hours with "find the cause by itself"), its page after
a regression with the "Find the cause" button, and the sentence the page gives when the cause
cannot be looked for (the host's worker is gone)."""

import pytest
from django.contrib.auth.models import User

from moeops.watches import services
from moeops.watches.models import WatchRun
from tests import page_base
from tests.browser import PASSWORD, log_in, shot

pytest_plugins = ["tests.browser"]
pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.timeout(120)]


def _judged(watch, peak, interval, max_num_seqs):
    run = page_base.run(
        watch.deployment,
        levels=[{"concurrency": 8, "output_throughput": peak}],
        snapshot={"engine": {"engine": "vllm", "version": "0.11.0", "args_source": "cli",
                             "args": {"--max-num-seqs": max_num_seqs}}},
    )  # fmt: skip
    # two-run verdicts judge the rounds (domain.intervals.compare_rounds)
    page_base.rounds_spanning(run.levels.get(), peak, interval)
    WatchRun.objects.create(watch=watch, run=run, status="running")
    return services.watch_run_finished(run)


def test_a_watch_added_on_the_deployment_page_and_its_cause_asked_for(transactional_db, page):
    staff = User.objects.create_user("ops", password=PASSWORD, is_staff=True)
    deployment = page_base.deployment(management="managed")
    log_in(page, staff)
    page.goto(page.base + deployment.get_absolute_url())
    page.click("#watches summary:has-text('Add a watch')")
    page.fill("#watch-form input[name=name]", "nightly")
    page.fill("#watch-form input[name=schedule]", "0 99 * * *")
    page.fill("#watch-form input[name=levels]", "4, 8")
    page.click("#watch-form button[type=submit]")
    # refused on its field, the form open again with what was typed
    page.wait_for_selector("#watch-form >> text=the hour field '99' does not parse")
    shot(page, "watch-form-bad-cron")
    # the refusal is answered 400, which Chromium reports as a failed load
    refused = "Failed to load resource: the server responded with a status of 400 (Bad Request)"
    assert page.js_errors == [refused]
    page.js_errors.clear()
    page.fill("#watch-form input[name=schedule]", "6h")
    page.check("#watch-form input[name=bisect_on_regression]")
    page.click("#watch-form button[type=submit]")
    page.wait_for_selector("h1:has-text('Watch nightly')")
    assert "every 6 hours" in page.locator("#watch-schedule").inner_text()
    assert "On a regression it finds the cause by itself." in page.content()

    watch = deployment.watches.get()
    _judged(watch, 1000.0, [950.0, 1050.0], 8)
    _judged(watch, 300.0, [280.0, 320.0], 1)
    page.reload()
    row = page.locator("#watch-runs tbody tr").first
    assert "Regressed beyond the noise" in row.inner_text()
    assert "--max-num-seqs 8 → 1" in row.inner_text()
    shot(page, "watch-regressed")
    # no worker has ever been heard from on this host: the page says so, nothing starts
    row.locator("button:has-text('Find the cause')").click()
    page.wait_for_selector("text=Cannot find the cause:")
    assert "Watch nightly" in page.locator("h1").inner_text()
    assert not watch.watch_runs.filter(bisections__isnull=False).exists()
