import datetime as dt
import json
import re

import pytest
from django.utils import timezone

from moeops.kernels.models import TuningRun, TuningTiming
from tests import page_base as pb
from tests.fakes import FIXTURES

pytestmark = pytest.mark.django_db


@pytest.fixture
def deployment(client):
    pb.sign_in(client)
    deployment = pb.deployment()
    pb.worker_seen(deployment.host)
    return deployment


def test_it_queues_a_tune_for_the_per_rank_shape(
    client, deployment, sent, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            f"/deployments/{deployment.pk}/tune/", {"dtype": "bf16", "batch_sizes": "1,64,16"}
        )
    tuning = TuningRun.objects.get()
    assert response["Location"] == f"/tunes/{tuning.uuid}/"
    # GLM-5 at TP8: 256 experts per rank, N = 2048 / 8
    assert (tuning.E, tuning.N, tuning.hidden_size, tuning.topk) == (256, 256, 6144, 8)
    assert tuning.device_name == "NVIDIA H200"
    assert tuning.batch_sizes == [1, 16, 64]
    assert tuning.status == "queued" and tuning.block_shape is None
    [(name, host, kwargs)] = sent
    assert name == "tune_kernel" and host == deployment.host
    assert kwargs["tuning_run_uuid"] == str(tuning.uuid)
    assert kwargs["E"] == 256 and kwargs["N"] == 256 and kwargs["dtype"] == "bf16"


def test_block_fp8_takes_the_models_weight_block_shape(client, sent):
    pb.sign_in(client)
    config = {
        **pb.GLM5_CONFIG,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    }
    deployment = pb.deployment(model_row=pb.model("GLM-5-FP8", config))
    pb.worker_seen(deployment.host)
    page = client.get(deployment.get_absolute_url()).content.decode()
    assert '<option value="fp8_w8a8" selected>' in page
    client.post(f"/deployments/{deployment.pk}/tune/", {"dtype": "fp8_w8a8", "batch_sizes": "1"})
    assert TuningRun.objects.get().block_shape == [128, 128]


def test_a_deployment_that_quantizes_to_fp8_is_tuned_in_fp8_by_default(client):
    pb.sign_in(client)
    # the engine's --quantization fp8 names the weights, as Deployment.weight_quantization says
    deployment = pb.deployment(quantization="fp8")
    page = client.get(deployment.get_absolute_url()).content.decode()
    assert '<option value="fp8_w8a8" selected>' in page


def test_a_shape_that_does_not_split_is_refused(client, deployment, sent):
    deployment.tp = 3
    deployment.save()
    response = client.post(
        f"/deployments/{deployment.pk}/tune/", {"dtype": "bf16", "batch_sizes": "1"}
    )
    assert response.status_code == 400
    assert "does not split over tp=3" in response.content.decode()
    assert not TuningRun.objects.exists()


def test_the_tune_page_shows_progress_then_timings(client, deployment, sent):
    client.post(f"/deployments/{deployment.pk}/tune/", {"dtype": "bf16", "batch_sizes": "1,64"})
    tuning = TuningRun.objects.get()
    TuningRun.objects.filter(pk=tuning.pk).update(
        status="running",
        progress={
            "batch_sizes_done": 1,
            "batch_sizes_total": 2,
            "batch_size": 64,
            "started_at": 1000.0,
        },
    )
    state = client.get(f"/tunes/{tuning.uuid}/status.json").json()
    assert state["progress"]["fraction"] == 0.5
    assert state["progress"]["text"] == "1 of 2 done, tuning M=64"
    # the worker's tune_kernel reports {done, total, message}
    TuningRun.objects.filter(pk=tuning.pk).update(
        progress={"done": 3, "total": 4, "message": "M=64: 212 candidates"}
    )
    state = client.get(f"/tunes/{tuning.uuid}/status.json").json()
    assert state["progress"]["fraction"] == 0.75
    assert state["progress"]["text"] == "3 of 4 done — M=64: 212 candidates"

    TuningTiming.objects.create(
        run=tuning, batch_size=1, tuned_us=20.0, default_us=30.0, floor_us=18.0
    )
    TuningTiming.objects.create(
        run=tuning, batch_size=64, tuned_us=600.0, default_us=900.0, floor_us=490.0
    )
    html = client.get(f"/tunes/{tuning.uuid}/").content.decode()
    fig = pb.figure(html, "timings-data")
    traces = {t["name"]: t for t in fig["data"]}
    assert traces["tuned"]["x"] == [1, 64] and traces["tuned"]["y"] == [20.0, 600.0]
    assert traces["default config"]["y"] == [30.0, 900.0]
    assert traces["hardware floor"]["y"] == [18.0, 490.0]
    assert "1.50×" in html  # 30 / 20 µs
    assert "82%" in html  # floor 490 / tuned 600 µs


HF_CONFIGS = FIXTURES / "hf_configs"


def _tune_form(html):
    return html.split('id="tune"')[1].split("</form>")[0]


@pytest.mark.parametrize(
    ("engine", "options"),
    [
        ("sglang", [("sglang", "the engine&#x27;s own (SGLang)"), ("builtin", None)]),
        ("vllm", [("vllm", "the engine&#x27;s own (vLLM)"), ("builtin", None)]),
        # moeops reads vLLM's and SGLang's kernels only
        ("other", [("builtin", None)]),
    ],
)
def test_the_kernel_is_the_engines_own_by_default(
    client, sent, django_capture_on_commit_callbacks, engine, options
):
    pb.sign_in(client)
    deployment = pb.deployment(engine=engine)
    pb.worker_seen(deployment.host)
    form = _tune_form(client.get(deployment.get_absolute_url()).content.decode())
    values = re.findall(
        r'<option value="(\w+)"', form.split('name="kernel"')[1].split("</select>")[0]
    )
    assert values == [value for value, _ in options]
    if options[0][1]:
        assert f'<option value="{engine}" selected>{options[0][1]}</option>' in form
    if engine == "other":
        assert "moeops reads vLLM's and SGLang's own kernels only" in form
        assert "the Triton kernel of the Other" not in form
    else:
        assert "falls back to moeops' builtin kernel" in form
    assert "Tune anyway" not in form

    with django_capture_on_commit_callbacks(execute=True):
        client.post(f"/deployments/{deployment.pk}/tune/", {"dtype": "bf16", "batch_sizes": "1"})

    tuning = TuningRun.objects.get()
    assert tuning.engine == options[0][0]
    [(_, _, kwargs)] = sent
    assert (kwargs["engine"], kwargs["force"], kwargs["quantization"]) == (options[0][0], False, "")


def test_the_builtin_kernel_can_be_asked_for(
    client, deployment, sent, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        client.post(
            f"/deployments/{deployment.pk}/tune/",
            {"dtype": "bf16", "batch_sizes": "1", "kernel": "builtin"},
        )
    assert TuningRun.objects.get().engine == "builtin"
    [(_, _, kwargs)] = sent
    assert kwargs["engine"] == "builtin"
    refused = client.post(
        f"/deployments/{deployment.pk}/tune/",
        {"dtype": "bf16", "batch_sizes": "1", "kernel": "vllm"},
    )
    # an SGLang deployment's own kernel is SGLang's
    assert refused.status_code == 400
    assert "Select a valid choice" in _tune_form(refused.content.decode())


def _fp4_deployment(**fields):
    config = json.loads((HF_CONFIGS / "nvidia-kimi-k2.5-nvfp4_config.json").read_text())
    return pb.deployment(model_row=pb.model("Kimi-K2.5-NVFP4", config), **fields)


@pytest.mark.parametrize(
    ("make", "quantization"),
    [
        (_fp4_deployment, "nvfp4"),
        # the deployment's own flag names the weights too
        (lambda: pb.deployment(quantization="modelopt_fp4"), "modelopt_fp4"),
    ],
)
def test_fp4_experts_are_refused_unless_tuned_anyway(
    client, sent, django_capture_on_commit_callbacks, make, quantization
):
    pb.sign_in(client)
    deployment = make()
    pb.worker_seen(deployment.host)
    reason = f"{quantization} experts run on SGLang&#x27;s and vLLM&#x27;s FP4 MoE kernels"
    page = _tune_form(client.get(deployment.get_absolute_url()).content.decode())
    assert f'<p class="notice">{reason}' in page
    assert "(CUTLASS, FlashInfer, TRT-LLM), which read no Triton config" in page

    refused = client.post(
        f"/deployments/{deployment.pk}/tune/", {"dtype": "bf16", "batch_sizes": "1"}
    )

    assert refused.status_code == 400
    form = _tune_form(refused.content.decode())
    field = form.split("Tune anyway")[1].split("</label>")[0]
    assert 'name="tune_anyway"' in field and reason in field and "errorlist" in field
    assert not TuningRun.objects.exists()

    with django_capture_on_commit_callbacks(execute=True):
        forced = client.post(
            f"/deployments/{deployment.pk}/tune/",
            {"dtype": "bf16", "batch_sizes": "1", "tune_anyway": "on"},
        )

    assert forced.status_code == 302
    [(_, _, kwargs)] = sent
    assert (kwargs["force"], kwargs["quantization"]) == (True, quantization)


def test_a_queued_tune_says_which_kernel_it_asked_for_and_the_fallback(
    client, deployment, sent, django_assert_max_num_queries
):
    client.post(f"/deployments/{deployment.pk}/tune/", {"dtype": "bf16", "batch_sizes": "1,64"})
    tuning = TuningRun.objects.get()

    with django_assert_max_num_queries(5):
        html = client.get(f"/tunes/{tuning.uuid}/").content.decode()

    # the title names the host the tune runs on, and the GPU it tunes for
    assert "<h1>tune E=256 N=256 bf16 on h200-x8 (NVIDIA H200)" in html
    assert f'action="/tunes/{tuning.uuid}/cancel/"' in html
    assert "<dt>Kernel</dt><dd>SGLang&#x27;s own kernel asked for" in html
    assert "the worker times moeops' builtin kernel" in html


def _refused(client, deployment):
    response = client.post(
        f"/deployments/{deployment.pk}/tune/", {"dtype": "bf16", "batch_sizes": "1"}
    )
    assert response.status_code == 400
    assert not TuningRun.objects.exists()
    return _tune_form(response.content.decode())


def test_a_host_without_gpus_is_refused_in_one_sentence(client, sent):
    pb.sign_in(client)
    deployment = pb.deployment(host_row=pb.host("local", gpus=0))
    pb.worker_seen(deployment.host)
    page = _tune_form(client.get(deployment.get_absolute_url()).content.decode())
    sentence = (
        "Host local has no GPU recorded (its worker&#x27;s probe found none), and a kernel tune "
        "times the kernel on a CUDA GPU."
    )
    assert f'<p class="notice" id="tune-preflight">{sentence}</p>' in page
    assert sentence in _refused(client, deployment)
    assert sent == []


def test_a_host_whose_probe_found_no_cuda_is_refused(client, sent):
    pb.sign_in(client)
    deployment = pb.deployment()
    pb.worker_seen(deployment.host)
    pb.snapshot(deployment.host, "bare_metal", "", source="probe", cuda_version="")
    assert "Host h200-x8&#x27;s worker found no CUDA driver when it probed the host" in _refused(
        client, deployment
    )


def test_a_host_without_a_live_worker_is_refused(client, sent):
    pb.sign_in(client)
    deployment = pb.deployment()
    form = _refused(client, deployment)
    assert "No worker of host h200-x8 has been seen: start one with" in form
    deployment.host.worker_seen_at = timezone.now() - dt.timedelta(hours=2)
    deployment.host.save()
    assert "The worker of host h200-x8 was last seen 2\xa0hours ago" in _refused(client, deployment)


def test_a_tune_that_failed_in_its_worker_reads_as_a_sentence(client, deployment):
    tuning = pb.tune(
        deployment,
        status="failed",
        # as tune_kernel stored it before it wrote "Name: message"
        error='SpreadTuneError("GPU 0 (batch sizes 1, 2) exited with 1: AttributeError: module '
        "'torch._C' has no attribute '_cuda_setDevice' (see /tmp/t/gpu0.stderr.txt). 0 batch "
        'sizes are kept in /tmp/t: run again to tune only the missing ones")',
    )
    html = client.get(f"/tunes/{tuning.uuid}/").content.decode()
    box = html.split('<div class="error-box" role="alert">')[1].split("</div>")[0]
    sentence = box.split('<p class="error-sentence">')[1].split("</p>")[0]
    assert sentence.startswith("This host cannot run CUDA: its PyTorch finds no CUDA GPU")
    assert "SpreadTuneError" not in sentence
    detail = box.split("<pre>")[1].split("</pre>")[0]
    assert "_cuda_setDevice" in detail
