import datetime as dt

import pytest

from moeops.examples import load_example_data
from moeops.insights.models import Finding
from moeops.kernels.models import KernelConfig
from tests import page_base as pb

pytestmark = pytest.mark.django_db

ENTRY = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 3,
}


@pytest.fixture
def example(client):
    pb.sign_in(client)
    return load_example_data()


def test_it_shows_model_shape_host_engine_and_health(client, example):
    html = client.get(example.get_absolute_url()).content.decode()
    assert "E=256, N=256" in html  # GLM-5 per rank at TP8
    assert "GlmMoeDsaForCausalLM" in html
    assert "8 × NVIDIA RTX PRO 6000 Blackwell (SM120)" in html
    assert "Container (lxc)" in html
    assert "<dt>max_running_requests</dt><dd><code>64</code></dd>" in html
    assert "GPUs at 0% utilization" in html


def test_runs_over_time_chart_has_one_point_per_run(client, example):
    html = client.get(example.get_absolute_url()).content.decode()
    fig = pb.figure(html, "peaks-chart-data")
    assert fig["data"][0]["y"] == [912.0]


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
    html = client.get(example.get_absolute_url()).content.decode()
    assert f'action="/deployments/{example.pk}/sweep/"' in html
    assert 'name="levels" value="32,64,128,256,512,1024"' in html
    assert f'action="/deployments/{example.pk}/tune/"' in html
    assert "none — the engine runs its default config" in html


def test_it_links_the_kernel_configs_on_record_for_its_shape(client, example):
    config = KernelConfig(
        device_name="NVIDIA RTX PRO 6000 Blackwell", E=256, N=256, entries={"1": ENTRY}
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
    assert sorted(peaks["y"]) == [800.0, 5800.0]
    assert peaks["mode"] == "lines+markers+text"


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
    with django_assert_max_num_queries(14):
        html = client.get(deployment.get_absolute_url()).content.decode()
    assert "engine_version 0.32.0 → 0.33.0" in html
