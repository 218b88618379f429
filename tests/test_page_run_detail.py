import csv
import io

import pytest

from moeops.front import series
from moeops.runs.models import EngineSample
from tests import page_base as pb

pytestmark = pytest.mark.django_db

LEVELS = [
    {
        "concurrency": 64,
        "output_throughput": 700.0,
        "total_token_throughput": 1400.0,
        "median_ttft_ms": 120.0,
        "p99_ttft_ms": 300.0,
        "median_tpot_ms": 40.0,
        "p99_tpot_ms": 55.0,
        "median_itl_ms": 38.0,
        "p99_itl_ms": 90.0,
        "completed": 256,
        "duration": 93.5,
    },
    {
        "concurrency": 128,
        "output_throughput": 806.0,
        "total_token_throughput": 1612.0,
        "median_ttft_ms": 400.0,
        "p99_ttft_ms": 900.0,
        "median_tpot_ms": 80.0,
        "p99_tpot_ms": 95.0,
        "median_itl_ms": 76.0,
        "p99_itl_ms": 150.0,
        "completed": 512,
        "duration": 162.0,
        "failed": 2,
        "errors": {"timeout": 2},
    },
]


@pytest.fixture
def sweep(client):
    pb.sign_in(client)
    return pb.run(pb.deployment(max_running_requests=64), label="before tuning", levels=LEVELS)


def test_it_requires_login(client, sweep):
    client.logout()
    assert client.get(f"/runs/{sweep.uuid}/").status_code == 302


def test_it_shows_every_recorded_metric_with_units(client, sweep):
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    assert 'output throughput<br><span class="unit">tok/s</span>' in html
    assert 'p99 TTFT<br><span class="unit">ms</span>' in html
    assert 'duration<br><span class="unit">s</span>' in html
    # per GPU: 806 tok/s over the deployment's 8 GPUs; per user: 1000 / 80 ms TPOT
    assert "100.8" not in html and ">101<" in html
    assert ">12.5<" in html
    assert "<code>timeout</code> × 2" in html
    # metrics without any value are named, not drawn as empty columns
    assert "No values recorded for:" in html and "p95 E2EL" in html


def test_throughput_and_latency_charts_follow_the_levels(client, sweep):
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    fig = pb.figure(html, "throughput-data")
    traces = {t["name"]: t for t in fig["data"]}
    assert traces["output"]["x"] == [64, 128]
    assert traces["output"]["y"] == [700.0, 806.0]
    assert traces["total"]["y"] == [1400.0, 1612.0]
    ttft = {t["name"]: t["y"] for t in pb.figure(html, "ttft-data")["data"]}
    assert ttft == {"p50": [120.0, 400.0], "p99": [300.0, 900.0]}
    tpot = {t["name"]: t["y"] for t in pb.figure(html, "tpot-data")["data"]}
    assert tpot == {"p50": [40.0, 80.0], "p99": [55.0, 95.0]}
    itl = {t["name"]: t["y"] for t in pb.figure(html, "itl-data")["data"]}
    assert itl == {"p50": [38.0, 76.0], "p99": [90.0, 150.0]}


def test_gpu_charts_are_bucketed_with_power_limit_and_level_bands(client, sweep):
    # 4 GPUs × 960 s; GPU g runs at 10·g % except a 1 s spike to 100 % at second 500
    t0 = pb.telemetry(
        sweep,
        gpus=4,
        seconds=960,
        t0=1_800_000_000.0,
        util=lambda g, s: 100.0 if s == 500 else 10.0 * g,
    )
    levels = list(sweep.levels.order_by("concurrency"))
    for level, (start, end) in zip(levels, [(0, 400), (400, 959)], strict=True):
        level.started_at, level.finished_at = t0 + start, t0 + end
        level.save()
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()

    util = pb.figure(html, "gpu-util-data")
    assert [t["name"] for t in util["data"]] == ["GPU0", "GPU1", "GPU2", "GPU3"]
    for g, trace in enumerate(util["data"]):
        assert len(trace["y"]) <= series.BUCKETS + 1
        assert trace["mode"] == "lines"  # too many points for a marker each
        assert min(trace["y"]) == pytest.approx(10.0 * g)
        # the spike survives bucketing as the bucket's max
        assert max(hi for _, hi in trace["customdata"]) == 100.0
    bands = [s for s in util["layout"]["shapes"] if s["type"] == "rect"]
    assert len(bands) == 2
    assert [a["text"] for a in util["layout"]["annotations"]] == ["c=64", "c=128"]

    power = pb.figure(html, "gpu-power-data")
    limit = [s for s in power["layout"]["shapes"] if s["type"] == "line"]
    assert [s["y0"] for s in limit] == [700.0]
    assert power["layout"]["yaxis"]["range"][1] >= 700.0
    assert "power limit 700 W" in [a["text"] for a in power["layout"]["annotations"]]


def test_engine_chart_shows_running_and_queued_against_the_cap(client, sweep):
    EngineSample.objects.bulk_create(
        EngineSample(run=sweep, ts=1_800_000_000.0 + s, running=64, queued=s) for s in range(30)
    )
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    fig = pb.figure(html, "engine-data")
    traces = {t["name"]: t for t in fig["data"]}
    assert traces["running"]["y"] == [64.0] * 30
    assert traces["queued"]["y"] == [float(s) for s in range(30)]
    assert [s["y0"] for s in fig["layout"]["shapes"]] == [64]


def test_a_finished_run_names_the_charts_it_has_no_data_for(client, sweep):
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    assert 'id="gpu-util-data"' not in html and 'id="engine-data"' not in html
    assert (
        "Not recorded for this run: GPU utilization, GPU power, engine running/queued requests."
        in html
    )


def test_one_nvidia_smi_reading_is_drawn_as_bars_per_gpu(client, sweep):
    pb.telemetry(
        sweep, gpus=8, seconds=1, t0=1_800_000_000.0, util=lambda g, s: 0.0, power_limit=600.0
    )
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    power = pb.figure(html, "gpu-power-data")
    [bars] = power["data"]
    assert bars["type"] == "bar" and bars["x"] == [f"GPU{i}" for i in range(8)]
    assert bars["y"] == [100.0] * 8
    assert power["layout"]["shapes"][0]["y0"] == 600.0
    assert "one reading per GPU" in power["layout"]["title"]["text"]
    assert pb.figure(html, "gpu-util-data")["data"][0]["text"] == ["0 %"] * 8


def test_a_running_sweep_keeps_its_empty_charts_to_fill_in(client, sweep):
    sweep.status = "running"
    sweep.save()
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    assert pb.figure(html, "engine-data")["data"] == []
    assert "Not recorded for this run" not in html


def test_page_queries_stay_few_with_a_long_sweep(client, sweep, django_assert_max_num_queries):
    pb.telemetry(sweep, gpus=8, seconds=600)
    with django_assert_max_num_queries(16):
        assert client.get(f"/runs/{sweep.uuid}/").status_code == 200


def test_csv_has_every_metric_with_units_and_the_failures(client, sweep):
    response = client.get(f"/runs/{sweep.uuid}/levels.csv")
    assert response["Content-Type"].startswith("text/csv")
    assert 'filename="before-tuning-levels.csv"' in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert len(rows) == 2
    header = rows[0].keys()
    assert {"output_throughput (tok/s)", "p99_ttft_ms (ms)", "mean_e2el_ms (ms)"} <= set(header)
    assert rows[1]["concurrency"] == "128"
    assert rows[1]["output_throughput (tok/s)"] == "806.0"
    assert rows[1]["output_throughput_per_gpu (tok/s)"] == "100.75"
    assert rows[1]["p95_e2el_ms (ms)"] == ""
    assert rows[1]["errors"] == '{"timeout": 2}'


def test_findings_of_the_run_are_listed(client, sweep):
    from moeops.insights.models import Finding

    Finding.objects.create(
        deployment=sweep.deployment,
        run=sweep,
        kind="plateau",
        title="Throughput plateaus from concurrency 64",
        evidence={
            "chart": {
                "type": "line",
                "x": [64, 128],
                "x_label": "concurrency",
                "y_label": "output tok/s",
                "series": [{"name": "output throughput", "y": [700, 806]}],
            }
        },
    )
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    assert "Throughput plateaus from concurrency 64" in html
    finding = Finding.objects.get()
    fig = pb.figure(html, f"evidence-{finding.pk}-data")
    assert fig["data"][0]["y"] == [700, 806]
    assert fig["layout"]["xaxis"]["type"] == "log"


def test_unknown_run_is_404(client, sweep):
    assert client.get("/runs/00000000-0000-0000-0000-000000000000/").status_code == 404
