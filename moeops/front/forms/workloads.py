"""The workloads page's form."""

from django import forms

from domain import workloads as workload_specs
from moeops.runs.models import WORKLOAD_KINDS


class WorkloadForm(forms.Form):
    """A workload, stored as POST /api/v1/workloads stores it: the fields its kind reads, and a
    dataset's file."""

    name = forms.CharField(max_length=100)
    kind = forms.ChoiceField(choices=WORKLOAD_KINDS, initial="random")
    description = forms.CharField(max_length=300, required=False)
    input_length = forms.CharField(
        required=False,
        initial="1024",
        help_text=f"random: prompt tokens, {workload_specs.LENGTH_SYNTAX}.",
    )
    # no pre-filled number: a dataset's (or a file's conversations') output left blank takes
    # each answer's length, and a filled-in default would silently replace them
    output_length = forms.CharField(
        required=False,
        widget=forms.TextInput(attrs={"placeholder": "128"}),
        help_text="Output tokens, written as the input's; a workload of a file left blank "
        "takes each answer's length.",
    )
    groups = forms.IntegerField(min_value=1, required=False, help_text="shared prefix: G")
    prefix_len = forms.IntegerField(
        min_value=1, required=False, help_text="shared prefix: tokens of each group's system prompt"
    )
    question_len = forms.IntegerField(
        min_value=1, required=False, help_text="shared prefix and multi-turn: question tokens"
    )
    turns = forms.IntegerField(
        min_value=1,
        required=False,
        help_text="multi-turn: T (with a file: at most T turns of each conversation, blank all)",
    )
    think_time_s = forms.FloatField(
        min_value=0, required=False, help_text="multi-turn: seconds between a turn and the next"
    )
    block_size = forms.IntegerField(
        min_value=1,
        required=False,
        help_text=f"trace: tokens per hash id (blank: {workload_specs.DEFAULT_BLOCK_SIZE}, as "
        "AIPerf reads a Mooncake trace)",
    )
    speed = forms.FloatField(
        required=False,
        help_text="trace: replayed this many times as fast (2: its timestamps halved; blank: 1)",
    )
    # an empty file is refused by domain.workloads, in a sentence that names it
    file = forms.FileField(
        required=False,
        allow_empty_file=True,
        help_text="dataset: ShareGPT JSON or JSONL, OpenAI messages JSONL, MT-bench questions, "
        "or one prompt a line; multi-turn: the conversations whose every turn it sends; "
        "trace: a Mooncake trace (JSONL or CSV of timestamp, input_length, output_length, "
        "hash_ids)",
    )
    context_len = forms.IntegerField(
        min_value=1,
        required=False,
        help_text="dataset: tokens a prompt may have; a longer one refuses the file",
    )

    def spec(self):
        """The spec its fields give (domain.workloads.spec_checked checks it)."""
        data = self.cleaned_data
        kind = data.get("kind")
        spec = {"kind": kind}
        lengths = (("input_length", "input"), ("output_length", "output"))
        for field, key in lengths:
            text = (data.get(field) or "").strip()
            if text:
                try:
                    spec[key] = workload_specs.parse_length(text, key)
                except workload_specs.WorkloadError as exc:
                    self.add_error(field, str(exc))
        for key in ("groups", "prefix_len", "question_len", "turns", "think_time_s"):
            if data.get(key) is not None:
                spec[key] = data[key]
        if kind == "trace":
            # a trace's lengths are its own: only how it is replayed is asked
            return {
                "kind": kind,
                **{k: data[k] for k in ("block_size", "speed") if data.get(k) is not None},
            }
        from_file = kind == "dataset" or (kind == "multi_turn" and data.get("file") is not None)
        if "output" not in spec and not from_file and not self.has_error("output_length"):
            self.add_error("output_length", f"output: a {kind} workload needs an output length")
        return spec
