"""A capacity search on the pages: the run page's card, its charts with the limit and the bands,
the bracket as it narrows, the deployment page over time, the dashboard's column, compare side
by side, and the form that starts one."""

import pytest

from moeops.fleet.models import SLOProfile
from moeops.front.progress import sweep_progress
from moeops.runs import services
from moeops.runs.models import SweepRun
from moeops.runs.workloads import workload_store
from tests import page_base as pb

pytestmark = pytest.mark.django_db

QUEUE = "host.h200-x8"
LIMITS = {"limits": {"tpot": ["p99", 50.0]}, "max_failed_percent": 1.0, "profile": "chat"}


def _search(deployment, profile, tpots, label="capacity", created_offset=0):
    """A finished capacity search whose level at concurrency c had p99 TPOT rounds tpots[c]."""
    run = pb.run(
        deployment,
        label=label,
        status="running",
        parameters={
            "kind": "capacity",
            "slo_profile": str(profile.pk),
            "slo": {**LIMITS, "profile": profile.name},
            "mode": "concurrency",
            "start": 4,
            "rounds": 3,
        },
    )
    for i, (concurrency, rounds) in enumerate(tpots.items()):
        for number, tpot in enumerate(rounds, 1):
            pb.capacity_round(
                run,
                number,
                concurrency,
                tpot,
                1_800_000_000.0 + 100 * i + number,
                output_throughput=100.0 * concurrency,
            )
    services.run_update(run=run, status="succeeded")
    run.refresh_from_db()
    return run


TPOTS = {
    4: (20.0, 21.0, 22.0),
    8: (30.0, 31.0, 32.0),
    16: (70.0, 72.0, 74.0),
    12: (40.0, 41.0, 42.0),
    14: (60.0, 61.0, 62.0),
    # the median meets 50 ms, the worst round (the upper end of three rounds' interval) does not
    13: (44.0, 47.0, 51.0),
}


@pytest.fixture
def world(client):
    pb.sign_in(client)
    profile = SLOProfile.objects.create(name="chat", tpot_percentile="p99", tpot_ms=50.0)
    deployment = pb.deployment(max_running_requests=64, default_slo_profile=profile)
    deployment.host.price_per_gpu_hour = 2
    deployment.host.currency = "USD"
    deployment.host.save()
    return deployment, profile


def test_the_run_page_shows_the_answer_and_each_limit_against_load(client, world):
    deployment, profile = world
    run = _search(deployment, profile, TPOTS)
    assert run.capacity["load"] == 12
    html = client.get(f"/runs/{run.uuid}/").content.decode()
    assert "Capacity within chat" in html
    assert "<strong>12 concurrent</strong> meet the SLO" in html
    assert "on the medians alone, 13 concurrent" in html
    assert "TPOT p99 binds: " in html and " at 12 concurrent, limit 50 ms." in html
    # 1,200 tok/s on 8 GPUs: 150 per GPU; 8 GPUs × 2 USD an hour at 1,200 tok/s
    assert "<dt>tok/s per GPU</dt><dd>150</dd>" in html
    assert "<dt>Cost per 1M output tokens</dt><dd>3.70 USD</dd>" in html
    assert "<dt>Running-request cap in use</dt><dd>19% of 64</dd>" in html
    assert '<dt>GPU power</dt><dd><span class="muted">unknown' in html
    fig = pb.figure(html, "slo-tpot-data")
    [line, band] = fig["data"]
    assert line["x"] == [4, 8, 12, 13, 14, 16]
    assert band["name"] == "TPOT p99 95 % interval"
    assert fig["layout"]["shapes"][0]["y0"] == 50.0
    assert fig["layout"]["annotations"][0]["text"] == "limit 50 ms"


def test_the_bracket_narrows_in_the_progress_as_each_probe_lands(world):
    deployment, _ = world
    run = pb.run(deployment, status="running", parameters={"kind": "capacity", "start": 4})
    run.progress = {
        "level_index": 3,
        "concurrency": 24,
        "capacity": {
            "unit": "concurrent",
            "probes": [
                {"load": 4, "met": True},
                {"load": 8, "met": True},
                {"load": 16, "met": True},
                {"load": 32, "met": False},
            ],
            "bracket": [16, 32],
        },
    }
    progress = sweep_progress(run)
    assert progress["text"] == (
        "level 4 (concurrency 24), tried 4 ✓, 8 ✓, 16 ✓, 32 ✗; bracket 16–32 concurrent"
    )
    assert progress["fraction"] is None


def test_the_deployment_page_dashboard_and_compare_show_the_capacity(client, world):
    deployment, profile = world
    before = _search(deployment, profile, TPOTS, label="before")
    after = _search(
        deployment,
        profile,
        {
            4: (20.0, 20.0, 20.0),
            8: (20.0, 21.0, 22.0),
            16: (30.0, 31.0, 32.0),
            32: (90.0,) * 3,
            24: (40.0, 41.0, 42.0),
            28: (60.0, 62.0, 64.0),
            26: (47.0, 48.0, 48.5),
            27: (55.0, 56.0, 57.0),
        },
        label="after",
    )
    assert after.capacity["load"] == 26
    page = client.get(deployment.get_absolute_url()).content.decode()
    assert "Capacity at chat" in page
    assert "26 concurrent (26–27)" in page and "12 concurrent (12–13)" in page
    chart = pb.figure(page, "capacity-chart-data")
    assert chart["data"][0]["y"] == [12, 26]
    dashboard = client.get("/").content.decode()
    assert "26 concurrent (26–27)" in dashboard
    compare = client.get(f"/compare/?run={before.uuid}&run={after.uuid}").content.decode()
    assert "beyond the noise (capacity 26–27 against 12–14 concurrent" in compare


def _capacity_form(profile, **fields):
    """The capacity form as posted: a concurrency search from 2, three rounds a level."""
    return {
        "mode": "concurrency",
        "start": "2",
        "rounds": "3",
        "input_len": "64",
        "output_len": "64",
        "endpoint": "completions",
        "slo_profile": str(profile.pk),
        **fields,
    }


def test_the_form_starts_a_search_and_refuses_bad_input_naming_the_field(client, world, broker):
    deployment, profile = world
    url = f"/deployments/{deployment.pk}/capacity/"
    good = _capacity_form(profile)
    for change, words in (
        ({"rounds": "0"}, "rounds: Input should be greater than or equal to 1"),
        ({"start": "64", "end": "32"}, "end: The end (32) must not be below the start (64)."),
        ({"start": "2.5"}, "start: The start must be a whole number"),
    ):
        response = client.post(url, {**good, **change})
        assert response.status_code == 400
        assert words in response.content.decode()
    deployment.default_slo_profile = None
    deployment.save()
    response = client.post(url, {**good, "slo_profile": ""})
    assert response.status_code == 400
    assert "slo_profile: a capacity search needs an SLO profile" in response.content.decode()
    assert not SweepRun.objects.exists()
    response = client.post(url, good)
    assert response.status_code == 302
    run = SweepRun.objects.get()
    assert run.parameters["kind"] == "capacity" and run.parameters["start"] == 2
    assert run.parameters["slo"]["limits"] == {"tpot": ["p99", 50.0]}


def test_a_request_rate_search_from_the_form_keeps_its_arrivals(client, world, broker):
    deployment, profile = world
    url = f"/deployments/{deployment.pk}/capacity/"
    search = _capacity_form(
        profile, mode="request_rate", rounds="1", burstiness="0.5", ramp_up_s="3"
    )

    refused = client.post(url, {**search, "mode": "concurrency"})
    started = client.post(url, search)

    assert refused.status_code == 400
    assert "burstiness: shapes the arrivals of a request rate" in refused.content.decode()
    assert started.status_code == 302
    run = SweepRun.objects.get()
    assert (run.parameters["burstiness"], run.parameters["ramp_up_s"]) == (0.5, 3.0)


def test_a_search_from_the_form_sends_the_workload_it_names(client, world, broker):
    deployment, profile = world
    spec = {"kind": "shared_prefix", "groups": 2, "prefix_len": 64, "question_len": 8}
    workload, _ = workload_store(
        name="prefixes", spec={**spec, "output": {"distribution": "fixed", "value": 32}}
    )
    search = {
        "mode": "concurrency",
        "start": "2",
        "rounds": "1",
        "input_len": "64",
        "output_len": "64",
        "endpoint": "completions",
        "slo_profile": str(profile.pk),
        "workload": str(workload.pk),
    }

    response = client.post(f"/deployments/{deployment.pk}/capacity/", search)

    assert response.status_code == 302
    run = SweepRun.objects.get()
    assert run.parameters["kind"] == "capacity"
    assert run.parameters["workload"] == workload.run_parameter()
    assert run.snapshot["workload"]["kind"] == "shared_prefix"
