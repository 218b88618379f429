"""The worker's end of an engine action (workers.engine_action) against the live web tier, with
the stand-in engine as the managed engine in real processes: a restart with a changed argument
checked against what the engine reports, a recipe that cannot start and the previous one back,
and the heartbeat that lists the managed engines."""

import sys
import time

import httpx
import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from moeops.api.models import ApiToken
from moeops.engines import services
from moeops.engines.models import EngineAction
from moeops.fleet.models import Deployment, Host
from tests import queues
from tests.api_base import GLM5_CONFIG
from workers import job
from workers.client import MoeopsClient
from workers.engine_action import ActionFailed, _check_recipe, run_action
from workers.engine_supervisor import EngineSupervisor
from workers.heartbeat import worker_status

pytestmark = pytest.mark.timeout(180)

HOST = "managed-h1"


@pytest.fixture
def managed(live_server, transactional_db, free_port, tmp_path, monkeypatch, redis_url):
    queues.send_to(monkeypatch, redis_url)
    queues.clear(redis_url, f"host.{HOST}")
    from moeops.fleet.models import ModelSpec

    model = ModelSpec(name="GLM-5", config_json=GLM5_CONFIG)
    model.fill_shape()
    model.save()
    host = Host.objects.create(name=HOST, worker_seen_at=timezone.now())
    port = free_port()
    deployment = Deployment.objects.create(
        name="glm-5 managed",
        model=model,
        host=host,
        engine="sglang",
        management="managed",
        endpoint_url=f"http://127.0.0.1:{port}",
        tp=8,
    )
    staff = User.objects.create_user("ops", is_staff=True)
    argv = [sys.executable, "-m", "localstack.standin", "--port", str(port)]
    services.recipe_create(
        deployment=deployment, argv=[*argv, "--max-running-requests", "16"], author=staff
    )
    _, token = ApiToken.issue(name="worker", host=host)
    supervisor = EngineSupervisor(tmp_path / "engines")
    with MoeopsClient(live_server.url, token, spool_dir=tmp_path / "spool") as client:
        world = {
            "deployment": deployment,
            "staff": staff,
            "client": client,
            "supervisor": supervisor,
            "redis": redis_url,
        }
        _act(world, "restart")
        yield world
    for state in supervisor.running():
        supervisor.stop(state["recipe"]["deployment"], grace_s=5)


def _act(world, kind, **fields):
    """Start the action on the web side, then run its chain's first task as the worker does."""
    action = services.engine_action_start(
        deployment=world["deployment"], kind=kind, user=world["staff"], **fields
    )
    [sent] = queues.queued(world["redis"], f"host.{HOST}")
    queues.clear(world["redis"], f"host.{HOST}")
    try:
        outcome = run_action(
            sent.kwargs["action_uuid"],
            sent.kwargs,
            client=world["client"],
            host_name=HOST,
            supervisor=world["supervisor"],
        )
    except ActionFailed as exc:
        outcome = f"failed: {exc}"
    return EngineAction.objects.get(pk=action.pk), outcome


def _cap(deployment):
    info = httpx.get(deployment.endpoint_url + "/get_server_info", timeout=5).json()
    return info["max_running_requests"]


def test_a_restart_with_a_changed_argument_is_checked_against_the_engine(managed):
    deployment = managed["deployment"]
    pid_before = managed["supervisor"].state(deployment.pk)["pid"]

    action, outcome = _act(managed, "restart_with_args", changes={"--max-running-requests": "8"})

    assert outcome == "succeeded" and action.status == "succeeded", action.error
    assert [s["name"] for s in action.steps] == ["stop", "kernel configs", "start", "check"]
    assert all(s["status"] == "done" for s in action.steps)
    # healthy is said once the engine reported the change, not when its port first answered
    start, check = action.steps[2:]
    assert start["detail"].startswith("its own process answers on its port after ")
    assert "healthy" not in start["detail"]
    assert check["detail"].startswith("healthy: the engine reports max_running_requests = 8")
    assert action.observed["max_running_requests"] == 8
    assert _cap(deployment) == 8
    state = managed["supervisor"].state(deployment.pk)
    assert state["recipe"]["version"] == 2 and state["pid"] != pid_before
    assert deployment.recipe_in_force() == action.recipe
    assert action.log_tail.startswith("== moeops: starting recipe v2")
    assert "recipe v1" not in action.log_tail  # the old engine's start is not this action's


def test_a_recipe_that_cannot_start_fails_with_its_log_and_the_previous_one_is_back(managed):
    deployment = managed["deployment"]

    action, outcome = _act(managed, "restart_with_args", changes={"--no-such-flag": "1"})

    assert outcome.startswith("failed: the engine exited with status 2")
    assert action.status == "failed"
    assert "unrecognized arguments: --no-such-flag 1" in action.error
    # the failed start's own lines, not the old engine's nor the revert's start
    assert action.log_tail.startswith("== moeops: starting recipe v2")
    assert "unrecognized arguments" in action.log_tail and "listening on" not in action.log_tail
    names = [(s["name"], s["status"]) for s in action.steps]
    assert names == [
        ("stop", "done"),
        ("kernel configs", "done"),
        ("start", "failed"),
        ("revert", "done"),
    ]
    assert action.steps[-1]["detail"].startswith("the previous recipe runs again")
    assert _cap(deployment) == 16
    assert managed["supervisor"].state(deployment.pk)["recipe"]["version"] == 1
    action.recipe.refresh_from_db()
    assert action.recipe.failed_at is not None
    assert deployment.recipe_in_force().version == 1


# A launcher that starts the stand-in without the running-request cap it is given: an engine
# that ignores part of its recipe (a wrapper script, a config file that wins over the flag).
DROPS_THE_CAP = (
    "import runpy, sys; a = sys.argv[1:]; i = a.index('--max-running-requests'); "
    "sys.argv = ['standin', *a[:i], *a[i + 2:]]; "
    "runpy.run_module('localstack.standin', run_name='__main__')"
)


def test_an_engine_that_ignores_its_recipe_is_never_called_healthy(managed):
    deployment = managed["deployment"]
    port = deployment.endpoint_url.rsplit(":", 1)[1]
    services.recipe_create(
        deployment=deployment,
        argv=[sys.executable, "-c", DROPS_THE_CAP, "--port", port, "--max-running-requests", "16"],
        author=managed["staff"],
    )

    action, outcome = _act(managed, "restart")

    # its process answered on its port, and then said it runs another cap than its recipe's
    assert outcome.startswith("failed: the engine came up without the change: ")
    assert action.status == "failed" and action.recipe.version == 2
    assert "the engine reports max_running_requests = 64, not 16 as the recipe" in action.error
    names = [(s["name"], s["status"]) for s in action.steps]
    assert names[2:] == [("start", "done"), ("check", "failed"), ("revert", "done")]
    assert not any("healthy" in s["detail"] for s in action.steps)
    action.recipe.refresh_from_db()
    assert action.recipe.failed_at is not None
    # the recipe that keeps its word runs again
    assert deployment.recipe_in_force().version == 1 and _cap(deployment) == 16


def test_a_recipe_of_another_host_is_not_run(managed):
    deployment = managed["deployment"]
    action = services.engine_action_start(
        deployment=deployment, kind="restart", user=managed["staff"]
    )
    [sent] = queues.queued(managed["redis"], f"host.{HOST}")

    with pytest.raises(ActionFailed, match="reached the worker of other-host"):
        run_action(
            str(action.uuid),
            sent.kwargs,
            client=managed["client"],
            host_name="other-host",
            supervisor=managed["supervisor"],
        )
    action.refresh_from_db()
    assert action.status == "failed"
    assert managed["supervisor"].state(deployment.pk)["recipe"]["version"] == 1


def _started(world, progress=None):
    """An action the web tier started, and a delivery claimed with the heartbeat `progress`
    (None: queued, not claimed yet); the payload its task carries."""
    action = services.engine_action_start(
        deployment=world["deployment"], kind="restart_with_args", user=world["staff"],
        changes={"--max-running-requests": "8"},
    )  # fmt: skip
    [sent] = queues.queued(world["redis"], f"host.{HOST}")
    queues.clear(world["redis"], f"host.{HOST}")
    if progress is not None:
        EngineAction.objects.filter(pk=action.pk).update(status="running", progress=progress)
    return action, sent.kwargs


def _deliver(world, action, payload):
    return run_action(
        str(action.uuid),
        payload,
        client=world["client"],
        host_name=HOST,
        supervisor=world["supervisor"],
    )


def test_an_action_delivered_again_while_its_first_delivery_beats_stands_down(managed):
    deployment = managed["deployment"]
    pid_before = managed["supervisor"].state(deployment.pk)["pid"]
    beat = {"heartbeat": time.time(), "attempt": 1, "worker": {"host": "another-host", "pid": 7}}
    action, payload = _started(managed, beat)

    assert _deliver(managed, action, payload) == job.BUSY

    # the engine the first delivery is restarting is not touched
    assert managed["supervisor"].state(deployment.pk)["pid"] == pid_before
    action.refresh_from_db()
    assert action.status == "running" and action.steps == [] and action.progress == beat


def test_an_action_whose_delivery_went_silent_is_taken_over_and_carried_out(managed):
    deployment = managed["deployment"]
    silent = {"heartbeat": time.time() - 60, "attempt": 1, "worker": {"host": "gone", "pid": 7}}
    action, payload = _started(managed, silent)

    assert _deliver(managed, action, payload) == "succeeded"

    action.refresh_from_db()
    assert action.status == "succeeded" and action.progress["attempt"] == 2
    assert _cap(deployment) == 8


def test_an_action_taken_over_while_it_runs_stops_and_reverts_nothing(managed, monkeypatch):
    deployment = managed["deployment"]
    action, payload = _started(managed)
    stop = managed["supervisor"].stop

    def stopped_then_taken_over(deployment_id, **kwargs):
        stopped = stop(deployment_id, **kwargs)
        # this worker was thought gone: another delivery takes the action over meanwhile
        services.engine_action_report(
            action=EngineAction.objects.get(pk=action.pk),
            takeover=2,
            progress={"heartbeat": time.time(), "attempt": 2},
        )
        return stopped

    monkeypatch.setattr(managed["supervisor"], "stop", stopped_then_taken_over)
    with pytest.raises(ActionFailed, match="another delivery of the action took it over"):
        _deliver(managed, action, payload)

    action.refresh_from_db()
    # the other delivery carries it on: this one neither started a recipe nor brought one back
    assert action.status == "running" and action.progress["attempt"] == 2
    assert [s["name"] for s in action.steps] == ["stop"]
    assert managed["supervisor"].state(deployment.pk) is None


def test_the_heartbeat_lists_the_managed_engines_with_their_log(managed):
    deployment = managed["deployment"]

    spool = managed["client"].spool
    spool.reject(spool.append("POST", "/runs", {"uuid": "x"}), "400: parameters.levels")
    status = worker_status(f"host.{HOST}", supervisor=managed["supervisor"], spool=spool)
    assert status["spool"] == {"waiting": 0, "rejected": 1}
    managed["client"].post_heartbeat(HOST, status)

    host = Host.objects.get(name=HOST)
    engine = host.managed_engine(deployment.pk)
    assert engine["version"] == 1 and engine["base_url"] == deployment.endpoint_url
    assert "starting recipe v1" in engine["log_tail"]
    assert host.worker_alive()
    assert host.worker_status["spool"]["rejected"] == 1


def test_the_check_finds_an_engine_that_runs_with_other_numbers_than_its_recipe():
    # vLLM's /server_info, as identify_engine flattens it, of an engine started otherwise
    identity = {
        "args": {
            "scheduler_config.max_num_seqs": 16,
            "model_config.max_model_len": 4096,
            "model_config.enforce_eager": True,
            "model_config.dtype": "torch.bfloat16",
        }
    }
    argv = ["vllm", "serve", "m", "--max-num-seqs", "16", "--max-model-len", "1024"]
    argv += ["--enforce-eager", "--dtype", "bfloat16", "--max-num-batched-tokens", "2k"]

    assert _check_recipe(identity, argv, changes={}) == [
        ("the engine reports max_model_len = 4096, not 1024 as the recipe", False)
    ]
    assert _check_recipe(identity, argv, changes={"--max-model-len": "1024"}) == []
