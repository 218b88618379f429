"""The SLO profiles page's form."""

from django import forms

from moeops.fleet.models import SLOProfile


class SLOProfileForm(forms.ModelForm):
    """A profile's limits; the model's own rule (SLOProfile.clean) refuses what is wrong."""

    class Meta:
        model = SLOProfile
        fields = (
            "name",
            "ttft_percentile",
            "ttft_ms",
            "tpot_percentile",
            "tpot_ms",
            "itl_percentile",
            "itl_ms",
            "e2el_percentile",
            "e2el_ms",
            "max_failed_percent",
        )
        labels = {
            "ttft_percentile": "TTFT percentile",
            "ttft_ms": "TTFT limit (ms)",
            "tpot_percentile": "TPOT percentile",
            "tpot_ms": "TPOT limit (ms)",
            "itl_percentile": "ITL percentile",
            "itl_ms": "ITL limit (ms)",
            "e2el_percentile": "E2E latency percentile",
            "e2el_ms": "E2E latency limit (ms)",
            "max_failed_percent": "Largest share of failed requests (%)",
        }
