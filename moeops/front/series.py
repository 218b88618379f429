"""Time series of a run or a kernel tune bucketed for display; raw samples stay in the database.

A 2 h sweep sampled at 1 Hz on 8 GPUs is 57,600 rows: the run page asks the database for a fixed
number of time buckets per GPU (mean, min and max in one GROUP BY) instead of loading them all.
"""

from dataclasses import dataclass, field

from django.db.models import Avg, Count, F, Max, Min, Sum, Value
from django.db.models.functions import Floor

from moeops.runs.models import EngineSample, TelemetrySample, total_power

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


def _span(qs):
    """(first, last) sample time (UTC epoch s), or (None, None)."""
    span = qs.aggregate(t0=Min("ts"), t1=Max("ts"))
    return span["t0"], span["t1"]


def _bucketed(qs, group_field, aggregates, buckets):
    """One GROUP BY (group, bucket) query; returns a Series."""
    t0, t1 = _span(qs)
    series = Series(t0=t0, t1=t1)
    if t0 is None:
        return series
    span = t1 - t0
    series.width = span / buckets if span > 0 else 1.0
    group_by = [group_field, "bucket"] if group_field else ["bucket"]
    rows = (
        qs.annotate(bucket=Floor((F("ts") - Value(t0)) / Value(series.width)))
        .values(*group_by)
        .annotate(t=Avg("ts"), n=Count("id"), **aggregates)
        .order_by(*group_by)
    )
    names = ["bucket", "t", *aggregates]
    for row in rows:
        key = row[group_field] if group_field else None
        group = series.groups.setdefault(key, {name: [] for name in names})
        for name in names:
            group[name].append(row[name])
        series.count += row["n"]
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
    return compute() if of_samples is None else of_samples(name, levels, compute)


def _levels_of(run, levels):
    """A sweep's levels, read when the caller has none at hand; None for a tune."""
    if levels is None and hasattr(run, "levels"):
        return list(run.levels.all())
    return levels


def gpu_series(run, buckets=BUCKETS, levels=None):
    """Per GPU: utilization (%), power (W), memory used (MiB) and SM clock (MHz), mean/min/max
    per time bucket, with the power each level drew, from one read of the samples.

    run: a SweepRun or a kernels TuningRun (both own samples as `telemetry`); levels: a
    sweep's LevelResults where the caller has them (they are read otherwise). Read once for a
    finished run (SweepRun.of_samples).
    `extra["power_limit_w"]` is the highest enforced power limit seen (W), `extra
    ["mem_total_mib"]` the largest GPU memory (MiB), each None when not recorded; a sweep's
    `extra["level_power"]` is SweepRun.level_power's {level key: total power (W)}.
    """
    levels = _levels_of(run, levels)
    return _of_samples(run, f"gpu-{buckets}", levels, lambda: _gpu_series(run, buckets, levels))


def engine_series(run, buckets=BUCKETS, levels=None):
    """The engine's running and queued requests (mean and max per bucket), KV-cache use (0–1);
    levels as gpu_series takes them. Read once for a finished run (SweepRun.of_samples)."""
    levels = _levels_of(run, levels)
    return _of_samples(
        run, f"engine-{buckets}", levels, lambda: _engine_series(run, buckets, levels)
    )


GPU_COLUMNS = {
    "util": "gpu_util",
    "power": "power_w",
    "mem": "mem_used_mib",
    "clock": "sm_clock_mhz",
}
HIGHEST = ("power_limit_w", "mem_total_mib")


def _gpu_rows(qs, t0, width, level):
    """Rows of sums, counts, minima and maxima per (GPU, bucket) and, with `level` (a Case
    naming each sample's level), per level within a bucket that two levels share."""
    keys = ["gpu_index", "bucket"]
    qs = qs.annotate(bucket=Floor((F("ts") - Value(t0)) / Value(width)))
    if level is not None:
        qs = qs.annotate(level=level)
        keys.append("level")
    aggregates = {"t_sum": Sum("ts"), "n": Count("id")}
    for name, column in GPU_COLUMNS.items():
        aggregates |= {
            f"{name}_sum": Sum(column),
            f"{name}_n": Count(column),
            f"{name}_min": Min(column),
            f"{name}_max": Max(column),
        }
    aggregates |= {column: Max(column) for column in HIGHEST}
    return qs.values(*keys).annotate(**aggregates).order_by(*keys)


def _least(a, b):
    return b if a is None else a if b is None else min(a, b)


def _most(a, b):
    return b if a is None else a if b is None else max(a, b)


def _gpu_series(run, buckets, levels):
    qs = _stored_attempts(run, run.telemetry.all(), levels)
    t0, t1 = _span(qs)
    series = Series(t0=t0, t1=t1, extra=dict.fromkeys(HIGHEST))
    level = run.level_windows(levels) if levels else None
    if level is not None:
        series.extra["level_power"] = {}
    if t0 is None:
        return series
    series.width = (t1 - t0) / buckets if t1 > t0 else 1.0
    names = ["bucket", "t"] + [f"{n}{end}" for n in GPU_COLUMNS for end in ("", "_min", "_max")]
    power = {}  # (level key, GPU index): [sum of power W, samples]
    merged = None  # the (GPU, bucket) being summed over its rows, one per level in it
    for row in [*_gpu_rows(qs, t0, series.width, level), None]:
        if merged is not None and (
            row is None
            or (row["gpu_index"], row["bucket"]) != (merged["gpu_index"], merged["bucket"])
        ):
            group = series.groups.setdefault(merged["gpu_index"], {n: [] for n in names})
            group["bucket"].append(int(merged["bucket"]))  # Floor gives a float on some databases
            group["t"].append(merged["t_sum"] / merged["n"])
            for name in GPU_COLUMNS:
                count = merged[f"{name}_n"]
                group[name].append(merged[f"{name}_sum"] / count if count else None)
                group[f"{name}_min"].append(merged[f"{name}_min"])
                group[f"{name}_max"].append(merged[f"{name}_max"])
            merged = None
        if row is None:
            break
        series.count += row["n"]
        for column in HIGHEST:
            series.extra[column] = _most(series.extra[column], row[column])
        if row.get("level") is not None and row["power_n"]:
            summed = power.setdefault((row["level"], row["gpu_index"]), [0.0, 0])
            summed[0] += row["power_sum"]
            summed[1] += row["power_n"]
        if merged is None:
            merged = dict(row)
            continue
        for key in ("t_sum", "n", *(f"{n}{end}" for n in GPU_COLUMNS for end in ("_sum", "_n"))):
            if row[key] is not None:
                merged[key] = (merged[key] or 0) + row[key]
        for name in GPU_COLUMNS:
            merged[f"{name}_min"] = _least(merged[f"{name}_min"], row[f"{name}_min"])
            merged[f"{name}_max"] = _most(merged[f"{name}_max"], row[f"{name}_max"])
    if level is not None:
        series.extra["level_power"] = total_power({key: s / n for key, (s, n) in power.items()})
    return series


def _engine_series(run, buckets, levels):
    qs = _stored_attempts(run, EngineSample.objects.filter(run=run), levels)
    return _bucketed(
        qs,
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
