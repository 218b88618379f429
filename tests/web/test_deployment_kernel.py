"""The kernel a deployment runs: the GPU it is tuned for, its shape, the configs on record for
that shape, and why a tune of it cannot run now (fleet.models.Deployment,
kernels.models.KernelConfig.objects.for_shape)."""

import datetime as dt

import pytest
from django.utils import timezone

from moeops.fleet.models import GPU
from moeops.kernels.models import KernelConfig
from tests import page_base as pb

pytestmark = pytest.mark.django_db

ENTRY = {"BLOCK_SIZE_M": 16, "num_warps": 4, "num_stages": 3}
FP8_CONFIG = {
    **pb.GLM5_CONFIG,
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
}


def _config(dtype="bf16", block_shape=None, down_moe=False, device="NVIDIA H200", E=256):
    return KernelConfig(
        device_name=device,
        E=E,
        N=256,
        dtype=dtype,
        block_shape=block_shape,
        down_moe=down_moe,
        entries={"1": ENTRY},
    ).save_new_version()


def test_the_kernel_gpu_is_its_lowest_gpu_else_its_hosts_first():
    host = pb.host(gpus=4)
    deployment = pb.deployment(host_row=host)
    deployment.gpus.set(GPU.objects.filter(index__in=[3, 2]))
    assert deployment.kernel_gpu().index == 2
    deployment.gpus.clear()
    assert deployment.kernel_gpu().index == 0


def test_a_host_without_gpus_has_no_kernel_gpu_and_no_device_in_the_shape():
    deployment = pb.deployment(host_row=pb.host("local", gpus=0))
    assert deployment.kernel_gpu() is None
    assert deployment.kernel_shape()["device_name"] is None


def test_the_kernel_shape_is_per_rank_on_its_kernel_gpu():
    # GLM-5 at TP8: 256 experts per rank, N = 2048 / 8
    deployment = pb.deployment()
    assert deployment.kernel_shape() == {
        "E": 256,
        "N": 256,
        "device_name": "NVIDIA H200",
        "dtype": "bf16",
        "block_shape": None,
    }
    deployment.tp = 3
    assert deployment.kernel_shape() is None


def test_block_fp8_weights_take_the_models_block_shape():
    deployment = pb.deployment(model_row=pb.model("GLM-5-FP8", FP8_CONFIG))
    shape = deployment.kernel_shape()
    assert (shape["dtype"], shape["block_shape"]) == ("fp8_w8a8", [128, 128])


def test_the_deployments_quantization_names_its_weights_before_the_models():
    deployment = pb.deployment(
        model_row=pb.model("GLM-5-FP8", FP8_CONFIG), quantization="modelopt_fp4"
    )
    assert deployment.weight_quantization == "modelopt_fp4"
    shape = deployment.kernel_shape()
    assert shape["dtype"] is None
    assert shape["reason"] == "modelopt_fp4 MoE weights run on kernels that read no Triton config"


def test_for_shape_is_what_the_engine_loads():
    bf16 = _config()
    down = _config(down_moe=True)
    _config(dtype="fp8_w8a8", block_shape=[128, 128])
    _config(E=128)
    _config(device="NVIDIA B200")
    shape = pb.deployment().kernel_shape()

    assert set(KernelConfig.objects.for_shape(shape, engine="sglang")) == {bf16, down}
    # only SGLang reads the _down files
    assert list(KernelConfig.objects.for_shape(shape, engine="vllm")) == [bf16]


def test_for_shape_matches_the_block_shape_of_block_fp8():
    block = _config(dtype="fp8_w8a8", block_shape=[128, 128])
    _config(dtype="fp8_w8a8")
    _config()
    shape = pb.deployment(model_row=pb.model("GLM-5-FP8", FP8_CONFIG)).kernel_shape()
    assert list(KernelConfig.objects.for_shape(shape)) == [block]


def test_for_shape_of_every_dtype_lists_fp4_deployments_configs_too():
    bf16, fp8 = _config(), _config(dtype="fp8_w8a8", block_shape=[128, 128])
    shape = pb.deployment(quantization="nvfp4").kernel_shape()
    assert not KernelConfig.objects.for_shape(shape).exists()
    assert set(KernelConfig.objects.for_shape(shape, every_dtype=True)) == {bf16, fp8}
    assert not KernelConfig.objects.for_shape(None, every_dtype=True).exists()
    assert not KernelConfig.objects.for_shape({**shape, "device_name": None}).exists()


def test_a_tune_is_refused_in_one_sentence_until_the_host_can_run_it():
    deployment = pb.deployment()
    local = pb.worker_seen(pb.host("local", gpus=0))
    on_local = pb.deployment("on local", model_row=deployment.model, host_row=local)
    assert on_local.tune_refusal() == (
        "Host local has no GPU recorded (its worker's probe found none), and a kernel tune "
        "times the kernel on a CUDA GPU."
    )
    assert deployment.tune_refusal().startswith("No worker of host h200-x8 has been seen")
    deployment.host.worker_seen_at = timezone.now() - dt.timedelta(hours=2)
    deployment.host.save()
    assert deployment.tune_refusal().startswith("The worker of host h200-x8 was last seen 2")
    pb.worker_seen(deployment.host)
    assert deployment.tune_refusal() == ""
    pb.snapshot(deployment.host, "bare_metal", "", source="probe", cuda_version="")
    assert deployment.tune_refusal() == (
        "Host h200-x8's worker found no CUDA driver when it probed the host, and a kernel tune "
        "needs CUDA."
    )
