"""Rules of the engine itself: the engine that answered is not the one recorded, launch settings
known not to work (incompatibility rules), the engine's own token counts against the load's, and
a prefix cache that stayed cold."""

from domain.engine import label as engine_label
from domain.engine_counters import TOKEN_GAP
from domain.numbers import is_integer
from domain.workloads import workload_identity
from moeops.insights.rules.evidence import _round
from moeops.insights.rules.run_data import Proposal, RunData

# -- known incompatibilities -----------------------------------------------------------------


def incompatibilities(data: RunData) -> list[Proposal]:
    """Enabled IncompatibilityRules whose every non-blank condition holds for the deployment.

    compute capability: any of its GPUs has it ("12" and "12.0" match); engine: equal, any case;
    launch argument: a deployment field or a launch_args flag (leading dashes and - vs _ ignored)
    whose value, as a string and in any case, equals launch_value, or, with launch_value blank,
    is truthy. A rule with no condition at all matches nothing.
    """
    capabilities = {_capability(gpu.compute_capability) for gpu in data.gpus}
    capabilities.discard("")
    launch = {_flag(k): v for k, v in data.launch.items()}
    proposals = []
    for rule in data.rules:
        if not (rule.compute_capability or rule.engine or rule.launch_argument):
            continue
        matched = {}
        if rule.compute_capability:
            if _capability(rule.compute_capability) not in capabilities:
                continue
            matched["compute_capability"] = rule.compute_capability
        if rule.engine:
            if rule.engine.lower() != (data.engine or "").lower():
                continue
            matched["engine"] = data.engine
        if rule.launch_argument:
            value = launch.get(_flag(rule.launch_argument))
            if value is None or value == "":
                continue
            if rule.launch_value:
                if str(value).lower() != rule.launch_value.strip().lower():
                    continue
            elif not value:
                continue
            matched[rule.launch_argument] = value
        proposals.append(
            Proposal(
                kind="incompatibility",
                key=f"rule-{rule.id}",
                severity=rule.severity,
                title=rule.name,
                text=rule.finding_text,
                evidence={"rule_id": rule.id, "matched": matched, "chart": None},
                scope="deployment",
                plan=[f"Resolve the known incompatibility: {rule.name}"],
                note_id=rule.note_id,
                recipe_bound=bool(rule.launch_argument),
            )
        )
    return proposals


def _capability(value):
    value = (value or "").strip()
    return value if not value or "." in value else f"{value}.0"


def _flag(name):
    return name.strip().lstrip("-").replace("-", "_").lower()


# -- engine not as recorded ------------------------------------------------------------------


def engine_mismatch(data: RunData) -> list[Proposal]:
    """The engine (or its version) that answered is not the one the deployment records."""
    answered = data.observed.get("engine")
    recorded = data.recorded_engine
    out = []
    if answered and recorded in ("vllm", "sglang") and answered not in (recorded, "unknown"):
        label = engine_label(data.observed)
        out.append(
            Proposal(
                kind="engine_mismatch",
                key="engine",
                severity="warning",
                title=f"{label} answered, but the deployment records {engine_label(recorded)}",
                text=(
                    f"When the sweep started, the server at the endpoint said it is {label}; the "
                    f"deployment is recorded as {engine_label(recorded)}. The run measured "
                    f"{label}, and its snapshot says so; the deployment's record is wrong."
                ),
                evidence={"recorded": recorded, "answered": answered, "chart": None},
                plan=[f"Correct the deployment's engine to {engine_label(answered)}"],
            )
        )
    version = data.observed.get("version")
    recorded_version = data.launch.get("engine_version") or ""
    if answered == recorded and version and recorded_version and version != recorded_version:
        out.append(
            Proposal(
                kind="engine_mismatch",
                key="version",
                severity="info",
                title=f"{engine_label(data.observed)} answered; the deployment records "
                f"version {recorded_version}",
                text=(
                    f"The engine reported version {version} when the sweep started; the "
                    f"deployment records {recorded_version}. The run's snapshot keeps {version}."
                ),
                evidence={"recorded": recorded_version, "answered": version, "chart": None},
                plan=[f"Update the deployment's engine version to {version}"],
            )
        )
    return out


# -- engine counters -------------------------------------------------------------------------

# A prefix-cache hit rate at or below 5 % on a shared-prefix workload is "near zero": with G
# groups each sharing a P-token system prompt and a Q-token question, every request after a
# group's first should hit P / (P + Q) of its prompt (P 1024, Q 128: 89 %); 5 % is what a
# cache that keeps nothing between requests shows from the odd coincidental block.
COLD_PREFIX_CACHE = 0.05
# The workload kind whose requests share long prefixes (domain.workloads.KINDS).
SHARED_PREFIX = "shared_prefix"


def _level_name(level):
    if level.request_rate is not None:
        return f"{level.request_rate:g} req/s (concurrency {level.concurrency})"
    return f"concurrency {level.concurrency}"


def engine_token_counts(data: RunData) -> list[Proposal]:
    """Levels where the engine's own prompt or generation token counters disagree with the
    client's counts (from the server's usage, warm-up included) by more than TOKEN_GAP."""
    out = []
    for which, key in (("prompt", "prompt_tokens_gap"), ("generation", "generation_tokens_gap")):
        off = [lv for lv in data.levels if abs(lv.engine.get(key) or 0) > TOKEN_GAP]
        if not off:
            continue
        worst = max(off, key=lambda lv: abs(lv.engine[key]))
        gap = worst.engine[key]
        engine = engine_label(worst.engine.get("engine") or data.engine)
        more = "more" if gap > 0 else "fewer"
        out.append(
            Proposal(
                kind="engine_tokens",
                key=which,
                severity="warning",
                title=f"{engine} counted {abs(gap):.1%} {more} {which} tokens than the client "
                f"at {_level_name(worst)}",
                text=(
                    f"During {len(off)} of {len(data.levels)} levels the engine's own {which} "
                    f"token counter (/metrics) moved by more than {TOKEN_GAP:.0%} off what the "
                    "client counted from the server's usage, warm-up included. Another client "
                    "sending to the engine during the sweep, requests the client gave up on "
                    "(timeouts) that the engine still ran, or a server whose usage miscounts "
                    "would each do this; the run's throughput figures count the client's tokens."
                ),
                evidence={
                    "levels": [_level_name(lv) for lv in off],
                    "gaps": [_round(lv.engine[key]) for lv in off],
                    "threshold": TOKEN_GAP,
                    "chart": None,
                },
                plan=["Sweep again with no other client on the engine"],
            )
        )
    return out


# Where each engine reports how many tokens a KV-cache block holds: its prefix cache reuses whole
# blocks only (vLLM's cache_config.block_size; SGLang's page_size).
KV_BLOCK_ARGS = ("cache_config.block_size", "page_size")


def _kv_block(observed) -> int | None:
    """The tokens of one KV-cache block the engine reported of itself, None where unknown."""
    args = (observed or {}).get("args") or {}
    found = next((args[key] for key in KV_BLOCK_ARGS if key in args), None)
    return found if is_integer(found) and found > 0 else None


def cold_prefix_cache(data: RunData) -> list[Proposal]:
    """A shared-prefix workload (the kind of the run's `workload` parameter,
    Workload.run_parameter) whose levels show a prefix-cache hit rate near zero: prefix caching
    is off, or the cache evicts the prefixes before they are used again; or, where the shared
    prefix is shorter than one of the engine's KV-cache blocks, the cache cannot hit at all."""
    if workload_identity(data.parameters.get("workload"))["kind"] != SHARED_PREFIX:
        return []
    read = [lv for lv in data.levels if lv.engine.get("prefix_cache_hit_rate") is not None]
    cold = [lv for lv in read if lv.engine["prefix_cache_hit_rate"] <= COLD_PREFIX_CACHE]
    if not cold:
        return []
    name = cold[0].engine.get("engine") or data.engine
    engine = engine_label(name)
    prefix = ((data.parameters.get("workload") or {}).get("spec") or {}).get("prefix_len")
    block = _kv_block(data.observed)
    if is_integer(prefix) and block is not None and prefix < block:
        return [_prefix_under_a_block(cold, read, engine, prefix, block)]
    flag = (
        "--enable-prefix-caching"
        if name == "vllm"
        else "the radix cache (no --disable-radix-cache)"
    )
    return [
        Proposal(
            kind="prefix_cache",
            key="cold",
            severity="warning",
            title=f"{engine}'s prefix cache hit {cold[0].engine['prefix_cache_hit_rate']:.1%} "
            f"of a shared-prefix workload at {_level_name(cold[0])}",
            text=(
                f"The workload shares long prefixes between requests, yet at {len(cold)} of "
                f"{len(read)} levels the engine's own counters show a prefix-cache hit rate at "
                f"or below {COLD_PREFIX_CACHE:.0%}: prefix caching is off, or the cache "
                "evicts the shared prefixes before the next request of their group comes "
                "(too little KV cache for the groups in flight). Every request then prefills "
                "its whole prompt, and TTFT and throughput are those of a cache that does "
                "nothing."
            ),
            evidence=_hit_rates(cold) | {"threshold": COLD_PREFIX_CACHE, "chart": None},
            plan=[f"Turn on {flag}, or give the KV cache room for the shared prefixes"],
        )
    ]


def _hit_rates(cold):
    """The evidence of a cold prefix cache: the cold levels and the hit rate the engine counted
    at each (0–1)."""
    return {
        "levels": [_level_name(lv) for lv in cold],
        "hit_rates": [_round(lv.engine["prefix_cache_hit_rate"]) for lv in cold],
    }


def _prefix_under_a_block(cold, read, engine, prefix, block) -> Proposal:
    return Proposal(
        kind="prefix_cache",
        key="cold",
        severity="info",
        title=f"{engine}'s prefix cache cannot reuse this workload's {prefix}-token prefixes: "
        f"it reuses whole blocks of {block} tokens",
        text=(
            f"The workload's shared prefixes are {prefix} tokens, shorter than one block of "
            f"{engine}'s KV cache ({block} tokens, as the engine reports it). A prefix cache "
            "reuses whole blocks only, so no request can reuse its group's prefix: the hit "
            f"rate at or below {COLD_PREFIX_CACHE:.0%} at {len(cold)} of {len(read)} levels is "
            "what this workload can get, not prefix caching off or evicting."
        ),
        evidence=_hit_rates(cold) | {"prefix_len": prefix, "kv_block_tokens": block, "chart": None},
        plan=[f"Measure prefix reuse with shared prefixes of at least {block} tokens"],
    )
