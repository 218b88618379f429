import json

from django import forms
from django.contrib import admin

from domain.topology import TopologyParseError, parse_nvidia_smi_topo
from moeops.admin_readonly import ReadOnlyAdmin
from moeops.fleet import services
from moeops.fleet.endpoints import endpoint_refusal
from moeops.fleet.forms import TopologyTextForm
from moeops.fleet.models import (
    GPU,
    Deployment,
    GPUReading,
    HealthCheck,
    Host,
    ModelSpec,
    SLOProfile,
    TopologySnapshot,
)
from tuning.moe_params import MoEConfigError

SHAPE_FIELDS = (
    "architecture",
    "model_type",
    "num_experts",
    "topk",
    "hidden_size",
    "moe_intermediate_size",
    "num_layers",
    "quantization",
    "block_shape",
)


def _read_json_upload(upload, field):
    try:
        return json.loads(upload.read().decode("utf-8"))
    except UnicodeDecodeError:
        raise forms.ValidationError({field: "The file is not UTF-8 text."}) from None
    except json.JSONDecodeError as exc:
        raise forms.ValidationError({field: f"The file is not JSON: {exc}"}) from None


class ModelSpecForm(forms.ModelForm):
    config_file = forms.FileField(
        required=False, help_text="Or upload config.json instead of pasting it."
    )
    quant_config_file = forms.FileField(
        required=False, help_text="Optional hf_quant_config.json (ModelOpt)."
    )

    class Meta:
        model = ModelSpec
        fields = ("name", "hf_repo_id", "config_json", "quant_config_json", "provenance")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Either the pasted JSON or the uploaded file is enough.
        self.fields["config_json"].required = False

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("config_file"):
            cleaned["config_json"] = _read_json_upload(cleaned["config_file"], "config_file")
        if cleaned.get("quant_config_file"):
            cleaned["quant_config_json"] = _read_json_upload(
                cleaned["quant_config_file"], "quant_config_file"
            )
        if self.errors:
            return cleaned
        if cleaned.get("config_json") in (None, ""):
            raise forms.ValidationError({"config_json": "Paste or upload the model's config.json."})
        self.instance.config_json = cleaned["config_json"]
        self.instance.quant_config_json = cleaned.get("quant_config_json")
        try:
            self.instance.fill_shape()
        except MoEConfigError as exc:
            raise forms.ValidationError({"config_json": f"config.json: {exc}"}) from None
        return cleaned


@admin.register(ModelSpec)
class ModelSpecAdmin(admin.ModelAdmin):
    form = ModelSpecForm
    list_display = ("name", "architecture", "num_experts", "topk", "hidden_size", "quantization")
    search_fields = ("name", "hf_repo_id", "architecture")
    readonly_fields = SHAPE_FIELDS
    fieldsets = (
        (None, {"fields": ("name", "hf_repo_id", "provenance")}),
        (
            "config.json",
            {"fields": ("config_json", "config_file", "quant_config_json", "quant_config_file")},
        ),
        ("MoE shape (read from config.json)", {"fields": SHAPE_FIELDS}),
    )


class GPUInline(admin.TabularInline):
    model = GPU
    extra = 0


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    list_display = ("name", "description", "price_per_gpu_hour", "currency", "created")
    search_fields = ("name",)
    inlines = [GPUInline]


class TopologySnapshotAddForm(TopologyTextForm, forms.ModelForm):
    """A snapshot from `nvidia-smi topo` text, parsed before anything is stored."""

    class Meta:
        model = TopologySnapshot
        fields = ("host", "provenance")

    def clean(self):
        data = super().clean()
        if not self.errors:
            try:
                parse_nvidia_smi_topo(**self.import_fields())
            except TopologyParseError as error:
                self.add_parse_error(error)
        return data


@admin.register(TopologySnapshot)
class TopologySnapshotAdmin(admin.ModelAdmin):
    """Snapshots are the host's history: one is added from `nvidia-smi topo` text through the
    same parser and service as the API and the host page, and never edited by hand."""

    list_display = ("host", "captured_at", "virtualization", "virtualization_technology", "source")
    list_filter = ("virtualization", "source", "host")
    date_hierarchy = "captured_at"
    add_form = TopologySnapshotAddForm

    def get_form(self, request, obj=None, **kwargs):
        if obj is None:
            kwargs["form"] = self.add_form
            kwargs["fields"] = ("host", "matrix_text", "p2p_kind", "p2p_text", "provenance")
        return super().get_form(request, obj, **kwargs)

    def has_change_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        row, created, changes = services.topology_import(
            host=form.cleaned_data["host"],
            provenance=form.cleaned_data["provenance"],
            **form.import_fields(),
        )
        # the admin's message and log name the row the service stored (or kept)
        for field in TopologySnapshot._meta.concrete_fields:
            setattr(obj, field.attname, getattr(row, field.attname))
        if not created:
            self.message_user(
                request, "Nothing changed from the host's current snapshot: none was added."
            )
        elif changes:
            self.message_user(request, "Changed: " + "; ".join(changes))


class DeploymentAdminForm(forms.ModelForm):
    """The deployment's fields, its endpoint held to the rule the pages and the API keep: the
    host's worker fetches that URL (fleet.endpoints). The admin makes its Meta."""

    def clean_endpoint_url(self):
        url = self.cleaned_data["endpoint_url"]
        host = self.cleaned_data.get("host")
        refusal = endpoint_refusal(host=host, url=url) if host is not None else ""
        if refusal:
            raise forms.ValidationError(refusal[:1].upper() + refusal[1:] + ".")
        return url


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    form = DeploymentAdminForm
    list_display = ("name", "model", "host", "engine", "tp", "ep", "status")
    list_filter = ("engine", "status", "host")
    search_fields = ("name", "served_model_name")
    filter_horizontal = ("gpus",)


@admin.register(SLOProfile)
class SLOProfileAdmin(admin.ModelAdmin):
    """Saved through SLOProfile.clean (the admin's form runs full_clean): the pages' and the
    API's rule."""

    list_display = ("name", "summary", "updated")
    search_fields = ("name",)


@admin.register(HealthCheck)
class HealthCheckAdmin(ReadOnlyAdmin):
    list_display = ("deployment", "checked_at", "status", "up", "latency_ms", "engine", "trigger")
    list_filter = ("status", "trigger", "deployment")
    list_select_related = ("deployment",)
    date_hierarchy = "checked_at"


@admin.register(GPUReading)
class GPUReadingAdmin(ReadOnlyAdmin):
    list_display = ("host", "taken_at", "status", "detail")
    list_filter = ("status", "host")
    list_select_related = ("host",)
    date_hierarchy = "taken_at"
