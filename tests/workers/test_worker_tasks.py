"""The tasks' library ends (kernel tune, engine check) against a live server, and the check,
GPUs-now and probe tasks through a real Celery worker (tests/stack.py)."""

import json
import re
import socket
import subprocess
import sys
import time

import httpx
import pytest
from django.contrib.auth.models import User
from django.db import OperationalError
from django.test import Client

from localstack.standin import StandinConfig, start_standin_in_thread
from moeops.api.models import ApiToken
from moeops.celery import send_host_task
from moeops.fleet.models import Deployment, GPUReading, HealthCheck
from moeops.kernels import services as kernel_services
from moeops.kernels.models import KernelConfig, TuningRun
from tests.engine import ensure_installed
from tests.fakes import KERNEL_ENTRY, FakeNVML, h200
from tuning.backends import load_backend
from tuning.engine_source import locate_package
from tuning.search import KernelShape
from tuning.tune_results import BatchResult, TuneResult
from workers import job, kernel_tune
from workers.engine_check import check_engine

pytest_plugins = ["tests.stack"]


class FakeTuner:
    """tuning.spread.spread_tune's signature, with made-up timings of a tune that never ran on
    a GPU; the kernel it names is the one the real backend of its engine spec loads."""

    def __init__(self):
        self.calls = []
        self.engines = []

    def __call__(self, shape, batch_sizes, gpu_indices, *, progress_callback, log_dir, engine):
        self.calls.append((shape, list(batch_sizes), list(gpu_indices), log_dir))
        self.engines.append(engine)
        spec = engine or {"engine": "builtin"}
        kernel = load_backend(
            spec["engine"],
            source_dir=spec.get("source_dir"),
            capability=90,
            launch=spec.get("launch"),
        )
        path = kernel.kernel_path(shape)
        for done, m in enumerate(batch_sizes, 1):
            progress_callback(done, len(batch_sizes), f"M={m}")
        batches = {
            m: BatchResult(
                M=m,
                config={**KERNEL_ENTRY, "BLOCK_SIZE_M": 16 * 2 ** (i - 1)},
                tuned_us=100.0 + m,
                default_us=150.0 + m,
                floor_us=80.0 + m,
                candidates_tried=40,
            )
            for i, m in enumerate(batch_sizes, 1)
        }
        # at M=1024 GEMM 2 got a config of its own: 1100 µs with it, 1120 µs with the shared one
        # (on vLLM's sorted-A path, an entry that takes it)
        batches[1024].down_config = (
            {**KERNEL_ENTRY, "USE_TMA": True} if path == "sorted_a" else KERNEL_ENTRY
        )
        batches[1024].shared_config_us = 1120.0
        # the engine ships a file; at M=1 the search's best did not beat the engine's default
        for b in batches.values():
            b.shipped_us = 160.0 + b.M
        if 1 in batches:
            batches[1].picked, batches[1].default_us = "default", batches[1].tuned_us
        return TuneResult(
            shape=shape,
            device_name="NVIDIA H200",
            triton_version="3.7.1",
            search="coarse-to-fine",
            ceilings={"bandwidth_tbps": 4.24, "bf16_tflops": 689.0, "fp8_tflops": None},
            batches=batches,
            wall_s=12.5,
            kernel={**kernel.describe(), "path": path},
        )


def test_a_tune_stores_its_config_timings_and_result(tune_client, tmp_path):
    host, client = tune_client
    tuning_run, _ = kernel_services.tuning_run_create(
        host=host, device_name="NVIDIA H200", E=256, N=256, hidden_size=6144, topk=8
    )
    tuner = FakeTuner()

    outcome = _tune(client, tuning_run, tuner, gpu_indices=[3])

    assert outcome == "succeeded"
    ((shape, sizes, gpus, log_dir),) = tuner.calls
    assert shape == KernelShape(E=256, N=256, H=6144, top_k=8, dtype="bf16")
    assert (sizes, gpus) == ([1, 64, 1024], [3])
    assert log_dir == tmp_path / "tune" / str(tuning_run.uuid)
    tuning_run.refresh_from_db()
    assert tuning_run.status == "succeeded"
    assert tuning_run.wall_s == 12.5
    config = tuning_run.result
    assert config.source == "tuned"
    assert (config.device_name, config.E, config.N, config.triton_version) == (
        "NVIDIA H200",
        256,
        256,
        "3.7.1",
    )
    assert config.entries["64"] == {**KERNEL_ENTRY, "BLOCK_SIZE_M": 32}
    assert config.file_name("vllm") == "E=256,N=256,device_name=NVIDIA_H200.json"
    timings = {t.batch_size: t for t in tuning_run.timings.all()}
    assert sorted(timings) == [1, 64, 1024]
    assert (timings[64].tuned_us, timings[64].default_us, timings[64].floor_us) == (
        164.0,
        214.0,
        144.0,
    )
    # the stored config is the one both GEMMs use: its time, not the time with a down config
    assert timings[1024].tuned_us == 1120.0
    # the engine's shipped file's entry, timed head to head; where the written config comes from
    assert (timings[64].shipped_us, timings[64].picked) == (224.0, "tuned")
    assert (timings[1].tuned_us, timings[1].default_us, timings[1].picked) == (
        101.0,
        101.0,
        "default",
    )
    # asked for nothing else, the worker times moeops' builtin kernel and says so
    assert tuner.engines == [None]
    assert (tuning_run.kernel_engine, tuning_run.kernel_note) == (
        "builtin",
        "moeops' builtin kernel, as asked",
    )
    assert (config.kernel_engine, config.kernel_version) == ("builtin", "moeops")
    assert config.kernel_source_sha256 == tuning_run.kernel_source_sha256
    assert re.fullmatch(r"[0-9a-f]{64}", config.kernel_source_sha256)
    # GEMM 2's own config at M=1024 travels as SGLang's _down file
    down = KernelConfig.objects.get(down_moe=True)
    assert (down.source, down.version, down.entries) == ("tuned", 1, {"1024": KERNEL_ENTRY})
    assert down.file_name("sglang") == "E=256,N=256,device_name=NVIDIA_H200_down.json"
    assert KernelConfig.objects.count() == 2


class SmTwelveTuner(FakeTuner):
    """FakeTuner on an sm_120 GPU: its result names the limits its searches pruned with."""

    def __call__(self, *args, **kwargs):
        result = super().__call__(*args, **kwargs)
        result.limits = {"capability": 120, "shared_memory_bytes": 101376}
        return result


def test_a_tunes_note_and_config_say_which_gpu_limits_the_search_pruned_with(tune_client):
    host, client = tune_client
    tuning_run, _ = kernel_services.tuning_run_create(
        host=host, device_name="NVIDIA H200", E=8, N=64, hidden_size=128, topk=2
    )

    assert _tune(client, tuning_run, SmTwelveTuner()) == "succeeded"

    tuning_run.refresh_from_db()
    said = "searched within compute capability 12.0's 101376 bytes of shared memory per block"
    assert tuning_run.kernel_note == f"moeops' builtin kernel, as asked; {said}"
    assert said in tuning_run.result.provenance


class RoutedTuner(FakeTuner):
    """FakeTuner taking the routing a tune asked for, as tuning.spread.spread_tune does."""

    def __call__(self, *args, routing, also_under=None, **kwargs):
        self.routing = routing
        self.also_under = also_under
        result = super().__call__(*args, **kwargs)
        result.routing = routing.as_dict()
        # timed under uniform routing too: at M=64 the written config is 9 % slower there than
        # the better of the engine's own
        for m, batch in result.batches.items():
            tuned, default = (109.0, 100.0) if m == 64 else (90.0, 100.0)
            batch.also_under = {
                "routing": {"kind": "uniform"},
                "tuned_us": tuned,
                "default_us": default,
                "shipped_us": 120.0,
            }
        return result


def test_a_tune_under_skewed_routing_times_under_it_and_says_so(tune_client):
    host, client = tune_client
    tuning_run, _ = kernel_services.tuning_run_create(
        host=host, device_name="NVIDIA H200", E=8, N=64, hidden_size=128, topk=2
    )
    tuner = RoutedTuner()

    assert _tune(client, tuning_run, tuner, routing="zipf:1.2", also_under="dirichlet:0.3") == (
        "succeeded"
    )

    assert (tuner.routing.kind, tuner.routing.parameter) == ("zipf", 1.2)
    assert (tuner.also_under.kind, tuner.also_under.parameter) == ("dirichlet", 0.3)
    tuning_run.refresh_from_db()
    assert tuning_run.kernel_note.endswith("; timed under Zipf 1.2 routing")
    assert tuning_run.result.provenance.endswith(", timed under Zipf 1.2 routing)")
    timing = tuning_run.timings.get(batch_size=64)
    assert timing.also_under["tuned_us"] == 109.0
    assert timing.loss_under_other_routing == "loses 9 % at M=64 under uniform"
    # the kernel page shows the file's times under both routings and where it loses
    html = _page(f"/kernels/{tuning_run.result.pk}/")
    assert "written under uniform (µs)" in html
    said = html.split('class="other-routing"')[1].split("</p>")[0]
    assert "loses 9 % at M=64 under uniform;" in said and "M=1024" not in said


def _tune(client, tuning_run, tuner, batch_sizes=(1, 64, 1024), **kwargs):
    """The worker's tune of `tuning_run` at the shape it was created with (E, N, hidden size,
    top k), timed by `tuner`."""
    return kernel_tune.tune_kernel(
        str(tuning_run.uuid),
        client=client,
        E=tuning_run.E,
        N=tuning_run.N,
        hidden_size=tuning_run.hidden_size,
        topk=tuning_run.topk,
        batch_sizes=None if batch_sizes is None else list(batch_sizes),
        spread=tuner,
        **kwargs,
    )


def _page(path):
    browser = Client()
    user, _ = User.objects.get_or_create(username="reader")
    browser.force_login(user)
    return browser.get(path).content.decode()


def test_a_sorted_a_tune_reads_the_launch_recipe_and_stores_up_and_down_as_one_config(
    tune_client, monkeypatch, tmp_path
):
    from tests.engine import engine_source
    from tuning import engine_source as engine_source_module

    host, client = tune_client
    # vLLM 0.34's fused-MoE code, installed with its own DeepGEMM as its wheel carries it
    real = engine_source("vllm", "0.34.0")
    site = tmp_path / "site"
    (site / "vllm" / "third_party" / "deep_gemm").mkdir(parents=True)
    (site / "vllm" / "model_executor").symlink_to(real / "model_executor")
    for info in real.parent.glob("*.dist-info"):
        (site / info.name).symlink_to(info)
    installed = engine_source_module.locate_package("vllm", source_dir=site / "vllm")
    monkeypatch.setattr(engine_source_module, "locate_package", lambda *a, **kw: installed)
    tuning_run, _ = kernel_services.tuning_run_create(
        host=host, E=8, N=256, hidden_size=4096, topk=2, engine="vllm"
    )
    tuner = FakeTuner()
    fp8 = {"dtype": "fp8_w8a8", "block_shape": [128, 128], "E": 8, "N": 256, "hidden_size": 4096}

    # the CUDA toolkit whose nvcc DeepGEMM's JIT runs (vLLM 0.34 turns DeepGEMM off without it)
    toolkit = _cuda_toolkit(tmp_path / "cuda", "12.9")
    outcome = kernel_tune.tune_kernel(
        str(tuning_run.uuid), client=client, topk=2, batch_sizes=[1, 64, 1024], spread=tuner,
        engine="vllm", launch_env={"VLLM_USE_DEEP_GEMM_E8M0": "1", "CUDA_HOME": toolkit},
        launch_argv=["vllm", "serve", "glm-5"], **fp8,
    )  # fmt: skip

    assert outcome == "succeeded"
    assert tuner.engines[0]["launch"] == {"deep_gemm_e8m0": True, "expert_parallel": False}
    tuning_run.refresh_from_db()
    assert tuning_run.kernel_path == "sorted_a"
    assert "sets VLLM_USE_DEEP_GEMM_E8M0=1" in tuning_run.kernel_note
    # one record: the up file and its _down file, the path off where GEMM 2 had no own config
    (config,) = KernelConfig.objects.all()
    assert config.pk == tuning_run.result_id and config.kernel_path == "sorted_a"
    assert config.down_entries == {
        "1": {"USE_TMA": False},
        "64": {"USE_TMA": False},
        "1024": {**KERNEL_ENTRY, "USE_TMA": True},
    }
    names = [name for name, _ in config.files("vllm")]
    assert names[1] == names[0].removesuffix(".json") + "_down.json"

    # the same launch with E8M0 off: the default path's TMA, one file, no _down entries
    again, _ = kernel_services.tuning_run_create(
        host=host, E=8, N=256, hidden_size=4096, topk=2, engine="vllm"
    )
    kernel_tune.tune_kernel(
        str(again.uuid), client=client, topk=2, batch_sizes=[1, 64, 1024], spread=tuner,
        engine="vllm", launch_env={"VLLM_USE_DEEP_GEMM_E8M0": "0"}, launch_argv=[], **fp8,
    )  # fmt: skip
    again.refresh_from_db()
    assert again.kernel_path == "tma" and again.result.down_entries is None
    assert "VLLM_USE_DEEP_GEMM_E8M0=0" in again.kernel_note

    # E8M0 on, but DeepGEMM's JIT would find an nvcc too old, or none: vLLM turns DeepGEMM off
    old_toolkit = _cuda_toolkit(tmp_path / "cuda-12.4", "12.4")
    for env, said in (
        ({"CUDA_HOME": old_toolkit}, f"needs nvcc 12.9 or newer, {old_toolkit}/bin/nvcc is 12.4"),
        ({"CUDA_HOME": str(tmp_path / "none")}, "no CUDA toolkit for DeepGEMM's JIT"),
        ({"CUDA_HOME": toolkit, "DG_JIT_NVCC_COMPILER": "/nowhere/nvcc"}, "no nvcc at /nowhere"),
    ):
        off, _ = kernel_services.tuning_run_create(
            host=host, E=8, N=256, hidden_size=4096, topk=2, engine="vllm"
        )
        kernel_tune.tune_kernel(
            str(off.uuid), client=client, topk=2, batch_sizes=[1, 64, 1024], spread=tuner,
            engine="vllm", launch_env={"VLLM_USE_DEEP_GEMM_E8M0": "1", **env}, launch_argv=[],
            **fp8,
        )  # fmt: skip
        off.refresh_from_db()
        assert off.kernel_path == "tma", off.kernel_note
        assert off.result.down_entries is None
        assert "vLLM turns DeepGEMM off on this host" in off.kernel_note and said in off.kernel_note


def _cuda_toolkit(folder, release):
    """A CUDA toolkit folder whose bin/nvcc answers --version as nvcc `release` does."""
    nvcc = folder / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(
        "#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
        f"echo 'Cuda compilation tools, release {release}, V{release}.41'\n"
    )
    nvcc.chmod(0o755)
    return str(folder)


def test_a_tune_times_the_engines_own_kernel_where_it_is_installed(tune_client, monkeypatch):
    host, client = tune_client
    python = ensure_installed()
    monkeypatch.setenv("MOEOPS_VLLM_PYTHON", str(python))
    package = locate_package("vllm", python=str(python))
    tuning_run, _ = kernel_services.tuning_run_create(
        host=host, E=8, N=64, hidden_size=128, topk=2, engine="vllm"
    )
    tuner = FakeTuner()
    during = []

    def spread(*args, **kwargs):
        # the tune page names the kernel while the tune runs
        fields = ("kernel_engine", "kernel_version", "kernel_note")
        during.append(TuningRun.objects.values_list(*fields).get(pk=tuning_run.pk))
        return tuner(*args, **kwargs)

    assert _tune(client, tuning_run, spread, engine="vllm") == "succeeded"

    assert tuner.engines == [{"engine": "vllm", "source_dir": str(package.package_dir)}]
    assert during == [("vllm", "0.32.0", "vLLM 0.32.0's own kernel")]
    tuning_run.refresh_from_db()
    source = load_backend("vllm", python=str(python), capability=90).source_sha256
    kernel = ("vllm", "0.32.0", source)
    assert (
        tuning_run.kernel_engine,
        tuning_run.kernel_version,
        tuning_run.kernel_source_sha256,
    ) == kernel
    assert tuning_run.kernel_fallback == ""
    # the config and SGLang's _down file record the kernel beside the file, not in it
    for config in KernelConfig.objects.all():
        assert (config.kernel_engine, config.kernel_version, config.kernel_source_sha256) == kernel
        assert set(json.loads(config.engine_file_text("sglang"))) == set(config.entries)
    vllm_file = json.loads(tuning_run.result.engine_file_text("vllm"))
    assert set(vllm_file) == {"triton_version", "1", "64", "1024"}
    label = (
        f'vLLM 0.32.0&#x27;s own kernel · source <code title="sha256 {source}">{source[:8]}…</code>'
    )
    assert label in _page(f"/tunes/{tuning_run.uuid}/")
    assert label in _page(f"/kernels/{tuning_run.result_id}/")


@pytest.mark.parametrize(
    ("engine", "note"),
    [
        ("sglang", "builtin: sglang is not installed on this host (set MOEOPS_SGLANG_PYTHON)"),
        ("other", "builtin: the deployment's engine (other) is neither vLLM nor SGLang"),
    ],
)
def test_without_the_engine_on_the_host_the_builtin_kernel_is_timed_and_why_is_said(
    tune_client, monkeypatch, engine, note
):
    host, client = tune_client
    monkeypatch.delenv("MOEOPS_SGLANG_PYTHON", raising=False)
    tuning_run, _ = kernel_services.tuning_run_create(
        host=host, E=8, N=64, hidden_size=128, topk=2, engine=engine
    )
    tuner = FakeTuner()

    assert _tune(client, tuning_run, tuner, engine=engine) == "succeeded"

    assert tuner.engines == [None]
    tuning_run.refresh_from_db()
    assert (tuning_run.kernel_engine, tuning_run.kernel_version) == ("builtin", "moeops")
    assert tuning_run.kernel_note == tuning_run.kernel_fallback == note
    assert tuning_run.result.kernel_engine == "builtin"
    html = _page(f"/tunes/{tuning_run.uuid}/")
    builtin = "moeops&#x27; builtin kernel (the engines&#x27; launch before vLLM 0.32)"
    assert f"{builtin} · source" in html
    assert note.replace("'", "&#x27;") in html


def test_an_fp4_tune_fails_saying_why_unless_forced(tune_client):
    host, client = tune_client
    refused, _ = kernel_services.tuning_run_create(host=host, E=8, N=64, hidden_size=128, topk=2)
    tuner = FakeTuner()

    assert _tune(client, refused, tuner, quantization="nvfp4") == "failed"

    assert tuner.calls == []
    refused.refresh_from_db()
    assert refused.status == "failed"
    assert (
        "nvfp4 experts run on" in refused.error and "CUTLASS, FlashInfer, TRT-LLM" in refused.error
    )
    assert refused.error.endswith("Tune anyway to tune it all the same.")
    assert refused.telemetry_detail == "the tune was refused before it started"
    forced, _ = kernel_services.tuning_run_create(host=host, E=8, N=64, hidden_size=128, topk=2)

    assert _tune(client, forced, tuner, quantization="nvfp4", force=True) == "succeeded"

    assert len(tuner.calls) == 1
    assert forced.timings.count() == 3


@pytest.mark.parametrize("gpu_indices", [[3], [0, 2, 3]])
def test_one_sampler_records_every_gpu_of_the_tune(tune_client, monkeypatch, gpu_indices):
    host, client = tune_client
    tuning_run, _ = kernel_services.tuning_run_create(
        host=host, E=256, N=256, hidden_size=6144, topk=8
    )
    monkeypatch.setattr(kernel_tune, "SAMPLES_INTERVAL_S", 0.1)
    nvml = FakeNVML([h200(util=10 * i, power_mw=100_000 * (i + 1)) for i in range(4)])
    tuner = FakeTuner()

    def slow(*args, **kwargs):
        # long enough for several samples per GPU and several pushes during the tune
        time.sleep(0.5)
        return tuner(*args, **kwargs)

    outcome = _tune(
        client,
        tuning_run,
        slow,
        batch_sizes=[1, 1024],
        gpu_indices=gpu_indices,
        nvml=nvml,
        telemetry_hz=10,
    )

    assert outcome == "succeeded"
    samples = list(tuning_run.telemetry.order_by("ts", "gpu_index"))
    counts = {i: sum(s.gpu_index == i for s in samples) for i in gpu_indices}
    assert set(counts) == {s.gpu_index for s in samples}
    assert min(counts.values()) >= 3
    # one sampler: every reading instant holds every GPU of the tune
    assert len({s.ts for s in samples}) * len(gpu_indices) == len(samples)
    by_gpu = {s.gpu_index: s for s in samples}
    assert [(by_gpu[i].gpu_util, by_gpu[i].power_w) for i in gpu_indices] == [
        (10.0 * i, 100.0 * (i + 1)) for i in gpu_indices
    ]
    assert tuning_run.telemetry_batches.count() >= 2
    assert nvml.inits == nvml.shutdowns == 1
    tuning_run.refresh_from_db()
    assert (tuning_run.telemetry_status, tuning_run.telemetry_detail) == ("recorded", "")


def _without_pynvml(monkeypatch):
    """nvml for tune_kernel on a host without pynvml: None, so the sampler imports it and fails."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    return None


# case: (nvml for tune_kernel, given monkeypatch; the reason the tuning run should record)
NO_TELEMETRY = {
    "pynvml not importable": (
        _without_pynvml,
        "pynvml is not installed (import of pynvml halted; None in sys.modules)",
    ),
    "no driver": (
        lambda monkeypatch: FakeNVML([], init_error="Driver Not Loaded"),
        "NVML did not initialise: Driver Not Loaded",
    ),
    "no GPU visible": (
        lambda monkeypatch: FakeNVML([]),
        "GPU index [0] not present: NVML sees 0 GPU(s)",
    ),
}


@pytest.mark.parametrize("case", NO_TELEMETRY)
def test_a_tune_whose_sampler_cannot_start_says_why(tune_client, monkeypatch, case):
    host, client = tune_client
    tuning_run, _ = kernel_services.tuning_run_create(host=host, E=8, N=64, hidden_size=128, topk=2)
    fake, reason = NO_TELEMETRY[case]
    during = []

    def spread(*args, **kwargs):
        # what the tune page shows while the tune runs
        fields = ("telemetry_status", "telemetry_detail")
        during.append(TuningRun.objects.values_list(*fields).get(pk=tuning_run.pk))
        return FakeTuner()(*args, **kwargs)

    outcome = _tune(client, tuning_run, spread, batch_sizes=[1, 1024], nvml=fake(monkeypatch))

    assert outcome == "succeeded"
    assert during == [("unavailable", reason)]
    tuning_run.refresh_from_db()
    assert (tuning_run.telemetry_status, tuning_run.telemetry_detail) == ("unavailable", reason)
    assert not tuning_run.telemetry.exists()


def test_a_finished_tune_delivered_again_does_nothing(tune_client):
    host, client = tune_client
    tuning_run, _ = kernel_services.tuning_run_create(
        host=host, E=8, N=64, hidden_size=128, topk=2, status="succeeded"
    )
    tuner = FakeTuner()

    outcome = _tune(client, tuning_run, tuner, batch_sizes=None)

    assert outcome == "succeeded"
    assert tuner.calls == []
    assert not KernelConfig.objects.exists()


def _running(host, *, attempt=1, silent_s=0.0, worker=None):
    """A tune a delivery claimed: running, its last heartbeat silent_s ago, from worker."""
    tuning_run, _ = kernel_services.tuning_run_create(
        host=host, E=8, N=64, hidden_size=128, topk=2, status="running"
    )
    beat = {
        "heartbeat": time.time() - silent_s,
        "attempt": attempt,
        "claim": "the-first-delivery",
        "worker": worker or {"host": "another-host", "pid": 4242},
    }
    TuningRun.objects.filter(pk=tuning_run.pk).update(progress=beat)
    return tuning_run


def test_a_tune_delivered_again_while_its_first_delivery_beats_stands_down(tune_client):
    host, client = tune_client
    tuning_run = _running(host)
    tuner = FakeTuner()

    assert _tune(client, tuning_run, tuner) == job.BUSY

    assert tuner.calls == []
    tuning_run.refresh_from_db()
    assert tuning_run.status == "running" and tuning_run.progress["attempt"] == 1


def test_a_tune_whose_delivery_went_silent_is_taken_over_and_resumes_from_its_log(
    tune_client, tmp_path
):
    host, client = tune_client
    tuning_run = _running(host, silent_s=kernel_tune.PROGRESS_INTERVAL_S + 60)
    tuner = FakeTuner()

    assert _tune(client, tuning_run, tuner) == "succeeded"

    # the log of the first delivery is where the second resumes from
    assert [call[3] for call in tuner.calls] == [tmp_path / "tune" / str(tuning_run.uuid)]
    tuning_run.refresh_from_db()
    assert tuning_run.status == "succeeded" and tuning_run.progress["attempt"] == 2


def test_a_tune_whose_worker_process_is_gone_is_taken_over_at_once(tune_client):
    host, client = tune_client
    # this host, a process that no longer runs: its heartbeat of a second ago says nothing
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    tuning_run = _running(host, worker={"host": socket.gethostname(), "pid": gone.pid})

    assert _tune(client, tuning_run, FakeTuner()) == "succeeded"

    tuning_run.refresh_from_db()
    assert tuning_run.progress["attempt"] == 2


def test_a_tune_taken_over_while_it_runs_stops_and_ends_nothing(tune_client):
    host, client = tune_client
    tuning_run, _ = kernel_services.tuning_run_create(host=host, E=8, N=64, hidden_size=128, topk=2)
    reported = []

    def taken_over_midway(shape, batch_sizes, gpu_indices, *, progress_callback, **kwargs):
        progress_callback(1, 4, "M=1")
        reported.append(1)
        # this worker was thought gone: another delivery takes the tune over
        kernel_services.tuning_run_update(
            tuning_run=TuningRun.objects.get(pk=tuning_run.pk),
            takeover=2,
            progress={"heartbeat": time.time(), "attempt": 2},
        )
        progress_callback(4, 4, "M=1024")
        reported.append(4)
        raise AssertionError("the tune went on after it was taken over")

    outcome = _tune(client, tuning_run, taken_over_midway)

    assert outcome == kernel_tune.TAKEN_OVER
    assert reported == [1]
    tuning_run.refresh_from_db()
    assert tuning_run.status == "running" and tuning_run.progress["attempt"] == 2
    assert not KernelConfig.objects.exists()


def test_a_tune_that_raises_fails_its_run_with_the_reason(tune_client, monkeypatch):
    host, client = tune_client
    tuning_run, _ = kernel_services.tuning_run_create(host=host, E=8, N=64, hidden_size=128, topk=2)
    _without_pynvml(monkeypatch)

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: out of memory")

    with pytest.raises(RuntimeError):
        _tune(client, tuning_run, broken, batch_sizes=None)
    tuning_run = TuningRun.objects.get(pk=tuning_run.pk)
    assert tuning_run.status == "failed"
    assert "out of memory" in tuning_run.error
    # a failed tune says why its charts are empty too
    assert tuning_run.telemetry_status == "unavailable"
    assert tuning_run.telemetry_detail.startswith("pynvml is not installed")


@pytest.fixture
def standin():
    url, stop = start_standin_in_thread(StandinConfig(model="glm-5"))
    yield url
    stop()


def test_the_engine_check_tells_healthy_from_wrong_model_from_down(standin):
    healthy = check_engine(standin, "glm-5")
    assert healthy["status"] == "healthy"
    assert healthy["models"] == ["glm-5"]
    assert healthy["max_running_requests"] == 64

    wrong = check_engine(standin, "kimi-k2")
    assert wrong["status"] == "degraded"
    assert "not 'kimi-k2'" in wrong["detail"]

    down = check_engine("http://127.0.0.1:9")
    assert down["status"] == "failed"
    assert "did not answer" in down["detail"]


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_the_worker_probes_its_host_on_start_and_checks_deployments(sweep_stack):
    stack = sweep_stack
    # workers.probe_host ran when the worker started: the host has a snapshot from the probe
    stack.worker.wait_for_log("workers.probe_host", timeout=30)
    stack.worker.wait_for_log("succeeded in", timeout=30)
    snapshot = stack.host.current_topology()
    assert snapshot is not None and snapshot.source == "probe"

    deployment = stack.deployment
    # the kwargs of a web tier from before health history: no engine, no trigger
    send_host_task(
        "check_deployment",
        stack.host,
        kwargs={"deployment": deployment.pk, "base_url": stack.standin_url, "model": "nope"},
    )
    stack.worker.wait_for_log("workers.check_deployment", timeout=30)
    [check] = _wait_for_checks(stack, 1)
    assert (check.status, check.trigger) == ("degraded", "manual")
    deployment = Deployment.objects.get(pk=deployment.pk)
    assert deployment.status == "degraded"
    assert "not 'nope'" in deployment.status_detail

    send_host_task(
        "check_deployment",
        stack.host,
        kwargs={
            "deployment": deployment.pk,
            "base_url": stack.standin_url,
            "model": "glm-5-standin",
        },
    )
    _wait_for_checks(stack, 2)
    deployment = Deployment.objects.get(pk=deployment.pk)
    assert deployment.status == "healthy"
    assert deployment.status_detail == "stand-in serves glm-5-standin"


@pytest.mark.e2e
@pytest.mark.timeout(150)
def test_checks_asked_for_through_the_api_fill_the_health_history(sweep_stack):
    stack = sweep_stack
    engine_url, stop_engine = start_standin_in_thread(StandinConfig(model="glm-5"))
    Deployment.objects.filter(pk=stack.deployment.pk).update(
        endpoint_url=engine_url, served_model_name="glm-5", engine="other"
    )
    with _api(stack) as api:
        try:
            answer = api.post(f"/deployments/{stack.deployment.pk}/check")
            assert answer.status_code == 202, answer.text
            assert answer.json()["queue"] == stack.host.queue_name
            healthy = _wait_for_checks(stack, 1)[-1]

            Deployment.objects.filter(pk=stack.deployment.pk).update(served_model_name="kimi-k2")
            assert api.post(f"/deployments/{stack.deployment.pk}/check").status_code == 202
            degraded = _wait_for_checks(stack, 2)[-1]
        finally:
            stop_engine()
        assert api.post(f"/deployments/{stack.deployment.pk}/check").status_code == 202
        failed = _wait_for_checks(stack, 3)[-1]
        history = api.get(f"/deployments/{stack.deployment.pk}/health-checks").json()

    assert (healthy.status, healthy.up, healthy.trigger) == ("healthy", True, "api")
    assert (healthy.engine, healthy.served_models) == ("standin", ["glm-5"])
    assert healthy.max_running_requests == 64 and healthy.latency_ms > 0
    assert healthy.detail == "stand-in serves glm-5"
    assert (degraded.status, degraded.up) == ("degraded", True)
    assert "not 'kimi-k2'" in degraded.detail
    assert (failed.status, failed.up, failed.latency_ms, failed.engine) == (
        "failed",
        False,
        None,
        "",
    )
    assert failed.detail.startswith("the engine did not answer")
    assert [c["status"] for c in history["items"]] == ["failed", "degraded", "healthy"]
    deployment = Deployment.objects.get(pk=stack.deployment.pk)
    assert (deployment.status, deployment.status_detail) == ("failed", failed.detail)
    assert deployment.status_checked_at == failed.checked_at

    page = _signed_in().get(deployment.get_absolute_url()).content.decode()
    table = page.split('id="health-checks"')[1].split("</table>")[0]
    assert table.count("<tr>") == 4
    assert "stand-in" in table and "not &#x27;kimi-k2&#x27;" in table


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_gpus_now_asked_for_through_the_api_reaches_the_host_page(sweep_stack, nvml_here):
    stack = sweep_stack
    with _api(stack) as api:
        answer = api.post(f"/hosts/{stack.host.name}/gpus-now")
    assert answer.status_code == 202, answer.text
    reading = _wait_for(stack, "a GPU reading", lambda: stack.host.gpu_readings.first())
    page = _signed_in().get(f"/hosts/{stack.host.name}/").content.decode()
    if nvml_here:
        assert reading.status == "recorded" and reading.gpus
        assert page.split('id="gpus-now"')[1].count('<td class="num">') >= 8
    else:
        # this machine has no GPU: the reading says why, and so does the page
        assert (reading.status, reading.gpus) == ("unavailable", [])
        assert reading.detail
        assert f"No NVML on this host: {reading.detail}" in page
    assert GPUReading.objects.count() == 1


def _api(stack):
    _, token = ApiToken.issue(name=f"owner of {stack.host.name}")
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.Client(base_url=f"{stack.live_server_url}/api/v1", headers=headers, timeout=30)


def _signed_in():
    client = Client()
    client.force_login(User.objects.create_user(f"viewer-{time.monotonic_ns()}"))
    return client


def _wait_for(stack, what, found, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = found()
        except OperationalError:
            # SQLite's test database: a table the live server writes is locked for a moment
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"no {what} after {timeout} s; worker log:\n{stack.worker.log()[-4000:]}")


def _wait_for_checks(stack, count):
    """The deployment's checks, oldest first, once there are `count`."""

    def checks():
        rows = list(
            HealthCheck.objects.filter(deployment=stack.deployment).order_by("checked_at", "id")
        )
        return rows if len(rows) >= count else None

    return _wait_for(stack, f"{count} health checks", checks)


def test_a_tune_cancelled_from_the_page_stops_at_its_next_progress_report(tune_client):
    host, client = tune_client
    tuning_run, _ = kernel_services.tuning_run_create(
        host=host, E=256, N=256, hidden_size=6144, topk=8
    )
    reported = []

    def cancelled_midway(shape, batch_sizes, gpu_indices, *, progress_callback, **kwargs):
        progress_callback(1, 4, "M=1")
        reported.append(1)
        # someone presses Cancel tune on the page while the tune runs
        kernel_services.tuning_run_cancel(tuning_run=TuningRun.objects.get(pk=tuning_run.pk))
        progress_callback(4, 4, "M=1024")
        reported.append(4)
        raise AssertionError("the tune went on after it was cancelled")

    outcome = _tune(client, tuning_run, cancelled_midway, batch_sizes=[1, 1024])

    assert outcome == "cancelled"
    assert reported == [1]
    tuning_run.refresh_from_db()
    assert tuning_run.status == "cancelled" and tuning_run.error == ""
    assert not KernelConfig.objects.exists()


def test_a_failed_tune_stores_its_error_as_name_and_message_not_a_repr(tune_client):
    host, client = tune_client
    tuning_run, _ = kernel_services.tuning_run_create(
        host=host, E=256, N=256, hidden_size=6144, topk=8
    )

    def no_cuda(*args, **kwargs):
        raise RuntimeError("GPU 0 exited with 1: AttributeError: no attribute '_cuda_setDevice'")

    with pytest.raises(RuntimeError):
        _tune(client, tuning_run, no_cuda, batch_sizes=None)

    tuning_run.refresh_from_db()
    assert tuning_run.status == "failed"
    assert tuning_run.error == (
        "RuntimeError: GPU 0 exited with 1: AttributeError: no attribute '_cuda_setDevice'"
    )
