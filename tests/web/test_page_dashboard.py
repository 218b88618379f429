import io
import re

import pytest
from django.core.management import call_command

from moeops.insights.models import Finding
from moeops.kernels.models import TuningRun
from tests import page_base as pb

pytestmark = pytest.mark.django_db


def test_it_requires_login(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_it_shows_each_deployments_latest_peak_and_open_findings(client):
    pb.sign_in(client)
    deployment = pb.deployment()
    pb.run(deployment, "old", levels=[{"concurrency": 64, "output_throughput": 5000.0}])
    latest = pb.run(
        deployment,
        "new",
        levels=[
            {"concurrency": 64, "output_throughput": 900.0},
            {"concurrency": 128, "output_throughput": 1234.0},
        ],
    )
    Finding.objects.create(deployment=deployment, kind="plateau", title="Flat from 64")
    Finding.objects.create(
        deployment=deployment, kind="plateau", title="Gone", key="b", state="dismissed"
    )
    html = client.get("/").content.decode()
    assert "1,234" in html  # the newest run's peak, not the best ever (5,000)
    assert "5,000" not in html.split("Recent runs")[0]
    assert f'href="/runs/{latest.uuid}/">new</a>' in html
    assert "Flat from 64" in html and "Gone" not in html
    assert f'href="/deployments/{deployment.pk}/#findings">1</a>' in html


@pytest.mark.parametrize("many", [3, 85])
def test_the_open_findings_are_counted_however_many_there_are(client, many):
    # the dashboard reads the 80 most important open findings: fewer, it counts those; more,
    # it counts them all in a query of their own
    pb.sign_in(client)
    busy = pb.deployment()
    calm = pb.deployment("calm", model_row=busy.model, host_row=pb.host("calm-host"))
    for i in range(many):
        Finding.objects.create(deployment=busy, kind="plateau", key=f"k{i}", title=f"F{i}")
    Finding.objects.create(deployment=calm, kind="plateau", title="Calm")
    Finding.objects.create(deployment=calm, kind="plateau", key="x", title="X", state="dismissed")
    html = client.get("/").content.decode()
    assert f'href="/deployments/{busy.pk}/#findings">{many}</a>' in html
    assert f'href="/deployments/{calm.pk}/#findings">1</a>' in html


def _running_sweep(client, label, *, level_index, levels_total, done):
    """A member signed in and a running sweep of a deployment, `done` of its level's 8 requests
    sent: (the deployment, the sweep)."""
    pb.sign_in(client)
    deployment = pb.deployment()
    progress = {
        "level_index": level_index,
        "levels_total": levels_total,
        "requests_done": done,
        "requests_total": 8,
    }
    return deployment, pb.run(deployment, label, status="running", progress=progress)


def test_running_sweeps_and_tunes_show_their_progress(client):
    deployment, live = _running_sweep(client, "live", level_index=2, levels_total=4, done=0)
    TuningRun.objects.create(
        deployment=deployment, E=256, N=256, hidden_size=6144, topk=8, status="queued"
    )
    html = client.get("/").content.decode()
    assert "Running now" in html
    assert f'data-progress-url="/runs/{live.uuid}/status.json"' in html
    assert "level 3 of 4" in html
    assert "/tunes/" in html and "queued, waiting for the host" in html


def test_the_write_up_reads_at_a_glance(client):
    pb.sign_in(client)
    # as make run loads it: the write-up's runs analyzed
    call_command("load_example_data", stdout=io.StringIO())
    html = client.get("/").content.decode()
    assert "GLM-5-NVFP4 on 8× RTX PRO 6000" in html
    assert ">912<" in html  # peak of the write-up's sweep
    assert ">5,800<" in html  # Kimi K2 after tuning, its latest run
    assert "SGLang 0.5.23 runs no all-reduce + RMSNorm fusion on compute capability 12.0" in html


def test_stand_in_runs_are_badged_in_the_recent_runs_and_the_latest_peak(client):
    pb.sign_in(client)
    deployment = pb.deployment()
    pb.run(
        deployment,
        "small sweep from the UI",
        levels=[{"concurrency": 64, "output_throughput": 2606.0}],
        snapshot={"engine": {"engine": "standin"}},
    )
    html = client.get("/").content.decode()
    deployments, recent = html.split("Recent runs")
    assert '2,606 <span class="badge standin"' in deployments
    row = recent.split(">small sweep from the UI</a>")[1].split("</td>")[0]
    assert '<span class="badge standin">stand-in</span>' in row


def test_open_findings_lead_with_severity_and_are_said_once(client):
    pb.sign_in(client)
    deployment = pb.deployment()
    pb.no_gpu_evidence_in_runs(deployment)
    Finding.objects.create(
        deployment=deployment, kind="plateau", key="t", severity="warning", title="Flat from 64"
    )
    Finding.objects.create(
        deployment=deployment,
        kind="plateau",
        key="c",
        severity="warning",
        title="Flat, charted",
        evidence={"chart": {"type": "line", "x": [1], "series": []}},
    )
    Finding.objects.create(
        deployment=deployment, kind="failed_requests", severity="critical", title="All failed"
    )
    panel = (
        client.get("/").content.decode().split("<h2>Open findings</h2>")[1].split("</section>")[0]
    )
    titles = re.findall(r'#finding-\d+">([^<]+)</a>', panel)
    assert titles == ["All failed", "Flat, charted", "Flat from 64", "No GPU evidence for this run"]


def test_healthy_needs_a_check(client):
    pb.sign_in(client)
    pb.deployment(status="healthy")
    html = client.get("/").content.decode()
    assert '<span class="status status-unknown">not checked yet</span>' in html
    assert "status-healthy" not in html


def test_a_detail_no_check_stands_behind_is_not_shown_beside_not_checked_yet(client):
    from moeops.fleet.services import health_check_record

    pb.sign_in(client)
    deployment = pb.deployment(status="healthy", status_detail="Server running, model loaded")

    assert "Server running" not in client.get("/").content.decode()
    assert "Server running" not in client.get(deployment.get_absolute_url()).content.decode()
    health_check_record(
        deployment=deployment, status="degraded", trigger="manual", detail="GPU 3 is slow"
    )
    assert "GPU 3 is slow" in client.get("/").content.decode()


def test_a_fleet_of_deployments_costs_no_extra_queries(client, django_assert_max_num_queries):
    pb.sign_in(client)
    spec, h200 = pb.model(), pb.host()
    for i in range(8):
        deployment = pb.deployment(f"d{i}", model_row=spec, host_row=h200)
        for status in ("running", "succeeded"):
            pb.run(deployment, status, status=status, levels=[{"concurrency": 8}])
        Finding.objects.create(deployment=deployment, kind="plateau", title=f"Flat {i}")
    # one query for each part, whatever the number of deployments: session, user, deployments,
    # runs, their capacity searches, tunes, findings, the watches that regressed and their runs
    with django_assert_max_num_queries(9):
        html = client.get("/").content.decode()
    assert "Flat 7" in html and ">d7</a>" in html


def test_a_sweep_running_since_before_the_eight_newest_runs_is_still_running_now(client):
    # the recent runs and the running ones come from one query: the old running sweep must
    # not fall off with the list's limit, nor a finished run slip into "Running now"
    deployment, old = _running_sweep(client, "long one", level_index=0, levels_total=2, done=1)
    for n in range(9):
        pb.run(deployment, f"newer {n}")
    html = client.get("/").content.decode()
    running, recent = html.split("Running now")[1].split("Recent runs")
    assert f'data-progress-url="/runs/{old.uuid}/status.json"' in running
    assert "newer 8" not in running
    assert "newer 8" in recent and "newer 1" in recent
    assert "newer 0" not in recent and "long one" not in recent
