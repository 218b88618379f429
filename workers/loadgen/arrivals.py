"""When each request of a rate level is sent: a Poisson process, or a gamma renewal process with
a burstiness factor (the semantics of `vllm bench serve --burstiness`), with an optional
linear ramp-up of the rate. Pure: offsets in s from the level's first send."""

from __future__ import annotations

import math

import numpy as np


def arrival_offsets(
    count: int,
    request_rate: float,
    *,
    burstiness: float = 1.0,
    ramp_up_s: float = 0.0,
    rng: np.random.Generator,
) -> np.ndarray:
    """Send times (s after the first request, ascending, the first at 0) of `count` requests.

    Gaps between requests are gamma distributed with shape `burstiness` and mean
    1 / request_rate (req/s): burstiness 1 is a Poisson process, below 1 burstier, above 1 more
    even, inf a constant gap. Without a ramp-up the offsets are scaled so that the last request
    goes at (count − 1) / request_rate, as vLLM scales its delays, so that two seeds send at the
    same mean rate. With ramp_up_s > 0 the rate rises linearly from 0 to request_rate over the
    first ramp_up_s seconds and stays there: the process is drawn at the full rate and its time
    axis warped by the inverse of the ramp's cumulative rate.
    """
    if count <= 0:
        return np.empty(0)
    if not request_rate > 0:
        raise ValueError(f"request_rate must be above 0 req/s, got {request_rate!r}")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be above 0, got {burstiness!r}")
    if ramp_up_s < 0:
        raise ValueError(f"ramp_up_s must be at least 0 s, got {ramp_up_s!r}")
    mean_gap = 1.0 / request_rate
    if math.isinf(burstiness):
        gaps = np.full(count - 1, mean_gap)
    else:
        gaps = rng.gamma(shape=burstiness, scale=mean_gap / burstiness, size=count - 1)
    offsets = np.concatenate(([0.0], np.cumsum(gaps)))
    if ramp_up_s == 0:
        if offsets[-1] > 0:
            offsets *= (count - 1) * mean_gap / offsets[-1]
        return offsets
    # the ramp's cumulative rate, in full-rate seconds u, is t² / (2 R) before R and t − R / 2
    # after: invert it
    half = ramp_up_s / 2
    return np.where(offsets < half, np.sqrt(2 * ramp_up_s * offsets), offsets + half)


def achieved_rate(send_times: np.ndarray, ramp_up_s: float = 0.0) -> float | None:
    """Requests sent per second (req/s) after the ramp-up: (n − 1) / (last − first send) over
    the sends at or after ramp_up_s from the first one; None with fewer than two of them or no
    time between them. send_times in s, any origin."""
    times = np.sort(np.asarray(send_times, dtype=np.float64))
    if times.size == 0:
        return None
    steady = times[times >= times[0] + ramp_up_s]
    if steady.size < 2 or steady[-1] <= steady[0]:
        return None
    return float((steady.size - 1) / (steady[-1] - steady[0]))
