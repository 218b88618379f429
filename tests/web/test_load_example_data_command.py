from io import StringIO

import pytest
from django.core.management import call_command

from moeops.insights.models import Finding

pytestmark = pytest.mark.django_db


def _load():
    out = StringIO()
    call_command("load_example_data", stdout=out)
    return out.getvalue()


def test_it_loads_and_analyzes_the_write_up():
    assert "findings from the analysis" in _load()
    kinds = set(Finding.objects.filter(source="auto").values_list("kind", flat=True))
    assert "plateau" in kinds
    plateau = Finding.objects.get(kind="plateau")
    assert plateau.run.label == "Concurrency sweep (write-up)"


def test_running_it_twice_adds_no_findings():
    _load()
    first = Finding.objects.count()
    _load()
    assert Finding.objects.count() == first


def test_the_kimi_k2_deployment_tuned_in_the_write_up_is_not_told_to_tune():
    _load()
    kimi = Finding.objects.filter(deployment__name__icontains="kimi")
    # its newest run measured the write-up's tuned file in effect, which moeops does not hold
    assert kimi.exists() and not kimi.filter(kind="no_tuned_kernel").exists()
