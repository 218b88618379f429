"""The capacity form's estimated duration (moeops.front.capacity_estimate): the levels the
search would run at the engine's pace, how long and how many requests, before it starts."""

import pytest

from moeops.fleet.models import SLOProfile
from tests import page_base as pb

pytestmark = pytest.mark.django_db


@pytest.fixture
def standin(client):
    """A deployment whose last health check found the stand-in engine, cap 64, with a default
    profile of TPOT p99 at most 20 ms."""
    pb.sign_in(client)
    profile = SLOProfile.objects.create(name="chat", tpot_percentile="p99", tpot_ms=20.0)
    return pb.standin_deployment(default_slo_profile=profile)


def _estimate(client, deployment, **search):
    query = {"mode": "concurrency", "start": 1, "rounds": 3, "input_len": 1024, **search}
    url = f"/deployments/{deployment.pk}/capacity/estimate/"
    return client.get(url, {"output_len": 256, "endpoint": "completions", **query}).json()["text"]


def test_the_search_on_the_standin_is_told_before_it_starts(client, standin):
    # the stand-in's pace: 8 ms + 0.25 ms per running request at 1, 2, 4 … 64, log2-interpolated
    # between. Growth 1…64 (64 fails at 24 ms), then 48 (20.7 ms) failed, 40 (18.6) and 44
    # (19.7) met, 46 (20.2) failed: 44–46 is within 5 %. 11 levels, Σ 305 streams × 4 prompts ×
    # 3 rounds = 3,660 requests; each level 4 waves of 256 steps, 3 times: 3 × 1024 × Σ 166.9 ms
    # of steps = 513 s
    assert _estimate(client, standin) == (
        "Estimated duration: ≈ 8 min 33 s, 11 levels from 1 to 64 concurrent, 3,660 requests "
        "(from the stand-in engine's step time, at most 64 requests at once; more where a "
        "level's rounds straddle a limit)."
    )


def test_the_estimate_follows_the_search_asked(client, standin):
    text = _estimate(client, standin, end=16, rounds=5)
    assert text.startswith("Estimated duration: ≈ ")
    # 1, 2, 4, 8, 16 all met, 16 the end: Σ 31 streams × 4 prompts × 5 rounds
    assert ", 5 levels from 1 to 16 concurrent, 620 requests " in text


def test_the_deployment_page_asks_for_the_estimate_of_the_form_as_it_stands(client, standin):
    html = pb.form_html(client, standin, "capacity")
    url = f"/deployments/{standin.pk}/capacity/estimate/"
    assert f'id="capacity-estimate" data-estimate-url="{url}"' in html


def test_no_estimate_without_a_pace_or_for_a_request_rate_search(client, standin):
    assert _estimate(client, standin, mode="request_rate").startswith(
        "No estimated duration for a request-rate search"
    )
    other = pb.deployment("cold", model_row=standin.model, host_row=pb.host("cold-host"))
    assert _estimate(client, other) == (
        "No estimated duration: no sweep of this deployment measured its TPOT yet."
    )
