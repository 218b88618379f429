"""Sweeps: a run over concurrency levels, its per-level results and request logs, and the
workloads it sends. The samples taken during a run are in moeops.runs.samples."""

import functools
import hashlib
import json
import uuid
import zlib
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from django.db import models
from django.db.models import Avg, Case, CharField, Q, Value, When
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce
from django.utils import timezone

from domain import engine as engine_reports
from domain import engine_counters, request_log
from domain import workloads as workload_specs
from domain.failures import describe_failure
from domain.intervals import ROUND_KEYS
from domain.jobs import JOB_STATUSES
from domain.numbers import is_integer
from domain.progress import HEARTBEAT_STALE_S, SweepProgress, attempt_of
from domain.snapshot import RunSnapshot
from domain.storable import MAX_INT
from domain.wire.levels import METRIC_TYPES
from domain.wire.runs import TELEMETRY_STATUSES
from moeops import subqueries
from moeops.jobs import Job
from moeops.keyed import BODY_SHA256_HELP
from moeops.runs.keys import KERNEL_STATES_IN_EFFECT, kernel_state

# a profiled level's model lives in its own module; imported here so that Django finds it
from moeops.runs.profiles import LevelProfile as LevelProfile

# Django registers an app's models from its models module: this import registers the samples and
# buckets, whose attempt column the levels share.
from moeops.runs.samples import ATTEMPT_HELP

RUN_SOURCES = (("worker", "Worker sweep"), ("import", "Imported file"), ("manual", "Manual entry"))


# kernel_state() == "tuned" as a filter on SweepRun.
TUNED_KERNEL = Q(snapshot__kernel_config__state="file", snapshot__kernel_config__shipped=False) | (
    (
        Q(snapshot__kernel_config__state__isnull=True)
        | ~Q(snapshot__kernel_config__state__in=KERNEL_STATES_IN_EFFECT)
    )
    & (Q(kernel_config__isnull=False) | Q(parameters__moe_kernel="tuned"))
)

# SweepRun.is_standin as a filter: the stand-in engine (a test double) answered the run.
STANDIN = Q(snapshot__engine__engine="standin")


def without_standin(runs):
    """A SweepRun queryset less the stand-in's runs (STANDIN): the engine's name as text, ""
    where the snapshot names none, as NOT over a JSON key that a run lacks is NULL and would
    drop that run too; not a subquery of STANDIN's runs, dearer to compile than to run."""
    named = Coalesce(KT("snapshot__engine__engine"), Value(""), output_field=models.TextField())
    return runs.alias(engine_named=named).exclude(engine_named="standin")


# The runs that do not stand for what their deployment serves: an imported file confirmed
# across a mismatch (another model, TP, GPU count or engine: file.mismatch, or other_model in
# files imported before it was kept) and a bisection's tries (the engine ran another recipe).
ASIDE = (
    Q(snapshot__file__other_model__isnull=False)
    | Q(snapshot__file__mismatch__isnull=False)
    | Q(actions_after__kind="bisect")
)


def of_the_deployment(runs):
    """A SweepRun queryset less the runs ASIDE: what a deployment's estimates, headlines,
    charts, comparisons and findings may read (a subquery, as without_standin)."""
    return runs.exclude(pk__in=SweepRun.objects.filter(ASIDE).values("pk"))


@dataclass(frozen=True)
class WorkerLoss:
    """A running sweep whose worker stopped sending its progress heartbeat (decision 54).

    silent_s: s since its last heartbeat; back: the host's worker has reported since (alive, and
    not sweeping it: a restarted worker), so the reaper sends the sweep to it again; resent_at:
    when the reaper did, for this loss (epoch s, else None); fails_at: when the reaper fails the
    run unless a worker takes it (epoch s)."""

    silent_s: float
    back: bool
    resent_at: float | None
    fails_at: float


@functools.cache
def _summary():
    """with_summary's annotations, written out as SQL (moeops.subqueries): as Subqueries of an
    OuterRef, resolving and compiling them took more of a run list's CPU than running them."""
    run = subqueries.column(SweepRun, "id")
    return {
        "level_count": subqueries.counted(LevelResult, "run", run),
        "peak": subqueries.largest(LevelResult, "output_throughput", "run", run),
    }


class SweepRunQuerySet(models.QuerySet):
    def with_summary(self):
        """Each run with .peak (its best level's output tok/s; None without levels) and
        .level_count: the one rule for a run's summary, on every page and in the API.

        Correlated subqueries rather than a GROUP BY over every column (progress and parameters
        are large JSON), which would also drop the model's ordering."""
        return self.annotate(**_summary())

    def with_peak(self):
        """Each run with with_summary's .peak alone, for a page that shows no level counts."""
        return self.annotate(peak=_summary()["peak"])


def summarized(runs):
    """The runs (SweepRuns whose levels are prefetched, with output_throughput) with
    SweepRunQuerySet.with_summary's .peak and .level_count counted from those levels: the same
    rule for a page that reads every level of its runs anyway, without two subqueries a run.
    A list."""
    runs = list(runs)
    for run in runs:
        levels = run.levels.all()
        run.level_count = len(levels)
        run.peak = max(
            (level.output_throughput for level in levels if level.output_throughput is not None),
            default=None,
        )
    return runs


class SweepRun(Job, models.Model):
    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    body_sha256 = models.CharField(max_length=64, blank=True, help_text=BODY_SHA256_HELP)
    deployment = models.ForeignKey("fleet.Deployment", models.CASCADE, related_name="runs")
    label = models.CharField(max_length=200, blank=True)
    parameters = models.JSONField(
        default=dict,
        blank=True,
        help_text="levels, input_len, output_len, prompts_per_level, warmup, endpoint, …",
    )
    status = models.CharField(max_length=20, choices=JOB_STATUSES, default="queued")
    source = models.CharField(max_length=20, choices=RUN_SOURCES, default="worker")
    progress = models.JSONField(
        default=dict, blank=True, help_text="level_index, levels_total, requests_done, …"
    )
    kernel_config = models.ForeignKey(
        "kernels.KernelConfig", models.SET_NULL, null=True, blank=True, related_name="runs"
    )
    topology_snapshot = models.ForeignKey(
        "fleet.TopologySnapshot", models.SET_NULL, null=True, blank=True, related_name="runs"
    )
    telemetry_status = models.CharField(
        max_length=20, choices=TELEMETRY_STATUSES, default="pending"
    )
    telemetry_detail = models.CharField(max_length=300, blank=True)
    error = models.TextField(blank=True)
    cancel_requested = models.BooleanField(default=False)
    provenance = models.CharField(max_length=300, blank=True)
    snapshot = models.JSONField(
        default=dict,
        blank=True,
        help_text="What the run measured, recorded once (moeops.runs.snapshots): the engine and "
        "version that answered, its arguments, the kernel config in effect, topology, load",
    )
    capacity = models.JSONField(
        null=True,
        blank=True,
        help_text="A capacity search's answer, stored when it ends (moeops.runs.capacity)",
    )
    created = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = SweepRunQuerySet.as_manager()

    class Meta:
        ordering = ["-created", "-id"]
        # deployment page: the runs of one deployment, newest first
        indexes = [models.Index(fields=["deployment", "-created"], name="run_deployment_created")]

    def __str__(self):
        return self.label or str(self.uuid)

    @property
    def is_capacity_search(self):
        """Whether the run is an SLO capacity search (parameters kind "capacity")."""
        return (self.parameters or {}).get("kind") == "capacity"

    def display_label(self):
        return self.label or f"run {str(self.uuid)[:8]}"

    def recorded(self):
        """The run's snapshot, typed (domain.snapshot.RunSnapshot): read once for each snapshot
        the run holds, as a run list asks each run's badges, engine and model of it. A copy of
        the whole snapshot is kept to compare, so that a part changed in place since, however
        deep, is read anew."""
        snapshot, read = self.snapshot, self.__dict__.get("_recorded")
        if read is None or read[0] != snapshot:
            # a JSON field's value: a JSON round trip copies it whole, faster than deepcopy
            kept = json.loads(json.dumps(snapshot))
            read = self.__dict__["_recorded"] = (kept, RunSnapshot.read(snapshot))
        return read[1]

    @property
    def observed_engine(self):
        """What the engine said of itself when the sweep started (engine_info), or {}."""
        return self.recorded().engine

    @property
    def is_standin(self):
        """Whether the stand-in engine (a test double) answered: its numbers are not real."""
        return self.observed_engine.get("engine") == "standin"

    @property
    def other_model(self):
        """The model an imported file measured where it is not the deployment's, else None."""
        return self.recorded().other_model

    def origin(self):
        """(badge, title) of where the run's numbers come from: "imported" (title: its file),
        "write-up" (the example data), "stand-in" (a test double answered), "measured" (a
        worker's sweep) or "entered" (by hand); ("", "") for a sweep in flight whose engine is
        not read yet."""
        snapshot = self.recorded()
        if self.source == "import":
            name = (snapshot.file and snapshot.file.file_name) or "a result file"
            other = f"; it measured {snapshot.other_model}" if snapshot.other_model else ""
            return "imported", f"imported from {name}{other}"
        if snapshot.source == "write-up":
            return "write-up", self.provenance
        if self.is_standin:
            return "stand-in", "from the stand-in engine, a test double"
        if self.source == "manual":
            return "entered", "entered by hand"
        if not snapshot.engine and self.status in ("queued", "running"):
            # which engine answers (a real one or the stand-in) is read as the sweep starts
            return "", ""
        return "measured", "swept by a moeops worker"

    def worker_loss(self, now=None):
        """A WorkerLoss when the run's worker is lost mid-sweep, else None: the one rule of the
        reaper's resend (run_resend_orphaned) and of what the run page says will happen. Reads
        the host only for a lost run."""
        if self.status != "running" or self.source != "worker":
            return None
        progress = SweepProgress.read(self.progress)
        beat = progress.heartbeat
        epoch = (now or timezone.now()).timestamp()
        if beat is None or epoch - beat <= HEARTBEAT_STALE_S:
            # a sweep that never sent one is the reaper's to fail: nothing to take back
            return None
        host = self.deployment.host
        back = host.worker_alive(now) and host.worker_seen_at.timestamp() - beat > HEARTBEAT_STALE_S
        resent = progress.resent_at
        resent = resent if resent is not None and resent > beat else None
        return WorkerLoss(
            silent_s=epoch - beat,
            back=back,
            resent_at=resent,
            # run_fail_stale: MOEOPS_RUN_STALE_S after the last heartbeat, or after the resend
            fails_at=max(beat, resent or beat) + settings.MOEOPS_RUN_STALE_S,
        )

    def stands_aside(self):
        """Whether the run feeds none of its deployment's headlines, charts, comparisons or
        findings (ASIDE); one query."""
        return SweepRun.objects.filter(ASIDE, pk=self.pk).exists()

    def model_name(self):
        """The model the run measured: an imported file's own where it is not the deployment's."""
        return self.other_model or self.deployment.model.name

    @property
    def stated_gpu_count(self):
        """The GPUs an imported file says its engine ran on (SGLang's server_info), or None."""
        return self.recorded().stated_gpu_count

    def measured_gpu_count(self):
        """GPUs the run's per-GPU figures divide by: an imported file's the count it states
        (None where it states none: it was measured elsewhere), else the deployment's
        (Deployment.num_gpus)."""
        if self.source == "import":
            return self.stated_gpu_count
        return self.deployment.num_gpus()

    @property
    def engine_answered(self):
        """Whether the engine said which engine it is (the snapshot's "engine", not unknown)."""
        return self.observed_engine.get("engine") not in (None, "", "unknown")

    def engine_label(self):
        """ "vLLM 0.32.0" as the engine reported itself, else as the deployment recorded it;
        "unknown" for an imported file of another model that names no engine."""
        observed = self.observed_engine if self.engine_answered else {}
        recorded = self.recorded().deployment
        # the deployment's engine served its own model, not the one another model's file measured
        fallback = "unknown" if self.other_model else self.deployment.engine
        name = observed.get("engine") or recorded.get("engine") or fallback
        version = observed.get("version") or recorded.get("engine_version") or ""
        return engine_reports.label({"engine": name, "version": version})

    def reported_running_cap(self):
        """The running-request cap the engine reported at the start of the sweep, or None."""
        return engine_reports.reported_running_cap(self.observed_engine)

    def recorded_running_cap(self):
        """The deployment's running-request cap as the run recorded it at its start (its
        snapshot): the cap it ran under whatever the deployment says since. Where the run
        recorded none (a run before snapshots, or a cap first filled in after the sweep), the
        deployment's own."""
        recorded = self.recorded().deployment
        return recorded.get("max_running_requests") or self.deployment.max_running_requests

    def kernel_config_state(self):
        """ "tuned" or "default" from the kernel config in effect (snapshot) or on record."""
        return kernel_state(
            self.recorded().kernel_config,
            self.kernel_config_id,
            self.parameters.get("moe_kernel"),
        )

    def attempts(self, levels):
        """How many deliveries swept the run: 1, then 2, … after each resume. The attempt its
        progress is at (run_take_over sets it), or a later one that a stored level names (each
        push replaces the progress whole, and one without an attempt forgets it). levels: the
        run's LevelResults."""
        return max([attempt_of(self.progress), *(level.attempt for level in levels)])

    def samples_of_stored_attempts(self, samples, levels=None):
        """samples (a queryset of this run's engine or GPU samples) less those a cut-short
        attempt took of a level that a later attempt stored: a sweep delivered again after its
        worker died runs that level anew, and the dead attempt's samples of it stay stored
        (their `attempt` tells them apart) but describe no stored level. levels: the run's
        LevelResults where the caller has them (else they are read)."""
        stored = (
            [(level.concurrency, level.attempt) for level in levels]
            if levels is not None
            else self.levels.values_list("concurrency", "attempt")
        )
        if attempt_of(self.progress) == 1 and all(attempt == 1 for _, attempt in stored):
            # one delivery swept the run: no sample is of another attempt
            return samples
        superseded = Q()
        for concurrency, attempt in stored:
            superseded |= Q(level_concurrency=concurrency) & ~Q(attempt=attempt)
        return samples.exclude(superseded) if superseded else samples

    def of_samples(self, name, levels, compute):
        """compute(), the figure `name` of this run's samples and levels; read once per process
        when the run is finished: a finished run takes no more samples or levels
        (runs.services), so what is computed from them holds. The key holds what the
        samples' reading takes of each level (its window and attempt), which the admin may
        still edit."""
        if not self.is_finished:
            return compute()
        windows = [
            (level.key, level.concurrency, level.attempt, level.started_at, level.finished_at)
            for level in levels
        ]
        digest = hashlib.sha256(repr(windows).encode()).hexdigest()[:16]
        key = f"run-samples:{self.uuid}:{name}:{digest}"
        value = cache.get(key)
        if value is None:
            value = compute()
            cache.set(key, value, timeout=None)
        return value

    def logged_requests(self):
        """Every logged request of the run, level by level (by concurrency, then rate) and
        round by round: (its level's domain.request_log.LEVEL_KEYS as a dict, the request's dict).
        Reads one log at a time."""
        logs = (
            RequestLog.objects.filter(level__run=self)
            .select_related("level")
            .order_by("level__concurrency", "level__request_rate", "level__id", "round")
        )
        for log in logs.iterator(chunk_size=1):
            level = {
                "concurrency": log.level.concurrency,
                "request_rate": log.level.request_rate,
                "round": log.round,
            }
            for request in log.requests():
                yield level, request

    def peak_level(self):
        """The level of the highest output tok/s (one query), or None when none measured it."""
        measured = [level for level in self.levels.all() if level.output_throughput is not None]
        return max(measured, key=lambda level: level.output_throughput, default=None)

    def level_power(self, levels):
        """{level key: mean total power of the run's GPUs over the level (W)}: each GPU's mean
        NVML power over the level's window (its started_at–finished_at, else the samples the
        worker tagged with its concurrency), summed over the GPUs; levels without power
        samples are left out. One query, none again for a finished run (of_samples); levels:
        the run's LevelResults."""
        return self.of_samples(
            "level-power", levels, lambda: total_power(self._level_gpu_means(levels, "power_w"))
        )

    def level_gpu_util(self, levels):
        """{level key: mean GPU utilisation of the run's GPUs over the level (%)}: the mean
        over the GPUs of each one's mean over the level's window, as level_power reads it."""
        by_level = {}
        for (level, _), mean in self._level_gpu_means(levels, "gpu_util").items():
            by_level.setdefault(level, []).append(mean)
        return {level: sum(means) / len(means) for level, means in by_level.items()}

    def level_windows(self, levels):
        """The level key (a Case over samples) that each of the run's samples was taken in:
        the level whose started_at–finished_at holds its time, else whose concurrency the
        worker tagged it with; NULL for none. None when no level has either."""
        whens = []
        for level in levels:
            if level.started_at is not None and level.finished_at is not None:
                window = Q(ts__gte=level.started_at, ts__lte=level.finished_at)
            elif level.concurrency is not None:
                window = Q(level_concurrency=level.concurrency)
            else:
                continue
            whens.append(When(window, then=Value(level.key)))
        return Case(*whens, output_field=CharField()) if whens else None

    def _level_gpu_means(self, levels, field):
        """{(level key, GPU index): the GPU's mean `field` over the level's window}, one query."""
        level = self.level_windows(levels)
        if level is None:
            return {}
        samples = self.samples_of_stored_attempts(
            self.telemetry.filter(**{f"{field}__isnull": False}), levels
        )
        rows = (
            samples.annotate(level=level)
            .filter(level__isnull=False)
            .values("level", "gpu_index")
            .annotate(mean=Avg(field))
            .order_by()
        )
        return {(row["level"], row["gpu_index"]): row["mean"] for row in rows}


def total_power(means):
    """{level key: total power of the GPUs (W)} from {(level key, GPU index): the GPU's mean
    power over the level (W)}."""
    totals = {}
    for (level, _), mean in means.items():
        totals[level] = totals.get(level, 0.0) + mean
    return totals


def _metric_column(metric):
    """The column of a level metric (domain.wire.levels.MetricType): a count in an integer
    column wide enough for its bound, a figure in a float column; null where the wire allows it."""
    if not metric.integer:
        column = models.FloatField
    elif metric.maximum is not None and metric.maximum <= MAX_INT:
        column = models.PositiveIntegerField
    else:
        column = models.BigIntegerField
    options = {"null": True, "blank": True} if metric.nullable else {"default": metric.default}
    if metric.description:
        options["help_text"] = metric.description
    return column(**options)


# A column per level metric, as the wire's model has them (domain.wire.levels.LevelMetrics): a
# new metric is a field there and a migration here.
LevelMetricColumns = type(
    "LevelMetricColumns",
    (models.Model,),
    {
        "__module__": __name__,
        "__doc__": "A level's metrics, one column each (docs/metrics.md; vLLM key names).",
        "Meta": type("Meta", (), {"abstract": True}),
        **{key: _metric_column(metric) for key, metric in METRIC_TYPES.items()},
    },
)


# What a page that draws its runs' levels against load reads of each (the deployment page,
# compare): a level has some 60 columns.
LEVEL_LOAD_FIELDS = (
    "run_id",
    "concurrency",
    "request_rate",
    "achieved_request_rate",
    "output_throughput",
    "median_tpot_ms",
)


class LevelResult(LevelMetricColumns):
    """One concurrency level of a sweep, with every metric of docs/metrics.md (vLLM key names)."""

    run = models.ForeignKey(SweepRun, models.CASCADE, related_name="levels")
    key = models.CharField(max_length=60, help_text="level_key(concurrency, request_rate)")
    concurrency = models.PositiveIntegerField(null=True, blank=True)
    request_rate = models.FloatField(null=True, blank=True, help_text="req/s; empty = unlimited")
    input_len = models.PositiveIntegerField(null=True, blank=True)
    output_len = models.PositiveIntegerField(null=True, blank=True)
    errors = models.JSONField(default=dict, blank=True, help_text="failure reason → count")
    usage_reported = models.BooleanField(
        null=True, blank=True, help_text="Token counts came from the server's usage"
    )
    started_at = models.FloatField(null=True, blank=True, help_text="UTC epoch s")
    finished_at = models.FloatField(null=True, blank=True, help_text="UTC epoch s")
    attempt = models.PositiveSmallIntegerField(default=1, help_text=ATTEMPT_HELP)
    raw = models.JSONField(
        null=True, blank=True, help_text="The original result object, unknown keys included"
    )
    round_count = models.PositiveSmallIntegerField(
        default=1, help_text="Rounds the figures are of (LevelRound); 1: the level ran once"
    )
    intervals = models.JSONField(
        default=dict,
        blank=True,
        help_text="95 % interval [low, high] over the rounds per figure (domain.intervals)",
    )
    body_sha256 = models.CharField(max_length=64, blank=True, help_text=BODY_SHA256_HELP)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "concurrency", "request_rate", "id"]
        constraints = [
            # idempotent ingestion: one level per (run, concurrency, request rate)
            models.UniqueConstraint(fields=["run", "key"], name="level_unique_run_key")
        ]

    def __str__(self):
        return f"{self.run} {self.key}"

    def all_failed_with(self):
        """ "HTTP 400: <the engine's message>" when every request of the level failed for one
        reason (the load generator's verdict, else read from the stored counts), else None."""
        if self.completed or not self.failed:
            return None
        raw = self.raw if isinstance(self.raw, dict) else {}
        verdict = raw.get("all_failed_with")
        if isinstance(verdict, str) and verdict:
            return verdict
        if len(self.errors or {}) != 1:
            return None
        (reason,) = self.errors
        samples = raw.get("error_samples") if isinstance(raw.get("error_samples"), dict) else {}
        return describe_failure(reason, samples.get(reason))

    @property
    def is_partial(self):
        """Whether the sweep stopped inside this level (cancelled, out of time): it holds the
        requests that finished before the stop, fewer than the level was to send."""
        raw = self.raw if isinstance(self.raw, dict) else {}
        return bool(raw.get("stopped"))

    def requests_planned(self):
        """How many measured requests the level was to send, or None when not recorded."""
        raw = self.raw if isinstance(self.raw, dict) else {}
        planned = raw.get("num_prompts")
        return planned if is_integer(planned) else None

    def engine_figures(self):
        """What the level did to the engine, from its /metrics counters over all its rounds
        (domain.engine_counters.figures: prefix-cache hit rate, preemptions, speculative
        acceptance, the engine's token counts against the client's); {} when the worker read
        no counters (an imported level, an engine without /metrics). Prefetch `rounds`."""
        rounds = self.stored_rounds()
        raws = [r.raw if isinstance(r.raw, dict) else {} for r in rounds]
        counters = engine_counters.summed([raw.get("engine_counters") for raw in raws])
        if not counters:
            return {}
        client = {}
        for key, column in (
            ("input_tokens", "total_input_tokens"),
            ("output_tokens", "total_output_tokens"),
        ):
            # the engine counts the warm-up too
            counts = [
                None
                if r.figures.get(column) is None
                else r.figures[column] + ((raw.get("warmup_tokens") or {}).get(key) or 0)
                for r, raw in zip(rounds, raws, strict=True)
            ]
            client[key] = None if None in counts else sum(counts)
        return {
            "engine": counters["engine"],
            **engine_counters.figures(
                counters,
                client_input_tokens=client["input_tokens"],
                client_output_tokens=client["output_tokens"],
            ),
        }

    def throughput_per_gpu(self, num_gpus):
        """Output tok/s per GPU."""
        if self.output_throughput is None or not num_gpus:
            return None
        return self.output_throughput / num_gpus

    @property
    def interactivity(self):
        """Tokens per second one user sees: 1000 / median TPOT (ms)."""
        if not self.median_tpot_ms:
            return None
        return 1000.0 / self.median_tpot_ms

    def own_round(self):
        """The level as its own round 1 (unsaved LevelRound): a level stored before rounds
        were, or imported, which has no LevelRound."""
        return LevelRound(
            level=self,
            round=1,
            figures={key: getattr(self, key) for key in ROUND_KEYS},
            raw=self.raw,
            attempt=self.attempt,
            body_sha256=self.body_sha256,
        )

    def stored_rounds(self):
        """The level's rounds in order (prefetch `rounds` to read them in one query); a level
        without LevelRounds is its own one round."""
        return list(self.rounds.all()) or [self.own_round()]

    def interval(self, key):
        """(low, high) of the figure `key` over the level's rounds (domain.intervals), or None:
        one round has none."""
        interval = (self.intervals or {}).get(key)
        return tuple(interval) if interval else None


class LevelRound(models.Model):
    """One round of a level that ran several times in a row, with its own figures; the level
    (LevelResult) holds their median and interval. A level stored before rounds, or imported,
    has none: it is its own one round."""

    level = models.ForeignKey(LevelResult, models.CASCADE, related_name="rounds")
    round = models.PositiveSmallIntegerField(help_text="1, 2, … in the order the level ran them")
    figures = models.JSONField(help_text="The round's LevelResult fields, raw aside")
    raw = models.JSONField(null=True, blank=True, help_text="The round's original result")
    attempt = models.PositiveSmallIntegerField(default=1, help_text=ATTEMPT_HELP)
    body_sha256 = models.CharField(max_length=64, help_text=BODY_SHA256_HELP)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["level", "round"]
        constraints = [
            # idempotent ingestion: one body per (level, round)
            models.UniqueConstraint(fields=["level", "round"], name="level_round_unique")
        ]

    def __str__(self):
        return f"{self.level} round {self.round}"

    def as_level(self):
        """The round as an unsaved LevelResult of its figures, read as a level is read."""
        figures = {key: self.figures.get(key) for key in ROUND_KEYS}
        figures["failed"] = figures["failed"] or 0
        figures["errors"] = figures["errors"] or {}
        return LevelResult(
            run_id=self.level.run_id,
            key=self.level.key,
            raw=self.raw,
            attempt=self.attempt,
            **figures,
        )


class RequestLog(models.Model):
    """Every request of one round of a level (domain.request_log: send time, TTFT, ITLs, E2E,
    tokens, status, error), packed: JSON columns, zlib-compressed. docs/decisions.md says why
    packed and where the ITLs are capped."""

    level = models.ForeignKey(LevelResult, models.CASCADE, related_name="request_logs")
    round = models.PositiveSmallIntegerField(default=1, help_text="the level's round: 1, 2, …")
    count = models.PositiveIntegerField(help_text="requests in the log")
    itl_dropped = models.PositiveIntegerField(
        default=0, help_text="requests that kept no ITLs: past the cap on a level's ITL values"
    )
    data = models.BinaryField(help_text="zlib of the JSON columns (domain.request_log)")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["level", "round"]
        constraints = [
            # one log per round of a level; a repeated push stores it once
            models.UniqueConstraint(fields=["level", "round"], name="request_log_unique")
        ]

    def __str__(self):
        return f"{self.level} round {self.round}: {self.count} requests"

    def requests(self):
        """The logged requests, one dict each (domain.request_log.REQUEST_KEYS)."""
        columns = json.loads(zlib.decompress(bytes(self.data)))
        return request_log.rows(columns)


WORKLOAD_KINDS = (
    ("random", "Random token ids"),
    ("dataset", "Dataset of conversations or prompts"),
    ("shared_prefix", "Shared prefix"),
    ("multi_turn", "Multi-turn conversations"),
    ("trace", "Timestamped trace (Mooncake)"),
)


class Workload(models.Model):
    """What a sweep sends: one version of a named workload (domain.workloads' spec, and for a
    dataset the uploaded file's compact form and SHA-256). Versions are kept: a run records the
    version it sent."""

    name = models.CharField(max_length=100)
    version = models.PositiveIntegerField(default=1, editable=False)
    kind = models.CharField(max_length=20, choices=WORKLOAD_KINDS)
    spec = models.JSONField(help_text="domain.workloads' spec: lengths in tokens, think time s")
    description = models.CharField(max_length=300, blank=True)
    file_name = models.CharField(max_length=300, blank=True)
    sha256 = models.CharField(max_length=64, blank=True, help_text="the uploaded file's")
    layout = models.CharField(
        max_length=20,
        blank=True,
        help_text="sharegpt, messages, mtbench, prompts, mooncake, mooncake_csv",
    )
    items = models.JSONField(
        null=True, blank=True, editable=False, help_text='[{"prompt", "answer"}] of the file'
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["name", "version"], name="workload_unique_version")
        ]

    def __str__(self):
        return f"{self.name} v{self.version}"

    @property
    def item_count(self):
        return len(self.items or [])

    def input_from_trace(self):
        """A trace's own input lengths, which set every request's: {"requests", "mean_tokens"};
        None for any other workload (the sweep's input length is sent)."""
        if self.kind != "trace" or not self.items:
            return None
        inputs = [item["input_length"] for item in self.items]
        return {"requests": len(inputs), "mean_tokens": sum(inputs) / len(inputs)}

    def output_from_file(self):
        """How the file sets the output lengths, where it does (the spec sets none): {"answered":
        turns whose answer's words are their output length, "unanswered": turns that take the
        sweep's output length, "mean_words"}; None where the spec or the sweep sets them. A
        trace's own output lengths (tokens) set every request's: "trace": True."""
        if self.kind == "trace" and self.items:
            outputs = [item["output_length"] for item in self.items]
            return {
                "answered": len(outputs),
                "unanswered": 0,
                "mean_words": sum(outputs) / len(outputs),
                "trace": True,
            }
        answered, unanswered = workload_specs.answer_words(self.spec, self.items or [])
        if not answered and not unanswered:
            return None
        mean = sum(answered) / len(answered) if answered else None
        return {"answered": len(answered), "unanswered": unanswered, "mean_words": mean}

    def record(self):
        """What a run records of the workload it sent (its snapshot, its parameters)."""
        return {
            "id": self.pk,
            "name": self.name,
            "version": self.version,
            "kind": self.kind,
            "sha256": self.sha256 or None,
        }

    def run_parameter(self):
        """The run parameter `workload`: the record and the spec the worker sends by."""
        return {**self.record(), "spec": self.spec}
