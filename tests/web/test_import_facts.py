"""An imported result file is filed under what it measured: its model, parallelism, GPU count,
engine and version. A file that disagrees with its deployment is refused unless confirmed, and
one of another model feeds none of the deployment's estimates, headlines or comparisons."""

import copy
import json

import pytest

from moeops.engines.models import EngineAction, LaunchRecipe
from moeops.fleet.models import Deployment, ModelSpec
from moeops.front.views.compare import _presets
from moeops.front.views.deployments import _with_latest_peak
from moeops.insights import services as insights
from moeops.insights.models import Finding
from moeops.runs import services
from moeops.runs.estimate import deployment_pace
from moeops.runs.importers import ResultFileMismatch
from moeops.runs.models import LevelResult, SweepRun, of_the_deployment
from tests import page_base as pb
from tests.api_base import make_world
from tests.fakes import FIXTURES

RESULTS = FIXTURES / "results"
# SGLang 0.5.5.post3 serving Qwen/Qwen2.5-3B-Instruct at TP1 (its server_info)
QWEN = (RESULTS / "TonyLi15-sglang-benchmark__agg_n50_in128_out64_c8.jsonl").read_text()
# vLLM 0.4.0's benchmark_serving.py against mistralai/Mixtral-8x7B-Instruct-v0.1
MIXTRAL = (RESULTS / "vllm_benchmark_serving_0.4.0.json").read_text()


@pytest.fixture
def world(db):
    return make_world()


def _import(deployment, text=QWEN, fmt="sglang", **fields):
    return services.run_import(deployment=deployment, fmt=fmt, text=text, **fields)


def test_a_file_of_another_model_is_refused_saying_what_each_measured(world):
    with pytest.raises(ResultFileMismatch) as caught:
        _import(world.deployment, file_name="agg.jsonl")
    assert str(caught.value) == (
        "the file measured Qwen/Qwen2.5-3B-Instruct at TP1 (1 GPU) on SGLang 0.5.5.post3; the "
        "deployment glm-5-sglang serves GLM-5 at TP8 (8 GPUs) on SGLang (they differ in model, "
        "TP, GPU count)"
    )
    assert caught.value.differences == ["model", "TP", "GPU count"]
    assert not SweepRun.objects.exists() and not LevelResult.objects.exists()


def test_a_vllm_file_of_another_model_is_refused_too(world):
    with pytest.raises(ResultFileMismatch) as caught:
        _import(world.deployment, MIXTRAL, "vllm")
    assert str(caught.value).startswith(
        "the file measured mistralai/Mixtral-8x7B-Instruct-v0.1 on vLLM 0.4.0; the deployment "
        "glm-5-sglang serves GLM-5 at TP8 on SGLang (they differ in model, engine)"
    )
    assert not SweepRun.objects.exists()


def test_confirmed_its_snapshot_holds_what_the_file_measured(world):
    run, created = _import(world.deployment, accept_mismatch=True)
    assert created
    recorded = run.snapshot["deployment"]
    assert recorded["name"] == "glm-5-sglang"
    assert (recorded["model"], recorded["tp"], recorded["ep"]) == (
        "Qwen/Qwen2.5-3B-Instruct",
        1,
        1,
    )
    assert (recorded["engine"], recorded["engine_version"]) == ("sglang", "0.5.5.post3")
    assert recorded["gpus"] == [] and run.snapshot["file"]["stated"]["gpu_count"] == 1
    assert run.snapshot["kernel_shape"] is None  # GLM-5's MoE shape is not Qwen's
    assert run.other_model == "Qwen/Qwen2.5-3B-Instruct"
    assert run.measured_gpu_count() == 1
    assert run.engine_label() == "SGLang 0.5.5.post3"
    assert run.origin() == (
        "imported",
        "imported from a result file; it measured Qwen/Qwen2.5-3B-Instruct",
    )


def test_a_file_of_the_deployments_model_imports_unasked_and_keeps_its_facts(world):
    model = ModelSpec.objects.create(name="Qwen2.5-3B-Instruct", config_json={})
    qwen = Deployment.objects.create(
        name="qwen", model=model, host=world.host, tp=1, engine_version="0.5.5.post3"
    )
    run, created = _import(qwen, file_name="agg.jsonl")
    assert created and run.other_model is None
    # the deployment's name for the model (a compare would otherwise see two models)
    assert run.snapshot["deployment"]["model"] == "Qwen2.5-3B-Instruct"
    assert (run.snapshot["deployment"]["tp"], run.snapshot["deployment"]["gpus"]) == (1, [])
    assert run.snapshot["deployment"]["engine_version"] == "0.5.5.post3"
    assert run.origin() == ("imported", "imported from agg.jsonl")


def test_the_sweep_estimate_never_comes_from_a_file_of_another_model(world):
    measured = world.run(status="succeeded", label="GLM-5 sweep")
    pb.level(measured, 8, output_throughput=900.0, median_tpot_ms=40.0)
    imported, _ = _import(world.deployment, accept_mismatch=True)
    assert imported.levels.get().median_tpot_ms is not None  # it would be the newest TPOT
    pace, _ = deployment_pace(world.deployment)
    assert pace.basis == "the TPOT of GLM-5 sweep"
    assert pace.points == ((8, 0.04),)


def test_no_compare_preset_pairs_a_file_of_another_model(world):
    imported, _ = _import(world.deployment, accept_mismatch=True)
    # the same snapshot but for the model: a pair that differs "in the model alone"
    snapshot = copy.deepcopy(imported.snapshot)
    snapshot["deployment"]["model"] = "GLM-5"
    del snapshot["file"]["other_model"]
    own = world.run(status="succeeded", label="GLM-5 sweep", snapshot=snapshot)
    pb.level(own, 8, output_throughput=900.0)
    by_model = dict((name, url) for name, url, _ in _presets())["By model"]
    assert by_model is None


def test_a_vllm_file_of_another_model_naming_no_engine_is_not_labelled_the_deployments(world):
    text = (RESULTS / "vllm_bench_serve_0.11.json").read_text()  # backend openai-chat
    run, _ = _import(world.deployment, text, "vllm", accept_mismatch=True)
    assert run.other_model == "zai-org/GLM-5-FP8"
    assert run.snapshot["deployment"]["engine"] is None
    assert run.engine_label() == "unknown"


def test_a_file_of_another_model_makes_no_finding_of_the_deployment(world):
    run, _ = _import(world.deployment, accept_mismatch=True)
    assert insights.run_analyze(run=run) == []
    assert not Finding.objects.exists()


# SGLang prefill/decode: server_info holds "prefill" and "decode" lists, one server each
# (Qwen/Qwen2.5-3B-Instruct at TP1; SGLang 0.5.5.post3 prefilling, 0.5.6 decoding)
PD = (RESULTS / "TonyLi15-sglang-benchmark__pd_1p2d_n100_in512_out128_c64.jsonl").read_text()


def test_a_prefill_decode_file_is_refused_saying_what_its_servers_measured(world):
    with pytest.raises(ResultFileMismatch) as caught:
        _import(world.deployment, PD, file_name="pd.jsonl")
    assert str(caught.value) == (
        "the file measured Qwen/Qwen2.5-3B-Instruct at TP1 (2 GPUs) on SGLang 0.5.5.post3 / "
        "0.5.6; the deployment glm-5-sglang serves GLM-5 at TP8 (8 GPUs) on SGLang (they "
        "differ in model, TP, GPU count)"
    )
    assert not SweepRun.objects.exists()


def test_a_prefill_decode_file_confirmed_into_a_vllm_deployment_keeps_its_model(world):
    world.deployment.engine = "vllm"
    world.deployment.save()
    with pytest.raises(ResultFileMismatch) as caught:
        _import(world.deployment, PD)
    assert "an unnamed model" not in str(caught.value)
    run, _ = _import(world.deployment, PD, accept_mismatch=True)
    assert run.other_model == "Qwen/Qwen2.5-3B-Instruct"
    stated = run.snapshot["file"]["stated"]
    assert (stated["model"], stated["tp"], stated["gpu_count"]) == (
        "Qwen/Qwen2.5-3B-Instruct",
        1,
        2,
    )
    assert run.snapshot["deployment"]["model"] == "Qwen/Qwen2.5-3B-Instruct"
    assert run.measured_gpu_count() == 2


def test_a_file_naming_no_model_is_never_filed_as_the_deployments(world):
    line = json.loads(QWEN)
    del line["server_info"]
    with pytest.raises(ResultFileMismatch) as caught:
        _import(world.deployment, json.dumps(line))
    assert str(caught.value).startswith("the file measured an unnamed model on SGLang;")
    run, _ = _import(world.deployment, json.dumps(line), accept_mismatch=True)
    assert run.other_model == "an unnamed model"
    assert run.snapshot["deployment"]["model"] is None


def _measured(world, label, throughput, **fields):
    run = world.run(status="succeeded", label=label, **fields)
    pb.level(run, 8, output_throughput=throughput)
    return run


def test_a_confirmed_import_of_another_model_is_no_headline_and_is_listed_with_its_model(
    world, client
):
    world.deployment.engine = "vllm"
    world.deployment.save()
    _measured(world, "GLM-5 sweep", 912.0)
    _import(world.deployment, PD, accept_mismatch=True)
    [deployment] = _with_latest_peak(Deployment.objects.filter(pk=world.deployment.pk))
    assert deployment.latest_peak == 912.0
    pb.sign_in(client)
    html = client.get(world.deployment.get_absolute_url()).content.decode()
    table = html.split("<h2>Runs</h2>")[1]
    assert "<th>Model</th>" in table
    assert "<td>Qwen/Qwen2.5-3B-Instruct</td>" in table and "<td>GLM-5</td>" in table


def test_a_file_of_the_same_model_confirmed_across_a_tp_mismatch_feeds_no_headline(world):
    model = ModelSpec.objects.create(name="Qwen2.5-3B-Instruct", config_json={})
    qwen = Deployment.objects.create(name="qwen", model=model, host=world.host, tp=2)
    _measured(world, "Qwen sweep", 100.0, deployment=qwen)
    run, _ = _import(qwen, accept_mismatch=True)  # TP1 in the file
    assert run.other_model is None and run.snapshot["file"]["mismatch"] == ["TP", "GPU count"]
    [deployment] = _with_latest_peak(Deployment.objects.filter(pk=qwen.pk))
    assert deployment.latest_peak == 100.0
    assert run.stands_aside() and insights.run_analyze(run=run) == []


def test_a_bisection_try_feeds_no_headline_or_finding(world):
    _measured(world, "GLM-5 sweep", 912.0)
    step = _measured(world, "bisection try", 300.0)
    recipe = LaunchRecipe.objects.create(deployment=world.deployment, version=1, argv=["sglang"])
    EngineAction.objects.create(
        deployment=world.deployment, kind="bisect", recipe=recipe, after_run=step
    )
    [deployment] = _with_latest_peak(Deployment.objects.filter(pk=world.deployment.pk))
    assert deployment.latest_peak == 912.0
    assert list(of_the_deployment(world.deployment.runs)) != [] and step.stands_aside()
    assert step not in of_the_deployment(world.deployment.runs)
    assert insights.run_analyze(run=step) == []
