"""The capacity form's estimated duration, before the search starts: the levels the search would
run were the engine to keep the pace of its newest sweep (moeops.runs.estimate.capacity_plan),
how long they take and how many requests they send."""

from django.core.exceptions import ValidationError

from domain import capacity
from moeops.front.templatetags.moeops_format import duration
from moeops.runs import estimate
from moeops.runs.capacity import search_parameters


def capacity_estimate(form):
    """ "Estimated duration: ≈ …" of the capacity search as the form stands (bound or not), or
    the sentence saying why there is none."""
    deployment = form.deployment
    pace, why = estimate.deployment_pace(deployment)
    if pace is None:
        return f"No estimated duration: {why}."
    if form.is_bound:
        if not form.is_valid():
            return "No estimated duration until the search's fields are valid."
        load = form.parameters()
    else:
        load = {name: form[name].initial for name in form.fields}
        load = {"kind": "capacity", **{k: v for k, v in load.items() if v not in (None, "")}}
        if load.get("slo_profile") is None:
            load.pop("slo_profile", None)
        else:
            load["slo_profile"] = str(load["slo_profile"])
    if load.get("mode") == "request_rate":
        return (
            "No estimated duration for a request-rate search: how long each level lasts "
            "depends on the rates the search tries."
        )
    try:
        parameters = search_parameters(deployment=deployment, load=load)
    except ValidationError:
        return "No estimated duration: the search needs an SLO profile."
    limits, max_failed = capacity.limits_of(parameters)
    plan = estimate.capacity_plan(
        pace,
        search=capacity.search_of(parameters),
        limits=limits,
        max_failed_percent=max_failed,
        output_len=parameters.get("output_len") or 256,
        rounds=parameters["rounds"],
    )
    cap = f", at most {pace.cap} requests at once" if pace.cap else ""
    return (
        f"Estimated duration: ≈ {duration(plan.seconds)}, {len(plan.loads)} levels from "
        f"{min(plan.loads)} to {max(plan.loads)} concurrent, {plan.requests:,} requests (from "
        f"{pace.basis}{cap}; "
        "more where a level's rounds straddle a limit)."
    )
