"""run_analyze on the database: the write-up's data, re-analysis, people's states, plan items."""

import io
import json
import statistics
from datetime import timedelta

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.core.management import CommandError, call_command
from django.utils import timezone

from domain.intervals import median_interval
from moeops import jobs
from moeops.examples import load_example_data
from moeops.fleet import services as fleet_services
from moeops.fleet.models import GPU, Deployment, Host, ModelSpec, TopologySnapshot
from moeops.insights import services
from moeops.insights.models import Finding, IncompatibilityRule, PlanItem
from moeops.kernels.models import KernelConfig, TuningRun
from moeops.runs.models import LevelResult, LevelRound, SweepRun
from moeops.runs.samples import EngineSample, TelemetrySample
from tests import fakes
from tests import page_base as pb

pytestmark = pytest.mark.django_db
FIXTURES = fakes.FIXTURES

MIXTRAL = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
}
PARAMS = {"levels": [32, 64, 128], "input_len": 1024, "output_len": 256}


def write_up_sweep():
    load_example_data()
    return SweepRun.objects.get(label="Concurrency sweep (write-up)")


def auto(run=None, **filters):
    qs = Finding.objects.filter(source="auto", **filters)
    return qs.filter(run=run) if run is not None else qs


@pytest.fixture
def h200_deployment():
    host = Host.objects.create(name="h200-x2")
    gpus = [
        GPU.objects.create(
            host=host, index=i, name="NVIDIA H200", compute_capability="9.0", power_limit_w=700.0
        )
        for i in range(2)
    ]
    model = ModelSpec(name="Mixtral-8x7B", config_json=MIXTRAL)
    model.fill_shape()
    model.save()
    deployment = Deployment.objects.create(
        name="mixtral", model=model, host=host, tp=2, max_running_requests=64
    )
    deployment.gpus.set(gpus)
    return deployment


def make_run(deployment, curve, parameters=PARAMS, created=None, **fields):
    run = SweepRun.objects.create(
        deployment=deployment, status="succeeded", parameters=parameters, **fields
    )
    if created is not None:
        SweepRun.objects.filter(pk=run.pk).update(created=created)
        run.refresh_from_db()
    for concurrency, throughput in curve:
        pb.level(run, concurrency, output_throughput=throughput)
    return run


# -- the write-up's example data --------------------------------------------------------------


def test_the_write_up_sweep_is_flagged_as_a_plateau():
    run = write_up_sweep()

    services.run_analyze(run=run)

    plateau = auto(run, kind="plateau").get()
    assert plateau.evidence["plateau_at"] == 128
    assert plateau.evidence["output_throughput"] == [806.0, 879.0, 912.0]
    assert PlanItem.objects.filter(
        finding=plateau, title="Find the bottleneck behind the throughput plateau", source="auto"
    ).exists()


def test_the_write_up_readings_show_idle_gpus_as_info_and_the_cap_below_the_load():
    run = write_up_sweep()

    services.run_analyze(run=run)

    idle = auto(run, kind="idle_gpus").get()
    assert idle.severity == "info"
    assert idle.evidence["mean_gpu_util_percent"] == 0.0
    assert idle.evidence["power_fraction"] == pytest.approx(0.1417, abs=1e-4)
    assert "85 W of 600 W (14%)" in idle.title
    queueing = auto(run, kind="queueing").get()
    assert queueing.evidence["cap"] == 64 and queueing.evidence["basis"] == "configuration"


@pytest.fixture
def sm120_rule():
    """An incompatibility rule as a team writes one in the admin (the example data has none)."""
    return IncompatibilityRule.objects.create(
        name="FlashInfer allreduce fusion on SM120",
        compute_capability="12.0",
        launch_argument="allreduce_fusion",
        launch_value="True",
        severity="critical",
        finding_text="FlashInfer allreduce fusion is enabled on SM120 GPUs. Turn it off.",
    )


def test_the_sm120_rule_does_not_fire_while_allreduce_fusion_is_unset(sm120_rule):
    run = write_up_sweep()
    assert run.deployment.allreduce_fusion is None

    services.run_analyze(run=run)

    assert not auto(kind="incompatibility").exists()


def test_the_sm120_rule_fires_when_allreduce_fusion_is_on(sm120_rule):
    run = write_up_sweep()
    Deployment.objects.filter(pk=run.deployment_id).update(allreduce_fusion=True)
    rule = sm120_rule

    services.run_analyze(run=run)

    finding = auto(kind="incompatibility").get()
    assert finding.run is None and finding.key == f"rule-{rule.pk}"
    assert finding.severity == "critical" and finding.note == rule.note
    assert finding.text == rule.finding_text


def test_the_flag_the_engine_reported_overrides_the_hand_set_one(sm120_rule):
    run = write_up_sweep()
    Deployment.objects.filter(pk=run.deployment_id).update(allreduce_fusion=True)
    # SGLang's /get_server_info, as the worker records it when the sweep starts
    run.snapshot["engine"] = {
        "engine": "sglang",
        "args": {"enable_flashinfer_allreduce_fusion": False},
        "allreduce_fusion": False,
    }
    run.save(update_fields=["snapshot"])

    services.run_analyze(run=run)

    assert not auto(kind="incompatibility").exists()


def test_a_disabled_rule_does_not_fire(sm120_rule):
    run = write_up_sweep()
    Deployment.objects.filter(pk=run.deployment_id).update(allreduce_fusion=True)
    IncompatibilityRule.objects.update(enabled=False)

    services.run_analyze(run=run)

    assert not auto(kind="incompatibility").exists()


def test_the_nvfp4_deployment_is_told_no_triton_config_applies():
    run = write_up_sweep()

    services.run_analyze(run=run)

    assert not auto(kind="no_tuned_kernel").exists()
    note = auto(kind="other", run__isnull=True).get()
    assert "nvfp4" in note.title


def test_the_kimi_runs_without_telemetry_get_no_gpu_evidence_not_idle_gpus():
    load_example_data()
    run = SweepRun.objects.get(label__startswith="Before MoE kernel tuning")

    services.run_analyze(run=run)

    assert not auto(kind="idle_gpus").exists()
    assert auto(run, key="no-gpu-evidence").get().severity == "info"
    assert not auto(kind="plateau").exists()


def test_analyzing_twice_adds_no_finding_and_no_plan_item():
    run = write_up_sweep()

    first = services.run_analyze(run=run)
    counts = (Finding.objects.count(), PlanItem.objects.count())
    second = services.run_analyze(run=run)

    assert (Finding.objects.count(), PlanItem.objects.count()) == counts
    assert [f.pk for f in first] == [f.pk for f in second]


def test_dismissed_and_confirmed_findings_stay_as_a_person_left_them():
    run = write_up_sweep()
    services.run_analyze(run=run)
    user = User.objects.create_user("ana")
    plateau = auto(run, kind="plateau").get()
    idle = auto(run, kind="idle_gpus").get()
    services.finding_set_state(finding=plateau, state="dismissed", user=user)
    services.finding_set_state(finding=idle, state="confirmed", user=user)

    services.run_analyze(run=run)

    plateau.refresh_from_db()
    idle.refresh_from_db()
    assert (plateau.state, idle.state) == ("dismissed", "confirmed")
    assert plateau.state_changed_by == user and plateau.state_changed_at is not None
    assert auto(run, kind="plateau").count() == 1


def test_a_dismissed_finding_stays_when_its_rule_stops_firing():
    run = write_up_sweep()
    services.run_analyze(run=run)
    plateau = auto(run, kind="plateau").get()
    services.finding_set_state(finding=plateau, state="dismissed", user=None)
    LevelResult.objects.filter(run=run, concurrency=512).update(output_throughput=2000.0)

    services.run_analyze(run=run)

    assert Finding.objects.get(pk=plateau.pk).state == "dismissed"


def test_an_open_finding_whose_rule_no_longer_fires_is_removed():
    run = write_up_sweep()
    services.run_analyze(run=run)
    LevelResult.objects.filter(run=run, concurrency=256).update(output_throughput=1400.0)
    LevelResult.objects.filter(run=run, concurrency=512).update(output_throughput=2400.0)

    services.run_analyze(run=run)

    assert not auto(run, kind="plateau").exists()


def test_people_s_findings_are_left_alone():
    run = write_up_sweep()
    human = Finding.objects.create(
        deployment=run.deployment,
        kind="incompatibility",
        key="sm120-allreduce-fusion",
        severity="warning",
        title="FlashInfer allreduce fusion is unsupported on SM120",
        evidence={"compute_capability": "12.0", "engine": "sglang"},
        source="human",
    )
    before = (human.title, human.evidence, human.state)

    services.run_analyze(run=run)

    human.refresh_from_db()
    assert (human.title, human.evidence, human.state) == before


def test_finding_set_state_rejects_an_unknown_state_and_an_anonymous_user_is_not_recorded():
    run = write_up_sweep()
    services.run_analyze(run=run)
    finding = auto(run, kind="plateau").get()

    with pytest.raises(ValueError):
        services.finding_set_state(finding=finding, state="resolved", user=None)
    services.finding_set_state(finding=finding, state="confirmed", user=AnonymousUser())

    finding.refresh_from_db()
    assert finding.state == "confirmed" and finding.state_changed_by is None


def test_finding_set_state_with_expected_is_a_compare_and_set():
    run = write_up_sweep()
    services.run_analyze(run=run)
    finding = auto(run, kind="plateau").get()
    stale_page = Finding.objects.get(pk=finding.pk)
    assert services.finding_set_state(
        finding=finding, state="confirmed", user=None, expected="open"
    )

    changed = services.finding_set_state(
        finding=stale_page, state="dismissed", user=None, expected="open"
    )

    assert not changed and Finding.objects.get(pk=finding.pk).state == "confirmed"


def test_it_refuses_a_run_that_has_not_finished():
    run = write_up_sweep()
    SweepRun.objects.filter(pk=run.pk).update(status="running")
    run.refresh_from_db()

    with pytest.raises(ValueError, match="not finished"):
        services.run_analyze(run=run)


# -- plan items ------------------------------------------------------------------------------


def test_a_plan_item_is_proposed_once_per_deployment(h200_deployment):
    a = make_run(h200_deployment, [(32, 800.0), (64, 820.0), (128, 830.0)])
    b = make_run(h200_deployment, [(32, 700.0), (64, 720.0), (128, 725.0)])

    services.run_analyze(run=a)
    services.run_analyze(run=b)

    titles = list(h200_deployment.plan_items.values_list("title", flat=True))
    assert titles.count("Find the bottleneck behind the throughput plateau") == 1
    assert auto(kind="plateau").count() == 2


def test_a_completed_plan_item_is_proposed_again_by_a_new_finding(h200_deployment):
    a = make_run(h200_deployment, [(32, 800.0), (64, 820.0), (128, 830.0)])
    services.run_analyze(run=a)
    PlanItem.objects.update(status="completed")
    b = make_run(h200_deployment, [(32, 700.0), (64, 720.0), (128, 725.0)])

    services.run_analyze(run=b)

    assert h200_deployment.plan_items.filter(
        title="Find the bottleneck behind the throughput plateau", status="pending"
    ).exists()


def test_plan_items_follow_the_deployment_s_list(h200_deployment):
    PlanItem.objects.create(deployment=h200_deployment, title="Check the server", position=4)
    run = make_run(h200_deployment, [(32, 800.0), (64, 820.0), (128, 830.0)])

    services.run_analyze(run=run)

    positions = list(h200_deployment.plan_items.values_list("position", flat=True))
    assert positions == sorted(positions) and positions[0] == 4 and len(set(positions)) > 2


# -- rules that read other rows ----------------------------------------------------------------


def test_no_tuned_kernel_until_a_config_is_on_record(h200_deployment):
    run = make_run(h200_deployment, [(32, 800.0)])

    services.run_analyze(run=run)

    finding = auto(kind="no_tuned_kernel").get()
    # Mixtral at tp 2: 8 experts, N = 14336 / 2
    assert finding.run is None
    assert finding.evidence["tune"] == {
        "device_name": "NVIDIA H200",
        "E": 8,
        "N": 7168,
        "hidden_size": 4096,
        "topk": 2,
        "dtype": "bf16",
        "block_shape": None,
    }
    assert PlanItem.objects.filter(
        finding=finding, title="Tune the fused-MoE kernel for NVIDIA H200 E=8 N=7168 bf16"
    ).exists()

    # SGLang's _down file alone leaves the engine on its default main config
    KernelConfig(
        device_name="NVIDIA_H200", E=8, N=7168, dtype="bf16", down_moe=True, entries={}
    ).save()
    services.run_analyze(run=run)
    assert auto(kind="no_tuned_kernel").exists()

    KernelConfig(device_name="NVIDIA_H200", E=8, N=7168, dtype="bf16", entries={}).save()
    services.run_analyze(run=run)

    assert not auto(kind="no_tuned_kernel").exists()
    assert PlanItem.objects.filter(title__startswith="Tune the fused-MoE kernel").exists()


def test_regression_against_the_previous_comparable_run(h200_deployment):
    now = timezone.now()
    make_run(h200_deployment, [(32, 1000.0), (64, 1600.0)], created=now - timedelta(days=3))
    other_lengths = {**PARAMS, "output_len": 64}
    make_run(h200_deployment, [(32, 9000.0), (64, 9000.0)], other_lengths, now - timedelta(days=2))
    failed = make_run(h200_deployment, [(32, 9000.0)], created=now - timedelta(days=1))
    SweepRun.objects.filter(pk=failed.pk).update(status="failed")
    previous = make_run(h200_deployment, [(32, 1000.0), (64, 1500.0)], created=now)
    run = make_run(h200_deployment, [(32, 980.0), (64, 1200.0)], created=now + timedelta(hours=1))

    services.run_analyze(run=run)

    finding = auto(run, kind="regression").get()
    assert finding.evidence["previous_run"]["uuid"] == str(previous.uuid)
    assert finding.evidence["drop"] == [0.02, 0.2]
    assert services.run_analyze(run=previous) and not auto(previous, kind="regression").exists()


def _with_rounds(run, concurrency, rounds):
    """The run's level at `concurrency` as its rounds of output tok/s give it: each round
    stored, the level their median with its interval, as the level's rounds are stored."""
    level = LevelResult.objects.get(run=run, concurrency=concurrency)
    level.rounds.all().delete()
    for number, value in enumerate(rounds, 1):
        LevelRound.objects.create(
            level=level, round=number, figures={"output_throughput": value}, body_sha256=""
        )
    level.output_throughput = statistics.median(rounds)
    level.intervals = {"output_throughput": list(median_interval(rounds))}
    level.save()


def test_regression_from_rounds_fires_only_beyond_the_noise(h200_deployment):
    now = timezone.now()
    previous = make_run(h200_deployment, [(32, 0.0)], created=now)
    run = make_run(h200_deployment, [(32, 0.0)], created=now + timedelta(hours=1))
    # medians 1,075 -> 975 (-9 %), but rounds spread as real vLLM's do: within the noise
    _with_rounds(previous, 32, [1200.0, 1000.0, 1100.0, 1050.0])
    _with_rounds(run, 32, [1050.0, 850.0, 950.0, 1000.0])

    services.run_analyze(run=run)
    assert not auto(run, kind="regression").exists()

    # about the same medians from tight rounds: beyond the noise
    _with_rounds(previous, 32, [1110.0, 1090.0, 1100.0, 1095.0])
    _with_rounds(run, 32, [960.0, 940.0, 950.0, 955.0])
    services.run_analyze(run=run)

    finding = auto(run, kind="regression").get()
    assert finding.severity == "warning"
    assert "fell from 1,098 (1,090–1,110) in" in finding.text
    assert "to 952 (940–960) in this run" in finding.text
    assert (
        "−13 % [−15 %, −12 %] beyond the noise (a permutation test of their rounds at 5 % "
        "false alarms, p = 0.029)"
    ) in finding.text


def test_a_drop_that_three_rounds_each_cannot_test_is_a_possible_regression(h200_deployment):
    now = timezone.now()
    previous = make_run(h200_deployment, [(32, 0.0)], created=now)
    run = make_run(h200_deployment, [(32, 0.0)], created=now + timedelta(hours=1))
    _with_rounds(previous, 32, [1110.0, 1090.0, 1100.0])
    _with_rounds(run, 32, [960.0, 940.0, 950.0])
    services.run_analyze(run=run)
    finding = auto(run, kind="regression").get()
    assert finding.severity == "info" and finding.title.startswith("Possible regression")
    assert "3 and 3 rounds are too few for a test at 5 % false alarms" in finding.text
    assert "re-run with rounds ≥ 4" in finding.text


def test_no_regression_without_lengths_in_the_parameters(h200_deployment):
    now = timezone.now()
    make_run(h200_deployment, [(32, 1000.0)], {"levels": [32]}, now)
    run = make_run(h200_deployment, [(32, 100.0)], {"levels": [32]}, now + timedelta(hours=1))

    services.run_analyze(run=run)

    assert not auto(kind="regression").exists()


def test_idle_gpus_and_queueing_from_samples_tagged_with_levels(h200_deployment):
    run = make_run(h200_deployment, [(32, 800.0), (128, 900.0)], telemetry_status="recorded")
    TelemetrySample.objects.bulk_create(
        TelemetrySample(
            run=run, gpu_index=i, ts=t, level_concurrency=128, gpu_util=2.0, power_w=100.0
        )
        for i in range(2)
        for t in (1.0, 2.0)
    )
    EngineSample.objects.bulk_create(
        [
            EngineSample(run=run, ts=1.0, level_concurrency=32, running=32, queued=0),
            EngineSample(run=run, ts=2.0, level_concurrency=128, running=64, queued=64),
        ]
    )

    services.run_analyze(run=run)

    idle = auto(run, kind="idle_gpus").get()
    # the limit comes from the GPU rows when samples carry none: 100 W of 700 W
    assert idle.severity == "warning" and idle.evidence["power_fraction"] == 0.1429
    queueing = auto(run, kind="queueing").get()
    assert queueing.severity == "warning" and queueing.evidence["max_queued"] == 64


def test_the_queue_finding_names_the_cap_the_run_ran_under_not_the_deployment_s_since(
    h200_deployment,
):
    snapshot = {"deployment": {"max_running_requests": 64}}
    run = make_run(h200_deployment, [(32, 800.0), (128, 900.0)], snapshot=snapshot)
    EngineSample.objects.bulk_create(
        [EngineSample(run=run, ts=2.0, level_concurrency=128, running=64, queued=64)]
    )
    # the cap was raised after the sweep (as its finding asked)
    Deployment.objects.filter(pk=h200_deployment.pk).update(max_running_requests=256)
    run = SweepRun.objects.get(pk=run.pk)

    services.run_analyze(run=run)

    queueing = auto(run, kind="queueing").get()
    assert (queueing.evidence["cap"], queueing.evidence["cap_source"]) == (64, "deployment")
    titles = set(PlanItem.objects.filter(finding=queueing).values_list("title", flat=True))
    assert "Raise --max-running-requests above 64 and re-sweep" in titles
    assert run.recorded_running_cap() == 64


def test_a_cap_first_filled_in_after_the_sweep_is_the_one_the_queue_finding_names(
    h200_deployment,
):
    snapshot = {"deployment": {"max_running_requests": None}}
    run = make_run(h200_deployment, [(32, 800.0), (128, 900.0)], snapshot=snapshot)
    EngineSample.objects.bulk_create(
        [EngineSample(run=run, ts=2.0, level_concurrency=128, running=64, queued=64)]
    )

    services.run_analyze(run=run)

    queueing = auto(run, kind="queueing").get()
    assert (queueing.evidence["cap"], queueing.evidence["cap_source"]) == (64, "deployment")


def test_a_resumed_level_is_judged_by_the_samples_of_the_attempt_that_stored_it(h200_deployment):
    # the worker died in level 128 (attempt 1), whose GPUs then sat idle; the sweep delivered
    # again ran the level anew (attempt 2) and stored it
    run = make_run(h200_deployment, [(32, 800.0)], telemetry_status="recorded")
    pb.level(run, 128, output_throughput=900.0, attempt=2)

    def gpu(ts, concurrency, util, attempt):
        return TelemetrySample(
            run=run,
            gpu_index=0,
            ts=ts,
            level_concurrency=concurrency,
            gpu_util=util,
            attempt=attempt,
        )

    TelemetrySample.objects.bulk_create(
        [gpu(1.0, 32, 90.0, 1)]
        + [gpu(2.0 + t, 128, 2.0, 1) for t in range(8)]
        + [gpu(20.0 + t, 128, 90.0, 2) for t in range(2)]
    )
    EngineSample.objects.bulk_create(
        [EngineSample(run=run, ts=1.0, level_concurrency=32, running=32, queued=0)]
        + [
            EngineSample(run=run, ts=2.0 + t, level_concurrency=128, running=64, queued=64)
            for t in range(3)
        ]
        + [EngineSample(run=run, ts=20.0, level_concurrency=128, running=64, queued=64, attempt=2)]
    )

    services.run_analyze(run=run)

    # the dead attempt's idle samples would have brought the mean to 26 %, below the 30 % line
    assert not auto(run, kind="idle_gpus").exists()
    queueing = auto(run, kind="queueing").get()
    assert queueing.evidence["engine_samples"] == 2
    assert queueing.evidence["samples_queued_at_cap"] == 1


def test_client_bound_from_the_load_generator_s_own_numbers(h200_deployment):
    run = make_run(h200_deployment, [])
    pb.level(
        run,
        512,
        output_throughput=900.0,
        started_at=100.0,
        finished_at=160.0,
        raw={"client_cpu_s": 58.0, "processes": 1},
    )

    services.run_analyze(run=run)

    finding = auto(run, kind="client_bound").get()
    assert finding.evidence["client_cpu_percent"] == [pytest.approx(96.67, abs=0.01)]


def test_topology_from_the_run_s_snapshot(h200_deployment):
    labels = ["GPU0", "GPU1"]
    snapshot = TopologySnapshot.objects.create(
        host=h200_deployment.host,
        captured_at=timezone.now(),
        virtualization="vm",
        virtualization_technology="kvm",
        p2p={"read": {"labels": labels, "matrix": [["X", "CNS"], ["CNS", "X"]]}, "write": None},
    )
    run = make_run(h200_deployment, [(32, 800.0)], topology_snapshot=snapshot)

    services.run_analyze(run=run)

    assert set(auto(run, kind="topology").values_list("key", flat=True)) == {
        "vm-passthrough",
        "p2p",
    }


def test_a_container_in_a_vm_is_told_its_gpus_are_passed_through_to_the_vm(h200_deployment):
    probed = json.loads((FIXTURES / "topology/probe_1xh200_firecracker.json").read_text())
    snapshot, _, _ = fleet_services.topology_record(host=h200_deployment.host, snapshot=probed)
    run = make_run(h200_deployment, [(32, 800.0)], topology_snapshot=snapshot)

    services.run_analyze(run=run)

    [finding] = auto(run, kind="topology", key="vm-passthrough")
    assert finding.title == "GPUs passed through to a virtual machine (firecracker)"
    assert finding.text.startswith("The GPUs ran in: Container (docker) in a VM (firecracker).")
    assert [layer["kind"] for layer in finding.evidence["layers"]] == ["vm", "container"]


# -- the job-finished hook, command ----------------------------------------------------------


def test_the_job_finished_hook_analyzes_a_finished_run_and_ignores_a_missing_one():
    run = write_up_sweep()

    answer = jobs.job_finished.apply(args=[run._meta.label_lower, run.pk]).get()

    ids = answer["moeops.insights.services.on_run_finished"]
    assert ids and set(ids) == set(auto().values_list("pk", flat=True))
    assert jobs.job_finished.apply(args=["runs.sweeprun", 10**9]).get() == {}


def test_a_finished_tune_is_no_run_to_analyze(h200_deployment):
    tune = TuningRun.objects.create(
        host=h200_deployment.host, E=8, N=64, hidden_size=64, topk=2, status="succeeded"
    )

    assert services.on_run_finished not in jobs.finished_handlers(TuningRun)
    assert "moeops.insights.services.on_run_finished" not in jobs.job_finished(
        "kernels.tuningrun", tune.pk
    )


def test_the_command_analyzes_one_run_by_uuid():
    run = write_up_sweep()
    out = io.StringIO()

    call_command("analyze_run", str(run.uuid), stdout=out)

    assert str(run.uuid) in out.getvalue() and "plateau" in out.getvalue()
    assert auto(run, kind="plateau").exists()


def test_the_command_analyzes_every_finished_run():
    load_example_data()
    out = io.StringIO()

    call_command("analyze_run", "--all", stdout=out)

    assert len(out.getvalue().splitlines()) == SweepRun.objects.count() == 3


NO_RUN = "00000000-0000-0000-0000-000000000000"


@pytest.mark.parametrize("args", [[], ["--all", NO_RUN], ["not-a-uuid"], [NO_RUN]])
def test_the_command_rejects_bad_arguments(args):
    with pytest.raises(CommandError):
        call_command("analyze_run", *args)
