"""Run forms: a result file imported as a run, a level's traces uploaded, and the filters of
the runs list and the compare page's picker."""

import datetime as dt

from django import forms

from domain.jobs import JOB_STATUSES
from moeops.fleet.models import ENGINES, VIRTUALIZATION_KINDS, Deployment, Host, ModelSpec
from moeops.front.forms.inputs import uploaded_text
from moeops.front.forms.render import PAGE_FORMS
from moeops.kernels.models import KernelConfig
from moeops.runs.models import TUNED_KERNEL, SweepRun
from moeops.runs.parameters import MAX_CONCURRENCY


class ResultFileForm(forms.Form):
    """A benchmark result file for a deployment, imported as POST /api/v1/runs/import does."""

    default_renderer = PAGE_FORMS

    format = forms.ChoiceField(
        choices=(
            ("sglang", "SGLang bench_serving (JSONL)"),
            ("vllm", "vLLM bench serve --save-result (JSON)"),
            ("moeops", "moeops per-request export (requests.jsonl or requests.csv)"),
            ("aiperf", "AIPerf profile_export_aiperf.json (one concurrency)"),
            ("guidellm", "guidellm benchmarks.json"),
            ("inference-perf", "inference-perf stage_N_lifecycle_metrics.json (one stage)"),
        )
    )
    file = forms.FileField(label="Result file")
    requests_file = forms.FileField(
        label="Second file: AIPerf's per-request records (profile_export.jsonl) or "
        "inference-perf's run configuration (config.yml)",
        required=False,
        help_text="AIPerf: profile_export.jsonl beside its summary, kept as the level's "
        "requests. inference-perf: the config.yml given to --config_file (or config.yaml of its "
        "report folder), which names the model and engine.",
    )
    label = forms.CharField(max_length=200, required=False)
    accept_mismatch = forms.BooleanField(
        required=False,
        label="Import it even where the file measured another model, TP, GPU count or engine",
    )

    def clean_file(self):
        upload = self.cleaned_data["file"]
        self.text = uploaded_text(upload)
        return upload

    def clean_requests_file(self):
        upload = self.cleaned_data["requests_file"]
        self.requests_text = uploaded_text(upload) if upload else ""
        return upload


class TraceUploadForm(forms.Form):
    """Traces of a profiled window captured by hand, for a level of a run: read by the web tier
    as POST /api/v1/runs/{ref}/profiles/upload reads them (runs.services.profile_upload)."""

    concurrency = forms.IntegerField(min_value=1, max_value=MAX_CONCURRENCY)
    request_rate = forms.FloatField(
        label="Request rate (req/s)",
        required=False,
        min_value=0.001,
        help_text="Of a rate level; empty: the level sent without a rate.",
    )
    file = forms.FileField(
        label="Trace file",
        help_text="A .zip of the ranks' traces, or one .json.gz or .json trace (torch profiler).",
    )


class RunFilterForm(forms.Form):
    """Filters of the runs list and of the compare page's run picker (GET)."""

    default_renderer = PAGE_FORMS

    model = forms.ModelChoiceField(ModelSpec.objects.none(), required=False, empty_label="any")
    deployment = forms.ModelChoiceField(
        Deployment.objects.none(), required=False, empty_label="any"
    )
    host = forms.ModelChoiceField(
        Host.objects.none(), required=False, to_field_name="name", empty_label="any"
    )
    virtualization = forms.ChoiceField(choices=(("", "any"), *VIRTUALIZATION_KINDS), required=False)
    engine = forms.ChoiceField(choices=(("", "any"), *ENGINES), required=False)
    kernel = forms.ChoiceField(label="Kernel config", required=False)
    status = forms.ChoiceField(choices=(("", "any"), *JOB_STATUSES), required=False)
    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # the choices show names (and a kernel config's file name): the model's config.json
        # and a config's tuned entries, large JSON, are not read
        self.fields["model"].queryset = ModelSpec.objects.order_by("name").only("id", "name")
        self.fields["deployment"].queryset = Deployment.objects.order_by("name").only("id", "name")
        self.fields["host"].queryset = Host.objects.order_by("name").only("id", "name")
        configs = KernelConfig.objects.order_by("device_name", "E", "N", "dtype", "-version").defer(
            "entries", "down_entries", "compile_checked"
        )
        self.fields["kernel"].choices = [
            ("", "any"),
            ("tuned", "a tuned config"),
            ("default", "the engine's default"),
            *((str(c.pk), str(c)) for c in configs),
        ]

    def filter(self, runs):
        """`runs` narrowed by the valid filters; an invalid form filters nothing."""
        if not self.is_valid():
            return runs
        data = self.cleaned_data
        if data["model"]:
            runs = runs.filter(deployment__model=data["model"])
        if data["deployment"]:
            runs = runs.filter(deployment=data["deployment"])
        if data["host"]:
            runs = runs.filter(deployment__host=data["host"])
        if data["virtualization"]:
            runs = runs.filter(topology_snapshot__virtualization=data["virtualization"])
        if data["engine"]:
            runs = runs.filter(deployment__engine=data["engine"])
        if data["kernel"] == "tuned":
            runs = runs.filter(TUNED_KERNEL)
        elif data["kernel"] == "default":
            # a subquery: NOT over JSON keys a run lacks would be NULL, and drop the run
            runs = runs.exclude(pk__in=SweepRun.objects.filter(TUNED_KERNEL).values("pk"))
        elif data["kernel"]:
            runs = runs.filter(kernel_config_id=int(data["kernel"]))
        if data["status"]:
            runs = runs.filter(status=data["status"])
        if data["since"]:
            runs = runs.filter(created__gte=_day_start(data["since"]))
        if data["until"]:
            runs = runs.filter(created__lt=_day_start(data["until"] + dt.timedelta(days=1)))
        return runs

    def is_filtering(self):
        return self.is_valid() and any(self.cleaned_data.values())


def _day_start(day):
    return dt.datetime.combine(day, dt.time.min, tzinfo=dt.UTC)
