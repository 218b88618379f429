"""Kernel-config files uploaded on the kernels page: the API's import service in a form."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from moeops.kernels.models import KernelConfig
from tests import page_base as pb
from tests.fakes import FIXTURES

pytestmark = pytest.mark.django_db
CONFIGS = FIXTURES / "kernel_configs"
FP8 = CONFIGS / (
    "E=128,N=2048,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Workstation_Edition,"
    "dtype=fp8_w8a8,block_shape=[128,128].json"
)


@pytest.fixture
def member(client):
    return pb.sign_in(client)


def _upload(client, path, name=None, **extra):
    upload = SimpleUploadedFile(name or path.name, path.read_bytes())
    return client.post("/kernels/upload/", {"file": upload, **extra})


def test_the_kernels_page_offers_the_upload(client, member):
    html = client.get("/kernels/").content.decode()
    form = html.split('id="kernel-upload"')[1].split("</form>")[0]
    assert 'action="/kernels/upload/"' in form and 'enctype="multipart/form-data"' in form


def test_an_engine_file_is_stored_from_its_name_and_text(client, member):
    response = _upload(client, FP8)
    config = KernelConfig.objects.get()
    assert response["Location"] == f"/kernels/{config.pk}/"
    assert (config.E, config.N, config.dtype, config.block_shape) == (
        128,
        2048,
        "fp8_w8a8",
        [128, 128],
    )
    assert config.device_name == "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
    assert config.source == "imported" and config.original_file_name == FP8.name
    # the same file again is the version on record
    again = _upload(client, FP8)
    assert again["Location"] == response["Location"] and KernelConfig.objects.count() == 1


def test_a_renamed_upload_takes_the_engine_name_given(client, member):
    response = _upload(client, FP8, name="download.json", file_name=FP8.name)
    assert response.status_code == 302
    assert KernelConfig.objects.get().E == 128


def test_a_file_whose_name_says_no_shape_is_refused_saying_why(client, member):
    response = _upload(client, FP8, name="tuned.json")
    assert response.status_code == 400
    form = response.content.decode().split('id="kernel-upload"')[1].split("</form>")[0]
    assert "file_name: " in form and "<details open>" in form
    assert not KernelConfig.objects.exists()


def test_bad_entries_are_refused_as_the_api_refuses_them(client, member, tmp_path):
    bad = tmp_path / FP8.name
    bad.write_text('{"1": {"BLOCK_SIZE_M": "sixteen"}}')
    response = _upload(client, bad)
    assert response.status_code == 400
    assert "content: " in response.content.decode()
    assert not KernelConfig.objects.exists()


@pytest.mark.parametrize(
    "name",
    [
        "E=99999999999999999999,N=64,device_name=NVIDIA_H200.json",
        "E=128,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[0,0].json",
    ],
)
def test_a_name_whose_shape_no_engine_writes_is_refused_on_the_name(client, member, name):
    response = _upload(client, FP8, file_name=name)
    assert response.status_code == 400
    form = response.content.decode().split('id="kernel-upload"')[1].split("</form>")[0]
    assert "file_name: " in form and "must be" in form
    assert not KernelConfig.objects.exists()
