"""A capacity search end to end on the stand-in: web tier → worker → stand-in → answer stored.

The stand-in runs at most 16 requests at once (--max-running-requests 16) and queues the rest:
up to 16 concurrent requests a request's first token comes within a decode step or two (15 ms
+ 0.25 ms per request each), from 17 on one request waits for a whole other request to finish
(32 tokens × 19 ms, about 600 ms). A TTFT p99 limit of 350 ms therefore holds up to exactly 16
concurrent requests: the capacity is the cap, and the answer says so and proposes raising it.

48 requests a level, three waves of 16 at every load, so that from 17 on two or more of them
wait; five rounds, not the default three, because a level meets the limit only when its
interval's upper end is under it: with three rounds one round's p99 of some 200 ms (the 2-core
machine busy with the other pass) put 16's upper end over 350 ms, with five it takes a round
of some 450 ms. It runs once, in make test's timed pass (`timing`).
"""

import pytest

from moeops.fleet.models import SLOProfile
from moeops.runs import services as run_services

pytest_plugins = ["tests.stack"]
pytestmark = [pytest.mark.e2e, pytest.mark.timing, pytest.mark.timeout(300)]


def test_a_capacity_search_finds_the_stand_ins_exact_capacity(make_sweep_stack):
    sweep_stack = make_sweep_stack(16, ("--step-ms-base", "15"))
    profile = SLOProfile.objects.create(name="interactive", ttft_percentile="p99", ttft_ms=350.0)
    run, _ = run_services.run_start(
        deployment=sweep_stack.deployment,
        parameters={
            "kind": "capacity",
            "slo_profile": profile.name,
            "start": 16,
            "input_len": 16,
            "output_len": 32,
            "prompts_per_level": 48,
            "rounds": 5,
        },
        label="capacity",
    )
    run = sweep_stack.wait_for_run(run, timeout=240)

    assert run.status == "succeeded", run.error
    answer = run.capacity
    levels = {level.concurrency: level for level in run.levels.all()}
    ttft = {c: (lv.p99_ttft_ms, lv.intervals.get("p99_ttft_ms")) for c, lv in levels.items()}
    assert answer["load"] == 16, ttft
    assert answer["bracket"] == [16, 17]
    assert answer["end"] == "bracketed"
    assert answer["load_on_medians"] == 16
    assert answer["binding"]["metric"] == "ttft"
    assert answer["binding"]["sentence"].startswith("TTFT p99 binds: ")
    assert answer["binding"]["sentence"].endswith(" at 16 concurrent, limit 350 ms")
    # the search grew 16 → 32, then bisected 32 → 17: never a level twice
    loads = [p["load"] for p in answer["probes"]]
    assert loads == [16, 32, 24, 20, 18, 17]
    assert sorted(levels) == sorted(loads)
    assert all(level.round_count == 5 and level.failed == 0 for level in levels.values())
    assert "p99_ttft_ms" in levels[16].intervals
    point = answer["at_capacity"]
    assert point["concurrency"] == 16
    assert point["output_throughput"] == levels[16].output_throughput
    assert point["running_cap"] == 16 and point["cap_share"] == 1.0
    assert point["per_user"] == pytest.approx(1000 / levels[16].median_tpot_ms)
    # the progress the run page draws the bracket from
    assert run.progress["capacity"]["bracket"] == [16, 17]

    # the capacity stops at the engine's cap: the finding says so and proposes raising it
    findings = sweep_stack.wait_for_findings(run, {("capacity", "running-cap")})
    finding = findings[("capacity", "running-cap")]
    assert finding.run_id == run.pk
    assert (
        finding.title
        == "Capacity stops at the engine's cap: 16 concurrent (--max-running-requests 16)"
    )
    assert "TTFT p99 binds" in finding.text
    raise_cap = run.deployment.plan_items.get(
        title="Raise --max-running-requests above 16 and re-sweep"
    )
    # the restart-with-a-higher-cap action reads its change from the finding: to 32, the
    # highest load the search tried
    assert finding.evidence["tested_concurrency"] == 32
    assert raise_cap.cap_change() is not None
