from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from moeops.admin_readonly import ReadOnlyAdmin
from moeops.runs.models import LevelProfile, LevelResult, LevelRound, SweepRun, Workload
from moeops.runs.parameters import parameters_checked
from moeops.runs.samples import EngineSample, TelemetrySample


class LevelResultInline(admin.TabularInline):
    model = LevelResult
    extra = 0
    fields = (
        "concurrency",
        "request_rate",
        "completed",
        "failed",
        "output_throughput",
        "total_token_throughput",
        "median_ttft_ms",
        "median_tpot_ms",
    )
    show_change_link = True


class SweepRunForm(forms.ModelForm):
    def clean_parameters(self):
        try:
            return parameters_checked(self.cleaned_data["parameters"])
        except ValidationError as exc:
            lines = [f"{key}: {'; '.join(msgs)}" for key, msgs in exc.message_dict.items()]
            raise forms.ValidationError(lines) from None


@admin.register(SweepRun)
class SweepRunAdmin(admin.ModelAdmin):
    form = SweepRunForm
    list_display = ("display_label", "deployment", "status", "source", "created")
    list_filter = ("status", "source", "deployment")
    search_fields = ("label", "uuid")
    readonly_fields = ("uuid",)
    inlines = [LevelResultInline]


class LevelRoundInline(admin.TabularInline):
    """A level's rounds as the worker sent them: read-only, as the level's figures are merged
    from them when a round is stored (measurements.level_record)."""

    model = LevelRound
    extra = 0
    fields = readonly_fields = ("round", "attempt", "figures", "created")
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(LevelResult)
class LevelResultAdmin(admin.ModelAdmin):
    list_display = (
        "run",
        "concurrency",
        "request_rate",
        "output_throughput",
        "failed",
        "round_count",
    )
    list_filter = ("run__deployment",)
    inlines = [LevelRoundInline]


class SampleAdmin(ReadOnlyAdmin):
    """Read-only: samples are stored through runs.measurements, which sums them per time bucket
    (runs.rollup) as it stores them; one added, edited or deleted here would leave the charts'
    sums behind. A run's deletion takes its samples and sums together."""

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(TelemetrySample)
class TelemetrySampleAdmin(SampleAdmin):
    list_display = ("run", "gpu_index", "ts", "gpu_util", "power_w", "power_limit_w")
    list_filter = ("run__deployment",)


@admin.register(EngineSample)
class EngineSampleAdmin(SampleAdmin):
    list_display = ("run", "ts", "running", "queued", "kv_cache_usage")


@admin.register(Workload)
class WorkloadAdmin(ReadOnlyAdmin):
    """Read-only: a new version is stored through the workloads page or the API
    (runs.workloads.workload_store), which checks its spec and file; a stored version that runs
    recorded is never rewritten."""

    list_display = ("name", "version", "kind", "file_name", "item_count", "created")
    list_filter = ("kind",)
    search_fields = ("name", "sha256")
    readonly_fields = (
        "name",
        "version",
        "kind",
        "spec",
        "description",
        "file_name",
        "sha256",
        "layout",
        "item_count",
        "created",
    )
    exclude = ("items",)


@admin.register(LevelProfile)
class LevelProfileAdmin(ReadOnlyAdmin):
    """Read-only: a profile is stored through runs.measurements.profile_record (the worker's push,
    traces uploaded on the run page), which keys it and hashes its body; one edited here would
    no longer match the body a repeat sends."""

    list_display = ("run", "concurrency", "request_rate", "attempt", "source", "status", "created")
    list_filter = ("status", "source", "run__deployment")
