"""The diagnosis rules on hand-built run data (no database): each fires, and each holds back."""

import pytest

from moeops.insights import analysis
from moeops.insights.rules import engine as engine_rules
from moeops.insights.rules import evidence
from moeops.insights.rules import gpus as gpu_rules
from moeops.insights.rules import kernels as kernel_rules
from moeops.insights.rules import load as load_rules
from moeops.insights.rules import regression as regression_rules
from moeops.insights.rules.run_data import (
    EngineSample,
    Gpu,
    GpuSample,
    Level,
    PreviousRun,
    Rule,
    RunData,
    Topology,
)
from tests.fakes import GLM5_TP8_TUNE

GLM5_TP8_SHAPE = {
    "num_experts": 256,
    "experts_per_rank": 256,
    "topk": 8,
    "hidden_size": 6144,
    "moe_intermediate_size": 2048,
    "N": 256,
    "quantization": None,
    "block_shape": None,
}
RTX = "NVIDIA RTX PRO 6000 Blackwell"


def write_up_levels():
    return [Level(128, 806.0), Level(256, 879.0), Level(512, 912.0)]


def eight_gpus(name=RTX, cc="12.0"):
    return [Gpu(i, name, cc, 600.0) for i in range(8)]


def only(proposals, kind):
    found = [p for p in proposals if p.kind == kind]
    assert len(found) == 1, [p.title for p in proposals]
    return found[0]


# -- plateau ---------------------------------------------------------------------------------


def test_plateau_fires_on_the_write_up_curve():
    [p] = load_rules.plateau(RunData(levels=write_up_levels()))

    assert p.kind == "plateau" and p.severity == "warning"
    assert p.evidence["plateau_at"] == 128
    assert p.evidence["gain_per_doubling"] == [
        pytest.approx(0.0906, abs=1e-4),
        pytest.approx(0.0375, abs=1e-4),
    ]
    assert p.evidence["chart"]["x"] == [128, 256, 512]
    assert p.evidence["chart"]["series"][0]["y"] == [806.0, 879.0, 912.0]
    assert "+9.1%" in p.text
    assert p.plan == ["Find the bottleneck behind the throughput plateau"]


def test_a_plateau_at_the_engines_cap_says_so_and_proposes_the_queue_caps_change():
    data = RunData(levels=write_up_levels(), max_running_requests=64, engine="sglang")
    [plateau] = load_rules.plateau(data)
    [queueing] = load_rules.queueing(data)

    assert plateau.title.endswith(", at the engine's cap (--max-running-requests 64)")
    assert "starts at or above the engine's running-request cap" in plateau.text
    assert (plateau.evidence["running_cap"], plateau.evidence["at_running_cap"]) == (64, True)
    # word for word the queue-cap finding's item, first: one action serves both
    assert (
        plateau.plan[0] == queueing.plan[0] == "Raise --max-running-requests above 64 and re-sweep"
    )


def test_a_plateau_at_the_stand_in_s_reported_cap_carries_the_cap_its_plan_item_changes():
    levels = [Level(4, 400.0), Level(8, 790.0), Level(16, 800.0), Level(32, 805.0)]
    observed = {"engine": "standin", "max_running_requests": 8}
    [p] = load_rules.plateau(RunData(levels=levels, engine="standin", observed=observed))

    assert p.evidence["cap"] == 8 and p.evidence["flag"] == "--max-running-requests"
    assert p.evidence["tested_concurrency"] == 32
    # the plan item's change, read from its finding as the page reads it: raise to 32
    assert load_rules.cap_change(p.plan[0], "plateau", p.evidence) == load_rules.CapChange(
        "--max-running-requests", 8, 32
    )
    # the plateau's other items change no cap
    assert load_rules.cap_change(p.plan[-1], "plateau", p.evidence) is None


def test_a_plateau_below_the_cap_proposes_no_cap_change():
    levels = [Level(32, 400.0), Level(64, 410.0), Level(128, 420.0)]
    [p] = load_rules.plateau(RunData(levels=levels, max_running_requests=256, engine="vllm"))

    assert "cap" not in p.title
    assert p.evidence["at_running_cap"] is False
    assert p.plan == ["Find the bottleneck behind the throughput plateau"]


def test_a_level_the_sweep_stopped_inside_is_left_out_of_the_curve():
    levels = [Level(32, 400.0), Level(64, 800.0), Level(128, 810.0, partial=True)]

    assert load_rules.plateau(RunData(levels=levels)) == []


def test_plateau_holds_back_on_a_curve_that_keeps_scaling():
    levels = [Level(32, 400.0), Level(64, 700.0), Level(128, 1200.0), Level(256, 2000.0)]

    assert load_rules.plateau(RunData(levels=levels)) == []


def test_plateau_ignores_a_flat_step_the_curve_recovers_from():
    levels = [Level(32, 400.0), Level(64, 410.0), Level(128, 900.0), Level(256, 1600.0)]

    assert load_rules.plateau(RunData(levels=levels)) == []


def test_plateau_on_the_last_step_only_proposes_sweeping_higher():
    levels = [Level(64, 400.0), Level(128, 700.0), Level(256, 720.0)]

    [p] = load_rules.plateau(RunData(levels=levels))

    assert p.evidence["plateau_at"] == 128
    assert p.plan[0] == "Sweep above concurrency 256 to confirm the plateau"


def test_plateau_normalizes_a_quadrupling_step_to_doublings():
    # +21% over 4× concurrency is +10% per doubling: not flat; +15% over 4× is flat
    assert load_rules.plateau(RunData(levels=[Level(128, 1000.0), Level(512, 1220.0)])) == []
    [p] = load_rules.plateau(RunData(levels=[Level(128, 1000.0), Level(512, 1150.0)]))
    assert p.evidence["plateau_at"] == 128


def test_a_plateau_whose_throughput_falls_says_it_falls():
    levels = [Level(64, 800.0), Level(128, 1000.0), Level(256, 982.0)]

    [p] = load_rules.plateau(RunData(levels=levels))

    assert "Output throughput falls 1.8% per doubling of concurrency after 128" in p.text
    assert "grows" not in p.text


def _rounds(low, median, high):
    """A level's four rounds of output tok/s spanning low–high with `median` twice, and their
    interval (domain.intervals.median_interval of four rounds: their range)."""
    return {"throughput_rounds": (low, median, high, median), "throughput_interval": (low, high)}


def test_a_small_rise_beyond_the_noise_of_rounds_is_no_plateau():
    # +8 % per doubling: flat by the 10 % rule, but the rounds measure a rise
    levels = [
        Level(128, 1000.0, **_rounds(990.0, 1000.0, 1010.0)),
        Level(256, 1080.0, **_rounds(1070.0, 1080.0, 1090.0)),
    ]

    assert load_rules.plateau(RunData(levels=levels)) == []


def test_a_small_rise_within_the_noise_of_rounds_is_a_plateau():
    levels = [
        Level(128, 1000.0, **_rounds(900.0, 1000.0, 1100.0)),
        Level(256, 1080.0, **_rounds(980.0, 1080.0, 1180.0)),
        Level(512, 1100.0, **_rounds(1000.0, 1100.0, 1200.0)),
    ]

    [p] = load_rules.plateau(RunData(levels=levels))

    assert p.evidence["plateau_at"] == 128
    assert p.evidence["within_noise"] == [True, True]
    assert "Every step from there rises within the noise" in p.text


def test_plateau_needs_two_levels_with_concurrency():
    assert load_rules.plateau(RunData(levels=[Level(128, 806.0)])) == []
    assert load_rules.plateau(RunData(levels=[Level(None, 800.0), Level(None, 5800.0)])) == []
    assert load_rules.plateau(RunData(levels=[Level(128, 806.0), Level(256, None)])) == []


# -- idle GPUs -------------------------------------------------------------------------------


def timed_levels():
    return [
        Level(64, 500.0, started_at=100.0, finished_at=200.0),
        Level(128, 600.0, started_at=210.0, finished_at=300.0),
    ]


def test_idle_gpus_fires_on_samples_inside_level_windows():
    samples = [GpuSample(i, ts, None, 3.0, 90.0, 600.0) for i in range(2) for ts in (150, 250)]

    [p] = gpu_rules.idle_gpus(
        RunData(levels=timed_levels(), telemetry_status="recorded", gpu_samples=samples)
    )

    assert (p.kind, p.severity, p.key) == ("idle_gpus", "warning", "under-load")
    assert p.evidence["mean_gpu_util_percent"] == 3.0
    assert p.evidence["power_fraction"] == 0.15
    assert p.evidence["chart"]["x"] == [64, 128]
    assert p.evidence["chart"]["series"][1]["y"] == [15.0, 15.0]
    assert "3% utilization, 90 W of 600 W (15%)" in p.title


def test_idle_gpus_counts_only_samples_while_requests_are_outstanding():
    # busy inside the windows, idle between levels (ts 205) and after the sweep (ts 400)
    samples = [
        GpuSample(0, 150, None, 95.0, 500.0, 600.0),
        GpuSample(0, 205, None, 0.0, 80.0, 600.0),
        GpuSample(0, 400, None, 0.0, 80.0, 600.0),
    ]

    assert (
        gpu_rules.idle_gpus(
            RunData(levels=timed_levels(), telemetry_status="recorded", gpu_samples=samples)
        )
        == []
    )


def test_idle_gpus_uses_level_tags_and_the_deployments_own_gpus():
    samples = [
        GpuSample(0, 1.0, 64, 97.0, 550.0, 600.0),
        # GPU 7 is not the deployment's: its idleness says nothing
        GpuSample(7, 1.0, 64, 0.0, 60.0, 600.0),
    ]
    data = RunData(
        levels=[Level(64, 500.0)],
        telemetry_status="recorded",
        gpu_samples=samples,
        used_gpu_indexes=[0, 1],
    )

    assert gpu_rules.idle_gpus(data) == []
    data.used_gpu_indexes = None
    assert gpu_rules.idle_gpus(data) == []  # mean of 97% and 0% is not idle


def test_idle_gpus_falls_back_to_power_when_no_utilization_is_recorded():
    samples = [GpuSample(0, 1.0, 64, None, 85.0, None)]
    data = RunData(
        levels=[Level(64, 500.0)],
        telemetry_status="recorded",
        gpu_samples=samples,
        gpus=eight_gpus(),
    )

    [p] = gpu_rules.idle_gpus(data)

    assert p.evidence["mean_gpu_util_percent"] is None
    assert p.evidence["power_fraction"] == pytest.approx(85 / 600, abs=1e-4)


def test_idle_gpus_on_untimed_readings_is_only_info():
    samples = [GpuSample(i, 1.0, None, 0.0, 85.0, 600.0) for i in range(8)]

    [p] = gpu_rules.idle_gpus(
        RunData(levels=write_up_levels(), telemetry_status="recorded", gpu_samples=samples)
    )

    assert (p.severity, p.evidence["basis"]) == ("info", "run")
    assert "not known that requests were outstanding" in p.text
    assert p.evidence["power_fraction"] == pytest.approx(0.1417, abs=1e-4)
    assert p.evidence["chart"]["x"] == list(range(8))
    assert p.plan == []


def test_idle_gpus_reads_power_only_against_a_known_limit():
    # GPU 1's reading has no limit anywhere: it cannot say how hard the GPU works
    samples = [GpuSample(0, 1.0, 64, None, 85.0, 600.0), GpuSample(1, 1.0, 64, None, 30.0, None)]
    data = RunData(levels=[Level(64, 500.0)], telemetry_status="recorded", gpu_samples=samples)

    [p] = gpu_rules.idle_gpus(data)
    assert (p.evidence["mean_power_w"], p.evidence["mean_power_limit_w"]) == (85.0, 600.0)

    data.gpu_samples = samples[1:]
    [p] = gpu_rules.idle_gpus(data)
    assert p.key == "no-gpu-evidence"


@pytest.mark.parametrize("status", ["unavailable", "pending", "not_collected"])
def test_no_telemetry_means_no_gpu_evidence_never_idle(status):
    samples = [GpuSample(0, 1.0, 64, 0.0, 80.0, 600.0)]

    [p] = gpu_rules.idle_gpus(
        RunData(levels=[Level(64, 500.0)], telemetry_status=status, gpu_samples=samples)
    )

    assert (p.kind, p.key, p.severity) == ("other", "no-gpu-evidence", "info")
    assert "unknown" in p.text


def test_no_samples_inside_any_window_means_no_gpu_evidence():
    samples = [GpuSample(0, 999.0, None, 0.0, 80.0, 600.0)]

    [p] = gpu_rules.idle_gpus(
        RunData(levels=timed_levels(), telemetry_status="recorded", gpu_samples=samples)
    )

    assert p.key == "no-gpu-evidence"


def test_idle_gpus_says_nothing_about_a_run_without_levels():
    assert gpu_rules.idle_gpus(RunData(telemetry_status="unavailable")) == []


# -- queueing --------------------------------------------------------------------------------


def test_queueing_fires_when_the_engine_queues_at_its_cap():
    levels = [Level(32, 400.0), Level(128, 600.0)]
    engine = [
        EngineSample(1.0, 32, 32, 0),
        EngineSample(2.0, 128, 64, 64),
        EngineSample(3.0, 128, 63, 60),
    ]

    [p] = load_rules.queueing(
        RunData(levels=levels, engine_samples=engine, max_running_requests=64, engine="sglang")
    )

    assert (p.kind, p.severity) == ("queueing", "warning")
    assert p.evidence["samples_queued_at_cap"] == 2
    assert p.evidence["chart"]["series"][1]["y"] == [0, 64]
    assert p.plan == ["Raise --max-running-requests above 64 and re-sweep"]


def test_queueing_holds_back_when_the_queue_is_not_behind_the_cap():
    levels = [Level(128, 600.0)]
    # queued while far below the cap: the engine is short of KV cache, not capped
    engine = [EngineSample(1.0, 128, 40, 10), EngineSample(2.0, 128, 64, 0)]

    assert (
        load_rules.queueing(RunData(levels=levels, engine_samples=engine, max_running_requests=64))
        == []
    )


def test_queueing_below_the_cap_with_the_kv_cache_to_spare_is_still_the_cap():
    levels = [Level(4, 500.0), Level(8, 600.0)]
    # one output length: the 4 running requests finish in one step and the gauges read 3 or 0
    # running with 4 waiting until the next step; the KV cache is nearly empty
    engine = [EngineSample(1.0, 8, 3, 4, 0.02), EngineSample(2.0, 8, 0, 5, 0.0)]

    [p] = load_rules.queueing(
        RunData(levels=levels, engine_samples=engine, max_running_requests=4, engine="vllm")
    )

    assert (p.severity, p.evidence["levels_above_cap"]) == ("info", [8])
    # the same queue with the cache full is the cache's
    engine = [EngineSample(1.0, 8, 3, 4, 0.97)]
    assert (
        load_rules.queueing(
            RunData(levels=levels, engine_samples=engine, max_running_requests=4, engine="vllm")
        )
        == []
    )


def test_queueing_falls_back_on_the_configuration_when_the_samples_never_show_a_queue():
    levels = [Level(4, 500.0, max_concurrent_requests=96), Level(8, 600.0)]
    # the gauges read 0 between steps (vLLM 0.32 on CPU): offered 8 against a cap of 4
    engine = [EngineSample(1.0, 8, 0, 0), EngineSample(2.0, 8, 2, 0)]

    [p] = load_rules.queueing(
        RunData(levels=levels, engine_samples=engine, max_running_requests=4, engine="vllm")
    )

    assert (p.severity, p.evidence["basis"]) == ("info", "configuration")
    # 96 requests touched one 1 s bucket at concurrency 4: still only 4 offered at once
    assert p.evidence["levels_above_cap"] == [8]
    assert "did not catch the queue" in p.text


def test_queueing_prefers_the_cap_the_server_reported():
    levels = [Level(128, 600.0)]
    engine = [EngineSample(1.0, 128, 128, 5)]
    data = RunData(
        levels=levels,
        engine_samples=engine,
        max_running_requests=64,
        observed={"max_running_requests": 256, "max_running_requests_source": "/server_info x"},
        engine="vllm",
    )

    assert load_rules.queueing(data) == []
    data.observed = {
        "max_running_requests": 128,
        "max_running_requests_source": "/server_info scheduler_config.max_num_seqs",
    }
    [p] = load_rules.queueing(data)
    assert p.evidence["cap_source"] == (
        "reported by the engine (/server_info scheduler_config.max_num_seqs)"
    )
    assert p.plan == ["Raise --max-num-seqs above 128 and re-sweep"]


def test_queueing_without_engine_samples_is_info_from_the_configuration():
    [p] = load_rules.queueing(RunData(levels=write_up_levels(), max_running_requests=64))

    assert (p.severity, p.evidence["basis"]) == ("info", "configuration")
    assert p.evidence["levels_above_cap"] == [128, 256, 512]


def test_queueing_needs_a_cap_and_load_above_it():
    assert load_rules.queueing(RunData(levels=write_up_levels())) == []
    assert load_rules.queueing(RunData(levels=write_up_levels(), max_running_requests=1024)) == []
    # the client offered only 60 at once: nothing queued behind a cap of 64
    levels = [Level(128, 600.0, max_concurrent_requests=60)]
    assert load_rules.queueing(RunData(levels=levels, max_running_requests=64)) == []


# -- no tuned kernel -------------------------------------------------------------------------


def test_no_tuned_kernel_fires_with_the_shape_to_tune():
    data = RunData(gpus=eight_gpus("NVIDIA H200", "9.0"), moe_shape=GLM5_TP8_SHAPE, tp=8)

    [p] = kernel_rules.no_tuned_kernel(data)

    assert (p.kind, p.scope) == ("no_tuned_kernel", "deployment")
    assert p.evidence["tune"] == {"device_name": "NVIDIA H200", **GLM5_TP8_TUNE}
    assert p.plan == ["Tune the fused-MoE kernel for NVIDIA H200 E=256 N=256 bf16"]


def test_no_tuned_kernel_holds_back_when_a_config_is_on_record():
    data = RunData(
        gpus=eight_gpus("NVIDIA H200", "9.0"),
        moe_shape=GLM5_TP8_SHAPE,
        kernel_configs={("NVIDIA_H200", 256, 256, "bf16", None)},
    )

    assert kernel_rules.no_tuned_kernel(data) == []


def test_no_tuned_kernel_holds_back_when_the_newest_run_measured_a_tuned_file():
    # Kimi K2 after tuning (the write-up): the engine loaded a tuned file moeops does not hold
    data = RunData(gpus=eight_gpus("NVIDIA H200"), moe_shape=GLM5_TP8_SHAPE, newest_run_tuned=True)

    assert kernel_rules.no_tuned_kernel(data) == []


def test_no_tuned_kernel_matches_fp8_by_block_shape():
    shape = {**GLM5_TP8_SHAPE, "quantization": "fp8", "block_shape": [128, 128]}
    per_tensor = {("NVIDIA H200", 256, 256, "fp8_w8a8", None)}
    data = RunData(
        gpus=eight_gpus("NVIDIA H200"),
        moe_shape=shape,
        quantization="fp8",
        kernel_configs=per_tensor,
    )

    [p] = kernel_rules.no_tuned_kernel(data)
    assert p.evidence["tune"]["dtype"] == "fp8_w8a8"
    assert p.evidence["tune"]["block_shape"] == [128, 128]

    data.kernel_configs = per_tensor | {("NVIDIA H200", 256, 256, "fp8_w8a8", (128, 128))}
    assert kernel_rules.no_tuned_kernel(data) == []


def test_fp4_weights_get_a_note_that_no_triton_config_applies():
    data = RunData(gpus=eight_gpus(), moe_shape=GLM5_TP8_SHAPE, quantization="nvfp4")

    [p] = kernel_rules.no_tuned_kernel(data)

    assert (p.kind, p.severity) == ("other", "info")
    assert "nvfp4" in p.title


def test_no_tuned_kernel_needs_a_shape_a_gpu_and_a_known_dtype():
    assert kernel_rules.no_tuned_kernel(RunData(gpus=eight_gpus(), moe_shape=None)) == []
    assert kernel_rules.no_tuned_kernel(RunData(moe_shape=GLM5_TP8_SHAPE)) == []
    data = RunData(gpus=eight_gpus(), moe_shape=GLM5_TP8_SHAPE, quantization="awq")
    assert kernel_rules.no_tuned_kernel(data) == []


# -- topology --------------------------------------------------------------------------------


def matrix(labels, cell):
    return {
        "labels": labels,
        "matrix": [["X" if a == b else cell(a, b) for b in labels] for a in labels],
    }


GPUS4 = [f"GPU{i}" for i in range(4)]


def test_topology_flags_gpus_used_together_without_p2p():
    p2p = {
        "read": matrix(GPUS4, lambda a, b: "GNS" if "GPU3" in (a, b) else "OK"),
        "write": matrix(GPUS4, lambda a, b: "OK"),
    }
    data = RunData(topology=Topology("container", "lxc", p2p=p2p), used_gpu_indexes=[0, 1, 3])

    [p] = gpu_rules.topology(data)

    assert (p.kind, p.key, p.severity) == ("topology", "p2p", "warning")
    assert {tuple(f["pair"]) for f in p.evidence["failures"]} == {
        ("GPU0", "GPU3"),
        ("GPU1", "GPU3"),
    }
    assert p.evidence["chart"]["type"] == "heatmap"
    assert p.evidence["chart"]["x"] == ["GPU0", "GPU1", "GPU3"]


def test_topology_ignores_p2p_failures_outside_the_gpus_used():
    p2p = {"read": matrix(GPUS4, lambda a, b: "GNS" if "GPU3" in (a, b) else "OK")}

    data = RunData(topology=Topology("bare_metal", p2p=p2p), used_gpu_indexes=[0, 1])

    assert gpu_rules.topology(data) == []


def test_topology_reads_unknown_p2p_as_no_evidence():
    p2p = {
        "atomics": matrix(GPUS4, lambda a, b: "NS"),
        "read": matrix(GPUS4, lambda a, b: "unknown"),
    }

    assert gpu_rules.topology(RunData(topology=Topology(p2p=p2p), tp=4)) == []


def test_topology_flags_sys_links_between_numa_nodes():
    links = matrix(GPUS4, lambda a, b: "SYS" if (a in GPUS4[:2]) != (b in GPUS4[:2]) else "PIX")
    affinity = [{"gpu": g, "cpu": "", "numa": "0" if i < 2 else "1"} for i, g in enumerate(GPUS4)]
    data = RunData(topology=Topology(links=links, affinity=affinity), tp=4)

    [p] = gpu_rules.topology(data)

    assert (p.key, p.severity) == ("cross-numa", "warning")
    assert len(p.evidence["cross_numa_pairs"]) == 4
    assert p.evidence["gpu_numa"] == {"GPU0": "0", "GPU1": "0", "GPU2": "1", "GPU3": "1"}

    data.used_gpu_indexes = [0, 1]
    assert gpu_rules.topology(data) == []


def test_topology_notes_a_vm_pass_through():
    [p] = gpu_rules.topology(RunData(topology=Topology("vm", "kvm", gpus=[{"index": 0}])))

    assert (p.key, p.severity) == ("vm-passthrough", "info")
    assert "kvm" in p.title


def test_a_vm_with_no_gpus_is_not_said_to_pass_gpus_through():
    # the stand-in's host: a cloud VM without a GPU, probed
    assert gpu_rules.topology(RunData(topology=Topology("vm", "kvm"))) == []


def test_topology_skips_pair_checks_when_the_gpus_used_are_unknown():
    p2p = {"read": matrix(GPUS4, lambda a, b: "GNS")}

    # tp 2 on a 4-GPU host, no GPUs recorded: which pair it uses is not known
    assert gpu_rules.topology(RunData(topology=Topology(p2p=p2p), tp=2)) == []
    assert gpu_rules.topology(RunData(topology=None, tp=4)) == []


# -- known incompatibilities -----------------------------------------------------------------


SM120_RULE = Rule(
    id=1,
    name="FlashInfer allreduce fusion unsupported on SM120",
    finding_text="Turn it off.",
    compute_capability="12.0",
    launch_argument="allreduce_fusion",
    launch_value="True",
    severity="critical",
    note_id=7,
)


def test_incompatibility_fires_when_every_condition_holds():
    data = RunData(gpus=eight_gpus(), launch={"allreduce_fusion": True}, rules=[SM120_RULE])

    [p] = engine_rules.incompatibilities(data)

    assert (p.kind, p.key, p.severity, p.note_id) == ("incompatibility", "rule-1", "critical", 7)
    assert p.evidence["matched"] == {"compute_capability": "12.0", "allreduce_fusion": True}


@pytest.mark.parametrize(
    "gpus, launch",
    [
        (eight_gpus(), {}),
        (eight_gpus(), {"allreduce_fusion": False}),
        (eight_gpus("NVIDIA H200", "9.0"), {"allreduce_fusion": True}),
        (eight_gpus(cc=""), {"allreduce_fusion": True}),
    ],
)
def test_incompatibility_holds_back_when_a_condition_fails(gpus, launch):
    assert (
        engine_rules.incompatibilities(RunData(gpus=gpus, launch=launch, rules=[SM120_RULE])) == []
    )


def test_incompatibility_reads_launch_args_flags_and_any_truthy_value():
    rule = Rule(
        id=2, name="r", finding_text="t", engine="SGLang", launch_argument="--enable-ep-moe"
    )
    data = RunData(engine="sglang", launch={"enable_ep_moe": "1"}, rules=[rule])

    assert len(engine_rules.incompatibilities(data)) == 1
    data.engine = "vllm"
    assert engine_rules.incompatibilities(data) == []


def test_a_rule_without_conditions_matches_nothing():
    rule = Rule(id=3, name="empty", finding_text="t")

    assert engine_rules.incompatibilities(RunData(gpus=eight_gpus(), rules=[rule])) == []


# -- regression ------------------------------------------------------------------------------


def regressions(now, before):
    """The regression rule's findings for a run of levels `now` after one labelled "before"."""
    previous = PreviousRun(id=1, uuid="0123456789abcdef", label="before", levels=tuple(before))
    return regression_rules.regression(RunData(levels=now, previous=previous))


def test_a_drop_between_one_round_runs_is_only_a_possible_regression():
    before = [Level(128, 1000.0), Level(256, 1200.0)]
    now = [Level(128, 980.0), Level(256, 1000.0)]

    [p] = regressions(now, before)

    assert p.kind == "regression" and p.evidence["drop"] == [0.02, pytest.approx(0.1667, abs=1e-4)]
    assert p.severity == "info"
    assert p.title == "Possible regression: throughput 17% below before at concurrency 256"
    assert p.text.startswith(
        "At concurrency 256 output tok/s fell from 1,200 in before to 1,000 in this run (same "
        "levels and lengths): single rounds: no noise estimate: cannot tell from noise; re-run "
        "with rounds ≥ 4."
    )
    assert p.evidence["verdict"] == [None, "possible"]
    assert [s["name"] for s in p.evidence["chart"]["series"]] == ["this run", "before"]


def test_regression_fires_when_the_intervals_do_not_overlap():
    before = [Level(128, 1234.0, **_rounds(1180.0, 1234.0, 1290.0))]
    now = [Level(128, 1050.0, **_rounds(1010.0, 1050.0, 1090.0))]

    [p] = regressions(now, before)

    assert p.severity == "warning"
    assert p.title == "Throughput 15% below before at concurrency 128"
    assert p.text.startswith(
        "At concurrency 128 output tok/s fell from 1,234 (1,180–1,290) in before to "
        "1,050 (1,010–1,090) in this run (same levels and lengths): −15 % [−22 %, −8 %] "
        "beyond the noise (a permutation test of their rounds at 5 % false alarms, p = 0.029)"
    )
    assert p.evidence["interval"] == [[1010.0, 1090.0]]
    assert p.evidence["previous_interval"] == [[1180.0, 1290.0]]
    assert p.evidence["verdict"] == ["beyond noise"]


def test_a_drop_of_the_medians_within_overlapping_intervals_is_no_regression():
    # the medians fell 15 %, more than the 10 % that a single round each would flag
    before = [Level(128, 1234.0, **_rounds(1000.0, 1234.0, 1470.0))]
    now = [Level(128, 1050.0, **_rounds(850.0, 1050.0, 1250.0))]

    assert regressions(now, before) == []


def test_one_round_against_four_is_too_few_to_test_so_a_drop_is_only_possible():
    before = [Level(128, 1234.0, **_rounds(1000.0, 1234.0, 1470.0))]

    [p] = regressions([Level(128, 1050.0)], before)
    assert p.severity == "info" and p.title.startswith("Possible regression")
    assert "1,234 (1,000–1,470) in before to 1,050 in this run" in p.text
    assert (
        "1 and 4 rounds are too few for a test at 5 % false alarms (4 a side are the fewest): "
        "cannot tell from noise; re-run with rounds ≥ 4."
    ) in p.text


def test_a_regression_beyond_the_noise_outranks_a_possible_one():
    before = [
        Level(128, 1000.0, **_rounds(990.0, 1000.0, 1010.0)),
        Level(256, 1200.0),
    ]
    now = [
        Level(128, 850.0, **_rounds(840.0, 850.0, 860.0)),
        Level(256, 600.0),
    ]

    [p] = regressions(now, before)

    assert p.severity == "warning" and p.title == "Throughput 15% below before at concurrency 128"
    assert p.evidence["verdict"] == ["beyond noise", "possible"]


def test_regression_holds_back_within_ten_percent_or_without_a_previous_run():
    before = [Level(128, 1000.0)]

    assert regressions([Level(128, 905.0)], before) == []
    assert regression_rules.regression(RunData(levels=[Level(128, 500.0)])) == []


def test_regression_leaves_out_levels_whose_every_request_failed():
    before = [Level(128, 1000.0, completed=100), Level(256, 0.0, completed=0, failed=100)]
    now = [Level(128, 0.0, completed=0, failed=100), Level(256, 1200.0, completed=100)]

    assert regressions(now, before) == []


def test_runs_are_comparable_only_with_the_same_levels_and_lengths():
    base = {"levels": [128, 256], "input_len": 1024, "output_len": 1024}

    assert regression_rules.comparable_key(base) == regression_rules.comparable_key(
        {**base, "levels": [256, 128]}
    )
    assert regression_rules.comparable_key(base) != regression_rules.comparable_key(
        {**base, "output_len": 512}
    )
    assert regression_rules.comparable_key({"levels": [128, 256]}) is None
    assert regression_rules.comparable_key({}) is None


def test_runs_are_comparable_only_with_the_same_arrivals():
    base = {"levels": [64], "input_len": 1024, "output_len": 1024}
    rated = {**base, "request_rates": [8.0, 2]}

    assert regression_rules.comparable_key(base) != regression_rules.comparable_key(rated)
    assert regression_rules.comparable_key(rated) == regression_rules.comparable_key(
        {**base, "request_rates": [2, 8], "burstiness": 1}
    )
    assert regression_rules.comparable_key(
        {**base, "request_rate": 4}
    ) == regression_rules.comparable_key({**base, "request_rates": [4.0]})
    assert regression_rules.comparable_key(rated) != regression_rules.comparable_key(
        {**rated, "burstiness": 0.5}
    )
    assert regression_rules.comparable_key(rated) != regression_rules.comparable_key(
        {**rated, "ramp_up_s": 30}
    )


def test_runs_of_two_workloads_are_never_compared():
    base = {"levels": [128, 256], "input_len": 1024, "output_len": 1024}
    chats = {"id": 3, "name": "chats", "version": 1, "kind": "dataset", "sha256": "ab" * 32}

    assert regression_rules.comparable_key(base) != regression_rules.comparable_key(
        {**base, "workload": chats}
    )
    newer = {**chats, "id": 4, "version": 2, "sha256": "cd" * 32}
    assert regression_rules.comparable_key(
        {**base, "workload": chats}
    ) != regression_rules.comparable_key({**base, "workload": newer})
    # the same workload version stored again (its spec in the run's parameters) compares
    same = {**chats, "spec": {"kind": "dataset", "output": None}}
    assert regression_rules.comparable_key(
        {**base, "workload": chats}
    ) == regression_rules.comparable_key({**base, "workload": same})


# -- client-bound ----------------------------------------------------------------------------


def test_client_bound_fires_on_a_saturated_client_cpu():
    levels = [Level(64, 500.0, client_cpu_percent=40.0), Level(512, 600.0, client_cpu_percent=98.0)]

    [p] = load_rules.client_bound(RunData(levels=levels))

    assert p.evidence["levels_cpu_saturated"] == [512]
    assert p.evidence["client_cpu_percent"] == [40.0, 98.0]


def test_client_bound_fires_when_achieved_concurrency_falls_short():
    levels = [
        Level(64, 500.0, max_concurrent_requests=64),
        Level(512, 600.0, max_concurrent_requests=300, requests=2000),
    ]

    [p] = load_rules.client_bound(RunData(levels=levels))

    assert p.evidence["levels_below_target"] == [512]
    assert p.evidence["chart"]["series"][1]["y"] == [64, 300]


def test_client_bound_holds_back_when_the_level_sent_fewer_requests_than_its_concurrency():
    # 100 requests at concurrency 512 can never have 512 in flight
    levels = [Level(512, 600.0, max_concurrent_requests=100, requests=100)]

    assert load_rules.client_bound(RunData(levels=levels)) == []


def test_client_cpu_comes_from_the_load_generator_s_cpu_seconds():
    raw = {"client_cpu_s": 57.0, "processes": 2}

    assert load_rules.client_cpu_percent(raw, 100.0, 130.0) == 95.0
    assert load_rules.client_cpu_percent(
        {"client_cpu_s": 3.0, "started_at": 0, "finished_at": 10}
    ) == (30.0)
    assert load_rules.client_cpu_percent({"client_cpu_percent": 42}) == 42.0
    assert load_rules.client_cpu_percent({"client_cpu_s": 3.0}) is None
    assert load_rules.client_cpu_percent(None) is None


def test_client_bound_needs_client_numbers():
    assert load_rules.client_bound(RunData(levels=write_up_levels())) == []


# -- missing data ----------------------------------------------------------------------------


def test_no_rule_fires_on_an_empty_run():
    assert analysis.analyze(RunData()) == []


def test_finding_keys_fit_their_column_even_for_long_device_names():
    long_names = [Gpu(0, "NVIDIA " + "X" * 150), Gpu(1, "NVIDIA " + "X" * 149 + "Y")]

    proposals = kernel_rules.no_tuned_kernel(RunData(gpus=long_names, moe_shape=GLM5_TP8_SHAPE))

    keys = [p.key for p in proposals]
    assert all(len(k) <= evidence.FINDING_KEY_MAX for k in keys) and len(set(keys)) == 2


# -- failed requests and the engine on record --------------------------------------------------


def test_a_level_whose_every_request_failed_puts_the_engines_words_first():
    error = "stream error: Token id 25531 is out of vocabulary"
    levels = [
        Level(8, None, completed=0, failed=64, all_failed_with=error),
        Level(16, None, completed=0, failed=64, all_failed_with=error),
        Level(4, 300.0, completed=64, failed=0),
    ]

    [p] = load_rules.failed_requests(RunData(levels=levels))

    assert (p.kind, p.severity) == ("failed_requests", "critical")
    assert p.title == f"Every request failed at concurrency 8, 16: {error}"
    assert p.text.startswith(error)
    assert p.evidence["levels"] == [8, 16]


def test_levels_with_some_failures_are_not_all_failed():
    levels = [Level(8, 300.0, completed=60, failed=4)]

    assert load_rules.failed_requests(RunData(levels=levels)) == []


def test_another_engine_answering_than_the_one_on_record_is_flagged():
    observed = {"engine": "vllm", "version": "0.32.0"}

    [p] = engine_rules.engine_mismatch(RunData(recorded_engine="sglang", observed=observed))

    assert (p.kind, p.key, p.severity) == ("engine_mismatch", "engine", "warning")
    assert p.title == "vLLM 0.32.0 answered, but the deployment records SGLang"


def test_a_version_on_record_that_is_not_the_one_that_answered_is_noted():
    observed = {"engine": "vllm", "version": "0.32.0"}
    data = RunData(recorded_engine="vllm", observed=observed, launch={"engine_version": "0.31"})

    [p] = engine_rules.engine_mismatch(data)

    assert (p.key, p.severity) == ("version", "info")
    assert p.evidence == {"recorded": "0.31", "answered": "0.32.0", "chart": None}
    same = RunData(recorded_engine="vllm", observed=observed, launch={"engine_version": "0.32.0"})
    assert engine_rules.engine_mismatch(same) == []
    # nothing answered, or the record names no engine: nothing to compare
    assert engine_rules.engine_mismatch(RunData(recorded_engine="other", observed=observed)) == []
    assert engine_rules.engine_mismatch(RunData(recorded_engine="vllm")) == []
