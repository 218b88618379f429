"""The top bar's links, on every page."""

import functools

from django import template
from django.urls import get_script_prefix, reverse
from django.utils.html import format_html
from django.utils.safestring import mark_safe

register = template.Library()

# (label, URL name, the views' `nav` that marks it active), in the bar's order
NAV_LINKS = (
    ("Dashboard", "dashboard", "dashboard"),
    ("Deployments", "deployments", "deployments"),
    ("Runs", "runs", "runs"),
    ("Compare", "compare", "compare"),
    ("Kernels", "kernels", "kernels"),
    ("Workloads", "workloads", "workloads"),
    ("Hosts", "hosts", "hosts"),
    ("SLO", "slo-profiles", "slo"),
    ("Notes", "notes", "notes"),
    ("API", "api-tokens", "tokens"),
)


@register.simple_tag
def nav_links(nav, staff):
    """The bar's links with the page's own (`nav`) marked active and Admin for staff: written
    once per script prefix, as a dozen {% url %} tags on every page cost some 3 % of a light
    page's CPU."""
    return _nav_links(get_script_prefix(), nav or "", bool(staff))


@functools.cache
def _nav_links(prefix, nav, staff):
    # prefix: reverse() writes the script prefix of the request, part of the cache's key
    links = [
        format_html(
            '<a href="{}"{}>{}</a>',
            reverse(name),
            mark_safe(' class="active"' if key == nav else ""),
            label,
        )
        for label, name, key in NAV_LINKS
    ]
    if staff:
        links.append(format_html('<a href="{}">Admin</a>', reverse("admin:index")))
    return mark_safe("\n      ".join(links))
