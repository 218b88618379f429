"""Cost and energy per output token of a level: pure arithmetic on what is recorded, with the
reason when a figure cannot be had (never a zero or a guess). docs/metrics.md defines both."""

import math
from dataclasses import dataclass

SECONDS_PER_HOUR = 3600


@dataclass(frozen=True)
class Figure:
    """A derived figure (value in `unit`), or None with the reason it is absent."""

    value: float | None
    unit: str = ""
    reason: str = ""


def _absent(reason, unit=""):
    return Figure(None, unit, reason)


def cost_per_million_output_tokens(price_per_gpu_hour, currency, num_gpus, output_tok_s):
    """What a million output tokens cost at this level: price × GPUs ÷ output tok/s × 10⁶ ÷ 3600.

    price_per_gpu_hour: the host's price of one GPU for an hour (a number in `currency`, or
    None: unknown); num_gpus: the GPUs the deployment holds; output_tok_s: the level's output
    throughput (tok/s). Unit: `currency` per 10⁶ output tokens."""
    unit = f"{currency} per 1M output tokens" if currency else ""
    if price_per_gpu_hour is None:
        return _absent("the host has no price per GPU-hour", unit)
    if not num_gpus:
        return _absent("the deployment's GPUs are not recorded", unit)
    if not output_tok_s:
        return _absent("the level has no output throughput", unit)
    value = float(price_per_gpu_hour) * num_gpus / output_tok_s * 1e6 / SECONDS_PER_HOUR
    return Figure(value, unit)


def energy_per_output_token(total_power_w, output_tok_s):
    """Energy one output token took at this level (J): the mean total power of the run's GPUs
    over the level (W, the sum over GPUs of each one's mean NVML power) ÷ output tok/s.

    total_power_w None: no power samples over the level."""
    if total_power_w is None or not math.isfinite(total_power_w):
        return _absent("no GPU power samples over the level", "J")
    if not output_tok_s:
        return _absent("the level has no output throughput", "J")
    return Figure(total_power_w / output_tok_s, "J")
