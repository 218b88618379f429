"""Time series of a run or a kernel tune bucketed for display; raw samples stay in the database.

A 2 h sweep sampled at 1 Hz on 8 GPUs is 57,600 rows: the run page asks the database for a fixed
number of time buckets per GPU (mean, min and max in one GROUP BY) instead of loading them all.
"""

from dataclasses import dataclass, field

from django.db.models import Avg, Count, F, Max, Min, Value
from django.db.models.functions import Floor

from moeops.runs.models import EngineSample, TelemetrySample

BUCKETS = 240


@dataclass
class Series:
    """Bucketed samples: per group (a GPU index, or None for the engine) a dict of lists.

    Each group holds "bucket" (the bucket's index: it spans t0 + index · width onwards), "t"
    (mean UTC epoch s of the bucket's samples) and one list per aggregate, all of equal length
    and in time order; a bucket without samples has no entry.
    """

    count: int = 0
    t0: float | None = None
    t1: float | None = None
    width: float | None = None
    groups: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)


def _bounds(qs, **extra):
    return qs.aggregate(n=Count("id"), t0=Min("ts"), t1=Max("ts"), **extra)


def _bucketed(qs, bounds, group_field, aggregates, buckets):
    """One GROUP BY (group, bucket) query; returns a Series."""
    series = Series(
        count=bounds["n"],
        t0=bounds["t0"],
        t1=bounds["t1"],
        extra={k: v for k, v in bounds.items() if k not in ("n", "t0", "t1")},
    )
    if not series.count:
        return series
    span = series.t1 - series.t0
    series.width = span / buckets if span > 0 else 1.0
    group_by = [group_field, "bucket"] if group_field else ["bucket"]
    rows = (
        qs.annotate(bucket=Floor((F("ts") - Value(series.t0)) / Value(series.width)))
        .values(*group_by)
        .annotate(t=Avg("ts"), **aggregates)
        .order_by(*group_by)
    )
    names = ["bucket", "t", *aggregates]
    for row in rows:
        key = row[group_field] if group_field else None
        group = series.groups.setdefault(key, {name: [] for name in names})
        for name in names:
            group[name].append(row[name])
    for group in series.groups.values():
        # Floor gives a float on some databases
        group["bucket"] = [int(b) for b in group["bucket"]]
    return series


def _stored_attempts(run, samples, levels):
    """A sweep's samples less a cut-short attempt's (as the analysis reads them); a tune's all.
    levels: the sweep's LevelResults where the caller has them."""
    keep = getattr(run, "samples_of_stored_attempts", None)
    return keep(samples, levels) if keep is not None else samples


def _of_samples(run, name, levels, compute):
    """compute(), once per finished sweep run (SweepRun.of_samples); a tune's every time."""
    of_samples = getattr(run, "of_samples", None)
    if of_samples is None:
        return compute()
    if levels is None:
        levels = list(run.levels.all())
    return of_samples(name, levels, compute)


def gpu_series(run, buckets=BUCKETS, levels=None):
    """Per GPU: utilization (%), power (W), memory used (MiB) and SM clock (MHz), mean/min/max
    per time bucket.

    run: a SweepRun or a kernels TuningRun (both own samples as `telemetry`); levels: a
    sweep's LevelResults where the caller has them (they are read otherwise). Read once for a
    finished run (SweepRun.of_samples).
    `extra["power_limit_w"]` is the highest enforced power limit seen (W), `extra
    ["mem_total_mib"]` the largest GPU memory (MiB), each None when not recorded.
    """
    return _of_samples(
        run, f"gpu-{buckets}", levels, lambda: _gpu_series(run, buckets=buckets, levels=levels)
    )


def engine_series(run, buckets=BUCKETS, levels=None):
    """The engine's running and queued requests (mean and max per bucket), KV-cache use (0–1);
    levels as gpu_series takes them. Read once for a finished run (SweepRun.of_samples)."""
    return _of_samples(
        run,
        f"engine-{buckets}",
        levels,
        lambda: _engine_series(run, buckets=buckets, levels=levels),
    )


def _gpu_series(run, buckets, levels):
    qs = _stored_attempts(run, run.telemetry.all(), levels)
    bounds = _bounds(qs, power_limit_w=Max("power_limit_w"), mem_total_mib=Max("mem_total_mib"))
    aggregates = {}
    for name, column in (
        ("util", "gpu_util"),
        ("power", "power_w"),
        ("mem", "mem_used_mib"),
        ("clock", "sm_clock_mhz"),
    ):
        aggregates |= {name: Avg(column), f"{name}_min": Min(column), f"{name}_max": Max(column)}
    return _bucketed(qs, bounds, "gpu_index", aggregates, buckets)


def _engine_series(run, buckets, levels):
    qs = _stored_attempts(run, EngineSample.objects.filter(run=run), levels)
    return _bucketed(
        qs,
        _bounds(qs),
        None,
        {
            # aliases must not shadow the model's own field names
            "running_mean": Avg("running"),
            "running_max": Max("running"),
            "queued_mean": Avg("queued"),
            "queued_max": Max("queued"),
            "kv_mean": Avg("kv_cache_usage"),
        },
        buckets,
    )


def level_bands(run, levels):
    """(concurrency, start epoch s, end epoch s) of each level, in time order.

    From the levels' own timestamps; where the worker stored none, from the telemetry samples
    tagged with the level that ran.
    """
    bands = [
        (level.concurrency, level.started_at, level.finished_at)
        for level in levels
        if level.started_at is not None and level.finished_at is not None
    ]
    if not bands:
        rows = (
            TelemetrySample.objects.filter(run=run, level_concurrency__isnull=False)
            .values("level_concurrency")
            .annotate(start=Min("ts"), end=Max("ts"))
            .order_by("start")
        )
        bands = [(row["level_concurrency"], row["start"], row["end"]) for row in rows]
    return sorted(bands, key=lambda band: band[1])


def level_means(series, bands, key):
    """{concurrency: mean of `key` (e.g. "util", %) over every GPU's buckets whose time falls in
    the level's band}, for the levels with a band and a value; a bucket is counted once per GPU
    whatever its number of samples."""
    means = {}
    for concurrency, start, end in bands:
        values = [
            value
            for group in series.groups.values()
            for t, value in zip(group["t"], group[key], strict=True)
            if value is not None and start <= t <= end
        ]
        if concurrency is not None and values:
            means[concurrency] = sum(values) / len(values)
    return means
