"""What a level did to the engine, from the engine's own /metrics counters read at the level's
start and end (workers.engine_metrics.counter_deltas): prefix-cache hit rate, preemptions,
speculative-decoding acceptance, and the engine's prompt and generation tokens against the
client's. The worker stores the counters with each round of a level; the pages, the API and
the analysis read the figures from here. docs/metrics.md, "Engine counters", defines each."""

# The client's and the engine's token counts disagree when they differ by more than this
# fraction of the client's: 2 %. Example: the client counted 6,144 generated tokens, vLLM
# 6,400 (4.2 % more): a finding; 6,200 (0.9 %) is within it.
TOKEN_GAP = 0.02

# The counters a level's rounds add up (the rest are ratios, read as the last round gives them).
SUMMED = (
    "prompt_tokens",
    "generation_tokens",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "cached_tokens",
    "preemptions",
    "spec_draft_tokens",
    "spec_accepted_tokens",
)


def summed(rounds):
    """One level's counters from its rounds' (each a counter_deltas dict, or None where a
    round has none): counters summed over the rounds that have them all, ratios as the last
    round read them; {} when no round has counters."""
    present = [r for r in rounds if isinstance(r, dict) and r.get("engine")]
    if not present:
        return {}
    out = {"engine": present[-1]["engine"]}
    for key in SUMMED:
        values = [r.get(key) for r in present]
        if all(_number(v) for v in values):
            out[key] = sum(values)
    for key in ("cache_hit_rate", "spec_accept_length"):
        if _number(present[-1].get(key)):
            out[key] = present[-1][key]
    return out


def _number(value):
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def _ratio(part, whole):
    return part / whole if _number(part) and _number(whole) and whole > 0 else None


def _gap(engine, client):
    """(engine − client) / client, or None without both."""
    if not _number(engine) or not _number(client) or client == 0:
        return None
    return (engine - client) / client


def figures(counters, *, client_input_tokens=None, client_output_tokens=None):
    """The level's engine figures from its counters (summed): {
    "prefix_cache_hit_rate": 0..1 (vLLM: hits / queries, in tokens; SGLang: cached / prompt
        tokens, else its cache_hit_rate gauge),
    "preemptions": count,
    "spec_acceptance_rate": 0..1 (vLLM: accepted / draft tokens),
    "spec_accept_length": tokens per step (SGLang's gauge),
    "engine_prompt_tokens", "engine_generation_tokens": the engine's counts,
    "prompt_tokens_gap", "generation_tokens_gap": (engine − client) / client, where the client's
        counts (warm-up included: the engine counts it too) are given},
    each None where the engine does not export what it needs."""
    counters = counters or {}
    hit_rate = _ratio(counters.get("prefix_cache_hits"), counters.get("prefix_cache_queries"))
    if hit_rate is None:
        hit_rate = _ratio(counters.get("cached_tokens"), counters.get("prompt_tokens"))
    if hit_rate is None and _number(counters.get("cache_hit_rate")):
        hit_rate = counters["cache_hit_rate"]
    return {
        "prefix_cache_hit_rate": hit_rate,
        "preemptions": counters.get("preemptions"),
        "spec_acceptance_rate": _ratio(
            counters.get("spec_accepted_tokens"), counters.get("spec_draft_tokens")
        ),
        "spec_accept_length": counters.get("spec_accept_length"),
        "engine_prompt_tokens": counters.get("prompt_tokens"),
        "engine_generation_tokens": counters.get("generation_tokens"),
        "prompt_tokens_gap": _gap(counters.get("prompt_tokens"), client_input_tokens),
        "generation_tokens_gap": _gap(counters.get("generation_tokens"), client_output_tokens),
    }
