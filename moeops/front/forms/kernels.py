"""Kernel forms: a tune of a deployment's MoE shape, an engine's config file and an engine-diff
report uploaded."""

import json

from django import forms

from moeops.front.forms.inputs import int_list, uploaded_text
from moeops.front.forms.render import PAGE_FORMS
from tuning.config_files import TUNED_BATCH_SIZES, kernel_dtype, triton_config_unread
from tuning.engines import ENGINE_TITLES

TUNE_DTYPES = (("bf16", "bf16"), ("fp8_w8a8", "fp8 w8a8"))


class TuneForm(forms.Form):
    """A kernel tune of the deployment's MoE shape. kernel: the deployment's engine's own (vLLM,
    SGLang) or moeops' builtin one; tune_anyway, shown with the FP4 experts' reason
    (fp4_reason): tune them all the same (kernels.services.tuning_start refuses them else)."""

    default_renderer = PAGE_FORMS

    dtype = forms.ChoiceField(choices=TUNE_DTYPES)
    batch_sizes = forms.CharField(
        initial=",".join(map(str, TUNED_BATCH_SIZES)), help_text="Batch sizes M to tune."
    )
    # left out: the default, as for a form posted before the choice existed
    kernel = forms.ChoiceField(required=False)
    routing = forms.CharField(
        required=False,
        max_length=40,
        initial="uniform",
        label="Routing",
        help_text="What the timings draw router choices under: uniform, zipf:S (a few hot "
        "experts, popularity ∝ 1/rank^S, e.g. zipf:1.2) or dirichlet:A (hot experts drawn per "
        "set, e.g. dirichlet:0.3).",
    )
    also_under = forms.CharField(
        required=False,
        max_length=40,
        label="Also time under",
        help_text="Another routing to time the written file and the engine's own configs under, "
        "saying where the file loses there (e.g. zipf:1.2 for a uniform tune; a skewed tune is "
        "timed under uniform routing too).",
    )
    tune_anyway = forms.BooleanField(required=False, label="Tune anyway")

    def __init__(self, *args, deployment, **kwargs):
        super().__init__(*args, **kwargs)
        self.deployment = deployment
        # fp8 weights run the fp8 w8a8 kernel; the others are tuned in bf16
        if kernel_dtype(deployment.weight_quantization) == "fp8_w8a8":
            self.fields["dtype"].initial = "fp8_w8a8"
        kernels = [("builtin", "moeops' builtin kernel")]
        if deployment.engine in ENGINE_TITLES:
            own = (deployment.engine, f"the engine's own ({deployment.get_engine_display()})")
            kernels.insert(0, own)
        self.fields["kernel"].choices = kernels
        self.fields["kernel"].initial = kernels[0][0]
        self.fp4_reason = triton_config_unread(deployment.weight_quantization)
        if not self.fp4_reason:
            del self.fields["tune_anyway"]

    def clean_batch_sizes(self):
        return int_list(self.cleaned_data["batch_sizes"], field_name="batch sizes")

    def clean_routing(self):
        # left out: uniform, as a form posted before the choice existed
        return self.cleaned_data["routing"].strip() or "uniform"

    def clean_kernel(self):
        return self.cleaned_data["kernel"] or self.fields["kernel"].initial

    def add_refusal(self, refusal):
        """Show kernels.services.tuning_start's ValidationError: "force" at the tune-anyway
        box, "routing" at its field, the others above the form."""
        for field, messages in refusal.message_dict.items():
            for message in messages:
                if field == "force":
                    self.add_error(
                        "tune_anyway", f"{message} Tick “Tune anyway” to tune it all the same."
                    )
                elif field in ("routing", "also_under"):
                    self.add_error(field, message)
                else:
                    self.add_error(None, message)


class KernelConfigFileForm(forms.Form):
    """An engine's fused-MoE config file, stored as POST /api/v1/kernel-configs/import does:
    its name says the shape, device and dtype."""

    file = forms.FileField(label="Config file")
    file_name = forms.CharField(
        max_length=300,
        required=False,
        help_text="The engine's file name, when the upload was renamed (e.g. "
        "E=256,N=256,device_name=NVIDIA_H200.json).",
    )

    def clean_file(self):
        upload = self.cleaned_data["file"]
        self.text = uploaded_text(upload)
        return upload

    def engine_file_name(self):
        return self.cleaned_data.get("file_name") or self.cleaned_data["file"].name


class EngineDiffFileForm(forms.Form):
    """A `python -m tuning engine-diff --json` report, stored as POST /api/v1/engine-diffs
    does."""

    file = forms.FileField(label="engine-diff report (--json)")

    def clean_file(self):
        upload = self.cleaned_data["file"]
        try:
            self.report = json.loads(uploaded_text(upload))
        except ValueError:
            raise forms.ValidationError("The file is not JSON.") from None
        return upload
