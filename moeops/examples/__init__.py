"""The example data: the figures of the write-up "The Pivot Point", and only those.

The write-up ("The Pivot Point: From Deployment to Optimization in Large-Scale MoE Inference")
follows the deployment of GLM-5-NVFP4 on 8 NVIDIA RTX PRO 6000 Blackwell GPUs to the moment the
work turns from "is it working?" to "how do we make it fast?". What it gives, and what is loaded:

- the host: 8 RTX PRO 6000 Blackwell (SM120, 600 W TDP), first in a KVM VM, then moved to an LXC
  container, which changed the GPU topology and P2P: one host, two topology snapshots (KVM for the
  earlier Kimi K2 runs, LXC for GLM-5's sweep);
- GLM-5-NVFP4, 744B parameters and 256 experts, its MoE shape as the write-up reads it from
  config.json (n_routed_experts 256, num_experts_per_tok 8, moe_intermediate_size 2048,
  hidden_size 6144): loaded from GLM-5-FP8's config.json (the same architecture) with the
  quantization of nvidia/GLM-5-NVFP4's hf_quant_config.json, both files in this folder; served by
  SGLang at TP8 with `--max-running-requests 64`;
- the server healthy, yet every GPU at 0 % utilization, ~85 W of 600 W, ~94.7 GB used: one
  telemetry reading of the 8 GPUs;
- the plateau: 806 tok/s at concurrency 128, 879 at 256, 912 at 512, against a 1,000+ target:
  the sweep's three levels;
- an earlier Kimi K2 deployment on the same hardware, from ~800 tok/s to over 5,800 tok/s at
  high concurrency after tuning the fused-MoE kernel for SM120: two runs, default and tuned
  kernel (Kimi K2's config.json is the published one, also in this folder);
- FlashInfer allreduce fusion off on SM120: not moeops' words but SGLang's own decision, stored
  in the sweep's snapshot as the engine paths a worker records (ENGINE_PATHS: SGLang 0.5.23's
  fusion passes evaluated by moeops for compute capability 12.0 at TP8; the write-up names no
  version), from which the analysis makes its finding (moeops.insights.rules.paths);
- the todo list (check the server: done; higher-concurrency benchmarks at 256, 512 and 1024: in
  progress; tune the fused-MoE kernel for SM120: pending): the deployment's plan;
- four notes quoting these passages (NOTES).

Everything loaded here is marked with WRITEUP as its provenance. Where the write-up gives no number
(GPU memory size, UUIDs, link matrices, Kimi K2's concurrency level) the field stays empty.
"""

import json
import sys
import time
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from domain.launch import set_flags
from moeops import permissions
from moeops.engines.services import recipe_create, recipe_newest
from moeops.fleet.models import GPU, Deployment, Host, ModelSpec, TopologySnapshot
from moeops.insights.models import Finding, IncompatibilityRule, Note, PlanItem
from moeops.runs import snapshots
from moeops.runs.keys import level_key
from moeops.runs.models import LevelResult, SweepRun
from moeops.runs.parameters import parameters_checked
from moeops.runs.samples import TelemetrySample

WRITEUP = "From the write-up 'The Pivot Point'"
HERE = Path(__file__).resolve().parent
HOST_NAME = "rtx-pro-6000-x8"
GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell"
# "~94.7GB used per GPU", in MiB as telemetry stores memory
MEM_USED_MIB = 94.7e9 / 2**20
# `python -m workers.cli engine-paths --engine sglang --source <SGLang 0.5.23> --capability 12.0
# --tp 8 --model-config glm-5-fp8_config.json --json`; tests/tuning/test_sglang_paths.py
# evaluates it again from the wheel and checks this file
ENGINE_PATHS = "glm-5_sglang-0.5.23_sm120_tp8_engine_paths.json"
# what a load before ENGINE_PATHS wrote by hand: the engine's own decision replaces them
HAND_WRITTEN_FINDING = "sm120-allreduce-fusion"
HAND_WRITTEN_RULE = "FlashInfer allreduce fusion unsupported on SM120"

NOTES = {
    "the-pivot-point": (
        "The pivot point (write-up)",
        "GLM-5-NVFP4 (744B parameters, 256 experts) on 8 NVIDIA RTX PRO 6000 Blackwell GPUs: "
        "the server is healthy, yet every GPU sits at **0% utilization, ~85 W of a 600 W TDP**, "
        "with ~94.7 GB used per GPU.\n\n"
        "Throughput plateaus: **806 tok/s at concurrency 128, 879 at 256, 912 at 512**, against a "
        "1,000+ target. The server runs with `--max-running-requests 64`, so higher concurrency "
        "queues.\n\n"
        "The MoE shape from config.json: `n_routed_experts` 256, `num_experts_per_tok` 8, "
        "`moe_intermediate_size` 2048, `hidden_size` 6144.\n\n"
        "Plan: check the server (done), run higher-concurrency benchmarks (in progress), tune the "
        "fused-MoE kernel for SM120 (pending).",
    ),
    "kimi-k2-moe-tuning": (
        "Kimi K2: MoE kernel tuning is the largest lever",
        "On the same hardware, an earlier Kimi K2 deployment went from **~800 tok/s to over "
        "5,800 tok/s** at high concurrency after tuning the fused-MoE kernel for SM120. The "
        "default kernel configs were not tuned for the RTX PRO 6000's SM120.",
    ),
    "sm120-allreduce-fusion": (
        "FlashInfer allreduce fusion is unsupported on SM120",
        "FlashInfer's allreduce fusion does not support SM120 (RTX PRO 6000 Blackwell). "
        "Leave it off on these GPUs.",
    ),
    "kvm-to-lxc": (
        "KVM VM → LXC container changed the GPU topology",
        "The hardware moved from a KVM VM to an LXC container during the deployment, which "
        "changed the GPU topology and P2P characteristics. Compare runs by the topology they "
        "ran on.",
    ),
}


def _config(name):
    return json.loads((HERE / name).read_text())


def _note(slug):
    title, body = NOTES[slug]
    note, _ = Note.objects.update_or_create(
        slug=slug, defaults={"title": title, "body": body, "provenance": WRITEUP}
    )
    return note


def _model(name, repo, config_file, quant_file=None, provenance=WRITEUP):
    model = ModelSpec.objects.filter(name=name).first() or ModelSpec(name=name)
    model.hf_repo_id = repo
    model.config_json = _config(config_file)
    model.quant_config_json = _config(quant_file) if quant_file else None
    model.provenance = provenance
    model.fill_shape()
    model.save()
    return model


def _host():
    host, _ = Host.objects.update_or_create(
        name=HOST_NAME,
        defaults={
            "description": "8× NVIDIA RTX PRO 6000 Blackwell (SM120, 600 W TDP)",
            "provenance": WRITEUP,
        },
    )
    for index in range(8):
        GPU.objects.update_or_create(
            host=host,
            index=index,
            defaults={"name": GPU_NAME, "compute_capability": "12.0", "power_limit_w": 600.0},
        )
    return host


def _snapshot(host, kind, technology, evidence, captured_at):
    # found by what it is, not by its provenance text, so that loading again never adds one
    snapshot, _ = TopologySnapshot.objects.update_or_create(
        host=host,
        virtualization=kind,
        virtualization_technology=technology,
        source="manual",
        defaults={"provenance": WRITEUP, "virtualization_evidence": [evidence]},
        create_defaults={
            "provenance": WRITEUP,
            "virtualization_evidence": [evidence],
            "captured_at": captured_at,
        },
    )
    return snapshot


def _deployment(name, model, host, **fields):
    deployment, _ = Deployment.objects.update_or_create(
        name=name,
        defaults={"model": model, "host": host, "provenance": WRITEUP, **fields},
    )
    deployment.gpus.set(host.gpus.all())
    return deployment


def _run(deployment, label, snapshot, levels, parameters, kernel_config=None, engine_paths=None):
    """kernel_config: the snapshot's kernel config in effect, where the write-up tells it;
    engine_paths: the engine paths a worker would record (domain.engine_paths' JSON)."""
    run = SweepRun.objects.filter(deployment=deployment, label=label).first()
    if run is None:
        run = SweepRun(deployment=deployment, label=label)
    run.source = "manual"
    run.status = "succeeded"
    run.topology_snapshot = snapshot
    run.parameters = parameters_checked(parameters)
    if not run.snapshot:
        # what the write-up tells of the run; it names no engine version
        run.snapshot = snapshots.initial_snapshot(
            deployment=deployment, parameters=parameters, topology=snapshot, source="write-up"
        )
        if kernel_config is not None:
            run.snapshot["kernel_config"] = kernel_config
    if engine_paths is not None and not run.snapshot.get("engine_paths"):
        run.snapshot["engine_paths"] = engine_paths
    run.provenance = WRITEUP
    run.telemetry_status = "not_collected"
    run.save()
    for concurrency, output_throughput in levels:
        LevelResult.objects.update_or_create(
            run=run,
            key=level_key(concurrency, None),
            defaults={"concurrency": concurrency, "output_throughput": output_throughput},
        )
    return run


def _glm5():
    return _model(
        "GLM-5-NVFP4",
        "nvidia/GLM-5-NVFP4",
        "glm-5-fp8_config.json",
        "nvidia-glm-5-nvfp4_hf_quant_config.json",
        provenance=WRITEUP + "; config.json of GLM-5-FP8 (same architecture), quantization "
        "from nvidia/GLM-5-NVFP4's hf_quant_config.json",
    )


@transaction.atomic
def load_example_data():
    """Create or refresh the write-up's example data; running it twice changes nothing."""
    glm5 = _glm5()
    kimi = _model("Kimi-K2-Instruct", "moonshotai/Kimi-K2-Instruct", "kimi-k2-instruct_config.json")
    host = _host()
    now = timezone.now()
    kvm = _snapshot(host, "vm", "kvm", "the write-up: the hardware first ran in a KVM VM", now)
    lxc = _snapshot(
        host, "container", "lxc", "the write-up: the hardware moved to an LXC container", now
    )
    notes = {slug: _note(slug) for slug in NOTES}

    glm_deployment = _deployment(
        "GLM-5-NVFP4 on 8× RTX PRO 6000",
        glm5,
        host,
        # --max-running-requests is SGLang's flag (vLLM's is --max-num-seqs)
        engine="sglang",
        tp=8,
        max_running_requests=64,
        quantization="nvfp4",
        status="healthy",
        status_detail="Server running with the model loaded; GPUs at 0% utilization",
    )
    kimi_deployment = _deployment(
        "Kimi K2 on 8× RTX PRO 6000", kimi, host, engine="sglang", tp=8, status="stopped"
    )

    sweep = _run(
        glm_deployment,
        "Concurrency sweep (write-up)",
        lxc,
        [(128, 806.0), (256, 879.0), (512, 912.0)],
        {"levels": [128, 256, 512]},
        engine_paths=_config(ENGINE_PATHS),
    )
    # The write-up's one GPU reading: 0% utilization, ~85 W of 600 W, ~94.7 GB used, all 8 GPUs.
    if not sweep.telemetry.exists():
        ts = time.time()
        TelemetrySample.objects.bulk_create(
            TelemetrySample(
                run=sweep,
                gpu_index=index,
                ts=ts,
                gpu_util=0.0,
                power_w=85.0,
                power_limit_w=600.0,
                mem_used_mib=MEM_USED_MIB,
            )
            for index in range(8)
        )
    sweep.telemetry_status = "recorded"
    sweep.telemetry_detail = "one nvidia-smi reading from the write-up"
    sweep.save(update_fields=["telemetry_status", "telemetry_detail"])

    # Kimi K2: the write-up gives no concurrency for these two figures, so none is stored.
    # No config file is on record, so the kernel is marked in the parameters (compare presets).
    _run(
        kimi_deployment,
        "Before MoE kernel tuning (write-up)",
        kvm,
        [(None, 800.0)],
        {"moe_kernel": "default"},
        kernel_config={
            "state": "engine_default",
            "reason": "the write-up ran the engine's default fused-MoE kernel configs",
        },
    )
    _run(
        kimi_deployment,
        "After MoE kernel tuning for SM120 (write-up)",
        kvm,
        [(None, 5800.0)],
        {"moe_kernel": "tuned"},
        kernel_config={
            "state": "file",
            "shipped": False,
            "reason": "the write-up tuned the fused-MoE kernel for SM120; the file is not on "
            "record",
        },
    )

    Finding.objects.filter(
        deployment=glm_deployment, key=HAND_WRITTEN_FINDING, source="human", provenance=WRITEUP
    ).delete()
    IncompatibilityRule.objects.filter(name=HAND_WRITTEN_RULE, provenance=WRITEUP).delete()
    todo = [
        ("Check server status", "completed", None),
        ("Run higher-concurrency benchmarks (256, 512, 1024)", "in_progress", None),
        ("Tune the fused-MoE kernel for SM120", "pending", notes["kimi-k2-moe-tuning"]),
    ]
    for position, (title, status, note) in enumerate(todo):
        PlanItem.objects.update_or_create(
            deployment=glm_deployment,
            title=title,
            defaults={
                "status": status,
                "position": position,
                "note": note,
                "provenance": WRITEUP,
            },
        )
    return glm_deployment


# --------------------------------------------------------------------------- stand-in (make run)

STANDIN = (
    "A stand-in engine started from its launch recipe by the worker `make run` starts (python -m "
    "localstack.standin): a test double that behaves like a continuous-batching server, not a real "
    "engine; its numbers are not data"
)
STANDIN_HOST = "local"
STANDIN_DEPLOYMENT = "GLM-5 (stand-in)"
STANDIN_MODEL_NAME = "glm-5-standin"
STANDIN_MAX_RUNNING_REQUESTS = 64
# s the worker waits for the stand-in's /health (it answers within a second or two)
STANDIN_READY_TIMEOUT_S = 60.0


def standin_argv(port):
    """The stand-in's command, run by this Python from the clone (the recipe's working folder)."""
    return [
        sys.executable, "-m", "localstack.standin", "--port", str(port),
        "--max-running-requests", str(STANDIN_MAX_RUNNING_REQUESTS), "--model", STANDIN_MODEL_NAME,
    ]  # fmt: skip


@transaction.atomic
def load_standin_deployment(port=30000):
    """The host "local" (this machine's worker) and the managed deployment "GLM-5 (stand-in)":
    its launch recipe starts the stand-in engine on 127.0.0.1:port, so that a new user can sweep
    something and restart it with changed arguments. A recipe already there (a cap changed from
    the page) is kept; only the port and the Python are brought up to this start's.

    Not write-up data: everything here carries the STANDIN provenance. Returns the deployment.
    """
    host, _ = Host.objects.update_or_create(
        name=STANDIN_HOST,
        defaults={
            "description": "This machine: the worker `make run` starts (queue host.local)",
            "provenance": STANDIN,
        },
    )
    fields = {
        "model": ModelSpec.objects.filter(name="GLM-5-NVFP4").first() or _glm5(),
        "host": host,
        "engine": "other",
        "engine_version": "moeops stand-in",
        "tp": 8,
        "max_running_requests": STANDIN_MAX_RUNNING_REQUESTS,
        "endpoint_url": f"http://127.0.0.1:{port}",
        "served_model_name": STANDIN_MODEL_NAME,
        "management": "managed",
        "provenance": STANDIN,
    }
    # the status is the worker's health check to keep, once it has run
    deployment, _ = Deployment.objects.update_or_create(
        name=STANDIN_DEPLOYMENT,
        defaults=fields,
        create_defaults={
            **fields,
            "status": "planned",
            "status_detail": "a stand-in engine for trying moeops out; not a real server",
        },
    )
    newest = recipe_newest(deployment)
    argv = standin_argv(port)
    if newest is not None:
        argv = set_flags([sys.executable, *newest.argv[1:]], {"--port": str(port)})
    if newest is None or newest.argv != argv or newest.cwd != str(settings.BASE_DIR):
        recipe_create(
            deployment=deployment,
            argv=argv,
            author=permissions.MOEOPS,
            cwd=str(settings.BASE_DIR),
            ready_timeout_s=STANDIN_READY_TIMEOUT_S,
            reason="make run's stand-in on port " + str(port),
            based_on=newest,
        )
    return deployment
