"""The UI in Debian's headless Chromium, driven by Playwright against a live Django server.

Every test fails on a JavaScript console error or an uncaught exception; screenshots land in
test-artifacts/ (gitignored) for a person to look at.
"""

import datetime as dt
import os
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from moeops.examples import load_example_data
from moeops.kernels.services import kernel_config_import
from moeops.runs import services as run_services
from moeops.runs.models import LevelResult, SweepRun, level_key
from tests import page_base as pb

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
KERNEL_FILE = (
    Path(__file__).parent
    / "fixtures"
    / "kernel_configs"
    / "E=128,N=2048,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Workstation_Edition,"
    "dtype=fp8_w8a8,block_shape=[128,128].json"
)
PASSWORD = "pw-browser-123"
# the real sweep path (live server, Redis, GPU-host Celery worker, stand-in engine)
pytest_plugins = ["tests.stack"]

# `make test` installs Debian's chromium; without it these tests fail rather than skip.
pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the ORM calls the tests make
    # between page actions are plain synchronous code all the same.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield chromium
        chromium.close()
    if previous is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser, live_server):
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    context.set_default_timeout(10_000)
    tab = context.new_page()
    errors = []
    tab.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.base = live_server.url
    yield tab
    context.close()
    assert errors == [], f"JavaScript errors: {errors}"


@pytest.fixture
def member(db):
    # staff: the deployment form sets an endpoint address, which only staff may choose
    return User.objects.create_user("dana", password=PASSWORD, is_staff=True)


def _shot(page, name):
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def _log_in(page, member):
    page.goto(page.base + "/")
    assert "/accounts/login/" in page.url
    page.fill("input[name=username]", member.username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(page.base + "/")


def _traces(page, element_id):
    """The traces plotly drew in one chart: name and point count."""
    page.wait_for_function(
        "id => { const el = document.getElementById(id); return el && el.data; }",
        arg=element_id,
    )
    return page.evaluate(
        "id => document.getElementById(id).data.map(t => ({name: t.name, n: (t.x || []).length}))",
        element_id,
    )


def test_log_in_and_create_a_deployment(page, member):
    load_example_data()
    _log_in(page, member)
    assert page.locator("h1").inner_text() == "Dashboard"
    _shot(page, "01-dashboard")

    page.click("text=New deployment")
    page.fill("input[name=name]", "GLM-5 (stand-in)")
    page.select_option("select[name=model]", label="GLM-5-NVFP4")
    page.select_option("select[name=host]", label="rtx-pro-6000-x8")
    page.fill("input[name=tp]", "8")
    page.fill("input[name=max_running_requests]", "64")
    page.fill("input[name=endpoint_url]", "http://127.0.0.1:30000")
    page.fill("input[name=served_model_name]", "glm-5")
    for index in range(8):
        page.check(f"text=rtx-pro-6000-x8 · GPU{index}")
    _shot(page, "02-new-deployment-form")
    page.click("button:has-text('Create deployment')")
    page.wait_for_selector("h1:has-text('GLM-5 (stand-in)')")
    assert "E=256, N=256" in page.content()
    assert "8 × NVIDIA RTX PRO 6000 Blackwell" in page.content()
    _shot(page, "03-new-deployment-page")


def test_a_sweep_started_from_the_page_shows_live_progress_to_the_end(page, member, monkeypatch):
    sent = []
    monkeypatch.setattr(
        run_services, "send_host_task", lambda name, host, kwargs: sent.append(kwargs)
    )
    deployment = load_example_data()
    deployment.endpoint_url = "http://127.0.0.1:30000"
    deployment.save()
    _log_in(page, member)
    page.goto(page.base + deployment.get_absolute_url())
    page.click("summary:has-text('Run sweep')")
    page.fill("input[name=levels]", "32,64,128")
    page.fill("input[name=prompts_per_level]", "100")
    page.click("button:has-text('Start sweep')")
    page.wait_for_selector(".progress[data-status=queued]")
    run = SweepRun.objects.get(status="queued")
    assert sent and sent[0]["run_uuid"] == str(run.uuid)
    assert page.url.endswith(f"/runs/{run.uuid}/")

    # The worker's reports, as the API would store them.
    started = timezone.now() - dt.timedelta(seconds=30)
    t0 = started.timestamp()
    SweepRun.objects.filter(pk=run.pk).update(
        status="running",
        started_at=started,
        progress={
            "level_index": 0,
            "levels_total": 3,
            "requests_done": 50,
            "requests_total": 100,
            "concurrency": 32,
        },
    )
    page.wait_for_selector(".progress-text:has-text('level 1 of 3 (concurrency 32), 50 of 100')")
    assert page.get_attribute("[role=progressbar]", "aria-valuenow") == "16.7"
    assert page.inner_text(".progress-eta") != "—"

    for i, (c, tok) in enumerate(((32, 400.0), (64, 700.0))):
        LevelResult.objects.create(
            run=run,
            key=level_key(c, None),
            concurrency=c,
            output_throughput=tok,
            total_token_throughput=2 * tok,
            started_at=t0 + 10 * i,
            finished_at=t0 + 10 * i + 9,
        )
    pb.telemetry(run, gpus=8, seconds=30, t0=t0, power_limit=600.0)
    SweepRun.objects.filter(pk=run.pk).update(
        progress={
            "level_index": 2,
            "levels_total": 3,
            "requests_done": 10,
            "requests_total": 100,
            "concurrency": 128,
        },
    )
    page.wait_for_selector(".progress-text:has-text('level 3 of 3')")
    page.wait_for_function("document.getElementById('throughput').data")
    traces = _traces(page, "throughput")
    assert {t["name"]: t["n"] for t in traces} == {"output": 2, "total": 2}
    assert len(_traces(page, "gpu-util")) == 8
    _shot(page, "04-sweep-running")

    page.click("button:has-text('Cancel run')")
    page.wait_for_selector("text=Cancel requested")
    assert SweepRun.objects.get(pk=run.pk).cancel_requested

    LevelResult.objects.create(
        run=run,
        key=level_key(128, None),
        concurrency=128,
        output_throughput=806.0,
        total_token_throughput=1612.0,
    )
    # the bar reaches the end, then the page reloads once with the finished run's full table
    with page.expect_navigation():
        SweepRun.objects.filter(pk=run.pk).update(
            status="succeeded",
            finished_at=timezone.now(),
            progress={
                "level_index": 2,
                "levels_total": 3,
                "requests_done": 100,
                "requests_total": 100,
            },
        )
        page.wait_for_selector("[role=progressbar][aria-valuenow='100']")
    assert page.locator("table.levels tbody tr").count() == 3
    assert page.locator(".progress").count() == 0
    assert {t["name"]: t["n"] for t in _traces(page, "throughput")} == {"output": 3, "total": 3}
    _shot(page, "05-sweep-finished")


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_a_sweep_against_the_standin_engine_runs_to_the_end_in_the_browser(
    page, member, sweep_stack
):
    deployment = sweep_stack.deployment
    _log_in(page, member)
    page.goto(page.base + deployment.get_absolute_url())
    page.click("summary:has-text('Run sweep')")
    page.fill("input[name=levels]", "8,16,64")
    page.fill("input[name=input_len]", "16")
    page.fill("input[name=output_len]", "32")
    page.fill("input[name=prompts_per_level]", "64")
    page.fill("input[name=warmup]", "2")
    page.click("button:has-text('Start sweep')")
    page.wait_for_selector(".progress")
    page.wait_for_selector(".progress-text:has-text('level')", timeout=60_000)
    _shot(page, "24-standin-sweep-running")
    # the bar reaches the end, then the page reloads with the finished run
    with page.expect_navigation(timeout=150_000):
        page.wait_for_selector("[role=progressbar][aria-valuenow='100']", timeout=150_000)
    page.wait_for_selector("table.levels")
    run = SweepRun.objects.get(deployment=deployment)
    assert run.status == "succeeded", run.error
    assert page.locator("table.levels tbody tr").count() == 3
    assert {t["name"]: t["n"] for t in _traces(page, "throughput")}["output"] == 3
    assert {t["name"] for t in _traces(page, "engine")} == {"running", "queued"}
    _shot(page, "25-standin-sweep-finished")


def test_compare_two_runs_shows_both_lines(page, member):
    deployment = pb.deployment()
    levels = [
        {"concurrency": c, "output_throughput": t, "median_tpot_ms": m}
        for c, t, m in ((32, 400.0, 20.0), (64, 700.0, 30.0), (128, 806.0, 45.0))
    ]
    before = pb.run(deployment, "before tuning", levels=levels)
    after = pb.run(
        deployment,
        "after tuning",
        levels=[{**level, "output_throughput": 3 * level["output_throughput"]} for level in levels],
        parameters={"moe_kernel": "tuned"},
    )
    _log_in(page, member)
    page.goto(page.base + "/runs/")
    page.check(f"input[value='{before.uuid}']")
    page.check(f"input[value='{after.uuid}']")
    page.click("button:has-text('Compare selected')")
    page.wait_for_url("**/compare/?run=*")
    assert str(before.uuid) in page.url and str(after.uuid) in page.url
    traces = _traces(page, "cmp-throughput")
    assert traces == [
        {"name": "GLM-5 · after tuning", "n": 3},
        {"name": "GLM-5 · before tuning", "n": 3},
    ]
    pareto = [t["name"] for t in _traces(page, "cmp-pareto")]
    assert pareto[:2] == ["GLM-5 · after tuning", "GLM-5 · before tuning"]
    _shot(page, "06-compare-two-runs")

    page.select_option("select[name=group]", "kernel")
    page.wait_for_url("**group=kernel*")
    groups = page.evaluate(
        "() => document.getElementById('cmp-throughput').data.map(t => t.legendgroup)"
    )
    assert groups == ["tuned kernel config", "default kernel config"]


def test_every_page_renders_the_write_up(page, member):
    deployment = load_example_data()
    config, _ = kernel_config_import(file_name=KERNEL_FILE.name, text=KERNEL_FILE.read_text())
    kimi = SweepRun.objects.get(label__startswith="After MoE kernel tuning")
    glm = deployment.runs.get()
    _log_in(page, member)
    pages = [
        ("07-deployments", "/deployments/"),
        ("08-deployment-glm5", deployment.get_absolute_url()),
        ("09-deployment-kimi", kimi.deployment.get_absolute_url()),
        ("10-run-glm5-sweep", f"/runs/{glm.uuid}/"),
        ("11-run-kimi-after", f"/runs/{kimi.uuid}/"),
        ("12-runs", "/runs/"),
        ("13-compare-empty", "/compare/"),
        ("16-kernels", "/kernels/"),
        ("17-kernel-config", f"/kernels/{config.pk}/"),
        ("18-hosts", "/hosts/"),
        ("19-host", "/hosts/rtx-pro-6000-x8/"),
        ("20-notes", "/notes/"),
        ("21-note", "/notes/the-pivot-point/"),
    ]
    for name, path in pages:
        response = page.goto(page.base + path)
        assert response.status == 200, path
        page.wait_for_load_state("networkidle")
        _shot(page, name)

    page.goto(page.base + "/compare/")
    page.click("a:has-text('By model')")
    names = [t["name"] for t in _traces(page, "cmp-peaks")]
    assert names == ["peak output tok/s"]
    _shot(page, "14-compare-by-model")
    page.goto(page.base + "/compare/")
    page.click("a:has-text('By topology')")
    page.wait_for_url("**group=topology*")
    _shot(page, "15-compare-by-topology")

    page.goto(page.base + deployment.get_absolute_url())
    with page.expect_navigation():
        page.click("form.plan-item >> nth=2 >> button[value=up]")
    titles = page.eval_on_selector_all(
        "form.plan-item input[name=title]", "els => els.map(e => e.value)"
    )
    assert titles[1] == "Tune the fused-MoE kernel for SM120"
    # changing the status saves it, no button pressed
    with page.expect_navigation():
        page.select_option("form.plan-item >> nth=1 >> select[name=status]", "in_progress")
    assert deployment.plan_items.get(title__startswith="Tune").status == "in_progress"
    page.click("#findings button:has-text('Confirm')")
    page.wait_for_selector("#findings .badge.state:has-text('Confirmed')")


def test_host_page_draws_link_and_p2p_heatmaps(page, member):
    from workers.topology import parse_nvidia_smi_topo

    fixtures = Path(__file__).parent / "fixtures" / "topology"
    matrix = (fixtures / "topo_m_8xh100_nv18_8nics.txt").read_text()
    parsed = parse_nvidia_smi_topo(matrix)
    host = pb.host("h100-x8", gpu_name="NVIDIA H100 80GB HBM3")
    pb.snapshot(host, "bare_metal", "", links=parsed["links"], gpus=parsed["gpus"])
    two = parse_nvidia_smi_topo(
        (fixtures / "topo_m_2x5090_phb_tabs.txt").read_text(),
        {"read": (fixtures / "p2p_2x5090_gns.txt").read_text()},
    )
    pb.snapshot(
        pb.host("rtx5090-x2", gpus=2),
        "container",
        "lxc",
        links=two["links"],
        p2p=two["p2p"],
        gpus=two["gpus"],
    )
    _log_in(page, member)
    page.goto(page.base + "/hosts/h100-x8/")
    [links] = page.evaluate(
        "() => document.getElementById('topo-links').data.map(t => ({type: t.type, n: t.y.length}))"
    )
    assert links == {"type": "heatmap", "n": len(parsed["links"]["labels"])}
    _shot(page, "22-host-8xh100-links")
    page.goto(page.base + "/hosts/rtx5090-x2/")
    assert _traces(page, "topo-p2p-read")[0]["n"] == 2
    _shot(page, "23-host-2x5090-p2p")
