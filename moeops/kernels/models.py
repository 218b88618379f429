"""Fused-MoE kernel configs (the files SGLang and vLLM load) and the tuning runs that make them."""

import hashlib
import uuid

from django.db import models, transaction

from domain import engine_diff_report
from domain.jobs import JOB_STATUSES
from domain.wire.runs import TELEMETRY_STATUSES
from domain.wire.tunes import KERNEL_ENGINES, KERNEL_PATHS, PICKS
from moeops.jobs import Job
from moeops.keyed import BODY_SHA256_HELP
from tuning import config_files, devices
from tuning.engines import ENGINE_TITLES, path_in_engine, vllm_launch
from tuning.routing import RoutingError, parse_routing
from tuning.tune_results import loss_under, routing_label

CONFIG_SOURCES = (("tuned", "Tuned by moeops"), ("imported", "Imported file"), ("manual", "Manual"))

# "bf16"/"fp16" have no dtype part in the engines' file names; the others do.
KERNEL_DTYPES = (
    ("bf16", "bf16"),
    ("fp16", "fp16"),
    ("fp8_w8a8", "fp8 w8a8"),
    ("int8_w8a8", "int8 w8a8"),
    ("int8_w8a16", "int8 w8a16"),
    ("int4_w4a16", "int4 w4a16"),
)
UNNAMED_DTYPES = ("bf16", "fp16")

BUILTIN_KERNEL = "moeops' builtin kernel (the engines' launch before vLLM 0.32)"
# What a tune asks for: the deployment's engine's own kernel (its engine as recorded) or builtin.
REQUESTED_KERNELS = (
    ("vllm", "vLLM's own"),
    ("sglang", "SGLang's own"),
    ("other", "the deployment's engine's own"),
    ("builtin", "moeops' builtin"),
)


class TimedKernel(models.Model):
    """Which fused-MoE kernel the timings were taken on
    (tuning.backends.base.KernelBackend.describe): a file tuned on one engine version's kernel
    need not be the best for another's launch."""

    kernel_engine = models.CharField(
        max_length=20, choices=KERNEL_ENGINES, blank=True, help_text="blank: not recorded"
    )
    kernel_version = models.CharField(max_length=100, blank=True)
    kernel_source_sha256 = models.CharField(
        max_length=64, blank=True, help_text="hash of the kernel code that was timed"
    )
    kernel_path = models.CharField(
        max_length=20,
        choices=KERNEL_PATHS,
        blank=True,
        help_text="which launch of the kernel was timed (vLLM 0.34); blank: not recorded",
    )

    class Meta:
        abstract = True

    @property
    def kernel_path_label(self):
        """ "the sorted-A path: …", or "" where the path is not recorded."""
        return dict(KERNEL_PATHS).get(self.kernel_path, "")

    def path_for(self, deployment):
        """A sentence: whether deployment's engine, at its recorded version and launch, runs
        the kernel path this was tuned for (tuning.engines.path_in_engine)."""
        return path_in_engine(
            self.kernel_path,
            engine=deployment.engine,
            version=deployment.engine_version,
            tma_shape=self.dtype == "fp8_w8a8" and bool(self.block_shape),
            # the launch recipe matters to the sorted-A path alone
            sorted_a=sorted_a_launch(deployment) if self.kernel_path == "sorted_a" else None,
        )

    @property
    def kernel_label(self):
        """ "vLLM 0.32.0's own kernel", moeops' builtin kernel, or "" when not recorded."""
        if self.kernel_engine == "builtin":
            return BUILTIN_KERNEL
        if not self.kernel_engine:
            return ""
        title = ENGINE_TITLES.get(self.kernel_engine, self.kernel_engine)
        return " ".join(filter(None, (title, self.kernel_version))) + "'s own kernel"

    def untimed_in(self, engine):
        """Why nothing is known of how fast this runs in `engine`'s kernel (vllm, sglang): a
        sentence when it was timed in another kernel, whose best tiles are not that engine's;
        "" when it was timed there or where it was timed is not recorded (an imported file)."""
        if not self.kernel_engine or self.kernel_engine == engine:
            return ""
        title = ENGINE_TITLES.get(engine, engine)
        return (
            f"Tuned in {self.kernel_label}, never timed in {title}'s: it may run slower "
            f"there than {title}'s own configs; tune with {title}'s kernel for {title}."
        )


def sorted_a_launch(deployment):
    """Whether the deployment's launch recipe runs vLLM with DeepGEMM's E8M0 scales and no
    expert parallelism (what its sorted-A path needs of the launch); None without a recipe."""
    recipe = deployment.launch_recipe()
    if recipe is None:
        return None
    launch = vllm_launch(recipe.env, recipe.argv)
    return launch.deep_gemm_e8m0 and not launch.expert_parallel


class KernelConfigQuerySet(models.QuerySet):
    def for_shape(self, shape, *, engine=None, every_dtype=False):
        """The configs of a kernel shape (Deployment.kernel_shape(): "device_name", "E", "N",
        "dtype", "block_shape"): those its engine would load. engine: who loads them (SGLang
        alone reads the _down files; None: every file); every_dtype: whatever their dtype and
        block shape. None where the shape names no GPU, or no dtype (FP4) unless every_dtype.
        """
        if not shape or not shape.get("device_name"):
            return self.none()
        configs = self.filter(device_name=shape["device_name"], E=shape["E"], N=shape["N"])
        if engine is not None and engine != "sglang":
            configs = configs.filter(down_moe=False)
        if every_dtype:
            return configs
        if shape.get("dtype") is None:
            return self.none()
        # block_shape compared in Python (JSON null vs SQL NULL), as KernelConfig.series does
        same_dtype = configs.filter(dtype=shape["dtype"])
        loaded = [c.pk for c in same_dtype if c.block_shape == shape["block_shape"]]
        return self.filter(pk__in=loaded)


class KernelConfig(TimedKernel):
    """One version of a config file for (device, E, N, dtype, block shape, down); versions are
    kept. A `down_moe` config is SGLang's `_down` file: GEMM 2's own configs beside GEMM 1's.
    down_entries: vLLM 0.34's `_down` file that goes with this (up) file on its sorted-A path,
    one record of two files, written, exported and applied together."""

    device_name = models.CharField(max_length=100, help_text="NVML name, e.g. NVIDIA H200")
    E = models.PositiveIntegerField(help_text="experts per rank")
    N = models.PositiveIntegerField(help_text="per-rank intermediate size after silu-and-mul")
    dtype = models.CharField(max_length=20, choices=KERNEL_DTYPES, default="bf16")
    block_shape = models.JSONField(null=True, blank=True, help_text="[128, 128] for block fp8")
    down_moe = models.BooleanField(
        default=False, help_text="SGLang's _down file: the down projection's (GEMM 2) configs"
    )
    triton_version = models.CharField(max_length=20, blank=True)
    entries = models.JSONField(help_text='batch size → {"BLOCK_SIZE_M": …, "num_stages": …}')
    down_entries = models.JSONField(
        null=True,
        blank=True,
        help_text="vLLM's _down file beside this one (its sorted-A path): batch size → entry, "
        'an entry of only {"USE_TMA": false} turning that path off there',
    )
    source = models.CharField(max_length=20, choices=CONFIG_SOURCES, default="manual")
    version = models.PositiveIntegerField(default=1, editable=False)
    original_file_name = models.CharField(max_length=300, blank=True)
    provenance = models.CharField(max_length=300, blank=True)
    compile_checked = models.JSONField(
        null=True,
        blank=True,
        help_text="compiled, not timed, for its GPU (python -m tuning compile-check --entries): "
        "capability, limit_bytes, max_shared_bytes, fewer_stages, kernel, triton_version",
    )
    created = models.DateTimeField(auto_now_add=True)

    objects = KernelConfigQuerySet.as_manager()

    class Meta:
        ordering = ["device_name", "E", "N", "dtype", "-version"]
        constraints = [
            models.UniqueConstraint(
                fields=["device_name", "E", "N", "dtype", "block_shape", "down_moe", "version"],
                name="kernelconfig_unique_down_version",
            )
        ]
        # "is there a tuned config for this device/E/N/dtype" (diagnosis, deployment page)
        indexes = [models.Index(fields=["device_name", "E", "N", "dtype"], name="kc_shape")]

    def __str__(self):
        return f"{self.display_file_name} v{self.version}"

    @property
    def styles(self):
        """The engines that load this file: vLLM has no _down files."""
        return ("sglang",) if self.down_moe else config_files.STYLES

    @property
    def display_file_name(self):
        """The vLLM name, or SGLang's for a _down config."""
        return self.file_name(self.styles[0])

    @property
    def name_dtype(self):
        """The dtype part of the engine file name, None for bf16/fp16."""
        return None if self.dtype in UNNAMED_DTYPES else self.dtype

    def file_name(self, style, *, down_moe=None):
        """The engine's file name (down_moe: of vLLM's `_down` file; default: as this config
        is); raises config_files.ConfigFileError for a _down config in vLLM's style."""
        return config_files.config_file_name(
            self.E,
            self.N,
            self.device_name,
            dtype=self.name_dtype,
            block_shape=self.block_shape,
            style=style,
            down_moe=self.down_moe if down_moe is None else down_moe,
        )

    def files(self, style):
        """[(file name, exact text)] the engine of style loads from this record: the file, and
        vLLM's `_down` file beside it where the record holds one."""
        files = [(self.file_name(style), self.engine_file_text(style))]
        if style == "vllm" and self.down_entries:
            files.append((self.down_file_name(), self.down_file_text()))
        return files

    def down_file_name(self):
        """vLLM's `_down` file name beside this file (get_moe_configs with down_moe)."""
        return self.file_name("vllm", down_moe=True)

    def down_file_text(self):
        """vLLM's `_down` file's exact content (down_entries)."""
        entries = {int(k): v for k, v in self.down_entries.items()}
        return config_files.dumps_config(entries, self.triton_version or None, vllm_down=True)

    def sorted_down_entries(self):
        return sorted(
            ((int(k), v) for k, v in (self.down_entries or {}).items()), key=lambda kv: kv[0]
        )

    def engine_file_text(self, style="vllm"):
        """The file's exact content, as the engine's own tuner writes it.

        SGLang reads every key as a batch size (its Triton version is the folder name), so its
        files carry no "triton_version" key.
        """
        entries = {int(k): v for k, v in self.entries.items()}
        version = self.triton_version or None if style == "vllm" else None
        return config_files.dumps_config(entries, version)

    @property
    def gpu_label(self):
        """Its GPU and that GPU's compute capability where moeops knows it: "NVIDIA RTX PRO
        6000 Blackwell Server Edition, compute capability 12.0"."""
        capability = devices.capability_of(self.device_name)
        if capability is None:
            return self.device_name
        return f"{self.device_name}, compute capability {devices.capability_text(capability)}"

    @property
    def other_names(self):
        """The names the same GPU also comes under (its other editions), each reading a file of
        its own."""
        return devices.same_gpu(self.device_name)[1:]

    def other_editions(self):
        """[(name, its newest file of this shape or None)] for each other name of its GPU
        (other_names), in one query."""
        names = self.other_names
        if not names:
            return []
        found = {}
        same = KernelConfig.objects.filter(
            device_name__in=names, E=self.E, N=self.N, dtype=self.dtype, down_moe=self.down_moe
        ).order_by("-version")
        for config in same:
            if config.block_shape == self.block_shape:
                found.setdefault(config.device_name, config)
        return [(name, found.get(name)) for name in names]

    @property
    def compile_check_note(self):
        """What compiling it for its GPU found, and that it was not timed there; "" for a file
        not compile-checked. A tuned file was timed on its GPU: it says nothing."""
        checked = self.compile_checked
        if not checked or self.source == "tuned":
            return ""
        kernel = checked.get("kernel") or {}
        title = ENGINE_TITLES.get(kernel.get("engine"), kernel.get("engine") or "")
        in_kernel = f" in {title} {kernel.get('version') or ''}".rstrip() + "'s kernel"
        deeper = checked.get("fewer_stages") or []
        fewer = (
            f"; {_batch_sizes(deeper)} with fewer pipeline stages than given, to fit"
            if deeper
            else ""
        )
        capability = checked["capability"]
        return (
            f"Compile-checked for compute capability {capability}{in_kernel if kernel else ''}"
            f" (Triton {checked.get('triton_version') or 'not recorded'}): every entry fits"
            f" {checked['limit_bytes']:,} bytes of shared memory per block (at most"
            f" {checked.get('max_shared_bytes') or 0:,}){fewer}. Not timed on {capability}:"
            f" a tune on a worker with such a GPU times it."
        )

    def timed_in(self):
        """The kernels its entries were timed in, as labels ("vLLM 0.33.0's own kernel"): the
        one it was tuned in and those of the tunes that wrote it; [] where none is recorded (an
        imported file). Reads self.tuning_runs (prefetch them for a list of configs)."""
        labels = [self.kernel_label, *(tune.kernel_label for tune in self.tuning_runs.all())]
        return list(dict.fromkeys(label for label in labels if label))

    def sorted_entries(self):
        return sorted(((int(k), v) for k, v in self.entries.items()), key=lambda kv: kv[0])

    def loads_for(self, shape, engine):
        """Whether engine loads this file for a kernel shape (Deployment.kernel_shape()): as
        KernelConfigQuerySet.for_shape selects, for one config in Python."""
        if not shape or not shape.get("device_name") or shape.get("dtype") is None:
            return False
        if self.down_moe and engine != "sglang":
            return False
        mine = (self.device_name, self.E, self.N, self.dtype, self.block_shape)
        wanted = ("device_name", "E", "N", "dtype", "block_shape")
        return mine == tuple(shape[key] for key in wanted)

    def loaded_by(self):
        """The deployments whose engine loads this file (loads_for), their launch recipes and
        GPUs read in a fixed number of queries."""
        from moeops.fleet.models import Deployment

        deployments = (
            Deployment.objects.filter(engine__in=ENGINE_TITLES)
            .select_related("model", "host")
            .prefetch_related("gpus", "host__gpus", "launch_recipes")
            .order_by("name")
        )
        return [d for d in deployments if self.loads_for(d.kernel_shape(), d.engine)]

    def series(self):
        """The stored versions of its (device, E, N, dtype, block shape, down) series, locked
        for update (call inside a transaction)."""
        same = KernelConfig.objects.select_for_update().filter(
            device_name=self.device_name,
            E=self.E,
            N=self.N,
            dtype=self.dtype,
            down_moe=self.down_moe,
        )
        # block_shape compared in Python: JSON null vs SQL NULL differ between databases
        return [c for c in same if c.block_shape == self.block_shape]

    def save_new_version(self):
        """Save as the next version of its series (never over a stored version)."""
        with transaction.atomic():
            self.pk = None
            self.version = max((c.version for c in self.series()), default=0) + 1
            self.save()
        return self


def _batch_sizes(sizes):
    """[64, 4096] → "M=64 and M=4096"."""
    said = [f"M={m}" for m in sizes]
    return said[0] if len(said) == 1 else ", ".join(said[:-1]) + f" and {said[-1]}"


def config_of_file(*, file_name, sha256, style):
    """The KernelConfig whose file, as moeops writes it in style (vllm, sglang), is the file
    named file_name with this SHA-256 (a file an engine loaded); None when moeops holds none.
    A file whose bytes moeops did not write (hand-edited, reformatted) is not matched."""
    try:
        name = config_files.parse_config_file_name(file_name)
    except config_files.ConfigFileError:
        return None
    configs = KernelConfig.objects.filter(
        device_name=config_files.nvml_device_name(name.device_name),
        E=name.E,
        N=name.N,
        dtype=name.dtype or "bf16",
        down_moe=name.down_moe,
    ).order_by("-version")
    for config in configs:
        text = config.engine_file_text(style)
        if hashlib.sha256(text.encode()).hexdigest() == sha256:
            return config
    return None


def kernel_source_of(engine, version) -> str:
    """The source hash of engine version's kernel as a tune recorded it, or "" where moeops has
    never timed that version's kernel."""
    for model in (TuningRun, KernelConfig):
        found = (
            model.objects.filter(kernel_engine=engine, kernel_version=version)
            .exclude(kernel_source_sha256="")
            .order_by("-created")
            .values_list("kernel_source_sha256", flat=True)
            .first()
        )
        if found:
            return found
    return ""


class TuningRun(Job, TimedKernel):
    """One tune of the fused-MoE kernel for a shape on a host's GPU(s): engine is the kernel
    asked for, kernel_* the one the worker timed and kernel_note which and why (the worker falls
    back to the builtin kernel where the engine is not installed on its host)."""

    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    body_sha256 = models.CharField(max_length=64, blank=True, help_text=BODY_SHA256_HELP)
    host = models.ForeignKey(
        "fleet.Host", models.SET_NULL, null=True, blank=True, related_name="tuning_runs"
    )
    deployment = models.ForeignKey(
        "fleet.Deployment", models.SET_NULL, null=True, blank=True, related_name="tuning_runs"
    )
    device_name = models.CharField(max_length=100, blank=True)
    E = models.PositiveIntegerField()
    N = models.PositiveIntegerField()
    hidden_size = models.PositiveIntegerField()
    topk = models.PositiveIntegerField()
    dtype = models.CharField(max_length=20, choices=KERNEL_DTYPES, default="bf16")
    block_shape = models.JSONField(null=True, blank=True)
    batch_sizes = models.JSONField(default=list, blank=True)
    engine = models.CharField(max_length=20, choices=REQUESTED_KERNELS, default="builtin")
    routing = models.CharField(
        max_length=40,
        default="uniform",
        help_text="what the timings drew their router choices under: uniform, zipf:S, "
        "dirichlet:A (tuning.routing)",
    )
    kernel_note = models.CharField(max_length=300, blank=True)
    status = models.CharField(max_length=20, choices=JOB_STATUSES, default="queued")
    progress = models.JSONField(default=dict, blank=True)
    result = models.ForeignKey(
        KernelConfig, models.SET_NULL, null=True, blank=True, related_name="tuning_runs"
    )
    # the plan item the tune carries out: its config is applied and re-swept once it succeeds
    plan_item = models.ForeignKey(
        "insights.PlanItem", models.SET_NULL, null=True, blank=True, related_name="tuning_runs"
    )
    wall_s = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)
    # as on a sweep run: whether the worker's NVML sampler ran, and its reason when it did not
    telemetry_status = models.CharField(
        max_length=20, choices=TELEMETRY_STATUSES, default="pending"
    )
    telemetry_detail = models.CharField(max_length=300, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self):
        # the host names where it runs; the GPU what it tunes for
        if self.host_id is None:
            where = self.device_name or "no host"
        else:
            where = f"{self.host.name} ({self.device_name or 'no GPU recorded'})"
        return f"tune E={self.E} N={self.N} {self.dtype} on {where}"

    @property
    def routing_label(self):
        """ "uniform", "Zipf 1.2", "Dirichlet α=0.3"."""
        try:
            return parse_routing(self.routing).label
        except RoutingError:
            return self.routing

    @property
    def kernel_fallback(self):
        """Why the worker timed the builtin kernel instead of the engine's asked for, or ""."""
        if self.engine == "builtin" or self.kernel_engine != "builtin":
            return ""
        return self.kernel_note


class TuningTiming(models.Model):
    """Per batch size: the written config's time (tuned_us) and where it comes from (picked),
    the engine's default and shipped configs' times, and the hardware floor."""

    run = models.ForeignKey(TuningRun, models.CASCADE, related_name="timings")
    batch_size = models.PositiveIntegerField()
    tuned_us = models.FloatField(null=True, blank=True)
    default_us = models.FloatField(null=True, blank=True)
    shipped_us = models.FloatField(
        null=True, blank=True, help_text="the engine's shipped file's entry; none without a file"
    )
    picked = models.CharField(max_length=20, choices=PICKS, blank=True)
    floor_us = models.FloatField(null=True, blank=True)
    grouped_mm_us = models.FloatField(null=True, blank=True)
    config = models.JSONField(null=True, blank=True)
    candidates_tried = models.PositiveIntegerField(null=True, blank=True)
    also_under = models.JSONField(
        null=True,
        blank=True,
        help_text="the written, default and shipped configs timed again under another routing "
        "than the tune's: {routing, tuned_us, default_us, shipped_us}",
    )

    class Meta:
        ordering = ["run", "batch_size"]
        constraints = [
            models.UniqueConstraint(fields=["run", "batch_size"], name="timing_unique_batch")
        ]

    def __str__(self):
        return f"M={self.batch_size}: {self.tuned_us} µs"

    def _per_tuned(self, us):
        """us / tuned_us, another time as a multiple of the tuned config's; None where either
        is missing (or 0)."""
        return us / self.tuned_us if us and self.tuned_us else None

    @property
    def speedup(self):
        return self._per_tuned(self.default_us)

    @property
    def shipped_speedup(self):
        return self._per_tuned(self.shipped_us)

    @property
    def floor_fraction(self):
        return self._per_tuned(self.floor_us)

    @property
    def other_routing_label(self):
        """The other routing the configs were timed under, in words; "" where none."""
        return routing_label(self.also_under["routing"]) if self.also_under else ""

    @property
    def loss_under_other_routing(self):
        """ "loses 9 % at M=64 under Zipf 1.2" where the written config, under the other
        routing, is slower than the better of the engine's own beyond the noise; "" else."""
        loss = loss_under(self.also_under)
        if loss is None:
            return ""
        return (
            f"loses {round(loss * 100)} % at M={self.batch_size} under {self.other_routing_label}"
        )


class EngineDiff(models.Model):
    """What changed in an engine's fused-MoE kernel between two versions for one shape and GPU,
    as `python -m tuning engine-diff --json` recorded it where both versions are installed
    (domain.engine_diff_report): the web tier shows it and runs no engine code."""

    engine = models.CharField(max_length=20, choices=KERNEL_ENGINES)
    from_version = models.CharField(max_length=100)
    to_version = models.CharField(max_length=100)
    device_name = models.CharField(max_length=100)
    shape = models.JSONField(help_text="tuning.search.KernelShape.as_dict()")
    report = models.JSONField(help_text="the --json report: both versions' records")
    provenance = models.CharField(max_length=300, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self):
        title = ENGINE_TITLES.get(self.engine, self.engine)
        return f"{title} {self.from_version} → {self.to_version} on {self.device_name}"

    def lines(self):
        """What changed, line by line, as the CLI prints it."""
        return engine_diff_report.compare(self.report["old"], self.report["new"])

    def tables(self):
        """[(title, [(batch size, old entry, new entry, changed)])]: the default rule's configs
        and the shipped files side by side."""
        old, new = self.report["old"], self.report["new"]
        return [
            (title, engine_diff_report.side_by_side(old[key], new[key]))
            for title, key in (
                ("Default rule", "defaults"),
                ("Shipped file", "shipped"),
                ("Shipped _down file", "shipped_down"),
            )
            if old[key] or new[key]
        ]
