"""Shared helpers of the page tests: a signed-in member, a small fleet, runs with levels and
telemetry, and the figures a page embeds (json_script blocks), parsed back."""

import json
import re
import time

from django.contrib.auth.models import User

from moeops.fleet.models import GPU, Deployment, Host, ModelSpec, TopologySnapshot
from moeops.runs.models import LevelResult, SweepRun, TelemetrySample, level_key

GLM5_CONFIG = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "hidden_size": 6144,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 78,
}
KIMI_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "kimi_k2",
    "hidden_size": 7168,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 384,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
}


def sign_in(client, username="alice"):
    user = User.objects.create_user(username, password=f"pw-{username}-123")
    client.force_login(user)
    return user


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


def run(deployment_row, label="sweep", levels=(), status="succeeded", **fields):
    """A run with one LevelResult per dict in `levels` (LevelResult fields, concurrency set)."""
    row = SweepRun.objects.create(
        deployment=deployment_row, label=label, status=status, source="manual", **fields
    )
    for level in levels:
        LevelResult.objects.create(run=row, key=level_key(level.get("concurrency"), None), **level)
    return row


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
    return t0
