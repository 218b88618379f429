"""The compare page's "differs in" and "what changed" tags write what their template loops
wrote: a run's label and its snapshot's values escaped, a decode step's shares in whole
percent and their change signed to one decimal."""

import pytest
from django.template import engines

from tests import page_base as pb

pytestmark = pytest.mark.django_db

TAGS = engines["django"].from_string(
    "{% load compare_format %}{% differs_lines items base %}|{% what_changed_blocks items base %}"
)


def _item(run, **fields):
    return {
        "run": run,
        "factors": [],
        "incidental": [],
        "headline": None,
        "noise": None,
        "latency": None,
        "capacity": None,
        "sections": [],
        "unknown": [],
        "engine_moved": None,
        "steps": [],
        **fields,
    }


def test_labels_and_snapshot_values_are_escaped():
    deployment = pb.deployment()
    base = pb.run(deployment, "<b>before</b>")
    after = pb.run(deployment, "after & <i>then</i>")
    item = _item(
        after,
        factors=["engine <version>"],
        sections=[("Engine", [("args", "--x <y>", "--x 'z'")])],
    )
    html = TAGS.render({"items": [item], "base": base})
    assert "<b>" not in html and "<i>" not in html
    assert "&lt;b&gt;before&lt;/b&gt;" in html
    assert "after &amp; &lt;i&gt;then&lt;/i&gt;" in html
    assert "differs in: engine &lt;version&gt;" in html
    assert "<li>args: --x &lt;y&gt; → --x &#x27;z&#x27;</li>" in html


def test_a_decode_steps_shares_are_whole_percent_and_the_change_signed():
    deployment = pb.deployment()
    base, after = pb.run(deployment, "before"), pb.run(deployment, "after")
    rows = [("moe", 0.4, 0.3, -10.0), ("communication", 0.12, 0.315, 19.5)]
    html = TAGS.render({"items": [_item(after, steps=[(64, rows)])], "base": base})
    assert f'id="step-changes-{after.pk}-64"' in html
    assert '<td>moe</td><td class="num">40 %</td><td class="num">30 %</td>' in html
    assert '<td class="num">-10.0</td>' in html
    assert '<td class="num">12 %</td><td class="num">32 %</td><td class="num">+19.5</td>' in html
