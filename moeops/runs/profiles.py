"""A profiled level: the engine's step breakdown over a bounded window of one level of a sweep
(domain.step_breakdown), as the worker pushed it or as traces uploaded by hand read.

Its own module beside models.py (which imports it, so that Django finds the model): the
profile's wire contract is domain.step_breakdown.LevelProfile, and this row stores it as is.
"""

from django.db import models

from domain.step_breakdown import (
    PROFILE_STATUSES,
    StepBreakdown,
    breakdown_changes,
)
from domain.step_breakdown import (
    LevelProfile as LevelProfileBody,
)

PROFILE_STATUS_CHOICES = tuple((status, status) for status in PROFILE_STATUSES)
PROFILE_SOURCES = (("worker", "The sweep's worker"), ("upload", "Traces uploaded by hand"))
# The class whose share of a decode step grew by less than this (percentage points) is not named
# as what grew: 12.0 % → 13.5 % is noise between two windows of 40 steps; 12 % → 31 % is not.
STEP_GROWTH_POINTS = 5.0


class LevelProfileQuerySet(models.QuerySet):
    def shown(self):
        """One profile per level (run, concurrency, request rate): the newest, worker's and
        uploaded alike, ordered by concurrency then rate. Evaluates the queryset (one query)."""
        newest = {}
        for profile in self.order_by("created", "id"):
            newest[(profile.run_id, profile.key)] = profile
        return sorted(
            newest.values(),
            key=lambda p: (p.run_id, p.concurrency, p.request_rate or float("inf")),
        )


class LevelProfile(models.Model):
    """One level's profiled window (the worker's push, POST /api/v1/runs/{uuid}/profiles, or
    traces uploaded by hand): its status, the window asked (engine steps) and taken (s), the trace
    files, what profiling cost the level's throughput and the step breakdown, each stored as the
    body gave it. Not a level round: its throughput is never a level's figure."""

    run = models.ForeignKey("runs.SweepRun", models.CASCADE, related_name="profiles")
    key = models.CharField(max_length=60, help_text="level_key(concurrency, request_rate)")
    concurrency = models.PositiveIntegerField()
    request_rate = models.FloatField(null=True, blank=True, help_text="req/s; empty = unlimited")
    attempt = models.PositiveSmallIntegerField(
        default=1, help_text="The sweep's delivery that profiled it (an upload: 1, 2, …)"
    )
    source = models.CharField(max_length=10, choices=PROFILE_SOURCES, default="worker")
    status = models.CharField(max_length=20, choices=PROFILE_STATUS_CHOICES)
    reason = models.TextField(blank=True, help_text="Why unavailable or failed, in a sentence")
    steps_asked = models.PositiveIntegerField(help_text="The window's bound in engine steps")
    window_s = models.FloatField(null=True, blank=True, help_text="s the window ran")
    traces = models.JSONField(default=list, blank=True, help_text="[{host, path, size_bytes}]")
    cost = models.JSONField(
        null=True, blank=True, help_text="{profiled_tok_s, unprofiled_tok_s, ratio}"
    )
    breakdown = models.JSONField(
        null=True, blank=True, help_text="domain.step_breakdown.StepBreakdown"
    )
    body_sha256 = models.CharField(
        max_length=64, help_text="SHA-256 of the body stored under this key"
    )
    created = models.DateTimeField(auto_now_add=True)

    objects = LevelProfileQuerySet.as_manager()

    class Meta:
        ordering = ["run", "concurrency", "request_rate", "attempt", "id"]
        constraints = [
            # idempotent ingestion: one body per (run, level, source, attempt)
            models.UniqueConstraint(
                fields=["run", "key", "source", "attempt"], name="level_profile_unique"
            )
        ]

    def __str__(self):
        return f"{self.run} {self.key} profile ({self.status})"

    def body(self) -> LevelProfileBody:
        """The stored profile as the wire contract reads it (the API's answer)."""
        fields = {name: getattr(self, name) for name in LevelProfileBody.model_fields}
        return LevelProfileBody(**fields | {"traces": self.traces or []})

    def step_breakdown(self) -> StepBreakdown | None:
        """The breakdown of a captured profile, read back; None for the others."""
        if self.breakdown is None:
            return None
        return StepBreakdown.model_validate(self.breakdown)


def step_growth(before: LevelProfile | None, after: LevelProfile | None) -> str | None:
    """ "communication grew 12 % → 31 % of a decode step at concurrency 64": the class whose share
    of a decode step grew the most from one profile to the other, when both hold a breakdown
    with decode steps and it grew by at least STEP_GROWTH_POINTS; else None."""
    a = before.step_breakdown() if before is not None else None
    b = after.step_breakdown() if after is not None else None
    if a is None or b is None:
        return None
    rows = [row for row in breakdown_changes(a, b) if row[0] != "idle" or row[3] > 0]
    if not rows:
        return None
    name, share_a, share_b, points = max(rows, key=lambda row: row[3])
    if points < STEP_GROWTH_POINTS:
        return None
    return (
        f"{name} grew {share_a * 100:.0f} % → {share_b * 100:.0f} % of a decode step at "
        f"concurrency {after.concurrency}"
    )


def same_level_profiles(run_a, run_b):
    """[(profile of run_a, profile of run_b)] of the levels both runs profiled with a breakdown
    (same concurrency and request rate), by concurrency; two queries."""
    mine = {p.key: p for p in run_a.profiles.filter(status="captured").shown()}
    theirs = {p.key: p for p in run_b.profiles.filter(status="captured").shown()}
    return [(mine[key], theirs[key]) for key in mine if key in theirs]


def runs_step_growth(before_run, after_run) -> str | None:
    """step_growth of the first level (by concurrency) both runs profiled where a class grew:
    what a regression's alert says of the inside of the step; None where none did."""
    for before, after in same_level_profiles(before_run, after_run):
        growth = step_growth(before, after)
        if growth is not None:
            return growth
    return None
