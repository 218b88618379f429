"""Workloads: the list, a form that stores a new one (a dataset with its file), and a
workload's page: its length distributions, counts, file hash, versions and the runs that sent
it."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.csrf import csrf_exempt, csrf_protect

from domain.traces import trace_facts
from domain.workloads import (
    MAX_DATASET_BYTES,
    SPEC_DRAWS,
    answer_words,
    conversation_of,
    spec_label,
)
from moeops.front.charts import workloads as workload_charts
from moeops.front.forms.workloads import WorkloadForm
from moeops.runs.models import Workload
from moeops.runs.workloads import workload_distributions, workload_runs, workload_store

# The runs a workload's page lists (newest first).
RUNS_SHOWN = 50


class DatasetSizeLimit(FileUploadHandler):
    """Stops a file upload whose request is larger than a dataset may be, at the file's first
    byte: the fields before it (the CSRF token) are read, the file is not."""

    def __init__(self, request, limit=MAX_DATASET_BYTES):
        super().__init__(request)
        self.limit = limit
        self.refused = None

    def handle_raw_input(self, input_data, META, content_length, boundary, encoding=None):
        self.content_length = content_length

    def new_file(self, field_name, file_name, *args, **kwargs):
        if self.content_length > self.limit:
            self.refused = (file_name, self.content_length)
            raise StopUpload(connection_reset=True)

    def receive_data_chunk(self, raw_data, start):
        return raw_data

    def file_complete(self, file_size):
        return None


def _workloads_page(request, form=None, status=200):
    workloads = Workload.objects.order_by("name", "-version")
    ctx = {
        "nav": "workloads",
        "workloads": [(w, spec_label(w.spec)) for w in workloads],
        "form": form or WorkloadForm(),
    }
    return render(request, "front/workloads.html", ctx, status=status)


@login_required
def workloads(request):
    return _workloads_page(request)


def workload_figures(workload):
    """([(measure, title, unit, histogram)] of the distributions the workload has, and
    workload_distributions' whole answer)."""
    distributions = workload_distributions(workload)
    return [
        (key, title, *distributions[key][::-1])
        for key, title in workload_charts.MEASURES
        if distributions[key]
    ], distributions


def _trace_facts(workload):
    facts = trace_facts(workload.items, workload.spec["block_size"])
    return {**facts, "replay_s": facts["duration_s"] / workload.spec["speed"]}


@login_required
def workload_detail(request, pk):
    workload = get_object_or_404(Workload, pk=pk)
    measures, distributions = workload_figures(workload)
    trace = workload.kind == "trace" and workload.items
    answered, unanswered = (
        answer_words(workload.spec, workload.items or []) if workload.items else ([], 0)
    )
    ctx = {
        "nav": "workloads",
        "workload": workload,
        "label": spec_label(workload.spec),
        "charts": [
            (f"workload-{key}", workload_charts.length_figure(title, unit, [(str(workload), h)]))
            for key, title, unit, h in measures
        ],
        "units": {key: unit for key, _, unit, _ in measures},
        "tokens_from": distributions["tokens_from"],
        "from_spec": distributions["from_spec"],
        "spec_draws": SPEC_DRAWS,
        "turns_total": 0
        if trace
        else sum(len(conversation_of(item)) for item in workload.items or []),
        "trace": _trace_facts(workload) if trace else None,
        "answered": len(answered),
        "unanswered": unanswered,
        "versions": Workload.objects.filter(name=workload.name).order_by("-version"),
        "runs": workload_runs(workload).select_related("deployment")[:RUNS_SHOWN],
        "runs_total": workload_runs(workload).count(),
    }
    return render(request, "front/workload_detail.html", ctx)


@csrf_exempt
@login_required
def workload_create(request):
    """Store a workload as POST /api/v1/workloads does; the CSRF check runs once the size
    limit is in place (the check reads the form, and with it the file)."""
    limit = DatasetSizeLimit(request)
    if request.method == "POST":
        request.upload_handlers.insert(0, limit)
    return _workload_create(request, limit)


@csrf_protect
def _workload_create(request, limit):
    if request.method != "POST":
        return redirect("workloads")
    form = WorkloadForm(request.POST, request.FILES)
    if limit.refused:
        file_name, size = limit.refused
        form.add_error(
            None,
            f"{file_name}: refused unread, its upload of {size:,} bytes is larger than a dataset "
            f"may be ({MAX_DATASET_BYTES:,} bytes).",
        )
        return _workloads_page(request, form, status=400)
    if form.is_valid():
        spec = form.spec()
        upload = form.cleaned_data.get("file")
        if upload is not None and upload.size > MAX_DATASET_BYTES:
            form.add_error(
                "file",
                f"{upload.name}: {upload.size:,} bytes, more than a dataset may hold "
                f"({MAX_DATASET_BYTES:,})",
            )
        if form.is_valid():
            try:
                workload, created = workload_store(
                    name=form.cleaned_data["name"],
                    spec=spec,
                    file_name=upload.name if upload else "",
                    data=upload.read() if upload is not None else None,
                    context_len=form.cleaned_data.get("context_len"),
                    description=form.cleaned_data["description"],
                )
            except ValidationError as exc:
                for field, problems in exc.message_dict.items():
                    target = field if field in ("name", "file") else None
                    for problem in problems:
                        form.add_error(target, problem)
            else:
                if created:
                    messages.success(request, f"Stored workload {workload}.")
                else:
                    messages.info(request, f"{workload} already holds this spec and file.")
                return redirect("workloads")
    return _workloads_page(request, form, status=400)
