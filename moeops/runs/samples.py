"""What a run samples as it goes: GPU telemetry (of sweeps and kernel tunes) and the engine's
/metrics, the batches they arrive in, and the buckets that charts read (runs.rollup)."""

from django.db import models

from moeops.keyed import BODY_SHA256_HELP
from moeops.runs import rollup

# A sweep delivered again after its worker died resumes where it was: its levels and samples
# carry the delivery that took them, so a level it ran twice keeps each attempt's samples apart.
ATTEMPT_HELP = "The sweep's delivery that took it: 1, then 2, … after each resume"


# Telemetry belongs to a sweep run or to a kernel tuning run, never to both or neither.
ONE_OWNER = models.Q(run__isnull=False, tuning_run__isnull=True) | models.Q(
    run__isnull=True, tuning_run__isnull=False
)


def _run_or_tune(related_name):
    """The two owners a telemetry row may have (ONE_OWNER): (run, tuning_run) foreign keys."""
    return (
        models.ForeignKey(
            "runs.SweepRun", models.CASCADE, null=True, blank=True, related_name=related_name
        ),
        models.ForeignKey(
            "kernels.TuningRun", models.CASCADE, null=True, blank=True, related_name=related_name
        ),
    )


class TelemetryBatch(models.Model):
    """A client-chosen batch id, so that a resent telemetry batch is stored once."""

    run, tuning_run = _run_or_tune("telemetry_batches")
    batch_id = models.CharField(max_length=100)
    kind = models.CharField(max_length=20, default="gpu")
    count = models.PositiveIntegerField(default=0)
    body_sha256 = models.CharField(max_length=64, blank=True, help_text=BODY_SHA256_HELP)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "kind", "batch_id"], name="telemetry_batch_unique"
            ),
            models.UniqueConstraint(
                fields=["tuning_run", "kind", "batch_id"], name="telemetry_batch_tuning_unique"
            ),
            models.CheckConstraint(condition=ONE_OWNER, name="telemetry_batch_one_owner"),
        ]

    def __str__(self):
        return f"{self.kind} batch {self.batch_id}"


class TelemetrySample(models.Model):
    """One NVML reading of one GPU (1 Hz by default) during a sweep or a kernel tune; raw
    samples are kept, charts downsample."""

    run, tuning_run = _run_or_tune("telemetry")
    gpu_index = models.PositiveSmallIntegerField()
    ts = models.FloatField(help_text="UTC epoch s")
    level_concurrency = models.PositiveIntegerField(null=True, blank=True)
    gpu_util = models.FloatField(null=True, blank=True, help_text="%")
    mem_util = models.FloatField(null=True, blank=True, help_text="%")
    power_w = models.FloatField(null=True, blank=True)
    power_limit_w = models.FloatField(null=True, blank=True)
    mem_used_mib = models.FloatField(null=True, blank=True)
    mem_total_mib = models.FloatField(null=True, blank=True)
    sm_clock_mhz = models.FloatField(null=True, blank=True)
    temperature_c = models.FloatField(null=True, blank=True)
    attempt = models.PositiveSmallIntegerField(default=1, help_text=ATTEMPT_HELP)

    class Meta:
        indexes = [
            # run page charts read one run's samples in time order
            models.Index(fields=["run", "ts"], name="telemetry_run_ts"),
            # tuning-run page charts read one tune's samples in time order
            models.Index(fields=["tuning_run", "ts"], name="telemetry_tuning_ts"),
        ]
        constraints = [
            models.CheckConstraint(condition=ONE_OWNER, name="telemetry_sample_one_owner")
        ]

    def __str__(self):
        return f"GPU{self.gpu_index} @ {self.ts:.1f}"


class EngineSample(models.Model):
    """One scrape of the engine's /metrics during a run."""

    run = models.ForeignKey("runs.SweepRun", models.CASCADE, related_name="engine_samples")
    ts = models.FloatField(help_text="UTC epoch s")
    level_concurrency = models.PositiveIntegerField(null=True, blank=True)
    running = models.FloatField(null=True, blank=True)
    queued = models.FloatField(null=True, blank=True)
    kv_cache_usage = models.FloatField(null=True, blank=True, help_text="fraction 0–1")
    attempt = models.PositiveSmallIntegerField(default=1, help_text=ATTEMPT_HELP)

    class Meta:
        # run page charts read one run's samples in time order
        indexes = [models.Index(fields=["run", "ts"], name="engine_run_ts")]

    def __str__(self):
        return f"engine @ {self.ts:.1f}"


class SampleBucket(models.Model):
    """What a bucket of a run's samples sums to: the samples of one owner (and GPU) whose time
    falls in [bucket · width, (bucket + 1) · width) s, of one tagged level and attempt, kept as
    samples are stored (runs.rollup) so that a chart reads a bounded number of rows whatever
    the run's length. Raw samples stay stored; `<field>_n` counts the samples with a value."""

    width = models.PositiveIntegerField(help_text="s")
    bucket = models.BigIntegerField(help_text="floor(ts / width)")
    level_concurrency = models.PositiveIntegerField(null=True, blank=True)
    attempt = models.PositiveSmallIntegerField(default=1, help_text=ATTEMPT_HELP)
    n = models.PositiveIntegerField(default=0)
    ts_sum = models.FloatField(default=0.0)
    ts_min = models.FloatField(help_text="UTC epoch s")
    ts_max = models.FloatField(help_text="UTC epoch s")

    class Meta:
        abstract = True


def _summed(name):
    """An abstract SampleBucket with the columns that rollup.SPECS names for the bucket model
    `name`: each summed field's sum, count, least and greatest value, and the greatest value
    of the fields of which only that is kept."""
    summed, highest, _ = rollup.SPECS[name]
    columns = {}
    for field in summed:
        columns |= {
            f"{field}_sum": models.FloatField(null=True),
            f"{field}_n": models.PositiveIntegerField(default=0),
            f"{field}_min": models.FloatField(null=True),
            f"{field}_max": models.FloatField(null=True),
        }
    columns |= {f"{field}_max": models.FloatField(null=True) for field in highest}
    meta = type("Meta", (), {"abstract": True})
    return type(f"{name}Sums", (SampleBucket,), {"__module__": __name__, "Meta": meta, **columns})


class TelemetryBucket(_summed("TelemetryBucket")):
    """GPU samples (TelemetrySample) of one GPU summed over a bucket, at each of
    rollup.WIDTHS."""

    run, tuning_run = _run_or_tune("telemetry_buckets")
    gpu_index = models.PositiveSmallIntegerField()

    class Meta:
        indexes = [
            # run page charts read one run's buckets of one width in time order
            models.Index(fields=["run", "width", "bucket"], name="telemetry_bucket_run"),
            # tuning-run page charts read one tune's buckets of one width
            models.Index(fields=["tuning_run", "width", "bucket"], name="telemetry_bucket_tuning"),
        ]
        constraints = [
            models.CheckConstraint(condition=ONE_OWNER, name="telemetry_bucket_one_owner")
        ]

    def __str__(self):
        return f"GPU{self.gpu_index} {self.width} s bucket {self.bucket}"


class EngineBucket(_summed("EngineBucket")):
    """Engine samples (EngineSample) summed over a bucket, at each of rollup.WIDTHS."""

    run = models.ForeignKey("runs.SweepRun", models.CASCADE, related_name="engine_buckets")

    class Meta:
        # run page charts read one run's buckets of one width in time order
        indexes = [models.Index(fields=["run", "width", "bucket"], name="engine_bucket_run")]

    def __str__(self):
        return f"engine {self.width} s bucket {self.bucket}"
