"""A plan item's status moves (insights.models.PLAN_MOVES) through one entry point,
services.plan_item_transition, by compare-and-set: the moves allowed and the one refused, a
move from a status the row left meanwhile, and each writer (pages, API, admin, engine actions,
tunes) going through it."""

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.utils import timezone

from moeops import permissions
from moeops.engines import services as engine_services
from moeops.engines.models import EngineAction
from moeops.insights import services
from moeops.insights.models import PLAN_MOVES, Finding, PlanItem
from moeops.kernels import services as kernel_services
from moeops.kernels.models import TuningRun
from tests import page_base as pb
from tests.api_base import make_managed_world

pytestmark = pytest.mark.django_db

QUEUE = "host.rtx-pro-6000"
ARGV = ["vllm", "serve", "/models/glm-5", "--port", "8000", "--max-num-seqs", "4"]
STATUSES = ("pending", "in_progress", "completed")


@pytest.fixture
def world(db):
    return make_managed_world()


def _item(world, status="pending", title="Raise --max-num-seqs"):
    return PlanItem.objects.create(deployment=world.deployment, title=title, status=status)


def _status(item):
    return PlanItem.objects.get(pk=item.pk).status


def _in_force_recipe(world):
    recipe = engine_services.recipe_create(
        deployment=world.deployment, argv=ARGV, author=world.staff
    )
    recipe.applied_at = timezone.now()
    recipe.save(update_fields=["applied_at"])
    return recipe


def _restart_carrying_an_item(world):
    """A restart under an in-force recipe that carries out a pending plan item: (item, action)."""
    _in_force_recipe(world)
    item = _item(world)
    action = engine_services.engine_action_start(
        deployment=world.deployment, kind="restart", user=world.staff, plan_item=item
    )
    return item, action


@pytest.mark.parametrize(
    ("source", "target"), [(a, b) for a in STATUSES for b in STATUSES if a != b]
)
def test_each_move_in_the_table_is_made_and_the_others_refused(world, source, target):
    item = _item(world, status=source)
    if target in PLAN_MOVES[source]:
        services.plan_item_transition(item=item, status=target)
        assert (item.status, _status(item)) == (target, target)
        return
    with pytest.raises(ValidationError) as raised:
        services.plan_item_transition(item=item, status=target)
    assert "reopen it as pending first" in raised.value.message_dict["status"][0]
    assert _status(item) == source


def test_a_done_item_is_not_carried_out_again_until_reopened():
    assert PLAN_MOVES["completed"] == ("pending",)
    assert PlanItem(status="completed").can_move_to("completed")
    assert not PlanItem(status="completed").can_move_to("in_progress")


def test_an_unknown_status_names_the_field(world):
    item = _item(world)
    with pytest.raises(ValidationError) as raised:
        services.plan_item_transition(item=item, status="doing")
    assert "not 'doing'" in raised.value.message_dict["status"][0]


def test_a_move_from_a_status_the_row_left_meanwhile_is_refused(world):
    item = _item(world)
    stale = PlanItem.objects.get(pk=item.pk)
    services.plan_item_transition(item=item, status="completed")  # another writer first

    with pytest.raises(services.PlanItemConflict) as raised:
        services.plan_item_transition(item=stale, status="in_progress")

    assert raised.value.message_dict["status"] == [
        "plan item “Raise --max-num-seqs” is completed now, not pending: it moved meanwhile"
    ]
    assert _status(item) == "completed" and stale.status == "completed"


def test_staying_where_it_is_still_checks_the_row(world):
    item = _item(world, status="in_progress")
    stale = PlanItem.objects.get(pk=item.pk)
    services.plan_item_transition(item=item, status="pending")
    with pytest.raises(services.PlanItemConflict):
        services.plan_item_transition(item=stale, status="in_progress")
    assert _status(item) == "pending"


def test_done_by_is_kept_while_done_and_forgotten_when_reopened(world, broker):
    _in_force_recipe(world)
    action = engine_services.engine_action_start(
        deployment=world.deployment, kind="restart", user=world.staff, resweep=False
    )
    item = _item(world, status="in_progress")
    services.plan_item_transition(item=item, status="completed", done_by=action)
    assert PlanItem.objects.get(pk=item.pk).done_by == action

    services.plan_item_transition(item=item, status="pending")
    assert PlanItem.objects.get(pk=item.pk).done_by is None
    with pytest.raises(ValueError):
        services.plan_item_transition(item=item, status="in_progress", done_by=action)


def test_a_refused_update_stores_nothing_of_it(world):
    item = _item(world, status="completed")
    with pytest.raises(ValidationError):
        services.plan_item_update(item=item, title="again", status="in_progress")
    row = PlanItem.objects.get(pk=item.pk)
    assert (row.title, row.status) == ("Raise --max-num-seqs", "completed")


# --------------------------------------------------------------------------- its writers


def test_the_page_says_why_a_move_is_refused(client, world):
    pb.sign_in(client)
    item = _item(world, status="completed")
    response = client.post(
        f"/plan/{item.pk}/", {"action": "save", "title": "again", "status": "in_progress"}
    )
    assert response.status_code == 302
    page = client.get(response["Location"]).content.decode()
    assert "Plan item “Raise --max-num-seqs” is completed: it cannot become in progress" in page
    assert _status(item) == "completed"


def test_the_api_refuses_a_move_naming_status(world):
    item = _item(world, status="completed")
    response = world.owner.patch(f"/api/v1/plan-items/{item.pk}", {"status": "in_progress"})
    assert response.status_code == 400
    assert response.json()["detail"].startswith("status: plan item “Raise --max-num-seqs”")
    reopened = world.owner.patch(f"/api/v1/plan-items/{item.pk}", {"status": "pending"})
    assert reopened.status_code == 200
    assert _status(item) == "pending"


def test_the_admin_refuses_a_move_on_its_form(client, world):
    User.objects.create_superuser("root", password="pw")
    client.login(username="root", password="pw")
    item = _item(world, status="completed")
    fields = {"deployment": world.deployment.pk, "title": item.title, "status": "in_progress"}
    fields |= {"position": 0, "source": "human", "provenance": ""}
    response = client.post(f"/admin/insights/planitem/{item.pk}/change/", fields)
    assert response.status_code == 200
    assert "reopen it as pending first" in response.content.decode()
    assert _status(item) == "completed"

    response = client.post(
        f"/admin/insights/planitem/{item.pk}/change/", {**fields, "status": "pending"}
    )
    assert response.status_code == 302 and _status(item) == "pending"


def test_an_action_for_a_done_item_is_refused_and_starts_nothing(world, broker):
    # before: the item went back to in progress and the action was queued
    _in_force_recipe(world)
    item = _item(world, status="completed")
    with pytest.raises(ValidationError) as raised:
        engine_services.engine_action_start(
            deployment=world.deployment,
            kind="restart_with_args",
            user=permissions.API_TOKEN,
            changes={"--max-num-seqs": "16"},
            plan_item=item,
        )
    assert "is completed: it cannot become in progress" in raised.value.message_dict["plan_item"][0]
    assert not EngineAction.objects.exists() and _status(item) == "completed"
    assert world.deployment.launch_recipes.count() == 1


def test_an_action_started_from_a_stale_page_is_refused(world, broker):
    _in_force_recipe(world)
    item = _item(world)
    stale = PlanItem.objects.get(pk=item.pk)
    services.plan_item_update(item=item, status="completed")
    with pytest.raises(ValidationError) as raised:
        engine_services.engine_action_start(
            deployment=world.deployment, kind="restart", user=world.staff, plan_item=stale
        )
    assert "it moved meanwhile" in raised.value.message_dict["plan_item"][0]
    assert not EngineAction.objects.exists()


def test_a_failed_action_leaves_an_item_someone_marked_done_meanwhile(world, broker):
    # before: the failure put it back to pending, over the person's "completed"
    item, action = _restart_carrying_an_item(world)
    assert _status(item) == "in_progress"
    services.plan_item_update(item=PlanItem.objects.get(pk=item.pk), status="completed")

    engine_services.engine_action_report(action=action, status="failed", error="exited")

    assert _status(item) == "completed"


def test_a_failed_action_puts_the_item_it_carried_out_back_to_do(world, broker):
    item, action = _restart_carrying_an_item(world)
    engine_services.engine_action_report(action=action, status="failed", error="exited")
    assert _status(item) == "pending"


def test_a_succeeded_action_marks_its_item_done_by_it(world, broker):
    item, action = _restart_carrying_an_item(world)
    engine_services.engine_action_report(action=action, status="running")
    engine_services.engine_action_report(action=action, status="succeeded")
    row = PlanItem.objects.get(pk=item.pk)
    assert (row.status, row.done_by) == ("completed", action)


def test_a_tune_for_an_item_that_moved_meanwhile_is_not_started(world, broker):
    finding = Finding.objects.create(
        deployment=world.deployment, kind="kernel_provenance", key="tuned-on:1", title="t"
    )
    item = PlanItem.objects.create(
        deployment=world.deployment, finding=finding, title="Tune for vLLM and re-sweep"
    )
    stale = PlanItem.objects.select_related("deployment", "finding").get(pk=item.pk)
    services.plan_item_update(item=item, status="completed")

    with pytest.raises(ValueError, match="it moved meanwhile"):
        kernel_services.tuning_start_for_plan_item(item=stale, user=world.staff)
    assert not TuningRun.objects.exists() and _status(item) == "completed"
