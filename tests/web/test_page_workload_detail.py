"""A workload's page: its prompt, turn and output lengths as histograms (tokens where a run's
worker counted them with the model's tokenizer, characters otherwise, said which), its counts,
SHA-256, versions and the runs that sent it."""

from pathlib import Path

import pytest

from domain.workloads import length_histogram
from moeops.runs.models import LevelResult
from moeops.runs.workloads import workload_store
from tests import page_base as pb

pytestmark = pytest.mark.django_db
MT_BENCH = Path(__file__).parents[1] / "fixtures" / "workloads" / "mt_bench_questions.jsonl"
SHAREGPT = (
    b'{"conversations": [{"from": "human", "value": "abcd"}, {"from": "gpt", "value": "xy"},'
    b' {"from": "human", "value": "abcdefgh"}, {"from": "gpt", "value": "xyz"}]}\n'
    b'{"conversations": [{"from": "human", "value": "ab"}, {"from": "gpt", "value": "x"}]}\n'
)


@pytest.fixture
def member(client):
    return pb.sign_in(client)


def _run_of(workload, deployment, label, **level_raw):
    run = pb.run(
        deployment,
        label=label,
        parameters={"model": "glm-5", "workload": workload.run_parameter()},
        levels=[{"concurrency": 4, "completed": 8, "output_throughput": 10.0}],
    )
    if level_raw:
        LevelResult.objects.filter(run=run).update(raw=level_raw)
    return run


def _bars(fig):
    [trace] = fig["data"]
    return [(low, count) for (low, count) in trace["customdata"] if count]


def test_a_files_lengths_are_characters_until_a_run_counts_its_tokens(client, member):
    workload, _ = workload_store(
        name="chats", spec={"kind": "multi_turn"}, file_name="c.jsonl", data=SHAREGPT
    )
    deployment = pb.deployment()
    _run_of(workload, deployment, "first sweep")

    html = client.get(f"/workloads/{workload.pk}/").content.decode()

    # every question of a multi-turn workload: 4, 8 and 2 characters; answers 2, 3 and 1
    prompt = pb.figure(html, "workload-prompt-data")
    assert prompt["layout"]["title"]["text"] == "Prompt lengths (characters)"
    assert sum(c for _, c in _bars(prompt)) == 3
    assert pb.figure(html, "workload-turns-data")["layout"]["xaxis"]["title"]["text"] == "turns"
    assert "are characters: no run of it has had the model" in html
    assert workload.sha256 in html
    assert "2 conversations, 3 human turns; 3 sent turns with an answer, 0 without" in html
    assert "first sweep" in html

    # a later run's worker had the model's tokenizer: its counts are shown, in tokens
    tokens = {
        "model": "glm-5",
        "prompt": length_histogram([3, 5, 2]),
        "turns": length_histogram([2, 1]),
        "output": length_histogram([1, 2, 1]),
    }
    counted = _run_of(workload, deployment, "counted", workload_tokens=tokens)
    html = client.get(f"/workloads/{workload.pk}/").content.decode()

    assert pb.figure(html, "workload-prompt-data")["layout"]["title"]["text"] == (
        "Prompt lengths (tokens)"
    )
    assert f'as the worker of run <a href="/runs/{counted.uuid}/">' in html
    assert "tokens of the model the engine served (glm-5)" in html


def test_an_mt_bench_file_has_no_answers_and_says_whose_output_length_is_sent(client, member):
    workload, _ = workload_store(
        name="mt", spec={"kind": "multi_turn"}, file_name=MT_BENCH.name, data=MT_BENCH.read_bytes()
    )

    html = client.get(f"/workloads/{workload.pk}/").content.decode()

    assert _bars(pb.figure(html, "workload-turns-data")) == [(2, 8)]
    assert 'id="workload-output"' not in html
    assert "The file has no answers: each request's output is the sweep's" in html
    assert "No run has sent this version yet." in html


def test_a_random_workload_draws_its_specs_lengths_in_tokens(client, member):
    spec = {
        "kind": "random",
        "input": {"distribution": "uniform", "low": 100, "high": 139},
        "output": {"distribution": "fixed", "value": 64},
    }
    workload, _ = workload_store(name="r", spec=spec)

    html = client.get(f"/workloads/{workload.pk}/").content.decode()

    prompt = pb.figure(html, "workload-prompt-data")
    assert prompt["layout"]["title"]["text"] == "Prompt lengths (tokens)"
    lows = [low for low, _ in _bars(prompt)]
    assert str(lows[0]).startswith("100") and str(lows[-1]).endswith("139")
    assert _bars(pb.figure(html, "workload-output-data")) == [(64, 4000)]
    assert "— (no file)" in html


def test_the_list_links_each_version_to_its_page(client, member):
    workload, _ = workload_store(
        name="mt", spec={"kind": "dataset"}, file_name="p.txt", data=b"a\n"
    )

    html = client.get("/workloads/").content.decode()

    assert f'href="/workloads/{workload.pk}/"' in html


TRACE = Path(__file__).parents[1] / "fixtures" / "workloads" / "mooncake_trace.jsonl"


def test_a_traces_page_shows_its_lengths_in_its_own_tokens_and_its_reuse(client, member):
    workload, _ = workload_store(
        name="mooncake",
        spec={"kind": "trace", "block_size": 128, "speed": 2},
        file_name=TRACE.name,
        data=TRACE.read_bytes(),
    )

    html = client.get(f"/workloads/{workload.pk}/").content.decode()

    prompt = pb.figure(html, "workload-prompt-data")
    assert prompt["layout"]["title"]["text"] == "Prompt lengths (tokens)"
    assert sum(c for _, c in _bars(prompt)) == 12
    assert "The trace's lengths are tokens, as it states them." in html
    # 12 requests over 2.75 s, 1.4 s at 2×; 30 blocks named, 11 distinct
    assert "12 requests over 2.8 s of the trace (1.4 s replayed at 2.0×)" in html
    assert "30 blocks named, 11 distinct" in html
    assert "2× as fast, 128-token blocks per hash id" in html
