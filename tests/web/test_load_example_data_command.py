import json
from io import StringIO

import pytest
from django.core.management import call_command

from moeops.examples.conversations import CONVERSATIONS, EXAMPLE_WORKLOAD
from moeops.insights.models import Finding
from moeops.kernels.models import KernelConfig, TuningRun
from moeops.runs.models import Workload
from tests import page_base as pb
from tests.fakes import ROOT

pytestmark = pytest.mark.django_db


def _load():
    out = StringIO()
    call_command("load_example_data", stdout=out)
    return out.getvalue()


def test_it_loads_and_analyzes_the_write_up():
    assert "findings from the analysis" in _load()
    kinds = set(Finding.objects.filter(source="auto").values_list("kind", flat=True))
    assert "plateau" in kinds
    plateau = Finding.objects.get(kind="plateau")
    assert plateau.run.label == "Concurrency sweep (write-up)"


def test_running_it_twice_adds_no_findings():
    _load()
    first = Finding.objects.count()
    _load()
    assert Finding.objects.count() == first


def test_the_kimi_k2_deployment_tuned_in_the_write_up_is_not_told_to_tune():
    _load()
    kimi = Finding.objects.filter(deployment__name__icontains="kimi")
    # its newest run measured the write-up's tuned file in effect, which moeops does not hold
    assert kimi.exists() and not kimi.filter(kind="no_tuned_kernel").exists()


def test_it_loads_the_h200_tune_of_the_device_table_once(client):
    _load()
    _load()
    tune = json.loads((ROOT / "moeops/examples/h200_vllm_glm5_fp8_block_tune.json").read_text())
    (tuning,) = TuningRun.objects.all()
    config = KernelConfig.objects.get()
    assert (tuning.status, tuning.result, config.source) == ("succeeded", config, "tuned")
    assert config.kernel_label == tuning.kernel_label == "vLLM 0.33.0's own kernel"
    assert config.entries["24"] == tune["batches"]["24"]["config"]
    timings = {t.batch_size: t for t in tuning.timings.all()}
    assert len(timings) == 18 and timings[24].picked == tune["batches"]["24"]["picked"]
    assert (timings[24].tuned_us, timings[24].shipped_us) == (
        tune["batches"]["24"]["tuned_us"],
        tune["batches"]["24"]["shipped_us"],
    )
    # the written entry is never slower than vLLM's own where the tune timed them
    assert all(t.tuned_us <= min(t.default_us, t.shipped_us) for t in timings.values())
    pb.sign_in(client)
    page = client.get(f"/kernels/{config.pk}/").content.decode()
    assert "vLLM 0.33.0&#x27;s own kernel" in page and "never timed in SGLang" in page
    # the H200 is no host of this moeops: nothing can be sent there
    assert tuning.host is None and str(tuning) == "tune E=256 N=256 fp8_w8a8 on NVIDIA H200"
    assert "NVIDIA H200" in client.get(f"/tunes/{tuning.uuid}/").content.decode()


def test_it_loads_one_dataset_workload_of_its_own_conversations_once():
    assert f"the dataset workload {EXAMPLE_WORKLOAD} v1 ({CONVERSATIONS} conversations)" in _load()
    _load()

    workload = Workload.objects.get()
    assert (workload.kind, workload.layout, workload.version) == ("dataset", "sharegpt", 1)
    prompts = [item["prompt"] for item in workload.items]
    answers = [len(item["answer"].split()) for item in workload.items]
    # varied lengths: the longest prompt and answer are many times the shortest
    lengths = [len(p.split()) for p in prompts]
    assert max(lengths) > 10 * min(lengths) and max(answers) > 10 * min(answers)
    assert len(set(prompts)) > CONVERSATIONS * 0.9
