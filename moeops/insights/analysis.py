"""Diagnosis rules: each reads one finished run's gathered data and proposes findings.

The rules are plain functions of a `RunData` (built by `services.run_analyze` from the database)
and return `Proposal`s; they touch no database, so each is tested on data built by hand. They live
in `moeops.insights.rules`, one module per family; this module applies them in order (`RULES`).

Every proposal's evidence holds the numbers it rests on and, under "chart", one figure the UI
can plot as is:

    {"type": "line" | "bar", "x": [...], "x_label": "...", "y_label": "...",
     "series": [{"name": "...", "y": [...]}, ...]}
    {"type": "heatmap", "x": [...], "y": [...], "z": [[...], ...], "x_label": ..., "y_label": ...}

Units: throughput in tok/s, utilization in %, power in W, fractions as 0–1, times in epoch s.

Where the data a rule needs is missing, the rule proposes nothing (or, for GPU telemetry, says
"no GPU evidence"); it never reads absence as a symptom.
"""

from moeops.insights.rules import paths as path_rules
from moeops.insights.rules import steps as step_rules
from moeops.insights.rules.engine import (
    cold_prefix_cache,
    engine_mismatch,
    engine_token_counts,
    incompatibilities,
)
from moeops.insights.rules.gpus import idle_gpus, topology
from moeops.insights.rules.kernels import kernel_provenance, no_tuned_kernel
from moeops.insights.rules.load import (
    capacity_at_cap,
    client_bound,
    failed_requests,
    plateau,
    queueing,
)
from moeops.insights.rules.regression import regression
from moeops.insights.rules.run_data import Proposal, RunData


def analyze(data: RunData) -> list[Proposal]:
    """Every rule's proposals for one run, in rule order: RULES, then the step breakdown's
    (step_rules.RULES) and the engine paths' (path_rules.RULES)."""
    rules = (*RULES, *step_rules.RULES, *path_rules.RULES)
    return [proposal for rule in rules for proposal in rule(data)]


RULES = (
    failed_requests,
    engine_mismatch,
    plateau,
    idle_gpus,
    queueing,
    no_tuned_kernel,
    kernel_provenance,
    topology,
    incompatibilities,
    regression,
    client_bound,
    capacity_at_cap,
    engine_token_counts,
    cold_prefix_cache,
)
