"""The compare page's "differs in" lines, "what changed" blocks and selected runs' rows, one
tag each: 20 runs are some thirty template nodes each in each. Each tag writes what its
template loop wrote, byte for byte, indents and line breaks included."""

import html

from django import template
from django.template.defaultfilters import date, floatformat
from django.urls import reverse
from django.utils.formats import localize
from django.utils.html import conditional_escape
from django.utils.safestring import mark_safe
from django.utils.timezone import template_localtime

from moeops.front.templatetags.moeops_format import compare_cells, concurrencies, num

register = template.Library()

BADGE = ' <span class="badge standin">stand-in</span>'


def _text(value):
    """{{ value }} as a template writes it (localized, escaped unless safe): conditional_escape
    without its lazy-string wrapper, called some 300 times a page."""
    value = localize(value)
    if not isinstance(value, str):
        value = str(value)
    if hasattr(value, "__html__"):
        return value.__html__()
    return html.escape(value)


def _joined(values, sep):
    """{{ values|join:sep }} as a template writes it."""
    return conditional_escape(sep).join(conditional_escape(value) for value in values)


def _percent(share):
    """{% widthratio share 1 100 %}: the share in whole percent."""
    try:
        return str(round(float(share) / 1.0 * 100))
    except ZeroDivisionError:
        return "0"
    except (ValueError, TypeError, OverflowError):
        return ""


def _positive(points):
    """{% if points > 0 %}: False where they do not compare."""
    try:
        return points > 0
    except TypeError:
        return False


def _differs_line(item, baseline, base):
    run = item["run"]
    out = [
        '\n  <p class="differs-line"><strong>',
        _text(run.display_label()),
        "</strong>",
        BADGE if run.is_standin else "",
        " against ",
        base,
        BADGE if baseline.is_standin else "",
        ":\n    ",
    ]
    if item["headline"]:
        out += ['<span class="headline">', _text(item["headline"]), "</span>"]
        if item["noise"]:
            out += [' <span class="noise">', _text(item["noise"]), "</span>"]
        out.append(" · ")
    out.append("\n    ")
    if item["latency"]:
        out += ['<span class="latency">', _text(item["latency"]), "</span> · "]
    out.append("\n    ")
    if item["capacity"]:
        out += ['<span class="capacity-noise">', _text(item["capacity"]), "</span> · "]
    out.append('\n    <span class="factors">differs in: ')
    out.append(_joined(item["factors"], ", ") if item["factors"] else "nothing they recorded")
    out.append("</span>")
    if item["incidental"]:
        out += [' <span class="muted small">(also ', _joined(item["incidental"], ", "), ")</span>"]
    if item["unknown"]:
        out += [
            ' <span class="muted small">— not compared: ',
            _joined(item["unknown"], "; "),
            "</span>",
        ]
    out.append("</p>\n  ")
    return "".join(out)


@register.simple_tag
def differs_lines(what_changed, baseline):
    """Each run against the baseline (the first selected) in a line: its headline, noise,
    latency, capacity and what its snapshot differs in (views.compare._what_changed)."""
    base = _text(baseline.display_label())
    return mark_safe("".join(_differs_line(item, baseline, base) for item in what_changed))


def _steps(run, base, concurrency, rows):
    cells = []
    for name, a, b, points in rows:
        name, a, b = _text(name), _percent(a), _percent(b)
        cells += [
            f'<tr title="{name} {a} % → {b} % of a decode step"><td>{name}</td>',
            f'<td class="num">{a} %</td><td class="num">{b} %</td><td class="num">',
            "+" if _positive(points) else "",
            _text(floatformat(points, 1)),
            "</td></tr>",
        ]
    level = _text(concurrency)
    return (
        f'\n    <table class="data compact step-changes" id="step-changes-{_text(run.pk)}-{level}">'
        f'\n      <caption class="small">Inside a decode step at concurrency {level} '
        '<span class="muted">(profiled passes: each class\'s share of the step)</span></caption>'
        f'\n      <thead><tr><th>Class</th><th class="num">{base}</th>'
        f'<th class="num">{_text(run.display_label())}</th>'
        '<th class="num">Change (points)</th></tr></thead>'
        f"\n      <tbody>{''.join(cells)}</tbody>\n    </table>\n    "
    )


def _snapshot(item, base):
    run = item["run"]
    out = [
        '\n  <div class="snapshot">\n    <h3><a href="',
        conditional_escape(reverse("run-detail", args=[run.uuid])),
        '">',
        _text(run.display_label()),
        "</a> against ",
        base,
        "</h3>\n    ",
    ]
    for title, changes in item["sections"]:
        out += ['\n    <p class="small">', _text(title), '</p>\n    <ul class="changes">']
        for key, then, now in changes:
            out += ["<li>", _text(key), ": ", _text(then), " → ", _text(now), "</li>"]
        out.append("</ul>\n    ")
    if not item["sections"] and not item["unknown"]:
        out.append('<p class="small">Nothing they recorded differs.</p>')
    out.append("\n    ")
    for sentence in item["unknown"]:
        out += ['<p class="muted small">Not compared: ', _text(sentence), ".</p>"]
    out.append("\n    ")
    for concurrency, rows in item["steps"]:
        out.append(_steps(run, base, concurrency, rows))
    out.append("\n    ")
    moved = item["engine_moved"]
    if moved:
        out += [
            '<p class="notice small retune">The engine moved from ',
            _text(moved["from"]),
            " to ",
            _text(moved["to"]),
            " under the same tuned kernel file, tuned for at most one of their kernels: “",
            _text(moved["retune"]),
            "”.</p>",
        ]
    out.append("\n  </div>\n  ")
    return "".join(out)


@register.simple_tag
def what_changed_blocks(what_changed, baseline):
    """Each run's changes against the baseline, section by section as their snapshots
    recorded them, what was not compared, its decode steps' classes side by side and an
    engine move under one tuned file (views.compare._what_changed)."""
    base = _text(baseline.display_label())
    return mark_safe("".join(_snapshot(item, base) for item in what_changed))


def _selected_row(summary):
    run = summary["run"]
    gpus = summary["gpus"]
    capacity, within = summary["capacity"], summary["capacity_range"]
    if capacity:
        shown = _text(capacity)
        if within:
            shown += (
                f' <span class="muted small">within {_text(within[0])}–{_text(within[1])}</span>'
            )
    else:
        shown = '<span class="muted">—</span>'
    return "".join(
        [
            '\n    <tr>\n      <td><input type="checkbox" name="run" value="',
            _text(run.uuid),
            '" checked aria-label="keep ',
            _text(run.display_label()),
            '"></td>\n      ',
            compare_cells(run, summary["kernel"]),
            "\n      <td>",
            _text(date(template_localtime(run.created), "Y-m-d")),
            "</td>\n      <td>",
            _text(concurrencies(run)),
            '</td>\n      <td class="num">',
            '<span class="muted" title="no GPUs recorded for the host">none</span>'
            if gpus is None
            else _text(gpus),
            '</td>\n      <td class="num">',
            _text(num(summary["peak"])),
            '</td>\n      <td class="num">',
            _text(num(summary["peak_per_gpu"])),
            '</td>\n      <td class="num">',
            _text(num(summary["best_per_user"], 1)),
            '</td>\n      <td class="capacity">',
            shown,
            "</td>\n    </tr>\n    ",
        ]
    )


@register.simple_tag
def selected_rows(selected):
    """The selected runs' rows (views.compare._summary of each): name to kernel config
    (compare_cells), created, levels, GPUs, peak, peak per GPU, best per user, capacity."""
    return mark_safe("".join(_selected_row(summary) for summary in selected))
