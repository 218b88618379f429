"""Compare, when its runs sent different workloads: each workload's length distributions,
overlaid where their units agree."""

import pytest

from moeops.runs.workloads import workload_store
from tests import page_base as pb

pytestmark = pytest.mark.django_db
LEVELS = [{"concurrency": 8, "output_throughput": 100.0, "median_tpot_ms": 20.0}]
SHORT = b"one two\nthree four five\n"
LONG = b"a much longer prompt than the other file holds, by far\n" * 3


def _run(deployment, label, workload):
    return pb.run(
        deployment,
        label,
        levels=LEVELS,
        parameters={"workload": workload.run_parameter()},
        snapshot={"source": "worker", "workload": workload.record()},
    )


def _page(client, *runs):
    query = "&".join(f"run={r.uuid}" for r in runs)
    return client.get(f"/compare/?{query}").content.decode()


def test_runs_of_two_datasets_show_both_prompt_distributions_overlaid(client):
    pb.sign_in(client)
    deployment = pb.deployment()
    short, _ = workload_store(name="short", spec={"kind": "dataset"}, file_name="s", data=SHORT)
    long, _ = workload_store(name="long", spec={"kind": "dataset"}, file_name="l", data=LONG)
    first, second = _run(deployment, "short prompts", short), _run(deployment, "long", long)

    html = _page(client, first, second)

    fig = pb.figure(html, "cmp-workload-prompt-characters-data")
    assert fig["layout"]["title"]["text"] == "Prompt lengths (characters)"
    assert [trace["name"] for trace in fig["data"]] == ["short v1", "long v1"]
    # the short file's prompts are 7 and 15 characters, the long one's 3 × 55
    assert [[count for _, count in trace["customdata"] if count] for trace in fig["data"]] == [
        [1, 1],
        [3],
    ]


def test_runs_of_one_workload_show_no_workload_charts(client):
    pb.sign_in(client)
    deployment = pb.deployment()
    short, _ = workload_store(name="short", spec={"kind": "dataset"}, file_name="s", data=SHORT)

    html = _page(client, _run(deployment, "a", short), _run(deployment, "b", short))

    assert 'id="cmp-workloads"' not in html
