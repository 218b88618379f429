"""domain.slo: the one rule a profile's limits keep, and a level judged against them."""

import math

import pytest

from domain.slo import judge, profile_problems, stat_key

TPOT_ONLY = {"tpot": ("p99", 50.0)}


def test_it_accepts_one_limit():
    assert profile_problems(TPOT_ONLY, 1.0) == {}


def test_it_refuses_a_profile_without_a_limit():
    problems = profile_problems({}, 1.0)
    assert problems == {
        "__all__": "A profile needs at least one limit (TTFT, TPOT, ITL or E2E latency)."
    }


@pytest.mark.parametrize(
    ("limits", "field", "words"),
    [
        ({"ttft": ("p42", 500.0)}, "ttft_percentile", "p50, p90, p95, p99"),
        ({"ttft": ("", 500.0)}, "ttft_percentile", "a limit but no percentile"),
        ({"tpot": ("p99", 0.0)}, "tpot_ms", "above 0 ms"),
        ({"itl": ("p99", -3.0)}, "itl_ms", "above 0 ms"),
        ({"e2el": ("p95", math.nan)}, "e2el_ms", "a number of ms"),
        ({"e2el": ("p95", 1e300)}, "e2el_ms", "at most"),
        ({"tpot": ("p99", None)}, "tpot_ms", "no limit"),
    ],
)
def test_it_refuses_a_bad_limit_naming_the_field(limits, field, words):
    problems = profile_problems(limits, 1.0)
    assert field in problems and words in problems[field]


@pytest.mark.parametrize("share", [-0.1, 100.1, math.nan, math.inf])
def test_it_refuses_a_failure_share_outside_0_to_100(share):
    assert "max_failed_percent" in profile_problems(TPOT_ONLY, share)


def test_p50_reads_the_median():
    assert stat_key("ttft", "p50") == "median_ttft_ms"
    assert stat_key("tpot", "p99") == "p99_tpot_ms"


LEVEL = {"p99_ttft_ms": 400.0, "p99_tpot_ms": 47.0, "completed": 99, "failed": 1}
LIMITS = {"ttft": ("p99", 500.0), "tpot": ("p99", 50.0)}


def test_a_level_within_every_limit_meets_the_profile_and_the_closest_limit_binds():
    verdict = judge(LIMITS, 1.0, LEVEL)
    assert verdict.met
    assert verdict.failed_percent == 1.0
    # TPOT at 47/50 = 0.94 of its limit, TTFT at 400/500 = 0.8
    assert verdict.binding.metric == "tpot"
    assert verdict.binding.margin_ms == 3.0
    assert verdict.binding.sentence() == "TPOT p99: 47 ms, limit 50 ms"
    ttft = verdict.checks[0]
    assert (ttft.metric, ttft.met, ttft.margin_ms, ttft.ratio) == ("ttft", True, 100.0, 0.8)


def test_the_limit_most_over_binds_and_the_level_fails():
    verdict = judge(LIMITS, 1.0, {**LEVEL, "p99_ttft_ms": 900.0, "p99_tpot_ms": 60.0})
    assert not verdict.met
    # 900/500 = 1.8 over 60/50 = 1.2
    assert verdict.binding.metric == "ttft"
    assert verdict.binding.margin_ms == -400.0


def test_an_upper_bound_is_judged_in_place_of_the_point_value():
    verdict = judge(LIMITS, 1.0, LEVEL, upper={"p99_tpot_ms": 52.0})
    assert not verdict.met
    assert verdict.binding.figure == 52.0


def test_too_many_failures_fail_the_level():
    verdict = judge(LIMITS, 1.0, {**LEVEL, "completed": 98, "failed": 2})
    assert not verdict.failures_met and not verdict.met


def test_a_missing_figure_is_not_met_and_binds():
    verdict = judge(LIMITS, 1.0, {"p99_ttft_ms": 400.0, "completed": 10, "failed": 0})
    assert not verdict.met
    assert verdict.binding.metric == "tpot" and verdict.binding.figure is None
