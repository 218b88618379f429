"""Findings from the engine's own counters: a token count off the client's by more than 2 %,
and a prefix cache near zero on a shared-prefix workload."""

from moeops.insights.rules import engine as engine_rules
from moeops.insights.rules.run_data import Level, RunData

# a run's `workload` parameter as run_start stores it (Workload.run_parameter)
SHARED_PREFIX = {
    "id": 3,
    "name": "system prompts",
    "version": 1,
    "kind": "shared_prefix",
    "sha256": None,
    "spec": {"kind": "shared_prefix", "groups": 4, "prefix_len": 1024, "question_len": 128},
}


def _level(concurrency, **engine):
    return Level(concurrency=concurrency, output_throughput=100.0, engine=engine)


def test_a_generation_count_off_by_more_than_2_percent_is_a_finding():
    data = RunData(
        engine="vllm",
        levels=[
            _level(4, engine="vllm", generation_tokens_gap=0.01, prompt_tokens_gap=0.0),
            _level(8, engine="vllm", generation_tokens_gap=0.042, prompt_tokens_gap=0.0),
        ],
    )

    [finding] = engine_rules.engine_token_counts(data)

    assert (finding.kind, finding.key) == ("engine_tokens", "generation")
    assert finding.title == (
        "vLLM counted 4.2% more generation tokens than the client at concurrency 8"
    )
    assert finding.evidence["levels"] == ["concurrency 8"]
    assert finding.evidence["gaps"] == [0.042]


def test_counts_within_2_percent_or_unread_are_no_finding():
    data = RunData(
        levels=[
            _level(4, engine="vllm", prompt_tokens_gap=-0.019, generation_tokens_gap=0.02),
            _level(8),
        ]
    )

    assert engine_rules.engine_token_counts(data) == []


def test_a_cold_prefix_cache_on_a_shared_prefix_workload_is_a_finding():
    data = RunData(
        engine="vllm",
        parameters={"workload": SHARED_PREFIX},
        levels=[
            _level(4, engine="vllm", prefix_cache_hit_rate=0.01),
            _level(8, engine="vllm", prefix_cache_hit_rate=0.8),
        ],
    )

    [finding] = engine_rules.cold_prefix_cache(data)

    assert (finding.kind, finding.key) == ("prefix_cache", "cold")
    assert finding.title == (
        "vLLM's prefix cache hit 1.0% of a shared-prefix workload at concurrency 4"
    )
    assert finding.plan == [
        "Turn on --enable-prefix-caching, or give the KV cache room for the shared prefixes"
    ]


def test_a_cold_prefix_cache_on_random_prompts_is_what_they_should_get():
    levels = [_level(4, engine="vllm", prefix_cache_hit_rate=0.0)]

    assert engine_rules.cold_prefix_cache(RunData(levels=levels)) == []
    assert (
        engine_rules.cold_prefix_cache(
            RunData(parameters={"workload": {**SHARED_PREFIX, "kind": "random"}}, levels=levels)
        )
        == []
    )


def test_a_rate_level_is_named_by_its_rate_and_cap():
    level = Level(
        concurrency=16,
        request_rate=8.0,
        output_throughput=1.0,
        engine={"engine": "sglang", "prefix_cache_hit_rate": 0.0},
    )
    data = RunData(parameters={"workload": SHARED_PREFIX}, levels=[level])

    [finding] = engine_rules.cold_prefix_cache(data)

    assert finding.title.endswith("at 8 req/s (concurrency 16)")
    assert "radix cache" in finding.plan[0]


def test_a_prefix_shorter_than_the_engines_kv_block_is_named_as_the_cause():
    short = {**SHARED_PREFIX, "spec": {**SHARED_PREFIX["spec"], "prefix_len": 64}}
    levels = [_level(4, engine="vllm", prefix_cache_hit_rate=0.0)]
    observed = {"engine": "vllm", "args": {"cache_config.block_size": 128}}

    [finding] = engine_rules.cold_prefix_cache(
        RunData(engine="vllm", parameters={"workload": short}, levels=levels, observed=observed)
    )

    assert finding.title == (
        "vLLM's prefix cache cannot reuse this workload's 64-token prefixes: it reuses whole "
        "blocks of 128 tokens"
    )
    assert "not prefix caching off or evicting" in finding.text
    assert finding.plan == ["Measure prefix reuse with shared prefixes of at least 128 tokens"]
    # a block the prefix fills, or none reported: caching off or evicting, as before
    for args in ({"cache_config.block_size": 16}, {}):
        data = RunData(
            engine="vllm",
            parameters={"workload": short},
            levels=levels,
            observed={"engine": "vllm", "args": args},
        )
        [finding] = engine_rules.cold_prefix_cache(data)
        assert finding.plan[0].startswith("Turn on --enable-prefix-caching")
