"""The heavy pages' forms write, through the renderer that writes their widgets in Python
(moeops.front.forms.render), what Django's widget templates write: unbound, and bound with
errors, every field, choice and error list."""

import pytest
from django.forms.renderers import DjangoTemplates

from moeops.fleet.models import SLOProfile
from moeops.front.forms import render
from moeops.front.forms.deployments import PlanItemForm
from moeops.front.forms.kernels import TuneForm
from moeops.front.forms.runs import ResultFileForm, RunFilterForm
from moeops.front.forms.sweeps import CapacityForm, SweepForm
from moeops.front.forms.watches import WatchCreateForm
from moeops.runs.models import Workload
from moeops.runs.workloads import workload_store
from moeops.watches.models import AlertChannel
from tests import page_base as pb

pytestmark = pytest.mark.django_db

ANSWERED = (
    b'{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "a <b>"}]}\n'
)
TRACE = b'{"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [0, 1]}\n'
BAD = {
    "levels": "8, x",
    "input_len": "-1",
    "rounds": "",
    "start": "many",
    "schedule": "0 99 * * *",
    "batch_sizes": "",
    "title": "",
    "status": "nope",
    "workload": "999",
    "slo_profile": "999",
    "channels": ["999"],
    "dtype": "fp4",
    "burstiness": "1 & 2",
    "label": '"quoted" <label>',
    "since": "2026-13-01",
    "until": "2026-01-02",
    "kernel": "tuned",
}


@pytest.fixture
def forms():
    """forms(renderer): every form of the deployment page, unbound and bound to BAD."""
    deployment = pb.deployment(endpoint_url="")
    Workload.objects.create(name='plain "<w>"', kind="random", spec={"input_len": 16})
    workload_store(name="answered", spec={"kind": "dataset"}, file_name="a.jsonl", data=ANSWERED)
    workload_store(name="trace", spec={"kind": "trace"}, file_name="t.jsonl", data=TRACE)
    profile = SLOProfile.objects.create(name="chat & co", ttft_percentile="p99", ttft_ms=500)
    deployment.default_slo_profile = profile
    AlertChannel.objects.create(name="<ops>", kind="email", recipients=["a@b.example"])

    def made(renderer):
        for data in (None, BAD):
            bound = {"renderer": renderer} | ({} if data is None else {"data": data})
            yield SweepForm(**bound, deployment=deployment)
            yield CapacityForm(**bound, deployment=deployment)
            yield WatchCreateForm(**bound, deployment=deployment)
            yield TuneForm(**bound, deployment=deployment)
            yield ResultFileForm(**bound)
            yield PlanItemForm(**bound)
            yield RunFilterForm(**bound)

    return made


def _written(form):
    form.is_bound and form.is_valid()
    html = [str(form.non_field_errors())]
    for field in form:
        html += [str(field), str(field.errors)]
        html += [str(choice.tag()) for choice in field.subwidgets if field.name == "channels"]
    return html


def test_the_forms_write_what_djangos_templates_write(forms):
    pairs = list(zip(forms(None), forms(DjangoTemplates()), strict=True))
    for fast, templates in pairs:
        assert fast.renderer is render.PAGE_FORMS
        assert _written(fast) == _written(templates), type(fast).__name__
    # the BAD forms have errors to write
    assert "errorlist" in "".join(_written(pairs[-1][0]))


def test_what_the_python_does_not_write_goes_to_the_templates():
    templates = DjangoTemplates()
    option = {
        "name": "w",
        "value": 1,
        "label": 7,
        "selected": False,
        "index": "0",
        "attrs": {},
        "type": "select",
        "template_name": "django/forms/widgets/select_option.html",
        "wrap_label": True,
    }
    grouped = {
        "name": "w",
        "attrs": {"id": "id_w"},
        "optgroups": [("group", [option], 0)],
        "template_name": "django/forms/widgets/select.html",
    }
    for widget in (grouped, {**grouped, "optgroups": [(None, [option], 0)]}):
        name = "django/forms/widgets/select.html"
        written = render.PAGE_FORMS.render(name, {"widget": widget})
        assert written == templates.render(name, {"widget": widget})
