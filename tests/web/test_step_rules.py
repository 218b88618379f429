"""The findings of a profiled level's step breakdown (moeops.insights.rules.steps): each fires at
its threshold and not below it, states only what the breakdown shows, and reaches the run's
findings through the analysis."""

import pytest

from moeops.insights.rules import run_data
from moeops.insights.rules import steps as step_rules
from moeops.insights.services import run_analyze
from moeops.runs import measurements
from tests import page_base as pb
from tests import step_breakdowns as sb


def _data(shares, device="gpu", top=None, **parameters):
    body = sb.captured(
        64, breakdown=sb.breakdown(kinds=[sb.kind(shares=shares, top=top)]).model_dump()
    )
    if device != "gpu":
        dump = body.model_dump()
        for rank in dump["breakdown"]["ranks"]:
            rank["device"] = device
        body = type(body).model_validate(dump)
    return run_data.RunData(parameters=parameters, profiles=[body])


def _titles(rule, data):
    return [p.title for p in rule(data)]


@pytest.mark.parametrize(
    "rule, name, threshold",
    [
        (step_rules.host_bound, "idle", step_rules.HOST_BOUND_IDLE),
        (step_rules.communication_bound, "communication", step_rules.COMMUNICATION_BOUND),
        (step_rules.moe_bound, "moe", step_rules.MOE_BOUND),
        (step_rules.attention_bound, "attention", step_rules.ATTENTION_BOUND),
    ],
)
def test_each_rule_fires_at_its_threshold_and_not_below(rule, name, threshold):
    at = rule(_data({name: threshold}))
    below = rule(_data({name: threshold - 0.01}))

    assert len(at) == 1 and below == []
    (finding,) = at
    assert finding.evidence["concurrency"] == 64
    assert finding.evidence["decode_share_fraction"][name] == threshold
    assert finding.evidence["steps_counted"] == {"decode": 80}
    assert finding.evidence["chart"]["x"][0] == "moe"
    assert finding.plan


def test_host_bound_says_how_idle_the_gpus_are():
    (finding,) = step_rules.host_bound(_data({"idle": 0.22}))

    assert finding.text.startswith(
        "The GPUs are idle 22 % of each decode step between kernels at concurrency 64: the "
        "engine's CPU side limits it"
    )


def test_a_cpu_traces_gaps_are_not_read_as_idle_gpus():
    assert step_rules.host_bound(_data({"idle": 0.5}, device="cpu")) == []


def test_an_all_gather_beside_a_norm_says_nothing_of_the_fusion():
    top = {
        "communication": [("ncclDevKernel_AllGather_RING_LL", 4000.0)],
        "norm": [("vllm::rms_norm_kernel<bf16>", 900.0)],
    }

    (finding,) = step_rules.communication_bound(_data({"communication": 0.31}, top=top))

    assert finding.text == (
        "Communication between the ranks takes 31 % of each decode step at concurrency 64."
    )


def test_the_fusion_is_named_only_where_the_names_show_both_kernels():
    top = {
        "communication": [("cross_device_reduce_1stage<bf16>", 4000.0)],
        "norm": [("vllm::rms_norm_kernel<bf16>", 900.0)],
    }
    fused = {
        "communication": [("flashinfer::allreduce_fusion_kernel<bf16>", 4000.0)],
        "norm": [("vllm::rms_norm_kernel<bf16>", 900.0)],
    }
    no_norm = {"communication": [("vllm::all_reduce<bf16>", 4000.0)]}

    (unfused,) = step_rules.communication_bound(_data({"communication": 0.31}, top=top))
    (with_fusion,) = step_rules.communication_bound(_data({"communication": 0.31}, top=fused))
    (without_norm,) = step_rules.communication_bound(_data({"communication": 0.31}, top=no_norm))

    assert "the fused all-reduce + norm is not running" in unfused.text
    assert unfused.plan[0].startswith("Run the fused all-reduce + RMSNorm")
    assert unfused.evidence["unfused_all_reduce"] == [
        "cross_device_reduce_1stage<bf16>",
        "vllm::rms_norm_kernel<bf16>",
    ]
    for finding in (with_fusion, without_norm):
        assert "fused" not in finding.text
        assert finding.evidence["unfused_all_reduce"] is None


def test_moe_bound_says_the_most_a_tune_can_win():
    (finding,) = step_rules.moe_bound(_data({"moe": 0.45}))

    assert "a tune of the fused-MoE kernel" in finding.text
    assert "can win at most that share" in finding.text
    assert finding.evidence["most_to_win_fraction"] == 0.45
    assert finding.plan == ["Tune the fused-MoE kernel (at most 45 % of a decode step to win)"]


def test_attention_bound_names_the_context():
    data = _data({"attention": 0.43}, input_len=8192, output_len=1024)

    (finding,) = step_rules.attention_bound(data)

    assert "with contexts of up to 9,216 tokens" in finding.text
    assert finding.evidence["context_tokens"] == 9216


def test_a_profile_without_a_breakdown_proposes_nothing():
    data = run_data.RunData(profiles=[sb.unavailable(64)])

    assert [p for rule in step_rules.RULES for p in rule(data)] == []


def test_a_breakdown_without_decode_steps_proposes_nothing():
    body = sb.captured(
        64, breakdown=sb.breakdown(kinds=[sb.kind("prefill", shares={"idle": 0.9})]).model_dump()
    )

    assert step_rules.host_bound(run_data.RunData(profiles=[body])) == []


@pytest.mark.django_db
def test_the_runs_analysis_reads_its_profiles():
    run = pb.run(pb.deployment(), levels=[{"concurrency": 64, "output_throughput": 1000.0}])
    measurements.profile_record(
        run=run, body=sb.captured(64, shares={"idle": 0.3}), source="upload"
    )

    findings = run_analyze(run=run)

    (host,) = [f for f in findings if f.key.startswith("step-host-bound")]
    assert host.kind == "other" and host.run == run
    assert host.evidence["idle_fraction"] == 0.3
