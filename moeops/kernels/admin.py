from django import forms
from django.contrib import admin

from moeops.admin_readonly import ReadOnlyAdmin
from moeops.kernels.models import EngineDiff, KernelConfig, TuningRun, TuningTiming
from moeops.kernels.services import kernel_config_store
from tuning.config_files import ConfigEntryError, shape_problems, validate_entries

# What names the kernel a config is for: a new version of the same shape is stored beside it.
SHAPE_FIELDS = ("device_name", "E", "N", "dtype", "block_shape", "down_moe")
# The fields kernel_config_store takes, as the admin's form edits them.
STORED_FIELDS = (
    *SHAPE_FIELDS,
    "triton_version",
    "entries",
    "source",
    "original_file_name",
    "provenance",
    "kernel_engine",
    "kernel_version",
    "kernel_source_sha256",
)


KERNEL_FACTS = ("kernel_engine", "kernel_version", "kernel_source_sha256")


def edited_entries_facts(form, user):
    """What the facts of a config become when its entries are edited by hand: the edited
    entries were neither tuned by moeops nor timed in the kernel the old ones were, so source,
    kernel and provenance say so, unless the same edit set them itself."""
    facts = {}
    changed = set(form.changed_data)
    if "source" not in changed:
        facts["source"] = "manual"
    if not changed & set(KERNEL_FACTS):
        facts |= dict.fromkeys(KERNEL_FACTS, "")
    if "provenance" not in changed:
        facts["provenance"] = f"v{form.instance.version}'s entries edited in the admin by {user}"
    return facts


class KernelConfigForm(forms.ModelForm):
    class Meta:
        model = KernelConfig
        fields = STORED_FIELDS

    def clean_entries(self):
        entries = self.cleaned_data["entries"]
        try:
            validated = validate_entries(entries)
        except ConfigEntryError as exc:
            raise forms.ValidationError(exc.errors) from None
        # Store with string keys in ascending batch order, as the engines' files have them.
        return {str(m): entry for m, entry in sorted(validated.items())}

    def clean_block_shape(self):
        shape = self.cleaned_data.get("block_shape")
        return None if shape in (None, "") else shape

    def clean(self):
        cleaned = super().clean()
        if "E" in cleaned and "N" in cleaned and "block_shape" in cleaned:
            problems = shape_problems(cleaned["E"], cleaned["N"], cleaned["block_shape"])
            for field, why in problems.items():
                self.add_error(field, f"{field} {why}")
        return cleaned


@admin.register(KernelConfig)
class KernelConfigAdmin(admin.ModelAdmin):
    form = KernelConfigForm
    list_display = (*SHAPE_FIELDS, "version", "source", "created")
    list_filter = ("device_name", "dtype", "down_moe", "source")
    readonly_fields = ("version",)

    def save_model(self, request, obj, form, change):
        # a version is never edited in place (runs and recipes point at it): an edit, like an
        # addition, is the series' next version, through the service the API uses
        if change and "entries" in form.changed_data:
            for name, value in edited_entries_facts(form, request.user).items():
                setattr(obj, name, value)
        fields = {name: getattr(obj, name) for name in STORED_FIELDS}
        stored, created = kernel_config_store(**fields)
        if not created and change and form.changed_data:
            # the same entries with other facts (provenance, source …): still the next version
            stored = obj.save_new_version()
        obj.pk, obj.version = stored.pk, stored.version


class TuningTimingInline(admin.TabularInline):
    model = TuningTiming
    extra = 0


@admin.register(TuningRun)
class TuningRunAdmin(admin.ModelAdmin):
    list_display = ("__str__", "host", "status", "created", "wall_s")
    list_filter = ("status", "host")
    inlines = [TuningTimingInline]


@admin.register(EngineDiff)
class EngineDiffAdmin(ReadOnlyAdmin):
    """Engine diffs come from `python -m tuning engine-diff --json` (the API, the kernels page):
    listed, shown and deleted here, never written, for an edited report would no longer be what
    the engines' sources said."""

    list_display = ("__str__", "engine", "from_version", "to_version", "device_name", "created")
    list_filter = ("engine", "device_name")
    readonly_fields = (
        "engine",
        "from_version",
        "to_version",
        "device_name",
        "shape",
        "report",
        "provenance",
        "created",
    )
