"""The dashboard's rows written by a tag (deployment_row, recent_run_row) are byte for byte what
its template wrote with a dozen variables and an include a row, in every state a row shows."""

import datetime as dt
import uuid

import pytest
from django.template import engines

from moeops.fleet.models import Deployment, Host, ModelSpec
from moeops.runs.models import SweepRun

# the dashboard's rows as its template wrote them (_latest_peak.html inlined)
DEPLOYMENT_ROW = (
    "{% load moeops_format %}{% for d in deployments %}\n" + "    <tr>\n"
    '      <td><a href="{{ d.get_absolute_url }}">{{ d.name }}</a></td>\n'
    "      <td>{{ d.model.name }}</td>\n"
    "      <td><a href=\"{% url 'host-detail' d.host.name %}\">{{ d.host.name }}</a></td>\n"
    '      <td>{% deployment_status d %}{% if d.checked_detail %} <span class="muted'
    ' small">{{ d.checked_detail }}</span>{% endif %}</td>\n'
    "      <td>{% if d.latest_run %}<a href=\"{% url 'run-detail' d.latest_run.uuid"
    ' %}">{{ d.latest_run.display_label }}</a> {% run_origin d.latest_run %}{% if'
    ' d.latest_run.is_standin %} <span class="badge standin">stand-in</span>{% endif'
    ' %} <span class="muted small">{{ d.latest_run.created|date:"Y-m-d" }}</span>{%'
    ' else %}<span class="muted">none yet</span>{% endif %}</td>\n'
    '      <td class="num big">{% if d.latest_recipe_gone %}{% with'
    ' was=d.latest_recipe_gone.0 now=d.latest_recipe_gone.1 %}<span class="muted">{{'
    ' d.latest_peak|num }}</span><div class="muted small recipe-gone">{% if was'
    " %}measured under launch recipe v{{ was }}; the engine runs v{{ now }} now, not"
    " swept yet{% else %}measured before launch recipe v{{ now }}, which the engine"
    " runs now; not swept yet{% endif %}</div>{% endwith %}{% else %}{{"
    " d.latest_peak|num }}{% endif %}{% if d.latest_run.is_standin %} <span"
    ' class="badge standin" title="from the stand-in engine, a test'
    ' double">stand-in</span>{% endif %}</td>\n'
    '      <td class="capacity">{% if d.capacity_run %}<a href="{% url \'run-detail\''
    ' d.capacity_run.uuid %}">{{ d.capacity }}</a> <span class="muted small">{{'
    ' d.capacity_run.capacity.profile }}</span>{% else %}<span class="muted">not'
    " searched</span>{% endif %}</td>\n"
    '      <td class="num">{% if d.open_findings %}<a class="count-warn" href="{{'
    ' d.get_absolute_url }}#findings">{{ d.open_findings }}</a>{% else %}0{% endif'
    " %}</td>\n"
    "    </tr>\n" + "    {% endfor %}"
)
RECENT_RUN_ROW = (
    "{% load moeops_format %}{% for run in recent_runs %}\n"
    '      <tr><td>{% run_link run %}</td><td>{{ run.deployment.name }}</td><td><span class="status'
    ' status-{{ run.status }}">{{ run.get_status_display }}</span></td><td class="num">'
    '{{ run.peak|num }}</td><td>{{ run.created|date:"Y-m-d H:i" }}</td></tr>\n'
    "      {% endfor %}"
)
TAGS = {
    "deployments": "{% load moeops_format %}{% for d in deployments %}\n"
    "    {% deployment_row d %}\n    {% endfor %}",
    "recent_runs": "{% load moeops_format %}{% for run in recent_runs %}\n"
    "      {% recent_run_row run %}\n      {% endfor %}",
}
WHEN = dt.datetime(2026, 3, 1, 23, 30, tzinfo=dt.UTC)


def _render(source, **ctx):
    return engines["django"].from_string(source).render(ctx)


def _run(deployment, label="", **fields):
    fields = {"status": "succeeded", "source": "worker", "snapshot": {}, **fields}
    run = SweepRun(uuid=uuid.uuid4(), label=label, created=WHEN, **fields)
    run.deployment = deployment
    return run


def _deployment(pk, name, **fields):
    d = Deployment(pk=pk, name=name, **fields)
    d.model = ModelSpec(name=f"model <{pk}>")
    d.host = Host(name=f"host-{pk}")
    d.latest_run, d.latest_peak, d.latest_recipe_gone = None, None, None
    d.capacity_run, d.capacity, d.open_findings = None, "", 0
    return d


def _deployments():
    bare = _deployment(1, "bare <one>", status="healthy")
    checked = _deployment(
        2, "checked", status="degraded", status_checked_at=WHEN, status_detail="slow & <late>"
    )
    checked.latest_run = _run(checked, "sweep <a>")
    checked.latest_peak, checked.latest_recipe_gone = 1234.5, (3, 5)
    checked.capacity_run = _run(checked, capacity={"profile": "chat <p99>", "load": 8})
    checked.capacity, checked.open_findings = "48 concurrent (48–50)", 3
    standin = _deployment(3, "standin", status="unknown", status_detail="no check")
    standin.latest_run = _run(standin, snapshot={"engine": {"engine": "standin"}})
    standin.latest_peak, standin.latest_recipe_gone = 99.0, (None, 2)
    standin.capacity_run = _run(standin, capacity={"load": 8})
    standin.capacity = "8 concurrent"
    imported = _deployment(4, "imported", status="failed", status_checked_at=WHEN)
    imported.latest_run = _run(
        imported,
        "file",
        source="import",
        snapshot={"file": {"file_name": "r.json", "other_model": "Qwen/Qwen3"}},
    )
    written = _deployment(5, "written", status="healthy", status_checked_at=WHEN)
    written.latest_run = _run(written, "write-up", snapshot={"source": "write-up"})
    written.latest_run.provenance = "the write-up <p. 3>"
    written.latest_peak = 0.0
    return [bare, checked, standin, imported, written]


@pytest.mark.parametrize("tz", ["UTC", "Europe/Berlin"])
def test_the_deployment_rows_are_what_the_template_wrote(settings, tz):
    settings.TIME_ZONE = tz
    deployments = _deployments()
    html = _render(TAGS["deployments"], deployments=deployments)
    assert html == _render(DEPLOYMENT_ROW, deployments=deployments)
    for text in ("recipe-gone", "stand-in", "not searched", "none yet", "#findings", "&lt;"):
        assert text in html


@pytest.mark.parametrize("tz", ["UTC", "Europe/Berlin"])
def test_the_recent_run_rows_are_what_the_template_wrote(settings, tz):
    settings.TIME_ZONE = tz
    runs = [d.latest_run or _run(d, status="running") for d in _deployments()]
    for run, peak in zip(runs, (None, 1234.5, 0.0, 7.0, None), strict=True):
        run.peak = peak
    html = _render(TAGS["recent_runs"], recent_runs=runs)
    assert html == _render(RECENT_RUN_ROW, recent_runs=runs)
    assert "stand-in" in html and "imported" in html and "Running" in html
