"""The deployment page's runs-table row (run_row) is byte for byte what its template wrote with
a dozen variables a row, and html_of, which writes it, is format_html's output."""

import datetime as dt
import uuid

import pytest
from django.template import engines
from django.utils.functional import lazy
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from moeops.fleet.models import Deployment, ModelSpec, TopologySnapshot
from moeops.front.templatetags.moeops_format import html_of
from moeops.runs.models import LevelResult, SweepRun

# the row as the deployment page's template wrote it before run_row
TEMPLATE_ROW = (
    "{% load moeops_format %}{% for run in runs %}\n    <tr>\n"
    '      <td><input type="checkbox" name="run" value="{{ run.uuid }}" aria-label="compare'
    ' {{ run.display_label }}"></td>\n'
    "      <td>{% run_link run %}</td>\n"
    "      <td>{{ run.other_model|default:deployment.model.name }}</td>\n"
    '      <td><span class="status status-{{ run.status }}">{{ run.get_status_display }}'
    "</span></td>\n"
    "      <td>{{ run.get_source_display }}</td>\n"
    '      <td>{{ run.topology_snapshot.virtualization_label|default:"—" }}</td>\n'
    '      <td>{{ run|concurrencies|default:"—" }}</td>\n'
    '      <td class="num">{{ run.peak|num }}</td>\n'
    '      <td>{{ run.created|date:"Y-m-d H:i" }}</td>\n'
    "    </tr>\n    {% endfor %}"
)
TAG_ROW = (
    "{% load moeops_format %}{% for run in runs %}\n"
    "    {% run_row run deployment.model.name %}\n    {% endfor %}"
)
# 23:30 UTC on the last day of a month: the next day (and month) in Berlin
WHEN = dt.datetime(2026, 3, 31, 23, 30, tzinfo=dt.UTC)


def _render(source, **ctx):
    return engines["django"].from_string(source).render(ctx)


def _run(pk, label, levels=(), peak=None, topology=None, **fields):
    fields = {"status": "succeeded", "source": "worker", "snapshot": {}, **fields}
    run = SweepRun(pk=pk, uuid=uuid.uuid4(), label=label, created=WHEN, **fields)
    run.topology_snapshot = topology
    run._prefetched_objects_cache = {
        "levels": [LevelResult(concurrency=c) for c in levels],
    }
    run.peak = peak
    return run


def _runs():
    vm = TopologySnapshot(virtualization="vm", virtualization_technology="kvm")
    return [
        _run(1, "sweep <a> & \"b\" 'c'", levels=(8, 16, None), peak=1234.5, topology=vm),
        _run(2, "", status="running", levels=(), peak=None),
        _run(
            3,
            "file",
            source="import",
            peak=0.0,
            snapshot={"file": {"file_name": "r<1>.json", "other_model": "Qwen/Qwen3 <x>"}},
        ),
        _run(4, "stand-in", snapshot={"engine": {"engine": "standin"}}, levels=(1,), peak=7.0),
    ]


@pytest.mark.parametrize("tz", ["UTC", "Europe/Berlin"])
def test_the_run_rows_are_what_the_template_wrote(settings, tz):
    settings.TIME_ZONE = tz
    deployment = Deployment(pk=1, name="d")
    deployment.model = ModelSpec(name="GLM-5 <nvfp4> & co")
    runs = _runs()
    html = _render(TAG_ROW, runs=runs, deployment=deployment)
    assert html == _render(TEMPLATE_ROW, runs=runs, deployment=deployment)
    for text in ("&lt;a&gt; &amp; &quot;b&quot; &#x27;c&#x27;", "Qwen/Qwen3 &lt;x&gt;", "8, 16, ?"):
        assert text in html
    assert ("2026-04-01 01:30" if tz == "Europe/Berlin" else "2026-03-31 23:30") in html


class _Html:
    def __html__(self):
        return "<b>already html</b>"


@pytest.mark.parametrize(
    "value",
    [
        "<script>alert('x') & \"y\"</script>",
        mark_safe("<i>safe</i>"),
        lazy(lambda: "lazy <text> & 'quotes'", str)(),
        _Html(),
        1234,
        0.5,
        None,
        uuid.UUID(int=7),
        "",
    ],
)
def test_html_of_writes_what_format_html_writes(value):
    template = '<a title="{}">{} {}</a>'
    assert html_of(template, value, value, "&") == format_html(template, value, value, "&")
