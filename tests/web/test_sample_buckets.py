"""The sums kept per time bucket as samples are stored (runs.rollup) against the raw samples."""

import math
import threading

import pytest
from django.db import connection

from moeops.front import series
from moeops.front.charts.figures import epoch_to_plotly
from moeops.runs import measurements, rollup
from moeops.runs.samples import EngineBucket, EngineSample, TelemetryBucket, TelemetrySample
from tests import page_base as pb

T0 = 1_800_000_003.25  # mid-bucket at every width


def _gpu_samples(first, seconds, gpus=2, level=64, attempt=1):
    """1 Hz samples; every 7th lacks its power and SM clock (NVML answered without them)."""
    return [
        {
            "gpu_index": g,
            "ts": T0 + s + 0.1 * g,
            "level_concurrency": level,
            "gpu_util": float((s * 7 + g * 13) % 100),
            "mem_util": 40.0,
            "power_w": None if s % 7 == 0 else 90.0 + (s * 3 + g) % 500,
            "power_limit_w": 700.0 - g,
            "mem_used_mib": 1000.0 + s,
            "mem_total_mib": 143771.0,
            "sm_clock_mhz": None if s % 7 == 0 else 1980.0 - s % 11,
            "temperature_c": 60.0,
            "attempt": attempt,
        }
        for s in range(first, first + seconds)
        for g in range(gpus)
    ]


def _of_raw(bucket_model, samples):
    """{bucket key: sums} of `samples` (rows of the sample model as dicts), computed directly."""
    fields, highest, per_gpu = rollup.SPECS[bucket_model.__name__]
    sums = {}
    for sample in samples:
        for width in rollup.WIDTHS:
            key = (
                width,
                math.floor(sample["ts"] / width),
                *((sample["gpu_index"],) if per_gpu else ()),
                sample["level_concurrency"],
                sample["attempt"],
            )
            bucket = sums.setdefault(key, {"n": 0, "ts_sum": 0.0, "ts": []})
            bucket["n"] += 1
            bucket["ts_sum"] += sample["ts"]
            bucket["ts"].append(sample["ts"])
            for name in fields:
                bucket.setdefault(name, [])
                if sample[name] is not None:
                    bucket[name].append(sample[name])
            for name in highest:
                bucket.setdefault(name, []).append(sample[name])
    expected = {}
    for key, bucket in sums.items():
        row = {
            "n": bucket["n"],
            "ts_sum": pytest.approx(bucket["ts_sum"]),
            "ts_min": min(bucket["ts"]),
            "ts_max": max(bucket["ts"]),
        }
        for name in fields:
            values = bucket[name]
            row |= {
                f"{name}_sum": pytest.approx(sum(values)) if values else None,
                f"{name}_n": len(values),
                f"{name}_min": min(values, default=None),
                f"{name}_max": max(values, default=None),
            }
        for name in highest:
            row[f"{name}_max"] = max((v for v in bucket[name] if v is not None), default=None)
        expected[key] = row
    return expected


def _stored(bucket_model, run):
    """{bucket key: sums} of the run's stored buckets."""
    names = rollup._key_names(bucket_model)
    return {
        tuple(row[name] for name in names): {
            k: v for k, v in row.items() if k not in (*names, "id", "run_id", "tuning_run_id")
        }
        for row in bucket_model.objects.filter(run=run).values()
    }


def _raw(sample_model, run):
    return list(sample_model.objects.filter(run=run).values())


@pytest.fixture
def running(client):
    pb.sign_in(client)
    return pb.run(pb.deployment(), status="running")


@pytest.mark.django_db
def test_the_buckets_equal_sums_of_the_raw_samples_after_a_batch_sent_again(running):
    batches = [
        ("a", _gpu_samples(0, 25)),
        ("b", _gpu_samples(25, 130)),  # across a 120 s edge
        ("c", _gpu_samples(155, 40, level=128)),  # a new level mid-bucket
        ("d", _gpu_samples(100, 30, level=64, attempt=2)),  # a resumed level's samples
    ]
    for batch_id, samples in batches:
        assert measurements.telemetry_record(run=running, batch_id=batch_id, samples=samples)[1]
    # sent again (a retry of a write that was stored): stored once, summed once
    assert not measurements.telemetry_record(run=running, batch_id="b", samples=batches[1][1])[1]

    stored = _stored(TelemetryBucket, running)
    assert TelemetrySample.objects.filter(run=running).count() == 2 * (25 + 130 + 40 + 30)
    assert stored == _of_raw(TelemetryBucket, _raw(TelemetrySample, running))
    # the migration's backfill sums them alike
    rollup.buckets_rebuild(TelemetryBucket, TelemetrySample, owner_field="run", owner_id=running.pk)
    assert _stored(TelemetryBucket, running) == _of_raw(
        TelemetryBucket, _raw(TelemetrySample, running)
    )


@pytest.mark.django_db
def test_engine_buckets_equal_sums_of_the_raw_samples(running):
    samples = [
        {
            "ts": T0 + s,
            "level_concurrency": 64,
            "running": float(s % 65),
            "queued": float(s % 3),
            "kv_cache_usage": None if s % 5 == 0 else s / 1000,
            "attempt": 1,
        }
        for s in range(300)
    ]
    for first in range(0, 300, 45):
        measurements.engine_samples_record(
            run=running, batch_id=str(first), samples=samples[first : first + 45]
        )
    measurements.engine_samples_record(run=running, batch_id="45", samples=samples[45:90])
    assert _stored(EngineBucket, running) == _of_raw(EngineBucket, _raw(EngineSample, running))


@pytest.mark.django_db(transaction=True)
def test_two_ingests_of_one_run_at_once_lose_none_of_each_others_sums(running):
    # two workers' batches of the same GPUs and seconds: each adds to the same buckets
    errors = []

    def push(gpus):
        try:
            for first in range(0, 200, 10):
                samples = [s for s in _gpu_samples(first, 10, gpus=4) if s["gpu_index"] in gpus]
                measurements.telemetry_record(
                    run=running, batch_id=f"{gpus}-{first}", samples=samples
                )
        except Exception as error:  # noqa: BLE001 — reported by the assertion below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=push, args=(gpus,)) for gpus in ((0, 1), (2, 3))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert TelemetrySample.objects.filter(run=running).count() == 4 * 200
    assert _stored(TelemetryBucket, running) == _of_raw(
        TelemetryBucket, _raw(TelemetrySample, running)
    )


@pytest.mark.django_db
def test_a_long_runs_charts_read_from_buckets_show_the_samples_means_and_extremes(client):
    pb.sign_in(client)
    sweep = pb.run(pb.deployment(), levels=[{"concurrency": 64}, {"concurrency": 128}])
    # 2 h on 2 GPUs with a spike on GPU1; levels end mid-bucket, with a gap between them
    t0 = pb.telemetry(
        sweep,
        gpus=2,
        seconds=7200,
        t0=T0,
        util=lambda g, s: 100.0 if (g, s) == (1, 4321) else s % 9,
    )
    levels = list(sweep.levels.order_by("concurrency"))
    for level, (start, end) in zip(levels, [(3.5, 3003.5), (3010.2, 7100.7)], strict=True):
        level.started_at, level.finished_at = t0 + start, t0 + end
        level.save()
    sweep.status = "running"
    summed = series.gpu_series(sweep, levels=levels)
    # from the 10 s edge before the first sample to the last, 7202.25 s: in 240 buckets of
    # 4 buckets of 10 s, and one more
    assert summed.width == 40 and summed.bucket_start(0) == 1_800_000_000.0
    assert summed.count == 2 * 7200
    assert summed.extra["power_limit_w"] == 700.0
    # each shown bucket against its raw samples
    samples = list(TelemetrySample.objects.filter(run=sweep).values("gpu_index", "ts", "gpu_util"))
    for gpu, group in summed.groups.items():
        assert len(group["bucket"]) <= series.BUCKETS + 1
        for i, bucket in enumerate(group["bucket"]):
            start = summed.bucket_start(bucket)
            inside = [
                s
                for s in samples
                if s["gpu_index"] == gpu and start <= s["ts"] < start + summed.width
            ]
            values = [s["gpu_util"] for s in inside]
            assert group["util"][i] == pytest.approx(sum(values) / len(values))
            assert (group["util_min"][i], group["util_max"][i]) == (min(values), max(values))
            assert group["t"][i] == pytest.approx(sum(s["ts"] for s in inside) / len(inside))
    assert max(summed.groups[1]["util_max"]) == 100.0
    # each level's power is of its own samples, as the cost columns read it
    assert set(summed.extra["level_power"]) == {level.key for level in levels}
    assert summed.extra["level_power"] == pytest.approx(sweep.level_power(levels))
    raw = series._gpu_series_of_samples(sweep, levels, series.BUCKETS, summed.t0, summed.t1)
    assert summed.extra["level_power"] == pytest.approx(raw.extra["level_power"])
    # the charts' traces start at the first bucket's centre, a bucket apart
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    [gpu0, _] = pb.figure(html, "gpu-util-data")["data"]
    assert gpu0["x0"] == epoch_to_plotly(1_800_000_000.0 + 20)
    assert gpu0["dx"] == 40_000


@pytest.mark.django_db
def test_a_short_runs_charts_are_read_from_its_raw_samples_as_before(client):
    pb.sign_in(client)
    sweep = pb.run(pb.deployment(), levels=[{"concurrency": 64}])
    # 2399 s: fewer than BUCKETS buckets of 10 s, drawn in 240 buckets of 2399 / 240 s
    pb.telemetry(sweep, gpus=2, seconds=2400, t0=T0, util=lambda g, s: s % 13)
    gpu = series.gpu_series(sweep, levels=list(sweep.levels.all()))
    assert gpu.width == pytest.approx(2399 / series.BUCKETS)
    assert gpu.bucket_start(0) == T0
    assert len(gpu.groups[0]["bucket"]) == series.BUCKETS + 1


@pytest.mark.django_db
def test_the_admin_shows_samples_but_does_not_change_them_behind_their_sums(admin_client, running):
    measurements.telemetry_record(run=running, batch_id="a", samples=_gpu_samples(0, 2))
    sample = TelemetrySample.objects.filter(run=running).first()
    assert admin_client.get(f"/admin/runs/telemetrysample/{sample.pk}/change/").status_code == 200
    edit = {"run": running.pk, "gpu_index": 0, "ts": sample.ts, "gpu_util": 99.0, "attempt": 1}
    admin_client.post(f"/admin/runs/telemetrysample/{sample.pk}/change/", edit)
    admin_client.post(f"/admin/runs/telemetrysample/{sample.pk}/delete/", {"post": "yes"})
    assert admin_client.get("/admin/runs/enginesample/add/").status_code == 403
    sample.refresh_from_db()
    assert sample.gpu_util == 0.0
    assert _stored(TelemetryBucket, running) == _of_raw(
        TelemetryBucket, _raw(TelemetrySample, running)
    )
