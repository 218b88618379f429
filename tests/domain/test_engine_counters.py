"""A level's engine figures from the counters its rounds read."""

import pytest

from domain import engine_counters


def test_vllms_hit_rate_is_hits_over_queries_in_tokens():
    figures = engine_counters.figures(
        {"engine": "vllm", "prefix_cache_queries": 640.0, "prefix_cache_hits": 384.0}
    )

    assert figures["prefix_cache_hit_rate"] == pytest.approx(0.6)


def test_sglangs_hit_rate_is_cached_over_prompt_tokens_else_its_gauge():
    counted = {"engine": "sglang", "prompt_tokens": 40000, "cached_tokens": 24000}
    gauge_only = {"engine": "sglang", "cache_hit_rate": 0.62, "spec_accept_length": 2.75}

    assert engine_counters.figures(counted)["prefix_cache_hit_rate"] == pytest.approx(0.6)
    assert engine_counters.figures(gauge_only)["prefix_cache_hit_rate"] == 0.62
    assert engine_counters.figures(gauge_only)["spec_accept_length"] == 2.75


def test_spec_acceptance_is_accepted_over_draft_tokens():
    figures = engine_counters.figures({"spec_draft_tokens": 400, "spec_accepted_tokens": 260})

    assert figures["spec_acceptance_rate"] == pytest.approx(0.65)


def test_the_token_gaps_are_relative_to_the_clients_counts():
    figures = engine_counters.figures(
        {"prompt_tokens": 6144, "generation_tokens": 6400},
        client_input_tokens=6144,
        client_output_tokens=6144,
    )

    assert figures["prompt_tokens_gap"] == 0
    assert figures["generation_tokens_gap"] == pytest.approx(256 / 6144)


def test_nothing_is_made_up_from_what_the_engine_does_not_export():
    figures = engine_counters.figures({"engine": "vllm"}, client_input_tokens=10)

    assert set(figures.values()) == {None}


def test_rounds_add_up_their_counters_and_keep_the_last_ratio():
    rounds = [
        {"engine": "sglang", "prompt_tokens": 100.0, "cache_hit_rate": 0.2},
        None,
        {"engine": "sglang", "prompt_tokens": 50.0, "cache_hit_rate": 0.4},
    ]

    assert engine_counters.summed(rounds) == {
        "engine": "sglang",
        "prompt_tokens": 150.0,
        "cache_hit_rate": 0.4,
    }
    assert engine_counters.summed([None, {}]) == {}
