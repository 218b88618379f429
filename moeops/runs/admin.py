from django.contrib import admin

from moeops.runs.models import EngineSample, LevelResult, SweepRun, TelemetrySample


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


@admin.register(SweepRun)
class SweepRunAdmin(admin.ModelAdmin):
    list_display = ("display_label", "deployment", "status", "source", "created")
    list_filter = ("status", "source", "deployment")
    search_fields = ("label", "uuid")
    readonly_fields = ("uuid",)
    inlines = [LevelResultInline]


@admin.register(LevelResult)
class LevelResultAdmin(admin.ModelAdmin):
    list_display = ("run", "concurrency", "request_rate", "output_throughput", "failed")
    list_filter = ("run__deployment",)


@admin.register(TelemetrySample)
class TelemetrySampleAdmin(admin.ModelAdmin):
    list_display = ("run", "gpu_index", "ts", "gpu_util", "power_w", "power_limit_w")
    list_filter = ("run__deployment",)


@admin.register(EngineSample)
class EngineSampleAdmin(admin.ModelAdmin):
    list_display = ("run", "ts", "running", "queued", "kv_cache_usage")
