"""Compare two runs profiled at the same concurrency: each class's share of a decode step side by
side, with the change in points (domain.step_breakdown.breakdown_changes)."""

import html as htmllib

import pytest

from domain.step_breakdown import CLASSES, breakdown_changes
from moeops.runs import measurements
from tests import page_base as pb
from tests import step_breakdowns as sb

pytestmark = pytest.mark.django_db

LEVELS = [{"concurrency": 64, "output_throughput": 1148.0}]


@pytest.fixture
def pair(client):
    pb.sign_in(client)
    deployment = pb.deployment()
    return pb.run(deployment, "before", levels=LEVELS), pb.run(deployment, "after", levels=LEVELS)


def _page(client, *runs):
    query = "&".join(f"run={r.uuid}" for r in runs)
    return htmllib.unescape(client.get(f"/compare/?{query}").content.decode())


def _profile(run, concurrency=64, **shares):
    measurements.profile_record(
        run=run, body=sb.captured(concurrency, shares=shares), source="upload"
    )


def test_breakdown_changes_gives_every_class_side_by_side_in_points():
    a = sb.breakdown(kinds=[sb.kind(shares={"communication": 0.12, "moe": 0.4})])
    b = sb.breakdown(kinds=[sb.kind(shares={"communication": 0.31, "moe": 0.3})])

    rows = breakdown_changes(a, b)

    assert [row[0] for row in rows] == list(CLASSES)
    name, share_a, share_b, points = rows[2]
    assert (name, share_a, share_b, round(points, 6)) == ("communication", 0.12, 0.31, 19.0)
    assert breakdown_changes(a, b, kind="prefill") == []


def test_two_runs_profiled_at_one_concurrency_show_each_classs_share(client, pair):
    before, after = pair
    _profile(before, communication=0.12, moe=0.4)
    _profile(after, communication=0.31, moe=0.3)

    page = _page(client, before, after)

    assert "Inside a decode step at concurrency 64" in page
    assert "communication 12 % → 31 % of a decode step" in page
    assert "+19.0" in page and "-10.0" in page


def test_profiles_at_other_concurrencies_show_no_table(client, pair):
    before, after = pair
    _profile(before, 64, communication=0.12)
    _profile(after, 128, communication=0.31)

    assert "Inside a decode step" not in _page(client, before, after)


def test_an_unavailable_profile_shows_no_table(client, pair):
    before, after = pair
    _profile(before, communication=0.12)
    measurements.profile_record(run=after, body=sb.unavailable(64), source="upload")

    assert "Inside a decode step" not in _page(client, before, after)
