"""The run page's "Inside the step" panel: per profiled level, the bars per rank of a decode step
(and of the other kinds seen), the steps counted, the top kernels, the steps over time, the
profiling cost and the trace files; an unavailable profile shows its reason instead."""

import pytest

from domain.step_breakdown import CLASSES
from moeops.runs import measurements
from tests import page_base as pb
from tests import step_breakdowns as sb

pytestmark = pytest.mark.django_db

LEVELS = [{"concurrency": 64, "output_throughput": 1148.0, "completed": 256, "duration": 60.0}]


@pytest.fixture
def sweep(client):
    pb.sign_in(client)
    return pb.run(pb.deployment(), label="profiled", levels=LEVELS)


def _page(client, run):
    response = client.get(f"/runs/{run.uuid}/")
    assert response.status_code == 200
    return response.content.decode()


def test_a_captured_profile_draws_a_bar_per_rank_stacked_by_class(client, sweep):
    profile, _ = measurements.profile_record(run=sweep, body=sb.captured(64), source="upload")

    html = _page(client, sweep)

    assert "Inside the step at concurrency 64" in html
    bars = pb.figure(html, f"step-{profile.pk}-decode-data")
    assert [trace["name"] for trace in bars["data"]] == list(CLASSES)
    assert bars["data"][0]["y"] == ["rank 0", "rank 1"]
    assert bars["data"][0]["x"] == [6000.0, 6000.0]
    assert bars["layout"]["barmode"] == "stack"
    assert "(profiled pass)" in bars["layout"]["title"]["text"]
    over_time = pb.figure(html, f"step-{profile.pk}-time-data")
    assert [trace["name"] for trace in over_time["data"]] == ["decode"]


def test_the_panel_gives_the_cost_the_steps_the_top_kernels_and_the_traces(client, sweep):
    body = sb.captured(
        64,
        breakdown=sb.breakdown(
            kinds=[sb.kind(top={"moe": [("fused_moe_kernel", 5400.0)]}), sb.kind("prefill")],
            notes=["rank 1's steps are 8 % longer than rank 0's"],
        ).model_dump(),
    )
    profile, _ = measurements.profile_record(run=sweep, body=body, source="upload")

    html = _page(client, sweep)

    assert "the profiled pass ran at 820 tok/s, the level&#x27;s rounds at 1,148: ×1.4" in html
    assert "fused_moe_kernel" in html
    assert "rank 1&#x27;s steps are 8 % longer than rank 0&#x27;s" in html
    assert "/var/moeops/profiles/rank1.json.gz" in html
    assert "20,000" in html and "18,000–24,000" in html
    prefill = pb.figure(html, f"step-{profile.pk}-prefill-data")
    assert prefill["layout"]["title"]["text"].startswith("A prefill step at concurrency 64")


def test_an_unavailable_profile_shows_its_reason_instead(client, sweep):
    profile, _ = measurements.profile_record(run=sweep, body=sb.unavailable(64), source="upload")

    html = _page(client, sweep)

    assert "Inside the step at concurrency 64" in html
    assert "the profile was unavailable: the engine was not started with a profiler" in html
    assert f"step-{profile.pk}-decode" not in html


@pytest.mark.parametrize(
    ("management", "engine", "offered"),
    [("managed", "vllm", True), ("external", "vllm", False), ("managed", "sglang", False)],
)
def test_a_managed_vllm_without_its_profiler_is_offered_a_restart_with_it(
    client, management, engine, offered
):
    pb.sign_in(client)
    run = pb.run(pb.deployment(management=management, engine=engine), levels=LEVELS)
    measurements.profile_record(run=run, body=sb.unavailable(64), source="upload")

    html = _page(client, run)

    assert ('name="kind" value="restart_with_profiler"' in html) is offered
    assert ("Restart with profiling available" in html) is offered


def test_a_run_without_profiles_has_no_panel(client, sweep):
    assert 'id="profiles"' not in _page(client, sweep)


def test_the_panel_costs_one_query(client, sweep, django_assert_max_num_queries):
    measurements.profile_record(run=sweep, body=sb.captured(64), source="upload")
    measurements.profile_record(run=sweep, body=sb.unavailable(128), source="upload")
    pb.telemetry(sweep, gpus=8, seconds=600)
    with django_assert_max_num_queries(16):
        assert client.get(f"/runs/{sweep.uuid}/").status_code == 200


def test_the_engine_paths_carry_the_profiles_word_beside_the_others(client):
    pb.sign_in(client)
    paths = {
        "engine": "vllm",
        "version": "0.32.0",
        "tp": 2,
        "rows": [
            {
                "key": "allreduce",
                "state": "on",
                "value": "shared memory (CPU build)",
                "reason": "the CPU build all-reduces over 2 ranks in shared memory",
            }
        ],
    }
    run = pb.run(pb.deployment(), levels=LEVELS, snapshot={"engine_paths": paths})
    top = {"communication": [("_C::shm_allreduce", 5000.0)]}
    body = sb.captured(64, breakdown=sb.breakdown(kinds=[sb.kind(top=top)]).model_dump())
    measurements.profile_record(run=run, body=body, source="upload")

    html = _page(client, run)

    assert "the window&#x27;s communication in a decode step: _C::shm_allreduce (12% of" in html
    assert '<strong class="verdict verdict-confirms">confirms it</strong>' in html
    assert "(profile at concurrency 64)" in html
