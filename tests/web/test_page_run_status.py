import datetime as dt
import time

import pytest
from django.utils import timezone

from moeops.front.progress import sweep_progress
from moeops.runs import measurements
from moeops.runs import services as run_services
from moeops.runs.models import SweepRun
from tests import page_base as pb

pytestmark = pytest.mark.django_db
# a sweep's progress, as the worker pushes it, half-way through its second level of four
HALFWAY_THROUGH_THE_SECOND_LEVEL = {
    "level_index": 1,
    "levels_total": 4,
    "requests_done": 50,
    "requests_total": 100,
    "concurrency": 64,
}


@pytest.fixture
def live(client):
    pb.sign_in(client)
    return pb.run(
        pb.deployment(),
        label="live",
        status="running",
        parameters={"levels": [32, 64, 128, 256]},
        started_at=timezone.now() - dt.timedelta(seconds=60),
    )


def test_progress_counts_finished_levels_and_requests_of_the_current_one(live):
    live.progress = {**HALFWAY_THROUGH_THE_SECOND_LEVEL, "started_at": 1000.0}
    p = sweep_progress(live, now=1060.0)
    assert p["level"] == 2 and p["levels_total"] == 4
    assert p["fraction"] == pytest.approx(1.5 / 4)
    assert p["elapsed_s"] == 60.0
    # 60 s bought 37.5 %: the other 62.5 % take 100 s more at that pace
    assert p["eta_s"] == pytest.approx(100.0)
    assert p["text"] == "level 2 of 4 (concurrency 64), 50 of 100 requests"


def test_progress_counts_the_rounds_of_the_level_running(live):
    live.progress = {**HALFWAY_THROUGH_THE_SECOND_LEVEL, "round": 2, "rounds": 4}
    p = sweep_progress(live, now=1060.0)
    # one level done, and of the second 1.5 rounds of 4
    assert p["fraction"] == pytest.approx((1 + 1.5 / 4) / 4)
    assert p["text"] == "level 2 of 4 (concurrency 64), round 2 of 4, 50 of 100 requests"


def test_progress_says_a_round_past_the_runs_rounds_is_one_more_for_a_straddling_level(live):
    live.progress = {
        "level_index": 2,
        "round": 4,
        "rounds": 4,
        "more_rounds": True,
        "concurrency": 8,
        "capacity": {"mode": "concurrency", "unit": "concurrent", "bracket": [4, None]},
    }
    p = sweep_progress(live, now=1060.0)
    assert "(concurrency 8), round 4, more as its interval straddles a limit" in p["text"]


def test_progress_before_the_worker_reports(live):
    live.status, live.started_at, live.progress = "queued", None, {}
    p = sweep_progress(live, now=0)
    assert p["fraction"] == 0.0
    assert p["levels_total"] == 4  # from the parameters the sweep was started with
    assert p["eta_s"] is None and p["elapsed_s"] is None
    assert p["text"].startswith("queued")


def test_progress_of_a_finished_run_is_whole_and_has_no_eta(live):
    live.status = "succeeded"
    live.finished_at = live.started_at + dt.timedelta(seconds=90)
    live.progress = {"level_index": 3, "levels_total": 4, "requests_done": 10}
    p = sweep_progress(live, now=10**10)
    assert p["fraction"] == 1.0
    assert p["eta_s"] is None
    assert p["elapsed_s"] == pytest.approx(90.0)


def test_progress_ignores_junk_from_a_worker(live):
    live.progress = {"level_index": "two", "levels_total": None, "requests_done": True}
    p = sweep_progress(live, now=0)
    assert p["level"] is None
    assert p["fraction"] is None


def test_status_endpoint_reports_progress_and_figures(client, live):
    SweepRun.objects.filter(pk=live.pk).update(
        progress={"level_index": 0, "levels_total": 4, "requests_done": 25, "requests_total": 100}
    )
    live.levels.create(key="c=32,r=inf", concurrency=32, output_throughput=300.0)
    response = client.get(f"/runs/{live.uuid}/status.json?figures=1")
    assert response.status_code == 200
    state = response.json()
    assert state["status"] == "running" and state["finished"] is False
    assert state["progress"]["fraction"] == pytest.approx(0.0625)
    assert state["levels"] == 1
    output = state["figures"]["throughput"]["data"][0]
    assert output["x"] == [32] and output["y"] == [300.0]
    assert set(state["figures"]) == {
        "throughput",
        "ttft",
        "tpot",
        "itl",
        "gpu-util",
        "gpu-power",
        "gpu-memory",
        "gpu-clock",
        "engine",
        "kv-cache",
        "engine-counters",
    }
    assert "figures" not in client.get(f"/runs/{live.uuid}/status.json").json()


def test_the_status_sends_the_level_table_of_the_levels_it_charts(
    client, live, django_assert_max_num_queries
):
    url = f"/runs/{live.uuid}/status.json?figures=1"
    assert "No levels finished yet" in client.get(url).json()["levels_html"]
    for concurrency, tok_s in ((32, 300.0), (64, 512.0)):
        live.levels.create(
            key=f"c={concurrency},r=inf", concurrency=concurrency, output_throughput=tok_s
        )
    with django_assert_max_num_queries(11):
        state = client.get(url).json()
    table = state["levels_html"]
    assert "No levels finished yet" not in table
    assert table.count("<tr") == 3 and ">300<" in table and ">512<" in table
    assert state["figures"]["throughput"]["data"][0]["x"] == [32, 64]
    # the page renders the same table
    page = client.get(f"/runs/{live.uuid}/").content.decode()
    assert table.strip() in page


def test_the_run_page_of_a_running_sweep_polls_its_status(client, live):
    html = client.get(f"/runs/{live.uuid}/").content.decode()
    assert f'data-progress-url="/runs/{live.uuid}/status.json"' in html
    assert 'data-status="running"' in html
    assert "front/progress.js" in html
    assert "Cancel run" in html


def test_cancel_asks_a_running_sweep_to_stop(client, live):
    # its worker beats (a run silent for 10 s has lost its worker, and is cancelled at once)
    SweepRun.objects.filter(pk=live.pk).update(progress={"heartbeat": time.time()})
    response = client.post(f"/runs/{live.uuid}/cancel/")
    assert response.status_code == 302
    live.refresh_from_db()
    assert live.cancel_requested and live.status == "running"
    assert client.get(f"/runs/{live.uuid}/status.json").json()["cancel_requested"] is True


def test_cancel_of_a_queued_sweep_ends_it(client, live):
    SweepRun.objects.filter(pk=live.pk).update(status="queued")
    client.post(f"/runs/{live.uuid}/cancel/")
    live.refresh_from_db()
    assert live.status == "cancelled"


def test_cancel_of_a_finished_sweep_changes_nothing(client, live):
    SweepRun.objects.filter(pk=live.pk).update(status="succeeded")
    response = client.post(f"/runs/{live.uuid}/cancel/", follow=True)
    live.refresh_from_db()
    assert live.status == "succeeded" and not live.cancel_requested
    assert "Nothing to cancel" in response.content.decode()


def test_cancel_needs_post(client, live):
    assert client.get(f"/runs/{live.uuid}/cancel/").status_code == 405


def _gpu_samples(t0, seconds):
    """Samples as the worker posts them: every TelemetrySample field but the owner."""
    empty = dict.fromkeys(
        ("level_concurrency", "mem_util", "mem_used_mib", "mem_total_mib", "sm_clock_mhz")
    )
    return [
        {
            **empty,
            "gpu_index": 0,
            "ts": t0 + s,
            "gpu_util": 50.0,
            "power_w": 300.0,
            "power_limit_w": 700.0,
            "temperature_c": 60.0,
            "attempt": 1,
        }
        for s in range(seconds)
    ]


def test_the_poll_leaves_out_charts_and_table_until_something_new_is_stored(client, live):
    url = f"/runs/{live.uuid}/status.json?figures=1"
    key = client.get(url).json()["figures_key"]
    # the page hands the poll the key of what it drew
    assert f'data-figures-key="{key}"' in client.get(f"/runs/{live.uuid}/").content.decode()
    unchanged = client.get(f"{url}&since={key}").json()
    assert unchanged["figures_key"] == key and unchanged["status"] == "running"
    assert "figures" not in unchanged and "levels_html" not in unchanged

    measurements.telemetry_record(
        run=live, batch_id="b1", samples=_gpu_samples(time.time() - 30, 30)
    )
    sampled = client.get(f"{url}&since={key}").json()
    assert sampled["figures_key"] != key
    assert [t["name"] for t in sampled["figures"]["gpu-util"]["data"]] == ["GPU0"]

    key = sampled["figures_key"]
    live.levels.create(key="c=32,r=inf", concurrency=32, output_throughput=300.0)
    leveled = client.get(f"{url}&since={key}").json()
    assert leveled["figures"]["throughput"]["data"][0]["x"] == [32]
    assert ">300<" in leveled["levels_html"]


def test_a_sweep_in_flight_is_not_badged_measured_before_its_engine_is_read(client):
    pb.sign_in(client)
    deployment = pb.deployment()
    run = SweepRun.objects.create(
        deployment=deployment, label="standin-sweep", status="running", source="worker"
    )

    heading = _heading(client, run)
    assert "badge origin" not in heading and "measured" not in heading

    run_services.run_record_observed(run=run, observed={"engine": {"engine": "standin"}})
    heading = _heading(client, run)
    assert '<span class="badge standin">stand-in</span>' in heading
    assert "measured" not in heading

    done = SweepRun.objects.create(
        deployment=deployment, label="real-sweep", status="succeeded", source="worker"
    )
    assert '<span class="badge origin" title="swept by a moeops worker">measured</span>' in (
        _heading(client, done)
    )


def _heading(client, run):
    html = client.get(f"/runs/{run.uuid}/").content.decode()
    return html.split("<h1>")[1].split("</h1>")[0]
