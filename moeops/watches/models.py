"""Regression watches: a fixed measurement of a deployment on a schedule (django-celery-beat's
PeriodicTask), each firing's record, and the alerts sent when a watch regresses, recovers or
keeps failing, with every delivery attempt and its answer."""

from datetime import time, timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.db import models
from django.urls import reverse

from moeops import subqueries

WATCH_KINDS = (
    ("sweep", "Sweep"),
    ("capacity", "Capacity search"),
)

# A watch's runs repeat each level this many times unless told otherwise: four rounds a side are
# the fewest a two-run verdict can decide on at 5 % false alarms (domain.intervals.compare_rounds).
DEFAULT_ROUNDS = 4

# What became of one firing of a watch.
WATCH_RUN_STATUSES = (
    ("waiting", "Waiting for the host"),
    ("running", "Running"),
    ("finished", "Finished"),
    ("skipped", "Skipped"),
    ("failed", "Failed"),
)
WATCH_RUN_OPEN = ("waiting", "running")

# How a finished watch run's figure stands against its baseline (domain.intervals.overlap).
VERDICTS = (
    ("first", "First run: nothing to compare with"),
    ("within", "Within the noise"),
    ("regressed", "Regressed beyond the noise"),
    ("improved", "Improved beyond the noise"),
    ("unknown", "Cannot tell: no interval"),
)

# A bisection's life: its steps run, the engine goes back to the recipe it started from, done.
BISECTION_STATUSES = (
    ("running", "Trying the baseline's values"),
    ("restoring", "Restoring the recipe in force before"),
    ("finished", "Finished"),
    ("failed", "Failed"),
    ("refused", "Could not start"),
)
BISECTION_OPEN = ("running", "restoring")
BISECTION_SOURCES = (("page", "Watch page"), ("api", "API"), ("watch", "The watch, on regressing"))

# What one step's figure says (domain.intervals.overlap against both ends of the regression).
STEP_OUTCOMES = (
    ("restores", "Restores the baseline's figure"),
    ("partly", "Better beyond the noise, still below the baseline"),
    ("no", "Does not restore it"),
    ("undecided", "Cannot tell: its interval overlaps both the regressed and the baseline's"),
    ("unknown", "Cannot tell: no interval"),
    ("failed", "The engine did not come up or the sweep failed"),
)

CHANNEL_KINDS = (("webhook", "Webhook"), ("email", "Email"))

ALERT_KINDS = (
    ("regression", "Regression"),
    ("recovery", "Recovery"),
    ("failing", "Failing"),
)
ALERT_STATUSES = (
    ("pending", "Sending"),
    ("delivered", "Delivered"),
    ("failed", "Undelivered"),
)


class Watch(models.Model):
    """A sweep (or capacity search) of one deployment with a fixed load, fired by beat on its
    schedule; its runs are compared with its baseline within the rounds' noise."""

    deployment = models.ForeignKey("fleet.Deployment", models.CASCADE, related_name="watches")
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=20, choices=WATCH_KINDS, default="sweep")
    parameters = models.JSONField(
        default=dict,
        help_text="The load of each run: levels, input_len, output_len, prompts_per_level, "
        "warmup, rounds (default 4), endpoint",
    )
    slo_profile = models.ForeignKey(
        "fleet.SLOProfile", models.PROTECT, null=True, blank=True, related_name="watches"
    )
    # the schedule lives in beat's own table, edited there in the admin too
    periodic_task = models.OneToOneField(
        "django_celery_beat.PeriodicTask",
        models.SET_NULL,
        null=True,
        blank=True,
        related_name="watch",
    )
    window_start = models.TimeField(null=True, blank=True, help_text="Quiet window start (UTC)")
    window_end = models.TimeField(null=True, blank=True, help_text="Quiet window end (UTC)")
    enabled = models.BooleanField(default=True)
    baseline = models.ForeignKey(
        "WatchRun", models.SET_NULL, null=True, blank=True, related_name="+",
        help_text="The run a person marked baseline; empty: each run against the previous one",
    )  # fmt: skip
    bisect_on_regression = models.BooleanField(
        default=False,
        help_text="On a regression of a managed deployment, find the cause by itself "
        "(restarts the engine with the baseline's values, one factor at a time)",
    )
    channels = models.ManyToManyField(
        "AlertChannel", blank=True, related_name="watches",
        help_text="Where this watch's alerts go; none chosen: the deployment's channels and "
        "the global ones",
    )  # fmt: skip
    baseline_marked_by = models.CharField(max_length=150, blank=True)
    baseline_marked_at = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["deployment", "name"]
        verbose_name_plural = "watches"
        constraints = [
            models.UniqueConstraint(fields=["deployment", "name"], name="watch_unique_name")
        ]

    def __str__(self):
        return f"{self.deployment.name}: {self.name}"

    def get_absolute_url(self):
        return reverse("watch-detail", args=[self.pk])

    def in_window(self, at):
        """Whether the time `at` (aware, UTC) lies in the quiet window; True without one. A window
        whose end is before its start runs over midnight (22:00–04:00)."""
        if self.window_start is None or self.window_end is None:
            return True
        now = time(at.hour, at.minute, at.second)
        if self.window_start <= self.window_end:
            return self.window_start <= now < self.window_end
        return now >= self.window_start or now < self.window_end

    def figure_name(self):
        """What the watch's figure is, in words: "peak output tok/s", or "capacity (concurrent
        requests within its SLO profile)"."""
        if self.kind == "capacity":
            return "capacity (the load within its SLO profile)"
        return "peak output tok/s"

    def window_label(self):
        if self.window_start is None or self.window_end is None:
            return ""
        return f"{self.window_start:%H:%M}–{self.window_end:%H:%M} UTC"

    def schedule_label(self):
        """ "cron 0 3 * * *" or "every 6 hours" as the schedule stands in beat's table."""
        task = self.periodic_task
        if task is None:
            return "no schedule"
        if task.crontab_id:
            c = task.crontab
            return f"cron {c.minute} {c.hour} {c.day_of_month} {c.month_of_year} {c.day_of_week}"
        if task.interval_id:
            i = task.interval
            return f"every {i.every} {i.period}"
        return "no schedule"

    def next_run_at(self, now):
        """When beat fires the watch next (aware datetime), or None when it is off."""
        task = self.periodic_task
        if task is None or not task.enabled or not self.enabled:
            return None
        remaining = task.schedule.remaining_estimate(task.last_run_at or task.date_changed or now)
        # the estimate is taken against the scheduler's own clock, a few ms off `now`
        at = now + max(remaining, timedelta(0)) + timedelta(milliseconds=500)
        return at.replace(microsecond=0)


REGRESSED_SHOWN = (
    "watch__name",
    "watch__deployment_id",
    "figure",
    "baseline_figure",
    "fired_at",
    "changes",
)


def last_regressed():
    """The watch runs that regressed and are their watch's newest finished run (the dashboard's
    "regressed" list), with their watch (the list shows their figures, not their runs; the
    dashboard sets each watch's deployment from those it has read)."""
    watch = subqueries.column(WatchRun, "watch")
    newest = subqueries.newest(WatchRun, "watch", watch, ("fired_at",), status="finished")
    return (
        WatchRun.objects.filter(status="finished", verdict="regressed")
        .filter(pk=newest)
        .select_related("watch")
        # what the list shows: the watch's name, the figures, when and what changed
        .only(*REGRESSED_SHOWN)
    )


class WatchRun(models.Model):
    """One firing of a watch: the run it started (or why it waited, skipped or failed) and, once
    that run finished, its figure against the baseline's."""

    watch = models.ForeignKey(Watch, models.CASCADE, related_name="watch_runs")
    run = models.OneToOneField(
        "runs.SweepRun", models.SET_NULL, null=True, blank=True, related_name="watch_run"
    )
    status = models.CharField(max_length=20, choices=WATCH_RUN_STATUSES, default="waiting")
    reason = models.TextField(blank=True, help_text="Why it waits, was skipped or failed")
    verdict = models.CharField(max_length=20, choices=VERDICTS, blank=True)
    compared_with = models.ForeignKey(
        "runs.SweepRun", models.SET_NULL, null=True, blank=True, related_name="+"
    )
    figure = models.FloatField(null=True, blank=True, help_text="Peak output tok/s")
    interval = models.JSONField(null=True, blank=True, help_text="[low, high] tok/s, 95 %")
    baseline_figure = models.FloatField(null=True, blank=True, help_text="tok/s")
    baseline_interval = models.JSONField(null=True, blank=True, help_text="[low, high] tok/s")
    changes = models.JSONField(
        default=list, blank=True, help_text="What changed between the two runs' snapshots"
    )
    fired_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-fired_at", "-id"]
        # the watch's timeline and "the previous run of this watch" read this
        indexes = [models.Index(fields=["watch", "-fired_at"], name="watchrun_watch_fired")]

    def __str__(self):
        return f"{self.watch} @ {self.fired_at:%Y-%m-%d %H:%M}: {self.status}"

    @property
    def drop(self):
        """The fall of the figure from the baseline's, a fraction (0.2: 20 % lower), or None."""
        if self.figure is None or not self.baseline_figure:
            return None
        return 1 - self.figure / self.baseline_figure


class AlertChannel(models.Model):
    """Where alerts go: a webhook (JSON with a Slack-compatible "text") or email addresses. A
    channel with no deployment takes every deployment's alerts (moeops has no teams)."""

    name = models.CharField(max_length=200, unique=True)
    kind = models.CharField(max_length=20, choices=CHANNEL_KINDS)
    deployment = models.ForeignKey(
        "fleet.Deployment", models.CASCADE, null=True, blank=True, related_name="alert_channels",
        help_text="Empty: every deployment's alerts",
    )  # fmt: skip
    # a webhook's URL carries its secret (Slack's path is the token): never shown back whole
    url = models.CharField(max_length=500, blank=True)
    recipients = models.JSONField(default=list, blank=True, help_text="Email addresses")
    enabled = models.BooleanField(default=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def masked_url(self):
        """The webhook's scheme and host, the rest hidden: "https://hooks.slack.com/…"."""
        if not self.url:
            return ""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}/…"

    def target_label(self):
        return self.masked_url() if self.kind == "webhook" else ", ".join(self.recipients)


class Alert(models.Model):
    """One message to one channel, kept whether or not it was delivered."""

    watch_run = models.ForeignKey(WatchRun, models.CASCADE, related_name="alerts")
    channel = models.ForeignKey(AlertChannel, models.CASCADE, related_name="alerts")
    kind = models.CharField(max_length=20, choices=ALERT_KINDS)
    subject = models.CharField(max_length=300)
    text = models.TextField()
    status = models.CharField(max_length=20, choices=ALERT_STATUSES, default="pending")
    error = models.TextField(blank=True, help_text="Why the last attempt failed")
    created = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self):
        return f"{self.kind} to {self.channel}: {self.status}"


class AlertAttempt(models.Model):
    """One try at delivering an alert and what the other side answered."""

    alert = models.ForeignKey(Alert, models.CASCADE, related_name="attempts")
    number = models.PositiveSmallIntegerField()
    at = models.DateTimeField(auto_now_add=True)
    ok = models.BooleanField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True, help_text="HTTP")
    answer = models.TextField(blank=True, help_text="The answer's first 500 characters")
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["alert", "number"]
        constraints = [
            models.UniqueConstraint(fields=["alert", "number"], name="attempt_unique_number")
        ]

    def __str__(self):
        return f"attempt {self.number} of {self.alert}: {'ok' if self.ok else 'failed'}"


class Bisection(models.Model):
    """ "Find the cause" of a regressed watch run on a managed deployment: the engine restarted
    with the baseline's value of some factors (each step an engine action with its re-sweep at
    the watch's load), until one factor restores the baseline's figure beyond the noise; then
    back to the recipe in force before. factors: [{"key", "kind", "name", "a", "b", "phrase"}]
    (a: the baseline's value, b: the regressed run's); fixed: [{"phrase", "why"}], what changed
    that a restart cannot bring back; candidates and queue: the keys still suspected and the
    key sets still to try (moeops.watches.bisection)."""

    watch_run = models.ForeignKey(WatchRun, models.CASCADE, related_name="bisections")
    deployment = models.ForeignKey("fleet.Deployment", models.CASCADE, related_name="bisections")
    status = models.CharField(max_length=20, choices=BISECTION_STATUSES, default="running")
    source = models.CharField(max_length=10, choices=BISECTION_SOURCES, default="page")
    start_recipe = models.ForeignKey(
        "engines.LaunchRecipe", models.PROTECT, null=True, blank=True, related_name="+",
        help_text="The recipe in force when it started: the engine ends on it again",
    )  # fmt: skip
    baseline_recipe = models.ForeignKey(
        "engines.LaunchRecipe", models.PROTECT, null=True, blank=True, related_name="+"
    )
    factors = models.JSONField(default=list, blank=True)
    fixed = models.JSONField(default=list, blank=True)
    candidates = models.JSONField(default=list, blank=True)
    queue = models.JSONField(default=list, blank=True)
    cause = models.JSONField(default=list, blank=True, help_text="The keys of the factors found")
    finding = models.TextField(blank=True, help_text="What it found, or why it could not start")
    restore_action = models.OneToOneField(
        "engines.EngineAction", models.SET_NULL, null=True, blank=True, related_name="+"
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self):
        return f"bisection {self.pk} of {self.watch_run}: {self.status}"

    def get_absolute_url(self):
        return reverse("bisection-detail", args=[self.pk])

    def phrases(self, keys):
        """The phrases of the factors with these keys, in the bisection's order."""
        return [f["phrase"] for f in self.factors if f["key"] in keys]


class BisectionStep(models.Model):
    """One try of a bisection: the engine action that brought up the recipe with `keys` at the
    baseline's values, its re-sweep's figure (or a later measurement's, with more rounds, where
    the first could not tell), and what that says."""

    bisection = models.ForeignKey(Bisection, models.CASCADE, related_name="steps")
    number = models.PositiveSmallIntegerField()
    keys = models.JSONField(help_text="The factors set to the baseline's value")
    action = models.OneToOneField(
        "engines.EngineAction", models.PROTECT, related_name="bisection_step"
    )
    run = models.ForeignKey(
        "runs.SweepRun",
        models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="The sweep the step is judged on: its action's re-sweep, or a measurement again",
    )
    measures = models.PositiveSmallIntegerField(
        default=1, help_text="How many times the try was measured"
    )
    outcome = models.CharField(max_length=20, choices=STEP_OUTCOMES, blank=True)
    figure = models.FloatField(null=True, blank=True, help_text="Peak output tok/s")
    interval = models.JSONField(null=True, blank=True, help_text="[low, high] tok/s, 95 %")
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["bisection", "number"]
        constraints = [
            models.UniqueConstraint(fields=["bisection", "number"], name="step_unique_number")
        ]

    def __str__(self):
        return f"step {self.number} of {self.bisection}: {self.outcome or 'running'}"

    @property
    def judged_run(self):
        """The sweep the step is (to be) judged on."""
        return self.run if self.run_id else self.action.after_run
