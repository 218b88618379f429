import csv
import io
import re

import pytest

from domain import engine as reports
from domain import launch
from moeops.front import series
from moeops.front.charts.deployments import throughput_vs_load
from moeops.front.charts.figures import epoch_to_plotly
from moeops.front.charts.load import CONCURRENCY_AXIS
from moeops.front.charts.runs import run_throughput
from moeops.runs.keys import level_key
from moeops.runs.models import LevelResult
from moeops.runs.samples import EngineSample, TelemetrySample
from tests import page_base as pb

pytestmark = pytest.mark.django_db

LEVELS = [
    {
        "concurrency": 64,
        "output_throughput": 700.0,
        "total_token_throughput": 1400.0,
        "median_ttft_ms": 120.0,
        "p99_ttft_ms": 300.0,
        "median_tpot_ms": 40.0,
        "p99_tpot_ms": 55.0,
        "median_itl_ms": 38.0,
        "p99_itl_ms": 90.0,
        "completed": 256,
        "duration": 93.5,
    },
    {
        "concurrency": 128,
        "output_throughput": 806.0,
        "total_token_throughput": 1612.0,
        "median_ttft_ms": 400.0,
        "p99_ttft_ms": 900.0,
        "median_tpot_ms": 80.0,
        "p99_tpot_ms": 95.0,
        "median_itl_ms": 76.0,
        "p99_itl_ms": 150.0,
        "completed": 512,
        "duration": 162.0,
        "failed": 2,
        "errors": {"timeout": 2},
    },
]


@pytest.fixture
def sweep(client):
    pb.sign_in(client)
    return pb.run(pb.deployment(max_running_requests=64), label="before tuning", levels=LEVELS)


def test_it_requires_login(client, sweep):
    client.logout()
    assert client.get(f"/runs/{sweep.uuid}/").status_code == 302


def test_it_shows_every_recorded_metric_with_units(client, sweep):
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    assert 'output throughput<br><span class="unit">tok/s</span>' in html
    assert 'p99 TTFT<br><span class="unit">ms</span>' in html
    assert 'duration<br><span class="unit">s</span>' in html
    # per GPU: 806 tok/s over the deployment's 8 GPUs; per user: 1000 / 80 ms TPOT
    assert "100.8" not in html and ">101<" in html
    assert ">12.5<" in html
    assert "<code>timeout</code> × 2" in html
    # metrics without any value are named, not drawn as empty columns
    assert "No values recorded for:" in html and "p95 E2EL" in html


def test_throughput_and_latency_charts_follow_the_levels(client, sweep):
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    fig = pb.figure(html, "throughput-data")
    traces = {t["name"]: t for t in fig["data"]}
    assert traces["output"]["x"] == [64, 128]
    assert traces["output"]["y"] == [700.0, 806.0]
    assert traces["total"]["y"] == [1400.0, 1612.0]
    ttft = {t["name"]: t["y"] for t in pb.figure(html, "ttft-data")["data"]}
    assert ttft == {"p50": [120.0, 400.0], "p99": [300.0, 900.0]}
    tpot = {t["name"]: t["y"] for t in pb.figure(html, "tpot-data")["data"]}
    assert tpot == {"p50": [40.0, 80.0], "p99": [55.0, 95.0]}
    itl = {t["name"]: t["y"] for t in pb.figure(html, "itl-data")["data"]}
    assert itl == {"p50": [38.0, 76.0], "p99": [90.0, 150.0]}


def _levels_timed(sweep, spans, **telemetry):
    """1 Hz telemetry from t0 = 1.8e9 s (pb.telemetry's keywords), and the sweep's levels, by
    concurrency, set to have run over `spans` ((start, end) s after t0); returns the levels."""
    t0 = pb.telemetry(sweep, t0=1_800_000_000.0, **telemetry)
    levels = list(sweep.levels.order_by("concurrency"))
    for level, (start, end) in zip(levels, spans, strict=True):
        level.started_at, level.finished_at = t0 + start, t0 + end
        level.save()
    return levels


def test_gpu_charts_are_bucketed_with_power_limit_and_level_bands(client, sweep):
    # 4 GPUs × 960 s; GPU g runs at 10·g % except a 1 s spike to 100 % at second 500
    _levels_timed(
        sweep,
        [(0, 400), (400, 959)],
        gpus=4,
        seconds=960,
        util=lambda g, s: 100.0 if s == 500 else 10.0 * g,
    )
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()

    util = pb.figure(html, "gpu-util-data")
    assert [t["name"] for t in util["data"]] == ["GPU0", "GPU1", "GPU2", "GPU3"]
    for g, trace in enumerate(util["data"]):
        assert len(trace["y"]) <= series.BUCKETS + 1
        assert trace["mode"] == "lines"  # too many points for a marker each
        assert min(trace["y"]) == pytest.approx(10.0 * g)
        # the spike survives bucketing as the bucket's max
        assert max(hi for _, hi in trace["customdata"]) == 100.0
    bands = [s for s in util["layout"]["shapes"] if s["type"] == "rect"]
    assert len(bands) == 2
    assert [a["text"] for a in util["layout"]["annotations"]] == ["c=64", "c=128"]

    power = pb.figure(html, "gpu-power-data")
    limit = [s for s in power["layout"]["shapes"] if s["type"] == "line"]
    assert [s["y0"] for s in limit] == [700.0]
    assert power["layout"]["yaxis"]["range"][1] >= 700.0
    assert "power limit 700 W" in [a["text"] for a in power["layout"]["annotations"]]


def test_the_level_table_gives_each_levels_mean_gpu_utilization(client, sweep):
    # 2 GPUs: at 20 and 40 % through concurrency 64, 60 and 80 % through 128
    _levels_timed(
        sweep,
        [(0, 99), (100, 199)],
        gpus=2,
        seconds=200,
        util=lambda g, s: (20.0 if s < 100 else 60.0) + 20.0 * g,
    )
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    table = html.split('<table class="data levels">')[1].split("</table>")[0]
    heads = re.findall(r'<th class="num">([^<]+)<', table)
    # past the key columns, a column shows only with "All columns" ticked
    [past] = re.findall(r"nth-child\(n\+(\d+)\)", html)
    assert heads[: int(past) - 1] == [*pb.LEVEL_TABLE_FIRST, "GPU util"]
    assert "duration" in heads[int(past) - 1 :]
    column = heads.index("GPU util")
    cells = [
        re.findall(r"<td [^>]*>([^<]*)<", row) for row in table.split("<tbody>")[1].split("<tr")[1:]
    ]
    assert [row[column] for row in cells] == ["30", "70"]


def test_engine_chart_shows_running_and_queued_against_the_cap(client, sweep):
    EngineSample.objects.bulk_create(
        EngineSample(run=sweep, ts=1_800_000_000.0 + s, running=64, queued=s) for s in range(30)
    )
    pb.samples_summed(sweep)
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    fig = pb.figure(html, "engine-data")
    traces = {t["name"]: t for t in fig["data"]}
    assert traces["running"]["y"] == [64.0] * 30
    assert traces["queued"]["y"] == [float(s) for s in range(30)]
    assert [s["y0"] for s in fig["layout"]["shapes"]] == [64]


def test_a_finished_run_names_the_charts_it_has_no_data_for(client, sweep):
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    assert 'id="gpu-util-data"' not in html and 'id="engine-data"' not in html
    assert (
        "Not recorded for this run: GPU utilization, GPU power, GPU memory, SM clock, "
        "engine running/queued requests, engine KV-cache use, engine counters (prefix cache, "
        "preemptions, speculative decoding)." in html
    )


def test_memory_clock_and_kv_cache_series_are_drawn_when_stored(client, sweep):
    TelemetrySample.objects.bulk_create(
        TelemetrySample(
            run=sweep,
            gpu_index=g,
            ts=1_800_000_000.0 + s,
            gpu_util=90.0,
            mem_used_mib=90_000.0 + s,
            mem_total_mib=143_771.0,
            sm_clock_mhz=1980.0 - s,
        )
        for s in range(10)
        for g in range(2)
    )
    pb.samples_summed(sweep)
    EngineSample.objects.bulk_create(
        EngineSample(run=sweep, ts=1_800_000_000.0 + s, running=64, queued=0, kv_cache_usage=0.5)
        for s in range(10)
    )
    pb.samples_summed(sweep)
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    memory = pb.figure(html, "gpu-memory-data")
    assert [t["name"] for t in memory["data"]] == ["GPU0", "GPU1"]
    assert memory["data"][0]["y"][0] == 90_000.0
    assert memory["layout"]["yaxis"]["range"][1] >= 143_771.0
    clock = pb.figure(html, "gpu-clock-data")
    assert clock["data"][1]["y"][-1] == 1971.0
    kv = pb.figure(html, "kv-cache-data")
    assert kv["data"][0]["y"] == [50.0] * 10
    assert kv["layout"]["yaxis"]["range"] == [0, 100]
    assert pb.figure(html, "gpu-util-data")["layout"]["yaxis"]["range"] == [0, 100]
    # a power chart without power samples draws no empty GPU traces
    assert 'id="gpu-power-data"' not in html


def test_the_ttft_chart_offers_a_log_axis(client, sweep):
    layout = pb.figure(client.get(f"/runs/{sweep.uuid}/").content.decode(), "ttft-data")["layout"]
    [menu] = layout["updatemenus"]
    assert [b["label"] for b in menu["buttons"]] == ["linear", "log"]
    assert menu["buttons"][1]["args"][0]["yaxis.type"] == "log"


def test_a_starting_run_shows_one_placeholder_not_empty_charts(client, sweep):
    sweep.levels.all().delete()
    sweep.status = "running"
    sweep.save()
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    waiting = html.split('id="waiting-first-level"')[1].split("</p>")[0]
    assert "hidden" not in waiting.split(">")[0]
    assert "Waiting for the first level" in waiting
    # the charts are there to fill in, each hidden while it has no data
    assert html.count('<section hidden><div id="') == 11
    assert 'class="chart hide-empty"' in html


def test_a_level_the_cancel_cut_short_is_kept_and_marked(client, sweep):
    pb.level(
        sweep,
        256,
        completed=37,
        failed=1,
        output_throughput=850.0,
        raw={"stopped": True, "num_prompts": 256},
    )
    sweep.status = "cancelled"
    sweep.save()
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    row = html.split('<tr class="partial">')[1].split("</tr>")[0]
    assert '256 <span class="badge partial">partial</span>' in row
    assert (
        "Concurrency 256: the sweep stopped inside this level (cancelled); the 38 of 256 "
        "requests finished by then are kept." in html
    )
    rows = list(
        csv.DictReader(io.StringIO(client.get(f"/runs/{sweep.uuid}/levels.csv").content.decode()))
    )
    assert [row["partial"] for row in rows] == ["no", "no", "yes"]


def test_a_worker_error_reads_as_a_sentence_with_the_detail_folded(client, sweep):
    sweep.status = "failed"
    sweep.error = "ConnectError: [Errno 111] Connection refused"
    sweep.save()
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    box = html.split('<div class="error-box" role="alert">')[1].split("</div>")[0]
    assert '<p class="error-sentence">The sweep failed: [Errno 111] Connection refused.</p>' in box
    assert "<summary>Details</summary><pre>ConnectError: [Errno 111] Connection refused</pre>" in (
        box
    )


def test_per_gpu_figures_are_na_on_a_host_without_gpus(client):
    pb.sign_in(client)
    deployment = pb.deployment("on a cpu box", host_row=pb.host("local", gpus=0))
    run = pb.run(deployment, "cpu", levels=LEVELS)
    html = client.get(f"/runs/{run.uuid}/").content.decode()
    header = html.split("<thead>")[1].split("</thead>")[0]
    column = [h.split("<")[0] for h in header.split('<th class="num">')[1:]].index("output per GPU")
    first_row = html.split("<tbody>")[1].split("</tr>")[0]
    cells = [c.split("</td>")[0] for c in first_row.split('<td class="num">')[1:]]
    assert cells[column] == "n/a"


def test_one_nvidia_smi_reading_is_drawn_as_bars_per_gpu(client, sweep):
    pb.telemetry(
        sweep, gpus=8, seconds=1, t0=1_800_000_000.0, util=lambda g, s: 0.0, power_limit=600.0
    )
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    power = pb.figure(html, "gpu-power-data")
    [bars] = power["data"]
    assert bars["type"] == "bar" and bars["x"] == [f"GPU{i}" for i in range(8)]
    assert bars["y"] == [100.0] * 8
    assert power["layout"]["shapes"][0]["y0"] == 600.0
    assert "one reading per GPU" in power["layout"]["title"]["text"]
    assert pb.figure(html, "gpu-util-data")["data"][0]["text"] == ["0 %"] * 8


def test_a_running_sweep_keeps_its_empty_charts_to_fill_in(client, sweep):
    sweep.status = "running"
    sweep.save()
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    assert pb.figure(html, "engine-data")["data"] == []
    assert "Not recorded for this run" not in html


def test_page_queries_stay_few_with_a_long_sweep(client, sweep, django_assert_max_num_queries):
    pb.telemetry(sweep, gpus=8, seconds=600)
    with django_assert_max_num_queries(16):
        assert client.get(f"/runs/{sweep.uuid}/").status_code == 200


def test_csv_has_every_metric_with_units_and_the_failures(client, sweep):
    response = client.get(f"/runs/{sweep.uuid}/levels.csv")
    assert response["Content-Type"].startswith("text/csv")
    assert 'filename="before-tuning-levels.csv"' in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert len(rows) == 2
    header = rows[0].keys()
    assert {"output_throughput (tok/s)", "p99_ttft_ms (ms)", "mean_e2el_ms (ms)"} <= set(header)
    assert rows[1]["concurrency"] == "128"
    assert rows[1]["output_throughput (tok/s)"] == "806.0"
    assert rows[1]["output_throughput_per_gpu (tok/s)"] == "100.75"
    assert rows[1]["p95_e2el_ms (ms)"] == ""
    assert rows[1]["errors"] == '{"timeout": 2}'


def test_findings_of_the_run_are_listed(client, sweep):
    from moeops.insights.models import Finding

    Finding.objects.create(
        deployment=sweep.deployment,
        run=sweep,
        kind="plateau",
        title="Throughput plateaus from concurrency 64",
        evidence={
            "chart": {
                "type": "line",
                "x": [64, 128],
                "x_label": "concurrency",
                "y_label": "output tok/s",
                "series": [{"name": "output throughput", "y": [700, 806]}],
            }
        },
    )
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    assert "Throughput plateaus from concurrency 64" in html
    finding = Finding.objects.get()
    fig = pb.figure(html, f"evidence-{finding.pk}-data")
    assert fig["data"][0]["y"] == [700, 806]
    assert fig["layout"]["xaxis"]["type"] == "log"


def test_unknown_run_is_404(client, sweep):
    assert client.get("/runs/00000000-0000-0000-0000-000000000000/").status_code == 404


@pytest.fixture
def measured(client):
    pb.sign_in(client)
    deployment = pb.deployment(engine="vllm", engine_version="0.31.0", max_running_requests=64)
    snapshot = pb.measured(deployment, engine=pb.vllm_identity(4), kernel_config="tuned")
    return pb.run(deployment, label="cap 4", levels=LEVELS, snapshot=snapshot)


def test_a_level_where_every_request_failed_shows_the_engines_error_first(client, sweep):
    pb.level(
        sweep,
        8,
        completed=0,
        failed=96,
        errors={"stream_error": 96},
        raw={"error_samples": {"stream_error": "Token id 25302 is out of vocabulary"}},
    )
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    error = (
        "Every request at concurrency 8 failed: stream error: Token id 25302 is out of vocabulary"
    )
    assert html.count(error) == 1
    assert html.index(error) < html.index("<h2>Sweep</h2>") < html.index("<h2>Per level</h2>")
    # a level with some failures among its successes stays a count under the table
    assert "Every request at concurrency 128" not in html
    assert "<code>timeout</code> × 2" in html


def test_the_cards_show_what_the_engine_answered_not_the_deployment_now(client, measured):
    deployment = measured.deployment
    deployment.engine_version, deployment.max_running_requests = "0.33.0", 256
    deployment.save()
    html = client.get(f"/runs/{measured.uuid}/").content.decode()
    sweep_card = html.split("<h2>Sweep</h2>")[1].split("</section>")[0]
    assert "vLLM 0.32.0" in sweep_card and "as the engine answered" in sweep_card
    assert "0.33.0" not in sweep_card and "256" not in sweep_card
    assert "4 <span" in sweep_card
    assert "reported by the engine (/server_info scheduler_config.max_num_seqs)" in sweep_card
    hardware = html.split("<h2>Hardware</h2>")[1].split("</section>")[0]
    assert "<code>E=256,N=256,device_name=NVIDIA_H200.json</code>" in hardware
    assert "from VLLM_TUNED_CONFIG_FOLDER, tuned (not shipped with the engine)" in hardware
    assert "h200-x8" in hardware and "pid 4242" in hardware
    assert measured.snapshot["moeops_version"] in hardware


def test_the_reported_arguments_are_listed_sorted_under_a_details(client, measured):
    html = client.get(f"/runs/{measured.uuid}/").content.decode()
    details = html.split('<details id="all-args">')[1].split("</details>")[0]
    assert "Every value the engine reported" in details
    assert "from <code>/server_info</code>" in details
    assert (
        "<tr><td><code>scheduler_config.max_num_seqs</code></td><td><code>4</code></td></tr>"
        in details
    )
    keys = [row.split("</code>")[0] for row in details.split("<tr><td><code>")[1:]]
    split = keys.index("VLLM_SERVER_DEV_MODE")
    args, env = keys[:split], keys[split:]
    assert args == sorted(args) and len(args) == 11 and "instance_id" not in args
    assert env == ["VLLM_SERVER_DEV_MODE", "VLLM_TUNED_CONFIG_FOLDER"]
    # JSON values, as the engine sent them
    assert "<td><code>true</code></td>" in details


def test_a_managed_runs_arguments_lead_with_what_its_recipe_passed(client, measured):
    argv = ["vllm", "serve", "zai-org/GLM-5", "--max-num-seqs", "16", "--enforce-eager"]
    measured.snapshot["recipe"] = {
        "version": 2,
        "flags": launch.flags(argv),
        "env": {"VLLM_TUNED_CONFIG_FOLDER": "/opt/moe-tuned", "VLLM_LOGGING_LEVEL": "DEBUG"},
        "kernel_configs": [],
    }
    measured.save()
    html = client.get(f"/runs/{measured.uuid}/").content.decode()
    section = html.split('<section id="engine-reported">')[1].split("<details")[0]
    assert "launch recipe v2, which moeops started this engine with" in section
    assert "<code>vllm serve zai-org/GLM-5</code>" in section
    rows = section.split('<table class="data compact args" id="passed-args">')[1]
    rows = [row.split("</tr>")[0] for row in rows.split("<tbody>")[1].split("<tr>")[1:]]
    assert len(rows) == 4
    # the engine reports 4 running requests where the recipe passed 16: said, not hidden
    assert "<code>--max-num-seqs</code>" in rows[0] and "<code>4</code>" in rows[0]
    assert "differs</span>" in rows[0]
    assert "<code>--enforce-eager</code></td><td><code>(on)</code>" in rows[1]
    assert "not reported" in rows[1] and "not reported" in rows[2]
    assert "VLLM_LOGGING_LEVEL" in rows[2] and "differs" not in rows[3]
    assert "<code>/opt/moe-tuned</code></td><td><code>/opt/moe-tuned</code>" in rows[3]


def test_the_values_not_the_engines_defaults_come_before_the_folded_rest(client, measured):
    measured.snapshot["engine"]["defaults"] = {
        "args": {
            "scheduler_config.max_num_seqs": 256,
            "parallel_config.tensor_parallel_size": 1,
            "model_config.served_model_name": None,
            "a key the engine did not report": 1,
        },
        "env": {"VLLM_TUNED_CONFIG_FOLDER": None},
    }
    measured.save()
    html = client.get(f"/runs/{measured.uuid}/").content.decode()
    section = html.split('<section id="engine-reported">')[1].split("<details")[0]
    rows = section.split('id="not-defaults">')[1].split("</table>")[0]
    rows = [row.split("</tr>")[0] for row in rows.split("<tbody>")[1].split("<tr>")[1:]]
    assert rows == [
        "<td><code>model_config.served_model_name</code></td><td><code>glm-5</code></td>"
        '<td><span class="muted">unset by default</span></td>',
        "<td><code>parallel_config.tensor_parallel_size</code></td><td><code>8</code></td>"
        "<td><code>1</code></td>",
        "<td><code>scheduler_config.max_num_seqs</code></td><td><code>4</code></td>"
        "<td><code>256</code></td>",
        "<td><code>VLLM_TUNED_CONFIG_FOLDER</code></td><td><code>/opt/moe-tuned</code></td>"
        '<td><span class="muted">unset by default</span></td>',
    ]
    summary = html.split('<details id="all-args">')[1].split("</summary>")[0]
    assert "its defaults included)" in summary and "does not say which" not in summary


def test_a_run_whose_defaults_could_not_be_read_says_why(client, measured):
    measured.snapshot["engine"]["defaults"] = {"error": "the engine runs on gpu-7, not here"}
    measured.save()
    html = client.get(f"/runs/{measured.uuid}/").content.decode()
    said = html.split('id="defaults-unknown">')[1].split("</p>")[0]
    assert said == (
        "Which of these are the engine's defaults is not known: the engine runs on gpu-7, not here."
    )
    assert "not-defaults" not in html
    assert "for it does not say which are defaults" in html


def test_an_engine_moeops_did_not_start_says_what_passed_is_unknown(client, measured):
    html = client.get(f"/runs/{measured.uuid}/").content.decode()
    section = html.split('<section id="engine-reported">')[1].split("<details")[0]
    assert "moeops did not start this engine" in section
    assert "passed-args" not in section


def test_a_vllm_without_dev_mode_says_why_its_arguments_are_missing(client):
    pb.sign_in(client)
    deployment = pb.deployment(engine="vllm", engine_version="0.32.0", max_running_requests=64)
    note = (
        "vLLM serves no /server_info, so its running-request cap and most of its arguments are "
        "unknown: start vLLM with VLLM_SERVER_DEV_MODE=1 for moeops to read its /server_info"
    )
    engine = reports.identity("vllm", version="0.32.0", notes=[note])
    engine_default = {
        "state": "engine_default",
        "file_name": "E=256,N=256,device_name=NVIDIA_H200.json",
        "reason": "no E=256,N=256,device_name=NVIDIA_H200.json where vllm looks: it runs its "
        "default kernel config",
    }
    run = pb.run(
        deployment,
        label="no dev mode",
        snapshot=pb.measured(deployment, engine=engine, kernel_config=engine_default),
    )
    html = client.get(f"/runs/{run.uuid}/").content.decode()
    assert note in html
    assert "<details>" not in html
    assert '64 <span class="muted small">as recorded; the engine did not report its cap' in html
    kernel = html.split("<dt>Kernel config</dt><dd>")[1].split("</dd>")[0]
    assert kernel.split()[:2] == ["engine", "default"]
    assert '<span class="muted small">no E=256,N=256,device_name=NVIDIA_H200.json where' in kernel


def test_an_engine_that_did_not_answer_is_shown_as_recorded(client):
    pb.sign_in(client)
    deployment = pb.deployment(engine="sglang", engine_version="0.5.6")
    run = pb.run(deployment, label="queued", status="queued", snapshot=pb.measured(deployment))
    deployment.engine_version = "0.5.7"
    deployment.save()
    html = client.get(f"/runs/{run.uuid}/").content.decode()
    sweep_card = html.split("<h2>Sweep</h2>")[1].split("</section>")[0]
    assert 'SGLang 0.5.6 <span class="muted small">as recorded</span>' in sweep_card
    assert "<h2>Hardware</h2>" in html and "Launch arguments" not in html


def test_a_run_before_snapshots_says_so_instead_of_the_deployment_now(client, sweep):
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    assert "not recorded (this run predates snapshots)" in html
    sweep_card = html.split("<h2>Sweep</h2>")[1].split("</section>")[0]
    assert "max running" not in sweep_card.lower() and "SGLang" not in sweep_card


def test_a_stand_in_run_is_marked_as_not_a_measurement(client, sweep):
    sweep.snapshot = pb.measured(
        sweep.deployment,
        engine=reports.identity("standin", version="0.1", args={"max_running_requests": 64}),
        kernel_config={"state": "not_applicable", "reason": "the stand-in engine runs no kernels"},
    )
    sweep.save()
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    title = html.split("<h1>")[1].split("</h1>")[0]
    assert '<span class="badge standin">stand-in</span>' in title
    assert "it is a test double" in html and "not measurements of an engine" in html
    assert "not applicable" in html and "the stand-in engine runs no kernels" in html
    # every chart series and the export say so too
    throughput = pb.figure(html, "throughput-data")
    assert [t["name"] for t in throughput["data"]] == ["output [stand-in]", "total [stand-in]"]
    assert throughput["layout"]["title"]["text"].endswith("stand-in engine, not a measurement")
    rows = list(
        csv.DictReader(io.StringIO(client.get(f"/runs/{sweep.uuid}/levels.csv").content.decode()))
    )
    assert {row["stand_in"] for row in rows} == {"yes"}


def test_a_measured_run_costs_no_extra_queries(client, measured, django_assert_max_num_queries):
    with django_assert_max_num_queries(16):
        assert client.get(f"/runs/{measured.uuid}/").status_code == 200


def test_a_resumed_sweep_says_which_attempt_ran_each_level(
    client, sweep, django_assert_max_num_queries
):
    # its worker died inside level 32; the sweep delivered again ran that level anew
    resumed = pb.run(
        sweep.deployment,
        label="resumed",
        levels=[{"concurrency": c, "request_throughput": c / 3, "attempt": a}
                for c, a in ((8, 1), (16, 1), (32, 2))],
        progress={"attempt": 2},
    )  # fmt: skip
    pb.telemetry(resumed, gpus=8, seconds=600)
    with django_assert_max_num_queries(16):
        html = client.get(f"/runs/{resumed.uuid}/").content.decode()
    assert (
        "Resumed: 2 attempts (its worker stopped and another delivery took over); "
        "levels 8 and 16 ran in attempt 1, level 32 in attempt 2."
    ) in html
    table = html.split('<table class="data levels">')[1].split("</table>")[0]
    head, body = table.split("<tbody>")
    assert ">attempt<" in head
    rows = [row.split("</td>") for row in body.split("</tr>")[:3]]
    assert [row[1].split(">")[-1] for row in rows] == ["1", "1", "2"]
    # the columns after it keep their own digits: request throughput has two
    assert ">2.67<" in body

    # a third delivery that has stored no level yet is named too
    resumed.status, resumed.progress = "running", {"attempt": 3}
    resumed.save()
    html = client.get(f"/runs/{resumed.uuid}/").content.decode()
    assert (
        "Resumed: 3 attempts (twice its worker stopped and another delivery took over); "
        "levels 8 and 16 ran in attempt 1, level 32 in attempt 2, none yet in attempt 3."
    ) in html


def test_a_sweep_of_one_attempt_shows_no_attempts(client, sweep):
    sweep.progress = {"attempt": 1}
    sweep.save()
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    assert "Resumed" not in html and ">attempt<" not in html


def test_a_finished_runs_samples_are_read_once_and_again_when_a_level_window_moves(
    client, sweep, django_assert_max_num_queries
):
    # sweep has finished: it takes no more samples (runs.services), so its charts hold
    t0 = pb.telemetry(sweep, gpus=2, seconds=300, t0=1_800_000_000.0)
    first = client.get(f"/runs/{sweep.uuid}/").content.decode()
    # stored behind the services' back, which refuse a finished run's samples: not read again
    pb.telemetry(sweep, gpus=3, seconds=300, t0=t0)
    with django_assert_max_num_queries(11):
        again = client.get(f"/runs/{sweep.uuid}/").content.decode()
    names = [t["name"] for t in pb.figure(again, "gpu-util-data")["data"]]
    assert names == ["GPU0", "GPU1"]
    assert pb.figure(again, "gpu-power-data") == pb.figure(first, "gpu-power-data")
    # a level's window is part of what the samples are read by: moved, they are read anew
    level = sweep.levels.order_by("concurrency").first()
    level.started_at, level.finished_at = t0, t0 + 100
    level.save()
    moved = client.get(f"/runs/{sweep.uuid}/").content.decode()
    names = [t["name"] for t in pb.figure(moved, "gpu-util-data")["data"]]
    assert names == ["GPU0", "GPU1", "GPU2"]


def test_time_charts_send_contiguous_buckets_as_a_start_and_a_step(client, sweep):
    sweep.status = "running"
    sweep.save()
    # GPU0 every second of 480 s; GPU1 only in its first and last minute
    pb.telemetry(sweep, gpus=1, seconds=480, t0=1_800_000_000.0)
    TelemetrySample.objects.bulk_create(
        TelemetrySample(run=sweep, gpu_index=1, ts=1_800_000_000.0 + s, gpu_util=20.0)
        for s in [*range(60), *range(420, 480)]
    )
    pb.samples_summed(sweep)
    html = client.get(f"/runs/{sweep.uuid}/").content.decode()
    gpu0, gpu1 = pb.figure(html, "gpu-util-data")["data"]
    # 479 s between the first and the last sample, in buckets of 479 / 240 s
    width = 479 / series.BUCKETS
    centre = [epoch_to_plotly(1_800_000_000.0 + (b + 0.5) * width) for b in (0, 240)]
    assert gpu0["x0"] == centre[0] and gpu0["dx"] == pytest.approx(width * 1000, abs=1e-3)
    # the last sample alone in a 241st bucket
    assert "x" not in gpu0 and len(gpu0["y"]) == series.BUCKETS + 1
    # a gap: each bucket's own time, from the first bucket's centre to the last's
    assert "x0" not in gpu1 and len(gpu1["x"]) == len(gpu1["y"]) < series.BUCKETS / 2
    assert (gpu1["x"][0], gpu1["x"][-1]) == tuple(centre)


def test_the_charts_and_the_cost_columns_read_the_same_level_power(sweep):
    # a level that ends inside a bucket: its power is of its own samples, not the bucket's
    levels = _levels_timed(
        sweep, [(0, 100.5), (101, 480)], gpus=2, seconds=481, util=lambda g, s: s % 7
    )
    sweep.status = "running"
    power = series.gpu_series(sweep, levels=levels).extra["level_power"]
    assert power == pytest.approx(sweep.level_power(levels))
    assert set(power) == {level.key for level in levels}


def test_the_engine_counters_of_each_level_are_charted(client, sweep):
    counters = {
        "engine": "vllm",
        "prefix_cache_queries": 1000.0,
        "prefix_cache_hits": 250.0,
        "preemptions": 3.0,
        "spec_draft_tokens": 400.0,
        "spec_accepted_tokens": 300.0,
    }
    level = sweep.levels.order_by("concurrency").first()
    level.raw = {"engine_counters": counters}
    level.save()

    fig = pb.figure(client.get(f"/runs/{sweep.uuid}/").content.decode(), "engine-counters-data")

    traces = {t["name"]: t for t in fig["data"]}
    assert traces["prefix-cache hit rate"]["y"] == [25.0]
    assert traces["speculative acceptance"]["y"] == [75.0]
    assert traces["preemptions"]["y"] == [3.0]
    assert traces["preemptions"]["x"] == [str(level.concurrency)]


def test_a_multi_turn_run_names_its_workload_and_shows_ttft_by_turn(client):
    pb.sign_in(client)
    spec = {"kind": "multi_turn", "turns": 2, "question_len": 8, "think_time_s": 1.0}
    spec["output"] = {"distribution": "fixed", "value": 32}
    named = {"id": 1, "name": "two turns", "version": 3, "kind": "multi_turn", "sha256": None}
    turns = [
        {"turn": 1, "completed": 8, "failed": 0, "mean_ttft_ms": 41.5, "p99_ttft_ms": 80.0},
        {"turn": 2, "completed": 7, "failed": 1, "mean_ttft_ms": 97.31, "p99_ttft_ms": 150.0},
    ]
    run = pb.run(
        pb.deployment(),
        levels=[{"concurrency": 4, "completed": 15, "failed": 1, "raw": {"ttft_by_turn": turns}}],
        parameters={"levels": [4], "workload": {**named, "spec": spec}},
        snapshot={"workload": {k: v for k, v in named.items() if k != "id"}},
    )

    html = client.get(f"/runs/{run.uuid}/").content.decode()

    workload = html.split('id="run-workload">')[1].split("</dd>")[0]
    # the name links to the workload's page (its length distributions)
    assert workload.startswith(
        '<a href="/workloads/1/">two turns v3</a> (multi_turn): 2 turns of 8-token questions'
    )
    table = html.split('id="turns"')[1].split("</table>")[0]
    rows = re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>")[1])
    cells = [re.findall(r'<td class="num">(.*?)</td>', row) for row in rows]
    assert cells == [["4", "1", "8", "0", "41.5", "80.0"], ["4", "2", "7", "1", "97.3", "150.0"]]


def _rate_sweep(caps_rates):
    """A rate sweep: at each (cap, rate) a level that achieved 95 % of the rate."""
    run = pb.run(pb.deployment(), label="rates", parameters={"levels": [8]})
    for cap, rate in caps_rates:
        LevelResult.objects.create(
            run=run,
            key=level_key(cap, rate),
            concurrency=cap,
            request_rate=rate,
            achieved_request_rate=0.95 * rate,
            output_throughput=100.0 * rate,
            median_ttft_ms=10.0 * rate,
            p99_ttft_ms=20.0 * rate,
            completed=64,
        )
    return run


def test_a_rate_sweeps_charts_plot_each_level_at_the_rate_it_asked(client):
    pb.sign_in(client)
    run = _rate_sweep([(8, 4.0), (8, 1.0), (8, 2.0)])

    html = client.get(f"/runs/{run.uuid}/").content.decode()
    throughput = pb.figure(html, "throughput-data")
    ttft = pb.figure(html, "ttft-data")

    assert throughput["layout"]["title"]["text"] == "Throughput vs request rate"
    assert throughput["layout"]["xaxis"]["title"]["text"] == "request rate asked (req/s)"
    [output] = [t for t in throughput["data"] if t["name"] == "output"]
    assert output["x"] == [1.0, 2.0, 4.0] and output["y"] == [100.0, 200.0, 400.0]
    assert output["customdata"] == [0.95, 1.9, 3.8]
    p99 = next(t for t in ttft["data"] if t["name"] == "p99")
    assert p99["x"] == [1.0, 2.0, 4.0] and p99["y"] == [20.0, 40.0, 80.0]


def test_a_rate_sweep_under_two_caps_draws_a_line_per_cap():
    run = _rate_sweep([(8, 1.0), (8, 2.0), (16, 1.0), (16, 2.0), (16, 4.0)])

    fig = run_throughput(list(run.levels.all()))

    lines = {t["name"]: t["x"] for t in fig["data"]}
    assert lines == {"output (cap 8)": [1.0, 2.0], "output (cap 16)": [1.0, 2.0, 4.0]}


def test_levels_that_sent_as_fast_as_they_could_stay_on_the_concurrency_axis(client, sweep):
    fig = run_throughput(list(sweep.levels.all()))

    assert fig["layout"]["xaxis"] == CONCURRENCY_AXIS
    assert fig["data"][0]["x"] == [64, 128]


def test_the_deployment_pages_chart_of_rate_sweeps_plots_them_at_their_rates():
    run = _rate_sweep([(8, 1.0), (8, 2.0)])

    fig = throughput_vs_load([run])

    assert fig["layout"]["title"]["text"] == "Output throughput vs request rate"
    assert [t["x"] for t in fig["data"]] == [[1.0, 2.0]]


def test_a_trace_level_shows_its_lateness_and_says_when_the_client_fell_behind(client):
    pb.sign_in(client)
    on_time = {"concurrency": 8, "completed": 12, "p99_lateness_ms": 3.2, "max_lateness_ms": 4.0}
    behind = {
        "concurrency": 1,
        "completed": 12,
        "p99_lateness_ms": 830.0,
        "max_lateness_ms": 1210.0,
        "raw": {"late_requests": 9},
    }
    deployment = pb.deployment()
    trace = pb.run(deployment, label="trace", levels=[on_time, behind])
    plain = pb.run(deployment, label="plain", levels=LEVELS)

    html = client.get(f"/runs/{trace.uuid}/").content.decode()
    other = client.get(f"/runs/{plain.uuid}/").content.decode()

    assert 'p99 lateness<br><span class="unit">ms</span>' in html and ">830.0<" in html
    [note] = re.findall(r'<p class="small trace-late"[^>]*>(.*?)</p>', html)
    assert note.startswith("<strong>Concurrency 1:</strong> The client could not keep up")
    assert "9 requests went more than 50 ms after their time" in note
    # a run of no trace neither shows the columns nor names them as missing
    assert "lateness" not in other
