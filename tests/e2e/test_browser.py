"""The UI in Debian's headless Chromium, driven by Playwright against a live Django server.

Every test fails on a JavaScript console error or an uncaught exception; screenshots land in
test-artifacts/ (gitignored) for a person to look at.
"""

import datetime as dt
import io
import json

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.utils import timezone

from moeops.examples import load_example_data, load_standin_deployment
from moeops.examples.h200_tune import TUNING_UUID
from moeops.fleet.models import Deployment
from moeops.insights.models import Finding
from moeops.insights.services import run_analyze
from moeops.kernels.models import TuningRun
from moeops.kernels.services import kernel_config_import
from moeops.runs import services as run_services
from moeops.runs.models import LevelResult, SweepRun
from tests import page_base as pb
from tests.browser import PASSWORD, chart_traces, doc_shot, log_in, shot, sweep_form_opened
from tests.fakes import FIXTURES

RESULTS = FIXTURES / "results"
KERNEL_FILE = (
    FIXTURES
    / "kernel_configs"
    / "E=128,N=2048,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Workstation_Edition,"
    "dtype=fp8_w8a8,block_shape=[128,128].json"
)
# the real sweep path (live server, Redis, GPU-host Celery worker, stand-in engine)
pytest_plugins = ["tests.stack", "tests.browser"]

# `make test` installs Debian's chromium; without it these tests fail rather than skip.
pytestmark = pytest.mark.browser


@pytest.fixture
def member(db):
    # staff: the deployment form sets an endpoint address, which only staff may choose
    return User.objects.create_user("dana", password=PASSWORD, is_staff=True)


def test_log_in_and_create_a_deployment(page, member):
    load_example_data()
    log_in(page, member)
    assert page.locator("h1").inner_text() == "Dashboard"
    shot(page, "01-dashboard")

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
    shot(page, "02-new-deployment-form")
    page.click("button:has-text('Create deployment')")
    page.wait_for_selector("h1:has-text('GLM-5 (stand-in)')")
    assert "E=256, N=256" in page.content()
    assert "8 × NVIDIA RTX PRO 6000 Blackwell" in page.content()
    shot(page, "03-new-deployment-page")


def test_a_sweep_started_from_the_page_shows_live_progress_to_the_end(page, member, monkeypatch):
    sent = []
    monkeypatch.setattr(
        run_services, "send_host_task", lambda name, host, kwargs: sent.append(kwargs)
    )
    deployment = load_example_data()
    deployment.endpoint_url = "http://127.0.0.1:30000"
    deployment.save()
    sweep_form_opened(page, member, deployment)
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
        pb.level(
            run,
            c,
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
            # the worker's heartbeat is fresh: a cancel goes through its flag
            "heartbeat": timezone.now().timestamp(),
        },
    )
    page.wait_for_selector(".progress-text:has-text('level 3 of 3')")
    page.wait_for_function("document.getElementById('throughput').data")
    traces = chart_traces(page, "throughput")
    assert {t["name"]: t["n"] for t in traces} == {"output": 2, "total": 2}
    assert len(chart_traces(page, "gpu-util")) == 8
    shot(page, "04-sweep-running")

    page.click("button:has-text('Cancel run')")
    page.wait_for_selector("text=Cancel requested")
    assert SweepRun.objects.get(pk=run.pk).cancel_requested

    pb.level(run, 128, output_throughput=806.0, total_token_throughput=1612.0)
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
    assert {t["name"]: t["n"] for t in chart_traces(page, "throughput")} == {
        "output": 3,
        "total": 3,
    }
    shot(page, "05-sweep-finished")


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_a_sweep_against_the_standin_engine_runs_to_the_end_in_the_browser(
    page, member, sweep_stack
):
    deployment = sweep_stack.deployment
    sweep_form_opened(page, member, deployment)
    page.fill("input[name=levels]", "8,16,64")
    page.fill("input[name=input_len]", "16")
    page.fill("input[name=output_len]", "32")
    page.fill("input[name=prompts_per_level]", "64")
    page.fill("input[name=warmup]", "2")
    page.click("button:has-text('Start sweep')")
    page.wait_for_selector(".progress")
    page.wait_for_selector(".progress-text:has-text('level')", timeout=60_000)
    shot(page, "24-standin-sweep-running")
    # the bar reaches the end, then the page reloads with the finished run
    with page.expect_navigation(timeout=150_000):
        page.wait_for_selector("[role=progressbar][aria-valuenow='100']", timeout=150_000)
    page.wait_for_selector("table.levels")
    run = SweepRun.objects.get(deployment=deployment)
    assert run.status == "succeeded", run.error
    assert page.locator("table.levels tbody tr").count() == 3
    # the stand-in answered: every series says so
    assert {t["name"]: t["n"] for t in chart_traces(page, "throughput")}["output [stand-in]"] == 3
    assert {t["name"] for t in chart_traces(page, "engine")} == {
        "running [stand-in]",
        "queued [stand-in]",
    }
    assert page.inner_text("h1 .badge.standin") == "stand-in"
    shot(page, "25-standin-sweep-finished")


def test_compare_two_runs_shows_both_lines(page, member):
    before, after = pb.before_and_after_tuning(pb.deployment(), parameters={"moe_kernel": "tuned"})
    log_in(page, member)
    page.goto(page.base + "/runs/")
    page.check(f"input[value='{before.uuid}']")
    page.check(f"input[value='{after.uuid}']")
    page.click("button:has-text('Compare selected')")
    page.wait_for_url("**/compare/?run=*")
    assert str(before.uuid) in page.url and str(after.uuid) in page.url
    # the older run is the baseline, whatever the order they were ticked in
    traces = chart_traces(page, "cmp-throughput")
    assert traces == [
        {"name": "GLM-5 · before tuning", "n": 3},
        {"name": "GLM-5 · after tuning", "n": 3},
    ]
    pareto = [t["name"] for t in chart_traces(page, "cmp-pareto")]
    assert pareto[:2] == ["GLM-5 · before tuning", "GLM-5 · after tuning"]
    shot(page, "06-compare-two-runs")

    page.select_option("select[name=group]", "kernel")
    page.wait_for_url("**group=kernel*")
    groups = page.evaluate(
        "() => document.getElementById('cmp-throughput').data.map(t => t.legendgroup)"
    )
    assert groups == ["default kernel config", "tuned kernel config"]


def test_every_page_renders_the_write_up(page, member):
    deployment = load_example_data()
    # as make run's load does: the write-up's findings come from the analysis of its runs
    for run in SweepRun.objects.filter(provenance__startswith="From the write-up"):
        run_analyze(run=run)
    config, _ = kernel_config_import(file_name=KERNEL_FILE.name, text=KERNEL_FILE.read_text())
    kimi = SweepRun.objects.get(label__startswith="After MoE kernel tuning")
    glm = deployment.runs.get()
    log_in(page, member)
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
        shot(page, name)

    page.goto(page.base + "/compare/")
    page.click("a:has-text('Before / after kernel tuning')")
    names = [t["name"] for t in chart_traces(page, "cmp-peaks")]
    assert names == ["peak output tok/s"]
    shot(page, "14-compare-before-after")
    page.goto(page.base + "/compare/")
    # the write-up's two models ran on two topologies: no pair varies one alone
    assert page.locator("span.button.disabled:has-text('By topology')").count() == 1
    shot(page, "15-compare-presets")

    page.goto(page.base + deployment.get_absolute_url())
    with page.expect_navigation():
        page.click("form.plan-item >> nth=2 >> button[value=up]")
    titles = page.eval_on_selector_all(
        "form.plan-item [name=title]", "els => els.map(e => e.value)"
    )
    assert titles[1] == "Tune the fused-MoE kernel for SM120"
    # changing the status saves it, no button pressed
    with page.expect_navigation():
        page.select_option("form.plan-item >> nth=1 >> select[name=status]", "in_progress")
    assert deployment.plan_items.get(title__startswith="Tune").status == "in_progress"
    page.click("#findings button:has-text('Confirm')")
    page.wait_for_selector("#findings .badge.state:has-text('Confirmed')")


def test_host_page_draws_link_and_p2p_heatmaps(page, member):
    from domain.topology import parse_nvidia_smi_topo

    fixtures = FIXTURES / "topology"
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
    log_in(page, member)
    page.goto(page.base + "/hosts/h100-x8/")
    [links] = page.evaluate(
        "() => document.getElementById('topo-links').data.map(t => ({type: t.type, n: t.y.length}))"
    )
    assert links == {"type": "heatmap", "n": len(parsed["links"]["labels"])}
    shot(page, "22-host-8xh100-links")
    page.goto(page.base + "/hosts/rtx5090-x2/")
    assert chart_traces(page, "topo-p2p-read")[0]["n"] == 2
    shot(page, "23-host-2x5090-p2p")


# --- issue 19: what the UI claims is true at a glance ----------------------------------------


def _analyzed_example():
    """The example data as `make run` loads it: the write-up's runs analyzed."""
    call_command("load_example_data", stdout=io.StringIO())
    return Deployment.objects.get(name="GLM-5-NVFP4 on 8× RTX PRO 6000")


def _standin_run(deployment, label="small sweep from the UI", peak=2606.0):
    levels = [
        {"concurrency": c, "output_throughput": peak * f, "median_tpot_ms": 10.0 * f}
        for c, f in ((8, 0.3), (64, 1.0))
    ]
    return pb.run(deployment, label, levels=levels, snapshot={"engine": {"engine": "standin"}})


def test_the_dashboard_marks_the_standin_and_says_no_check_has_run(page, member):
    deployment = _analyzed_example()
    standin = _standin_run(load_standin_deployment())
    log_in(page, member)
    glm_row = page.locator("table.data").first.locator("tr", has_text=deployment.name)
    assert glm_row.locator(".status").inner_text() == "not checked yet"
    recent = page.locator("table.compact tr", has_text=standin.label)
    assert recent.locator(".badge.standin").inner_text() == "stand-in"
    # the headline first: a critical or warning finding leads the open findings
    first = page.locator(".finding-line").first
    assert first.locator(".badge.severity").inner_text() in ("Critical", "Warning")
    favicon = page.get_attribute("link[rel=icon]", "href")
    assert page.request.get(page.base + favicon).status == 200
    doc_shot(page, "dashboard")


def test_compare_leaves_the_standin_out_unless_asked(page, member):
    glm = _analyzed_example()
    standin = _standin_run(load_standin_deployment())
    sweep = glm.runs.get()
    log_in(page, member)
    page.goto(f"{page.base}/compare/?run={sweep.uuid}&run={standin.uuid}")
    notice = page.inner_text("#standin-left-out")
    assert notice.startswith("1 stand-in run left out (small sweep from the UI)")
    assert [t["name"] for t in chart_traces(page, "cmp-peaks")] == ["peak output tok/s"]
    assert page.locator("#compare-table tbody tr").count() == 1
    page.click("#standin-left-out a")
    page.wait_for_url("**standin=1*")
    names = page.evaluate("() => document.getElementById('cmp-peaks').data[0].y")
    assert "GLM-5-NVFP4 · small sweep from the UI [stand-in]" in names
    row = page.locator("#compare-table tr", has_text="small sweep from the UI")
    assert row.locator(".badge.standin").inner_text() == "stand-in"
    # a host with no GPU has no per-GPU figure
    assert row.locator("td").nth(12).inner_text() == "n/a"
    banner = page.inner_text("#differs-in")
    assert "differs in: model" in banner


def test_a_preset_compares_one_factor_and_states_the_headline(page, member):
    _analyzed_example()
    log_in(page, member)
    page.goto(page.base + "/compare/")
    assert page.locator("span.button.disabled", has_text="By model").count() == 1
    assert "By model: No two runs differ in the model alone." in page.inner_text(".presets")
    page.click("a:has-text('Before / after kernel tuning')")
    page.wait_for_selector("#differs-in")
    banner = page.inner_text("#differs-in")
    assert "7.25× peak output throughput" in banner
    assert "differs in: kernel config" in banner
    doc_shot(page, "compare-preset")


def test_the_glm5_page_leads_with_what_matters(page, member):
    deployment = _analyzed_example()
    log_in(page, member)
    page.goto(page.base + deployment.get_absolute_url())
    titles = page.eval_on_selector_all("#findings article h3", "els => els.map(e => e.innerText)")
    severities = page.eval_on_selector_all(
        "#findings article .badge.severity", "els => els.map(e => e.innerText)"
    )
    assert severities == sorted(severities, key=["Critical", "Warning", "Info"].index)
    # the plateau is the engine's cap: it says so, first, and proposes the cap's change
    assert titles[0] == (
        "Throughput plateaus from concurrency 128 (806 tok/s), at the engine's cap "
        "(--max-running-requests 64)"
    )
    plan = page.eval_on_selector_all("form.plan-item [name=title]", "els => els.map(e => e.value)")
    assert plan.count("Raise --max-running-requests above 64 and re-sweep") == 1
    idle = Finding.objects.get(deployment=deployment, kind="idle_gpus")
    page.wait_for_function(
        "id => document.getElementById(id) && document.getElementById(id).layout",
        arg=f"evidence-{idle.pk}",
    )
    span = page.evaluate(f"() => document.getElementById('evidence-{idle.pk}').layout.yaxis.range")
    assert span == [0, 100]
    peaks = page.evaluate("() => document.getElementById('peaks-chart').data[0].type")
    assert peaks == "bar"
    doc_shot(page, "deployment-glm5")


def test_the_run_page_offers_a_log_ttft_axis_and_marks_a_partial_level(page, member):
    deployment = pb.deployment()
    levels = [
        {
            "concurrency": c,
            "output_throughput": t,
            "median_tpot_ms": 20.0 * i,
            "median_ttft_ms": 10.0**i,
            "p99_ttft_ms": 3 * 10.0**i,
        }
        for i, (c, t) in enumerate(((32, 400.0), (64, 700.0), (128, 806.0)), 1)
    ]
    run = pb.run(deployment, "cancelled at 128", levels=levels, status="cancelled")
    LevelResult.objects.filter(run=run, concurrency=128).update(
        completed=37, raw={"stopped": True, "num_prompts": 128}
    )
    log_in(page, member)
    page.goto(f"{page.base}/runs/{run.uuid}/")
    assert page.locator("table.levels tr.partial .badge.partial").inner_text() == "partial"
    assert "the 37 of 128 requests finished by then are kept" in page.inner_text(".partial-note")
    chart_traces(page, "ttft")
    page.locator("#ttft .updatemenu-button", has_text="log").click()
    page.wait_for_function("() => document.getElementById('ttft').layout.yaxis.type === 'log'")
    doc_shot(page, "run")


def test_a_starting_run_waits_in_one_placeholder_then_draws(page, member):
    run = pb.run(pb.deployment(), "starting", status="running")
    log_in(page, member)
    page.goto(f"{page.base}/runs/{run.uuid}/")
    assert page.is_visible("#waiting-first-level")
    assert page.locator(".chart-grid section:visible").count() == 0
    pb.level(run, 32, output_throughput=400.0)
    page.wait_for_selector("#waiting-first-level", state="hidden")
    assert page.is_visible("#throughput")
    # the charts still without data stay out of sight
    assert not page.is_visible("#gpu-util")


def test_the_sweep_form_has_presets_and_estimates_their_duration(page, member):
    deployment = pb.standin_checked(load_standin_deployment())
    sweep_form_opened(page, member, deployment)
    assert page.input_value("input[name=levels]") == "8,16,32,64,128"
    estimate = page.inner_text("#sweep-estimate")
    assert estimate.startswith("Estimated duration: ≈ 1 min 04 s (from the stand-in")
    page.click("button:has-text('full')")
    assert page.input_value("input[name=levels]") == "32,64,128,256,512,1024"
    page.wait_for_function(
        "() => document.getElementById('sweep-estimate').innerText.includes('≈ 43 min')"
    )
    page.click("button:has-text('quick (≈ 1 min on the stand-in)')")
    page.wait_for_function(
        "() => document.getElementById('sweep-estimate').innerText.includes('≈ 1 min 04 s')"
    )


def test_a_form_the_server_cannot_give_says_so_and_opens_on_the_next_try(page, member):
    deployment = pb.standin_checked(load_standin_deployment())
    refused = []

    def once_refused(route):
        if refused:
            route.continue_()
        else:
            refused.append(route.request.url)
            route.fulfill(status=503, body="down")

    page.route("**/sweep/form/", once_refused)
    sweep_form_opened(page, member, deployment)
    slot = page.wait_for_selector("#sweep .form-slot:has-text('could not be opened')")
    assert slot.inner_text() == (
        "The form could not be opened (the server answered 503): "
        "close and open this section to try again."
    )
    page.click("summary:has-text('Run sweep')")
    page.click("summary:has-text('Run sweep')")
    assert page.input_value("#sweep-form input[name=levels]") == "8,16,32,64,128"
    assert refused == [page.base + f"/deployments/{deployment.pk}/sweep/form/"]
    # the refused request is the one error the browser logs
    assert [e for e in page.js_errors if "503" not in e] == []
    page.js_errors.clear()


def test_a_tune_is_refused_before_it_is_queued_saying_why(page, member):
    deployment = load_standin_deployment()
    pb.worker_seen(deployment.host)
    log_in(page, member)
    page.goto(page.base + deployment.get_absolute_url())
    page.click("summary:has-text('Tune MoE kernel')")
    assert page.inner_text("#tune-preflight") == (
        "Host local has no GPU recorded (its worker's probe found none), and a kernel tune "
        "times the kernel on a CUDA GPU."
    )
    assert page.is_disabled("button:has-text('Start tune')")


def test_a_failed_tune_reads_as_a_sentence_and_can_be_cancelled_when_queued(page, member):
    deployment = pb.deployment()
    failed = pb.tune(
        deployment,
        device_name="NVIDIA H200",
        status="failed",
        error="RuntimeError: GPU 0 (batch sizes 1) exited with 1: AttributeError: module "
        "'torch._C' has no attribute '_cuda_setDevice'",
    )
    queued = pb.tune(deployment)
    log_in(page, member)
    page.goto(f"{page.base}/tunes/{failed.uuid}/")
    assert page.inner_text("h1").startswith("tune E=256 N=256 bf16 on h200-x8 (NVIDIA H200)")
    assert page.inner_text(".error-sentence").startswith("This host cannot run CUDA")
    assert not page.is_visible(".error-detail pre")
    page.click(".error-detail summary")
    assert "_cuda_setDevice" in page.inner_text(".error-detail pre")
    page.goto(f"{page.base}/tunes/{queued.uuid}/")
    with page.expect_navigation():
        page.click("button:has-text('Cancel tune')")
    assert "Cancelled before the worker started it." in page.inner_text(".messages")
    assert page.inner_text("h1 .status") == "Cancelled"


def test_a_deployment_of_a_pasted_config_is_checked_before_it_is_saved(page, member):
    pb.host("h200")
    log_in(page, member)
    page.goto(page.base + "/deployments/new/")
    page.fill("input[name=name]", "Kimi K2 on h200")
    page.fill("input[name=new_model_name]", "moonshotai/Kimi-K2-Instruct")
    page.fill("textarea[name=config_text]", json.dumps(pb.KIMI_CONFIG))
    page.select_option("select[name=host]", label="h200")
    page.fill("input[name=tp]", "7")
    page.click("button:has-text('Create deployment')")
    page.wait_for_selector(".has-error")
    assert "The MoE shape does not split over tp=7, ep=1" in page.inner_text(".field.has-error")
    # what was typed is all still there
    assert json.loads(page.input_value("textarea[name=config_text]")) == pb.KIMI_CONFIG
    assert page.input_value("input[name=name]") == "Kimi K2 on h200"
    page.fill("input[name=tp]", "8")
    page.click("button:has-text('Create deployment')")
    page.wait_for_selector("h1:has-text('Kimi K2 on h200')")
    assert "E=384, N=256" in page.content()


def test_result_and_kernel_files_upload_from_their_pages(page, member):
    # the model the vLLM file measured (its model_id): imported without a question
    deployment = pb.deployment(served_model_name="zai-org/GLM-5-FP8")
    log_in(page, member)
    page.goto(page.base + deployment.get_absolute_url())
    page.click("summary:has-text('Upload a result file')")
    page.select_option("#result-upload select[name=format]", "vllm")
    page.set_input_files(
        "#result-upload input[name=file]", str(RESULTS / "vllm_bench_serve_0.11.json")
    )
    with page.expect_navigation():
        page.click("#result-upload button:has-text('Import')")
    assert "Imported vllm_bench_serve_0.11.json: 1 levels." in page.inner_text(".messages")
    assert page.inner_text("h1 .badge.origin") == "imported"
    assert page.locator("table.levels tbody tr").count() == 1

    page.goto(page.base + "/kernels/")
    page.click("summary:has-text('Upload a config file')")
    page.set_input_files("#kernel-upload input[name=file]", str(KERNEL_FILE))
    with page.expect_navigation():
        page.click("#kernel-upload button:has-text('Upload')")
    assert page.inner_text(".messages").startswith("Stored E=128,N=2048")


def test_the_h200_tune_of_the_examples_draws_the_tuned_default_and_shipped_timings(page, member):
    call_command("load_example_data", stdout=io.StringIO())
    tuning = TuningRun.objects.get(uuid=TUNING_UUID)
    log_in(page, member)
    page.goto(page.base + f"/kernels/{tuning.result_id}/")
    traces = {t["name"]: t["n"] for t in chart_traces(page, "timings")}
    assert traces == {"tuned": 18, "default config": 18, "shipped config": 18, "hardware floor": 18}
    tuned_on = page.locator("dt:has-text('Tuned on') + dd").inner_text()
    assert tuned_on.startswith("vLLM 0.33.0's own kernel · source 8f71154b")
    # the README's picture: the timings against vLLM's own configs, under the files
    page.locator("h2:has-text('Timings')").evaluate("h => window.scrollTo(0, h.offsetTop - 8)")
    doc_shot(page, "kernel-h200")
