from django.contrib import admin

from moeops.insights.models import Finding, IncompatibilityRule, Note, PlanItem


@admin.register(Note)
class NoteAdmin(admin.ModelAdmin):
    list_display = ("title", "slug", "updated")
    prepopulated_fields = {"slug": ("title",)}
    search_fields = ("title", "body")


@admin.register(Finding)
class FindingAdmin(admin.ModelAdmin):
    list_display = ("title", "deployment", "kind", "severity", "state", "source", "created")
    list_filter = ("kind", "severity", "state", "source")
    search_fields = ("title", "text")


@admin.register(PlanItem)
class PlanItemAdmin(admin.ModelAdmin):
    list_display = ("title", "deployment", "status", "position")
    list_filter = ("status", "deployment")
    list_editable = ("status", "position")


@admin.register(IncompatibilityRule)
class IncompatibilityRuleAdmin(admin.ModelAdmin):
    list_display = ("name", "compute_capability", "engine", "launch_argument", "enabled")
    list_filter = ("enabled", "engine")
