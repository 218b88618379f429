"""The plan item "Tune for <engine> <version> and re-sweep": its button starts the tune of the
engine's own kernel, and on a managed deployment the tune's config is then applied, the engine
restarted and re-swept (the engine action carries the item to the before / after)."""

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from moeops import jobs
from moeops.engines import services as engine_services
from moeops.engines.models import EngineAction
from moeops.insights.models import Finding, PlanItem
from moeops.kernels import services as kernel_services
from moeops.kernels.models import TuningRun
from moeops.runs.models import SweepRun
from tests import page_base as pb
from tests import queues
from tests.api_base import make_managed_world
from tests.fakes import KERNEL_ENTRY

QUEUE = "host.rtx-pro-6000"
ARGV = ["vllm", "serve", "/models/glm-5", "--port", "8000"]
TITLE = "Tune for vLLM 0.34.0 and re-sweep"


@pytest.fixture
def world(db, client):
    world = make_managed_world()
    deployment, staff = world.deployment, world.staff
    recipe = engine_services.recipe_create(deployment=deployment, argv=ARGV, author=staff)
    recipe.applied_at = timezone.now()
    recipe.save(update_fields=["applied_at"])
    SweepRun.objects.create(
        deployment=deployment,
        status="succeeded",
        parameters={"levels": [4], "input_len": 32, "output_len": 64, "prompts_per_level": 8},
    )
    finding = Finding.objects.create(
        deployment=deployment, kind="kernel_provenance", key="tuned-on:1:0.34.0", title="t"
    )
    world.item = PlanItem.objects.create(
        deployment=deployment, finding=finding, title=TITLE, source="auto"
    )
    world.staff = staff
    User.objects.create_user("member", password="pw")
    return world


@pytest.fixture
def broker(monkeypatch, redis_url):
    queues.send_to(monkeypatch, redis_url)
    queues.clear(redis_url, QUEUE)
    yield redis_url
    queues.clear(redis_url, QUEUE)


def _press(client, world, user="ops"):
    client.login(username=user, password="pw")
    return client.post(f"/plan/{world.item.pk}/retune/")


def _tuned(tuning):
    """What the worker reports of a tune that wrote a config for the deployment's shape."""
    shape = tuning.deployment.kernel_shape()
    config, _ = _store(shape)
    kernel_services.tuning_run_update(tuning_run=tuning, status="running")
    kernel_services.tuning_run_update(tuning_run=tuning, status="succeeded", result=config)
    return config


def _store(shape):
    return pb.vllm_tuned_config(shape, {1: KERNEL_ENTRY}, triton_version="3.7.1")


def test_the_deployment_page_offers_the_tune_on_the_item(client, world):
    client.login(username="ops", password="pw")
    page = client.get(world.deployment.get_absolute_url()).content.decode()

    assert f'action="/plan/{world.item.pk}/retune/"' in page
    assert "once it succeeds moeops applies its config, restarts the engine" in page


def test_the_button_tunes_then_the_config_is_applied_restarted_and_re_swept(
    client, world, broker, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = _press(client, world)

    tuning = TuningRun.objects.get()
    assert response.status_code == 302 and response.url == f"/tunes/{tuning.uuid}/"
    assert (tuning.plan_item, tuning.engine) == (world.item, "vllm")
    world.item.refresh_from_db()
    assert world.item.status == "in_progress"
    [sent] = queues.queued(broker, QUEUE)
    assert sent.task == "workers.tune_kernel" and sent.kwargs["engine"] == "vllm"
    queues.clear(broker, QUEUE)

    with django_capture_on_commit_callbacks(execute=True):
        config = _tuned(tuning)

    action = EngineAction.objects.get()
    assert (action.kind, action.kernel_config, action.plan_item) == (
        "apply_config",
        config,
        world.item,
    )
    assert action.source == "tune" and action.requested_by is None
    assert list(action.recipe.kernel_configs.all()) == [config]
    assert action.after_run is not None and action.before_run is not None
    [sent] = queues.queued(broker, QUEUE)
    assert sent.task == "workers.engine_action"
    assert [link["task"] for link in sent.embed["chain"]] == ["workers.run_sweep"]
    world.item.refresh_from_db()
    assert world.item.status == "in_progress"

    # the hook delivered again (a retry) starts no second action and leaves the item in progress
    again = jobs.job_finished.apply(args=["kernels.tuningrun", tuning.pk]).get()
    assert again["moeops.engines.services.on_tune_finished"] == str(action.uuid)
    assert EngineAction.objects.count() == 1
    world.item.refresh_from_db()
    assert world.item.status == "in_progress"


def test_only_staff_may_start_what_restarts_a_managed_engine(client, world):
    response = _press(client, world, user="member")

    assert response.status_code == 302 and not TuningRun.objects.exists()
    world.item.refresh_from_db()
    assert world.item.status == "pending"


def test_a_failed_tune_leaves_the_item_to_do_and_applies_nothing(
    client, world, broker, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        _press(client, world)
    tuning = TuningRun.objects.get()

    # what follows a finished tune runs once its status is committed
    with django_capture_on_commit_callbacks(execute=True):
        kernel_services.tuning_run_update(tuning_run=tuning, status="failed", error="OOM")

    world.item.refresh_from_db()
    assert world.item.status == "pending" and not EngineAction.objects.exists()


def test_on_an_external_deployment_the_tune_is_all_moeops_does(
    client, world, broker, django_capture_on_commit_callbacks
):
    world.deployment.management = "external"
    world.deployment.save()
    client.login(username="member", password="pw")
    page = client.get(world.deployment.get_absolute_url()).content.decode()
    assert "moeops never restarts an external engine" in page

    with django_capture_on_commit_callbacks(execute=True):
        _press(client, world, user="member")
        _tuned(TuningRun.objects.get())

    world.item.refresh_from_db()
    assert world.item.status == "in_progress" and not EngineAction.objects.exists()
