"""A finished run is closed to writes, and an idempotency key stores one body: the same key
sent again with the same body is a repeat (200), with another body a 409 naming the key."""

import time

import pytest

from moeops.runs.models import LevelResult
from moeops.runs.samples import TelemetryBatch, TelemetrySample
from tests.api_base import make_world
from tests.fakes import FIXTURES

LEVEL = {"concurrency": 8, "completed": 32, "duration": 4.0, "output_throughput": 806.3}


@pytest.fixture
def world(db):
    return make_world()


def _samples(n, power_w=85.0):
    return [{"gpu_index": i % 2, "ts": 1.7e9 + i // 2, "power_w": power_w} for i in range(n)]


def _engine_samples(n, running=8.0):
    return [{"ts": 1.7e9 + i, "running": running, "queued": 0.0} for i in range(n)]


def _levels(world, run):
    return world.host_worker.post(f"/api/v1/runs/{run.uuid}/levels", {**LEVEL, "attempt": 1})


# --------------------------------------------------------------------------- finished runs


@pytest.mark.parametrize("status", ["succeeded", "failed", "cancelled"])
def test_a_finished_run_takes_no_new_level(world, status):
    run = world.run(status=status, progress={"attempt": 2})

    answer = _levels(world, run)

    assert answer.status_code == 409
    assert answer.json()["detail"] == (
        f"run {run.uuid} is {status}: a finished run takes no more levels"
    )
    assert not LevelResult.objects.exists()


def test_a_finished_run_takes_no_samples(world):
    run = world.run(status="succeeded")
    telemetry = {"batch_id": "t1", "samples": _samples(4)}
    engine = {"batch_id": "e1", "samples": _engine_samples(4)}

    answers = [
        world.host_worker.post(f"/api/v1/runs/{run.uuid}/telemetry", telemetry),
        world.host_worker.post(f"/api/v1/runs/{run.uuid}/engine-samples", engine),
    ]

    assert [a.status_code for a in answers] == [409, 409]
    assert answers[0].json()["detail"].endswith("a finished run takes no more samples")
    assert not TelemetryBatch.objects.exists() and not TelemetrySample.objects.exists()


def test_a_finished_run_takes_no_progress_nor_snapshot_part(world):
    run = world.run(status="succeeded", progress={"levels_done": 2})
    url = f"/api/v1/runs/{run.uuid}"

    progress = world.host_worker.patch(url, {"progress": {"levels_done": 3}})
    telemetry = world.host_worker.patch(url, {"telemetry_status": "recorded"})
    observed = world.host_worker.post(f"{url}/snapshot", {"engine": {"engine": "vllm"}})

    assert progress.status_code == 409
    assert progress.json()["detail"] == (
        f"run {run.uuid} is succeeded: a finished run takes no more writes (progress)"
    )
    assert telemetry.status_code == 409 and "(telemetry_status)" in telemetry.json()["detail"]
    assert observed.status_code == 409 and "snapshot parts" in observed.json()["detail"]
    run.refresh_from_db()
    assert run.progress == {"levels_done": 2} and run.telemetry_status == "pending"
    assert "engine" not in run.snapshot
    # a person may still rename it
    assert world.owner.patch(url, {"label": "the good one"}).json()["label"] == "the good one"


def test_an_imported_run_takes_no_level(world):
    text = (FIXTURES / "results" / "vllm_bench_serve_append.jsonl").read_text()
    body = {
        "format": "vllm",
        "deployment": "glm-5-sglang",
        "content": text,
        "accept_mismatch": True,
    }
    run = world.owner.post("/api/v1/runs/import", body).json()["run"]

    new = world.owner.post(f"/api/v1/runs/{run['uuid']}/levels", {**LEVEL, "concurrency": 3})
    over = world.owner.post(f"/api/v1/runs/{run['uuid']}/levels", {**LEVEL, "concurrency": 32})

    assert new.status_code == 409 and "is succeeded" in new.json()["detail"]
    # a key of the file's levels: stored from the file, not from this body
    assert over.status_code == 409 and "already stored with another body" in over.json()["detail"]
    assert LevelResult.objects.filter(run_id=run["id"]).count() == 2


def test_the_pushes_that_finished_a_run_may_be_sent_again(world):
    """A worker pushes its levels, then the final status; a push whose answer was lost is sent
    again from its spool after the run ended: the same body is a repeat (200), not a 409."""
    run = world.run(status="running")
    url = f"/api/v1/runs/{run.uuid}"
    progress = {"levels_done": 1, "attempt": 1, "heartbeat": time.time()}
    samples = {"batch_id": "t1", "samples": _samples(4)}
    final = {"status": "succeeded", "error": "", "progress": progress}
    assert _levels(world, run).status_code == 201
    assert world.host_worker.post(f"{url}/telemetry", samples).status_code == 201
    assert world.host_worker.patch(url, final).json()["status"] == "succeeded"

    again = [
        _levels(world, run),
        world.host_worker.post(f"{url}/telemetry", samples),
        world.host_worker.patch(url, final),
    ]

    assert [a.status_code for a in again] == [200, 200, 200]
    assert LevelResult.objects.get(run=run).output_throughput == 806.3
    assert TelemetrySample.objects.filter(run=run).count() == 4


# --------------------------------------------------------------------------- idempotency keys


def test_a_level_key_sent_again_with_another_body_is_refused(world):
    run = world.run(status="running")
    assert _levels(world, run).status_code == 201

    other = world.host_worker.post(
        f"/api/v1/runs/{run.uuid}/levels", {**LEVEL, "output_throughput": 999.0}
    )

    assert other.status_code == 409
    assert other.json()["detail"] == (
        f"level c=8,r=inf of run {run.uuid} is already stored with another body: a key is "
        "stored once, send it again only with the same body"
    )
    assert LevelResult.objects.get(run=run).output_throughput == 806.3
    # the same body is still a repeat, and unlimited written as inf is the same level
    assert _levels(world, run).status_code == 200
    inf = {**LEVEL, "attempt": 1, "request_rate": "inf"}
    assert world.host_worker.post(f"/api/v1/runs/{run.uuid}/levels", inf).status_code == 200


@pytest.mark.parametrize(
    ("path", "first", "other"),
    [
        ("telemetry", _samples(4), _samples(4, power_w=90.0)),
        ("telemetry", _samples(4), _samples(6)),
        ("engine-samples", _engine_samples(4), _engine_samples(4, running=9.0)),
    ],
)
def test_a_batch_id_sent_again_with_other_samples_is_refused(world, path, first, other):
    run = world.run(status="running")
    url = f"/api/v1/runs/{run.uuid}/{path}"
    assert world.host_worker.post(url, {"batch_id": "b1", "samples": first}).status_code == 201

    again = world.host_worker.post(url, {"batch_id": "b1", "samples": other})

    assert again.status_code == 409
    assert again.json()["detail"].startswith(f"{_kind(path)} sample batch 'b1' is already stored")
    assert TelemetryBatch.objects.get(run=run).count == 4
    assert world.host_worker.post(url, {"batch_id": "b1", "samples": first}).status_code == 200


def _kind(path):
    return "gpu" if path == "telemetry" else "engine"


def test_a_level_stored_before_bodies_were_hashed_takes_its_repeat(world):
    run = world.run(status="running")
    assert _levels(world, run).status_code == 201
    LevelResult.objects.filter(run=run).update(body_sha256="")

    assert _levels(world, run).status_code == 200
