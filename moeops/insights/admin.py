from django import forms
from django.contrib import admin

from moeops.insights import services
from moeops.insights.models import Finding, IncompatibilityRule, Note, PlanItem

NOTE_FIELDS = ("title", "slug", "body", "provenance")


class NoteAdminForm(forms.ModelForm):
    def clean(self):
        cleaned = super().clean()
        if cleaned.get("slug"):
            try:
                services.note_slug(title=cleaned.get("title") or "", slug=cleaned["slug"])
            except forms.ValidationError as exc:
                self.add_error(None, exc)
        return cleaned


@admin.register(Note)
class NoteAdmin(admin.ModelAdmin):
    form = NoteAdminForm
    fields = NOTE_FIELDS
    list_display = ("title", "slug", "updated")
    prepopulated_fields = {"slug": ("title",)}
    search_fields = ("title", "body")

    def save_model(self, request, obj, form, change):
        fields = {name: getattr(obj, name) for name in NOTE_FIELDS}
        if change:
            services.note_update(note=obj, **fields)
            return
        note, _ = services.note_create(**fields)
        obj.pk, obj.created, obj.updated = note.pk, note.created, note.updated


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
