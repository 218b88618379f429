"""Arrival times of a rate level: Poisson, gamma with a burstiness factor, a linear ramp-up."""

import math

import numpy as np
import pytest

from workers.loadgen.arrivals import achieved_rate, arrival_offsets


def _gaps(burstiness, count=20_000, rate=10.0, seed=1):
    offsets = arrival_offsets(count, rate, burstiness=burstiness, rng=np.random.default_rng(seed))
    return np.diff(offsets)


def test_a_poisson_level_sends_its_last_request_at_the_asked_rate():
    offsets = arrival_offsets(101, 20.0, rng=np.random.default_rng(0))

    assert offsets[0] == 0 and np.all(np.diff(offsets) >= 0)
    assert offsets[-1] == pytest.approx(100 / 20.0)
    assert achieved_rate(offsets) == pytest.approx(20.0)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gaps_have_the_mean_of_the_rate_and_the_spread_of_the_burstiness(burstiness):
    gaps = _gaps(burstiness)

    # gamma(shape k, mean m) has a coefficient of variation 1 / √k
    assert gaps.mean() == pytest.approx(0.1, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_an_infinite_burstiness_sends_at_a_constant_gap():
    gaps = _gaps(math.inf, count=50)

    assert gaps == pytest.approx(np.full(49, 0.1))


def test_a_ramp_up_starts_slow_and_reaches_the_rate_after_it():
    offsets = arrival_offsets(
        2001, 10.0, burstiness=math.inf, ramp_up_s=20.0, rng=np.random.default_rng(0)
    )

    # the ramp's first 10 s send a quarter of what 10 s at the full rate would (linear rise)
    assert np.sum(offsets < 10.0) == pytest.approx(25, abs=1)
    assert np.sum(offsets < 20.0) == pytest.approx(100, abs=1)
    assert achieved_rate(offsets, ramp_up_s=20.0) == pytest.approx(10.0, rel=0.01)
    assert achieved_rate(offsets) < 10.0


def test_the_achieved_rate_needs_two_sends():
    assert achieved_rate(np.array([])) is None
    assert achieved_rate(np.array([3.0])) is None
    assert achieved_rate(np.array([3.0, 3.0])) is None


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"request_rate": 0.0}, "request_rate must be above 0"),
        ({"burstiness": 0.0}, "burstiness must be above 0"),
        ({"ramp_up_s": -1.0}, "ramp_up_s must be at least 0"),
    ],
)
def test_it_refuses_rates_and_shapes_that_send_nothing(kw, message):
    args = {"request_rate": 5.0, "burstiness": 1.0, "ramp_up_s": 0.0, **kw}
    rate = args.pop("request_rate")
    with pytest.raises(ValueError, match=message):
        arrival_offsets(10, rate, rng=np.random.default_rng(0), **args)
