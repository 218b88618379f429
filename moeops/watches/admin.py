"""Watches, alert channels and alerts in the admin. A watch is saved through
moeops.watches.services, so that its beat schedule (also under "Periodic tasks") follows it; a
webhook's URL is a secret: the form never shows it back, lists show its host only."""

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from moeops.watches import services
from moeops.watches.models import Alert, AlertAttempt, AlertChannel, Bisection, Watch, WatchRun


class WatchForm(forms.ModelForm):
    cron = forms.CharField(required=False, help_text="Five fields, UTC: 0 3 * * *")
    every_hours = forms.IntegerField(required=False, min_value=1)

    class Meta:
        model = Watch
        fields = (
            "deployment",
            "name",
            "kind",
            "parameters",
            "slo_profile",
            "window_start",
            "window_end",
            "enabled",
            "bisect_on_regression",
            "channels",
        )

    def clean_cron(self):
        cron = self.cleaned_data["cron"].strip()
        problem = cron and services.cron_problem(cron)
        if problem:
            raise ValidationError(problem)
        return cron

    def clean(self):
        """The service's refusals, on their fields, before anything is saved."""
        data = super().clean()
        cron, every = data.get("cron") or None, data.get("every_hours")
        if self.instance.pk is None and (cron is None) == (every is None):
            raise ValidationError("Give either a cron expression or every N hours.")
        deployment = data.get("deployment") or getattr(self.instance, "deployment", None)
        try:
            if deployment is not None and isinstance(data.get("parameters"), dict):
                services.watch_load(
                    deployment, data.get("kind"), data["parameters"], data.get("slo_profile")
                )
            services.check_window(data.get("window_start"), data.get("window_end"))
        except ValidationError as exc:
            for field, messages in exc.message_dict.items():
                field = field.split(".")[0]
                self.add_error(field if field in self.fields else None, messages)
        return data


@admin.register(Watch)
class WatchAdmin(admin.ModelAdmin):
    form = WatchForm
    list_display = ("name", "deployment", "kind", "schedule_label", "enabled", "baseline")
    list_filter = ("kind", "enabled")

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        schedule = {"cron": data.get("cron") or None, "every_hours": data.get("every_hours")}
        fields = {key: data[key] for key in WatchForm.Meta.fields if key != "deployment"}
        if change:
            services.watch_update(watch=obj, **schedule, **fields)
        else:
            obj.pk = services.watch_create(deployment=data["deployment"], **schedule, **fields).pk

    def delete_model(self, request, obj):
        services.watch_delete(watch=obj)


@admin.register(WatchRun)
class WatchRunAdmin(admin.ModelAdmin):
    list_display = ("watch", "fired_at", "status", "verdict", "figure", "reason")
    list_filter = ("status", "verdict")
    readonly_fields = [f.name for f in WatchRun._meta.fields]

    def has_add_permission(self, request):
        return False


class ChannelForm(forms.ModelForm):
    url = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Never shown back; leave empty to keep the one stored.",
    )

    class Meta:
        model = AlertChannel
        fields = ("name", "kind", "deployment", "url", "recipients", "enabled")

    def clean_url(self):
        return self.cleaned_data["url"] or self.instance.url

    def clean(self):
        data = super().clean()
        try:
            services.check_channel(data.get("kind"), data.get("url"), data.get("recipients") or [])
        except ValidationError as exc:
            for field, messages in exc.message_dict.items():
                self.add_error(field if field in self.fields else None, messages)
        return data


@admin.register(AlertChannel)
class AlertChannelAdmin(admin.ModelAdmin):
    form = ChannelForm
    list_display = ("name", "kind", "deployment", "target_label", "enabled")


class AttemptInline(admin.TabularInline):
    model = AlertAttempt
    extra = 0
    can_delete = False
    readonly_fields = ("number", "at", "ok", "status_code", "answer", "error")


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = ("subject", "channel", "kind", "status", "created", "error")
    list_filter = ("status", "kind")
    readonly_fields = [f.name for f in Alert._meta.fields]
    inlines = [AttemptInline]

    def has_add_permission(self, request):
        return False


@admin.register(Bisection)
class BisectionAdmin(admin.ModelAdmin):
    list_display = ("watch_run", "deployment", "status", "source", "created")
    list_filter = ("status", "source")
    readonly_fields = [f.name for f in Bisection._meta.fields]

    def has_add_permission(self, request):
        return False
