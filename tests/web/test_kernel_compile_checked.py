"""Files for a GPU moeops has not timed on (issue 42, item 3): compile-check writes a file's
entries, fitted to the RTX PRO 6000 Blackwell's shared memory, under each name its editions
read in both engines with an import request of each; the API stores the check beside the file
and the kernel page says which GPUs the file is for and that it was compile-checked, not timed
there, until a tune on such a GPU times it."""

import json
from html import unescape

import pytest

from moeops.kernels.models import KernelConfig
from moeops.kernels.services import kernel_config_store
from tests import page_base as pb
from tests.api_base import make_world
from tests.fakes import KERNEL_ENTRY
from tuning.compile_check import IMPORTS, CheckedEntry, EntriesCheck, write_files
from tuning.compile_only import target_for
from tuning.devices import RTX_PRO_6000_BLACKWELL
from tuning.search import KernelShape

WORKSTATION, SERVER, MAX_Q = RTX_PRO_6000_BLACKWELL
SHAPE = KernelShape(E=256, N=256, H=6144, top_k=8, dtype="fp8_w8a8", block_shape=(128, 128))
SMALL = {**KERNEL_ENTRY, "num_stages": 5}
BIG = {**SMALL, "BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "num_warps": 8}
KERNEL = {"engine": "vllm", "version": "0.34.0", "source_sha256": "ab" * 32}


@pytest.fixture
def world(db):
    return make_world()


def _checked():
    """What compile-check found for a file tuned elsewhere (as tests/tuning compiles it):
    M=4096's 5-stage tile fitted 12.0 with 4 stages."""
    return EntriesCheck(
        target=target_for(120),
        shape=SHAPE,
        kernel=KERNEL,
        triton_version="3.7.1",
        entries=[
            CheckedEntry(1, SMALL, SMALL, None, 49152),
            CheckedEntry(4096, BIG, {**BIG, "num_stages": 4}, None, 98304),
        ],
    )


def _import_written(client, folder):
    write_files(_checked(), folder, RTX_PRO_6000_BLACKWELL)
    requests = json.loads((folder / IMPORTS).read_text())
    return [client.post("/api/v1/kernel-configs/import", body) for body in requests]


def test_the_files_compile_check_writes_are_stored_with_the_check(world, tmp_path):
    responses = _import_written(world.owner, tmp_path)

    assert [r.status_code for r in responses] == [201, 201, 201]
    bodies = [r.json() for r in responses]
    assert [b["device_name"] for b in bodies] == list(RTX_PRO_6000_BLACKWELL)
    for body in bodies:
        assert body["entries"]["4096"]["num_stages"] == 4
        assert body["triton_version"] == "3.7.1"
        checked = body["compile_checked"]
        assert (checked["capability"], checked["limit_bytes"]) == ("12.0", 101376)
        assert checked["fewer_stages"] == [4096] and checked["kernel"] == KERNEL
    # the same requests again are the records on file
    again = _import_written(world.owner, tmp_path)
    assert [r.status_code for r in again] == [200, 200, 200]
    assert KernelConfig.objects.count() == 3


def _request(**checked):
    record = {**_checked().record(), **checked}
    content = {"1": SMALL, "4096": {**BIG, "num_stages": 4}}
    name = f"E=256,N=256,device_name={SERVER.replace(' ', '_')},dtype=fp8_w8a8.json"
    return {"file_name": name, "content": content, "compile_checked": record}


@pytest.mark.parametrize(
    ("file_name", "checked", "said"),
    [
        (
            "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
            {},
            "compile_checked: checked for compute capability 12.0, but NVIDIA H200 is 9.0",
        ),
        (None, {"entries": 3}, "compile_checked: checked 3 entries, the file has 2"),
        (None, {"max_shared_bytes": 131072}, "max_shared_bytes 131072 is over limit_bytes"),
        (None, {"capability": "twelve"}, "compile_checked.capability"),
    ],
)
def test_a_check_that_cannot_be_of_the_file_on_its_gpu_is_refused(world, file_name, checked, said):
    body = _request(**checked)
    if file_name:
        body["file_name"] = file_name

    response = world.owner.post("/api/v1/kernel-configs/import", body)

    assert response.status_code in (400, 422)
    assert said in json.dumps(response.json())
    assert not KernelConfig.objects.exists()


def test_the_kernel_page_says_which_gpus_and_that_it_was_not_timed_there(world, client, tmp_path):
    _import_written(world.owner, tmp_path)
    server = KernelConfig.objects.get(device_name=SERVER)
    workstation = KernelConfig.objects.get(device_name=WORKSTATION)
    pb.sign_in(client)

    html = client.get(f"/kernels/{server.pk}/").content.decode()

    cell = unescape(html.split('class="gpu-for"')[1].split("</dd>")[0])
    assert f"{SERVER}, compute capability 12.0" in cell
    assert f'href="/kernels/{workstation.pk}/"' in cell and MAX_Q in cell
    assert (
        "Compile-checked for compute capability 12.0 in vLLM 0.34.0's kernel (Triton 3.7.1):"
        " every entry fits 101,376 bytes of shared memory per block (at most 98,304); M=4096"
        " with fewer pipeline stages than given, to fit. Not timed on 12.0: a tune on a worker"
        " with such a GPU times it." in cell
    )
    assert "Timed there" not in cell

    # a worker on a Server Edition tunes the shape: the checked file points at the timed one
    tuned, _ = kernel_config_store(
        device_name=SERVER,
        E=256,
        N=256,
        dtype="fp8_w8a8",
        block_shape=[128, 128],
        triton_version="3.7.1",
        entries={"1": SMALL, "4096": {**BIG, "num_stages": 3}},
        source="tuned",
        kernel_engine="vllm",
        kernel_version="0.34.0",
    )
    before = client.get(f"/kernels/{server.pk}/").content.decode()
    assert f'href="/kernels/{tuned.pk}/">Timed there in v2.</a>' in before
    timed = client.get(f"/kernels/{tuned.pk}/").content.decode()
    cell = timed.split('class="gpu-for"')[1].split("</dd>")[0]
    assert "Compile-checked" not in cell and "12.0" in cell


def test_a_file_for_a_gpu_of_one_name_says_its_gpu_only(world, client):
    config, _ = kernel_config_store(
        device_name="NVIDIA H200",
        E=256,
        N=256,
        dtype="bf16",
        block_shape=None,
        triton_version="3.6.0",
        entries={"1": SMALL},
    )
    pb.sign_in(client)

    html = client.get(f"/kernels/{config.pk}/").content.decode()

    cell = html.split('class="gpu-for"')[1].split("</dd>")[0]
    assert cell.strip(">") == "NVIDIA H200, compute capability 9.0"
