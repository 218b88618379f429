import datetime as dt
import io

import pytest
from django.core.management import call_command

from moeops.examples import load_example_data
from moeops.insights.models import Finding
from moeops.kernels.models import KernelConfig, TuningRun
from moeops.runs import estimate
from tests import page_base as pb
from tests.fakes import KERNEL_ENTRY

pytestmark = pytest.mark.django_db
# the analysis' finding from SGLang 0.5.23's own fusion decision in the example sweep's snapshot
FUSION_OFF = "SGLang 0.5.23 runs no all-reduce + RMSNorm fusion on compute capability 12.0"


@pytest.fixture
def example(client):
    pb.sign_in(client)
    return load_example_data()


@pytest.fixture
def analyzed(example):
    """The example data as `make run` shows it: its runs analyzed."""
    call_command("load_example_data", stdout=io.StringIO())
    return example


def test_it_shows_model_shape_host_engine_and_health(client, example):
    html = client.get(example.get_absolute_url()).content.decode()
    assert "E=256, N=256" in html  # GLM-5 per rank at TP8
    assert "GlmMoeDsaForCausalLM" in html
    assert "8 × NVIDIA RTX PRO 6000 Blackwell (SM120)" in html
    assert "Container (lxc)" in html
    assert "<dt>max_running_requests</dt><dd><code>64</code></dd>" in html
    # the write-up's status detail: no check of moeops' stands behind it (not checked yet)
    assert "GPUs at 0% utilization" not in html


def test_healthy_is_said_only_after_a_real_check(client, example):
    from moeops.fleet.services import health_check_record

    head = client.get(example.get_absolute_url()).content.decode().split("</h1>")[0]
    # the write-up says the server is healthy; no check of moeops' has said so
    assert '<span class="status status-unknown">not checked yet</span>' in head
    assert "Healthy" not in head
    health_check_record(deployment=example, status="healthy", trigger="manual")
    head = client.get(example.get_absolute_url()).content.decode().split("</h1>")[0]
    assert '<span class="status status-healthy">Healthy</span>' in head


def test_the_peak_per_run_chart_is_a_bar_per_run_oldest_first(client, example):
    later = pb.run(example, "later", levels=[{"concurrency": 64, "output_throughput": 700.0}])
    html = client.get(example.get_absolute_url()).content.decode()
    [bars] = pb.figure(html, "peaks-chart-data")["data"]
    assert bars["type"] == "bar"
    assert bars["y"] == [912.0, 700.0]
    assert bars["x"][1] == str(later.uuid)
    layout = pb.figure(html, "peaks-chart-data")["layout"]
    assert layout["xaxis"]["ticktext"] == ["Concurrency sweep (write-up)", "later"]


def test_stand_in_runs_are_marked_in_the_list_and_the_charts(client, example):
    run = pb.run(
        example,
        "from the stand-in",
        levels=[{"concurrency": 64, "output_throughput": 2606.0}],
        snapshot={"engine": {"engine": "standin"}},
    )
    html = client.get(example.get_absolute_url()).content.decode()
    row = html.split(f'href="/runs/{run.uuid}/">from the stand-in</a>')[1].split("</tr>")[0]
    assert '<span class="badge standin">stand-in</span>' in row
    names = [t["name"] for t in pb.figure(html, "throughput-figure")["data"]]
    assert "from the stand-in [stand-in]" in names
    bars = pb.figure(html, "peaks-chart-data")
    assert "from the stand-in [stand-in]" in bars["layout"]["xaxis"]["ticktext"]


def test_findings_lead_with_severity_then_evidence(client, analyzed):
    html = client.get(analyzed.get_absolute_url()).content.decode()
    panel = html.split('id="findings"')[1]
    order = [part.split("</h3>")[0] for part in panel.split("<h3>")[1:]]
    # the write-up's sweep: the plateau (warning, charted) before SGLang's fusion left off on
    # SM120 (warning, no chart), both before every info
    assert order[0].startswith("Throughput plateaus from concurrency 128")
    assert order[1] == FUSION_OFF
    severities = [
        part.split('<span class="badge severity">')[1].split("<")[0]
        for part in panel.split('<article class="finding')[1:]
    ]
    assert severities == sorted(severities, key=["Critical", "Warning", "Info"].index)


def test_the_plateau_finding_proposes_the_queue_caps_change(client, analyzed):
    html = client.get(analyzed.get_absolute_url()).content.decode()
    assert "(806 tok/s), at the engine&#x27;s cap (--max-running-requests 64)</h3>" in html
    assert "so the cap is what the plateau coincides with" in html
    titles = list(analyzed.plan_items.values_list("title", flat=True))
    assert titles.count("Raise --max-running-requests above 64 and re-sweep") == 1


def test_a_finding_said_in_several_runs_is_shown_once(client, example):
    pb.no_gpu_evidence_in_runs(example)
    html = client.get(example.get_absolute_url()).content.decode()
    panel = html.split('id="findings"')[1].split('id="plan"')[0]
    assert panel.count("<h3>No GPU evidence for this run</h3>") == 1
    also = panel.split('class="muted small also">')[1].split("</p>")[0]
    assert also.startswith("The same in 2 other runs:")
    assert also.count('href="/runs/') == 2


def test_evidence_numbers_are_rounded_to_what_they_mean(client, analyzed):
    html = client.get(analyzed.get_absolute_url()).content.decode()
    evidence = html.split("Throughput plateaus from concurrency 128")[1].split("</details>")[0]
    assert "<dt>gain_per_doubling</dt><dd><code>+9.1%, +3.8%</code></dd>" in evidence
    assert "<dt>plateau_throughput</dt><dd><code>806 tok/s</code></dd>" in evidence
    assert "<dt>threshold</dt><dd><code>10%</code></dd>" in evidence


def test_percentage_evidence_charts_run_from_0_to_100(client, analyzed):
    idle = Finding.objects.get(deployment=analyzed, kind="idle_gpus")
    html = client.get(analyzed.get_absolute_url()).content.decode()
    layout = pb.figure(html, f"evidence-{idle.pk}-data")["layout"]
    assert layout["yaxis"]["range"] == [0, 100]


def test_findings_have_state_buttons_and_charted_evidence(client, example):
    finding = Finding.objects.create(
        deployment=example,
        kind="plateau",
        key="throughput",
        title="Throughput plateaus from concurrency 128",
        evidence={
            "concurrency": [128, 256, 512],
            "chart": {
                "type": "line",
                "x": [128, 256, 512],
                "x_label": "concurrency",
                "y_label": "output tok/s",
                "series": [{"name": "output throughput", "y": [806.0, 879.0, 912.0]}],
            },
        },
    )
    html = client.get(example.get_absolute_url()).content.decode()
    fig = pb.figure(html, f"evidence-{finding.pk}-data")
    assert fig["data"][0]["x"] == [128, 256, 512]
    assert fig["data"][0]["y"] == [806.0, 879.0, 912.0]
    assert f'action="/findings/{finding.pk}/state/"' in html
    assert 'value="confirmed">Confirm</button>' in html
    assert 'value="dismissed">Dismiss</button>' in html


def test_heatmap_evidence_is_drawn_with_its_codes(client, example):
    finding = Finding.objects.create(
        deployment=example,
        kind="topology",
        title="No P2P",
        evidence={
            "chart": {
                "type": "heatmap",
                "title": "P2P read",
                "x": ["GPU0", "GPU1"],
                "y": ["GPU0", "GPU1"],
                "z": [["X", "CNS"], ["CNS", "X"]],
            }
        },
    )
    html = client.get(example.get_absolute_url()).content.decode()
    trace = pb.figure(html, f"evidence-{finding.pk}-data")["data"][0]
    assert trace["type"] == "heatmap"
    assert trace["text"] == [["X", "CNS"], ["CNS", "X"]]
    assert trace["z"] == [[None, 0], [0, None]]


def test_it_offers_sweep_and_tune_forms(client, example):
    sweep = pb.form_html(client, example, "sweep")
    assert f'action="/deployments/{example.pk}/sweep/"' in sweep
    # the quick preset first; the full one a click away
    assert 'name="levels" value="8,16,32,64,128"' in sweep
    assert ">quick (≈ 1 min on the stand-in)</button>" in sweep
    assert 'data-levels="32,64,128,256,512,1024"' in sweep and ">full</button>" in sweep
    html = client.get(example.get_absolute_url()).content.decode()
    assert f'action="/deployments/{example.pk}/tune/"' in html
    assert "none — the engine runs its default config" in html


def test_the_sweep_form_estimates_from_the_newest_measured_tpot(client, example):
    pb.run(
        example,
        "measured",
        levels=[
            {"concurrency": c, "output_throughput": 1.0, "median_tpot_ms": tpot}
            for c, tpot in ((8, 10.0), (64, 20.0))
        ],
    )
    html = pb.form_html(client, example, "sweep")
    line = html.split('id="sweep-estimate"')[1].split("</p>")[0]
    # 8..128 at most 64 at once, 128 prompts + 8 warm-up of 128 tokens, at 10..20 ms a token
    assert "Estimated duration: ≈ 1 min" in line
    assert "(from the TPOT of measured, at most 64 requests at once)" in line


def test_the_page_and_the_estimate_endpoint_skip_a_newer_file_of_another_model(client, example):
    # the sweep form and the estimate's module both leave an imported file of another model out
    measured = [
        {"concurrency": c, "output_throughput": 1.0, "median_tpot_ms": 10.0} for c in (8, 64)
    ]
    pb.run(example, "measured", levels=measured)
    other = [{"concurrency": 8, "output_throughput": 1.0, "median_tpot_ms": 500.0}]
    pb.run(example, "qwen file", levels=other, snapshot={"file": {"other_model": "Qwen/Qwen3"}})
    html = pb.form_html(client, example, "sweep")
    line = html.split('id="sweep-estimate"')[1].split("</p>")[0]
    assert "(from the TPOT of measured, " in line
    pace, _ = estimate.deployment_pace(example)
    assert pace.basis == "the TPOT of measured"


def test_a_tune_running_since_before_the_five_newest_is_still_running_now(client):
    # the recent tunes and the running ones come from one query
    pb.sign_in(client)
    deployment = pb.deployment()
    shape = {"E": 256, "N": 256, "hidden_size": 6144, "topk": 8}
    old = TuningRun.objects.create(deployment=deployment, status="running", **shape)
    for _ in range(6):
        TuningRun.objects.create(deployment=deployment, status="succeeded", **shape)
    html = client.get(deployment.get_absolute_url()).content.decode()
    running = html.split("Running now")[1].split("</section>")[0]
    assert f"/tunes/{old.uuid}/" in running
    recent = html.split("Recent tunes:")[1].split("</p>")[0]
    assert recent.count("/tunes/") == 5 and f"/tunes/{old.uuid}/" not in recent


def test_without_a_measured_run_the_sweep_form_says_why_there_is_no_estimate(client):
    pb.sign_in(client)
    deployment = pb.deployment()
    html = pb.form_html(client, deployment, "sweep")
    assert "No estimated duration: no sweep of this deployment measured its TPOT yet." in html


def test_a_host_without_a_worker_is_said_before_a_tune(client, example):
    html = client.get(example.get_absolute_url()).content.decode()
    sentence = html.split('id="tune-preflight">')[1].split("</p>")[0]
    assert sentence.startswith("No worker of host rtx-pro-6000-x8 has been seen")
    assert '<button type="submit" disabled title="No worker of host' in html


def test_it_links_the_kernel_configs_on_record_for_its_shape(client, example):
    config = KernelConfig(
        device_name="NVIDIA RTX PRO 6000 Blackwell", E=256, N=256, entries={"1": KERNEL_ENTRY}
    ).save_new_version()
    html = client.get(example.get_absolute_url()).content.decode()
    assert f'href="/kernels/{config.pk}/">bf16 v1</a>' in html


def test_it_lists_runs_with_compare_checkboxes(client, example):
    run = example.runs.get()
    html = client.get(example.get_absolute_url()).content.decode()
    assert f'name="run" value="{run.uuid}"' in html
    assert 'action="/compare/"' in html


def test_runs_without_concurrency_levels_draw_no_empty_chart(client, example):
    from moeops.runs.models import SweepRun

    kimi = SweepRun.objects.get(label__startswith="After MoE").deployment
    html = client.get(kimi.get_absolute_url()).content.decode()
    assert 'id="throughput-figure"' not in html
    assert "No run has levels by concurrency" in html
    peaks = pb.figure(html, "peaks-chart-data")["data"][0]
    assert peaks["y"] == [800.0, 5800.0]
    assert peaks["text"] == ["800", "5,800"]


@pytest.fixture
def measured(client):
    pb.sign_in(client)
    deployment = pb.deployment(engine="vllm", engine_version="0.32.0")
    snapshot = pb.measured(deployment, engine=pb.vllm_identity(4), kernel_config="tuned")
    older = pb.run(deployment, label="cap 2", snapshot=pb.measured(deployment))
    run = pb.run(deployment, label="cap 4", snapshot=snapshot)
    older.created = run.created - dt.timedelta(hours=1)
    older.save(update_fields=["created"])
    return run


def test_it_says_which_fields_were_edited_since_the_newest_measured_run(client, measured):
    deployment = measured.deployment
    deployment.endpoint_url = "http://127.0.0.1:30001"
    deployment.max_running_requests = 64
    deployment.save()
    # a newer run that predates snapshots (imported without one) records nothing to compare
    pb.run(deployment, label="no snapshot")
    html = client.get(deployment.get_absolute_url()).content.decode()
    notice = html.split('id="edited-since"')[1].split("</p>")[0]
    assert f'href="/runs/{measured.uuid}/">‘cap 4’</a>' in notice
    assert (
        "max_running_requests unset → 64, "
        "endpoint_url http://127.0.0.1:30000 → http://127.0.0.1:30001." in notice
    )


def test_an_unchanged_deployment_has_no_edit_notice(client, measured):
    html = client.get(measured.deployment.get_absolute_url()).content.decode()
    assert "Edited since run" not in html


def test_the_edit_notice_costs_no_extra_query(client, measured, django_assert_max_num_queries):
    deployment = measured.deployment
    deployment.engine_version = "0.33.0"
    deployment.save()
    for i in range(10):
        pb.run(deployment, label=f"more {i}", snapshot=measured.snapshot)
    # 14, 2 for the sweep form's estimate (the newest measured run's levels), 1 for its
    # workload choices, 3 for the capacity searches (their history, and the profiles and
    # workloads the capacity form offers), 1 for its watches and 1 for the alert channels the
    # watch form offers
    with django_assert_max_num_queries(22):
        html = client.get(deployment.get_absolute_url()).content.decode()
    assert "engine_version 0.32.0 → 0.33.0" in html
