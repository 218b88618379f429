"""domain.capacity: the search's next load, its end, and the answer, on levels built by hand."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.capacity import (
    DEFAULT_BUDGET,
    WIDTH,
    Search,
    at_capacity,
    bracket,
    capacities_compared,
    capacity_answer,
    capacity_range,
    ended,
    limited_by_cap,
    needs_more_rounds,
    next_load,
    parse_slo,
    probe_of,
    search_problems,
)

TPOT_P99_50 = {"tpot": ("p99", 50.0)}


def level(tpot_ms, *, upper=None, completed=100, failed=0, throughput=1000.0):
    """A level with p99 TPOT `tpot_ms` (its interval's upper end `upper`, None: one round)."""
    intervals = {} if upper is None else {"p99_tpot_ms": [tpot_ms * 0.9, upper]}
    return {
        "p99_tpot_ms": tpot_ms,
        "median_tpot_ms": tpot_ms / 2,
        "completed": completed,
        "failed": failed,
        "output_throughput": throughput,
        "intervals": intervals,
    }


def run_search(search, meets, limits=TPOT_P99_50):
    """The probes of a search over an engine whose level at load x meets the limit iff
    meets(x) (a TPOT of 40 ms against 60 ms)."""
    probes = []
    while (load := next_load(search, probes)) is not None:
        assert all(p.load != load for p in probes), f"{load} asked twice"
        probes.append(probe_of(limits, 1.0, load, level(40.0 if meets(load) else 60.0)))
    return probes


def test_it_grows_geometrically_until_a_level_fails_then_bisects():
    search = Search("concurrency", start=1)
    probes = run_search(search, lambda c: c <= 48)
    # 48 → 50 is 2 wide, within 5 % of 48
    assert [p.load for p in probes] == [1, 2, 4, 8, 16, 32, 64, 48, 56, 52, 50]
    assert ended(search, probes) == "bracketed"
    assert bracket(probes) == (48, 50)


def test_it_stops_once_the_bracket_is_within_five_percent():
    search = Search("concurrency", start=100)
    probes = run_search(search, lambda c: c <= 310)
    low, high = bracket(probes)
    assert low <= 310 < high
    assert high - low <= WIDTH * low
    assert (high - low) * 2 > WIDTH * low, "one bisection more than needed"


def test_a_request_rate_search_bisects_real_numbers():
    search = Search("request_rate", start=0.5)
    probes = run_search(search, lambda r: r <= 3.3)
    low, high = bracket(probes)
    assert low <= 3.3 < high and high - low <= WIDTH * low
    assert any(not float(p.load).is_integer() for p in probes)


def test_it_steps_down_from_a_start_that_fails():
    search = Search("concurrency", start=64)
    probes = run_search(search, lambda c: c <= 5)
    assert [p.load for p in probes[:5]] == [64, 32, 16, 8, 4]
    assert bracket(probes) == (5, 6)


def test_it_ends_when_not_even_one_concurrent_request_meets_the_slo():
    search = Search("concurrency", start=4)
    probes = run_search(search, lambda c: False)
    assert [p.load for p in probes] == [4, 2, 1]
    answer = capacity_answer(search, probes)
    assert answer["load"] is None and answer["end"] == "none_met"
    assert answer["binding"]["sentence"] == "TPOT p99 binds: 60 ms at 1 concurrent, limit 50 ms"


def test_it_stops_at_the_end_of_its_range_when_that_meets():
    search = Search("concurrency", start=3, end=20)
    probes = run_search(search, lambda c: True)
    assert [p.load for p in probes] == [3, 6, 12, 20]
    answer = capacity_answer(search, probes)
    assert answer["load"] == 20 and answer["end"] == "end_met"
    assert answer["bracket"] == [20, None]


def test_it_stops_when_the_level_budget_is_spent():
    search = Search("concurrency", start=1, budget=5)
    probes = run_search(search, lambda c: c <= 1000)
    assert len(probes) == 5
    assert capacity_answer(search, probes)["end"] == "budget"


def test_a_level_meets_only_when_the_upper_bound_is_under_the_limit():
    within = probe_of(TPOT_P99_50, 1.0, 8, level(45.0, upper=49.0))
    noisy = probe_of(TPOT_P99_50, 1.0, 16, level(45.0, upper=55.0))
    assert within.met and within.met_on_medians
    assert not noisy.met and noisy.met_on_medians


def test_a_level_straddling_its_limit_runs_more_rounds_up_to_ten():
    noisy = probe_of(TPOT_P99_50, 1.0, 16, level(45.0, upper=55.0))
    clear = probe_of(TPOT_P99_50, 1.0, 16, level(45.0, upper=49.0))
    over = probe_of(TPOT_P99_50, 1.0, 16, level(51.0, upper=60.0))
    assert needs_more_rounds(noisy, 3) and needs_more_rounds(noisy, 9)
    assert not needs_more_rounds(noisy, 10)
    # a level met on its bounds, or failed on its medians too, is judged as it stands
    assert not needs_more_rounds(clear, 3) and not needs_more_rounds(over, 3)
    # failures are no noise of the rounds: a level failing on its failed share is judged
    failing = probe_of(TPOT_P99_50, 1.0, 16, {**level(45.0, upper=55.0), "failed": 5})
    assert not needs_more_rounds(failing, 3)


def test_a_level_with_too_many_failures_fails_however_fast():
    probe = probe_of(TPOT_P99_50, 1.0, 8, level(10.0, completed=97, failed=3))
    assert not probe.met and not probe.met_on_medians


def test_the_answer_on_medians_reaches_further_than_the_conservative_one():
    search = Search("concurrency", start=8)
    # the median meets up to 32, the upper bound only up to 16
    probes = [
        probe_of(TPOT_P99_50, 1.0, c, level(tpot, upper=upper))
        for c, tpot, upper in [(8, 30, 35), (16, 40, 48), (32, 46, 58), (64, 70, 80)]
    ]
    answer = capacity_answer(search, probes)
    assert answer["load"] == 16 and answer["load_on_medians"] == 32
    assert answer["bracket"] == [16, 32] and answer["bracket_on_medians"] == [32, 64]
    assert answer["binding"]["sentence"] == "TPOT p99 binds: 48 ms at 16 concurrent, limit 50 ms"
    assert answer["level"]["p99_tpot_ms"] == 40
    assert [p["met"] for p in answer["probes"]] == [True, True, False, False]


def test_the_binding_metric_is_the_one_the_failing_level_is_most_over():
    limits = {"ttft": ("p99", 500.0), "tpot": ("p99", 50.0)}
    ok = {**level(30.0), "p99_ttft_ms": 450.0}
    over = {**level(52.0), "p99_ttft_ms": 900.0}
    search = Search("concurrency", start=4)
    probes = [probe_of(limits, 1.0, 4, ok), probe_of(limits, 1.0, 8, over)]
    binding = capacity_answer(search, probes)["binding"]
    assert binding["metric"] == "ttft" and binding["figure"] == 450.0
    assert binding["sentence"] == "TTFT p99 binds: 450 ms at 4 concurrent, limit 500 ms"


def test_failed_requests_bind_when_they_are_what_fails():
    search = Search("concurrency", start=4)
    probes = [
        probe_of(TPOT_P99_50, 1.0, 4, level(30.0)),
        probe_of(TPOT_P99_50, 1.0, 8, level(30.0, completed=90, failed=10)),
    ]
    binding = capacity_answer(search, probes)["binding"]
    assert binding["metric"] == "failed"
    assert binding["sentence"] == "failed requests bind: 10 % at 8 concurrent, limit 1 %"


def test_a_load_met_above_a_failed_one_is_not_the_answer():
    search = Search("concurrency", start=4)
    probes = [
        probe_of(TPOT_P99_50, 1.0, 4, level(30.0)),
        probe_of(TPOT_P99_50, 1.0, 8, level(60.0)),
        probe_of(TPOT_P99_50, 1.0, 16, level(30.0)),
    ]
    assert bracket(probes) == (4, 8)
    assert next_load(search, probes) == 6


def test_the_capacity_point_holds_what_a_deployment_does_there():
    point = {
        "concurrency": 48,
        "output_throughput": 4800.0,
        "median_tpot_ms": 40.0,
        "request_goodput": 2.5,
        "intervals": {"output_throughput": [4500.0, 5100.0]},
    }
    figures = at_capacity(point, num_gpus=8, running_cap=64, gpu_util=91.0, power_w=4200.0)
    assert figures["per_gpu"] == 600.0
    assert figures["per_user"] == 25.0
    assert figures["cap_share"] == 0.75
    assert figures["output_throughput_interval"] == [4500.0, 5100.0]
    assert (figures["gpu_util"], figures["power_w"]) == (91.0, 4200.0)
    unknown = at_capacity({"concurrency": 4})
    assert unknown["per_gpu"] is None and unknown["per_user"] is None
    assert unknown["cap_share"] is None
    # at a request rate, the requests in flight are Little's: 4 req/s × 2.5 s
    rated = {"concurrency": 1024, "request_rate": 4.0, "request_throughput": 4.0}
    assert at_capacity({**rated, "mean_e2el_ms": 2500.0}, running_cap=20)["cap_share"] == 0.5
    assert at_capacity(rated, running_cap=20)["cap_share"] is None


@pytest.mark.parametrize(
    ("bracket_", "cap", "limited"),
    [([48, 49], 48, True), ([40, 50], 48, True), ([32, 40], 48, False), ([48, None], 48, False)],
)
def test_a_capacity_is_limited_by_the_cap_when_its_bracket_straddles_it(bracket_, cap, limited):
    answer = {"mode": "concurrency", "bracket": bracket_}
    assert limited_by_cap(answer, cap) is limited
    assert not limited_by_cap(answer, None)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("speed", 1), "mode"),
        (("concurrency", 0), "start"),
        (("concurrency", 2.5), "start"),
        (("concurrency", 64, 32), "end"),
        (("request_rate", math.nan), "start"),
        (("request_rate", 4.0, 2.0), "end"),
        (("concurrency", 1, None, 1), "budget"),
        (("concurrency", True), "start"),
    ],
)
def test_it_refuses_a_bad_range_naming_the_field(args, field):
    assert field in search_problems(*args)


def test_it_accepts_a_good_range():
    assert search_problems("concurrency", 1, 64, 12) == {}
    assert search_problems("request_rate", 0.25) == {}


def test_it_reads_limits_from_the_command_line():
    assert parse_slo("ttft:p99:500, tpot:p99:50") == {
        "ttft": ("p99", 500.0),
        "tpot": ("p99", 50.0),
    }


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "at least one limit"),
        ("ttft:p99", "metric:percentile:ms"),
        ("speed:p99:5", "metric must be one of"),
        ("ttft:p42:5", "percentile must be one of"),
        ("ttft:p99:fast", "a number of ms"),
        ("ttft:p99:-1", "above 0 ms"),
    ],
)
def test_it_refuses_bad_limits_in_words(text, words):
    with pytest.raises(ValueError, match=words):
        parse_slo(text)


def _bracketed(mode, start, capacity):
    """A search from start (with 64 probes to spend) of an engine that meets the limits up to
    capacity: (its probes, the bracket), the bracket holding capacity."""
    search = Search(mode, start=start, budget=64)
    probes = run_search(search, lambda load: load <= capacity)
    low, high = bracket(probes)
    assert ended(search, probes) == "bracketed"
    assert low <= capacity < high
    return probes, (low, high)


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.integers(min_value=1, max_value=5000),
    start=st.integers(min_value=1, max_value=5000),
)
def test_a_concurrency_search_brackets_any_capacity(capacity, start):
    probes, (low, high) = _bracketed("concurrency", start, capacity)
    assert high - low <= max(1, WIDTH * low)
    # growth and bisection both take about log2 steps
    assert len(probes) <= 2 * math.log2(max(capacity, start)) + 8


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(min_value=1, max_value=2000))
def test_from_one_the_default_budget_suffices(capacity):
    search = Search("concurrency", start=1)
    probes = run_search(search, lambda c: c <= capacity)
    assert len(probes) <= DEFAULT_BUDGET
    assert ended(search, probes) == "bracketed"
    if capacity <= 20:
        # the bracket narrows to one concurrency: the exact capacity
        assert bracket(probes)[0] == capacity


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.floats(min_value=0.02, max_value=500.0),
    start=st.floats(min_value=0.05, max_value=100.0),
)
def test_a_request_rate_search_brackets_any_capacity(capacity, start):
    _, (low, high) = _bracketed("request_rate", start, capacity)
    assert high - low <= WIDTH * low


@settings(max_examples=200, deadline=None)
@given(
    verdicts=st.lists(st.booleans(), min_size=1, max_size=40),
    start=st.integers(min_value=1, max_value=300),
)
def test_on_any_noise_the_search_ends_and_never_repeats_a_load(verdicts, start):
    # a noisy engine: each level's verdict drawn regardless of its load
    search = Search("concurrency", start=start, budget=40)
    probes = []
    for met in verdicts:
        load = next_load(search, probes)
        if load is None:
            break
        assert load >= 1 and all(p.load != load for p in probes)
        probes.append(probe_of(TPOT_P99_50, 1.0, load, level(40.0 if met else 60.0)))
    answer = capacity_answer(search, probes)
    low, high = answer["bracket"]
    assert low is None or high is None or low < high


def _answer(load, medians_bracket, profile="chat", mode="concurrency"):
    return {
        "load": load,
        "load_on_medians": medians_bracket[0],
        "bracket_on_medians": medians_bracket,
        "profile": profile,
        "mode": mode,
    }


def test_a_capacity_lies_between_its_conservative_answer_and_where_medians_fail():
    assert capacity_range(_answer(48, [56, 64])) == (48, 64)
    assert capacity_range(_answer(48, [64, None])) == (48, 64)
    assert capacity_range(_answer(None, [None, 4])) is None


def test_two_capacities_differ_beyond_the_noise_only_when_their_ranges_do_not_overlap():
    assert capacities_compared(_answer(16, [16, 24]), _answer(48, [48, 56])).startswith(
        "beyond the noise (capacity 48–56 against 16–24 concurrent"
    )
    assert capacities_compared(_answer(16, [20, 32]), _answer(24, [24, 28])).startswith(
        "within noise (capacity 24–28 against 16–32 concurrent"
    )
    assert capacities_compared(_answer(16, [16, 24]), _answer(16, [16, 24], "batch")).startswith(
        "not compared"
    )
    assert capacities_compared(None, _answer(16, [16, 24])) is None
