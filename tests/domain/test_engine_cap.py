"""domain.engine: what counts as the running-request cap an engine reports, one rule for the
worker reading the engine's arguments and the web tier reading a run's snapshot."""

import pytest

from domain import engine


@pytest.mark.parametrize("value", [None, 0, -4, True, "64", 64.0])
def test_only_a_positive_integer_is_a_cap(value):
    assert engine.reported_running_cap({"max_running_requests": value}) is None
    identity = engine.identity("vllm", args={"scheduler_config.max_num_seqs": value})
    assert identity["max_running_requests"] is None


def test_a_reported_cap_is_read_as_the_engine_gave_it():
    vllm = engine.identity(
        "vllm", args={"scheduler_config.max_num_seqs": 16}, args_source="/server_info"
    )

    assert vllm["max_running_requests_source"] == "/server_info scheduler_config.max_num_seqs"
    assert engine.reported_running_cap(vllm) == 16
    assert engine.reported_running_cap({}) is None
