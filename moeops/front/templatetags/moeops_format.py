"""Number, duration and status formatting shared by every page."""

import html

from django import template
from django.urls import reverse
from django.utils.html import format_html, format_html_join, json_script
from django.utils.safestring import mark_safe
from django.utils.timezone import localtime

from domain.failures import explain_error
from moeops.front.charts.figures import CompactJSONEncoder

register = template.Library()


def html_of(template_text, *args, **kwargs):
    """format_html's output, byte for byte (each argument escaped unless it is HTML already),
    without its per-argument lazy-string checks: for the tags that write a row per run."""
    return mark_safe(
        template_text.format(*map(_html_arg, args), **{k: _html_arg(v) for k, v in kwargs.items()})
    )


def _html_arg(value):
    return value.__html__() if hasattr(value, "__html__") else html.escape(str(value))


@register.filter
def num(value, digits=0):
    """1234.5 → "1,234" (or with `digits` decimals); None → "—"."""
    if value is None or value == "":
        return "—"
    try:
        return f"{float(value):,.{int(digits)}f}"
    except (TypeError, ValueError):
        return str(value)


@register.filter
def concurrencies(run):
    """ "8, 16, ?": the concurrency of each of the run's levels (prefetched), in their order;
    "" without levels. A filter, not a loop in the template: the deployment page and compare
    list every run's levels."""
    return ", ".join(str(level.concurrency or "?") for level in run.levels.all())


@register.filter
def duration(seconds):
    """Seconds → "42 s", "3 min 05 s", "2 h 01 min"; None → "—"."""
    if seconds is None:
        return "—"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


@register.simple_tag
def chart(fig, element_id, data_id=None, css_class="chart"):
    """A plotly chart: the element charts.js draws and the figure's JSON (id `data_id`)."""
    data_id = data_id or f"{element_id}-data"
    return format_html(
        '<div id="{}" class="{}" data-figure="{}"></div>{}',
        element_id,
        css_class,
        data_id,
        json_script(fig, data_id, encoder=CompactJSONEncoder),
    )


@register.simple_tag
def error_parts(text, what="run"):
    """{"sentence", "detail"} of a worker's error (domain.failures.explain_error)."""
    sentence, detail = explain_error(text, what)
    return {"sentence": sentence, "detail": detail}


def _evidence_number(key, value):
    key = key.lower()
    if key.endswith("percent") or key.endswith("_pct"):
        return f"{value:,.0f}%"
    if "fraction" in key:
        return f"{value:.0%}"
    # shares of a whole: a gain of 0.0906 per doubling is "+9.1%"
    if "gain" in key:
        return f"{value:+.1%}"
    if "drop" in key:
        return f"{value:.1%}"
    if key == "threshold":
        return f"{value:.0%}"
    if key.endswith("_w"):
        return f"{value:,.0f} W"
    if key.endswith("_ms"):
        return f"{value:,.1f} ms"
    if "throughput" in key:
        return f"{value:,.0f} tok/s"
    if isinstance(value, int):
        return f"{value:,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


@register.filter
def evidence_text(value, key=""):
    """A finding's evidence value as people read it, rounded to what it means: fractions as
    %, W, ms and tok/s by their key, other numbers to 3 significant digits; lists and dicts
    item by item."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return _evidence_number(key, value)
    if isinstance(value, list):
        return ", ".join(evidence_text(item, key) for item in value)
    if isinstance(value, dict):
        return "; ".join(f"{k}: {evidence_text(v, k)}" for k, v in value.items())
    return str(value)


@register.simple_tag
def deployment_status(deployment):
    """The deployment's status badge: a health status only once a check has set it (an example
    or a hand edit saying "healthy" without one reads "not checked yet")."""
    if deployment.status_unchecked:
        return format_html('<span class="status status-{}">{}</span>', "unknown", "not checked yet")
    return format_html(
        '<span class="status status-{}">{}</span>',
        deployment.status,
        deployment.get_status_display(),
    )


@register.simple_tag
def run_origin(run):
    """The badge of where the run's numbers come from (SweepRun.origin); none for a sweep whose
    engine is not read yet, nor for the stand-in's (run_link gives it its own badge)."""
    badge, title = run.origin()
    if not badge or badge == "stand-in":
        return ""
    return html_of('<span class="badge origin" title="{}">{}</span>', title, badge)


STANDIN_BADGE = mark_safe('<span class="badge standin">stand-in</span>')


@register.simple_tag
def run_link(run):
    """The run's name linked to its page, then its origin badge and the stand-in's, as the
    run lists show it: one tag a row, not a template included per row."""
    standin = STANDIN_BADGE if run.is_standin else ""
    url = reverse("run-detail", args=[run.uuid])
    return html_of('<a href="{}">{}</a> {} {}', url, run.display_label(), run_origin(run), standin)


@register.simple_tag
def labelled_fields(form):
    """Each field of the form in its label, after its name, with its errors (the forms of the
    deployment page and the run page): one tag, not three template variables a field."""
    return format_html_join(
        "", "<label>{} {}{}</label>", ((field.label, field, field.errors) for field in form)
    )


# A row of the deployment page's runs table (run_row); the indents are the template's.
RUN_ROW = """<tr>
      <td><input type="checkbox" name="run" value="{}" aria-label="compare {}"></td>
      <td>{}</td>
      <td>{}</td>
      <td><span class="status status-{}">{}</span></td>
      <td>{}</td>
      <td>{}</td>
      <td>{}</td>
      <td class="num">{}</td>
      <td>{}</td>
    </tr>"""


@register.simple_tag
def run_row(run, model_name):
    """The deployment page's row of a run (levels prefetched, .peak): its compare box, name,
    model (an imported file's own, else model_name), status, source, topology, levels, peak
    and start. One tag a row: a dozen template variables a row took ~2 ms of 21 rows."""
    topology = run.topology_snapshot
    return html_of(
        RUN_ROW,
        run.uuid,
        run.display_label(),
        run_link(run),
        run.other_model or model_name,
        run.status,
        run.get_status_display(),
        run.get_source_display(),
        (topology and topology.virtualization_label) or "—",
        concurrencies(run) or "—",
        num(run.peak),
        # the "Y-m-d H:i" of the date filter
        localtime(run.created).strftime("%Y-%m-%d %H:%M"),
    )


# A row of the dashboard's deployments table (deployment_row); the indents are the template's.
DEPLOYMENT_ROW = """<tr>
      <td><a href="{url}">{name}</a></td>
      <td>{model}</td>
      <td><a href="{host_url}">{host}</a></td>
      <td>{status}</td>
      <td>{latest}</td>
      <td class="num big">{peak}{standin}</td>
      <td class="capacity">{capacity}</td>
      <td class="num">{findings}</td>
    </tr>"""
STANDIN_BADGE_AFTER = mark_safe(' <span class="badge standin">stand-in</span>')
STANDIN_PEAK_BADGE = mark_safe(
    ' <span class="badge standin" title="from the stand-in engine, a test double">stand-in</span>'
)


def latest_peak(deployment):
    """The deployment's latest peak, muted with why where the engine runs another launch recipe
    than its latest run measured (.latest_recipe_gone): templates/front/_latest_peak.html."""
    if not deployment.latest_recipe_gone:
        return num(deployment.latest_peak)
    was, now = deployment.latest_recipe_gone
    if was:
        why = format_html(
            "measured under launch recipe v{}; the engine runs v{} now, not swept yet", was, now
        )
    else:
        why = format_html(
            "measured before launch recipe v{}, which the engine runs now; not swept yet", now
        )
    return format_html(
        '<span class="muted">{}</span><div class="muted small recipe-gone">{}</div>',
        num(deployment.latest_peak),
        why,
    )


@register.simple_tag
def deployment_row(d):
    """The dashboard's row of a deployment (_with_latest_runs, _with_capacity, .open_findings):
    one tag a row, not a template and a dozen variables a row."""
    url = d.get_absolute_url()
    status = deployment_status(d)
    if d.checked_detail:
        status = html_of('{} <span class="muted small">{}</span>', status, d.checked_detail)
    run = d.latest_run
    standin = run is not None and run.is_standin
    if run is None:
        latest = mark_safe('<span class="muted">none yet</span>')
    else:
        latest = html_of(
            '<a href="{}">{}</a> {}{} <span class="muted small">{}</span>',
            reverse("run-detail", args=[run.uuid]),
            run.display_label(),
            run_origin(run),
            STANDIN_BADGE_AFTER if standin else "",
            # the "Y-m-d" of the date filter
            localtime(run.created).strftime("%Y-%m-%d"),
        )
    if d.capacity_run:
        capacity = html_of(
            '<a href="{}">{}</a> <span class="muted small">{}</span>',
            reverse("run-detail", args=[d.capacity_run.uuid]),
            d.capacity,
            d.capacity_run.capacity.get("profile", ""),
        )
    else:
        capacity = mark_safe('<span class="muted">not searched</span>')
    if d.open_findings:
        findings = html_of('<a class="count-warn" href="{}#findings">{}</a>', url, d.open_findings)
    else:
        findings = "0"
    return html_of(
        DEPLOYMENT_ROW,
        url=url,
        name=d.name,
        model=d.model.name,
        host_url=reverse("host-detail", args=[d.host.name]),
        host=d.host.name,
        status=status,
        latest=latest,
        peak=latest_peak(d),
        standin=STANDIN_PEAK_BADGE if standin else "",
        capacity=capacity,
        findings=findings,
    )


RECENT_RUN_ROW = (
    '<tr><td>{}</td><td>{}</td><td><span class="status status-{}">{}</span></td>'
    '<td class="num">{}</td><td>{}</td></tr>'
)


@register.simple_tag
def recent_run_row(run):
    """The dashboard's row of a recent run (select_related deployment, .peak): one tag a row."""
    return html_of(
        RECENT_RUN_ROW,
        run_link(run),
        run.deployment.name,
        run.status,
        run.get_status_display(),
        num(run.peak),
        # the "Y-m-d H:i" of the date filter
        localtime(run.created).strftime("%Y-%m-%d %H:%M"),
    )


# compare's cells of a run from its name to its kernel config (compare_cells); the indents are
# the template's.
COMPARE_CELLS = """<td><a href="{}">{}</a>{}</td>
      <td>{}</td>
      <td class="clip" title="{}">{}</td>
      <td>{}</td>
      <td>{}</td>
      <td>{}</td>
      <td>{}</td>"""


@register.simple_tag
def compare_cells(run, kernel=None):
    """Compare's cells of a run (deployment, host and kernel config read with it): its name
    with the stand-in's badge, deployment, model, host, topology, engine and kernel config.
    kernel: the kernel state the selected runs' table writes where no config is on record;
    without it, the run's own, muted (the candidates' table). One tag a row's seven cells: compare
    lists its 20 runs and their candidates."""
    config = run.kernel_config
    if config is not None:
        kernel = format_html("{} v{}", config.dtype, config.version)
    elif kernel is None:
        kernel = format_html('<span class="muted">{}</span>', run.kernel_config_state())
    topology = run.topology_snapshot
    model = run.model_name()
    return format_html(
        COMPARE_CELLS,
        reverse("run-detail", args=[run.uuid]),
        run.display_label(),
        format_html(" {}", STANDIN_BADGE) if run.is_standin else "",
        run.deployment.name,
        model,
        model_short(model),
        run.deployment.host.name,
        (topology and topology.virtualization_label) or "—",
        run.engine_label(),
        kernel,
    )


@register.filter
def parameter_text(value):
    """A run parameter as a person reads it, not a Python repr: a list "8, 16, 32", an object
    "key value; key value" (nested the same way, keys sorted: PostgreSQL's jsonb does not keep
    the order they were written in), None "—", booleans "yes"/"no"."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return "; ".join(f"{key} {parameter_text(item)}" for key, item in sorted(value.items()))
    if isinstance(value, list | tuple):
        return ", ".join(parameter_text(item) for item in value)
    return str(value)


@register.filter
def model_short(name):
    """A model's name short enough for a table column: a path's last part ("/models/Qwen3-8B/"
    → "Qwen3-8B"), a Hugging Face cache snapshot as its repo ("…/models--Qwen--Qwen3-8B/
    snapshots/<sha>" → "Qwen/Qwen3-8B"); "org/name" as it is. The page shows the whole on hover."""
    text = str(name or "")
    parts = [part for part in text.split("/") if part]
    if len(parts) <= 2 and not text.startswith("/"):
        return text
    if "snapshots" in parts and parts.index("snapshots") > 0:
        repo = parts[parts.index("snapshots") - 1]
        if repo.startswith("models--"):
            return repo.removeprefix("models--").replace("--", "/")
        return repo
    return parts[-1] if parts else text
