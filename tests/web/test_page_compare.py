import csv
import io
import re
from urllib.parse import parse_qs, urlparse

import pytest

from moeops.examples import load_example_data
from moeops.runs import snapshots
from moeops.runs.keys import level_key
from moeops.runs.models import LevelResult, SweepRun
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
    assert line["customdata"] == ["c=32", "c=64", "c=128"]
    # "after" is twice as fast at the same interactivity: it alone is the front
    assert traces["Pareto front"]["y"] == [201.5, 175.0, 100.0]


def test_pareto_labels_do_not_overlap(client, pair):
    before, after, _ = pair
    runs = [before, after]
    for i in range(4):
        # runs a few percent apart: their points sit on each other
        runs.append(pb.run(before.deployment, f"again {i}", levels=_levels(1 + i / 50)))
    html = _page(client, *runs)
    traces = [t for t in pb.figure(html, "cmp-pareto-data")["data"] if t["name"] != "Pareto front"]
    points = [(x, y) for t in traces for x, y in zip(t["x"], t["y"], strict=True)]
    span_x = max(x for x, _ in points) - min(x for x, _ in points)
    span_y = max(y for _, y in points) - min(y for _, y in points)
    labelled = [
        (x, y) for t in traces for x, y, text in zip(t["x"], t["y"], t["text"], strict=True) if text
    ]
    assert len(labelled) < len(points)
    for i, (x, y) in enumerate(labelled):
        for px, py in labelled[:i]:
            assert abs(x - px) / span_x >= 0.08 or abs(y - py) / span_y >= 0.06


def test_the_older_run_comes_first_whatever_order_the_url_gives(client, pair):
    before, after, other = pair
    html = _page(client, other, before)
    names = [t["name"] for t in pb.figure(html, "cmp-throughput-data")["data"]]
    assert names == ["GLM-5 · before", "Kimi K2 · kimi"]
    table = html.split('id="compare-table"')[1].split("</table>")[0]
    assert table.index(">before<") < table.index(">kimi<")
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


def _preset(html, name):
    """The selection of a preset's link, or None when the preset has no pair."""
    head = html.split('<div class="presets">')[1].split("</div>")[0]
    link = re.search(rf'<a class="button" href="([^"]+)">{re.escape(name)}</a>', head)
    if link is None:
        return None
    return parse_qs(urlparse(link[1].replace("&amp;", "&")).query)


def _measured_run(deployment, label, scale=1.0, kernel=None, topology=None):
    snapshot = pb.measured(deployment, kernel_config=kernel)
    if topology is not None:
        snapshot["topology"] = snapshots.topology_record(topology)
    return pb.run(deployment, label, levels=_levels(scale), snapshot=snapshot)


@pytest.fixture
def one_factor_pairs(client):
    """Runs that pair up one factor at a time, and runs that differ in several at once."""
    pb.sign_in(client)
    host = pb.host("h200")
    glm = pb.deployment("glm", pb.model("GLM-5"), host)
    kimi = pb.deployment("kimi", pb.model("Kimi K2", pb.KIMI_CONFIG), host)
    default = {"state": "engine_default", "reason": "none where the engine looks"}
    vm, lxc = pb.snapshot(host, "vm", "kvm"), pb.snapshot(host, "container", "lxc")
    runs = {
        "glm default": _measured_run(glm, "glm default", 1.0, default, lxc),
        "glm tuned": _measured_run(glm, "glm tuned", 7.25, "tuned", lxc),
        "kimi default": _measured_run(kimi, "kimi default", 1.5, default, lxc),
        "glm on the vm": _measured_run(glm, "glm on the vm", 0.8, default, vm),
        # newest, and differs from every other run in more than one factor
        "kimi tuned on the vm": _measured_run(kimi, "kimi tuned on the vm", 5, "tuned", vm),
    }
    return runs


def test_presets_pick_pairs_that_differ_in_their_factor_alone(client, one_factor_pairs):
    runs = {name: str(run.uuid) for name, run in one_factor_pairs.items()}
    html = client.get("/compare/").content.decode()
    kernel = _preset(html, "Before / after kernel tuning")
    assert kernel["run"] == [runs["glm default"], runs["glm tuned"]]
    assert kernel["group"] == ["kernel"]
    assert _preset(html, "By model")["run"] == [runs["glm default"], runs["kimi default"]]
    # glm tuned and kimi default also differ from glm on the vm in their kernel or model
    topology = _preset(html, "By topology (VM vs container)")["run"]
    assert topology == [runs["glm default"], runs["glm on the vm"]]


def test_a_preset_without_a_pair_says_so(client):
    pb.sign_in(client)
    load_example_data()
    html = client.get("/compare/").content.decode()
    # the write-up's GLM-5 ran on LXC, its Kimi K2 on KVM: no pair varies one of them alone
    assert _preset(html, "By model") is None
    assert _preset(html, "By topology (VM vs container)") is None
    assert "By model: No two runs differ in the model alone." in html
    assert "By topology (VM vs container): No two runs differ in the topology alone." in html
    kernel = _preset(html, "Before / after kernel tuning")["run"]
    kimi = SweepRun.objects.filter(label__contains="MoE kernel tuning").order_by("created")
    assert kernel == [str(run.uuid) for run in kimi]


def test_the_kimi_pair_states_its_headline_and_what_differs(client):
    pb.sign_in(client)
    load_example_data()
    kimi = SweepRun.objects.filter(label__contains="MoE kernel tuning").order_by("created")
    html = _page(client, *kimi, group="kernel")
    banner = html.split('id="differs-in"')[1].split("</section>")[0]
    assert '<span class="headline">7.25× peak output throughput</span>' in banner
    assert '<span class="factors">differs in: kernel config</span>' in banner
    assert html.index('id="differs-in"') < html.index('id="compare-table"')


def _peak_in_rounds(peak, low, high):
    """Levels whose peak (64) ran four rounds spanning low–high with `peak` their median."""
    return [
        {"concurrency": 32, "output_throughput": peak / 2},
        {"concurrency": 64, "output_throughput": peak, "rounds": (low, high)},
    ]


def _run_of(deployment, label, levels):
    rounds = {level["concurrency"]: level.pop("rounds", None) for level in levels}
    run = pb.run(deployment, label, levels=levels)
    for level in run.levels.all():
        if rounds.get(level.concurrency):
            pb.rounds_spanning(level, level.output_throughput, rounds[level.concurrency])
    return run


def _banner(client, before_levels, after_levels, order=("before", "after")):
    pb.sign_in(client)
    deployment = pb.deployment("glm", pb.model("GLM-5"), pb.host("h200"))
    runs = {
        "before": _run_of(deployment, "before", before_levels),
        "after": _run_of(deployment, "after", after_levels),
    }
    html = _page(client, *(runs[name] for name in order))
    return html.split('id="differs-in"')[1].split("</section>")[0]


def test_a_headline_within_the_rounds_noise_says_so(client):
    banner = _banner(
        client, _peak_in_rounds(1000.0, 850.0, 1150.0), _peak_in_rounds(1100.0, 900.0, 1300.0)
    )
    assert '<span class="headline">1.1× peak output throughput</span>' in banner
    assert (
        '<span class="noise">within noise: +10 % [−22 %, +53 %] (peak 1,100 (900–1,300) against '
        "1,000 (850–1,150) tok/s; a permutation test of the rounds at 5 % false alarms, "
        "p = 0.37)</span>"
    ) in banner


def test_a_headline_beyond_the_rounds_noise_says_so(client):
    banner = _banner(
        client, _peak_in_rounds(1000.0, 980.0, 1020.0), _peak_in_rounds(1100.0, 1080.0, 1120.0)
    )
    assert (
        "beyond the noise: +10 % [+6 %, +14 %] (peak 1,100 (1,080–1,120) against 1,000 (980–1,020) "
        "tok/s; a permutation test of the rounds at 5 % false alarms, p = 0.03)"
    ) in banner
    assert "within noise" not in banner


def test_a_headline_of_one_round_runs_says_it_has_no_noise_estimate(client):
    banner = _banner(client, _levels(1.0), _levels(2.0))
    assert "single rounds: no noise estimate (peak 1,612 against 806 tok/s)" in banner
    assert "cannot tell" not in banner


def test_the_older_run_is_the_baseline_whichever_was_ticked_first(client):
    banner = _banner(
        client,
        _peak_in_rounds(1000.0, 980.0, 1020.0),
        _peak_in_rounds(500.0, 490.0, 510.0),
        order=("after", "before"),
    )
    assert "<strong>after</strong> against before" in banner
    assert '<span class="headline">0.5× peak output throughput</span>' in banner
    assert "beyond the noise: −50 % [" in banner


def test_latency_is_compared_at_the_same_concurrency(client):
    before = _peak_in_rounds(1000.0, 980.0, 1020.0)
    after = _peak_in_rounds(1100.0, 1080.0, 1120.0)
    before[1]["median_tpot_ms"], after[1]["median_tpot_ms"] = 40.0, 44.0
    after[0]["median_tpot_ms"] = 20.0  # at 32: not the baseline's peak
    banner = _banner(client, before, after)
    assert '<span class="latency">p50 TPOT at concurrency 64: 40.0 → 44.0 ms</span>' in banner


def test_the_banner_lists_every_factor_a_comparison_varies(client, one_factor_pairs):
    html = _page(client, one_factor_pairs["glm default"], one_factor_pairs["kimi tuned on the vm"])
    banner = html.split('id="differs-in"')[1].split("</section>")[0]
    assert "differs in: model, kernel config, topology" in banner
    assert "5× peak output throughput" in banner


def test_stand_in_runs_are_left_out_unless_asked(client, pair):
    before, _, _ = pair
    standin = pb.run(
        before.deployment,
        "small sweep from the UI",
        levels=_levels(3.0),
        snapshot={"engine": {"engine": "standin"}},
    )
    html = _page(client, before, standin)
    assert "1 stand-in run left out (small sweep from the UI)" in html
    assert [t["name"] for t in pb.figure(html, "cmp-throughput-data")["data"]] == ["GLM-5 · before"]
    assert f'value="{standin.uuid}"' not in html.split("Add runs")[1]
    assert "Runs of the stand-in engine are not listed" in html
    rows = list(
        csv.DictReader(
            io.StringIO(
                client.get(
                    f"/compare/levels.csv?run={before.uuid}&run={standin.uuid}"
                ).content.decode()
            )
        )
    )
    assert {row["run"] for row in rows} == {"before"}

    html = client.get(f"/compare/?run={before.uuid}&run={standin.uuid}&standin=1").content.decode()
    names = [t["name"] for t in pb.figure(html, "cmp-throughput-data")["data"]]
    assert names == ["GLM-5 · before", "GLM-5 · small sweep from the UI [stand-in]"]
    table = html.split('id="compare-table"')[1].split("</table>")[0]
    assert table.count('<span class="badge standin">stand-in</span>') == 1
    response = client.get(f"/compare/levels.csv?run={before.uuid}&run={standin.uuid}&standin=1")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert {(row["run"], row["stand_in"]) for row in rows} == {
        ("before", "no"),
        ("small sweep from the UI", "yes"),
    }


def test_per_gpu_figures_are_na_on_a_host_without_gpus(client, pair):
    before, _, _ = pair
    cpu_box = pb.deployment("on a cpu box", pb.model("GLM-5 copy"), pb.host("local", gpus=0))
    run = pb.run(cpu_box, "cpu", levels=_levels(1.0))
    html = _page(client, before, run)
    table = html.split('id="compare-table"')[1].split("</table>")[0]
    row = table.split(">cpu</a>")[1].split("</tr>")[0]
    assert '<td class="num"><span class="muted" title="no GPUs recorded for the host">none' in row
    assert ">n/a</td>" in row
    pareto = [t["name"] for t in pb.figure(html, "cmp-pareto-data")["data"]]
    assert "GLM-5 copy · cpu" not in pareto
    assert "Per GPU n/a, no GPUs recorded for the host: cpu" in html


def test_ttft_offers_a_log_axis(client, pair):
    before, after, _ = pair
    layout = pb.figure(_page(client, before, after), "cmp-ttft-data")["layout"]
    [menu] = layout["updatemenus"]
    assert [b["label"] for b in menu["buttons"]] == ["linear", "log"]
    assert menu["buttons"][1]["args"][0]["yaxis.type"] == "log"


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
    html = client.get(href.replace("&amp;", "&")).content.decode()
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


def test_an_engine_upgrade_under_the_same_tuned_file_says_to_re_tune(client, measured):
    capped, _ = measured
    deployment = capped.deployment
    before, after = (
        pb.run(
            deployment,
            f"on {version}",
            levels=_levels(1.0),
            snapshot=pb.measured(
                deployment, engine=pb.vllm_identity(16, version=version), kernel_config="tuned"
            ),
        )
        for version in ("0.33.0", "0.34.0")
    )

    moved = _page(client, before, after).split('id="what-changed"')[1].split("</section>")[0]
    same = _page(client, capped, capped).split('id="what-changed"')

    assert (
        "The engine moved from 0.33.0 to 0.34.0 under the same tuned kernel file, tuned for at "
        "most one of their kernels: “Tune for vLLM 0.34.0 and re-sweep”." in moved
    )
    assert "Tune for" not in "".join(same)


def _rate_run(deployment, label, rates):
    run = pb.run(deployment, label)
    for rate in rates:
        LevelResult.objects.create(
            run=run,
            key=level_key(16, rate),
            concurrency=16,
            request_rate=rate,
            achieved_request_rate=rate,
            output_throughput=50.0 * rate,
        )
    return run


def test_rate_sweeps_compare_against_the_rate_asked_and_a_closed_loop_run_against_concurrency(
    client, pair
):
    before, _, _ = pair
    slow = _rate_run(before.deployment, "rates", [1.0, 2.0])
    fast = _rate_run(before.deployment, "more rates", [2.0, 4.0, 8.0])

    rated = pb.figure(_page(client, slow, fast), "cmp-throughput-data")
    mixed = pb.figure(_page(client, before, slow), "cmp-throughput-data")

    assert rated["layout"]["title"]["text"] == "Output throughput vs request rate"
    assert [t["x"] for t in rated["data"]] == [[1.0, 2.0], [2.0, 4.0, 8.0]]
    assert mixed["layout"]["title"]["text"] == "Output throughput vs concurrency"
    assert [t["x"] for t in mixed["data"]] == [[32, 64, 128], [16, 16]]
