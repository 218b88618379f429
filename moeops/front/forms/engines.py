"""The forms of a managed engine: its launch recipe (staff) and the actions on it."""

from django import forms

from moeops.fleet.models import MANAGEMENT
from moeops.kernels.models import KernelConfig


def _lines(text):
    return [line.strip() for line in text.splitlines() if line.strip()]


class RecipeForm(forms.Form):
    """A new launch recipe version: the command one argument per line (no shell), the
    environment one NAME=value per line."""

    management = forms.ChoiceField(choices=MANAGEMENT, initial="managed")
    argv = forms.CharField(
        label="Command",
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false"}),
        help_text="One argument per line, as the engine's argv (no shell, no quoting).",
    )
    env = forms.CharField(
        label="Environment",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        help_text="One NAME=value per line.",
    )
    cwd = forms.CharField(label="Working folder", max_length=500, required=False)
    gpu_indices = forms.CharField(
        label="GPUs", required=False, help_text="Indices, comma-separated (CUDA_VISIBLE_DEVICES)."
    )
    config_folder = forms.CharField(
        label="Kernel config folder",
        max_length=500,
        required=False,
        help_text="Where the engine reads tuned configs; blank: a folder of the worker's cache.",
    )
    ready_timeout_s = forms.FloatField(
        label="Wait for /health (s)", min_value=1, max_value=2 * 3600, initial=900
    )
    reason = forms.CharField(max_length=300, required=False, help_text="Why this change.")

    @classmethod
    def initial_from(cls, recipe, deployment):
        if recipe is None:
            return {"management": deployment.management, "gpu_indices": _gpus(deployment)}
        return {
            "management": deployment.management,
            "argv": "\n".join(recipe.argv),
            "env": "\n".join(f"{k}={v}" for k, v in recipe.env.items()),
            "cwd": recipe.cwd,
            "gpu_indices": ",".join(map(str, recipe.gpu_indices)),
            "config_folder": recipe.config_folder,
            "ready_timeout_s": recipe.ready_timeout_s,
        }

    def clean_argv(self):
        return _lines(self.cleaned_data["argv"])

    def clean_env(self):
        env = {}
        for line in _lines(self.cleaned_data["env"]):
            name, sep, value = line.partition("=")
            if not sep or not name.strip():
                raise forms.ValidationError(f"“{line}” is not NAME=value")
            env[name.strip()] = value
        return env

    def clean_gpu_indices(self):
        text = self.cleaned_data["gpu_indices"].replace(" ", "")
        try:
            return [int(part) for part in text.split(",") if part]
        except ValueError:
            raise forms.ValidationError("GPU indices are whole numbers, comma-separated") from None

    def recipe_fields(self):
        keys = ("argv", "env", "cwd", "gpu_indices", "config_folder", "ready_timeout_s", "reason")
        return {key: self.cleaned_data[key] for key in keys}


def _gpus(deployment):
    return ",".join(map(str, deployment.gpu_indices()))


class ArgsForm(forms.Form):
    """Restart with one flag changed, e.g. --max-num-seqs 64."""

    flag = forms.CharField(max_length=100, initial="--max-num-seqs")
    value = forms.CharField(max_length=1000)


class ApplyConfigForm(forms.Form):
    kernel_config = forms.ModelChoiceField(queryset=KernelConfig.objects.none())

    def __init__(self, *args, configs, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["kernel_config"].queryset = configs
