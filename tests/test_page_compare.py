import csv
import io
from urllib.parse import parse_qs, urlparse

import pytest

from moeops.examples import load_example_data
from tests import page_base as pb

pytestmark = pytest.mark.django_db


def _levels(scale):
    return [
        {
            "concurrency": c,
            "output_throughput": t * scale,
            "median_tpot_ms": tpot,
            "p99_ttft_ms": 100.0 * c / 32,
        }
        for c, t, tpot in ((32, 400.0, 20.0), (64, 700.0, 25.0), (128, 806.0, 40.0))
    ]


@pytest.fixture
def pair(client):
    pb.sign_in(client)
    h200 = pb.host("h200")
    vm_host = pb.host("rtx", gpu_name="NVIDIA RTX PRO 6000 Blackwell")
    glm = pb.deployment("glm", pb.model("GLM-5"), h200)
    kimi = pb.deployment("kimi", pb.model("Kimi K2", pb.KIMI_CONFIG), vm_host)
    before = pb.run(
        glm, "before", levels=_levels(1.0), topology_snapshot=pb.snapshot(h200, "container", "lxc")
    )
    after = pb.run(
        glm,
        "after",
        levels=_levels(2.0),
        parameters={"moe_kernel": "tuned"},
        topology_snapshot=before.topology_snapshot,
    )
    other = pb.run(
        kimi, "kimi", levels=_levels(1.5), topology_snapshot=pb.snapshot(vm_host, "vm", "kvm")
    )
    return before, after, other


def _page(client, *runs, group="run"):
    query = "&".join(f"run={r.uuid}" for r in runs)
    return client.get(f"/compare/?{query}&group={group}").content.decode()


def test_two_runs_overlay_as_two_lines(client, pair):
    before, after, _ = pair
    html = _page(client, before, after)
    traces = pb.figure(html, "cmp-throughput-data")["data"]
    assert [t["name"] for t in traces] == ["GLM-5 · before", "GLM-5 · after"]
    assert traces[0]["y"] == [400.0, 700.0, 806.0]
    assert traces[1]["y"] == [800.0, 1400.0, 1612.0]
    tpot = pb.figure(html, "cmp-tpot-data")["data"]
    assert tpot[0]["y"] == [20.0, 25.0, 40.0]
    assert pb.figure(html, "cmp-ttft-data")["data"][0]["y"] == [100.0, 200.0, 400.0]


def test_pareto_plots_per_gpu_against_per_user(client, pair):
    before, after, _ = pair
    html = _page(client, before, after)
    traces = {t["name"]: t for t in pb.figure(html, "cmp-pareto-data")["data"]}
    line = traces["GLM-5 · before"]
    # per user 1000 / TPOT ms; per GPU over the deployment's 8 GPUs
    assert line["x"] == [50.0, 40.0, 25.0]
    assert line["y"] == [50.0, 87.5, 100.75]
    assert line["text"] == ["c=32", "c=64", "c=128"]
    # "after" is twice as fast at the same interactivity: it alone is the front
    assert traces["Pareto front"]["y"] == [201.5, 175.0, 100.0]


def test_the_selection_order_and_table_follow_the_url(client, pair):
    before, after, other = pair
    html = _page(client, other, before)
    names = [t["name"] for t in pb.figure(html, "cmp-throughput-data")["data"]]
    assert names == ["Kimi K2 · kimi", "GLM-5 · before"]
    table = html.split('id="compare-table"')[1].split("</table>")[0]
    assert table.index(">kimi<") < table.index(">before<")
    assert "Virtual machine (kvm)" in table and "Container (lxc)" in table


def test_grouping_colors_by_group(client, pair):
    before, after, other = pair
    html = _page(client, before, after, other, group="topology")
    traces = pb.figure(html, "cmp-throughput-data")["data"]
    colors = [t["line"]["color"] for t in traces]
    assert colors[0] == colors[1] != colors[2]
    assert traces[0]["legendgroup"] == "Container (lxc)"
    assert traces[0]["legendgrouptitle"] == {"text": "Container (lxc)"}
    assert traces[2]["legendgrouptitle"] == {"text": "Virtual machine (kvm)"}
    assert [t["line"]["dash"] for t in traces[:2]] == ["solid", "dash"]


def test_presets_pick_before_after_model_and_topology(client, pair):
    before, after, other = pair
    html = client.get("/compare/").content.decode()
    hrefs = {
        name: href.replace("&amp;", "&")
        for name, href in (
            ("kernel", html.split("Before / after kernel tuning")[0].rsplit('href="', 1)[1]),
            ("model", html.split(">By model<")[0].rsplit('href="', 1)[1]),
            ("topology", html.split(">By topology (VM vs container)<")[0].rsplit('href="', 1)[1]),
        )
    }
    picked = {k: parse_qs(urlparse(v.split('"')[0]).query) for k, v in hrefs.items()}
    assert picked["kernel"]["run"] == [str(before.uuid), str(after.uuid)]
    assert picked["kernel"]["group"] == ["kernel"]
    assert set(picked["model"]["run"]) == {str(other.uuid), str(after.uuid)}
    assert set(picked["topology"]["run"]) == {str(other.uuid), str(after.uuid)}


def test_peaks_chart_includes_runs_without_a_concurrency(client):
    pb.sign_in(client)
    load_example_data()
    from moeops.runs.models import SweepRun

    kimi = SweepRun.objects.filter(label__contains="MoE kernel tuning").order_by("created")
    html = _page(client, *kimi)
    assert 'id="cmp-throughput-data"' not in html
    assert "Not drawn, no such numbers in these runs: Output throughput vs concurrency" in html
    bars = pb.figure(html, "cmp-peaks-data")["data"][0]
    assert bars["orientation"] == "h"
    assert bars["x"] == [800.0, 5800.0]


def test_candidates_are_filtered_and_exclude_the_selection(client, pair):
    before, after, other = pair
    html = client.get(f"/compare/?run={before.uuid}&host=rtx").content.decode()
    candidates = html.split("Add runs")[1]
    assert f'value="{other.uuid}"' in candidates
    assert f'value="{after.uuid}"' not in candidates
    assert f'value="{before.uuid}"' not in candidates


def test_bad_uuids_are_ignored(client, pair):
    response = client.get("/compare/?run=not-a-uuid&run=")
    assert response.status_code == 200
    assert "Pick runs below" in response.content.decode()


def test_csv_has_one_row_per_level_with_the_runs_facets(client, pair):
    before, _, other = pair
    response = client.get(f"/compare/levels.csv?run={before.uuid}&run={other.uuid}")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert len(rows) == 6
    assert rows[0]["run"] == "before" and rows[3]["run"] == "kimi"
    assert rows[3]["virtualization"] == "Virtual machine (kvm)"
    assert rows[3]["output_throughput (tok/s)"] == "600.0"
    assert rows[0]["kernel_config"] == "default"


def test_twenty_runs_compare_in_a_bounded_number_of_queries(
    client, pair, django_assert_max_num_queries
):
    before = pair[0]
    runs = [pb.run(before.deployment, f"r{i}", levels=_levels(1 + i / 10)) for i in range(20)]
    with django_assert_max_num_queries(14):
        html = _page(client, *runs)
    assert len(pb.figure(html, "cmp-throughput-data")["data"]) == 20


@pytest.fixture
def measured(client):
    """Two sweeps of one vLLM deployment: --max-num-seqs 4, then 16 behind another endpoint."""
    pb.sign_in(client)
    deployment = pb.deployment("glm vllm", engine="vllm", engine_version="0.32.0")
    capped = pb.run(
        deployment,
        "cap 4",
        levels=_levels(1.0),
        snapshot=pb.measured(deployment, engine=pb.vllm_identity(4), kernel_config="tuned"),
    )
    deployment.endpoint_url = "http://127.0.0.1:30001"
    deployment.save()
    wide = pb.run(
        deployment,
        "cap 16",
        levels=_levels(1.5),
        snapshot=pb.measured(deployment, engine=pb.vllm_identity(16), kernel_config="tuned"),
    )
    return capped, wide


def test_what_changed_lists_each_runs_changes_against_the_first(client, measured):
    capped, wide = measured
    html = _page(client, capped, wide)
    changed = html.split('id="what-changed"')[1].split("</section>")[0]
    assert html.index('id="what-changed"') < html.index('id="compare-table"')
    sections = {
        part.split("</p>")[0]: part.split("</ul>")[0]
        for part in changed.split('<p class="small">')[1:]
    }
    assert list(sections) == [
        "Engine (as it answered)",
        "Launch arguments (as the engine reported them)",
        "Deployment (as recorded)",
    ]
    assert "<li>max_running_requests: 4 → 16</li>" in sections["Engine (as it answered)"]
    args = sections["Launch arguments (as the engine reported them)"]
    assert args.count("<li>") == 1 and "<li>scheduler_config.max_num_seqs: 4 → 16</li>" in args
    assert (
        "<li>endpoint_url: http://127.0.0.1:30000 → http://127.0.0.1:30001</li>"
        in sections["Deployment (as recorded)"]
    )
    assert "Not compared" not in changed


def test_nothing_changes_for_a_single_run(client, measured):
    html = _page(client, measured[0])
    assert "What changed" not in html


def test_runs_before_snapshots_say_what_could_not_be_compared(client, pair):
    before = pair[0]
    deployment = before.deployment
    after = pb.run(deployment, "measured", snapshot=pb.measured(deployment))
    html = _page(client, before, after)
    changed = html.split('id="what-changed"')[1].split("</section>")[0]
    assert "Not compared: a run has no snapshot" in changed
    assert "Nothing they recorded differs" not in changed


def test_the_engine_column_shows_what_the_engine_answered(client, measured):
    capped, wide = measured
    capped.deployment.engine_version = "0.33.0"
    capped.deployment.save()
    table = _page(client, capped, wide).split('id="compare-table"')[1].split("</table>")[0]
    assert table.count("<td>vLLM 0.32.0</td>") == 2 and "0.33.0" not in table


def test_before_after_tuning_reads_the_kernel_config_in_effect(client, measured):
    _, tuned = measured
    deployment = tuned.deployment
    engine_default = {
        "state": "engine_default",
        "file_name": "E=256,N=256,device_name=NVIDIA_H200.json",
        "reason": "no E=256,N=256,device_name=NVIDIA_H200.json where vllm looks",
    }
    default = pb.run(
        deployment,
        "untuned",
        levels=_levels(1.0),
        snapshot=pb.measured(deployment, engine=pb.vllm_identity(16), kernel_config=engine_default),
    )
    html = client.get("/compare/").content.decode()
    href = html.split("Before / after kernel tuning")[0].rsplit('href="', 1)[1].split('"')[0]
    picked = parse_qs(urlparse(href.replace("&amp;", "&")).query)
    # neither run has a config on record or an import's marker: the snapshots tell them apart
    assert picked["run"] == [str(default.uuid), str(tuned.uuid)]
    html = _page(client, default, tuned, group="kernel")
    groups = [t["legendgroup"] for t in pb.figure(html, "cmp-throughput-data")["data"]]
    assert groups == ["default kernel config", "tuned kernel config"]


def test_twenty_measured_runs_compare_in_a_bounded_number_of_queries(
    client, measured, django_assert_max_num_queries
):
    capped = measured[0]
    runs = [
        pb.run(capped.deployment, f"r{i}", levels=_levels(1.0), snapshot=capped.snapshot)
        for i in range(20)
    ]
    with django_assert_max_num_queries(14):
        html = _page(client, *runs)
    assert html.count("Nothing they recorded differs.") == 19
