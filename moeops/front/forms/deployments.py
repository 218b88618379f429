"""The deployment forms: the deployment itself (its model given by a config.json when new) and
its plan's items."""

import json
import re

from django import forms
from django.forms.fields import InvalidJSONInput

from domain.storable import MAX_BIG_INT, storable_json
from moeops.fleet.endpoints import endpoint_change_refusal
from moeops.fleet.models import GPU, Deployment, Host, ModelSpec, not_an_id, one_line
from moeops.front.forms.render import PAGE_FORMS
from moeops.insights.models import PLAN_STATUSES
from tuning.moe_params import MoEConfigError, moe_params


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


class PlanItemForm(forms.Form):
    default_renderer = PAGE_FORMS

    title = forms.CharField(
        max_length=300, widget=forms.TextInput(attrs={"placeholder": "New plan item"})
    )
    status = forms.ChoiceField(choices=PLAN_STATUSES, initial="pending")
