"""The browser UI's forms: deployments, sweeps, tunes, plan items, notes, run filters."""

import datetime as dt
import json
import re

from django import forms
from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS
from django.forms.fields import InvalidJSONInput

from domain import workloads as workload_specs
from domain.jobs import JOB_STATUSES
from domain.storable import MAX_BIG_INT, storable_json
from moeops.fleet.endpoints import endpoint_change_refusal
from moeops.fleet.models import (
    ENGINES,
    GPU,
    VIRTUALIZATION_KINDS,
    Deployment,
    Host,
    ModelSpec,
    SLOProfile,
    not_an_id,
    one_line,
)
from moeops.front.templatetags.moeops_format import duration
from moeops.insights.models import PLAN_STATUSES, Note
from moeops.insights.services import note_slug, note_taken_refusal
from moeops.kernels.models import KernelConfig
from moeops.runs import estimate
from moeops.runs.models import TUNED_KERNEL, WORKLOAD_KINDS, SweepRun, Workload
from moeops.runs.parameters import (
    DEFAULT_PROFILE_STEPS,
    MAX_CONCURRENCY,
    MAX_PROFILE_STEPS,
    MAX_ROUNDS,
    parameters_checked,
)
from tuning.config_files import TUNED_BATCH_SIZES, kernel_dtype, triton_config_unread
from tuning.engines import ENGINE_TITLES
from tuning.moe_params import MoEConfigError, moe_params

TUNE_DTYPES = (("bf16", "bf16"), ("fp8_w8a8", "fp8 w8a8"))
# The sweep form's presets: a first sweep that teaches in a minute (it crosses the stand-in's
# cap of 64, so it shows the plateau and the queue), and the write-up's full sweep.
SWEEP_PRESETS = {
    "quick": {
        "title": "quick (≈ 1 min on the stand-in)",
        "levels": "8,16,32,64,128",
        "input_len": 128,
        "output_len": 128,
        "prompts_per_level": 128,
        "warmup": 8,
    },
    "full": {
        "title": "full",
        "levels": "32,64,128,256,512,1024",
        "input_len": 1024,
        "output_len": 1024,
        "prompts_per_level": 1024,
        "warmup": 8,
    },
}


def _int_list(text, *, field_name):
    """ "32, 64,128" → [32, 64, 128]: positive, distinct, ascending."""
    try:
        values = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise forms.ValidationError(f"{field_name}: whole numbers separated by commas") from None
    if not values:
        raise forms.ValidationError(f"{field_name}: give at least one")
    if any(v < 1 for v in values):
        raise forms.ValidationError(f"{field_name}: every value must be at least 1")
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise forms.ValidationError(
            f"{field_name}: give each value once ({', '.join(map(str, repeated))} is given "
            "more than once)"
        )
    return sorted(values)


def _storable_loads(text):
    """The JSON value of text that PostgreSQL and SQLite both store; ValueError saying why not."""
    try:
        return storable_json(json.loads(text))
    except RecursionError:
        raise ValueError("nested too deep to read") from None


class StorableJSONField(forms.JSONField):
    """A JSON field whose value both databases store: NaN, NUL or nesting past what the reader
    follows is the field's error, not a failed write."""

    def to_python(self, value):
        try:
            value = super().to_python(value)
        except RecursionError:
            raise forms.ValidationError("Nested too deep to read.", code="invalid") from None
        try:
            return storable_json(value)
        except ValueError as exc:
            raise forms.ValidationError(f"{exc}.", code="invalid") from None

    def bound_data(self, data, initial):
        # the form shown again with the refused text reads it once more
        try:
            return super().bound_data(data, initial)
        except RecursionError:
            return InvalidJSONInput(data)


class RowsByIdField(forms.ModelMultipleChoiceField):
    """Rows picked by id: a value that is no id a column holds is refused as unknown before the
    `pk__in` query, which SQLite answers with OverflowError past 64 bits."""

    def _check_values(self, value):
        for pk in value:
            text = str(pk)
            if not (text.isascii() and text.isdigit() and int(text) <= MAX_BIG_INT):
                raise forms.ValidationError(
                    self.error_messages["invalid_pk_value"],
                    code="invalid_pk_value",
                    params={"pk": text if len(text) <= 20 else f"{text[:20]}…"},
                )
        return super()._check_values(value)


class EndpointField(forms.CharField):
    """An engine's URL. Engines on a team's network are plain http more often than not, so a URL
    without a scheme gets http://; the host may be a bare name (rtx-pro-6000), which Django's
    URLField refuses. Which addresses may be named is fleet.endpoints' rule (clean_endpoint_url).
    """

    def to_python(self, value):
        value = super().to_python(value)
        if value and not re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*://", value):
            value = f"http://{value}"
        return value


class DeploymentForm(forms.ModelForm):
    """A deployment of a model on record, or (new deployments) of a model given by its
    config.json, pasted or uploaded: a config identical to one on record reuses that model.
    TP and EP are checked against the model's MoE shape before anything is saved; new_model
    is then {"name", "config"} for the view to register, reused_model the model reused."""

    endpoint_url = EndpointField(
        required=False,
        label="Endpoint URL",
        help_text="The OpenAI-compatible server the host's worker sweeps, e.g. "
        "http://gpu-host:8000 (http:// is assumed).",
    )
    new_model_name = forms.CharField(
        max_length=200,
        required=False,
        validators=[not_an_id, one_line],
        label="New model's name",
        help_text="For a model not in the list, e.g. its Hugging Face repo id.",
    )
    config_text = forms.CharField(
        required=False,
        label="Its config.json",
        widget=forms.Textarea(attrs={"rows": 5, "class": "mono", "spellcheck": "false"}),
        help_text="Paste it, or upload it below; the MoE shape is read from it.",
    )
    config_file = forms.FileField(required=False, label="…or upload config.json")

    class Meta:
        model = Deployment
        fields = (
            "name",
            "model",
            "host",
            "gpus",
            "engine",
            "engine_version",
            "tp",
            "ep",
            "max_running_requests",
            "quantization",
            "attention_backend",
            "allreduce_fusion",
            "launch_args",
            "endpoint_url",
            "served_model_name",
            "engine_log",
            "status",
            "default_slo_profile",
        )
        field_classes = {"launch_args": StorableJSONField, "gpus": RowsByIdField}
        widgets = {
            "gpus": forms.CheckboxSelectMultiple,
            "launch_args": forms.Textarea(attrs={"rows": 3}),
            "allreduce_fusion": forms.NullBooleanSelect,
        }
        labels = {
            "gpus": "GPUs used",
            "tp": "TP",
            "ep": "EP",
            "launch_args": "Other launch arguments (JSON)",
            "default_slo_profile": "Default SLO profile",
            "engine_log": "Engine start-up log",
        }
        help_texts = {
            "gpus": "Leave empty to count the GPUs as max(tp, ep).",
            "launch_args": 'flag → value, e.g. {"--cuda-graph-max-bs": 256}',
            "engine_log": "An engine moeops does not start: the path of its start-up log on its "
            "host, which the worker reads for the run's engine paths.",
        }

    NEW_MODEL_FIELDS = ("new_model_name", "config_text", "config_file")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        # who saves: only staff may point the deployment at a new endpoint address
        self.user = user
        self.new_model = self.reused_model = None
        self.fields["model"].queryset = ModelSpec.objects.order_by("name")
        self.fields["host"].queryset = Host.objects.order_by("name")
        self.fields["gpus"].queryset = GPU.objects.select_related("host").order_by("host", "index")
        self.fields["gpus"].label_from_instance = lambda gpu: f"{gpu.host.name} · GPU{gpu.index}"
        if self.instance.pk:
            for name in self.NEW_MODEL_FIELDS:
                del self.fields[name]
        else:
            self.fields["model"].required = False
            self.fields["model"].empty_label = "— a new model, from its config.json below —"
            order = ["name", "model", *self.NEW_MODEL_FIELDS]
            self.order_fields(order + [f for f in self.fields if f not in order])

    def clean_launch_args(self):
        # an empty box is no other arguments, not a JSON null the column cannot hold
        args = self.cleaned_data["launch_args"]
        if args is None:
            return {}
        if not isinstance(args, dict):
            raise forms.ValidationError('Give flag → value pairs, e.g. {"--max-num-seqs": 256}.')
        return args

    def clean_endpoint_url(self):
        url = self.cleaned_data["endpoint_url"]
        host = self.cleaned_data.get("host")
        if host is not None:
            current = self.instance.endpoint_url
            refusal = endpoint_change_refusal(host=host, url=url, current=current, user=self.user)
            if refusal:
                raise forms.ValidationError(refusal[:1].upper() + refusal[1:] + ".")
        return url

    def clean(self):
        cleaned = super().clean()
        host, gpus = cleaned.get("host"), cleaned.get("gpus")
        if host and gpus:
            strangers = [gpu for gpu in gpus if gpu.host_id != host.pk]
            if strangers:
                self.add_error("gpus", f"Pick GPUs of {host.name} only.")
        config = None
        if not self.instance.pk:
            config = self._clean_model(cleaned)
        self._check_split(cleaned, config)
        return cleaned

    def _config_text(self, cleaned):
        """The pasted config.json, or the uploaded one's text, which is then kept in the
        textarea so that an error elsewhere does not lose it."""
        upload = cleaned.get("config_file")
        if upload is None:
            return (cleaned.get("config_text") or "").strip()
        try:
            text = upload.read().decode("utf-8")
        except UnicodeDecodeError:
            self.add_error("config_file", "config.json must be UTF-8 text.")
            return ""
        self.data = self.data.copy()
        self.data["config_text"] = text
        return text.strip()

    def _clean_model(self, cleaned):
        """The new model's config (a dict) when one is given, else None; sets new_model or
        reused_model (and cleaned["model"] to it)."""
        text, picked = self._config_text(cleaned), cleaned.get("model")
        if text and picked:
            self.add_error("config_text", "Pick a model on record or give a config.json, not both.")
            return None
        if not text:
            if not picked and "model" not in self.errors:
                self.add_error(
                    "model", "Pick a model on record, or paste or upload its config.json."
                )
            return None
        try:
            config = _storable_loads(text)
            if not isinstance(config, dict):
                raise ValueError(f"a JSON object, not {type(config).__name__}")
            moe_params(config)
        except ValueError as exc:
            self.add_error("config_text", f"config.json: {exc}")
            return None
        same = _same_model(config)
        if same is not None:
            cleaned["model"] = self.reused_model = same
            return None
        name = (cleaned.get("new_model_name") or "").strip()
        if not name:
            self.add_error("new_model_name", "Name the new model (e.g. its Hugging Face repo id).")
        elif ModelSpec.objects.filter(name=name).exists():
            self.add_error(
                "new_model_name",
                f"A model named “{name}” is on record with another config.json: pick it "
                "above, or name this one differently.",
            )
        else:
            self.new_model = {"name": name, "config": config}
        return config

    def _check_split(self, cleaned, config):
        """TP and EP against the MoE shape (of the model picked, or of the config given)."""
        tp, ep, model = cleaned.get("tp"), cleaned.get("ep"), cleaned.get("model")
        if tp is None or ep is None or (model is None and config is None):
            return
        quant = None
        if config is None:
            config, quant = model.config_json, model.quant_config_json
        try:
            moe_params(config, tp=tp, ep=ep, quant_config=quant)
        except MoEConfigError as exc:
            field = "ep" if str(exc).startswith("num_experts") else "tp"
            self.add_error(field, f"The MoE shape does not split over tp={tp}, ep={ep}: {exc}.")


def _same_model(config):
    """The ModelSpec on record whose config.json is this one (and no separate quant config)."""
    params = moe_params(config)
    candidates = ModelSpec.objects.filter(
        num_experts=params.num_experts,
        hidden_size=params.hidden_size,
        moe_intermediate_size=params.moe_intermediate_size,
        quant_config_json__isnull=True,
    )
    return next((m for m in candidates if m.config_json == config), None)


class WorkloadSelect(forms.Select):
    """The workload choice; a workload whose file sets the output lengths says so in its
    option's data-output (forms.js shows it in place of the sweep's output length)."""

    def create_option(self, name, value, *args, **kwargs):
        option = super().create_option(name, value, *args, **kwargs)
        workload = getattr(value, "instance", None)
        from_file = workload.output_from_file() if workload is not None else None
        if from_file:
            option["attrs"]["data-output"] = output_from_file_label(from_file)
        return option


def output_from_file_label(from_file):
    """ "the file's answers: mean 212 words (40 turns; 3 without one take the length above)"."""
    answered, unanswered = from_file["answered"], from_file["unanswered"]
    if from_file.get("trace"):
        return f"the trace's: mean {from_file['mean_words']:.0f} tokens ({answered} requests)"
    if not answered:
        return f"the file has no answers: its {unanswered} turns take the length above"
    text = f"the file's answers: mean {from_file['mean_words']:.0f} words ({answered} turns"
    if unanswered:
        text += f"; {unanswered} without one take the length above"
    return text + ")"


class SweepForm(forms.Form):
    label = forms.CharField(max_length=200, required=False)
    levels = forms.CharField(
        initial=SWEEP_PRESETS["quick"]["levels"], help_text="Concurrency levels, comma-separated."
    )
    input_len = forms.IntegerField(
        label="Input length (tokens)", min_value=1, initial=SWEEP_PRESETS["quick"]["input_len"]
    )
    output_len = forms.IntegerField(
        label="Output length (tokens)",
        min_value=1,
        required=False,
        initial=SWEEP_PRESETS["quick"]["output_len"],
        help_text="Left empty with a workload whose file has answers: each request's output is "
        "its answer's length.",
    )
    prompts_per_level = forms.IntegerField(
        min_value=1, initial=SWEEP_PRESETS["quick"]["prompts_per_level"]
    )
    warmup = forms.IntegerField(
        label="Warm-up requests", min_value=0, initial=SWEEP_PRESETS["quick"]["warmup"]
    )
    rounds = forms.IntegerField(
        initial=1,
        required=False,
        help_text=f"Times each level runs in a row (1 to {MAX_ROUNDS}); from 2 on, each level "
        "shows the median of its rounds and a 95 % interval.",
    )
    endpoint = forms.ChoiceField(
        choices=(("completions", "completions"), ("chat", "chat")), initial="completions"
    )
    request_rates = forms.CharField(
        label="Request rates (req/s)",
        required=False,
        help_text="Comma-separated: one level per rate, each capped by each concurrency above. "
        "Empty: each stream sends its next request when the last one ends.",
    )
    burstiness = forms.FloatField(
        required=False,
        help_text="Gaps between requests: 1 (or empty) Poisson, below 1 burstier, above 1 more "
        "even (vLLM's --burstiness).",
    )
    ramp_up_s = forms.FloatField(
        label="Ramp-up (s)",
        required=False,
        help_text="Each rate level's rate rises from 0 over these seconds.",
    )
    workload = forms.ModelChoiceField(
        queryset=Workload.objects.order_by("name", "-version"),
        required=False,
        widget=WorkloadSelect,
        empty_label="random token ids of the lengths above",
        help_text="What each request sends (the workloads page lists them); the lengths above "
        "then bound the sweep's total only, and a file's answers set the output lengths.",
    )
    profile_levels = forms.CharField(
        label="Profile levels",
        required=False,
        help_text="Concurrencies to profile inside the engine's step, comma-separated, each one "
        "of the levels above; empty: none. After a profiled level's rounds the engine records "
        "a window of steps with the torch profiler: a pass of its own that costs time, and "
        "needs an engine started with the profiler (vLLM: --profiler-config).",
    )
    profile_steps = forms.IntegerField(
        label="Profile steps",
        min_value=1,
        max_value=MAX_PROFILE_STEPS,
        initial=DEFAULT_PROFILE_STEPS,
        required=False,
        help_text="Engine steps each profiled window records.",
    )

    def __init__(self, *args, deployment, **kwargs):
        super().__init__(*args, **kwargs)
        self.deployment = deployment

    LOAD = (
        "levels",
        "input_len",
        "output_len",
        "prompts_per_level",
        "warmup",
        "rounds",
        "endpoint",
        "request_rates",
        "burstiness",
        "ramp_up_s",
    )

    def clean_levels(self):
        return _int_list(self.cleaned_data["levels"], field_name="levels")

    def clean_request_rates(self):
        text = self.cleaned_data["request_rates"].replace(" ", "")
        if not text:
            return None
        try:
            rates = [float(part) for part in text.split(",") if part]
        except ValueError:
            raise forms.ValidationError(
                "request_rates: numbers of req/s separated by commas"
            ) from None
        return sorted(rates)

    def clean_profile_levels(self):
        text = self.cleaned_data["profile_levels"].replace(" ", "")
        return _int_list(text, field_name="profile_levels") if text else None

    def clean_rounds(self):
        # left empty: once, as a sweep before rounds
        rounds = self.cleaned_data["rounds"]
        return 1 if rounds is None else rounds

    def clean_output_len(self):
        output_len = self.cleaned_data.get("output_len")
        # the workload is cleaned after this field: read its choice from the submitted data
        if output_len is None and not self._workload_sets_output():
            raise forms.ValidationError("output_len: a sweep needs a token count of at least 1")
        return output_len

    def _workload_sets_output(self):
        try:
            workload = self.fields["workload"].clean(self.data.get(self.add_prefix("workload")))
        except forms.ValidationError:
            return False
        from_file = workload.output_from_file() if workload is not None else None
        return bool(from_file and from_file["answered"] and not from_file["unanswered"])

    def clean(self):
        cleaned = super().clean()
        workload = cleaned.get("workload")
        if cleaned.get("output_len") is None and workload is not None:
            from_file = workload.output_from_file()
            if from_file and from_file["mean_words"]:
                # the answers set each request's output; their mean bounds the sweep's total
                cleaned["output_len"] = max(1, round(from_file["mean_words"]))
        try:
            parameters_checked(self.parameters())
        except forms.ValidationError as exc:
            self.add_parameter_errors(exc)
        if not self.deployment.endpoint_url:
            raise forms.ValidationError(
                "This deployment has no endpoint URL to send requests to; edit it first."
            )
        return cleaned

    def add_parameter_errors(self, exc):
        """Put a ValidationError of the run's parameters ("parameters.levels": …) on the field
        it names; what names no field of the form (the sweep's total, the endpoint) on the
        form."""
        for key, problems in exc.message_dict.items():
            field = key.removeprefix("parameters.")
            if field.startswith("profile"):
                field = "profile_steps" if "steps" in str(problems) else "profile_levels"
            for problem in problems:
                if field in self.fields:
                    # "0: …" is the place in the list, which the form's text does not show
                    problem = re.sub(r"^\d+: ", "", problem)
                    self.add_error(field, forms.ValidationError(f"{field}: {problem}"))
                else:
                    self.add_error(None, forms.ValidationError(problem, code="load"))

    def parameters(self):
        """The load as the run's parameters: what the form's fields hold (those that parsed;
        the arrival fields left empty are left out)."""
        load = {
            key: self.cleaned_data[key]
            for key in self.LOAD
            if key in self.cleaned_data
            and not (key in self.ARRIVALS and self.cleaned_data[key] is None)
        }
        if self.cleaned_data.get("workload") is not None:
            load["workload"] = self.cleaned_data["workload"].pk
        if self.cleaned_data.get("profile_levels"):
            steps = self.cleaned_data.get("profile_steps") or DEFAULT_PROFILE_STEPS
            load["profile"] = {"levels": self.cleaned_data["profile_levels"], "steps": steps}
        return load

    ARRIVALS = ("request_rates", "burstiness", "ramp_up_s")

    def estimate(self, runs=None):
        """ "Estimated duration: ≈ …" of the sweep as the form stands (valid or not); runs: as
        estimate.deployment_pace takes them."""
        pace, why = estimate.deployment_pace(self.deployment, runs)
        if pace is None:
            return f"No estimated duration: {why}."
        if self.is_bound:
            self.is_valid()
            data = self.cleaned_data
        else:
            data = {name: self[name].initial for name in self.fields}
            data["levels"] = _int_list(data["levels"], field_name="levels")
        keys = ("levels", "prompts_per_level", "output_len", "warmup")
        if any(data.get(key) is None for key in keys) or self.has_error(NON_FIELD_ERRORS, "load"):
            return "No estimated duration until levels, prompts and lengths are valid."
        seconds = estimate.sweep_seconds(
            pace,
            levels=data["levels"],
            prompts_per_level=data["prompts_per_level"],
            output_len=data["output_len"],
            warmup=data["warmup"],
            rounds=data.get("rounds") or 1,
            request_rates=data.get("request_rates") or (),
        )
        cap = f", at most {pace.cap} requests at once" if pace.cap else ""
        return f"Estimated duration: ≈ {duration(seconds)} (from {pace.basis}{cap})."


class CapacityForm(forms.Form):
    """A capacity search of the deployment: the largest load within an SLO profile
    (domain.capacity); the service writes the profile's limits into the run's parameters."""

    label = forms.CharField(max_length=200, required=False)
    slo_profile = forms.ModelChoiceField(
        SLOProfile.objects.all(), label="SLO profile", required=False, empty_label="(choose)"
    )
    mode = forms.ChoiceField(
        choices=(("concurrency", "concurrency"), ("request_rate", "request rate (req/s)")),
        initial="concurrency",
    )
    start = forms.FloatField(initial=1, help_text="The first load: concurrency, or req/s.")
    end = forms.FloatField(required=False, help_text="The highest load tried; empty: no end.")
    budget = forms.IntegerField(required=False, help_text="The most levels; empty: 20.")
    rounds = forms.IntegerField(
        initial=3, help_text=f"Times each level runs (1 to {MAX_ROUNDS}): its 95 % interval."
    )
    input_len = forms.IntegerField(label="Input length (tokens)", min_value=1, initial=1024)
    output_len = forms.IntegerField(label="Output length (tokens)", min_value=1, initial=256)
    endpoint = forms.ChoiceField(
        choices=(("completions", "completions"), ("chat", "chat")), initial="completions"
    )
    burstiness = forms.FloatField(
        required=False,
        help_text="Request-rate mode: the gaps between requests at every rate tried, 1 (or "
        "empty) Poisson, below 1 burstier (vLLM's --burstiness).",
    )
    ramp_up_s = forms.FloatField(
        label="Ramp-up (s)",
        required=False,
        help_text="Request-rate mode: each level's rate rises from 0 over these seconds.",
    )
    workload = forms.ModelChoiceField(
        queryset=Workload.objects.order_by("name", "-version"),
        required=False,
        empty_label="random token ids of the lengths above",
        help_text="What each request sends at every load tried (the workloads page lists them).",
    )

    def __init__(self, *args, deployment, **kwargs):
        super().__init__(*args, **kwargs)
        self.deployment = deployment
        self.fields["slo_profile"].initial = deployment.default_slo_profile_id

    def clean(self):
        cleaned = super().clean()
        no_profile = not cleaned.get("slo_profile") and "slo_profile" not in self.errors
        if no_profile and self.deployment.default_slo_profile_id is None:
            self.add_error(
                "slo_profile",
                "slo_profile: a capacity search needs an SLO profile with at least one limit.",
            )
        if not self.errors:
            try:
                parameters_checked(self.parameters())
            except forms.ValidationError as exc:
                self.add_parameter_errors(exc)
        return cleaned

    def add_parameter_errors(self, exc):
        """A ValidationError of the run's parameters on the field it names, else the form."""
        for key, problems in exc.message_dict.items():
            field = key.removeprefix("parameters.")
            for problem in problems:
                if field in self.fields:
                    self.add_error(field, forms.ValidationError(f"{field}: {problem}"))
                else:
                    self.add_error(None, forms.ValidationError(problem))

    def parameters(self):
        """The search as the run's parameters; a concurrency's start and end as integers."""
        data = self.cleaned_data
        whole = data.get("mode") == "concurrency"

        def load(value):
            return int(value) if whole and value is not None and value.is_integer() else value

        parameters = {
            "kind": "capacity",
            "mode": data.get("mode"),
            "start": load(data.get("start")),
            "end": load(data.get("end")),
            "budget": data.get("budget"),
            "rounds": data.get("rounds"),
            "input_len": data.get("input_len"),
            "output_len": data.get("output_len"),
            "endpoint": data.get("endpoint"),
            "burstiness": data.get("burstiness"),
            "ramp_up_s": data.get("ramp_up_s"),
        }
        if data.get("slo_profile"):
            parameters["slo_profile"] = str(data["slo_profile"].pk)
        if data.get("workload") is not None:
            parameters["workload"] = data["workload"].pk
        return {k: v for k, v in parameters.items() if v is not None}


class TuneForm(forms.Form):
    """A kernel tune of the deployment's MoE shape. kernel: the deployment's engine's own (vLLM,
    SGLang) or moeops' builtin one; tune_anyway, shown with the FP4 experts' reason
    (fp4_reason): tune them all the same (kernels.services.tuning_start refuses them else)."""

    dtype = forms.ChoiceField(choices=TUNE_DTYPES)
    batch_sizes = forms.CharField(
        initial=",".join(map(str, TUNED_BATCH_SIZES)), help_text="Batch sizes M to tune."
    )
    # left out: the default, as for a form posted before the choice existed
    kernel = forms.ChoiceField(required=False)
    routing = forms.CharField(
        required=False,
        max_length=40,
        initial="uniform",
        label="Routing",
        help_text="What the timings draw router choices under: uniform, zipf:S (a few hot "
        "experts, popularity ∝ 1/rank^S, e.g. zipf:1.2) or dirichlet:A (hot experts drawn per "
        "set, e.g. dirichlet:0.3).",
    )
    also_under = forms.CharField(
        required=False,
        max_length=40,
        label="Also time under",
        help_text="Another routing to time the written file and the engine's own configs under, "
        "saying where the file loses there (e.g. zipf:1.2 for a uniform tune; a skewed tune is "
        "timed under uniform routing too).",
    )
    tune_anyway = forms.BooleanField(required=False, label="Tune anyway")

    def __init__(self, *args, deployment, **kwargs):
        super().__init__(*args, **kwargs)
        self.deployment = deployment
        # fp8 weights run the fp8 w8a8 kernel; the others are tuned in bf16
        if kernel_dtype(deployment.weight_quantization) == "fp8_w8a8":
            self.fields["dtype"].initial = "fp8_w8a8"
        kernels = [("builtin", "moeops' builtin kernel")]
        if deployment.engine in ENGINE_TITLES:
            own = (deployment.engine, f"the engine's own ({deployment.get_engine_display()})")
            kernels.insert(0, own)
        self.fields["kernel"].choices = kernels
        self.fields["kernel"].initial = kernels[0][0]
        self.fp4_reason = triton_config_unread(deployment.weight_quantization)
        if not self.fp4_reason:
            del self.fields["tune_anyway"]

    def clean_batch_sizes(self):
        return _int_list(self.cleaned_data["batch_sizes"], field_name="batch sizes")

    def clean_routing(self):
        # left out: uniform, as a form posted before the choice existed
        return self.cleaned_data["routing"].strip() or "uniform"

    def clean_kernel(self):
        return self.cleaned_data["kernel"] or self.fields["kernel"].initial

    def add_refusal(self, refusal):
        """Show kernels.services.tuning_start's ValidationError: "force" at the tune-anyway
        box, "routing" at its field, the others above the form."""
        for field, messages in refusal.message_dict.items():
            for message in messages:
                if field == "force":
                    self.add_error(
                        "tune_anyway", f"{message} Tick “Tune anyway” to tune it all the same."
                    )
                elif field in ("routing", "also_under"):
                    self.add_error(field, message)
                else:
                    self.add_error(None, message)


def _uploaded_text(upload):
    """An uploaded file's text; ValidationError past the API's body limit or when not UTF-8."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if upload.size > limit:
        raise forms.ValidationError(
            f"The file is larger than {limit:,} bytes (MOEOPS_MAX_BODY_BYTES), as the API refuses."
        )
    try:
        return upload.read().decode("utf-8")
    except UnicodeDecodeError:
        raise forms.ValidationError("The file is not UTF-8 text.") from None


class ResultFileForm(forms.Form):
    """A benchmark result file for a deployment, imported as POST /api/v1/runs/import does."""

    format = forms.ChoiceField(
        choices=(
            ("sglang", "SGLang bench_serving (JSONL)"),
            ("vllm", "vLLM bench serve --save-result (JSON)"),
            ("moeops", "moeops per-request export (requests.jsonl or requests.csv)"),
        )
    )
    file = forms.FileField(label="Result file")
    label = forms.CharField(max_length=200, required=False)
    accept_mismatch = forms.BooleanField(
        required=False,
        label="Import it even where the file measured another model, TP, GPU count or engine",
    )

    def clean_file(self):
        upload = self.cleaned_data["file"]
        self.text = _uploaded_text(upload)
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


class KernelConfigFileForm(forms.Form):
    """An engine's fused-MoE config file, stored as POST /api/v1/kernel-configs/import does:
    its name says the shape, device and dtype."""

    file = forms.FileField(label="Config file")
    file_name = forms.CharField(
        max_length=300,
        required=False,
        help_text="The engine's file name, when the upload was renamed (e.g. "
        "E=256,N=256,device_name=NVIDIA_H200.json).",
    )

    def clean_file(self):
        upload = self.cleaned_data["file"]
        self.text = _uploaded_text(upload)
        return upload

    def engine_file_name(self):
        return self.cleaned_data.get("file_name") or self.cleaned_data["file"].name


class EngineDiffFileForm(forms.Form):
    """A `python -m tuning engine-diff --json` report, stored as POST /api/v1/engine-diffs
    does."""

    file = forms.FileField(label="engine-diff report (--json)")

    def clean_file(self):
        upload = self.cleaned_data["file"]
        try:
            self.report = json.loads(_uploaded_text(upload))
        except ValueError:
            raise forms.ValidationError("The file is not JSON.") from None
        return upload


class PlanItemForm(forms.Form):
    title = forms.CharField(
        max_length=300, widget=forms.TextInput(attrs={"placeholder": "New plan item"})
    )
    status = forms.ChoiceField(choices=PLAN_STATUSES, initial="pending")


class SLOProfileForm(forms.ModelForm):
    """A profile's limits; the model's own rule (SLOProfile.clean) refuses what is wrong."""

    class Meta:
        model = SLOProfile
        fields = (
            "name",
            "ttft_percentile",
            "ttft_ms",
            "tpot_percentile",
            "tpot_ms",
            "itl_percentile",
            "itl_ms",
            "e2el_percentile",
            "e2el_ms",
            "max_failed_percent",
        )
        labels = {
            "ttft_percentile": "TTFT percentile",
            "ttft_ms": "TTFT limit (ms)",
            "tpot_percentile": "TPOT percentile",
            "tpot_ms": "TPOT limit (ms)",
            "itl_percentile": "ITL percentile",
            "itl_ms": "ITL limit (ms)",
            "e2el_percentile": "E2E latency percentile",
            "e2el_ms": "E2E latency limit (ms)",
            "max_failed_percent": "Largest share of failed requests (%)",
        }


class NoteForm(forms.ModelForm):
    class Meta:
        model = Note
        fields = ("title", "slug", "body")
        widgets = {"body": forms.Textarea(attrs={"rows": 18, "class": "mono"})}
        help_texts = {"slug": "Leave empty to derive it from the title.", "body": "Markdown."}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["slug"].required = False

    def clean(self):
        cleaned = super().clean()
        try:
            slug = note_slug(title=cleaned.get("title") or "", slug=cleaned.get("slug") or "")
        except forms.ValidationError as exc:
            self.add_error(None, exc)
            return cleaned
        refusal = note_taken_refusal(slug=slug, note=self.instance)
        if refusal:
            self.add_error("slug", refusal)
        # the model's own checks (blank, unique) see the slug the note will have
        cleaned["slug"] = self.instance.slug = slug
        return cleaned


class RunFilterForm(forms.Form):
    """Filters of the runs list and of the compare page's run picker (GET)."""

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
        self.fields["model"].queryset = ModelSpec.objects.order_by("name")
        self.fields["deployment"].queryset = Deployment.objects.order_by("name")
        self.fields["host"].queryset = Host.objects.order_by("name")
        configs = KernelConfig.objects.order_by("device_name", "E", "N", "dtype", "-version")
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


class WorkloadForm(forms.Form):
    """A workload, stored as POST /api/v1/workloads stores it: the fields its kind reads, and a
    dataset's file."""

    name = forms.CharField(max_length=100)
    kind = forms.ChoiceField(choices=WORKLOAD_KINDS, initial="random")
    description = forms.CharField(max_length=300, required=False)
    input_length = forms.CharField(
        required=False,
        initial="1024",
        help_text=f"random: prompt tokens, {workload_specs.LENGTH_SYNTAX}.",
    )
    # no pre-filled number: a dataset's (or a file's conversations') output left blank takes
    # each answer's length, and a filled-in default would silently replace them
    output_length = forms.CharField(
        required=False,
        widget=forms.TextInput(attrs={"placeholder": "128"}),
        help_text="Output tokens, written as the input's; a workload of a file left blank "
        "takes each answer's length.",
    )
    groups = forms.IntegerField(min_value=1, required=False, help_text="shared prefix: G")
    prefix_len = forms.IntegerField(
        min_value=1, required=False, help_text="shared prefix: tokens of each group's system prompt"
    )
    question_len = forms.IntegerField(
        min_value=1, required=False, help_text="shared prefix and multi-turn: question tokens"
    )
    turns = forms.IntegerField(
        min_value=1,
        required=False,
        help_text="multi-turn: T (with a file: at most T turns of each conversation, blank all)",
    )
    think_time_s = forms.FloatField(
        min_value=0, required=False, help_text="multi-turn: seconds between a turn and the next"
    )
    block_size = forms.IntegerField(
        min_value=1,
        required=False,
        help_text=f"trace: tokens per hash id (blank: {workload_specs.DEFAULT_BLOCK_SIZE}, as "
        "AIPerf reads a Mooncake trace)",
    )
    speed = forms.FloatField(
        required=False,
        help_text="trace: replayed this many times as fast (2: its timestamps halved; blank: 1)",
    )
    # an empty file is refused by domain.workloads, in a sentence that names it
    file = forms.FileField(
        required=False,
        allow_empty_file=True,
        help_text="dataset: ShareGPT JSON or JSONL, OpenAI messages JSONL, MT-bench questions, "
        "or one prompt a line; multi-turn: the conversations whose every turn it sends; "
        "trace: a Mooncake trace (JSONL or CSV of timestamp, input_length, output_length, "
        "hash_ids)",
    )
    context_len = forms.IntegerField(
        min_value=1,
        required=False,
        help_text="dataset: tokens a prompt may have; a longer one refuses the file",
    )

    def spec(self):
        """The spec its fields give (domain.workloads.spec_checked checks it)."""
        data = self.cleaned_data
        kind = data.get("kind")
        spec = {"kind": kind}
        lengths = (("input_length", "input"), ("output_length", "output"))
        for field, key in lengths:
            text = (data.get(field) or "").strip()
            if text:
                try:
                    spec[key] = workload_specs.parse_length(text, key)
                except workload_specs.WorkloadError as exc:
                    self.add_error(field, str(exc))
        for key in ("groups", "prefix_len", "question_len", "turns", "think_time_s"):
            if data.get(key) is not None:
                spec[key] = data[key]
        if kind == "trace":
            # a trace's lengths are its own: only how it is replayed is asked
            return {
                "kind": kind,
                **{k: data[k] for k in ("block_size", "speed") if data.get(k) is not None},
            }
        from_file = kind == "dataset" or (kind == "multi_turn" and data.get("file") is not None)
        if "output" not in spec and not from_file and not self.has_error("output_length"):
            self.add_error("output_length", f"output: a {kind} workload needs an output length")
        return spec
