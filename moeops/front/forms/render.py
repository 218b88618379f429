"""The form renderer of the heavy pages' forms (the deployment page's, the runs filter of the
runs list and compare): Django's own widget templates, those the forms use for every field
written in Python. Through the templates each widget and each empty error list costs a template
render, ~60 of them on the deployment page (bench/ui_pages.py); what this writes is what those
templates write (tests/web/test_form_render.py), and any other template, or a value the Python
would not write alike, goes to the templates."""

from django.forms.renderers import DjangoTemplates
from django.utils.html import conditional_escape, escape
from django.utils.safestring import SafeData

WIDGETS = "django/forms/widgets/"
INPUTS = {
    f"{WIDGETS}{name}.html"
    for name in ("input", "text", "number", "email", "url", "password", "checkbox", "file", "date")
}
# a choice of a CheckboxSelectMultiple written alone ({{ choice.tag }}): the input, unlabelled
OPTION_INPUTS = {f"{WIDGETS}checkbox_option.html", f"{WIDGETS}input_option.html"}
ERROR_LIST = "django/forms/errors/list/default.html"


def _text(value):
    """{{ value }} of a str: escaped unless safe; None for a value the template would localize."""
    return conditional_escape(value) if isinstance(value, str) else None


def _formatted(value):
    """{{ value|stringformat:'s' }}."""
    return conditional_escape(value) if isinstance(value, SafeData) else escape(value)


def _attrs(attrs):
    """django/forms/widgets/attrs.html, or None."""
    html = []
    for name, value in attrs.items():
        if value is False:
            continue
        if not isinstance(name, str):
            return None
        html.append(f" {conditional_escape(name)}")
        if value is not True:
            html.append(f'="{_formatted(value)}"')
    return "".join(html)


def _input(widget):
    """django/forms/widgets/input.html, or None."""
    kind, name, attrs = _text(widget["type"]), _text(widget["name"]), _attrs(widget["attrs"])
    if None in (kind, name, attrs):
        return None
    value = "" if widget["value"] is None else f' value="{_formatted(widget["value"])}"'
    return f'<input type="{kind}" name="{name}"{value}{attrs}>'


def _option(option):
    """django/forms/widgets/select_option.html, or None."""
    label, attrs = _text(option["label"]), _attrs(option["attrs"])
    if option["template_name"] != f"{WIDGETS}select_option.html" or None in (label, attrs):
        return None
    return f'<option value="{_formatted(option["value"])}"{attrs}>{label}</option>'


def _select(widget):
    """django/forms/widgets/select.html without option groups, or None."""
    name, attrs = _text(widget["name"]), _attrs(widget["attrs"])
    if None in (name, attrs):
        return None
    html = [f'<select name="{name}"{attrs}>']
    for group_name, options, _ in widget["optgroups"]:
        if group_name:
            return None
        for option in options:
            # each option's own template ends in a line break, inside the select's indent
            written = _option(option)
            if written is None:
                return None
            html.append(f"\n  {written}\n")
    html.append("\n</select>")
    return "".join(html)


class PageFormRenderer(DjangoTemplates):
    def render(self, template_name, context, request=None):
        html = None
        alone = template_name in OPTION_INPUTS and not context["widget"]["wrap_label"]
        if template_name in INPUTS or alone:
            html = _input(context["widget"])
        elif template_name == f"{WIDGETS}select.html":
            html = _select(context["widget"])
        elif template_name == ERROR_LIST and not context["errors"]:
            html = ""
        if html is None:
            return super().render(template_name, context, request)
        return html


PAGE_FORMS = PageFormRenderer()
