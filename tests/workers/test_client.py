import json

import httpx
import pytest

from domain.wire.levels import Level
from moeops.api.models import ApiToken
from moeops.kernels.models import KernelConfig
from moeops.runs.models import LevelResult, SweepRun
from moeops.runs.samples import TelemetrySample
from moeops.wsgi import application
from tests.api_base import make_world, wsgi_in_test_transaction
from tests.fakes import KERNEL_ENTRY
from workers.client import (
    SPOOL_GIVE_UP_S,
    SPOOL_MAX_BACKOFF_S,
    SPOOL_MAX_FAILURES,
    ApiError,
    BadPush,
    Conflict,
    MoeopsClient,
    NotFound,
    Unreachable,
)
from workers.engine_supervisor import EngineSupervisor
from workers.heartbeat import worker_status


class Switchable(httpx.BaseTransport):
    """The Django app in-process, with a switch that makes it unreachable or failing."""

    def __init__(self):
        self.app = httpx.WSGITransport(app=application)
        self.down = False
        self.fail_with = []  # statuses to answer before reaching the app
        self.retry_after = "2"  # the Retry-After header (s) of those answers
        self.poison = {}  # path → the status every request to it gets (a push the app fails)
        self.requests = []

    def handle_request(self, request):
        self.requests.append((request.method, request.url.path))
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if self.fail_with:
            status = self.fail_with.pop(0)
            headers = {"Retry-After": self.retry_after}
            return httpx.Response(status, headers=headers, json={"detail": "busy"})
        if request.url.path in self.poison:
            return httpx.Response(self.poison[request.url.path], json={"detail": "poison"})
        return self.app.handle_request(request)


@pytest.fixture
def world(db):
    with wsgi_in_test_transaction():
        yield make_world()


@pytest.fixture
def transport():
    return Switchable()


@pytest.fixture
def sleeps():
    return []


@pytest.fixture
def clock():
    """The spool's clock (UTC epoch s), moved by the test."""
    return [1.7e9]


@pytest.fixture
def client(world, transport, sleeps, clock, tmp_path):
    with MoeopsClient(
        "http://testserver",
        world.host_token,
        spool_dir=tmp_path / "spool",
        transport=transport,
        sleep=sleeps.append,
        clock=lambda: clock[0],
    ) as client:
        yield client


def _samples(n):
    return [{"gpu_index": i % 8, "ts": 1.7e9 + i // 8, "gpu_util": 0.0} for i in range(n)]


def test_it_runs_a_sweep_through_the_api(client, world):
    run = client.create_run("glm-5-sglang", label="c32", parameters={"levels": [32]})
    assert run["status"] == "queued" and run["host"] == "rtx-pro-6000"
    assert client.update_run(run["uuid"], status="running")["status"] == "running"
    level = {"concurrency": 32, "request_rate": float("inf"), "output_throughput": 512.5}
    assert client.post_level(run["uuid"], level)["key"] == "c=32,r=inf"
    client.post_telemetry(run["uuid"], _samples(16), batch_id="t1")
    client.post_engine_samples(run["uuid"], [{"ts": 1.7e9, "running": 32.0}], batch_id="e1")
    done = client.update_run(run["uuid"], status="succeeded", progress={"levels_done": 1})
    assert done["status"] == "succeeded"
    assert [lv["request_rate"] for lv in client.get_levels(run["uuid"])] == [None]
    assert client.get_run(run["id"])["level_count"] == 1
    assert client.list_runs(deployment="glm-5-sglang")["count"] == 1


def test_it_raises_conflict_on_an_illegal_move(client, world):
    run = world.run(status="succeeded")
    with pytest.raises(Conflict, match="cannot become running"):
        client.update_run(str(run.uuid), status="running")
    assert not client.spool.entries()


def test_it_raises_a_4xx_instead_of_spooling_it(client, world):
    other = world.run(deployment=world.other_deployment)
    with pytest.raises(ApiError) as caught:
        client.post_level(str(other.uuid), {"concurrency": 8, "output_throughput": 1.0})
    assert caught.value.status == 403
    with pytest.raises(NotFound):
        client.get_run("6f0c7f6e-55a4-4b42-9a3f-3d1f9f3c0d10")
    assert not client.spool.entries()


# Each push of a body the wire defines, with a field its model refuses: (what the message names
# the push, the field, the call).
BAD_PUSHES = [
    ("run", "status", lambda c: c.update_run("r", status="paused")),
    ("run", "progress", lambda c: c.update_run("r", advisory=True, progress=[1])),
    ("run takeover", "takeover", lambda c: c.take_over_run("r", 0, {})),
    ("observed", "engine", lambda c: c.post_observed("r", {"engine": "vllm 0.33"})),
    ("level", "completed", lambda c: c.post_level("r", {"concurrency": 8, "completed": True})),
    ("level", "output_throughput", lambda c: c.post_level("r", {"output_throughput": "5"})),
    ("level", "raw", lambda c: c.post_level("r", {"raw": {"note": "a\x00b"}})),
    ("samples", "samples.0.gpu_index", lambda c: c.post_telemetry("r", [{"gpu_index": "0"}], "b")),
    ("samples", "samples.0.ts", lambda c: c.post_engine_samples("r", [{"ts": -1.0}], "b")),
    ("tuning run", "kernel_engine", lambda c: c.update_tuning_run("t", kernel_engine="cuda")),
    ("timings", "timings.0.batch_size", lambda c: c.post_tuning_timings("t", [{"batch_size": 0}])),
    ("heartbeat", "sent_at", lambda c: c.post_heartbeat("h", {"sent_at": -1.0})),
    ("action report", "status", lambda c: c.report_action("a", status="queued")),
    ("action report", "steps", lambda c: c.report_action("a", advisory=True, steps={})),
]


@pytest.mark.parametrize(("what", "field", "push"), BAD_PUSHES, ids=[b[1] for b in BAD_PUSHES])
def test_a_push_the_api_would_refuse_is_refused_before_it_is_sent_or_spooled(
    client, transport, what, field, push
):
    # down: a push that passed would be spooled, to be refused in a replay on the web tier
    transport.down = True
    with pytest.raises(BadPush, match=f"^{what}: {field}: "):
        push(client)
    assert transport.requests == []
    assert client.spool.entries() == []


def test_a_bad_sample_sends_none_of_its_batch(client, transport, world):
    run = world.run(status="running")
    samples = _samples(12_000)
    samples[7_000]["gpu_index"] = True
    with pytest.raises(BadPush, match="^samples: samples.2000.gpu_index: "):
        client.post_telemetry(str(run.uuid), samples, batch_id="big")
    assert transport.requests == [] and not TelemetrySample.objects.exists()


def test_a_level_goes_as_the_wire_model_or_as_its_dict(client, world):
    run = world.run(status="running")
    level = Level(concurrency=16, request_rate=float("inf"), output_throughput=512.5)
    assert client.post_level(str(run.uuid), level)["key"] == "c=16,r=inf"
    level = {"concurrency": 32, "request_rate": float("inf"), "raw": {"ttft_s": float("nan")}}
    assert client.post_level(str(run.uuid), level)["key"] == "c=32,r=inf"
    assert LevelResult.objects.get(run=run, concurrency=32).raw == {"ttft_s": None}


def test_it_retries_connection_errors_with_backoff(client, transport, sleeps, world):
    transport.down = True
    calls = []
    original = transport.handle_request

    def flaky(request):
        calls.append(request)
        if len(calls) == 3:
            transport.down = False
        return original(request)

    transport.handle_request = flaky
    run = world.run()
    assert client.get_run(run.pk)["id"] == run.pk
    assert len(calls) == 3
    assert [round(s, 1) for s in sleeps] == [
        pytest.approx(0.5, abs=0.06),
        pytest.approx(1.0, abs=0.11),
    ]


def test_it_retries_5xx_and_429_honouring_retry_after(client, transport, sleeps, world):
    transport.fail_with = [503, 429]
    run = world.run()
    assert client.get_run(run.pk)["id"] == run.pk
    assert sleeps == [2.0, 2.0]


def test_it_gives_up_after_its_retries(client, transport, sleeps, world):
    transport.fail_with = [500] * 10
    # a server asking for an hour is waited on no longer than max_backoff_s
    transport.retry_after = "3600"
    with pytest.raises(Unreachable, match="500: busy"):
        client.get_run(1)
    assert len(sleeps) == 4
    assert [s for s in sleeps if s > 30] == []


def test_it_spools_pushes_while_the_web_tier_is_down_and_replays_them_once(
    client, transport, world
):
    transport.down = True
    run = client.create_run("glm-5-sglang", label="offline")
    assert run["spooled"] is True
    client.update_run(run["uuid"], status="running")
    client.post_level(run["uuid"], {"concurrency": 64, "output_throughput": 879.0})
    client.post_telemetry(run["uuid"], _samples(40), batch_id="b1")
    client.update_run(run["uuid"], status="succeeded")
    assert len(client.spool.entries()) == 5
    assert not SweepRun.objects.exists()

    transport.down = False
    assert client.replay_spool() == (5, 0)
    stored = SweepRun.objects.get(uuid=run["uuid"])
    assert stored.status == "succeeded"
    assert LevelResult.objects.get(run=stored).output_throughput == 879.0
    assert TelemetrySample.objects.filter(run=stored).count() == 40
    assert client.replay_spool() == (0, 0)

    # the same pushes again (a worker that did not know they arrived) store nothing new
    client.post_telemetry(run["uuid"], _samples(40), batch_id="b1")
    client.post_level(run["uuid"], {"concurrency": 64, "output_throughput": 879.0})
    assert TelemetrySample.objects.count() == 40 and LevelResult.objects.count() == 1


def test_a_new_push_waits_behind_the_spool(client, transport, world):
    transport.down = True
    run = client.create_run("glm-5-sglang")
    transport.down = False
    # the run must exist before its level arrives: the spooled create goes first
    answer = client.post_level(run["uuid"], {"concurrency": 8, "output_throughput": 1.0})
    assert answer["key"] == "c=8,r=inf"
    assert [path for method, path in transport.requests if method == "POST"][-2:] == [
        "/api/v1/runs",
        f"/api/v1/runs/{run['uuid']}/levels",
    ]
    assert not client.spool.entries()


def _replay_until_settled(client, clock, times=SPOOL_MAX_FAILURES):
    """Replay as often as the spool's backoff lets a failing push be tried `times` times."""
    for _ in range(times):
        clock[0] += SPOOL_MAX_BACKOFF_S
        client.replay_spool()


def test_a_refused_spooled_push_is_set_aside_after_its_refusals(
    client, transport, world, clock, tmp_path
):
    running = world.run(status="running")
    queued = world.run()
    transport.down = True
    # a negative duration: the API refuses the level (400)
    client.post_level(str(running.uuid), {"concurrency": 8, "duration": -3})
    client.update_run(str(queued.uuid), status="running")
    transport.down = False
    # the refused push waits its backoff and does not hold back the other run's
    assert client.replay_spool() == (1, 1)
    queued.refresh_from_db()
    assert queued.status == "running"
    assert client.replay_spool() == (0, 1)
    _replay_until_settled(client, clock, SPOOL_MAX_FAILURES - 1)
    assert client.spool.entries() == [] and client.spool.rejected_count() == 1
    reason = next((tmp_path / "spool" / "rejected").glob("*.txt")).read_text()
    assert reason.startswith("400: ") and f"({SPOOL_MAX_FAILURES} failures since" in reason


def test_a_push_that_always_gets_a_5xx_does_not_block_the_rest(client, transport, world, clock):
    poisoned, other = world.run(status="running"), world.run(status="running")
    transport.down = True
    client.post_level(str(poisoned.uuid), {"concurrency": 8, "output_throughput": 1.0})
    client.update_run(str(poisoned.uuid), status="succeeded")
    client.post_level(str(other.uuid), {"concurrency": 8, "output_throughput": 2.0})
    client.update_run(str(other.uuid), status="succeeded")
    transport.down = False
    transport.poison[f"/api/v1/runs/{poisoned.uuid}/levels"] = 500

    assert client.replay_spool() == (2, 2)
    other.refresh_from_db()
    assert other.status == "succeeded" and other.levels.count() == 1
    # the poisoned run's status waits behind its level, the order the analysis needs
    poisoned.refresh_from_db()
    assert poisoned.status == "running"
    # a new push of another run goes through at once
    third = world.run(status="running")
    client.post_engine_samples(str(third.uuid), [{"ts": 1.7e9, "running": 1.0}], batch_id="e")
    assert third.engine_samples.count() == 1

    # failing for less than SPOOL_GIVE_UP_S keeps it; then it is moved aside and the rest goes
    _replay_until_settled(client, clock)
    assert client.spool.rejected_count() == 0
    clock[0] += SPOOL_GIVE_UP_S
    client.replay_spool()
    assert client.spool.rejected_count() == 1 and client.spool.entries() == []
    poisoned.refresh_from_db()
    assert poisoned.status == "succeeded" and poisoned.levels.count() == 0


def test_a_web_tier_that_fails_everything_marks_no_push(client, transport, world, clock):
    run = world.run(status="running")
    transport.down = True
    client.post_level(str(run.uuid), {"concurrency": 8, "output_throughput": 1.0})
    transport.down = False
    # the health check fails too: the web tier is down, not the push
    transport.poison = {"/api/v1/health": 502, f"/api/v1/runs/{run.uuid}/levels": 502}
    for _ in range(SPOOL_MAX_FAILURES + 1):
        assert client.replay_spool() == (0, 1)
        clock[0] += SPOOL_GIVE_UP_S
    [entry] = client.spool.entries()
    assert "failures" not in json.loads(entry.read_bytes())
    transport.poison = {}
    assert client.replay_spool() == (1, 0)


def test_the_spool_outlives_the_worker_process(world, transport, tmp_path):
    transport.down = True
    options = {"spool_dir": tmp_path, "transport": transport, "sleep": lambda s: None}
    with MoeopsClient("http://testserver", world.host_token, **options) as first:
        run = first.create_run("glm-5-sglang")
    transport.down = False
    with MoeopsClient("http://testserver", world.host_token, **options) as second:
        assert second.replay_spool() == (1, 0)
    assert SweepRun.objects.filter(uuid=run["uuid"]).exists()


def test_without_a_spool_an_outage_raises(world, transport):
    transport.down = True
    client = MoeopsClient(
        "http://testserver",
        world.host_token,
        spool=False,
        transport=transport,
        sleep=lambda s: None,
    )
    with pytest.raises(Unreachable, match="ConnectError"):
        client.post_level("1", {"concurrency": 1, "output_throughput": 1.0})


def test_it_splits_large_telemetry_into_stable_batches(client, world):
    run = world.run(status="running")
    answers = client.post_telemetry(str(run.uuid), _samples(12_000), batch_id="big")
    assert [a["batch_id"] for a in answers] == ["big.0", "big.1", "big.2"]
    assert [a["count"] for a in answers] == [5000, 5000, 2000]
    client.post_telemetry(str(run.uuid), _samples(12_000), batch_id="big")
    assert TelemetrySample.objects.filter(run=run).count() == 12_000


def test_it_pushes_and_exports_kernel_configs(client, world):
    name = "E=256,N=256,device_name=NVIDIA_H200.json"
    text = json.dumps({"triton_version": "3.7.1", "1": KERNEL_ENTRY}, indent=4) + "\n"
    pushed = client.push_kernel_config(name, text)
    assert pushed["version"] == 1
    assert client.push_kernel_config(name, json.loads(text))["id"] == pushed["id"]
    file_name, path, content = client.export_kernel_config(pushed["id"], style="sglang")
    assert file_name == name
    assert path == f"triton_3_7_1/{name}"
    assert json.loads(content) == {"1": KERNEL_ENTRY}
    assert KernelConfig.objects.count() == 1


def test_it_records_a_tuning_run(client, world):
    tuning = client.post_tuning_run(
        host="rtx-pro-6000", E=256, N=256, hidden_size=6144, topk=8, batch_sizes=[1, 64]
    )
    client.update_tuning_run(tuning["uuid"], status="running", progress={"batch_size": 1})
    client.post_tuning_timings(tuning["uuid"], [{"batch_size": 1, "tuned_us": 24.0}])
    done = client.update_tuning_run(tuning["uuid"], status="succeeded", wall_s=30.5)
    assert done["status"] == "succeeded" and done["timings"][0]["tuned_us"] == 24.0


def test_it_records_topology_and_gpus(client, world):
    matrix = "\tGPU0\tGPU1\nGPU0\t X \tNV18\nGPU1\tNV18\t X \n"
    recorded = client.post_topology("rtx-pro-6000", nvidia_smi_topo=matrix)
    assert recorded["created"] is True
    assert client.post_topology("rtx-pro-6000", nvidia_smi_topo=matrix)["created"] is False
    gpus = client.post_gpus("rtx-pro-6000", [{"index": 0, "name": "NVIDIA RTX PRO 6000"}])
    assert gpus["updated"] == 1


def test_a_token_from_the_environment_is_used(world, transport, monkeypatch):
    monkeypatch.setenv("MOEOPS_URL", "http://testserver/")
    monkeypatch.setenv("MOEOPS_TOKEN", world.owner_token)
    with MoeopsClient(spool=False, transport=transport) as client:
        assert client.list_runs()["count"] == 0
    assert ApiToken.objects.get(name="owner").last_used is not None


# A spooled push as the client writes it, to be spoiled one field at a time.
GOOD_ENTRY = {"method": "POST", "path": "/runs/x/levels", "body": {}, "spooled_at": 1.7e9}
# The name a worker's spool file has: older than any push of the test, so replayed first.
POISON_NAME = "01796307891654025847-99999-000001.json"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[]", "a JSON list, not an object"),
        ('"a push"', "a JSON str, not an object"),
        ("{", "not JSON: "),
        ("[" * 100_000 + "]" * 100_000, "not JSON: "),
        (json.dumps({"path": "/runs/x/levels", "body": {}}), "method: Field required"),
        (json.dumps({**GOOD_ENTRY, "retry_at": "soon"}), "retry_at: Input should be a valid"),
        (json.dumps({**GOOD_ENTRY, "method": 5}), "method: Input should be 'POST'"),
        (json.dumps({**GOOD_ENTRY, "method": "GET"}), "method: Input should be 'POST'"),
        (json.dumps({**GOOD_ENTRY, "path": 7}), "path: Input should be a valid string"),
        (json.dumps({**GOOD_ENTRY, "path": "runs/x"}), "path: String should match"),
        (json.dumps({**GOOD_ENTRY, "path": "/runs/x\n"}), "path: String should match"),
        (json.dumps({**GOOD_ENTRY, "body": "x"}), "body: Input should be a valid dictionary"),
        (json.dumps({**GOOD_ENTRY, "failures": "2"}), "failures: Input should be a valid integer"),
        (json.dumps({**GOOD_ENTRY, "failures": True}), "failures: Input should be a valid integer"),
        (json.dumps({**GOOD_ENTRY, "failures": 10**30}), "failures: Input should be less than"),
        (json.dumps({**GOOD_ENTRY, "error": ["x"]}), "error: Input should be a valid string"),
        (json.dumps(GOOD_ENTRY)[:-1] + ', "retry_at": 1' + "0" * 400 + "}", "retry_at: "),
        (json.dumps(GOOD_ENTRY)[:-1] + ', "failing_since": 1e400}', "failing_since: "),
        (json.dumps(GOOD_ENTRY)[:-1] + ', "retry_at": NaN}', "retry_at: "),
    ],
)
def test_a_spool_file_that_holds_no_push_is_moved_aside_and_the_rest_goes_on(
    client, world, tmp_path, text, reason
):
    run = world.run(status="running")
    poison = tmp_path / "spool" / POISON_NAME
    poison.parent.mkdir()
    poison.write_text(text)

    # a push replays the spool first: the poison is moved aside, the push goes through
    answer = client.post_level(str(run.uuid), {"concurrency": 8, "output_throughput": 1.0})

    assert answer["key"] == "c=8,r=inf" and run.levels.count() == 1
    assert client.spool.entries() == [] and not poison.exists()
    rejected = tmp_path / "spool" / "rejected"
    assert (rejected / POISON_NAME).read_text() == text
    kept = (rejected / POISON_NAME.replace(".json", ".reason.txt")).read_text()
    assert kept.startswith(f"not a spool entry: {reason}")
    # the heartbeat counts it, as the host page shows
    status = worker_status("host.x", supervisor=EngineSupervisor(tmp_path), spool=client.spool)
    assert status["spool"] == {"waiting": 0, "rejected": 1}


def test_a_push_to_a_path_with_a_name_in_it_reads_as_an_entry(client):
    entry = client.spool.append("PATCH", "/deployments/GLM-5 on gpu 1 ü", {"status": "stopped"})

    record = client.spool.read(entry)

    assert (record.method, record.path, record.body) == (
        "PATCH",
        "/deployments/GLM-5 on gpu 1 ü",
        {"status": "stopped"},
    )


def test_a_poison_entry_behind_a_waiting_push_holds_back_nothing(client, transport, world):
    run = world.run(status="running")
    transport.down = True
    client.post_level(str(run.uuid), {"concurrency": 8, "output_throughput": 1.0})
    client.spool.folder.joinpath(POISON_NAME).write_text("[]")
    transport.down = False

    assert client.replay_spool() == (1, 0)
    assert run.levels.count() == 1 and client.spool.rejected_count() == 1


def test_a_spooled_push_refused_with_409_is_moved_aside_at_once(client, transport, world):
    finished = world.run(status="failed")
    transport.down = True
    client.update_run(str(finished.uuid), status="running")
    transport.down = False

    # a finished run stays finished, so a retry would be refused alike: not retried
    assert client.replay_spool() == (0, 0)
    assert client.spool.rejected_count() == 1
    reason = next(client.spool.rejected.glob("*.txt")).read_text()
    assert reason.startswith("409: ") and "(final: not retried)" in reason


def _a_folder(entry):
    entry.mkdir()
    (entry / "inside.json").write_text(json.dumps(GOOD_ENTRY))


def _a_dangling_link(entry):
    entry.symlink_to(entry.parent / "gone.json")


@pytest.mark.parametrize(
    ("lay", "reason"),
    [(_a_folder, "Is a directory"), (_a_dangling_link, "No such file or directory")],
)
def test_a_spool_entry_that_is_no_readable_file_is_moved_aside_and_the_push_goes_on(
    client, world, tmp_path, lay, reason
):
    run = world.run(status="running")
    poison = tmp_path / "spool" / POISON_NAME
    poison.parent.mkdir()
    lay(poison)

    answer = client.update_run(str(run.uuid), status="succeeded")

    assert answer["status"] == "succeeded"
    assert client.spool.entries() == [] and not poison.is_symlink() and not poison.exists()
    rejected = tmp_path / "spool" / "rejected"
    assert (rejected / POISON_NAME).is_symlink() or (rejected / POISON_NAME).is_dir()
    kept = (rejected / POISON_NAME.replace(".json", ".reason.txt")).read_text()
    assert kept == f"not a spool entry: cannot be read: {reason}\n"
    assert client.spool.rejected_count() == 1


def test_an_entry_that_cannot_be_moved_aside_either_holds_back_no_push(client, world, tmp_path):
    run = world.run(status="running")
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / POISON_NAME).mkdir()
    # rejected/ is a file: nothing can be moved into it
    (spool / "rejected").write_text("")

    answer = client.update_run(str(run.uuid), status="succeeded")

    assert answer["status"] == "succeeded"
    assert (spool / POISON_NAME).is_dir()
