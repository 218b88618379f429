"""Capacity searches of the web tier: the parameters a search is started with (its SLO profile's
limits written into them, so that the worker judges levels as the run records), and the answer
stored on the run from its levels (domain.capacity does the search and the judging)."""

from django.core.exceptions import ValidationError
from django.db.models import Q

from domain.capacity import (
    DEFAULT_ROUNDS,
    at_capacity,
    capacity_answer,
    limits_of,
    probe_of,
    search_of,
)
from domain.intervals import INTERVAL_KEYS
from moeops.fleet.models import SLOProfile
from moeops.runs.models import SweepRun
from moeops.runs.parameters import MAX_CONCURRENCY

# The per-request limits of the load generator's goodput, from the profile's limits of the
# same metric (ITL has none there).
GOODPUT_LIMITS = {"ttft": "slo_ttft_ms", "tpot": "slo_tpot_ms", "e2el": "slo_e2el_ms"}


def is_capacity(parameters):
    """Whether a run's parameters are a capacity search's."""
    return (parameters or {}).get("kind") == "capacity"


def slo_profile_of(*, deployment, ref):
    """The SLOProfile named by ref (id or name), else the deployment's default; raises
    ValidationError naming parameters.slo_profile when there is none."""
    if ref is None:
        if deployment.default_slo_profile_id is None:
            raise ValidationError(
                {
                    "parameters.slo_profile": "a capacity search needs an SLO profile with at "
                    f"least one limit; none is given and deployment {deployment.name!r} names "
                    "no default profile"
                }
            )
        return deployment.default_slo_profile
    condition = Q(name=str(ref))
    if str(ref).isascii() and str(ref).isdigit():
        condition |= Q(pk=int(ref))
    profile = SLOProfile.objects.filter(condition).first()
    if profile is None:
        raise ValidationError({"parameters.slo_profile": f"no SLO profile {ref!r}"})
    return profile


def search_parameters(*, deployment, load):
    """The load of a capacity search with its profile's limits (`slo`), rounds (default 3),
    mode (default concurrency) and the goodput limits filled in."""
    profile = slo_profile_of(deployment=deployment, ref=load.get("slo_profile"))
    limits = profile.limits()
    parameters = {
        **load,
        "slo_profile": str(profile.pk),
        "slo": {
            "profile": profile.name,
            "limits": {m: [p, ms] for m, (p, ms) in limits.items() if ms is not None},
            "max_failed_percent": profile.max_failed_percent,
        },
        "mode": load.get("mode") or "concurrency",
        "rounds": load.get("rounds") or DEFAULT_ROUNDS,
    }
    if parameters["mode"] == "concurrency" and parameters.get("end") is None:
        # no end asked: the search grows no further than a worker can hold streams open
        parameters["end"] = MAX_CONCURRENCY
    for metric, key in GOODPUT_LIMITS.items():
        _, limit_ms = limits[metric]
        if limit_ms is not None and parameters.get(key) is None:
            parameters[key] = limit_ms
    return parameters


def level_load(mode, level):
    """The load a level of a search ran at: its concurrency, or its request rate (req/s)."""
    return level.concurrency if mode == "concurrency" else level.request_rate


LEVEL_FIELDS = (
    "concurrency",
    "request_rate",
    "completed",
    "failed",
    "output_throughput",
    "request_goodput",
    "request_throughput",
    "mean_e2el_ms",
    "median_tpot_ms",
    "intervals",
)


def level_figures(level):
    """A LevelResult as the dict domain.capacity reads: its fields and its intervals."""
    figures = {key: getattr(level, key) for key in (*LEVEL_FIELDS, *INTERVAL_KEYS)}
    figures["intervals"] = dict(level.intervals or {})
    return figures


def run_answer(run, levels):
    """The answer of a capacity search run from its stored levels (domain.capacity's, plus
    `at_capacity`: what the deployment does at the capacity point), or None for another run.
    Levels stopped part-way are left out: they did not run their rounds."""
    if not is_capacity(run.parameters):
        return None
    search = search_of(run.parameters)
    limits, max_failed = limits_of(run.parameters)
    ran = sorted(
        (lv for lv in levels if not lv.is_partial and level_load(search.mode, lv) is not None),
        key=lambda lv: (lv.started_at or 0.0, lv.pk or 0),
    )
    probes = [
        probe_of(limits, max_failed, level_load(search.mode, lv), level_figures(lv)) for lv in ran
    ]
    answer = capacity_answer(search, probes, stopped=run.status != "succeeded")
    answer["profile"] = (run.parameters.get("slo") or {}).get("profile", "")
    answer["requests"] = sum((lv.completed or 0) + (lv.failed or 0) for lv in levels)
    point = next((lv for lv in ran if level_load(search.mode, lv) == answer["load"]), None)
    if point is not None:
        util = run.level_gpu_util([point]).get(point.key)
        power = run.level_power([point]).get(point.key)
        answer["at_capacity"] = at_capacity(
            answer["level"],
            num_gpus=run.measured_gpu_count(),
            running_cap=run.reported_running_cap() or run.recorded_running_cap(),
            gpu_util=util,
            power_w=power,
        )
    else:
        answer["at_capacity"] = None
    return answer


def answered_runs(deployment_ids):
    """The capacity searches of these deployments that have an answer, newest first (one
    query; each with its deployment id, parameters and answer)."""
    return (
        SweepRun.objects.filter(deployment_id__in=deployment_ids, capacity__isnull=False)
        .exclude(capacity__load=None)
        .only("pk", "uuid", "label", "deployment_id", "parameters", "capacity", "created")
        .order_by("-created", "-id")
    )


def is_answered(run):
    """answered_runs' rule for a run read already: a capacity search with an answer."""
    return run.capacity is not None and run.capacity.get("load") is not None


def at_default_profile(run, deployment):
    """Whether the run searched against the deployment's default SLO profile (any profile
    where the deployment names none)."""
    if deployment.default_slo_profile_id is None:
        return True
    return str((run.parameters or {}).get("slo_profile")) == str(deployment.default_slo_profile_id)


def latest_capacities(deployments):
    """{deployment id: its newest answered capacity search at its default SLO profile}."""
    by_id = {d.pk: d for d in deployments}
    latest = {}
    for run in answered_runs(list(by_id)):
        if run.deployment_id not in latest and at_default_profile(run, by_id[run.deployment_id]):
            latest[run.deployment_id] = run
    return latest
