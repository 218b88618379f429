"""What the heavy pages cost in queries, pinned: a page makes as many for a deployment with few
runs, tunes, findings, plan items, watches and checks as for one with many, so a query per row
fails here (bench/ui_pages.py times them)."""

import datetime as dt

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from moeops.engines.models import EngineAction, LaunchRecipe
from moeops.fleet import services as fleet_services
from moeops.fleet.models import SLOProfile
from moeops.insights.models import Finding, PlanItem
from moeops.kernels.models import TuningRun, TuningTiming
from moeops.runs.models import Workload
from moeops.watches import services as watch_services
from moeops.watches.models import AlertChannel, WatchRun
from tests import page_base as pb

pytestmark = pytest.mark.django_db

LEVELS = (8, 16, 32, 64, 128, 256)
# session, user, deployment, runs, their levels, GPUs, tunes (recent and running), topology,
# health checks, plan items, their engine actions and tunes, findings, watches, their runs,
# those runs' alerts and bisections, kernel configs; the sweep, capacity and watch forms, with
# their workloads, SLO profiles and alert channels, are asked for when opened (FORMS)
DEPLOYMENT_PAGE = 18
# session, user, deployment, then: the newest run that timed its tokens (none here: its levels
# are not read), a health check (the estimate's pace and cap) and the workloads; the SLO
# profiles and workloads; the alert channels
FORMS = {"sweep": 6, "capacity": 5, "watches": 4}
# session, user, deployments, runs (recent, running and each deployment's latest), capacity
# searches, running tunes, findings, watches that regressed
DASHBOARD = 8
# session, user, the runs, their levels, their peak levels' rounds, the filter form's five
# choice lists, the kernel configs in effect
COMPARE = 12


def _grow(deployment, n, start):
    """n more of everything the deployment page and the dashboard list, numbered from start."""
    now = timezone.now()
    for i in range(start, start + n):
        levels = [{"concurrency": c, "output_throughput": 10.0 * c + i} for c in LEVELS]
        sweep = pb.run(deployment, f"sweep {i}", levels=levels)
        pb.run(
            deployment,
            f"capacity {i}",
            parameters={"kind": "capacity"},
            capacity={"mode": "concurrency", "load": 8, "bracket": [8, 16]},
            levels=levels[:2],
        )
        running = pb.run(deployment, f"running {i}", status="running", levels=levels[:1])
        tune = TuningRun.objects.create(
            deployment=deployment, E=256, N=256, hidden_size=6144, topk=8, status="running"
        )
        TuningTiming.objects.create(run=tune, batch_size=1 + i, tuned_us=10.0)
        finding = Finding.objects.create(
            deployment=deployment, run=sweep, kind="plateau", key=f"k{i}", title=f"Flat {i}"
        )
        item = PlanItem.objects.create(deployment=deployment, finding=finding, title=f"do {i}")
        # an item done by another's restart, measured before and after
        recipe = LaunchRecipe.objects.create(deployment=deployment, version=100 + i, argv=["x"])
        action = EngineAction.objects.create(
            deployment=deployment,
            kind="restart_with_args",
            recipe=recipe,
            plan_item=item,
            before_run=running,
            after_run=sweep,
        )
        PlanItem.objects.create(deployment=deployment, title=f"done {i}", done_by=action)
        watch = watch_services.watch_create(
            deployment=deployment,
            name=f"nightly {i}",
            parameters={"levels": [8], "input_len": 16, "output_len": 32},
            every_hours=6,
        )
        WatchRun.objects.create(
            watch=watch, run=sweep, compared_with=running, status="finished", verdict="regressed"
        )
        fleet_services.health_check_record(
            deployment=deployment,
            status="healthy",
            trigger="periodic",
            checked_at=(now - dt.timedelta(minutes=100 - i)).timestamp(),
            max_running_requests=64,
        )
        name = f"{deployment.name} {i}"
        Workload.objects.create(name=name, kind="random", spec={"input_len": 16})
        SLOProfile.objects.create(name=name, ttft_percentile="p99", ttft_ms=500)
        AlertChannel.objects.create(name=name, kind="email", recipients=["a@b.example"])


def _queries(client, url):
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured)


@pytest.fixture
def fleet(client):
    pb.sign_in(client)
    spec, host = pb.model(), pb.host()
    pb.snapshot(host)
    deployments = [pb.deployment(f"d{i}", model_row=spec, host_row=host) for i in range(2)]
    for deployment in deployments:
        _grow(deployment, 1, 0)
    return deployments


def test_the_deployment_page_makes_the_same_queries_for_few_rows_as_for_many(client, fleet):
    url = fleet[0].get_absolute_url()
    few = _queries(client, url)
    _grow(fleet[0], 6, 1)
    assert (few, _queries(client, url)) == (DEPLOYMENT_PAGE, DEPLOYMENT_PAGE)


@pytest.mark.parametrize("form", FORMS)
def test_the_deployment_pages_forms_make_the_same_queries_for_few_rows_as_for_many(
    client, fleet, form
):
    url = f"/deployments/{fleet[0].pk}/{form}/form/"
    few = _queries(client, url)
    _grow(fleet[0], 6, 1)
    assert (few, _queries(client, url)) == (FORMS[form], FORMS[form])


def test_the_dashboard_makes_the_same_queries_for_few_rows_as_for_many(client, fleet):
    few = _queries(client, "/")
    for deployment in fleet:
        _grow(deployment, 6, 1)
    fleet.append(pb.deployment("d2", model_row=fleet[0].model, host_row=fleet[0].host))
    _grow(fleet[-1], 3, 0)
    assert (few, _queries(client, "/")) == (DASHBOARD, DASHBOARD)


def test_compare_makes_the_same_queries_for_two_runs_as_for_twenty(client, fleet):
    _grow(fleet[0], 9, 1)
    runs = list(fleet[0].runs.filter(label__startswith="sweep").order_by("created"))
    assert len(runs) == 10
    runs += list(fleet[1].runs.all()[:10])

    def url(chosen):
        return "/compare/?" + "&".join(f"run={run.uuid}" for run in chosen)

    assert (_queries(client, url(runs[:2])), _queries(client, url(runs))) == (COMPARE, COMPARE)


def test_the_sweep_form_reads_the_cap_of_a_check_older_than_those_the_page_lists(client):
    # the newest check that reported a cap may be older than the ten the page lists
    pb.sign_in(client)
    deployment = pb.deployment()
    levels = [{"concurrency": c, "median_tpot_ms": 20.0 + c / 10} for c in (8, 16, 32)]
    pb.run(deployment, "timed", levels=levels)
    now = timezone.now()
    for minutes, cap in [(60, 48)] + [(30 - i, None) for i in range(12)]:
        fleet_services.health_check_record(
            deployment=deployment,
            status="healthy",
            trigger="periodic",
            checked_at=(now - dt.timedelta(minutes=minutes)).timestamp(),
            max_running_requests=cap,
        )
    form = pb.form_html(client, deployment, "sweep")
    assert "at most 48 requests at once)." in form.split('id="sweep-estimate"')[1]
    html = client.get(deployment.get_absolute_url()).content.decode()
    listed = html.split('id="health-checks"')[1].split("</table>")[0]
    assert listed.count("<tr") == 1 + 10
