"""The run page in Debian's headless Chromium: what a person sees is laid out so that it reads —
nothing drawn over anything, a live run's table and charts in step, the engine's whole account
of itself folded behind what the recipe passed, the per-level table's key columns first.

Every test fails on a JavaScript console error; screenshots land in test-artifacts/.
"""

import pytest
from django.contrib.auth.models import User

from domain import launch
from moeops.runs.keys import level_key
from moeops.runs.models import LevelResult
from tests import page_base as pb
from tests.browser import ARTIFACTS, PASSWORD, chart_traces, log_in, shot

pytest_plugins = ["tests.browser"]

pytestmark = pytest.mark.browser

LEVELS = [
    {
        "concurrency": c,
        "completed": 64,
        "failed": 0,
        "duration": 30.0 * i,
        "output_throughput": t,
        "total_token_throughput": 2 * t,
        "median_ttft_ms": 10.0**i,
        "p99_ttft_ms": 3 * 10.0**i,
        "median_tpot_ms": 20.0 * i,
        "p99_tpot_ms": 25.0 * i,
        "median_itl_ms": 19.0 * i,
        "p99_itl_ms": 40.0 * i,
        "p99_e2el_ms": 3000.0 * i,
        "mean_e2el_ms": 2000.0 * i,
    }
    for i, (c, t) in enumerate(((32, 400.0), (64, 700.0), (128, 806.0)), 1)
]


@pytest.fixture
def member(db):
    return User.objects.create_user("dana", password=PASSWORD)


def _box(page, selector):
    box = page.locator(selector).first.bounding_box()
    assert box is not None, f"{selector} is not drawn"
    return box


def _overlap(a, b):
    """Whether two bounding boxes share any area."""
    return (
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and b["y"] < a["y"] + a["height"]
    )


def _charts_apart(page, first, second):
    """Each chart's drawing stays inside its own box, and the two boxes do not meet."""
    for element_id in (first, second):
        outer = _box(page, f"#{element_id}")
        svg = _box(page, f"#{element_id} .main-svg")
        assert svg["x"] + svg["width"] <= outer["x"] + outer["width"] + 1, element_id
    assert not _overlap(_box(page, f"#{first} .main-svg"), _box(page, f"#{second} .main-svg"))


@pytest.mark.parametrize(("width", "engine"), [(1440, "standin"), (1100, "vllm"), (800, "standin")])
def test_the_log_toggle_sits_clear_of_the_ttft_title(page, member, width, engine):
    # the stand-in's title is the longest: it says its numbers are no measurement
    snapshot = {"engine": {"engine": engine}}
    run = pb.run(pb.deployment(), "three levels", levels=LEVELS, snapshot=snapshot)
    page.set_viewport_size({"width": width, "height": 1000})
    log_in(page, member)
    page.goto(f"{page.base}/runs/{run.uuid}/")
    chart_traces(page, "ttft")
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#ttft").screenshot(path=str(ARTIFACTS / f"run-page-ttft-{width}-{engine}.png"))
    title = _box(page, "#ttft .gtitle")
    for button in page.locator("#ttft .updatemenu-button").all():
        assert not _overlap(button.bounding_box(), title)
    # nor over the plot itself
    plot = _box(page, "#ttft .nsewdrag")
    for button in page.locator("#ttft .updatemenu-button").all():
        assert not _overlap(button.bounding_box(), plot)
    _charts_apart(page, "throughput", "ttft")


def test_a_live_run_shows_its_levels_in_the_table_and_the_charts_alike(page, member):
    run = pb.run(pb.deployment(), "live", status="running")
    log_in(page, member)
    page.goto(f"{page.base}/runs/{run.uuid}/")
    assert page.is_visible("#waiting-first-level")
    assert "No levels finished yet" in page.inner_text("#levels")
    for level in LEVELS[:1]:
        LevelResult.objects.create(run=run, key=level_key(level["concurrency"], None), **level)
    page.wait_for_selector("#levels table.levels")
    page.wait_for_function("() => document.getElementById('throughput').data")
    page.locator("label", has_text="All columns").click()
    for level in LEVELS[1:]:
        LevelResult.objects.create(run=run, key=level_key(level["concurrency"], None), **level)
    page.wait_for_function("() => document.querySelectorAll('#levels tbody tr').length === 3")
    page.wait_for_function("() => document.getElementById('ttft').data[0].x.length === 3")
    concurrencies = page.eval_on_selector_all(
        "#levels tbody tr td:first-child", "els => els.map(e => e.innerText.trim())"
    )
    assert concurrencies == ["32", "64", "128"]
    assert [t["n"] for t in chart_traces(page, "throughput")] == [3, 3]
    assert "No levels finished yet" not in page.inner_text("#levels")
    # the table redrawn by the poll keeps "All columns" as it was ticked
    assert page.is_checked("#all-columns") and page.is_visible("#levels th:has-text('duration')")
    run.refresh_from_db()
    assert run.status == "running"
    # before the screenshot: a full-page shot resizes the window, which redraws every chart
    _charts_apart(page, "throughput", "ttft")
    _charts_apart(page, "tpot", "itl")
    _charts_apart(page, "throughput", "tpot")
    shot(page, "run-page-live")


def _managed_run(deployment):
    """A run of a vLLM moeops started from a recipe, with every /server_info key it reported."""
    identity = pb.vllm_identity(max_num_seqs=32)
    # the real /server_info has hundreds of keys; these stand for the ones nobody passed
    identity["args"] |= {f"model_config.option_{i:03}": i for i in range(300)}
    identity["env"] |= {f"VLLM_SETTING_{i:03}": str(i) for i in range(250)}
    # what the worker read of the engine's own defaults: the two it was given are not defaults
    identity["defaults"] = {
        "args": {"scheduler_config.max_num_seqs": 128, "parallel_config.tensor_parallel_size": 1},
        "env": {"VLLM_TUNED_CONFIG_FOLDER": None},
    }
    snapshot = pb.measured(deployment, engine=identity)
    argv = ["vllm", "serve", "zai-org/GLM-5", "--max-num-seqs", "32", "--tensor-parallel-size=8"]
    snapshot["recipe"] = {
        "version": 3,
        "flags": launch.flags(argv),
        "env": {"VLLM_TUNED_CONFIG_FOLDER": "/opt/moe-tuned"},
        "kernel_configs": [],
    }
    return pb.run(deployment, "managed", levels=LEVELS, snapshot=snapshot)


def test_the_launch_arguments_lead_with_what_the_recipe_passed(page, member):
    run = _managed_run(pb.deployment())
    log_in(page, member)
    page.goto(f"{page.base}/runs/{run.uuid}/")
    passed = page.locator("#passed-args tbody tr")
    rows = [passed.nth(i).inner_text().split("\t") for i in range(passed.count())]
    assert rows == [
        ["--max-num-seqs", "32", "32"],
        ["--tensor-parallel-size", "8", "8"],
        ["VLLM_TUNED_CONFIG_FOLDER", "/opt/moe-tuned", "/opt/moe-tuned"],
    ]
    assert "launch recipe" in page.inner_text("#engine-reported")
    # then what is not the engine's default, with the default, in view
    assert page.is_visible("#not-defaults")
    differ = page.locator("#not-defaults tbody tr")
    assert [differ.nth(i).inner_text().split("\t") for i in range(differ.count())] == [
        ["parallel_config.tensor_parallel_size", "8", "1"],
        ["scheduler_config.max_num_seqs", "32", "128"],
        ["VLLM_TUNED_CONFIG_FOLDER", "/opt/moe-tuned", "unset by default"],
    ]
    # the rest of what the engine reported is there, folded
    assert not page.is_visible("#all-args table")
    assert page.locator("#all-args table tr").count() > 500
    page.locator("#all-args summary").click()
    assert page.is_visible("#all-args table")
    page.locator("#all-args summary").click()
    shot(page, "run-page-launch-args")


def test_an_engine_moeops_did_not_start_keeps_its_arguments_folded_and_says_why(page, member):
    deployment = pb.deployment()
    identity = pb.vllm_identity()
    run = pb.run(
        deployment, "external", levels=LEVELS, snapshot=pb.measured(deployment, engine=identity)
    )
    log_in(page, member)
    page.goto(f"{page.base}/runs/{run.uuid}/")
    assert page.locator("#passed-args").count() == 0
    assert "moeops did not start this engine" in page.inner_text("#engine-reported")
    assert not page.is_visible("#all-args table")


def test_the_level_table_shows_its_key_columns_and_the_rest_on_asking(page, member):
    run = pb.run(pb.deployment(), "three levels", levels=LEVELS)
    log_in(page, member)
    page.goto(f"{page.base}/runs/{run.uuid}/")
    headers = page.eval_on_selector_all(
        "table.levels thead th", "els => els.filter(e => e.offsetParent).map(e => e.innerText)"
    )
    heads = [h.split("\n")[0] for h in headers]
    assert heads == [*pb.LEVEL_TABLE_FIRST, "p99 E2EL"]
    table, section = _box(page, "table.levels"), _box(page, "#levels")
    assert table["width"] <= section["width"]
    shot(page, "run-page-key-columns")
    page.locator("label", has_text="All columns").click()
    every = page.eval_on_selector_all(
        "table.levels thead th", "els => els.filter(e => e.offsetParent).map(e => e.innerText)"
    )
    assert len(every) > len(heads)
    assert [h.split("\n")[0] for h in every[: len(heads)]] == heads
    assert "p50 ITL" in [h.split("\n")[0] for h in every]
    shot(page, "run-page-all-columns")
