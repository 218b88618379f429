import datetime as dt

import pytest
from django.utils import timezone

from moeops.kernels.models import KernelConfig
from moeops.runs.models import SweepRun
from tests import page_base as pb
from tests.fakes import KERNEL_ENTRY

pytestmark = pytest.mark.django_db


@pytest.fixture
def runs(client):
    pb.sign_in(client)
    h200 = pb.host("h200", gpus=8)
    rtx = pb.host("rtx", gpus=8, gpu_name="NVIDIA RTX PRO 6000 Blackwell")
    glm = pb.deployment("glm", pb.model("GLM-5"), h200, engine="sglang")
    kimi = pb.deployment("kimi", pb.model("Kimi K2", pb.KIMI_CONFIG), rtx, engine="vllm")
    vm, lxc = pb.snapshot(rtx, "vm", "kvm"), pb.snapshot(h200, "container", "lxc")
    config = KernelConfig(device_name="NVIDIA H200", E=256, N=256, entries={"1": KERNEL_ENTRY})
    config.save_new_version()
    rows = {
        "glm default": pb.run(glm, "glm default", topology_snapshot=lxc),
        "glm tuned": pb.run(glm, "glm tuned", topology_snapshot=lxc, kernel_config=config),
        "kimi vm": pb.run(kimi, "kimi vm", topology_snapshot=vm, status="failed"),
        "kimi imported": pb.run(kimi, "kimi imported", parameters={"moe_kernel": "tuned"}),
    }
    old = timezone.now() - dt.timedelta(days=30)
    SweepRun.objects.filter(pk=rows["kimi vm"].pk).update(created=old)
    return rows, config


def _listed(client, query=""):
    html = client.get(f"/runs/?{query}").content.decode()
    return {
        label
        for label in ("glm default", "glm tuned", "kimi vm", "kimi imported")
        if f">{label}</a>" in html
    }


def test_it_lists_every_run_newest_first(client, runs):
    html = client.get("/runs/").content.decode()
    assert html.index("kimi imported") < html.index("kimi vm")
    assert _listed(client) == {"glm default", "glm tuned", "kimi vm", "kimi imported"}


@pytest.mark.parametrize(
    "query, expected",
    [
        ("engine=vllm", {"kimi vm", "kimi imported"}),
        ("host=h200", {"glm default", "glm tuned"}),
        ("virtualization=vm", {"kimi vm"}),
        ("kernel=tuned", {"glm tuned", "kimi imported"}),
        ("kernel=default", {"glm default", "kimi vm"}),
        ("status=failed", {"kimi vm"}),
    ],
)
def test_it_filters(client, runs, query, expected):
    assert _listed(client, query) == expected


def test_it_filters_by_model_deployment_config_and_date(client, runs):
    rows, config = runs
    kimi = rows["kimi vm"].deployment
    assert _listed(client, f"model={kimi.model.pk}") == {"kimi vm", "kimi imported"}
    assert _listed(client, f"deployment={kimi.pk}") == {"kimi vm", "kimi imported"}
    assert _listed(client, f"kernel={config.pk}") == {"glm tuned"}
    week_ago = (timezone.now() - dt.timedelta(days=7)).date().isoformat()
    assert "kimi vm" not in _listed(client, f"since={week_ago}")
    assert _listed(client, f"until={week_ago}") == {"kimi vm"}


def test_selected_runs_go_to_compare(client, runs):
    html = client.get("/runs/").content.decode()
    assert 'action="/compare/"' in html
    assert f'name="run" value="{runs[0]["glm tuned"].uuid}"' in html


def test_a_page_of_runs_costs_no_extra_queries(client, runs, django_assert_max_num_queries):
    glm = runs[0]["glm default"].deployment
    for i in range(20):
        pb.run(glm, f"more {i}", levels=[{"concurrency": 8, "output_throughput": 10.0}])
    with django_assert_max_num_queries(8):
        html = client.get("/runs/").content.decode()
    assert ">more 19</a>" in html and ">kimi vm</a>" in html


def _measured_runs(deployment):
    """A run whose engine loaded a tuned file, one whose engine ran its default although a
    config is on record for it, and one whose kernel config the worker could not tell."""
    engine_default = {"state": "engine_default", "reason": "no such file where vllm looks"}
    unknown = {"state": "unknown", "reason": "vllm is not installed for this worker's Python"}
    config = KernelConfig.objects.get()
    return {
        "tuned file": pb.run(
            deployment,
            "tuned file",
            snapshot=pb.measured(deployment, engine=pb.vllm_identity(4), kernel_config="tuned"),
        ),
        "default in effect": pb.run(
            deployment,
            "default in effect",
            kernel_config=config,
            snapshot=pb.measured(deployment, kernel_config=engine_default),
        ),
        "unknown on record": pb.run(
            deployment,
            "unknown on record",
            kernel_config=config,
            snapshot=pb.measured(deployment, kernel_config=unknown),
        ),
    }


def test_the_engine_column_shows_what_the_engine_answered(client, runs):
    glm = runs[0]["glm default"].deployment
    _measured_runs(glm)
    html = client.get("/runs/").content.decode()
    row = html.split(">tuned file</a>")[1].split("</tr>")[0]
    assert "<td>vLLM 0.32.0</td>" in row
    # as recorded in the snapshot (SGLang, no version), and without one as the deployment says
    assert "<td>SGLang</td>" in html.split(">default in effect</a>")[1].split("</tr>")[0]
    assert "<td>vLLM</td>" in html.split(">kimi vm</a>")[1].split("</tr>")[0]


@pytest.mark.parametrize(
    "query, expected",
    [
        ("kernel=tuned", {"glm tuned", "kimi imported", "tuned file", "unknown on record"}),
        ("kernel=default", {"glm default", "kimi vm", "default in effect"}),
    ],
)
def test_the_kernel_filter_reads_the_config_in_effect_first(client, runs, query, expected):
    _measured_runs(runs[0]["glm default"].deployment)
    html = client.get(f"/runs/?{query}").content.decode()
    labels = set(runs[0]) | {"tuned file", "default in effect", "unknown on record"}
    assert {label for label in labels if f">{label}</a>" in html} == expected
    assert {r.kernel_config_state() for r in SweepRun.objects.all() if f">{r}</a>" in html} == {
        query.split("=")[1]
    }


def test_a_stand_in_run_is_badged_in_the_list(client):
    pb.sign_in(client)
    deployment = pb.deployment()
    standin = pb.run(deployment, "from the stand-in", snapshot={"engine": {"engine": "standin"}})
    pb.run(deployment, "real")
    html = client.get("/runs/").content.decode()
    row = html.split(f'href="/runs/{standin.uuid}/">from the stand-in</a>')[1].split("</td>")[0]
    assert '<span class="badge standin">stand-in</span>' in row
    real = html.split(">real</a>")[1].split("</td>")[0]
    assert "standin" not in real
