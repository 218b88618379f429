"""Issue 40's first figures in Chromium: a run of another model imported across the mismatch
leaves the dashboard's headline and the deployment's chart as they were (item 2), and compare
takes the older run as the baseline whatever order the rows were ticked in (item 5)."""

import pytest
from django.contrib.auth.models import User

from moeops.examples import load_example_data
from moeops.runs.models import SweepRun
from tests import page_base as pb
from tests.browser import PASSWORD, chart_traces, log_in, shot
from tests.fakes import FIXTURES

pytest_plugins = ["tests.browser"]
pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

# a real SGLang bench_serving line: Qwen/Qwen2.5-3B-Instruct on TP 1, SGLang 0.5.5.post3
QWEN_FILE = FIXTURES / "results" / "TonyLi15-sglang-benchmark__agg_n50_in128_out64_c8.jsonl"


@pytest.fixture
def member(db):
    return User.objects.create_user("dana", password=PASSWORD)


def _headlines(page):
    """{deployment name: its "Latest peak output" cell} of the dashboard."""
    page.goto(page.base + "/")
    return page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll("table.data tbody tr")]
            .filter(row => row.querySelector("td.big"))
            .map(row => [row.cells[0].innerText.trim(),
                         row.querySelector("td.big").innerText.trim()]))"""
    )


def test_another_models_run_imported_feeds_no_headline_nor_chart(page, member):
    glm = load_example_data()
    log_in(page, member)
    before = _headlines(page)
    assert before[glm.name].startswith("912")

    page.goto(page.base + glm.get_absolute_url())
    upload = page.locator("#result-upload")
    upload.locator("summary").click()
    upload.locator("select[name=format]").select_option("sglang")
    upload.locator("input[name=file]").set_input_files(str(QWEN_FILE))
    upload.locator("button[type=submit]").click()
    # the mismatch is asked about first: the file measured Qwen, not GLM-5
    page.wait_for_selector("#result-upload >> text=Not imported:")
    assert "Qwen/Qwen2.5-3B-Instruct" in page.locator("#result-upload").inner_text()
    page.js_errors.clear()  # the refusal is a 400, which Chromium logs as a failed load
    upload = page.locator("#result-upload")
    upload.locator("select[name=format]").select_option("sglang")
    upload.locator("input[name=file]").set_input_files(str(QWEN_FILE))
    upload.locator("input[name=accept_mismatch]").check()
    upload.locator("button[type=submit]").click()
    page.wait_for_url("**/runs/*/")
    imported = SweepRun.objects.get(source="import")
    assert imported.other_model == "Qwen/Qwen2.5-3B-Instruct"

    # the dashboard's headlines are what they were, the Qwen run's peak in none of them
    assert _headlines(page) == before
    page.goto(page.base + glm.get_absolute_url())
    # the deployment's run table names the model each run measured
    row = page.locator("tr", has=page.locator(f"a[href='/runs/{imported.uuid}/']")).first
    assert "Qwen2.5-3B-Instruct" in row.inner_text()
    # its throughput chart draws the GLM-5 sweep alone
    traces = chart_traces(page, "throughput-chart")
    assert [t["n"] for t in traces] == [3]
    shot(page, "trust-import-another-model")


def test_compare_takes_the_older_run_as_baseline_when_ticked_newest_first(page, member):
    older, newer = pb.before_and_after_tuning(pb.deployment())
    log_in(page, member)
    page.goto(page.base + "/runs/")
    page.check(f"input[value='{newer.uuid}']")
    page.check(f"input[value='{older.uuid}']")
    page.click("button:has-text('Compare selected')")
    page.wait_for_url("**/compare/?run=*")
    # ticked newest first: the query names the newer run first all the same
    assert page.url.index(str(newer.uuid)) < page.url.index(str(older.uuid))
    line = page.locator("#differs-in .differs-line").first.inner_text()
    assert line.startswith("after tuning against before tuning")
    # 3× the older run's figure, not 0.33×: the older is the baseline
    headline = page.locator("#differs-in .headline").first.inner_text()
    assert headline.startswith("3"), headline
    # single rounds say so, not "cannot tell"
    assert "single rounds: no noise estimate" in line
    assert "cannot tell" not in line
    shot(page, "trust-compare-newest-first")
