"""GPU telemetry of kernel tuning runs: the one-owner constraint, ingestion through the API,
and the per-GPU charts of the tune page, down to real samples of 2×H200 and 4×H200 spread tunes."""

import json

import pytest
from django.db import IntegrityError, transaction

from moeops.kernels.models import TuningRun
from moeops.runs.samples import TelemetryBatch, TelemetrySample
from tests import page_base as pb
from tests.api_base import make_world, refused_batch
from tests.fakes import FIXTURES

TELEMETRY = FIXTURES / "telemetry"


@pytest.fixture
def world(db):
    return make_world()


def _tuning(world, **fields):
    return TuningRun.objects.create(
        host=world.host, device_name="NVIDIA H200", E=256, N=256, hidden_size=6144, topk=8, **fields
    )


def _samples(n, gpus=2, t0=1.7e9):
    return [
        {
            "gpu_index": i % gpus,
            "ts": t0 + i // gpus,
            "gpu_util": 100.0 * (i % gpus),
            "power_w": 80.0 + 500.0 * (i % gpus),
            "power_limit_w": 700.0,
        }
        for i in range(n)
    ]


# --------------------------------------------------------------------------- model


def test_a_sample_belongs_to_exactly_one_run(world):
    tuning = _tuning(world)
    sweep = world.run()
    for owners in ({}, {"run": sweep, "tuning_run": tuning}):
        with pytest.raises(IntegrityError), transaction.atomic():
            TelemetrySample.objects.create(gpu_index=0, ts=1.7e9, **owners)
    TelemetrySample.objects.create(tuning_run=tuning, gpu_index=0, ts=1.7e9)
    TelemetrySample.objects.create(run=sweep, gpu_index=0, ts=1.7e9)
    assert (tuning.telemetry.count(), sweep.telemetry.count()) == (1, 1)


def test_a_batch_belongs_to_exactly_one_run(world):
    tuning = _tuning(world)
    sweep = world.run()
    for owners in ({}, {"run": sweep, "tuning_run": tuning}):
        with pytest.raises(IntegrityError), transaction.atomic():
            TelemetryBatch.objects.create(batch_id="b", **owners)
    # the same batch id under a sweep run and under a tuning run are two batches
    TelemetryBatch.objects.create(tuning_run=tuning, batch_id="b")
    TelemetryBatch.objects.create(run=sweep, batch_id="b")
    with pytest.raises(IntegrityError), transaction.atomic():
        TelemetryBatch.objects.create(tuning_run=tuning, batch_id="b")


# --------------------------------------------------------------------------- API


def test_it_stores_a_tuning_telemetry_batch_once(world):
    tuning = _tuning(world, status="running")
    path = f"/api/v1/tuning-runs/{tuning.uuid}/telemetry"
    body = {"batch_id": "t-0001", "samples": _samples(600)}
    first = world.host_worker.post(path, body)
    assert first.status_code == 201
    assert first.json() == {
        "tuning_run": tuning.pk,
        "batch_id": "t-0001",
        "kind": "gpu",
        "count": 600,
    }
    assert world.host_worker.post(path, body).status_code == 200
    assert tuning.telemetry.count() == 600
    assert not TelemetrySample.objects.filter(run__isnull=False).exists()
    sample = tuning.telemetry.get(gpu_index=1, ts=1.7e9)
    assert (sample.gpu_util, sample.power_w, sample.power_limit_w, sample.mem_util) == (
        100.0,
        580.0,
        700.0,
        None,
    )


def test_it_lists_tuning_telemetry_in_time_order(world):
    tuning = _tuning(world)
    path = f"/api/v1/tuning-runs/{tuning.pk}/telemetry"
    world.host_worker.post(path, {"batch_id": "late", "samples": _samples(4, t0=1.7e9 + 10)})
    world.host_worker.post(path, {"batch_id": "early", "samples": _samples(4)})
    page = world.read_only.get(f"{path}?limit=3").json()
    assert page["count"] == 8
    assert [(s["ts"], s["gpu_index"]) for s in page["items"]] == [
        (1.7e9, 0),
        (1.7e9, 1),
        (1.7e9 + 1, 0),
    ]


def test_only_writers_of_the_tuning_runs_host_post_telemetry(world):
    tuning = _tuning(world)
    hostless = TuningRun.objects.create(E=8, N=64, hidden_size=128, topk=2)
    body = {"batch_id": "x", "samples": _samples(4)}
    assert (
        world.outsider.post(f"/api/v1/tuning-runs/{tuning.pk}/telemetry", body).status_code == 403
    )
    assert (
        world.read_only.post(f"/api/v1/tuning-runs/{tuning.pk}/telemetry", body).status_code == 403
    )
    assert (
        world.anonymous.post(f"/api/v1/tuning-runs/{tuning.pk}/telemetry", body).status_code == 401
    )
    # a host's token writes only its own host's data; a tune of no host is the owner's
    path = f"/api/v1/tuning-runs/{hostless.pk}/telemetry"
    assert world.host_worker.post(path, body).status_code == 403
    assert world.owner.post(path, body).status_code == 201
    assert not tuning.telemetry.exists()


def test_it_rejects_a_batch_with_one_bad_sample_whole(world):
    tuning = _tuning(world)
    samples = _samples(10)
    samples[7]["gpu_util"] = "busy"
    path = f"/api/v1/tuning-runs/{tuning.pk}/telemetry"
    refused_batch(world.host_worker, path, samples, "samples.7.gpu_util:")
    assert not TelemetrySample.objects.exists()


# --------------------------------------------------------------------------- page


def test_the_tune_page_charts_utilization_and_power_per_gpu(world, client):
    pb.sign_in(client)
    tuning = _tuning(world, status="running")
    world.host_worker.post(
        f"/api/v1/tuning-runs/{tuning.pk}/telemetry", {"batch_id": "a", "samples": _samples(40)}
    )
    world.host_worker.patch(f"/api/v1/tuning-runs/{tuning.pk}", {"status": "succeeded"})
    html = client.get(f"/tunes/{tuning.uuid}/").content.decode()
    util = pb.figure(html, "gpu-util-data")
    power = pb.figure(html, "gpu-power-data")
    assert [t["name"] for t in util["data"]] == ["GPU0", "GPU1"]
    assert [t["name"] for t in power["data"]] == ["GPU0", "GPU1"]
    assert set(util["data"][1]["y"]) == {100.0}
    assert set(power["data"][0]["y"]) == {80.0}
    assert "power limit 700 W" in json.dumps(power["layout"])
    state = client.get(f"/tunes/{tuning.uuid}/status.json?figures=1").json()
    assert [t["name"] for t in state["figures"]["gpu-power"]["data"]] == ["GPU0", "GPU1"]


@pytest.mark.parametrize(
    "telemetry, reason",
    [
        (
            {"telemetry_status": "unavailable", "telemetry_detail": "NVML sees no GPU"},
            "NVML sees no GPU",
        ),
        (
            {
                "telemetry_status": "unavailable",
                "telemetry_detail": "pynvml is not installed (No module named 'pynvml')",
            },
            "pynvml is not installed (No module named &#x27;pynvml&#x27;)",
        ),
        # a tune stored before workers sent the reason
        ({}, "telemetry pending"),
    ],
)
def test_a_finished_tune_without_telemetry_says_why_where_the_charts_would_be(
    world, client, telemetry, reason
):
    pb.sign_in(client)
    tuning = _tuning(world, status="succeeded", **telemetry)
    html = client.get(f"/tunes/{tuning.uuid}/").content.decode()
    assert (
        f'<p class="muted small">No GPU samples were recorded for this tune ({reason}).</p>' in html
    )
    assert "gpu-util-data" not in html
    assert "gpu-power-data" not in html


@pytest.mark.parametrize(
    ("telemetry", "gpus"),
    [("h200x2_spread_tune.jsonl", 2), ("h200x4_spread_tune.jsonl", 4)],
)
def test_the_h200_spread_tune_samples_are_stored_and_charted_per_gpu(
    world, client, telemetry, gpus
):
    lines = (TELEMETRY / telemetry).read_text().splitlines()
    samples = [json.loads(line) for line in lines]
    tuning = _tuning(world, status="running")
    response = world.host_worker.post(
        f"/api/v1/tuning-runs/{tuning.uuid}/telemetry",
        {"batch_id": telemetry, "samples": samples},
    )
    assert response.status_code == 201
    world.host_worker.patch(f"/api/v1/tuning-runs/{tuning.uuid}", {"status": "succeeded"})
    per_gpu = {gpu: tuning.telemetry.filter(gpu_index=gpu).count() for gpu in range(gpus)}
    assert per_gpu == {gpu: len(samples) // gpus for gpu in range(gpus)}
    busiest = {
        gpu: max(s["power_w"] for s in samples if s["gpu_index"] == gpu) for gpu in range(gpus)
    }
    # both GPUs worked during the spread tune, well above their ~80 W idle
    assert min(busiest.values()) > 200.0

    pb.sign_in(client)
    html = client.get(f"/tunes/{tuning.uuid}/").content.decode()
    power = pb.figure(html, "gpu-power-data")
    util = pb.figure(html, "gpu-util-data")
    names = [f"GPU{gpu}" for gpu in range(gpus)]
    assert [t["name"] for t in power["data"]] == names
    assert [t["name"] for t in util["data"]] == names
    for trace in power["data"]:
        gpu = int(trace["name"][3:])
        # bucket means never exceed the raw peak; the bucket maxima reach it
        assert max(trace["y"]) <= busiest[gpu]
        assert max(high for _, high in trace["customdata"]) == busiest[gpu]
    assert "power limit 700 W" in json.dumps(power["layout"])
