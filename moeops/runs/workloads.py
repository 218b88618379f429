"""Writes to workloads: a new version of a named workload from its spec and, for a dataset or
a multi-turn workload of a file's conversations, its file (domain.workloads parses and checks
it; nothing of a refused file is stored); and what a workload's page shows of it: its length
distributions and the runs that sent it."""

import hashlib
import json

from django.core.exceptions import ValidationError
from django.db import transaction

from domain import traces, workloads
from moeops.runs.models import LevelResult, SweepRun, Workload


def workload_store(*, name, spec, file_name="", data=None, context_len=None, description=""):
    """(Workload, created): the next version of the workload `name`, or its newest version when
    that holds the same spec and file (created False).

    spec: domain.workloads' spec (kind, lengths in tokens, …); data: the file's bytes (kind
    dataset; trace, its requests (domain.traces); or multi_turn: its questions then come from
    the file's conversations, the spec marked from_file), context_len: tokens a question may
    have. Raises ValidationError naming "name", "spec.<key>" or "file" (the file's name, line
    and reason).
    """
    name = (name or "").strip()
    if not name:
        raise ValidationError({"name": "a workload needs a name"})
    if isinstance(spec, dict) and spec.get("kind") == "multi_turn" and data is not None:
        spec = {**spec, "from_file": True}
    try:
        checked = workloads.spec_checked(spec)
    except workloads.WorkloadError as exc:
        raise ValidationError({"spec": str(exc)}) from None
    fields = {"file_name": "", "sha256": "", "layout": "", "items": None}
    if checked["kind"] in ("trace", "dataset") or checked.get("from_file"):
        fields = _file_fields(checked, file_name, data, context_len)
    elif data is not None:
        raise ValidationError({"file": f"a {checked['kind']} workload takes no file"})
    with transaction.atomic():
        newest = Workload.objects.select_for_update().filter(name=name).order_by("-version").first()
        if (
            newest is not None
            and _canonical(newest.spec) == _canonical(checked)
            and newest.sha256 == fields["sha256"]
        ):
            return newest, False
        workload = Workload.objects.create(
            name=name,
            version=(newest.version + 1) if newest else 1,
            kind=checked["kind"],
            spec=checked,
            description=description,
            **fields,
        )
    return workload, True


def _file_fields(checked, file_name, data, context_len):
    """The Workload fields of the file a checked spec reads (a trace's requests, a dataset's or
    conversations' prompts): its name, SHA-256, layout and items. Raises ValidationError on
    "file" for no file or one that does not parse."""
    if data is None:
        if checked["kind"] == "trace":
            raise ValidationError({"file": "a trace workload needs its trace file"})
        what = "dataset" if checked["kind"] == "dataset" else "multi-turn workload of a file"
        raise ValidationError({"file": f"a {what} needs a file"})
    try:
        if checked["kind"] == "trace":
            parsed = traces.parse_trace(
                file_name or "the file", data, block_size=checked["block_size"]
            )
        else:
            parsed = workloads.parse_dataset(file_name or "the file", data, context_len=context_len)
    except workloads.DatasetFileError as exc:
        raise ValidationError({"file": str(exc)}) from None
    return {
        "file_name": file_name,
        "sha256": hashlib.sha256(data).hexdigest(),
        "layout": parsed["layout"],
        "items": parsed["items"],
    }


def _canonical(spec):
    return json.dumps(spec, sort_keys=True)


def workload_lookup(ref):
    """The workload a run names: an id, "name" (its newest version) or "name v3"; raises
    ValidationError naming "workload" when there is none."""
    if isinstance(ref, dict):
        ref = ref.get("id")
    if isinstance(ref, int) and not isinstance(ref, bool):
        found = Workload.objects.filter(pk=ref).first()
    elif isinstance(ref, str) and ref.strip():
        name, _, version = ref.strip().rpartition(" v")
        if name and version.isdigit():
            found = Workload.objects.filter(name=name, version=int(version)).first()
        else:
            found = Workload.objects.filter(name=ref.strip()).order_by("-version").first()
    else:
        raise ValidationError({"workload": f"a workload's id or name, got {ref!r}"})
    if found is None:
        raise ValidationError({"workload": f"no workload {ref!r}"})
    return found


def sweep_task_kwargs(run_uuid, parameters):
    """The keyword arguments of workers.run_sweep for a run with these parameters: the
    parameters, and the prompts (conversations) of a workload of a file (kept out of the stored
    parameters: each run would otherwise hold its own copy of the file)."""
    kwargs = {"run_uuid": str(run_uuid), **parameters}
    named = parameters.get("workload")
    if isinstance(named, dict) and (
        named.get("kind") in ("dataset", "trace") or (named.get("spec") or {}).get("from_file")
    ):
        kwargs["workload_items"] = Workload.objects.get(pk=named["id"]).items
    return kwargs


def workload_runs(workload):
    """The runs that sent this version of the workload, newest first."""
    return SweepRun.objects.filter(parameters__workload__id=workload.pk).order_by("-created")


def workload_distributions(workload):
    """{"prompt", "turns", "output"}: each (domain.workloads.length_histogram, unit) or None;
    "tokens_from": (run UUID, model) of the run whose worker counted a file's lengths in
    tokens, or None; "from_spec": the measures the spec's own lengths give. A spec's lengths
    are tokens; a file's are counted in the tokens of the model the engine served where a run's
    worker had its tokenizer (the newest such run's counts), else in characters."""
    spec = workload.spec
    own = workloads.spec_lengths(spec)
    out = {key: (own[key], "turns" if key == "turns" else "tokens") for key in own if own[key]}
    out["tokens_from"] = None
    out["from_spec"] = [key for key in own if own[key]]
    if not workload.items:
        return {key: out.get(key) for key in KEYS}
    counted = (
        LevelResult.objects.filter(
            run__parameters__workload__id=workload.pk, raw__has_key="workload_tokens"
        )
        .order_by("-id")
        .values_list("run__uuid", "raw__workload_tokens")
        .first()
    )
    if counted is not None and isinstance(counted[1], dict):
        uuid, tokens = counted
        file, unit = tokens, "tokens"
        out["tokens_from"] = (uuid, tokens.get("model"))
    elif spec["kind"] == "trace":
        # a trace states its lengths in tokens
        file, unit = workloads.file_lengths(spec, workload.items), "tokens"
    else:
        file, unit = workloads.file_lengths(spec, workload.items), "characters"
    for key in ("prompt", "turns", "output"):
        if key not in out and file.get(key):
            out[key] = (file[key], "turns" if key == "turns" else unit)
    return {key: out.get(key) for key in KEYS}


KEYS = ("prompt", "turns", "output", "tokens_from", "from_spec")
