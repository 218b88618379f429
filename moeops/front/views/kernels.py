"""Fused-MoE kernel configs: the list, one config's entries and timings, diffs, engine files."""

import math

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import Prefetch, prefetch_related_objects
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from moeops.front.charts.kernels import kernel_speedups, kernel_timings
from moeops.front.forms.kernels import EngineDiffFileForm, KernelConfigFileForm
from moeops.kernels import services
from moeops.kernels.models import EngineDiff, KernelConfig, TuningRun
from moeops.kernels.routings import routing_side_by_side
from tuning import config_files

ENTRY_FIELDS = config_files.REQUIRED_FIELDS
# vLLM's _down entries: a tile and whether the sorted-A path runs it
DOWN_FIELDS = (*ENTRY_FIELDS, "USE_TMA")


def _config_or_404(pk):
    return get_object_or_404(KernelConfig, pk=pk)


def _fields_of(*configs):
    """The entry fields to show: the required ones, then any optional one some entry has."""
    extra = [
        f
        for f in config_files.OPTIONAL_FIELDS
        if any(f in entry for c in configs for _, entry in c.sorted_entries())
    ]
    return [*ENTRY_FIELDS, *extra]


def _cell_color(value, low, high):
    """A light blue whose depth follows log2(value) between the column's low and high."""
    if not isinstance(value, int | float) or value <= 0 or high <= low:
        return ""
    depth = (math.log2(value) - math.log2(low)) / (math.log2(high) - math.log2(low))
    return f"background: hsl(218, 70%, {96 - 34 * depth:.0f}%)"


def entry_table(config, fields):
    """Rows (batch size, [(value, css style)…]), colored per column from smallest to largest."""
    return entry_table_of(config.sorted_entries(), fields)


def entry_table_of(entries, fields):
    """entry_table of [(batch size, entry)] sorted by batch size."""
    ranges = {}
    for field in fields:
        values = [e.get(field) for _, e in entries if isinstance(e.get(field), int | float)]
        positive = [v for v in values if v > 0]
        ranges[field] = (min(positive), max(positive)) if positive else (1, 1)
    return [
        (m, [(entry.get(field), _cell_color(entry.get(field), *ranges[field])) for field in fields])
        for m, entry in entries
    ]


def _versions(config):
    same = KernelConfig.objects.filter(
        device_name=config.device_name,
        E=config.E,
        N=config.N,
        dtype=config.dtype,
        down_moe=config.down_moe,
    ).order_by("-version")
    return [c for c in same if c.block_shape == config.block_shape]


def _kernels_page(request, upload_form=None, status=200):
    configs = list(
        KernelConfig.objects.prefetch_related("tuning_runs").order_by(
            "device_name", "E", "N", "dtype", "-version"
        )
    )
    tunings = TuningRun.objects.select_related("deployment", "host", "result").order_by("-created")[
        :20
    ]
    ctx = {
        "nav": "kernels",
        "configs": configs,
        "tunings": tunings,
        "upload_form": upload_form or KernelConfigFileForm(),
    }
    return render(request, "front/kernels.html", ctx, status=status)


@login_required
def kernels(request):
    return _kernels_page(request)


@login_required
@require_POST
def kernel_upload(request):
    """Store an engine's config file as POST /api/v1/kernel-configs/import does."""
    form = KernelConfigFileForm(request.POST, request.FILES)
    if form.is_valid():
        name = form.engine_file_name()
        try:
            config, created = services.kernel_config_import(
                file_name=name, text=form.text, provenance=f"uploaded {name} on the kernels page"
            )
        except ValidationError as exc:
            for field, problems in exc.message_dict.items():
                target = "file_name" if field == "file_name" else "file"
                for problem in problems:
                    form.add_error(target, f"{field}: {problem}")
        else:
            if created:
                messages.success(request, f"Stored {config}.")
            else:
                messages.info(request, f"{name} holds the newest version on record: {config}.")
            return redirect("kernel-detail", pk=config.pk)
    return _kernels_page(request, form, status=400)


@login_required
def kernel_detail(request, pk):
    config = _config_or_404(pk)
    fields = _fields_of(config)
    versions = [config if v.pk == config.pk else v for v in _versions(config)]
    # one query for every version's tunes: this one's newest and every tune's kernel
    # (KernelConfig.timed_in), the others' newest for the side by side of two routings
    prefetch_related_objects(
        versions, Prefetch("tuning_runs", TuningRun.objects.order_by("-created"))
    )
    tuning = next(iter(config.tuning_runs.all()), None)
    timings = list(tuning.timings.all()) if tuning else []
    older = [c for c in versions if c.version < config.version]
    sglang_path = None
    if config.triton_version:
        sglang_path = config_files.config_file_relpath(
            config.file_name("sglang"), "sglang", config.triton_version
        )
    ctx = {
        "nav": "kernels",
        "config": config,
        "fields": fields,
        "rows": entry_table(config, fields),
        "tuning": tuning,
        "timings": timings,
        "figure": kernel_timings(timings),
        "speedups": kernel_speedups(timings),
        "versions": versions,
        "previous": older[0] if older else None,
        "vllm_name": config.file_name("vllm") if "vllm" in config.styles else None,
        "sglang_name": config.file_name("sglang"),
        "sglang_path": sglang_path,
        "vllm_untimed": config.untimed_in("vllm"),
        "down_fields": DOWN_FIELDS,
        "down_rows": entry_table_of(config.sorted_down_entries(), DOWN_FIELDS),
        "down_name": config.down_file_name() if config.down_entries else None,
        # which path the file is for, and whether each engine that loads it runs that path
        "path_uses": [(d, config.path_for(d)) for d in config.loaded_by()],
        "sglang_untimed": config.untimed_in("sglang"),
        # a compile-checked file's GPU: its other editions' files, and a later version timed
        # there by a tune on such a GPU
        "editions": config.other_editions(),
        "timed_later": next(
            (v for v in versions if v.version > config.version and v.source == "tuned"), None
        ),
        "runs": config.runs.select_related("deployment").order_by("-created")[:10],
        "routings": routing_side_by_side(tuning, timings, versions),
    }
    return render(request, "front/kernel_detail.html", ctx)


@login_required
def kernel_download(request, pk, style):
    """The engine's config file, named as that engine looks it up."""
    config = _config_or_404(pk)
    if style == "vllm-down" and config.down_entries:
        name, text = config.down_file_name(), config.down_file_text()
    elif style in config.styles:
        name, text = config.file_name(style), config.engine_file_text(style)
    else:
        raise Http404("no such file for this engine (vLLM has no _down file for this config)")
    response = HttpResponse(text, content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


def diff_entries(a, b, fields):
    """Per batch size in either config: (M, [(field, value in a, value in b, changed)…])."""
    ea, eb = dict(a.sorted_entries()), dict(b.sorted_entries())
    rows = []
    for m in sorted(ea.keys() | eb.keys()):
        left, right = ea.get(m), eb.get(m)
        cells = []
        for field in fields:
            va = left.get(field) if left else None
            vb = right.get(field) if right else None
            cells.append((field, va, vb, va != vb))
        rows.append((m, left is not None, right is not None, cells))
    return rows


@login_required
def kernel_diff(request):
    all_configs = KernelConfig.objects.order_by("device_name", "E", "N", "dtype", "-version")
    a = b = None
    rows, fields = [], []
    if request.GET.get("a") and request.GET.get("b"):
        try:
            a = _config_or_404(int(request.GET["a"]))
            b = _config_or_404(int(request.GET["b"]))
        except ValueError:
            raise Http404("not a config id") from None
        fields = _fields_of(a, b)
        rows = diff_entries(a, b, fields)
    ctx = {
        "nav": "kernels",
        "configs": all_configs,
        "a": a,
        "b": b,
        "fields": fields,
        "rows": rows,
        "changed": sum(1 for row in rows if any(cell[3] for cell in row[3])),
    }
    return render(request, "front/kernel_diff.html", ctx)


@login_required
def engine_diffs(request):
    """The engine diffs on record, and an upload of a `python -m tuning engine-diff --json`
    report (the web tier runs no engine code: a host where both versions are installed does)."""
    form = EngineDiffFileForm()
    status = 200
    if request.method == "POST":
        form = EngineDiffFileForm(request.POST, request.FILES)
        if form.is_valid():
            try:
                diff = services.engine_diff_store(
                    report=form.report, provenance="uploaded on the engine-diff page"
                )
            except ValidationError as exc:
                for problem in exc.message_dict["report"]:
                    form.add_error("file", problem)
            else:
                messages.success(request, f"Stored {diff}.")
                return redirect("engine-diff", pk=diff.pk)
        status = 400
    ctx = {"nav": "kernels", "diffs": EngineDiff.objects.all()[:50], "form": form}
    return render(request, "front/engine_diffs.html", ctx, status=status)


@login_required
def engine_diff(request, pk):
    diff = get_object_or_404(EngineDiff, pk=pk)
    ctx = {"nav": "kernels", "diff": diff, "lines": diff.lines(), "tables": diff.tables()}
    return render(request, "front/engine_diff.html", ctx)
