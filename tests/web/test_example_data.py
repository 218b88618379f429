import pytest

from moeops.examples import HAND_WRITTEN_FINDING, HAND_WRITTEN_RULE, WRITEUP, load_example_data
from moeops.fleet.models import Deployment, ModelSpec, TopologySnapshot
from moeops.insights.models import Finding, IncompatibilityRule, Note, PlanItem
from moeops.insights.services import run_analyze
from moeops.runs.models import LevelResult, SweepRun
from moeops.runs.samples import TelemetrySample

pytestmark = pytest.mark.django_db


def _counts():
    return [
        m.objects.count()
        for m in (
            ModelSpec,
            Deployment,
            TopologySnapshot,
            SweepRun,
            LevelResult,
            TelemetrySample,
            Finding,
            PlanItem,
            Note,
            IncompatibilityRule,
        )
    ]


def test_it_loads_the_write_up_figures():
    load_example_data()
    run = SweepRun.objects.get(label="Concurrency sweep (write-up)")
    curve = list(run.levels.order_by("concurrency").values_list("concurrency", "output_throughput"))
    assert curve == [(128, 806.0), (256, 879.0), (512, 912.0)]
    assert run.deployment.max_running_requests == 64
    assert run.topology_snapshot.virtualization == "container"
    assert run.topology_snapshot.virtualization_technology == "lxc"
    samples = run.telemetry.all()
    assert samples.count() == 8
    assert {(s.power_w, s.power_limit_w, s.gpu_util) for s in samples} == {(85.0, 600.0, 0.0)}


def test_it_reads_the_glm5_moe_shape_from_config_json():
    load_example_data()
    glm5 = ModelSpec.objects.get(name="GLM-5-NVFP4")
    assert (glm5.num_experts, glm5.topk, glm5.moe_intermediate_size, glm5.hidden_size) == (
        256,
        8,
        2048,
        6144,
    )
    assert glm5.quantization == "nvfp4"


def test_kimi_k2_before_and_after_tuning():
    load_example_data()
    before = SweepRun.objects.get(label__startswith="Before MoE kernel tuning")
    after = SweepRun.objects.get(label__startswith="After MoE kernel tuning")
    peaks = dict(SweepRun.objects.with_summary().values_list("pk", "peak"))
    assert (peaks[before.pk], peaks[after.pk]) == (800.0, 5800.0)
    # the write-up gives no concurrency for these figures, so none is invented
    assert after.levels.get().concurrency is None
    assert before.topology_snapshot.virtualization_technology == "kvm"


def test_everything_is_marked_as_from_the_write_up():
    load_example_data()
    for model in (ModelSpec, Deployment, SweepRun, PlanItem, Note):
        rows = list(model.objects.all())
        assert rows and all(WRITEUP in row.provenance for row in rows), model


def test_it_seeds_the_todo_list_and_no_hand_written_rule():
    deployment = load_example_data()
    assert not IncompatibilityRule.objects.exists()
    assert not Finding.objects.exists()
    plan = list(deployment.plan_items.values_list("status", flat=True))
    assert plan == ["completed", "in_progress", "pending"]


def test_the_sweep_records_sglangs_own_fusion_decision_as_a_worker_would():
    load_example_data()
    run = SweepRun.objects.get(label="Concurrency sweep (write-up)")

    paths = run.recorded().engine_paths
    assert (paths["engine"], paths["version"], paths["capability"], paths["tp"]) == (
        "sglang",
        "0.5.23",
        "12.0",
        8,
    )
    (fusion,) = paths["rows"]
    assert (fusion["key"], fusion["state"]) == ("allreduce_rms_fusion", "off")
    assert fusion["evidence"][0]["where"] == (
        "sglang/srt/arg_groups/overrides.py _flashinfer_allreduce_fusion_auto_enable, SGLang 0.5.23"
    )


def test_the_fusion_finding_comes_from_the_engine_paths():
    load_example_data()
    run = SweepRun.objects.get(label="Concurrency sweep (write-up)")

    run_analyze(run=run)

    finding = Finding.objects.get(run=run, key__startswith="path-not-here")
    assert finding.source == "auto" and finding.severity == "warning"
    assert finding.title == (
        "SGLang 0.5.23 runs no all-reduce + RMSNorm fusion on compute capability 12.0"
    )
    assert finding.text.startswith(
        "SGLang 0.5.23 enables all-reduce + RMSNorm fusion only on compute capability 9.0 and "
        "10.x; this GPU is 12.0, so each layer runs its all-reduce and its norm apart."
    )
    assert finding.evidence["source"].endswith(
        "_flashinfer_allreduce_fusion_auto_enable, SGLang 0.5.23"
    )
    assert not Finding.objects.filter(kind="incompatibility").exists()


def test_loading_again_removes_the_hand_written_rule_and_finding():
    deployment = load_example_data()
    rule = IncompatibilityRule.objects.create(
        name=HAND_WRITTEN_RULE, compute_capability="12.0", provenance=WRITEUP
    )
    Finding.objects.create(
        deployment=deployment,
        kind="incompatibility",
        key=HAND_WRITTEN_FINDING,
        title="FlashInfer allreduce fusion is unsupported on SM120",
        source="human",
        provenance=WRITEUP,
    )

    load_example_data()

    assert not IncompatibilityRule.objects.filter(pk=rule.pk).exists()
    assert not Finding.objects.filter(key=HAND_WRITTEN_FINDING).exists()


def test_loading_twice_changes_nothing():
    load_example_data()
    first = _counts()
    load_example_data()
    assert _counts() == first


def test_loading_again_after_a_provenance_reword_adds_no_snapshot():
    load_example_data()
    TopologySnapshot.objects.update(provenance="From the write-up (an older wording)")
    first = _counts()
    load_example_data()
    assert _counts() == first
    assert set(TopologySnapshot.objects.values_list("provenance", flat=True)) == {WRITEUP}
