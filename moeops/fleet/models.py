"""What runs where: models and their MoE shape, GPU hosts, their topology history, deployments,
their health checks and the hosts' GPU readings."""

import unicodedata
import uuid
from datetime import UTC, datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.urls import reverse
from django.utils import timezone
from django.utils.timesince import timesince

from domain import engine as engine_reports
from domain import launch
from domain.levels import LATENCY_METRICS
from domain.numbers import is_number
from domain.queues import host_queue
from domain.slo import (
    DEFAULT_MAX_FAILED_PERCENT,
    METRIC_LABELS,
    SLO_PERCENTILES,
    judge,
    profile_problems,
    stat_key,
)
from domain.topology import VIRTUALIZATION_WORDS, virtualization_words, vm_layer
from moeops.keyed import BODY_SHA256_HELP
from tuning import config_files
from tuning.moe_params import (
    MAX_ARCHITECTURE_CHARS,
    MAX_MODEL_TYPE_CHARS,
    MoEConfigError,
    moe_params,
)

# "not read yet" for arguments where None is a value (no topology snapshot)
_UNREAD = object()


def not_an_id(name):
    """The API finds models, hosts, deployments and SLO profiles by id or by name: a name of
    digits alone would be taken for another row's id."""
    if name.isascii() and name.isdigit():
        raise ValidationError(
            f"{name!r} is digits alone, which the API reads as an id: add a letter",
            code="digits",
        )


def one_line(name):
    """A name is one line of text: a control character (a line break, a tab, an escape) would
    break the pages' tables, the CSV exports and the terminal the CLI prints it to."""
    if any(unicodedata.category(ch) == "Cc" for ch in name):
        raise ValidationError(
            "holds a control character (a line break, a tab or an escape): a name is one line "
            "of text",
            code="control",
        )


ENGINES = (("sglang", "SGLang"), ("vllm", "vLLM"), ("other", "Other"))

DEPLOYMENT_STATUSES = (
    ("planned", "Planned"),
    ("deploying", "Deploying"),
    ("healthy", "Healthy"),
    ("degraded", "Degraded"),
    ("stopped", "Stopped"),
    ("failed", "Failed"),
)

# What a health check can find; the newest check sets the deployment's status to it.
HEALTH_STATUSES = (("healthy", "Healthy"), ("degraded", "Degraded"), ("failed", "Failed"))

CHECK_TRIGGERS = (
    ("manual", "Check now"),
    ("periodic", "Periodic"),
    ("api", "API"),
    ("edit", "Set by hand"),
)

READING_STATUSES = (("recorded", "Recorded"), ("unavailable", "Unavailable"))

VIRTUALIZATION_KINDS = tuple(VIRTUALIZATION_WORDS.items())

# Whether moeops starts and stops the deployment's engine (from its launch recipe, through the
# host's worker) or only measures an engine someone else runs.
MANAGEMENT = (
    ("external", "External: moeops never touches the engine"),
    ("managed", "Managed: moeops starts and stops the engine"),
)

TOPOLOGY_SOURCES = (
    ("probe", "Worker probe"),
    ("nvidia-smi", "nvidia-smi import"),
    ("manual", "Manual"),
)


class ModelSpec(models.Model):
    """A model as its HF config.json describes it; the MoE shape is read from that file."""

    name = models.CharField(max_length=200, unique=True, validators=[not_an_id, one_line])
    hf_repo_id = models.CharField(max_length=200, blank=True)
    config_json = models.JSONField(help_text="The model's config.json, as published.")
    quant_config_json = models.JSONField(
        null=True, blank=True, help_text="A separate hf_quant_config.json (ModelOpt), if any."
    )
    architecture = models.CharField(max_length=MAX_ARCHITECTURE_CHARS, blank=True)
    model_type = models.CharField(max_length=MAX_MODEL_TYPE_CHARS, blank=True)
    num_experts = models.PositiveIntegerField(null=True, blank=True)
    topk = models.PositiveIntegerField(null=True, blank=True)
    hidden_size = models.PositiveIntegerField(null=True, blank=True)
    moe_intermediate_size = models.PositiveIntegerField(null=True, blank=True)
    num_layers = models.PositiveIntegerField(null=True, blank=True)
    quantization = models.CharField(max_length=50, blank=True)
    block_shape = models.JSONField(null=True, blank=True)
    provenance = models.CharField(max_length=300, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def fill_shape(self):
        """Set the MoE shape fields from config_json; raises MoEConfigError naming what's wrong."""
        params = moe_params(self.config_json, quant_config=self.quant_config_json)
        self.architecture = params.architecture or ""
        self.model_type = params.model_type or ""
        self.num_experts = params.num_experts
        self.topk = params.topk
        self.hidden_size = params.hidden_size
        self.moe_intermediate_size = params.moe_intermediate_size
        self.num_layers = params.num_layers
        self.quantization = params.quantization or ""
        self.block_shape = params.block_shape

    def shape_for(self, tp=1, ep=1):
        """The per-rank MoE shape (dict of tuning.moe_params) at this tp/ep, or None if invalid."""
        try:
            return moe_params(
                self.config_json, tp=tp, ep=ep, quant_config=self.quant_config_json
            ).as_dict()
        except MoEConfigError:
            return None


# What a GPU-hour may cost: up to 99,999,999.9999 in any currency, which no cloud reaches.
PRICE_DIGITS, PRICE_DECIMALS = 12, 4


class Host(models.Model):
    """A GPU host; its worker listens on the Celery queue `host.<name>`."""

    name = models.SlugField(max_length=100, unique=True, validators=[not_an_id, one_line])
    description = models.CharField(max_length=300, blank=True)
    price_per_gpu_hour = models.DecimalField(
        max_digits=PRICE_DIGITS,
        decimal_places=PRICE_DECIMALS,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="What one GPU of this host costs for an hour, in `currency`; empty: unknown.",
    )
    currency = models.CharField(
        max_length=3,
        blank=True,
        validators=[
            RegexValidator(r"^[A-Z]{3}\Z", "Give an ISO 4217 code: three capitals, as USD.")
        ],
        help_text="ISO 4217 code of the price (USD, EUR, …).",
    )
    provenance = models.CharField(max_length=300, blank=True)
    worker_seen_at = models.DateTimeField(
        null=True, blank=True, help_text="The host's worker's last heartbeat; empty: never seen."
    )
    worker_status = models.JSONField(
        default=dict,
        blank=True,
        help_text="What the last heartbeat said: the worker, its managed engines, its spool.",
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def clean(self):
        # a price without its currency would print as a bare number next to another host's
        if self.price_per_gpu_hour is not None and not self.currency:
            raise ValidationError({"currency": "Give the currency of the price, as USD."})

    @property
    def queue_name(self):
        return host_queue(self.name)

    def silent_for(self, now=None):
        """s since the host's worker's last heartbeat, or None when it was never heard from."""
        if self.worker_seen_at is None:
            return None
        return ((now or timezone.now()) - self.worker_seen_at).total_seconds()

    def worker_alive(self, now=None):
        """Whether the host's worker sent a heartbeat within MOEOPS_WORKER_STALE_S."""
        silent = self.silent_for(now)
        return silent is not None and silent <= settings.MOEOPS_WORKER_STALE_S

    def worker_absence(self):
        """A sentence saying why work sent to this host would wait, or "" when its worker is
        alive and reaches its broker."""
        broker = self.broker_out_of_reach()
        if self.worker_alive():
            if not broker:
                return ""
            return (
                f"The worker of host {self.name} is running but cannot reach its broker "
                f"{broker}; what is sent to it waits until it can."
            )
        if self.worker_seen_at is None:
            return (
                f"No worker of host {self.name} has been seen: start one with "
                f"`celery -A workers worker -Q {self.queue_name}` (README: Adding a GPU host)."
            )
        gone = (
            f"The worker of host {self.name} was last seen "
            f"{timesince(self.worker_seen_at)} ago; what is sent to it waits until it is back."
        )
        return (
            f"{gone} Its last heartbeat said it could not reach its broker {broker}."
            if broker
            else gone
        )

    def broker_out_of_reach(self):
        """ "redis://h:6379 (why, for 3 minutes)" when the last heartbeat said the worker could
        not reach its broker, else "" (it could, or the worker does not say)."""
        broker = (self.worker_status or {}).get("broker")
        if not isinstance(broker, dict) or broker.get("reachable") is not False:
            return ""
        why = str(broker.get("error") or "no answer").rstrip(".")
        since = broker.get("since")
        # UTC epoch s as the heartbeat's sent_at is bounded: a date that datetime can hold
        if is_number(since) and 0 < since <= 1e11:
            why += f", for {timesince(datetime.fromtimestamp(since, tz=UTC))}"
        return f"{broker.get('url') or ''} ({why})".lstrip()

    def managed_engine(self, deployment_id):
        """The managed engine of that deployment as the last heartbeat reported it, or None."""
        engines = (self.worker_status or {}).get("engines") or []
        return next((e for e in engines if e.get("deployment") == deployment_id), None)

    def current_topology(self):
        return self.topology_snapshots.order_by("-captured_at", "-id").first()


class GPU(models.Model):
    host = models.ForeignKey(Host, models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=100)
    uuid = models.CharField(max_length=100, blank=True)
    compute_capability = models.CharField(max_length=10, blank=True, help_text="e.g. 9.0, 12.0")
    memory_total_mib = models.PositiveIntegerField(null=True, blank=True)
    power_limit_w = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["host", "index"]
        constraints = [
            models.UniqueConstraint(fields=["host", "index"], name="gpu_unique_host_index")
        ]

    def __str__(self):
        return f"{self.host.name}/GPU{self.index} {self.name}"

    @property
    def sm(self):
        """12.0 -> SM120, 9.0 -> SM90; empty when unknown."""
        if not self.compute_capability:
            return ""
        major, _, minor = self.compute_capability.partition(".")
        return f"SM{major}{minor or '0'}"


class TopologySnapshot(models.Model):
    """One capture of a host's GPUs, links, P2P and virtualization; history is kept."""

    host = models.ForeignKey(Host, models.CASCADE, related_name="topology_snapshots")
    captured_at = models.DateTimeField()
    source = models.CharField(max_length=20, choices=TOPOLOGY_SOURCES, default="probe")
    virtualization = models.CharField(
        max_length=20, choices=VIRTUALIZATION_KINDS, default="unknown"
    )
    virtualization_technology = models.CharField(max_length=50, blank=True)
    virtualization_evidence = models.JSONField(default=list, blank=True)
    # every layer, outermost first (domain.topology); [] in rows older than it
    virtualization_layers = models.JSONField(default=list, blank=True)
    driver_version = models.CharField(max_length=50, blank=True)
    cuda_version = models.CharField(max_length=50, blank=True)
    gpus = models.JSONField(default=list, blank=True)
    links = models.JSONField(null=True, blank=True, help_text="{labels, matrix} of link types")
    p2p = models.JSONField(null=True, blank=True, help_text="{read|write|atomics|nvlink: matrix}")
    affinity = models.JSONField(default=list, blank=True)
    nics = models.JSONField(default=list, blank=True)
    raw_text = models.TextField(blank=True)
    fingerprint = models.CharField(max_length=64, blank=True)
    provenance = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-captured_at", "-id"]
        # host page history and "current topology" read the newest snapshots of one host
        indexes = [models.Index(fields=["host", "-captured_at"], name="topo_host_captured")]

    def __str__(self):
        return f"{self.host.name} @ {self.captured_at:%Y-%m-%d %H:%M} ({self.virtualization_label})"

    @property
    def virtualization_label(self):
        """ "Container (docker) in a VM (kvm, firecracker)", "Virtual machine (kvm)"."""
        return virtualization_words(self.as_snapshot()["virtualization"])

    @property
    def vm_layer(self):
        """The VM layer its GPUs sit in (however deep), or None: it decides P2P and links."""
        return vm_layer(self.as_snapshot()["virtualization"])

    def as_snapshot(self):
        """The snapshot in the JSON shape of domain.topology (for diffs and the API)."""
        return {
            "source": self.source,
            "virtualization": {
                "kind": self.virtualization,
                "technology": self.virtualization_technology or None,
                "evidence": self.virtualization_evidence,
                "layers": self.virtualization_layers,
            },
            "driver_version": self.driver_version or None,
            "cuda_version": self.cuda_version or None,
            "gpus": self.gpus,
            "links": self.links,
            "p2p": self.p2p,
            "affinity": self.affinity,
            "nics": self.nics,
        }


def gpu_count(used, on_host, tp, ep):
    """GPUs a deployment's per-GPU figures divide by: the `used` ones it records, else its
    largest parallel size on a host with GPUs recorded; None on a host with none (a CPU box
    serving the stand-in), where per-GPU figures are n/a."""
    if used:
        return used
    return max(tp, ep) if on_host else None


PERCENTILE_CHOICES = tuple((p, p) for p in SLO_PERCENTILES)


def _limit_fields(label):
    percentile = models.CharField(
        max_length=3, choices=PERCENTILE_CHOICES, blank=True, help_text=f"{label} percentile"
    )
    limit = models.FloatField(null=True, blank=True, help_text=f"{label} limit (ms); empty: none")
    return percentile, limit


class SLOProfile(models.Model):
    """A named set of latency limits, each at a percentile, and the largest share of failed
    requests: what a level must meet (domain.slo judges it)."""

    name = models.CharField(max_length=200, unique=True, validators=[not_an_id, one_line])
    ttft_percentile, ttft_ms = _limit_fields("TTFT")
    tpot_percentile, tpot_ms = _limit_fields("TPOT")
    itl_percentile, itl_ms = _limit_fields("ITL")
    e2el_percentile, e2el_ms = _limit_fields("E2E latency")
    max_failed_percent = models.FloatField(
        default=DEFAULT_MAX_FAILED_PERCENT, help_text="Largest share of failed requests (%)"
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "SLO profile"

    def __str__(self):
        return self.name

    def get_absolute_url(self):
        return reverse("slo-profile-edit", args=[self.pk])

    def limits(self):
        """{metric: (percentile, ms or None)} as domain.slo takes them."""
        return {
            metric: (getattr(self, f"{metric}_percentile"), getattr(self, f"{metric}_ms"))
            for metric in LATENCY_METRICS
        }

    def clean(self):
        problems = profile_problems(self.limits(), self.max_failed_percent)
        if problems:
            raise ValidationError(problems)

    def judge(self, level, upper=None):
        """A LevelResult (or any object with its fields) against this profile: a
        domain.slo.Judgement; upper: {field: upper bound in ms} judged in place of the point
        value (an interval's bound)."""
        limits = self.limits()
        keys = ["completed", "failed", *(stat_key(m, p) for m, (p, _) in limits.items() if p)]
        figures = {key: getattr(level, key, None) for key in keys}
        return judge(limits, self.max_failed_percent, figures, upper)

    def summary(self):
        """ "TTFT p99 ≤ 500 ms, TPOT p99 ≤ 50 ms, failed ≤ 1 %" for lists and forms."""
        parts = [
            f"{METRIC_LABELS[m]} {p} ≤ {ms:g} ms"
            for m, (p, ms) in self.limits().items()
            if ms is not None
        ]
        return ", ".join([*parts, f"failed ≤ {self.max_failed_percent:g} %"])


class Deployment(models.Model):
    """One model served by one engine on (some GPUs of) one host."""

    name = models.CharField(max_length=200, unique=True, validators=[not_an_id, one_line])
    model = models.ForeignKey(ModelSpec, models.PROTECT, related_name="deployments")
    host = models.ForeignKey(Host, models.PROTECT, related_name="deployments")
    gpus = models.ManyToManyField(GPU, blank=True, related_name="deployments")
    engine = models.CharField(max_length=20, choices=ENGINES, default="sglang")
    engine_version = models.CharField(max_length=100, blank=True)
    tp = models.PositiveSmallIntegerField(default=1, help_text="tensor parallel size")
    ep = models.PositiveSmallIntegerField(default=1, help_text="expert parallel size")
    max_running_requests = models.PositiveIntegerField(null=True, blank=True)
    quantization = models.CharField(max_length=50, blank=True)
    attention_backend = models.CharField(max_length=50, blank=True)
    allreduce_fusion = models.BooleanField(null=True, blank=True)
    launch_args = models.JSONField(
        default=dict, blank=True, help_text="Other launch arguments, flag → value."
    )
    # a CharField: Django's URL check refuses a bare host name (http://rtx-pro-6000:8000), which
    # is how a team's engines are mostly addressed; fleet.endpoints decides what may be named
    endpoint_url = models.CharField(max_length=200, blank=True)
    # an external engine's start-up log on its host, read by the host's worker for the engine
    # paths (a managed engine's is the supervisor's own); blank: moeops does not see it
    engine_log = models.CharField(max_length=500, blank=True)
    management = models.CharField(max_length=20, choices=MANAGEMENT, default="external")
    served_model_name = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=20, choices=DEPLOYMENT_STATUSES, default="planned")
    status_detail = models.CharField(max_length=300, blank=True)
    status_checked_at = models.DateTimeField(null=True, blank=True)
    provenance = models.CharField(max_length=300, blank=True)
    # a default is a preference for the next search, not a record: deleting the profile
    # leaves the deployment without one rather than blocking the delete
    default_slo_profile = models.ForeignKey(
        SLOProfile, models.SET_NULL, null=True, blank=True, related_name="deployments"
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def get_absolute_url(self):
        return reverse("deployment-detail", args=[self.pk])

    @property
    def request_model_name(self):
        """The model name that requests to its engine carry: the served name, else the model's."""
        return self.served_model_name or self.model.name

    @property
    def is_managed(self):
        return self.management == "managed"

    @property
    def status_unchecked(self):
        """Whether its status is a health status no check has set (an example's, a hand
        edit's): it reads "not checked yet", and its detail is not shown as a check's."""
        return self.status in dict(HEALTH_STATUSES) and self.status_checked_at is None

    @property
    def checked_detail(self):
        """status_detail where a check (or a status that needs none) stands behind it, else ""."""
        return "" if self.status_unchecked else self.status_detail

    def recipe_in_force(self):
        """The launch recipe version an engine action last brought up, or None."""
        return (
            self.launch_recipes.filter(applied_at__isnull=False)
            .order_by("-applied_at", "-version")
            .first()
        )

    def launch_recipe(self):
        """The launch recipe its engine runs: the one in force (recipe_in_force), else the
        newest; None. Reads prefetched launch_recipes where there are."""
        recipes = list(self.launch_recipes.all())
        applied = [r for r in recipes if r.applied_at is not None]
        if applied:
            return max(applied, key=lambda r: (r.applied_at, r.version))
        return max(recipes, key=lambda r: r.version, default=None)

    def running_cap_in_force(self, flag):
        """(cap, action): the running-request cap the managed engine runs with now and the
        engine action that brought it up. The cap is what the engine reported after that action,
        else what the recipe in force sets flag to; (None, None) when no recipe is in force."""
        recipe = self.recipe_in_force()
        if recipe is None:
            return None, None
        action = (
            recipe.actions.filter(status__in=("sweeping", "succeeded"))
            .order_by("-created", "-id")
            .first()
        )
        cap = engine_reports.reported_running_cap(action.observed or {}) if action else None
        if cap is None:
            value = launch.flag_value(recipe.argv, flag)
            cap = int(value) if value and value.isdigit() else None
        return cap, action

    def gpu_indices(self):
        """NVML indices of the GPUs it uses, ascending ([] when none are recorded)."""
        return sorted(gpu.index for gpu in self.gpus.all())

    def num_gpus(self):
        """GPUs the deployment's per-GPU figures divide by (gpu_count), or None."""
        return gpu_count(self.gpus.count(), self.host.gpus.count(), self.tp, self.ep)

    def moe_shape(self):
        return self.model.shape_for(tp=self.tp, ep=self.ep)

    @property
    def weight_quantization(self):
        """The MoE weights' quantization: the deployment's (its engine's flag), else the model's."""
        return self.quantization or self.model.quantization

    def kernel_gpu(self):
        """The GPU its MoE kernel is tuned for and loaded on: its first GPU, else its host's
        first; None on a host with no GPU recorded. Reads prefetched GPUs where there are."""
        own = sorted(self.gpus.all(), key=lambda gpu: gpu.index)
        return own[0] if own else next(iter(self.host.gpus.all()), None)

    def kernel_shape(self):
        """{"E", "N", "device_name", "dtype", "block_shape"} of its MoE layer per rank on its
        kernel GPU: what names the config file its engine loads; None when the model's shape
        does not split over its tp/ep. device_name is None on a host with no GPU recorded.

        dtype is None, with a "reason", for weights whose MoE kernels read no Triton config
        (FP4)."""
        shape = self.moe_shape()
        if shape is None:
            return None
        gpu = self.kernel_gpu()
        quantization = (self.weight_quantization or "").lower()
        dtype = config_files.kernel_dtype(quantization)
        out = {
            "E": shape["experts_per_rank"],
            "N": shape["N"],
            "device_name": gpu.name if gpu else None,
            "dtype": dtype,
            "block_shape": shape.get("block_shape") if dtype == "fp8_w8a8" else None,
        }
        if dtype is None:
            out["reason"] = f"{quantization} MoE weights run on kernels that read no Triton config"
        return out

    def tune_refusal(self, *, has_gpus=None, topology=_UNREAD):
        """Why a kernel tune of it cannot run on its host now, in one sentence, or "".

        A tune sent to a host without a CUDA GPU fails in its worker, and one sent to a host
        whose worker is gone waits in its queue. has_gpus (the host has GPUs recorded) and
        topology (its current snapshot, or None) where the caller has read them already.
        """
        host = self.host
        if has_gpus is None:
            has_gpus = host.gpus.exists()
        if topology is _UNREAD:
            topology = host.current_topology()
        if not has_gpus:
            return (
                f"Host {host.name} has no GPU recorded (its worker's probe found none), and a "
                "kernel tune times the kernel on a CUDA GPU."
            )
        if topology is not None and topology.source == "probe" and not topology.cuda_version:
            return (
                f"Host {host.name}'s worker found no CUDA driver when it probed the host, and a "
                "kernel tune needs CUDA."
            )
        return host.worker_absence()

    def launch_summary(self, running_cap=None):
        """The launch arguments as (flag, value) pairs, known ones first. running_cap: the
        running-request cap a managed engine runs with now (running_cap_in_force), in place of
        the one recorded, which no restart changes."""
        pairs = [("tp", self.tp), ("ep", self.ep)]
        for field in ("max_running_requests", "quantization", "attention_backend"):
            value = getattr(self, field)
            if field == "max_running_requests" and running_cap is not None:
                value = running_cap
            if value not in (None, ""):
                pairs.append((field, value))
        if self.allreduce_fusion is not None:
            pairs.append(("allreduce_fusion", self.allreduce_fusion))
        pairs.extend(sorted(self.launch_args.items()))
        return pairs


class HealthCheck(models.Model):
    """One check of a deployment's engine by its host's worker (workers.engine_check): whether it
    answered, what it is and whether it serves the model; history is kept."""

    deployment = models.ForeignKey(Deployment, models.CASCADE, related_name="health_checks")
    # chosen by the worker, so that a retried or spooled push stores one check
    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    body_sha256 = models.CharField(max_length=64, blank=True, help_text=BODY_SHA256_HELP)
    checked_at = models.DateTimeField()
    status = models.CharField(max_length=20, choices=HEALTH_STATUSES)
    up = models.BooleanField(help_text="The engine answered.")
    latency_ms = models.FloatField(null=True, blank=True, help_text="ms to identify the engine")
    engine = models.CharField(max_length=50, blank=True, help_text="The engine that answered.")
    version = models.CharField(max_length=100, blank=True)
    served_models = models.JSONField(default=list, blank=True, help_text="Model ids it serves.")
    max_running_requests = models.PositiveIntegerField(null=True, blank=True)
    detail = models.CharField(max_length=300, blank=True)
    trigger = models.CharField(max_length=20, choices=CHECK_TRIGGERS, default="manual")

    class Meta:
        ordering = ["-checked_at", "-id"]
        # the deployment page's latest checks and "is this check the newest" read this
        indexes = [
            models.Index(fields=["deployment", "-checked_at"], name="health_deployment_checked")
        ]

    def __str__(self):
        return f"{self.deployment.name} @ {self.checked_at:%Y-%m-%d %H:%M}: {self.status}"

    @property
    def engine_label(self):
        """ "SGLang 0.5.6" as the engine answered; empty when nothing answered."""
        return engine_reports.label({"engine": self.engine, "version": self.version})


class GPUReading(models.Model):
    """Every GPU of a host read once through NVML ("GPUs now"), or why it could not be read."""

    host = models.ForeignKey(Host, models.CASCADE, related_name="gpu_readings")
    # chosen by the worker, so that a retried or spooled push stores one reading
    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    body_sha256 = models.CharField(max_length=64, blank=True, help_text=BODY_SHA256_HELP)
    taken_at = models.DateTimeField()
    status = models.CharField(max_length=20, choices=READING_STATUSES)
    detail = models.CharField(max_length=300, blank=True, help_text="Why there is no reading.")
    gpus = models.JSONField(
        default=list,
        blank=True,
        help_text="Per GPU: gpu_index, gpu_util %, power_w and power_limit_w W, mem_used_mib "
        "and mem_total_mib MiB, sm_clock_mhz MHz, temperature_c °C (as workers.telemetry reads).",
    )

    class Meta:
        ordering = ["-taken_at", "-id"]
        # the host page's latest reading
        indexes = [models.Index(fields=["host", "-taken_at"], name="gpu_reading_host_taken")]

    def __str__(self):
        return f"{self.host.name} @ {self.taken_at:%Y-%m-%d %H:%M}: {self.status}"
