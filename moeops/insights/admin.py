from django import forms
from django.contrib import admin

from moeops.insights import services
from moeops.insights.models import PLAN_STATUSES, Finding, IncompatibilityRule, Note, PlanItem

NOTE_FIELDS = ("title", "slug", "body", "provenance")
PLAN_ITEM_FIELDS = ("deployment", "title", "status", "finding", "note", "source", "provenance")


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
    readonly_fields = ("state_changed_by", "state_changed_at")

    def save_model(self, request, obj, form, change):
        # a state changed here is on record with who changed it, as from the pages
        state = obj.state
        if change and "state" in form.changed_data:
            obj.state = form.initial["state"]
        super().save_model(request, obj, form, change)
        if state != obj.state:
            services.finding_set_state(finding=obj, state=state, user=request.user)


class PlanItemAdminForm(forms.ModelForm):
    def clean_status(self):
        # a move the item cannot make is the form's error, not the save's (PLAN_MOVES)
        status = self.cleaned_data["status"]
        if self.instance.pk and not self.instance.can_move_to(status):
            raise forms.ValidationError(
                f"A {self.instance.get_status_display().lower()} item cannot become "
                f"{dict(PLAN_STATUSES)[status].lower()}: reopen it as pending first."
            )
        return status


@admin.register(PlanItem)
class PlanItemAdmin(admin.ModelAdmin):
    form = PlanItemAdminForm
    list_display = ("title", "deployment", "status", "position")
    list_filter = ("status", "deployment")
    list_editable = ("status", "position")

    def get_changelist_form(self, request, **kwargs):
        return super().get_changelist_form(request, form=PlanItemAdminForm, **kwargs)

    def save_model(self, request, obj, form, change):
        # the service keeps a plan's positions 0…n-1: a new item goes last, a position moves it
        position = obj.position if "position" in form.changed_data else None
        if change:
            # the other fields only: the status moves by compare-and-set, as from the pages
            rest = [name for name in form.changed_data if name not in ("position", "status")]
            if rest:
                obj.save(update_fields=rest)
            if "status" in form.changed_data:
                obj.status = form.initial["status"]
                services.plan_item_update(item=obj, status=form.cleaned_data["status"])
        else:
            fields = {name: getattr(obj, name) for name in PLAN_ITEM_FIELDS}
            item = services.plan_item_add(**fields)
            obj.pk, obj.position, obj.created = item.pk, item.position, item.created
        if position is not None:
            services.plan_item_update(item=obj, position=position)

    def delete_model(self, request, obj):
        services.plan_item_delete(item=obj)

    def delete_queryset(self, request, queryset):
        for item in queryset:
            services.plan_item_delete(item=item)


@admin.register(IncompatibilityRule)
class IncompatibilityRuleAdmin(admin.ModelAdmin):
    list_display = ("name", "compute_capability", "engine", "launch_argument", "enabled")
    list_filter = ("enabled", "engine")
