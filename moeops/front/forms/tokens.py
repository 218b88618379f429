"""The form of the API tokens page (moeops.api.services.token_issue)."""

from django import forms

from moeops.fleet.models import Host


class TokenForm(forms.Form):
    name = forms.CharField(
        max_length=100, help_text="Who or what uses it: ci, worker-h200, a person's name."
    )
    host = forms.ModelChoiceField(
        Host.objects.order_by("name"),
        required=False,
        empty_label="(any host)",
        help_text="A token bound to a host writes only that host's data: give one to its worker.",
    )
    read_only = forms.BooleanField(required=False, help_text="A token that only reads.")
