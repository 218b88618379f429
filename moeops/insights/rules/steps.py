"""Diagnosis rules of a profiled level: where a decode step's time goes (the run's profiles,
domain.step_breakdown) says what bounds the engine at that load.

Each rule reads `RunData.profiles` (the newest captured profile of each profiled level) and
proposes a finding per level where the breakdown shows it, with the class shares, top kernels
and step counts it rests on; a level without a captured breakdown, or without decode steps,
proposes nothing. The profiled pass is never a level round: its throughput feeds no verdict.

analysis.analyze() applies these after its own RULES.
"""

from domain.step_breakdown import CLASSES, top_names, unfused_all_reduce
from moeops.insights.rules.evidence import _key
from moeops.insights.rules.run_data import Proposal, RunData

# Host-bound: the GPUs idle at least this share of a decode step between kernels. A decode step
# of 20,000 µs whose kernels leave 4,400 µs of gaps is 22 % idle: the CPU side (scheduling,
# input preparation) cannot keep the GPUs fed.
HOST_BOUND_IDLE = 0.20
# Communication-bound: collectives take at least this share of a decode step. 6,200 µs of
# all-reduce in a 20,000 µs step is 31 %: the ranks spend a third of the step exchanging.
COMMUNICATION_BOUND = 0.25
# MoE-bound: the expert kernels take at least this share of a decode step. 9,000 µs of
# fused-MoE in 20,000 µs is 45 %: a kernel tune can win at most that share.
MOE_BOUND = 0.40
# Attention-bound: attention kernels take at least this share of a decode step. 8,600 µs of
# paged attention in 20,000 µs is 43 %: at long contexts the KV reads dominate the step.
ATTENTION_BOUND = 0.40

KIND = "decode"


def _decode_profiles(data):
    """(profile, breakdown) of each captured profile whose ranks saw decode steps."""
    for profile in data.profiles:
        breakdown = profile.breakdown
        if profile.status == "captured" and breakdown is not None and KIND in breakdown.kinds():
            yield profile, breakdown


def _level_words(profile):
    rate = f" and {profile.request_rate:g} req/s" if profile.request_rate is not None else ""
    return f"concurrency {profile.concurrency}{rate}"


def _percent(share):
    """0.223 → "22 %"."""
    return f"{share * 100:.0f} %"


def _evidence(profile, breakdown, threshold, **extra):
    """What every step finding rests on: the level, the decode step's class shares (mean over
    the ranks), the steps counted per kind, the top names of each class and a bar chart."""
    shares = {c: round(breakdown.mean_share(KIND, c), 4) for c in CLASSES}
    percents = [round(shares[c] * 100, 1) for c in CLASSES]
    steps = {}
    for rank in breakdown.ranks:
        for kind in rank.kinds:
            steps[kind.kind] = steps.get(kind.kind, 0) + kind.steps
    return {
        "concurrency": profile.concurrency,
        "request_rate": profile.request_rate,
        "threshold_fraction": threshold,
        "decode_share_fraction": shares,
        "steps_counted": steps,
        "ranks": len(breakdown.ranks),
        "device": breakdown.ranks[0].device,
        "top": {c: names[:3] for c in CLASSES if (names := top_names(breakdown, c, KIND))},
        **extra,
        "chart": {
            "type": "bar",
            "x": list(CLASSES),
            "x_label": "class",
            "y_label": "share of a decode step (%)",
            "series": [{"name": f"c={profile.concurrency}", "y": percents}],
        },
    }


def host_bound(data: RunData) -> list[Proposal]:
    """The GPUs idle between kernels for HOST_BOUND_IDLE or more of a decode step. Only from GPU
    traces: a CPU trace's gaps are not the GPUs'."""
    proposals = []
    for profile, breakdown in _decode_profiles(data):
        idle = breakdown.mean_share(KIND, "idle")
        if idle < HOST_BOUND_IDLE or any(r.device != "gpu" for r in breakdown.ranks):
            continue
        where, pct = _level_words(profile), _percent(idle)
        proposals.append(
            Proposal(
                kind="other",
                key=_key("step-host-bound", profile.concurrency, profile.request_rate),
                severity="warning",
                title=f"Host-bound at {where}: the GPUs idle {pct} of a decode step",
                text=(
                    f"The GPUs are idle {pct} of each decode step between kernels at "
                    f"{where}: the engine's CPU side limits it (scheduling, preparing the next "
                    "step's inputs), not the GPUs."
                ),
                evidence=_evidence(profile, breakdown, HOST_BOUND_IDLE, idle_fraction=idle),
                plan=[f"Find what holds the engine's CPU side between decode steps at {where}"],
            )
        )
    return proposals


def communication_bound(data: RunData) -> list[Proposal]:
    """Collectives take COMMUNICATION_BOUND or more of a decode step; where the top names show
    an all-reduce and a separate RMSNorm kernel, the fused all-reduce + norm is not running."""
    proposals = []
    for profile, breakdown in _decode_profiles(data):
        share = breakdown.mean_share(KIND, "communication")
        if share < COMMUNICATION_BOUND:
            continue
        where, pct = _level_words(profile), _percent(share)
        text = f"Communication between the ranks takes {pct} of each decode step at {where}."
        plan = [f"Cut the all-reduce time of a decode step at {where}"]
        unfused = unfused_all_reduce(breakdown, KIND)
        if unfused is not None:
            text += (
                f" The step's top kernels hold an all-reduce ({unfused[0]}) and a separate "
                f"RMSNorm kernel ({unfused[1]}), and no fused one: the fused all-reduce + norm "
                "is not running."
            )
            plan = [f"Run the fused all-reduce + RMSNorm (vLLM's fuse_allreduce_rms) at {where}"]
        proposals.append(
            Proposal(
                kind="other",
                key=_key("step-communication", profile.concurrency, profile.request_rate),
                severity="warning",
                title=f"Communication takes {pct} of a decode step at {where}",
                text=text,
                evidence=_evidence(
                    profile,
                    breakdown,
                    COMMUNICATION_BOUND,
                    communication_fraction=share,
                    unfused_all_reduce=list(unfused) if unfused else None,
                ),
                plan=plan,
            )
        )
    return proposals


def moe_bound(data: RunData) -> list[Proposal]:
    """The expert kernels take MOE_BOUND or more of a decode step: a tune of the fused-MoE kernel
    (the deployment page's Tune MoE kernel) can win at most that share."""
    proposals = []
    for profile, breakdown in _decode_profiles(data):
        share = breakdown.mean_share(KIND, "moe")
        if share < MOE_BOUND:
            continue
        where, pct = _level_words(profile), _percent(share)
        proposals.append(
            Proposal(
                kind="other",
                key=_key("step-moe", profile.concurrency, profile.request_rate),
                severity="info",
                title=f"The MoE kernels take {pct} of a decode step at {where}",
                text=(
                    f"The MoE kernels take {pct} of each decode step at {where}: a tune of "
                    "the fused-MoE kernel (the deployment page's Tune MoE kernel) can win at "
                    f"most that share of the step."
                ),
                evidence=_evidence(
                    profile, breakdown, MOE_BOUND, moe_fraction=share, most_to_win_fraction=share
                ),
                plan=[f"Tune the fused-MoE kernel (at most {pct} of a decode step to win)"],
            )
        )
    return proposals


def attention_bound(data: RunData) -> list[Proposal]:
    """Attention takes ATTENTION_BOUND or more of a decode step; the contexts (input + output
    tokens of the sweep's requests) go in the evidence."""
    proposals = []
    parameters = data.parameters or {}
    lengths = [parameters.get("input_len"), parameters.get("output_len")]
    context = sum(lengths) if all(isinstance(n, int) for n in lengths) else None
    for profile, breakdown in _decode_profiles(data):
        share = breakdown.mean_share(KIND, "attention")
        if share < ATTENTION_BOUND:
            continue
        where, pct = _level_words(profile), _percent(share)
        contexts = f" with contexts of up to {context:,} tokens" if context else ""
        proposals.append(
            Proposal(
                kind="other",
                key=_key("step-attention", profile.concurrency, profile.request_rate),
                severity="info",
                title=f"Attention takes {pct} of a decode step at {where}",
                text=(
                    f"Attention takes {pct} of each decode step at {where}{contexts}: the "
                    "step reads each request's KV cache, and longer contexts read more."
                ),
                evidence=_evidence(
                    profile,
                    breakdown,
                    ATTENTION_BOUND,
                    attention_fraction=share,
                    context_tokens=context,
                ),
                plan=[f"Measure attention backends at {where}{contexts}"],
            )
        )
    return proposals


RULES = (host_bound, communication_bound, moe_bound, attention_bound)
