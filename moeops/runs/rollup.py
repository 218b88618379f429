"""Sums of a run's samples per time bucket (TelemetryBucket, EngineBucket), kept as samples are
stored: a chart of a 24 h run reads a few thousand of them instead of 691,200 raw samples,
which stay stored for whatever needs each one.

A bucket is one owner's (and one GPU's) samples of one tagged level and attempt whose time
falls in [bucket · width, (bucket + 1) · width) s, at each width of WIDTHS; it holds their
count, the sum, least and greatest of their times, and for each field the sum, count, least
and greatest of its values. Buckets are added to under the owner's row lock, in the
transaction that stores the samples' batch, so a batch sent again (stored once,
runs.services) is summed once and two batches of one run at once do not lose each other's.
The functions take the bucket and sample models so that a migration can run them.
"""

import math

from django.db import connection
from django.db.models import Count, F, Max, Min, Q, Sum, Value
from django.db.models.functions import Floor

# s; a chart of a run of span S reads the widest width w with S ≥ BUCKETS · w (front.series),
# e.g. 10 s buckets for 2 h, 120 s for 24 h, 1800 s for a week
WIDTHS = (10, 120, 1800)

# (fields summed, fields of which only the greatest is kept, whether buckets are per GPU)
SPECS = {
    "TelemetryBucket": (
        ("gpu_util", "power_w", "mem_used_mib", "sm_clock_mhz"),
        ("power_limit_w", "mem_total_mib"),
        True,
    ),
    "EngineBucket": (("running", "queued", "kv_cache_usage"), (), False),
}


def _spec(bucket_model):
    return SPECS[bucket_model.__name__]


def _key_names(bucket_model):
    per_gpu = _spec(bucket_model)[2]
    return ("width", "bucket", *(("gpu_index",) if per_gpu else ()), "level_concurrency", "attempt")


def _empty(fields, highest):
    sums = {"n": 0, "ts_sum": 0.0, "ts_min": None, "ts_max": None}
    for name in fields:
        sums |= {f"{name}_sum": None, f"{name}_n": 0, f"{name}_min": None, f"{name}_max": None}
    return sums | {f"{name}_max": None for name in highest}


def _least(a, b):
    return b if a is None else a if b is None else min(a, b)


def _most(a, b):
    return b if a is None else a if b is None else max(a, b)


def _merge(into, sums, fields, highest):
    """Adds `sums` (a bucket's, as _empty lays them out) to `into`."""
    into["n"] += sums["n"]
    into["ts_sum"] += sums["ts_sum"]
    into["ts_min"] = _least(into["ts_min"], sums["ts_min"])
    into["ts_max"] = _most(into["ts_max"], sums["ts_max"])
    for name in fields:
        if sums[f"{name}_n"]:
            into[f"{name}_sum"] = (into[f"{name}_sum"] or 0.0) + sums[f"{name}_sum"]
            into[f"{name}_n"] += sums[f"{name}_n"]
            into[f"{name}_min"] = _least(into[f"{name}_min"], sums[f"{name}_min"])
            into[f"{name}_max"] = _most(into[f"{name}_max"], sums[f"{name}_max"])
    for name in highest:
        into[f"{name}_max"] = _most(into[f"{name}_max"], sums[f"{name}_max"])


def _of_samples(samples, fields, highest):
    """The sums of samples (dicts of the sample model's fields), as _empty lays them out."""
    times = [sample["ts"] for sample in samples]
    sums = {"n": len(times), "ts_sum": sum(times), "ts_min": min(times), "ts_max": max(times)}
    for name in fields:
        values = [value for sample in samples if (value := sample.get(name)) is not None]
        sums |= {
            f"{name}_sum": sum(values) if values else None,
            f"{name}_n": len(values),
            f"{name}_min": min(values, default=None),
            f"{name}_max": max(values, default=None),
        }
    for name in highest:
        values = [value for sample in samples if (value := sample.get(name)) is not None]
        sums[f"{name}_max"] = max(values, default=None)
    return sums


def buckets_add(bucket_model, *, owner_field, owner_id, samples):
    """Adds samples (dicts of the sample model's fields) to the owner's buckets at every width.
    The caller holds the owner's row lock inside the transaction that stores the samples.
    owner_field: "run" or "tuning_run"."""
    fields, highest, per_gpu = _spec(bucket_model)
    grouped = {}
    for sample in samples:
        ts = sample["ts"]
        rest = (
            *((sample["gpu_index"],) if per_gpu else ()),
            sample.get("level_concurrency"),
            sample.get("attempt") or 1,
        )
        for width in WIDTHS:
            grouped.setdefault((width, math.floor(ts / width), *rest), []).append(sample)
    if not grouped:
        return
    added = {key: _of_samples(group, fields, highest) for key, group in grouped.items()}
    names = _key_names(bucket_model)
    span = Q()
    for width in WIDTHS:
        buckets = [key[1] for key in added if key[0] == width]
        span |= Q(width=width, bucket__gte=min(buckets), bucket__lte=max(buckets))
    owner = {f"{owner_field}_id": owner_id}
    stale = []
    for row in bucket_model.objects.filter(span, **owner).values():
        key = tuple(row[name] for name in names)
        sums = added.get(key)
        if sums is not None:
            stored = {name: row[name] for name in sums}
            _merge(stored, sums, fields, highest)
            added[key] = stored
            stale.append(row["id"])
    if stale:
        bucket_model.objects.filter(id__in=stale).delete()
    _insert(bucket_model, owner, names, added)


def _insert(bucket_model, owner, names, added):
    """Inserts the rows {key: sums} in one statement: model instances would cost more than
    the samples' own insert."""
    ((owner_column, owner_id),) = owner.items()
    sums = list(_empty(*_spec(bucket_model)[:2]))
    columns = [owner_column, *names, *sums]
    rows = [(owner_id, *key, *(value[name] for name in sums)) for key, value in added.items()]
    table = connection.ops.quote_name(bucket_model._meta.db_table)
    quoted = ", ".join(connection.ops.quote_name(column) for column in columns)
    marks = ", ".join(["%s"] * len(columns))
    with connection.cursor() as cursor:
        cursor.executemany(f"INSERT INTO {table} ({quoted}) VALUES ({marks})", rows)


def buckets_rebuild(bucket_model, sample_model, *, owner_field, owner_id):
    """Replaces the owner's buckets with sums of its stored samples, one GROUP BY per width:
    the backfill of samples stored before buckets were kept, or behind the services' back."""
    fields, highest, per_gpu = _spec(bucket_model)
    owner = {f"{owner_field}_id": owner_id}
    bucket_model.objects.filter(**owner).delete()
    keys = [name for name in _key_names(bucket_model) if name != "width"]
    sums = {"n": Count("id"), "ts_sum": Sum("ts"), "ts_min": Min("ts"), "ts_max": Max("ts")}
    for name in fields:
        sums |= {
            f"{name}_sum": Sum(name),
            f"{name}_n": Count(name),
            f"{name}_min": Min(name),
            f"{name}_max": Max(name),
        }
    sums |= {f"{name}_max": Max(name) for name in highest}
    for width in WIDTHS:
        rows = (
            sample_model.objects.filter(**owner)
            .annotate(bucket=Floor(F("ts") / Value(float(width))))
            .values(*keys)
            .annotate(**sums)
            .order_by()
        )
        bucket_model.objects.bulk_create(
            [
                bucket_model(**owner, width=width, **row | {"bucket": int(row["bucket"])})
                for row in rows
            ],
            batch_size=5000,
        )
