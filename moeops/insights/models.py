"""What the team knows: findings with evidence, plans, notes, known incompatibilities."""

import nh3
from django.conf import settings
from django.db import models
from django.db.models import Case, Value, When
from markdown_it import MarkdownIt

from moeops.insights.rules.load import cap_change
from tuning.engines import ENGINE_TITLES

FINDING_KINDS = (
    ("plateau", "Throughput plateau"),
    ("idle_gpus", "Idle GPUs under load"),
    ("queueing", "Requests queued behind max-running-requests"),
    ("no_tuned_kernel", "No tuned kernel config"),
    ("kernel_provenance", "Kernel config tuned for another kernel"),
    ("topology", "Topology"),
    ("incompatibility", "Known incompatibility"),
    ("regression", "Regression"),
    ("client_bound", "Client-bound"),
    ("failed_requests", "Failed requests"),
    ("engine_mismatch", "Engine not as recorded"),
    ("capacity", "Capacity limited by the running-request cap"),
    ("other", "Other"),
)
SEVERITIES = (("info", "Info"), ("warning", "Warning"), ("critical", "Critical"))
FINDING_SOURCES = (("auto", "Automatic analysis"), ("human", "A person"))
# superseded: of a run whose engine ran a launch recipe that no longer runs (kept in history)
FINDING_STATES = (
    ("open", "Open"),
    ("confirmed", "Confirmed"),
    ("dismissed", "Dismissed"),
    ("superseded", "Superseded"),
)
PLAN_STATUSES = (("pending", "Pending"), ("in_progress", "In progress"), ("completed", "Completed"))
# A plan item's moves (services.plan_item_transition makes them): an action or a tune carries a
# pending item out (in progress) and ends it done, or pending again when it failed; a person may
# make each of those moves and reopen a done item. A done item is not carried out again
# until it is reopened: the plan offers no action for it, and its change is in force.
PLAN_MOVES = {
    "pending": ("in_progress", "completed"),
    "in_progress": ("pending", "completed"),
    "completed": ("pending",),
}

_markdown = MarkdownIt("commonmark", {"linkify": False}).enable("table")


class Note(models.Model):
    """A page of the team's knowledge base, in markdown."""

    title = models.CharField(max_length=200)
    slug = models.SlugField(max_length=200, unique=True)
    body = models.TextField(blank=True, help_text="Markdown")
    provenance = models.CharField(max_length=300, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["title"]

    def __str__(self):
        return self.title

    def html(self):
        """The body rendered to HTML and sanitized (notes are written by people)."""
        return nh3.clean(_markdown.render(self.body))


# Most severe first (FindingQuerySet.by_importance).
SEVERITY_ORDER = ("critical", "warning", "info")


# by_importance's ranks, built once: a query copies an expression as it resolves it.
IMPORTANCE = {
    "dismissed_rank": Case(
        When(state__in=("dismissed", "superseded"), then=Value(1)), default=Value(0)
    ),
    "severity_rank": Case(
        *(When(severity=s, then=Value(i)) for i, s in enumerate(SEVERITY_ORDER)),
        default=Value(len(SEVERITY_ORDER)),
    ),
    "evidence_rank": Case(
        When(evidence__chart__type__isnull=False, then=Value(0)), default=Value(1)
    ),
}


class FindingQuerySet(models.QuerySet):
    def by_importance(self):
        """The one order findings are listed in: dismissed and superseded ones last, then by
        severity (critical, warning, info), then by evidence (one with a chart of what was
        measured before one with none), then newest first."""
        # aliased, not annotated: the ranks order the findings, no page reads them
        return self.alias(**IMPORTANCE).order_by(*IMPORTANCE, "-created", "-id")

    def open_by_importance(self):
        """The open findings in by_importance's order, without its first rank, which is the
        same for all of them (the dashboard's list: each rank costs its query a CASE)."""
        ranks = {name: rank for name, rank in IMPORTANCE.items() if name != "dismissed_rank"}
        return self.filter(state="open").alias(**ranks).order_by(*ranks, "-created", "-id")


class Finding(models.Model):
    """One observation about a deployment (or one of its runs) with its numbers as evidence."""

    deployment = models.ForeignKey("fleet.Deployment", models.CASCADE, related_name="findings")
    run = models.ForeignKey(
        "runs.SweepRun", models.CASCADE, null=True, blank=True, related_name="findings"
    )
    kind = models.CharField(max_length=30, choices=FINDING_KINDS)
    # Re-analysis updates the finding with the same (deployment, run, kind, key) instead of adding.
    key = models.CharField(max_length=100, blank=True)
    severity = models.CharField(max_length=10, choices=SEVERITIES, default="warning")
    title = models.CharField(max_length=200)
    text = models.TextField(blank=True)
    evidence = models.JSONField(default=dict, blank=True)
    source = models.CharField(max_length=10, choices=FINDING_SOURCES, default="auto")
    state = models.CharField(max_length=10, choices=FINDING_STATES, default="open")
    # who confirmed or dismissed it, and when; empty while the finding is untouched
    state_changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True, related_name="+"
    )
    state_changed_at = models.DateTimeField(null=True, blank=True)
    note = models.ForeignKey(Note, models.SET_NULL, null=True, blank=True, related_name="findings")
    provenance = models.CharField(max_length=300, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    objects = FindingQuerySet.as_manager()

    class Meta:
        ordering = ["-created", "-id"]
        # dashboard and deployment page: open findings of a deployment
        indexes = [models.Index(fields=["deployment", "state"], name="finding_deployment_state")]

    def __str__(self):
        return self.title


# The findings whose plan item is "Tune for <engine> <version> and re-sweep".
RETUNE_FINDINGS = ("kernel_provenance",)


class PlanItem(models.Model):
    """One line of a deployment's todo list."""

    deployment = models.ForeignKey("fleet.Deployment", models.CASCADE, related_name="plan_items")
    finding = models.ForeignKey(
        Finding, models.SET_NULL, null=True, blank=True, related_name="plan_items"
    )
    title = models.CharField(max_length=300)
    status = models.CharField(max_length=20, choices=PLAN_STATUSES, default="pending")
    position = models.PositiveIntegerField(default=0)
    note = models.ForeignKey(
        Note, models.SET_NULL, null=True, blank=True, related_name="plan_items"
    )
    source = models.CharField(max_length=10, choices=FINDING_SOURCES, default="human")
    provenance = models.CharField(max_length=300, blank=True)
    # the engine action that put the item's change in force (it may carry out another item)
    done_by = models.ForeignKey(
        "engines.EngineAction", models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["deployment", "position", "id"]

    def __str__(self):
        return self.title

    def can_move_to(self, status):
        """Whether the item may go from its status to `status` (staying is no move)."""
        return status == self.status or status in PLAN_MOVES.get(self.status, ())

    def cap_change(self):
        """The rules.load.CapChange this item proposes (its finding names the engine's cap), or
        None."""
        if self.finding is None:
            return None
        return cap_change(
            self.title, self.finding.kind, self.finding.evidence or {}, self.deployment.engine
        )

    def retunes(self):
        """Whether the item is a re-tune for the engine's kernel that a button can start now
        (one pending: a tune it started puts it in progress)."""
        return (
            self.status == "pending"
            and self.finding is not None
            and self.finding.kind in RETUNE_FINDINGS
            and self.deployment.engine in ENGINE_TITLES
        )


class IncompatibilityRule(models.Model):
    """A known engine/architecture incompatibility, kept as data so people can add their own."""

    name = models.CharField(max_length=200)
    compute_capability = models.CharField(
        max_length=10, blank=True, help_text="GPU compute capability it applies to, e.g. 12.0"
    )
    engine = models.CharField(max_length=20, blank=True, help_text="sglang, vllm … (blank: any)")
    launch_argument = models.CharField(
        max_length=100,
        blank=True,
        help_text="deployment field or launch_args flag, e.g. allreduce_fusion",
    )
    launch_value = models.CharField(
        max_length=100, blank=True, help_text="value that triggers it (blank: any value)"
    )
    severity = models.CharField(max_length=10, choices=SEVERITIES, default="warning")
    finding_text = models.TextField()
    note = models.ForeignKey(Note, models.SET_NULL, null=True, blank=True)
    enabled = models.BooleanField(default=True)
    provenance = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name
