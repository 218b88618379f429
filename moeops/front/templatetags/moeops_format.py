"""Number, duration and status formatting shared by every page."""

from django import template
from django.utils.html import format_html, json_script

register = template.Library()


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
        json_script(fig, data_id),
    )
