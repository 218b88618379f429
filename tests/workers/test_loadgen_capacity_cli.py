"""`python -m workers.loadgen --capacity`: its arguments refused in words, and a search against
the in-process stand-in printing each level, the bracket as it narrows and the answer."""

import pytest

from domain.capacity import search_of
from tests.fakes import standin_running
from workers.capacity import level_at
from workers.loadgen import ClientConfig, SweepConfig
from workers.loadgen.cli import main

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ([], "--slo: A profile needs at least one limit"),
        (["--slo", "tpot:p42:50"], "--slo: 'tpot:p42:50': the percentile must be one of"),
        (["--slo", "tpot:p99:50", "--start", "8", "--end", "4"], "--end: The end (4)"),
        (["--slo", "tpot:p99:50", "--start", "2.5"], "--start: The start must be a whole"),
        (["--slo", "tpot:p99:50", "--rounds", "0"], "--rounds: from 1 to 10, got 0"),
    ],
)
def test_bad_search_arguments_are_refused_naming_the_argument(argv, words, capsys):
    base = ["--base-url", "http://127.0.0.1:9", "--model", "m", "--capacity"]
    with pytest.raises(SystemExit) as exit_:
        main([*base, *argv])
    assert exit_.value.code == 2
    assert words in capsys.readouterr().err


def test_a_plain_sweep_still_needs_its_concurrencies(capsys):
    with pytest.raises(SystemExit):
        main(["--base-url", "http://127.0.0.1:9", "--model", "m"])
    assert "--concurrency is required (or --capacity)" in capsys.readouterr().err


def _search_on_standin(*args):
    """The CLI's capacity search of 8-token requests, with `args` added, against a stand-in
    engine of 16 running requests: its exit code."""
    with standin_running(model="m", max_running_requests=16) as url:
        return main(
            [
                "--base-url", url, "--model", "m", "--vocab-size", "32000",
                "--input-len", "8", "--output-len", "8", "--capacity", *args,
            ]
        )  # fmt: skip


def test_a_search_prints_the_bracket_as_it_narrows_and_the_answer(capsys, tmp_path):
    # every level meets a limit of 10 s: the search grows 2 → 4 and stops at its end
    code = _search_on_standin(
        "--slo", "tpot:p99:10000", "--start", "2", "--end", "4",
        "--rounds", "2", "--output", str(tmp_path / "search.json"),
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "  2 concurrent meets (TPOT p99: " in out and "; bracket 2–?" in out
    assert "  4 concurrent meets (TPOT p99: " in out and "; bracket 4–?" in out
    assert "Capacity: 4 concurrent (every 95 % upper bound within the SLO)" in out
    assert "TPOT p99 binds: " in out and " at 4 concurrent, limit 10000 ms" in out
    assert "median of 2 rounds" in out
    assert (tmp_path / "search.json").exists()


def test_a_rate_levels_arrivals_are_the_runs_and_a_concurrency_levels_none():
    config = SweepConfig(
        client=ClientConfig("http://x", "m", vocab_size=1000),
        concurrencies=(),
        input_len=8,
        output_len=8,
        burstiness=0.5,
        ramp_up_s=2.0,
    )

    rate = level_at(config, search_of({"mode": "request_rate", "start": 4.0}), 4.0, 0)
    streams = level_at(config, search_of({"mode": "concurrency", "start": 4}), 4, 0)

    assert (rate.request_rate, rate.burstiness, rate.ramp_up_s) == (4.0, 0.5, 2.0)
    assert (streams.request_rate, streams.burstiness, streams.ramp_up_s) == (None, 1.0, 0.0)


def test_a_level_straddling_its_limit_runs_more_rounds_and_says_so(capsys, monkeypatch):
    import workers.loadgen.cli as cli

    real, calls = cli.run_level, []

    async def second_round_slow(client, level):
        result = await real(client, level)
        calls.append(level.concurrency)
        # the second round of the level is a busy machine's: its TPOT p99 reads 150 ms
        return {**result, "p99_tpot_ms": 150.0} if len(calls) == 2 else result

    monkeypatch.setattr(cli, "run_level", second_round_slow)
    code = _search_on_standin(
        "--prompts-per-level", "8",
        "--slo", "tpot:p99:100", "--start", "2", "--end", "2", "--rounds", "3",
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "  2 concurrent straddles a limit: round 4" in out
    assert f"median of {len(calls)} rounds" in out and 3 < len(calls) < 10
    assert "  2 concurrent meets (TPOT p99: " in out
    assert "Capacity: 2 concurrent" in out


def test_a_search_without_start_begins_at_one(capsys, tmp_path):
    code = _search_on_standin(
        "--slo", "tpot:p99:10000", "--end", "2", "--rounds", "1",
        "--output", str(tmp_path / "search.json"),
    )  # fmt: skip
    assert code == 0
    assert "  1 concurrent meets (TPOT p99: " in capsys.readouterr().out
