"""Traces captured by hand, uploaded for a level of a run (POST /api/v1/runs/{ref}/profiles/upload
and the run page's form): read by domain.step_trace into a captured profile listed as uploaded;
a file over the limit or one the reader refuses is a 400 with its sentence, nothing stored. The
fixtures are real vLLM CPU-build windows (tests/fixtures/traces)."""

import io
import zipfile
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile

from moeops.runs import measurements
from moeops.runs.models import LevelProfile
from tests import page_base as pb
from tests.api_base import make_world

TRACES = Path(__file__).parent.parent / "fixtures" / "traces"
TP2 = TRACES / "vllm-cpu-tp2"


def _zip_of(folder):
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w") as archive:
        for path in sorted(folder.iterdir()):
            archive.write(path, path.name)
    return packed.getvalue()


def _rank0(folder=TP2):
    return next(p for p in sorted(folder.iterdir()) if "rank0" in p.name)


@pytest.fixture
def world(db):
    return make_world()


def _upload(client, run, name, data, **fields):
    form = {"concurrency": "8", **fields, "file": SimpleUploadedFile(name, data)}
    return client.client.post(
        f"/api/v1/runs/{run.uuid}/profiles/upload", form, headers=client.headers
    )


def test_a_zip_of_two_ranks_is_read_into_a_captured_profile(world):
    run = world.run(status="succeeded")

    answer = _upload(world.host_worker, run, "window.zip", _zip_of(TP2))

    assert answer.status_code == 201, answer.json()
    body = answer.json()
    assert (body["status"], body["source"], body["concurrency"]) == ("captured", "upload", 8)
    assert [r["rank"] for r in body["breakdown"]["ranks"]] == [0, 1]
    assert body["traces"] == [
        {"host": "uploaded", "path": "window.zip", "size_bytes": len(_zip_of(TP2))}
    ]
    # the names are the upload's, not the web tier's temporary folder
    assert body["breakdown"]["ranks"][0]["file"].startswith("window.zip:dp0_pp0_tp0")
    assert "moeops-upload" not in answer.content.decode()


def test_the_same_file_again_is_a_repeat_and_another_the_levels_next_upload(world):
    run = world.run(status="succeeded")
    data = _zip_of(TP2)

    first = _upload(world.host_worker, run, "window.zip", data)
    again = _upload(world.host_worker, run, "window.zip", data)
    other = _upload(world.host_worker, run, "rank0.json.gz", _rank0().read_bytes())

    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 201)
    assert [p.attempt for p in LevelProfile.objects.order_by("id")] == [1, 2]
    listed = world.read_only.get(f"/api/v1/runs/{run.uuid}/profiles").json()
    assert [p["traces"][0]["path"] for p in listed] == ["rank0.json.gz"]


@pytest.mark.parametrize(
    "name, data, said",
    [
        ("notes.txt", b"hello", "file: notes.txt is not a trace file (.json.gz, .json)"),
        ("broken.zip", b"PK not a zip", "file: broken.zip: not a readable zip"),
        ("empty.json", b"{}", "file: "),
    ],
)
def test_a_file_the_reader_refuses_is_a_400_with_its_sentence(world, name, data, said):
    run = world.run(status="succeeded")

    answer = _upload(world.host_worker, run, name, data)

    assert answer.status_code == 400
    assert answer.json()["detail"].startswith(said)
    assert "moeops-upload" not in answer.json()["detail"]
    assert not LevelProfile.objects.exists()


def test_a_file_over_the_limit_is_refused_unread(world, settings):
    settings.TRACE_UPLOAD_MAX_BYTES = 1000
    run = world.run(status="succeeded")

    answer = _upload(world.host_worker, run, "window.zip", _zip_of(TP2))

    assert answer.status_code == 400
    assert (
        "more than the 1,000 a trace upload may be (MOEOPS_MAX_TRACE_BYTES)"
        in (answer.json()["detail"])
    )
    assert not LevelProfile.objects.exists()


def test_another_hosts_token_may_not_upload(world):
    run = world.run(status="succeeded")

    answer = _upload(world.outsider, run, "window.zip", _zip_of(TP2))

    assert answer.status_code == 403


def test_the_run_page_reads_an_upload_into_its_panel(db, client):
    pb.sign_in(client)
    run = pb.run(pb.deployment(), levels=[{"concurrency": 8, "output_throughput": 100.0}])
    form = {"concurrency": "8", "file": SimpleUploadedFile("rank0.json.gz", _rank0().read_bytes())}

    response = client.post(f"/runs/{run.uuid}/profiles/upload/", form)

    profile = LevelProfile.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/runs/{run.uuid}/#profile-{profile.pk}"
    page = client.get(f"/runs/{run.uuid}/").content.decode()
    assert "Inside the step at concurrency 8" in page
    assert "uploaded: <code>rank0.json.gz</code>" in page


def test_the_run_page_shows_the_readers_sentence_on_the_file(db, client):
    pb.sign_in(client)
    run = pb.run(pb.deployment(), levels=[])
    form = {"concurrency": "8", "file": SimpleUploadedFile("broken.zip", b"PK not a zip")}

    response = client.post(f"/runs/{run.uuid}/profiles/upload/", form)

    assert response.status_code == 400
    assert "broken.zip: not a readable zip" in response.content.decode()
    assert not LevelProfile.objects.exists()


@pytest.mark.parametrize(
    "name, said",
    [
        ("a\x00.json", "the file's name must not contain the NUL character"),
        ("x" * 300 + ".json", "the file's name is longer than 200 characters"),
    ],
)
def test_a_name_that_cannot_be_stored_is_refused(world, name, said):
    run = world.run(status="succeeded")

    with pytest.raises(ValidationError) as refused:
        measurements.profile_upload(run=run, concurrency=8, name=name, chunks=[b"{}"], size=2)

    assert refused.value.message_dict == {"file": [said]}
