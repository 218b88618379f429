"""Issue 40, items 16 and 17, in Chromium at a 1,400 px window: the runs list and compare fit it
with a long model path (shortened, whole on hover), run parameters read as words and not a
Python dict, the workload select and plan titles are not cut, the TTFT chart's linear/log switch
sits outside its plot; a watch's "Run now" starts a run, its form offers alert channels, the
capacity form tells its estimated duration, and the API tokens page makes and revokes a token."""

import pytest
from django.contrib.auth.models import User

from moeops.api.models import ApiToken
from moeops.examples import load_example_data
from moeops.fleet.models import SLOProfile
from moeops.insights.models import PlanItem
from moeops.runs.models import SweepRun
from moeops.watches import services as watch_services
from moeops.watches.models import AlertChannel
from tests import page_base as pb
from tests.browser import PASSWORD, log_in, shot

pytest_plugins = ["tests.browser"]
pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]

LONG_MODEL = (
    "/mnt/models/huggingface/hub/models--Qwen--Qwen2.5-72B-Instruct-GPTQ-Int4-long-name/"
    "snapshots/0123456789abcdef0123456789abcdef01234567"
)
OVERFLOW = "() => document.documentElement.scrollWidth - window.innerWidth"
# tables wider than their box: a scroll of its own hides columns as the page would
TABLES_WIDER = """() => [...document.querySelectorAll("table.data")]
    .filter(t => t.getBoundingClientRect().width > t.parentElement.clientWidth + 1)
    .map(t => t.id || t.className)"""


@pytest.fixture
def staff(db):
    return User.objects.create_user("ops", password=PASSWORD, is_staff=True)


@pytest.fixture
def narrow(page):
    page.set_viewport_size({"width": 1400, "height": 900})
    return page


def _long_model_run(deployment):
    """A run imported from a file of a model with a long path, as a person's cache names it."""
    run = pb.run(
        deployment,
        "qwen72b-gptq-int4 sweep on the borrowed box",
        levels=[{"concurrency": 8, "output_throughput": 300.0}],
        snapshot={"file": {"other_model": LONG_MODEL, "format": "vllm"}},
        parameters={"levels": [8, 16], "slo": {"profile": "chat", "limits": {"tpot": ["p99", 50]}}},
    )
    SweepRun.objects.filter(pk=run.pk).update(source="import")
    return run


def test_the_runs_list_and_compare_fit_1400_px_with_a_long_model_path(narrow, staff):
    page = narrow
    glm = load_example_data()
    long_run = _long_model_run(glm)
    log_in(page, staff)
    page.goto(page.base + "/runs/")
    cell = page.locator(f"td[title='{LONG_MODEL}']").first
    assert cell.inner_text() == "Qwen/Qwen2.5-72B-Instruct-GPTQ-Int4-long-name"
    assert page.evaluate(OVERFLOW) <= 0
    assert page.evaluate(TABLES_WIDER) == []
    shot(page, "layout-runs-1400")

    glm_run = glm.runs.exclude(pk=long_run.pk).first()
    page.goto(page.base + f"/compare/?run={glm_run.uuid}&run={long_run.uuid}")
    page.wait_for_selector("#compare-table")
    assert page.locator(f"#compare-table td[title='{LONG_MODEL}']").count() == 1
    assert page.evaluate(OVERFLOW) <= 0
    assert page.evaluate(TABLES_WIDER) == []
    shot(page, "layout-compare-1400")


def test_run_parameters_read_as_words(narrow, staff):
    page = narrow
    run = _long_model_run(pb.deployment())
    log_in(page, staff)
    page.goto(page.base + f"/runs/{run.uuid}/")
    values = page.locator("dd.parameter").all_inner_texts()
    assert "8, 16" in values
    assert "limits tpot p99, 50; profile chat" in values
    assert not any("{'" in value or "['" in value for value in values), values


def test_the_workload_select_and_plan_titles_are_not_cut(narrow, staff):
    page = narrow
    glm = load_example_data()
    title = (
        "Restart with --max-running-requests 128 and sweep again with the same load to see "
        "whether the plateau at 64 was the cap or the GPUs"
    )
    PlanItem.objects.create(deployment=glm, title=title, position=99)
    log_in(page, staff)
    page.goto(page.base + glm.get_absolute_url())
    page.click("#capacity-search summary")
    page.wait_for_selector("#capacity-form select[name=workload]")
    clipped = page.evaluate(
        """() => { const s = document.querySelector("#capacity-form select[name=workload]");
                   const label = s.closest("label").getBoundingClientRect();
                   const box = s.getBoundingClientRect();
                   return {inside: box.right <= label.right + 0.5,
                           fits: s.scrollWidth <= s.clientWidth + 1,
                           text: box.width >= label.width - 1}; }"""
    )
    assert clipped == {"inside": True, "fits": True, "text": True}
    box = page.locator("textarea.plan-title", has_text="Restart with").first
    assert box.input_value() == title
    assert box.evaluate(
        "el => el.scrollHeight <= el.clientHeight + 1 && el.scrollWidth <= el.clientWidth + 1"
    )
    shot(page, "layout-plan-and-workload")


def test_the_ttft_switch_lies_outside_its_plot(narrow, staff):
    page = narrow
    levels = [
        {"concurrency": c, "output_throughput": t, "median_ttft_ms": ttft, "p99_ttft_ms": 3 * ttft}
        for c, t, ttft in ((32, 400.0, 10.0), (64, 700.0, 100.0), (128, 806.0, 1000.0))
    ]
    run = pb.run(pb.deployment(), "sweep", levels=levels)
    log_in(page, staff)
    page.goto(page.base + f"/runs/{run.uuid}/")
    chart = page.locator(".js-plotly-plot", has=page.locator(".updatemenu-container")).first
    chart.locator(".updatemenu-button").first.wait_for()
    assert "TTFT" in chart.locator(".gtitle").text_content()
    plot = chart.locator(".nsewdrag").first.bounding_box()
    buttons = chart.locator(".updatemenu-button").all()
    assert len(buttons) == 2
    for button in buttons:
        b = button.bounding_box()
        assert b["y"] + b["height"] <= plot["y"] + 0.5, (b, plot)


def test_run_now_channels_and_the_capacity_estimate(narrow, staff):
    page = narrow
    profile = SLOProfile.objects.create(name="chat", tpot_percentile="p99", tpot_ms=20.0)
    deployment = pb.standin_deployment(default_slo_profile=profile)
    AlertChannel.objects.create(name="perf-oncall", kind="email", recipients=["p@example.com"])
    log_in(page, staff)
    page.goto(page.base + deployment.get_absolute_url())

    # the capacity search tells its duration before it starts, and follows the form
    page.click("#capacity-search summary")
    estimate = page.locator("#capacity-estimate")
    page.wait_for_function("() => document.getElementById('capacity-estimate')?.innerText")
    assert estimate.inner_text().startswith("Estimated duration: ≈ 8 min 33 s, 11 levels")
    page.fill("#capacity-form input[name=end]", "16")
    page.wait_for_function(
        "() => document.getElementById('capacity-estimate').innerText.includes('to 16 concurrent')"
    )

    # a watch whose alerts go to the channel ticked in its form
    page.click("#watches summary:has-text('Add a watch')")
    page.fill("#watch-form input[name=name]", "nightly")
    page.fill("#watch-form input[name=levels]", "4, 8")
    page.check("#watch-channels label:has-text('perf-oncall') input")
    page.click("#watch-form button[type=submit]")
    page.wait_for_selector("h1:has-text('Watch nightly')")
    watch = deployment.watches.get()
    assert [c.name for c in watch.channels.all()] == ["perf-oncall"]

    # "Run now" starts a run at once, whatever the schedule
    page.click("#watch-run-now button")
    page.wait_for_selector("text=Watch nightly fired: its run is queued.")
    row = page.locator("#watch-runs tbody tr").first
    assert "Running" in row.inner_text()
    run = watch.watch_runs.get().run
    assert run.status == "queued" and run.parameters["levels"] == [4, 8]
    assert row.locator(f"a[href='/runs/{run.uuid}/']").count() == 1
    shot(page, "watch-run-now")
    assert watch_services.watch_channels(watch).get().name == "perf-oncall"


def test_the_api_root_and_the_tokens_page(narrow, staff):
    page = narrow
    log_in(page, staff)
    # asked as a client asks it (a tab would also ask for /favicon.ico, which is no page)
    links = page.request.get(page.base + "/api/v1/").json()
    assert links["docs"] == page.base + "/api/v1/docs"
    page.goto(links["tokens"])
    page.fill("#token-form input[name=name]", "ci")
    page.check("#token-form input[name=read_only]")
    page.click("#token-form button[type=submit]")
    plaintext = page.locator("#token-plaintext").input_value()
    token = ApiToken.objects.get()
    assert ApiToken.lookup(plaintext) == token and token.read_only
    page.goto(links["tokens"])
    assert page.locator("#token-plaintext").count() == 0
    page.locator("#tokens button:has-text('Revoke')").click()
    page.wait_for_selector("text=Token ci")
    assert not ApiToken.objects.exists()
    assert "No tokens yet." in page.locator("#tokens").inner_text()
