"""Two versions of one file, one tuned under uniform routing and one under Zipf 1.2, each timed
again under the other's routing (issue 42, item 4): the kernel page puts them side by side and
says, per routing, how the file tuned for it compares with the other."""

from html import unescape
from statistics import geometric_mean

import pytest

from moeops.kernels.models import TuningRun, TuningTiming
from tests import page_base as pb
from tests.fakes import KERNEL_ENTRY

pytestmark = pytest.mark.django_db

ZIPF = {"kind": "zipf", "parameter": 1.2}
UNIFORM = {"kind": "uniform"}
# M: (uniform file under uniform, under Zipf), (Zipf file under Zipf, under uniform), µs
TIMES = {
    2: ((20.0, 22.0), (21.9, 20.1)),
    24: ((40.0, 47.3), (44.0, 41.0)),
    512: ((300.0, 330.0), (321.0, 306.0)),
}


def _version(entries_m):
    entry = {**KERNEL_ENTRY, "BLOCK_SIZE_M": entries_m}
    return pb.h200_fp8_config({str(m): entry for m in TIMES}, source="tuned")


def _tune(config, routing, own, other_routing, *, which):
    tuning = TuningRun.objects.create(
        E=256, N=256, hidden_size=6144, topk=8, status="succeeded", result=config, routing=routing
    )
    for m, pair in TIMES.items():
        under_own, under_other = pair[which]
        TuningTiming.objects.create(
            run=tuning,
            batch_size=m,
            tuned_us=under_own,
            default_us=under_own * 1.1,
            also_under={"routing": other_routing, "tuned_us": under_other, "default_us": 50.0},
        )
    return tuning


@pytest.fixture
def two_routings(client):
    pb.sign_in(client)
    uniform = _version(16)
    skewed = _version(32)
    _tune(uniform, "uniform", UNIFORM, ZIPF, which=0)
    _tune(skewed, "zipf:1.2", ZIPF, UNIFORM, which=1)
    return uniform, skewed


def _section(client, config):
    html = unescape(client.get(f"/kernels/{config.pk}/").content.decode())
    assert 'class="routing-side-by-side"' in html
    return html.split('class="routing-side-by-side"')[1].split("</section>")[0]


def test_the_skew_tuned_file_sits_beside_the_uniform_one_with_both_routings(client, two_routings):
    uniform, skewed = two_routings
    section = _section(client, skewed)

    assert f"v{uniform.version}</a>, tuned under uniform" in section
    assert "this file was tuned under Zipf 1.2" in section
    rows = section.split("<tbody>")[1].split("</tbody>")[0].split("<tr>")[1:]
    assert len(rows) == len(TIMES)
    m24 = next(r for r in rows if r.startswith('<td class="num">24</td>'))
    # this file under Zipf, the uniform file under Zipf, this file under uniform, the other under it
    assert [c.split("<")[0] for c in m24.split('<td class="num">')[2:]] == [
        "44.0",
        "47.3",
        "41.0",
        "40.0",
    ]


def test_each_routing_says_how_the_file_tuned_for_it_compares(client, two_routings):
    uniform, skewed = two_routings
    section = _section(client, skewed)

    under_zipf = [(TIMES[m][0][1] / TIMES[m][1][0], m) for m in TIMES]
    under_uniform = [(TIMES[m][1][1] / TIMES[m][0][0], m) for m in TIMES]
    best, worst = max(under_zipf), min(under_zipf)
    assert (
        f"Under Zipf 1.2 the file tuned for it (this file) is "
        f"{geometric_mean([r for r, _ in under_zipf]):.3f}× as fast as v{uniform.version} in "
        f"geomean over 3 batch sizes; best {best[0]:.3f}× at M={best[1]}, "
        f"worst {worst[0]:.3f}× at M={worst[1]}."
    ) in section
    assert (
        f"Under uniform the file tuned for it (v{uniform.version}) is "
        f"{geometric_mean([r for r, _ in under_uniform]):.3f}× as fast as this file"
    ) in section
    # seen from the uniform file, the same two comparisons, named the other way round
    other = _section(client, uniform)
    assert f"the file tuned for it (v{skewed.version}) is" in other
    assert "Under uniform the file tuned for it (this file) is" in other


def test_a_file_without_a_version_tuned_under_another_routing_shows_no_side_by_side(client):
    pb.sign_in(client)
    first, second = _version(16), _version(32)
    _tune(first, "uniform", UNIFORM, ZIPF, which=0)
    _tune(second, "uniform", UNIFORM, ZIPF, which=0)

    html = client.get(f"/kernels/{second.pk}/").content.decode()
    assert html.count("routing-side-by-side") == 0


def test_times_neither_tune_took_under_the_others_routing_are_a_dash(client):
    pb.sign_in(client)
    uniform, skewed = _version(16), _version(32)
    _tune(uniform, "uniform", UNIFORM, ZIPF, which=0)
    _tune(skewed, "dirichlet:0.3", {"kind": "dirichlet", "parameter": 0.3}, UNIFORM, which=1)

    section = _section(client, uniform)
    # the uniform tune timed its file again under Zipf, not under the other tune's Dirichlet
    assert "tuned under Dirichlet α=0.3" in section
    assert "Under Dirichlet α=0.3" not in section
    assert "Under uniform the file tuned for it (this file)" in section
    assert "—" in section
