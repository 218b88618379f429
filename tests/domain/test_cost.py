"""domain.cost: cost per million output tokens and energy per output token, or why not."""

import pytest

from domain.cost import cost_per_million_output_tokens, energy_per_output_token


def test_cost_is_price_times_gpus_over_tokens_per_second_per_hour():
    # 8 GPUs at 2.50 USD/h = 20 USD/h; 2,000 tok/s = 7.2 M tok/h → 20 / 7.2 = 2.777… per 1M
    figure = cost_per_million_output_tokens(2.5, "USD", 8, 2000.0)
    assert figure.value == pytest.approx(20 / 7.2, rel=1e-12)
    assert figure.unit == "USD per 1M output tokens"
    assert figure.reason == ""


@pytest.mark.parametrize(
    ("price", "gpus", "tok_s", "reason"),
    [
        (None, 8, 2000.0, "the host has no price per GPU-hour"),
        (2.5, None, 2000.0, "the deployment's GPUs are not recorded"),
        (2.5, 8, None, "the level has no output throughput"),
        (2.5, 8, 0.0, "the level has no output throughput"),
    ],
)
def test_cost_is_absent_with_the_reason(price, gpus, tok_s, reason):
    figure = cost_per_million_output_tokens(price, "USD", gpus, tok_s)
    assert figure.value is None and figure.reason == reason


def test_energy_is_total_power_over_tokens_per_second():
    # 8 GPUs at 450 W = 3,600 W over 2,000 tok/s = 1.8 J per token
    figure = energy_per_output_token(3600.0, 2000.0)
    assert figure.value == 1.8 and figure.unit == "J"


def test_energy_is_absent_with_the_reason():
    assert energy_per_output_token(None, 2000.0).reason == "no GPU power samples over the level"
    assert energy_per_output_token(3600.0, 0.0).reason == "the level has no output throughput"
