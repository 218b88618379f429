"""Shared helpers of the page tests: a signed-in member, a small fleet, runs with levels and
telemetry, and the figures a page embeds (json_script blocks), parsed back."""

import json
import re
import time
from pathlib import Path

from django.contrib.auth.models import User

from moeops.fleet.models import GPU, Deployment, Host, ModelSpec, TopologySnapshot
from moeops.fleet.services import health_check_record
from moeops.insights.models import Finding
from moeops.kernels.models import TuningRun
from moeops.runs import rollup
from moeops.runs.keys import level_key
from moeops.runs.models import LevelResult, LevelRound, SweepRun
from moeops.runs.samples import EngineBucket, EngineSample, TelemetryBucket, TelemetrySample

HF_CONFIGS = Path(__file__).parent / "fixtures" / "hf_configs"
# The MoE keys of GLM-5's and Kimi K2's config.json (bf16: no quantization block), the shapes
# most tests need; the whole published files are beside them.
GLM5_CONFIG = json.loads((HF_CONFIGS / "glm-5_moe-keys.TRIMMED.json").read_text())
KIMI_CONFIG = json.loads((HF_CONFIGS / "kimi-k2_moe-keys.TRIMMED.json").read_text())


# the load of the watch "nightly" (tests/web/conftest.py's watch)
WATCH_LOAD = {"levels": [4, 8], "input_len": 16, "output_len": 32, "prompts_per_level": 8}


# The first columns of a run page's level table, in order
LEVEL_TABLE_FIRST = (
    "concurrency",
    "completed",
    "failed",
    "output throughput",
    "output per GPU",
    "p50 TTFT",
    "p99 TTFT",
    "p50 TPOT",
    "p99 TPOT",
)


def sign_in(client, username="alice", staff=False):
    user = User.objects.create_user(username, password=f"pw-{username}-123", is_staff=staff)
    client.force_login(user)
    return user


def form_html(client, deployment_row, form):
    """The deployment page's `form` ("sweep", "capacity" or "watches") as the page asks for it
    when its section is opened, after checking that the page asks for it there."""
    page = client.get(deployment_row.get_absolute_url()).content.decode()
    url = f"/deployments/{deployment_row.pk}/{form}/form/"
    assert f'data-form-url="{url}"' in page
    response = client.get(url)
    assert response.status_code == 200
    return response.content.decode()


def figure(html, data_id):
    """The plotly figure a page embedded under json_script id `data_id`."""
    match = re.search(rf'<script id="{data_id}" type="application/json">(.*?)</script>', html, re.S)
    assert match, f"no figure {data_id!r} in the page"
    return json.loads(match.group(1))


def model(name="GLM-5", config=GLM5_CONFIG):
    spec = ModelSpec(name=name, config_json=config)
    spec.fill_shape()
    spec.save()
    return spec


def host(name="h200-x8", gpus=8, gpu_name="NVIDIA H200", power_limit_w=700.0):
    row = Host.objects.create(name=name, description=f"{gpus}× {gpu_name}")
    for index in range(gpus):
        GPU.objects.create(
            host=row,
            index=index,
            name=gpu_name,
            compute_capability="9.0",
            power_limit_w=power_limit_w,
        )
    return row


def worker_seen(host_row):
    """The host's worker sent a heartbeat just now (the host takes work)."""
    from django.utils import timezone

    host_row.worker_seen_at = timezone.now()
    host_row.save(update_fields=["worker_seen_at"])
    return host_row


def vllm_deployment(tp=8, **fields):
    """The vLLM deployment "glm-5-vllm" on both GPUs of a 2-GPU host whose worker is seen."""
    host_row = worker_seen(host(gpus=2))
    row = Deployment.objects.create(
        name="glm-5-vllm", model=model(), host=host_row, engine="vllm", tp=tp, **fields
    )
    row.gpus.set(host_row.gpus.all())
    return row


def vllm_tuned_config(shape, entries, **fields):
    """A config tuned for vLLM 0.34.0 at `shape` (a deployment's kernel_shape()), stored by the
    kernels service: (the config, whether it was new)."""
    from moeops.kernels.services import kernel_config_store

    return kernel_config_store(
        device_name=shape["device_name"],
        E=shape["E"],
        N=shape["N"],
        dtype=shape["dtype"],
        block_shape=shape["block_shape"],
        entries=entries,
        source="tuned",
        kernel_engine="vllm",
        kernel_version="0.34.0",
        **fields,
    )


def h200_fp8_config(entries, **fields):
    """A new version of the H200 fp8 (128x128 blocks) config for E=256, N=256."""
    from moeops.kernels.models import KernelConfig

    return KernelConfig(
        device_name="NVIDIA H200",
        E=256,
        N=256,
        dtype="fp8_w8a8",
        block_shape=[128, 128],
        triton_version="3.7.1",
        entries=entries,
        **fields,
    ).save_new_version()


def restarted_with_seqs(deployment_row, user, seqs, reported):
    """A restart of the deployment's engine with --max-num-seqs `seqs` (no re-sweep) that
    succeeded, the engine reporting a cap of `reported` running requests; returns the action."""
    from moeops.engines import services as engine_services

    action = engine_services.engine_action_start(
        deployment=deployment_row,
        kind="restart_with_args",
        user=user,
        changes={"--max-num-seqs": seqs},
        resweep=False,
    )
    engine_services.engine_action_report(action=action, status="running")
    engine_services.engine_action_report(
        action=action, status="succeeded", observed={"max_running_requests": reported}
    )
    return action


def standin_checked(deployment_row):
    """The deployment's last health check found the stand-in engine with a cap of 64 running
    requests (the cap the sweep and capacity estimates read)."""
    health_check_record(
        deployment=deployment_row,
        status="healthy",
        trigger="periodic",
        engine="standin",
        max_running_requests=64,
    )
    return deployment_row


def standin_deployment(**fields):
    """The deployment "GLM-5 (stand-in)" on a host without GPUs, checked by standin_checked."""
    return standin_checked(deployment("GLM-5 (stand-in)", host_row=host("local", gpus=0), **fields))


def sweep_form(label, levels, *, input_len, output_len, prompts_per_level, warmup=8):
    """The deployment page's sweep form as a browser posts it (`levels` as typed: "8, 64")."""
    return {
        "label": label,
        "levels": levels,
        "input_len": str(input_len),
        "output_len": str(output_len),
        "prompts_per_level": str(prompts_per_level),
        "warmup": str(warmup),
        "endpoint": "completions",
    }


def deployment_signed_in(client):
    """A deployment on a host that sent a topology snapshot, its user signed in on `client`."""
    sign_in(client)
    row = deployment()
    snapshot(row.host)
    return row


def snapshot(host_row, kind="container", technology="lxc", **fields):
    return TopologySnapshot.objects.create(
        host=host_row,
        captured_at=fields.pop("captured_at", None) or _now(),
        virtualization=kind,
        virtualization_technology=technology,
        **fields,
    )


def _now():
    from django.utils import timezone

    return timezone.now()


def deployment(name="GLM-5 on h200", model_row=None, host_row=None, **fields):
    model_row = model_row or model()
    host_row = host_row or host()
    row = Deployment.objects.create(
        name=name,
        model=model_row,
        host=host_row,
        tp=fields.pop("tp", 8),
        endpoint_url=fields.pop("endpoint_url", "http://127.0.0.1:30000"),
        served_model_name=fields.pop("served_model_name", "glm-5"),
        **fields,
    )
    row.gpus.set(host_row.gpus.all())
    return row


def before_and_after_tuning(deployment_row, **after_fields):
    """Two runs of the deployment: "before tuning" at concurrency 32, 64 and 128, and "after
    tuning" (SweepRun fields after_fields) at 3× its output throughput."""
    levels = [
        {"concurrency": c, "output_throughput": t, "median_tpot_ms": m}
        for c, t, m in ((32, 400.0, 20.0), (64, 700.0, 30.0), (128, 806.0, 45.0))
    ]
    before = run(deployment_row, "before tuning", levels=levels)
    after = run(
        deployment_row,
        "after tuning",
        levels=[{**level, "output_throughput": 3 * level["output_throughput"]} for level in levels],
        **after_fields,
    )
    return before, after


def tune(deployment_row, **fields):
    """A tune of GLM-5's MoE layer at TP8 (E=256, N=256, H=6144, top-8) for the deployment, on
    its host, of TuningRun fields."""
    return TuningRun.objects.create(
        host=deployment_row.host,
        deployment=deployment_row,
        E=256,
        N=256,
        hidden_size=6144,
        topk=8,
        **fields,
    )


def level(run_row, concurrency, **fields):
    """The run's LevelResult at `concurrency` streams (no request rate), of LevelResult fields."""
    return LevelResult.objects.create(
        run=run_row, key=level_key(concurrency, None), concurrency=concurrency, **fields
    )


def run(deployment_row, label="sweep", levels=(), status="succeeded", **fields):
    """A run with one LevelResult per dict in `levels` (LevelResult fields, concurrency set)."""
    row = SweepRun.objects.create(
        deployment=deployment_row, label=label, status=status, source="manual", **fields
    )
    for level in levels:
        LevelResult.objects.create(run=row, key=level_key(level.get("concurrency"), None), **level)
    return row


def no_gpu_evidence_in_runs(deployment_row, count=3):
    """`count` runs of the deployment, each with the finding "No GPU evidence for this run"
    (one finding said in several runs); returns the runs."""
    runs = [run(deployment_row, f"r{i}") for i in range(count)]
    for row in runs:
        Finding.objects.create(
            deployment=deployment_row,
            run=row,
            kind="other",
            key="no-gpu-evidence",
            severity="info",
            title="No GPU evidence for this run",
        )
    return runs


def capacity_round(run_row, number, concurrency, p99_tpot_ms, started_at, **fields):
    """Round `number` of a capacity search's level at `concurrency`, recorded as the worker
    pushes it: 4 requests a stream, none failed, TPOT p99 as given (its median half of it), one
    second from `started_at`; `fields`: the rest of the level's figures."""
    from moeops.runs import measurements

    measurements.level_record(
        run=run_row,
        round=number,
        concurrency=concurrency,
        completed=4 * concurrency,
        failed=0,
        median_tpot_ms=p99_tpot_ms / 2,
        p99_tpot_ms=p99_tpot_ms,
        started_at=started_at,
        finished_at=started_at + 1,
        **fields,
    )


def rounds_spanning(level_row, figure, interval):
    """Four rounds of output tok/s whose median is `figure` and whose range is `interval`
    ([low, high], the level's 95 % interval as domain.intervals gives it for four rounds),
    stored as the level's LevelRounds: what two-run verdicts judge."""
    low, high = interval
    for number, value in enumerate((low, figure, high, figure), 1):
        LevelRound.objects.create(
            level=level_row, round=number, figures={"output_throughput": value}, body_sha256=""
        )
    level_row.round_count = 4
    level_row.intervals = {"output_throughput": list(interval)}
    level_row.save()


def telemetry(run_row, *, gpus=8, seconds=60, t0=None, util=lambda g, s: 50.0, power_limit=700.0):
    """1 Hz samples for `seconds` s on `gpus` GPUs; util(gpu, second) gives utilization %."""
    t0 = time.time() - seconds if t0 is None else t0
    TelemetrySample.objects.bulk_create(
        (
            TelemetrySample(
                run=run_row,
                gpu_index=g,
                ts=t0 + s,
                gpu_util=util(g, s),
                power_w=100.0 + util(g, s) * 5,
                power_limit_w=power_limit,
            )
            for s in range(seconds)
            for g in range(gpus)
        ),
        batch_size=5000,
    )
    samples_summed(run_row)
    return t0


def samples_summed(run_row):
    """Sums the run's samples stored here behind the services' back per time bucket, as the
    services do for the samples they store (runs.rollup)."""
    for buckets, samples in ((TelemetryBucket, TelemetrySample), (EngineBucket, EngineSample)):
        rollup.buckets_rebuild(buckets, samples, owner_field="run", owner_id=run_row.pk)


def vllm_identity(max_num_seqs=4, version="0.32.0", tuned_folder="/opt/moe-tuned"):
    """The snapshot's "engine" of a vLLM started with VLLM_SERVER_DEV_MODE=1, built the way
    identify_engine builds it: /server_info's nested vllm_config flattened to dotted names."""
    from domain import engine as reports

    config = {
        "model_config": {
            "model": "zai-org/GLM-5",
            "served_model_name": "glm-5",
            "max_model_len": 4096,
            "dtype": "torch.bfloat16",
        },
        "cache_config": {"block_size": 16, "gpu_memory_utilization": 0.9},
        "parallel_config": {"tensor_parallel_size": 8, "enable_expert_parallel": False},
        "scheduler_config": {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": 8192},
        "compilation_config": {"pass_config": {"fuse_allreduce_rms": True}},
        "instance_id": "changes at every start",
    }
    env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_TUNED_CONFIG_FOLDER": tuned_folder}
    identity = reports.identity(
        "vllm",
        version=version,
        args=reports.vllm_args(config),
        args_source="/server_info",
        env=reports.vllm_env(env),
        models=[{"id": "glm-5", "max_model_len": 4096, "owned_by": "vllm", "root": "GLM-5"}],
        metric_names=["vllm:num_requests_running", "vllm:num_requests_waiting"],
    )
    return {**identity, "url": "http://127.0.0.1:8000", "reachable": True, "error": ""}


def tuned_file(snapshot_row, folder="/opt/moe-tuned"):
    """The snapshot's "kernel_config" of a tuned file found in VLLM_TUNED_CONFIG_FOLDER."""
    from tuning.config_files import config_file_name

    shape = snapshot_row["kernel_shape"]
    name = config_file_name(shape["E"], shape["N"], shape["device_name"], shape["dtype"])
    return {
        "state": "file",
        "file_name": name,
        "path": f"{folder}/{name}",
        "sha256": "3f" * 32,
        "folder": "VLLM_TUNED_CONFIG_FOLDER",
        "shipped": False,
        "searched": [f"{folder}/{name}"],
        "reason": "",
    }


def measured(deployment_row, *, engine=None, kernel_config=None, parameters=None):
    """A worker run's snapshot: what the web tier records at creation (the deployment as it
    stands now), then what the worker adds when the sweep starts. engine: the snapshot's
    "engine" (vllm_identity()); kernel_config: a dict, or "tuned" for tuned_file()."""
    from moeops.runs import snapshots

    row = snapshots.initial_snapshot(
        deployment=deployment_row, parameters=parameters or {}, topology=None, source="worker"
    )
    if engine is not None:
        row["engine"] = engine
    if kernel_config is not None:
        row["kernel_config"] = tuned_file(row) if kernel_config == "tuned" else kernel_config
    row["client"] = {"host": "h200-x8", "pid": 4242}
    return row
