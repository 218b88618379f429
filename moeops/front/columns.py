"""The per-level metrics as columns: vLLM's key names, a header for people, and the unit."""

from dataclasses import dataclass

from domain.levels import LATENCY_METRICS, LATENCY_STATS


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    unit: str
    digits: int = 0

    @property
    def header(self):
        return f"{self.label} ({self.unit})" if self.unit else self.label

    @property
    def csv_header(self):
        return f"{self.key} ({self.unit})" if self.unit else self.key


# vLLM names the median "median"; people read it as p50 next to p99
_STAT_LABELS = {
    "mean": "mean",
    "median": "p50",
    "std": "std",
    "p90": "p90",
    "p95": "p95",
    "p99": "p99",
}

LEVEL_COLUMNS = (
    Column("concurrency", "concurrency", ""),
    Column("request_rate", "request rate", "req/s", 2),
    Column("input_len", "input length", "tokens"),
    Column("output_len", "output length", "tokens"),
    Column("completed", "completed", "requests"),
    Column("failed", "failed", "requests"),
    Column("duration", "duration", "s", 1),
    Column("total_input_tokens", "input tokens", "tokens"),
    Column("total_output_tokens", "output tokens", "tokens"),
    Column("request_throughput", "request throughput", "req/s", 2),
    Column("output_throughput", "output throughput", "tok/s"),
    Column("total_token_throughput", "total throughput", "tok/s"),
    Column("output_throughput_per_gpu", "output per GPU", "tok/s"),
    Column("interactivity", "per user (1000/p50 TPOT)", "tok/s", 1),
    Column("max_output_tokens_per_s", "max output in 1 s", "tok/s"),
    Column("max_concurrent_requests", "max concurrent", "requests"),
    Column("request_goodput", "goodput", "req/s", 2),
    Column("p99_lateness_ms", "p99 lateness", "ms", 1),
    Column("max_lateness_ms", "max lateness", "ms", 1),
    *(
        Column(f"{stat}_{metric}_ms", f"{_STAT_LABELS[stat]} {metric.upper()}", "ms", 1)
        for metric in LATENCY_METRICS
        for stat in LATENCY_STATS
    ),
)

# which delivery of the sweep stored the level: a column only on the page of a resumed run
ATTEMPT_COLUMN = Column("attempt", "attempt", "")

# the mean GPU utilization while the level ran, from the run's GPU samples: a page-only column
GPU_UTIL_COLUMN = Column("gpu_util", "GPU util", "%")

# What a cost or energy cell reads where the figure is absent; the reason is said by the table.
ABSENT = "n/a"


def cost_columns(currency):
    """The per-level cost and energy columns (moeops.runs.costs), page and CSV only: not key
    columns. currency: the host's ISO 4217 code, "" when it has no price."""
    per_million = f"{currency} per 1M output tokens" if currency else "per 1M output tokens"
    return (
        Column("cost_per_million_output_tokens", "cost", per_million, 2),
        Column("energy_per_output_token", "energy per output token", "J", 3),
    )


COST_KEYS = {"cost_per_million_output_tokens": "cost", "energy_per_output_token": "energy"}


# The columns a person reads a level by, in this order, first in the run page's table; the rest
# of LEVEL_COLUMNS follow behind its "All columns" switch (the CSV keeps LEVEL_COLUMNS' order).
KEY_COLUMNS = (
    "concurrency",
    "request_rate",
    "attempt",
    "completed",
    "failed",
    "output_throughput",
    "output_throughput_per_gpu",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "p99_e2el_ms",
    "p99_lateness_ms",
    "gpu_util",
)

# A trace's columns: how far its requests went after their time; no other level has them, and
# the page does not list them as missing there.
TRACE_COLUMNS = ("p99_lateness_ms", "max_lateness_ms")

# What a per-GPU figure reads on a host with no GPUs recorded (the stand-in on a CPU box).
NO_GPUS = "n/a"


def level_value(level, column, num_gpus, gpu_util=None, costs=None):
    """The column's value for one LevelResult; per-GPU throughput divides by num_gpus (None:
    no GPUs recorded, NO_GPUS); GPU util from gpu_util ({concurrency: %}); cost and energy
    from costs ({level key: moeops.runs.costs.LevelCost}; ABSENT where a figure is not had)."""
    if column.key in COST_KEYS:
        cost = (costs or {}).get(level.key)
        figure = getattr(cost, COST_KEYS[column.key]) if cost else None
        return ABSENT if figure is None or figure.value is None else figure.value
    if column.key == "gpu_util":
        return (gpu_util or {}).get(level.concurrency)
    if column.key == "output_throughput_per_gpu":
        if num_gpus is None:
            return NO_GPUS if level.output_throughput is not None else None
        return level.throughput_per_gpu(num_gpus)
    if column.key == "interactivity":
        return level.interactivity
    return getattr(level, column.key)


def key_columns_first(columns):
    """columns reordered for the page: KEY_COLUMNS in their order, then the rest as given."""
    keys = [c for c in columns if c.key in KEY_COLUMNS]
    return (
        *sorted(keys, key=lambda c: KEY_COLUMNS.index(c.key)),
        *(c for c in columns if c.key not in KEY_COLUMNS),
    )


def level_rows(levels, num_gpus, columns=LEVEL_COLUMNS, gpu_util=None, costs=None):
    """[(level, [values…])] in column order."""
    return [
        (level, [level_value(level, c, num_gpus, gpu_util, costs) for c in columns])
        for level in levels
    ]


def absent_reasons(costs):
    """[(what, reason)] of the cost and energy figures absent at some level, each reason once
    ("cost", "the host has no price per GPU-hour")."""
    reasons = []
    for cost in costs.values():
        for what, figure in (("cost", cost.cost), ("energy per output token", cost.energy)):
            if figure.value is None and (what, figure.reason) not in reasons:
                reasons.append((what, figure.reason))
    return reasons


def filled_columns(rows, columns=LEVEL_COLUMNS):
    """Indexes of the columns that have a value in at least one row."""
    return [i for i in range(len(columns)) if any(values[i] is not None for _, values in rows)]
