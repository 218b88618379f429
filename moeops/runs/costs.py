"""Cost and energy per output token of each level of a run, from its host's price and its GPU
power samples (domain.cost does the arithmetic; docs/metrics.md defines both)."""

from dataclasses import dataclass

from domain.cost import Figure, cost_per_million_output_tokens, energy_per_output_token

# why an imported file's per-GPU figures and cost are unknown
GPUS_UNSTATED = "the result file does not say how many GPUs it ran on"


@dataclass(frozen=True)
class LevelCost:
    """cost: per 10⁶ output tokens in the host's currency; energy: J per output token."""

    cost: Figure
    energy: Figure


def _no_power_reason(run):
    if run.telemetry_status == "recorded":
        return "no GPU power samples over the level"
    why = run.telemetry_detail or run.get_telemetry_status_display().lower()
    return f"no GPU power samples for this run ({why})"


def level_costs(run, levels, num_gpus, power=None):
    """{level key: LevelCost} of a SweepRun's levels (one query for the power samples);
    num_gpus: run.measured_gpu_count(), which the callers have at hand; power: run.level_power
    (levels) where the caller read it already (front.series.gpu_series reads it too)."""
    host = run.deployment.host
    # a file measured elsewhere: the host's GPUs are not the ones it ran on
    unstated = run.source == "import" and not num_gpus
    power = run.level_power(levels) if power is None else power
    no_power = _no_power_reason(run)
    costs = {}
    for level in levels:
        energy = energy_per_output_token(power.get(level.key), level.output_throughput)
        if level.key not in power:
            energy = Figure(None, energy.unit, no_power)
        cost = cost_per_million_output_tokens(
            host.price_per_gpu_hour, host.currency, num_gpus, level.output_throughput
        )
        if unstated:
            cost = Figure(None, cost.unit, GPUS_UNSTATED)
        costs[level.key] = LevelCost(cost=cost, energy=energy)
    return costs
