"""Managed engines: how a deployment's engine is started (launch recipes, one version per change)
and what moeops did to it (engine actions: restart with changed arguments, apply a kernel config,
revert), each action a chain of steps on the host's worker, every step recorded."""

import uuid
from urllib.parse import urlencode

from django.conf import settings
from django.db import models
from django.urls import reverse

from moeops.jobs import ACTION_MOVES, ACTION_STATUSES, Job
from tuning.config_files import CONFIG_ENV

ACTION_KINDS = (
    ("restart", "Restart with the newest recipe"),
    ("restart_with_args", "Restart with changed arguments"),
    # vLLM's torch profiler and /server_info, which a profiled level needs (workers.step_profile)
    ("restart_with_profiler", "Restart with profiling available"),
    ("apply_config", "Apply a kernel config"),
    ("revert", "Revert to the previous recipe"),
    # a bisection's step (some factors at the baseline's values), and its last move back
    ("bisect", "Bisection step"),
    ("restore", "Restore the recipe in force before a bisection"),
)
ACTION_SOURCES = (
    ("page", "Deployment page"),
    ("api", "API"),
    ("make_run", "make run"),
    ("tune", "A plan item's tune, once it succeeded"),
    ("bisection", "A bisection of a regression"),
)


class LaunchRecipe(models.Model):
    """One version of how a managed deployment's engine starts: argv (a list, no shell),
    environment, working folder, GPU indices, where it reads tuned kernel configs, and the kernel
    configs that folder holds. Versions are never edited: a change is a new version, attributed.
    applied_at is set when an action brought the version up; failed_at when it did not come up."""

    deployment = models.ForeignKey(
        "fleet.Deployment", models.CASCADE, related_name="launch_recipes"
    )
    version = models.PositiveIntegerField(editable=False)
    argv = models.JSONField(help_text='["python", "-m", "vllm.entrypoints.cli.main", "serve", …]')
    env = models.JSONField(default=dict, blank=True, help_text="variable → value")
    cwd = models.CharField(max_length=500, blank=True, help_text="working folder; blank: worker's")
    gpu_indices = models.JSONField(default=list, blank=True, help_text="CUDA_VISIBLE_DEVICES")
    config_folder = models.CharField(
        max_length=500,
        blank=True,
        help_text="where the engine reads tuned kernel configs (blank: a folder of the worker's "
        "cache for this deployment)",
    )
    kernel_configs = models.ManyToManyField(
        "kernels.KernelConfig",
        blank=True,
        related_name="launch_recipes",
        help_text="the kernel configs written into the config folder before the engine starts",
    )
    ready_timeout_s = models.FloatField(default=900.0, help_text="s to wait for /health")
    based_on = models.ForeignKey(
        "self", models.SET_NULL, null=True, blank=True, related_name="+",
        help_text="the version in force when this one was made",
    )  # fmt: skip
    reason = models.CharField(max_length=300, blank=True, help_text="why this version exists")
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created = models.DateTimeField(auto_now_add=True)
    applied_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["deployment", "-version"]
        constraints = [
            models.UniqueConstraint(
                fields=["deployment", "version"], name="launch_recipe_unique_version"
            )
        ]

    def __str__(self):
        return f"{self.deployment} recipe v{self.version}"

    @property
    def config_env(self):
        """The variable that points the engine at config_folder (None for another engine)."""
        return CONFIG_ENV.get(self.deployment.engine)

    def command_line(self):
        """argv as one line, for people (never run through a shell)."""
        return " ".join(_quoted(part) for part in self.argv)


def _quoted(part):
    return part if part and all(c.isalnum() or c in "-_./=:,+@" for c in part) else repr(part)


class EngineAction(Job, models.Model):
    """One change to a managed engine, as a chain on its host's worker: write the kernel
    configs, restart the engine with `recipe` (back to `previous_recipe` when it does not come
    up), check that the engine reports the change, re-sweep with `before_run`'s load into
    `after_run`. steps: [{"name", "status" (running, done, failed, skipped), "detail", "at"}]."""

    MOVES = ACTION_MOVES

    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    deployment = models.ForeignKey(
        "fleet.Deployment", models.CASCADE, related_name="engine_actions"
    )
    kind = models.CharField(max_length=30, choices=ACTION_KINDS)
    status = models.CharField(max_length=20, choices=ACTION_STATUSES, default="queued")
    recipe = models.ForeignKey(
        LaunchRecipe, models.PROTECT, related_name="actions", help_text="the version it brings up"
    )
    previous_recipe = models.ForeignKey(
        LaunchRecipe, models.PROTECT, null=True, blank=True, related_name="+",
        help_text="the version in force before; restarted when the new one fails",
    )  # fmt: skip
    changes = models.JSONField(
        default=dict, blank=True, help_text="restart_with_args: flag → value, e.g. --max-num-seqs"
    )
    kernel_config = models.ForeignKey(
        "kernels.KernelConfig", models.SET_NULL, null=True, blank=True, related_name="+"
    )
    plan_item = models.ForeignKey(
        "insights.PlanItem",
        models.SET_NULL,
        null=True,
        blank=True,
        related_name="engine_actions",
    )
    before_run = models.ForeignKey(
        "runs.SweepRun", models.SET_NULL, null=True, blank=True, related_name="actions_before"
    )
    after_run = models.ForeignKey(
        "runs.SweepRun", models.SET_NULL, null=True, blank=True, related_name="actions_after"
    )
    steps = models.JSONField(default=list, blank=True)
    progress = models.JSONField(
        default=dict,
        blank=True,
        help_text="the heartbeat of the worker's delivery carrying it out (workers.job)",
    )
    observed = models.JSONField(
        default=dict, blank=True, help_text="what the engine reported after the restart"
    )
    error = models.TextField(blank=True)
    log_tail = models.TextField(blank=True, help_text="the engine's last log lines")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, models.SET_NULL, null=True, blank=True, related_name="+"
    )
    source = models.CharField(max_length=10, choices=ACTION_SOURCES, default="page")
    created = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]
        # the deployment page's recent actions, and "is an action of it in flight"
        indexes = [
            models.Index(fields=["deployment", "-created"], name="action_deployment_created")
        ]

    def __str__(self):
        return f"{self.get_kind_display()} of {self.deployment} ({self.status})"

    def get_absolute_url(self):
        return reverse("engine-action", args=[self.uuid])

    def compare_url(self):
        """Compare of the run before the action and its re-sweep ("" without both). Stand-in
        runs are compared too: this pair is what the action measured, asked for by name."""
        if self.before_run is None or self.after_run is None:
            return ""
        query = [("run", str(self.before_run.uuid)), ("run", str(self.after_run.uuid))]
        if self.before_run.is_standin or self.after_run.is_standin:
            query.append(("standin", "1"))
        return f"{reverse('compare')}?{urlencode(query)}"

    def title(self):
        """What it does, in a line: "Restart with --max-num-seqs 16", "Apply E=8,N=64… v2"."""
        if self.kind == "restart_with_args" and self.changes:
            flags = ", ".join(f"{flag} {value}" for flag, value in self.changes.items())
            return f"Restart with {flags}"
        if self.kind == "apply_config" and self.kernel_config_id:
            return f"Apply {self.kernel_config}"
        if self.kind == "revert":
            return f"Revert to recipe v{self.recipe.version}"
        if self.kind in ("bisect", "restore"):
            return f"{self.get_kind_display()}: {self.recipe.reason}"
        return self.get_kind_display()
