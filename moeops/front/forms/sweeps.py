"""The deployment page's load forms: a sweep (with its presets and workload choice) and a
capacity search."""

import re
from functools import cached_property

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS

from moeops.fleet.models import SLOProfile
from moeops.front.forms.inputs import int_list
from moeops.front.forms.render import PAGE_FORMS
from moeops.front.templatetags.moeops_format import duration
from moeops.runs import estimate
from moeops.runs.models import Workload
from moeops.runs.parameters import (
    DEFAULT_PROFILE_STEPS,
    MAX_PROFILE_STEPS,
    MAX_ROUNDS,
    parameters_checked,
)

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


def _endpoint_field():
    return forms.ChoiceField(
        choices=(("completions", "completions"), ("chat", "chat")), initial="completions"
    )


def _ramp_up_field(help_text):
    return forms.FloatField(label="Ramp-up (s)", required=False, help_text=help_text)


def _workload_field(help_text, **kwargs):
    """The workload a sweep or a capacity search sends; none: random token ids."""
    return forms.ModelChoiceField(
        queryset=Workload.objects.order_by("name", "-version"),
        required=False,
        empty_label="random token ids of the lengths above",
        help_text=help_text,
        **kwargs,
    )


class WorkloadSelect(forms.Select):
    """The workload choice; a workload whose file sets the output lengths says so in its
    option's data-output (forms.js shows it in place of the sweep's output length)."""

    def create_option(self, name, value, *args, **kwargs):
        option = super().create_option(name, value, *args, **kwargs)
        workload = getattr(value, "instance", None)
        from_file = workload.output_from_file() if workload is not None else None
        if from_file:
            option["attrs"]["data-output"] = output_from_file_label(from_file)
        from_trace = workload.input_from_trace() if workload is not None else None
        if from_trace:
            option["attrs"]["data-input"] = input_from_trace_label(from_trace)
        return option


def input_from_trace_label(from_trace):
    """ "the trace's: mean 2,048 tokens (40 requests)"."""
    return (
        f"the trace's: mean {from_trace['mean_tokens']:,.0f} tokens "
        f"({from_trace['requests']} requests)"
    )


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
    default_renderer = PAGE_FORMS

    label = forms.CharField(max_length=200, required=False)
    levels = forms.CharField(
        initial=SWEEP_PRESETS["quick"]["levels"], help_text="Concurrency levels, comma-separated."
    )
    input_len = forms.IntegerField(
        label="Input length (tokens)",
        min_value=1,
        required=False,
        initial=SWEEP_PRESETS["quick"]["input_len"],
        help_text="Not asked with a trace workload: each request sends its own input length.",
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
    endpoint = _endpoint_field()
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
    ramp_up_s = _ramp_up_field("Each rate level's rate rises from 0 over these seconds.")
    workload = _workload_field(
        "What each request sends (the workloads page lists them); the lengths above then bound "
        "the sweep's total only, and a file's answers set the output lengths.",
        widget=WorkloadSelect,
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
        return int_list(self.cleaned_data["levels"], field_name="levels")

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
        return int_list(text, field_name="profile_levels") if text else None

    def clean_rounds(self):
        # left empty: once, as a sweep before rounds
        rounds = self.cleaned_data["rounds"]
        return 1 if rounds is None else rounds

    def clean_input_len(self):
        input_len = self.cleaned_data.get("input_len")
        if input_len is None and not self._workload_sets_input():
            raise forms.ValidationError("input_len: a sweep needs a token count of at least 1")
        return input_len

    def clean_output_len(self):
        output_len = self.cleaned_data.get("output_len")
        if output_len is None and not self._workload_sets_output():
            raise forms.ValidationError("output_len: a sweep needs a token count of at least 1")
        return output_len

    @cached_property
    def _workload_chosen(self):
        """The workload chosen, read from the submitted data (once: both length fields ask):
        it is cleaned after the length fields that depend on it; None where none (or none
        valid) is chosen."""
        try:
            return self.fields["workload"].clean(self.data.get(self.add_prefix("workload")))
        except forms.ValidationError:
            return None

    def _workload_sets_input(self):
        workload = self._workload_chosen
        return bool(workload and workload.input_from_trace())

    def _workload_sets_output(self):
        workload = self._workload_chosen
        from_file = workload.output_from_file() if workload is not None else None
        return bool(from_file and from_file["answered"] and not from_file["unanswered"])

    def clean(self):
        cleaned = super().clean()
        workload = cleaned.get("workload")
        from_trace = workload.input_from_trace() if workload is not None else None
        if from_trace:
            # a trace sends each request's own input length: the run records their mean, not
            # a number the form held that nothing sent
            cleaned["input_len"] = max(1, round(from_trace["mean_tokens"]))
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

    def estimate(self, runs=None, checks=None):
        """ "Estimated duration: ≈ …" of the sweep as the form stands (valid or not); runs and
        checks: as estimate.deployment_pace takes them."""
        pace, why = estimate.deployment_pace(self.deployment, runs, checks)
        if pace is None:
            return f"No estimated duration: {why}."
        if self.is_bound:
            self.is_valid()
            data = self.cleaned_data
        else:
            data = {name: self[name].initial for name in self.fields}
            data["levels"] = int_list(data["levels"], field_name="levels")
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

    default_renderer = PAGE_FORMS

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
    endpoint = _endpoint_field()
    burstiness = forms.FloatField(
        required=False,
        help_text="Request-rate mode: the gaps between requests at every rate tried, 1 (or "
        "empty) Poisson, below 1 burstier (vLLM's --burstiness).",
    )
    ramp_up_s = _ramp_up_field(
        "Request-rate mode: each level's rate rises from 0 over these seconds."
    )
    workload = _workload_field(
        "What each request sends at every load tried (the workloads page lists them)."
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
