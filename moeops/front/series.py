"""Time series of a run or a kernel tune bucketed for display; raw samples stay in the database.

A 24 h sweep sampled at 1 Hz on 8 GPUs is 691,200 rows: the run page asks the database for a
fixed number of time buckets per GPU (mean, min and max in one GROUP BY), summed from the
buckets kept as the samples were stored (runs.rollup) where the run spans BUCKETS of them,
else from its raw samples.
"""

import math
from dataclasses import dataclass, field

from django.db import connections
from django.db.models import (
    Avg,
    BigIntegerField,
    Case,
    CharField,
    Count,
    ExpressionWrapper,
    F,
    Max,
    Min,
    Q,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Floor

from moeops.runs.models import total_power
from moeops.runs.rollup import WIDTHS
from moeops.runs.samples import EngineBucket, EngineSample, TelemetrySample

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
    origin: float | None = None  # where bucket 0 starts (UTC epoch s); t0 unless set

    def bucket_start(self, index):
        """UTC epoch s where bucket `index` starts."""
        return (self.t0 if self.origin is None else self.origin) + index * self.width


def _bucketed(qs, group_field, aggregates, buckets, t0, t1):
    """One GROUP BY (group, bucket) query of the samples from t0 to t1 (UTC epoch s, None
    where there are none); returns a Series."""
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


def _summed_width(summed, buckets, highest=()):
    """(t0, t1, width, per, greatest) of a run's buckets (runs.rollup; a queryset of them): its
    first and last sample time (UTC epoch s, None without samples), the widest width w (s)
    with the run's span ≥ buckets · w, how many of its buckets make one that is shown, and
    {column: its greatest value} of the `highest` columns. width and per are None when the
    run spans fewer than `buckets` of the narrowest width: its raw samples, at most
    buckets · WIDTHS[0] s of them, are read instead, and drawn as finely as before."""
    greatest = {column: Max(f"{column}_max") for column in highest}
    span = summed.filter(width=WIDTHS[-1]).aggregate(t0=Min("ts_min"), t1=Max("ts_max"), **greatest)
    t0, t1 = span.pop("t0"), span.pop("t1")
    fitting = [w for w in WIDTHS if t0 is not None and t1 - t0 >= buckets * w]
    if not fitting:
        return t0, t1, None, None, span
    width = fitting[-1]
    per = math.ceil((t1 - math.floor(t0 / width) * width) / (buckets * width))
    return t0, t1, width, per, span


def _summed_rows(summed, width, per, origin, keys, aggregates):
    """One GROUP BY of the buckets of `width` into `per` of them each from bucket `origin` on,
    as the rows _gpu_rows and _bucketed make of raw samples ("shown" the shown one's index)."""
    # whole numbers ≥ 0: integer division floors them on both databases
    shown = ExpressionWrapper((F("bucket") - Value(origin)) / Value(per), BigIntegerField())
    rows = (
        summed.filter(width=width)
        .annotate(shown=shown)
        .values_list(*keys, "shown")
        .annotate(t_sum=Sum("ts_sum"), n=Sum("n"), **aggregates)
        .order_by(*keys, "shown")
    )
    # as the database gives them (ints and floats on both): Django's converter for each value
    # of 2,000 rows of 20 sums costs more than the query
    sql, params = rows.query.sql_with_params()
    with connections[rows.db].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _gpu_series(run, buckets, levels):
    summed = _stored_attempts(run, run.telemetry_buckets.all(), levels)
    t0, t1, width, per, greatest = _summed_width(summed, buckets, HIGHEST)
    if width is None:
        return _gpu_series_of_samples(run, levels, buckets, t0, t1)
    origin = math.floor(t0 / width)
    series = Series(t0=t0, t1=t1, width=width * per, origin=origin * width, extra=greatest)
    aggregates = {}
    for name, column in GPU_COLUMNS.items():
        aggregates |= {
            f"{name}_sum": Sum(f"{column}_sum"),
            f"{name}_n": Sum(f"{column}_n"),
            f"{name}_min": Min(f"{column}_min"),
            f"{name}_max": Max(f"{column}_max"),
        }
    names = ["bucket", "t"] + [f"{n}{end}" for n in GPU_COLUMNS for end in ("", "_min", "_max")]
    for gpu_index, shown, t_sum, n, *sums in _summed_rows(
        summed, width, per, origin, ["gpu_index"], aggregates
    ):
        group = series.groups.get(gpu_index)
        if group is None:
            group = series.groups[gpu_index] = {name: [] for name in names}
        group["bucket"].append(shown)
        group["t"].append(t_sum / n)
        for i, name in enumerate(GPU_COLUMNS):
            total, count, least, most = sums[4 * i : 4 * i + 4]
            group[name].append(total / count if count else None)
            group[f"{name}_min"].append(least)
            group[f"{name}_max"].append(most)
        series.count += n
    if levels and run.level_windows(levels) is not None:
        series.extra["level_power"] = _level_power_summed(run, levels, summed, width)
    return series


def _level_power_summed(run, levels, summed, width):
    """SweepRun.level_power's figures from the buckets of `width` that lie wholly in a level's
    window (or carry its tag, where it has no window) and the raw samples of the buckets that
    a window's start or end falls in, which those split: the same samples' sums as
    SweepRun.level_windows gives each level, read from a few hundred rows."""
    whens, edges = [], set()
    for level in levels:
        if level.started_at is not None and level.finished_at is not None:
            first, last = (
                math.floor(level.started_at / width),
                math.floor(level.finished_at / width),
            )
            edges |= {first, last}
            # a bucket that is no edge lies wholly in the window or wholly out of it
            whens.append(When(Q(bucket__gt=first, bucket__lt=last), then=Value(level.key)))
        elif level.concurrency is not None:
            whens.append(When(Q(level_concurrency=level.concurrency), then=Value(level.key)))
    sums = {}  # (level key, GPU index): [sum of power W, samples]
    inner = (
        summed.filter(width=width)
        .exclude(bucket__in=edges)
        .annotate(level=Case(*whens, output_field=CharField()))
        .filter(level__isnull=False)
        .values("level", "gpu_index")
        .annotate(total=Sum("power_w_sum"), n=Sum("power_w_n"))
        .order_by()
    )
    rows = list(inner)
    if edges:
        # the index on (run, ts) finds them where each range names the run (SQLite scans the
        # run's samples otherwise); the bucket is computed as rollup computes it
        near = Q()
        for bucket in edges:
            near |= Q(run=run, ts__gte=bucket * width - 1, ts__lt=(bucket + 1) * width + 1)
        samples = _stored_attempts(run, TelemetrySample.objects.filter(near), levels)
        rows += (
            samples.annotate(bucket=Floor(F("ts") / Value(float(width))))
            .filter(bucket__in=edges)
            .annotate(level=run.level_windows(levels))
            .filter(level__isnull=False)
            .values("level", "gpu_index")
            .annotate(total=Sum("power_w"), n=Count("power_w"))
            .order_by()
        )
    for row in rows:
        if row["n"]:
            summed_power = sums.setdefault((row["level"], row["gpu_index"]), [0.0, 0])
            summed_power[0] += row["total"]
            summed_power[1] += row["n"]
    return total_power({key: total / n for key, (total, n) in sums.items()})


def _gpu_bucket_add(series, row):
    """Appends a (GPU, bucket) row of sums, counts, minima and maxima to its GPU's group."""
    names = ["bucket", "t"] + [f"{n}{end}" for n in GPU_COLUMNS for end in ("", "_min", "_max")]
    group = series.groups.setdefault(row["gpu_index"], {n: [] for n in names})
    group["bucket"].append(int(row["bucket"]))  # Floor gives a float on some databases
    group["t"].append(row["t_sum"] / row["n"])
    for name in GPU_COLUMNS:
        count = row[f"{name}_n"]
        group[name].append(row[f"{name}_sum"] / count if count else None)
        group[f"{name}_min"].append(row[f"{name}_min"])
        group[f"{name}_max"].append(row[f"{name}_max"])
    series.count += row["n"]
    for column in HIGHEST:
        series.extra[column] = _most(series.extra[column], row[column])


def _gpu_series_of_samples(run, levels, buckets, t0, t1):
    """gpu_series read from the raw samples taken from t0 to t1 (UTC epoch s)."""
    qs = _stored_attempts(run, run.telemetry.all(), levels)
    series = Series(t0=t0, t1=t1, extra=dict.fromkeys(HIGHEST))
    level = run.level_windows(levels) if levels else None
    if level is not None:
        series.extra["level_power"] = {}
    if t0 is None:
        return series
    series.width = (t1 - t0) / buckets if t1 > t0 else 1.0
    power = {}  # (level key, GPU index): [sum of power W, samples]
    merged = None  # the (GPU, bucket) being summed over its rows, one per level in it
    for row in [*_gpu_rows(qs, t0, series.width, level), None]:
        if merged is not None and (
            row is None
            or (row["gpu_index"], row["bucket"]) != (merged["gpu_index"], merged["bucket"])
        ):
            _gpu_bucket_add(series, merged)
            merged = None
        if row is None:
            break
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
        for column in HIGHEST:
            merged[column] = _most(merged[column], row[column])
    if level is not None:
        series.extra["level_power"] = total_power({key: s / n for key, (s, n) in power.items()})
    return series


ENGINE_MEANS = {"running_mean": "running", "queued_mean": "queued", "kv_mean": "kv_cache_usage"}
ENGINE_MAXIMA = {"running_max": "running", "queued_max": "queued"}


def _engine_series(run, buckets, levels):
    summed = _stored_attempts(run, EngineBucket.objects.filter(run=run), levels)
    t0, t1, width, per, _ = _summed_width(summed, buckets)
    if width is None:
        return _engine_series_of_samples(run, levels, buckets, t0, t1)
    origin = math.floor(t0 / width)
    series = Series(t0=t0, t1=t1, width=width * per, origin=origin * width)
    aggregates = {}
    for column in ENGINE_MEANS.values():
        aggregates |= {f"{column}_sum": Sum(f"{column}_sum"), f"{column}_n": Sum(f"{column}_n")}
    aggregates |= {name: Max(f"{column}_max") for name, column in ENGINE_MAXIMA.items()}
    names = ["bucket", "t", *ENGINE_MEANS, *ENGINE_MAXIMA]
    group = {name: [] for name in names}
    for shown, t_sum, n, *sums in _summed_rows(summed, width, per, origin, [], aggregates):
        group["bucket"].append(shown)
        group["t"].append(t_sum / n)
        for i, name in enumerate(ENGINE_MEANS):
            total, count = sums[2 * i : 2 * i + 2]
            group[name].append(total / count if count else None)
        for i, name in enumerate(ENGINE_MAXIMA):
            group[name].append(sums[2 * len(ENGINE_MEANS) + i])
        series.count += n
    if group["bucket"]:
        series.groups[None] = group
    return series


def _engine_series_of_samples(run, levels, buckets, t0, t1):
    """engine_series read from the raw samples taken from t0 to t1 (UTC epoch s)."""
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
        t0,
        t1,
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
