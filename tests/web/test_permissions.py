"""moeops.permissions: each predicate for each kind of asker, and the services that ask it
refusing a caller that names nobody (None), where they used to take None for an API token."""

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from moeops import permissions
from moeops.api.models import ApiToken
from moeops.engines import services as engine_services
from moeops.engines.models import EngineAction
from moeops.fleet import services as fleet_services
from moeops.fleet.endpoints import endpoint_change_refusal
from moeops.fleet.models import Host
from moeops.insights.models import Finding, PlanItem
from moeops.kernels import services as kernel_services
from moeops.kernels.models import TuningRun
from moeops.watches import bisection
from moeops.watches.models import WatchRun
from tests.api_base import make_managed_world, make_world

pytestmark = pytest.mark.django_db

QUEUE = "host.rtx-pro-6000"
ARGV = ["vllm", "serve", "/models/glm-5", "--port", "8000"]


def _users():
    return {
        "nobody": None,
        "anonymous": AnonymousUser(),
        "member": User.objects.create_user("member", password="pw"),
        "inactive staff": User.objects.create_user("gone", is_staff=True, is_active=False),
        "staff": User.objects.create_user("ops", password="pw", is_staff=True),
        "API token": permissions.API_TOKEN,
        "moeops": permissions.MOEOPS,
    }


# who: is_member, is_staff, may_change_engine, may_set_endpoint, may_manage_tokens
ANSWERS = {
    "nobody": (False, False, False, False, False),
    "anonymous": (False, False, False, False, False),
    "member": (True, False, False, False, False),
    "inactive staff": (False, False, False, False, False),
    "staff": (True, True, True, True, True),
    "API token": (False, False, True, True, False),
    "moeops": (False, False, True, False, False),
}


@pytest.mark.parametrize("who", list(ANSWERS))
def test_each_predicate_answers_for_each_kind_of_asker(who):
    asker = _users()[who]
    answers = (
        permissions.is_member(asker),
        permissions.is_staff(asker),
        permissions.may_change_engine(asker),
        permissions.may_set_endpoint(asker),
        permissions.may_manage_tokens(asker),
    )
    assert answers == ANSWERS[who]


@pytest.mark.parametrize(
    ("who", "managed", "external"),
    [
        ("nobody", False, False),
        ("anonymous", False, False),
        ("member", False, True),
        ("staff", True, True),
        ("moeops", True, True),
    ],
)
def test_a_plan_items_tune_is_staffs_where_it_restarts_the_engine(who, managed, external):
    asker = _users()[who]
    world = make_world()
    deployment = world.deployment
    assert permissions.may_tune_for_plan_item(asker, deployment) is external
    deployment.management = "managed"
    assert permissions.may_tune_for_plan_item(asker, deployment) is managed


def test_require_engine_change_refuses_nobody_and_a_member():
    users = _users()
    for who in ("nobody", "member", "anonymous"):
        with pytest.raises(PermissionDenied, match="only staff may change"):
            permissions.require_engine_change(users[who])
    for who in ("staff", "API token", "moeops"):
        permissions.require_engine_change(users[who])


def test_only_a_person_is_recorded_as_author():
    users = _users()
    assert permissions.person(users["staff"]) == users["staff"]
    assert permissions.person(permissions.API_TOKEN) is None
    assert permissions.person(permissions.MOEOPS) is None
    assert permissions.person(None) is None


def test_host_token_writes_only_its_host():
    h1 = Host.objects.create(name="h1")
    h2 = Host.objects.create(name="h2")
    row, _ = ApiToken.issue(name="worker", host=h1)
    assert permissions.token_may_write_host(row, h1)
    assert not permissions.token_may_write_host(row, h2)
    assert not permissions.token_may_write_host(row, None)
    assert permissions.token_may_write(row) and not permissions.token_is_personal(row)


def test_read_only_token_writes_nothing():
    row, _ = ApiToken.issue(name="viewer", read_only=True)
    assert not permissions.token_may_write_host(row, None)
    assert not permissions.token_may_write(row)


def test_a_personal_token_writes_every_hosts_data():
    row, _ = ApiToken.issue(name="owner")
    host = Host.objects.create(name="h1")
    assert permissions.token_is_personal(row)
    assert permissions.token_may_write_host(row, host)
    assert permissions.token_may_write_host(row, None)
    assert not permissions.token_may_write_host(None, host)


# --------------------------------------------------------------------------- services


@pytest.fixture
def managed(db):
    return make_managed_world()


def test_a_recipe_asked_for_by_nobody_is_refused(managed):
    # before: None passed as "an API token" and the recipe was written
    with pytest.raises(PermissionDenied):
        engine_services.recipe_create(deployment=managed.deployment, argv=ARGV, author=None)
    assert not managed.deployment.launch_recipes.exists()

    by_token = engine_services.recipe_create(
        deployment=managed.deployment, argv=ARGV, author=permissions.API_TOKEN
    )
    assert by_token.version == 1 and by_token.author is None


def test_an_engine_action_asked_for_by_nobody_is_refused(managed, broker):
    recipe = engine_services.recipe_create(
        deployment=managed.deployment, argv=ARGV, author=managed.staff
    )
    recipe.applied_at = timezone.now()
    recipe.save(update_fields=["applied_at"])
    with pytest.raises(PermissionDenied):
        engine_services.engine_action_start(
            deployment=managed.deployment, kind="restart", user=None, resweep=False
        )
    assert not EngineAction.objects.exists()

    action = engine_services.engine_action_start(
        deployment=managed.deployment, kind="restart", user=permissions.MOEOPS, resweep=False
    )
    assert action.requested_by is None and action.status == "queued"


def test_a_bisection_asked_for_by_nobody_is_refused_before_anything_is_read():
    # before: None passed, and the unsaved watch run's missing watch raised instead
    with pytest.raises(PermissionDenied):
        bisection.bisection_start(watch_run=WatchRun(), user=None)


def test_a_plan_items_tune_asked_for_by_nobody_is_refused(managed, broker):
    finding = Finding.objects.create(
        deployment=managed.deployment, kind="kernel_provenance", key="k", title="t"
    )
    item = PlanItem.objects.create(
        deployment=managed.deployment, finding=finding, title="Tune for vLLM and re-sweep"
    )
    with pytest.raises(PermissionDenied):
        kernel_services.tuning_start_for_plan_item(item=item, user=None)
    managed.deployment.management = "external"
    managed.deployment.save()
    with pytest.raises(PermissionDenied, match="signed-in member"):
        kernel_services.tuning_start_for_plan_item(item=item, user=None)
    assert not TuningRun.objects.exists()
    item.refresh_from_db()
    assert item.status == "pending"


def test_a_new_endpoint_set_by_nobody_is_refused(managed):
    deployment = managed.deployment
    refusal = endpoint_change_refusal(
        host=deployment.host,
        url="http://127.0.0.1:9000",
        current=deployment.endpoint_url,
        user=None,
    )
    assert refusal == "only staff may point a deployment at a new endpoint address"
    # before: deployment_update without a user took it for an API token and saved the address
    with pytest.raises(ValidationError) as raised:
        fleet_services.deployment_update(
            deployment=deployment, endpoint_url="http://127.0.0.1:9000"
        )
    assert "endpoint_url" in raised.value.message_dict
    deployment.refresh_from_db()
    assert deployment.endpoint_url == "http://127.0.0.1:8000"

    fleet_services.deployment_update(
        deployment=deployment, endpoint_url="http://127.0.0.1:9000", user=permissions.API_TOKEN
    )
    deployment.refresh_from_db()
    assert deployment.endpoint_url == "http://127.0.0.1:9000"


def test_the_same_endpoint_again_needs_nobody(managed):
    deployment = managed.deployment
    # a save that keeps the address (a title edit) is no new address to allow
    fleet_services.deployment_update(
        deployment=deployment, endpoint_url="http://127.0.0.1:8000/", tp=4
    )
    deployment.refresh_from_db()
    assert deployment.tp == 4
