import pytest

from tests import page_base as pb

pytestmark = pytest.mark.django_db
QUICK = {
    "levels": "8,16,32,64,128",
    "input_len": 128,
    "output_len": 128,
    "prompts_per_level": 128,
    "warmup": 8,
}


@pytest.fixture
def standin(client):
    """A deployment whose last health check found the stand-in engine, cap 64."""
    pb.sign_in(client)
    return pb.standin_deployment()


def _estimate(client, deployment, **load):
    return client.get(f"/deployments/{deployment.pk}/sweep/estimate/", load).json()["text"]


def test_the_quick_preset_takes_about_a_minute_on_the_standin(client, standin):
    # 8 to 128 at most 64 at once: 16+8+4+2+2 waves and 5 warm-up waves of 128 steps at
    # 8 ms + 0.25 ms per running request
    assert _estimate(client, standin, **QUICK) == (
        "Estimated duration: ≈ 1 min 04 s (from the stand-in engine's step time, at most 64 "
        "requests at once)."
    )


def test_the_full_preset_takes_most_of_an_hour_on_the_standin(client, standin):
    text = _estimate(
        client,
        standin,
        levels="32,64,128,256,512,1024",
        input_len=1024,
        output_len=1024,
        prompts_per_level=1024,
        warmup=8,
    )
    assert text.startswith("Estimated duration: ≈ 43 min")


def test_the_estimate_follows_the_newest_measured_run(client, standin):
    pb.run(
        standin,
        "measured",
        levels=[{"concurrency": 64, "output_throughput": 1.0, "median_tpot_ms": 100.0}],
    )
    # 2 waves of 64 at 100 ms a token, 10 tokens each
    text = _estimate(client, standin, levels="64", prompts_per_level=128, output_len=10, warmup=0)
    assert text == (
        "Estimated duration: ≈ 2 s (from the TPOT of measured, at most 64 requests at once)."
    )


def test_an_invalid_load_says_what_is_missing(client, standin):
    assert _estimate(client, standin, levels="eight") == (
        "No estimated duration until levels, prompts and lengths are valid."
    )


@pytest.mark.parametrize(
    "load",
    [
        {"levels": "99999999999"},
        {"prompts_per_level": 100000000000},
        {"input_len": 2**24, "output_len": 2**24, "prompts_per_level": 2**20},
    ],
)
def test_a_load_no_worker_could_finish_gets_no_estimate(client, standin, load):
    assert _estimate(client, standin, **{**QUICK, **load}) == (
        "No estimated duration until levels, prompts and lengths are valid."
    )
