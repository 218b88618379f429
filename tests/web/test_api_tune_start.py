"""POST /api/v1/deployments/{ref}/tuning-runs: a queued tune of the deployment's MoE shape sent to
its host's worker, refused as the deployment page's Tune refuses it (kernels.services.tuning_start).
"""

import json

import pytest
from django.utils import timezone

from moeops.fleet.models import GPU, Host, TopologySnapshot
from moeops.kernels.models import TuningRun
from tests import queues
from tests.api_base import TUNE_START
from tests.fakes import FIXTURES, GLM5_TP8_TUNE

QUEUE = "host.rtx-pro-6000"
TUNE_UUID = "5e0c2a41-7b9d-4f38-a6e2-1c8d9b3f7a20"
DEVICE = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def test_it_queues_a_tune_and_sends_it_to_the_hosts_worker_after_commit(
    worker_world, broker, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = worker_world.host_worker.post(
            TUNE_START, {"uuid": TUNE_UUID, "batch_sizes": [64, 1, 16], "engine": "sglang"}
        )
        assert queues.queued(broker, QUEUE) == []
    assert response.status_code == 201, response.json()
    tuning = TuningRun.objects.get()
    assert str(tuning.uuid) == TUNE_UUID == response.json()["uuid"]
    # GLM-5 at TP8: 256 experts per rank, N = 2048 / 8, on the deployment's first GPU
    assert (tuning.E, tuning.N, tuning.hidden_size, tuning.topk) == (256, 256, 6144, 8)
    assert (tuning.status, tuning.device_name, tuning.dtype) == ("queued", DEVICE, "bf16")
    assert (tuning.deployment, tuning.host) == (worker_world.deployment, worker_world.host)
    assert tuning.batch_sizes == [1, 16, 64] and tuning.engine == "sglang"
    [task] = queues.queued(broker, QUEUE)
    assert task.task == "workers.tune_kernel"
    assert task.kwargs == {
        "tuning_run_uuid": TUNE_UUID,
        **GLM5_TP8_TUNE,
        "batch_sizes": [1, 16, 64],
        "device_name": DEVICE,
        "gpu_indices": [0, 1],
        "engine": "sglang",
        "quantization": "",
        "force": False,
        # an unmanaged deployment: no launch recipe to read the kernel path from
        "launch_env": None,
        "launch_argv": None,
    }


def test_a_start_sent_again_is_the_same_tune_and_no_second_task(
    worker_world, broker, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        first = worker_world.owner.post(TUNE_START, {"uuid": TUNE_UUID})
        again = worker_world.owner.post(TUNE_START, {"uuid": TUNE_UUID})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    [task] = queues.queued(broker, QUEUE)
    assert task.kwargs["engine"] == "builtin"


@pytest.mark.parametrize(
    ("change", "body", "detail"),
    [
        (
            lambda w: GPU.objects.filter(host=w.host).delete(),
            {},
            "deployment: Host rtx-pro-6000 has no GPU recorded (its worker's probe found none), "
            "and a kernel tune times the kernel on a CUDA GPU.",
        ),
        (
            lambda w: TopologySnapshot.objects.create(
                host=w.host, captured_at=timezone.now(), source="probe", cuda_version=""
            ),
            {},
            "deployment: Host rtx-pro-6000's worker found no CUDA driver when it probed the host",
        ),
        (
            lambda w: Host.objects.filter(pk=w.host.pk).update(worker_seen_at=None),
            {},
            "deployment: No worker of host rtx-pro-6000 has been seen: start one with",
        ),
        (
            lambda w: type(w.deployment).objects.filter(pk=w.deployment.pk).update(tp=3),
            {},
            "deployment: The MoE shape of GLM-5 does not split over tp=3, ep=1.",
        ),
        # an SGLang deployment's own kernel is SGLang's
        (
            lambda w: None,
            {"engine": "vllm"},
            "engine: a tune of glm-5-sglang asks for sglang (its engine's own) or builtin, "
            "not vllm",
        ),
    ],
)
def test_a_tune_the_host_cannot_run_is_refused_in_a_sentence(
    worker_world, broker, change, body, detail
):
    change(worker_world)
    response = worker_world.owner.post(TUNE_START, body)
    assert response.status_code == 400
    assert response.json()["detail"].startswith(detail), response.json()
    assert not TuningRun.objects.exists()
    assert queues.queued(broker, QUEUE) == []


@pytest.mark.parametrize(
    ("batch_sizes", "message"),
    [
        ([1, 1], "batch_sizes: give each batch size once"),
        ([], "batch_sizes: List should have at least 1 item"),
        ([0], "batch_sizes.0: Input should be greater than or equal to 1"),
    ],
)
def test_the_batch_sizes_are_distinct_whole_numbers(worker_world, broker, batch_sizes, message):
    response = worker_world.owner.post(TUNE_START, {"batch_sizes": batch_sizes})
    assert response.status_code == 422
    assert response.json()["message"].startswith(message), response.json()
    assert not TuningRun.objects.exists()


def test_fp4_experts_are_tuned_only_when_forced(
    worker_world, broker, django_capture_on_commit_callbacks
):
    config = json.loads(
        (FIXTURES / "hf_configs" / "nvidia-kimi-k2.5-nvfp4_config.json").read_text()
    )
    worker_world.model.config_json = config
    worker_world.model.fill_shape()
    worker_world.model.save()
    refused = worker_world.owner.post(TUNE_START, {})
    assert refused.status_code == 400
    assert refused.json()["detail"].startswith(
        "force: nvfp4 experts run on SGLang's and vLLM's FP4 MoE kernels"
    )
    with django_capture_on_commit_callbacks(execute=True):
        forced = worker_world.owner.post(TUNE_START, {"force": True})
    assert forced.status_code == 201
    [task] = queues.queued(broker, QUEUE)
    assert (task.kwargs["force"], task.kwargs["quantization"]) == (True, "nvfp4")


def test_only_a_token_that_may_write_the_host_starts_a_tune(worker_world, broker):
    assert worker_world.outsider.post(TUNE_START, {}).status_code == 403
    assert worker_world.read_only.post(TUNE_START, {}).status_code == 403
    assert worker_world.anonymous.post(TUNE_START, {}).status_code == 401
    assert not TuningRun.objects.exists()
