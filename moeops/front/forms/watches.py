"""The watch form of the deployment page: a sweep watch's schedule, load, alert channels and
whether it finds a regression's cause by itself (moeops.watches.services.watch_create)."""

import re

from django import forms
from django.db.models import Q

from moeops.front.forms.inputs import int_list
from moeops.front.forms.render import PAGE_FORMS
from moeops.runs.parameters import MAX_ROUNDS
from moeops.watches.models import AlertChannel


class WatchCreateForm(forms.Form):
    """A sweep watch of the deployment: its name, schedule (cron in UTC, or every N hours), the
    load of each run, and whether a regression finds its cause by itself."""

    default_renderer = PAGE_FORMS

    name = forms.CharField(max_length=200, initial="nightly")
    schedule = forms.CharField(
        max_length=200,
        initial="0 3 * * *",
        help_text='Cron, five fields in UTC ("0 3 * * *"), or every N hours ("6h").',
    )
    levels = forms.CharField(initial="8, 16", help_text="Concurrency levels, comma-separated.")
    input_len = forms.IntegerField(label="Input length (tokens)", min_value=1, initial=128)
    output_len = forms.IntegerField(label="Output length (tokens)", min_value=1, initial=128)
    prompts_per_level = forms.IntegerField(min_value=1, initial=64)
    rounds = forms.IntegerField(
        min_value=2, max_value=MAX_ROUNDS, initial=3,
        help_text="Times each level runs: a regression is judged beyond the noise of its rounds.",
    )  # fmt: skip
    channels = forms.ModelMultipleChoiceField(
        AlertChannel.objects.none(),
        required=False,
        label="Alert channels",
        widget=forms.CheckboxSelectMultiple,
        help_text="Where its alerts go; none ticked: the deployment's channels and the global "
        "ones.",
    )
    bisect_on_regression = forms.BooleanField(
        required=False,
        label="Find the cause by itself",
        help_text="On a regression of a managed engine, restart it with the baseline's value "
        "of one factor at a time and name the one that brings the figure back.",
    )

    def __init__(self, *args, deployment, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["channels"].queryset = AlertChannel.objects.filter(
            Q(deployment=deployment) | Q(deployment__isnull=True)
        ).order_by("name")

    LOAD = ("levels", "input_len", "output_len", "prompts_per_level", "rounds")
    EVERY_HOURS = re.compile(r"^(\d+)\s*h$")

    def clean_levels(self):
        return int_list(self.cleaned_data["levels"], field_name="levels")

    def schedule_kwargs(self):
        """{"cron": …} or {"every_hours": N} as the form's schedule says."""
        text = self.cleaned_data["schedule"].strip()
        every = self.EVERY_HOURS.match(text)
        return {"every_hours": int(every.group(1))} if every else {"cron": text}

    def parameters(self):
        return {key: self.cleaned_data[key] for key in self.LOAD}

    def add_service_errors(self, exc):
        """The service's refusal on the field it names (schedule.cron → schedule,
        parameters.levels → levels), the rest on the form."""
        for key, problems in exc.message_dict.items():
            field = key.removeprefix("parameters.").split(".")[0]
            for problem in problems:
                self.add_error(field if field in self.fields else None, problem)
