import pytest

from moeops.insights.models import PlanItem
from tests import page_base as pb

pytestmark = pytest.mark.django_db


@pytest.fixture
def deployment(client):
    pb.sign_in(client)
    row = pb.deployment()
    for position, title in enumerate(["check server", "sweep higher", "tune MoE kernel"]):
        PlanItem.objects.create(deployment=row, title=title, position=position)
    return row


def _titles(deployment):
    return list(deployment.plan_items.values_list("title", flat=True))


def test_it_adds_an_item_at_the_end(client, deployment):
    response = client.post(
        f"/deployments/{deployment.pk}/plan/", {"title": "re-sweep", "status": "pending"}
    )
    assert response["Location"] == f"/deployments/{deployment.pk}/#plan"
    assert _titles(deployment)[-1] == "re-sweep"


def test_it_edits_title_and_status_in_place(client, deployment):
    item = deployment.plan_items.get(title="sweep higher")
    client.post(
        f"/plan/{item.pk}/",
        {"action": "save", "title": "sweep 256, 512, 1024", "status": "in_progress"},
    )
    item.refresh_from_db()
    assert (item.title, item.status) == ("sweep 256, 512, 1024", "in_progress")


def test_it_moves_items_up_and_down(client, deployment):
    last = deployment.plan_items.get(title="tune MoE kernel")
    client.post(f"/plan/{last.pk}/", {"action": "up"})
    assert _titles(deployment) == ["check server", "tune MoE kernel", "sweep higher"]
    client.post(f"/plan/{last.pk}/", {"action": "up"})
    client.post(f"/plan/{last.pk}/", {"action": "up"})  # already first: stays
    assert _titles(deployment) == ["tune MoE kernel", "check server", "sweep higher"]
    client.post(f"/plan/{last.pk}/", {"action": "down"})
    assert _titles(deployment) == ["check server", "tune MoE kernel", "sweep higher"]


def test_it_deletes_an_item(client, deployment):
    item = deployment.plan_items.get(title="check server")
    client.post(f"/plan/{item.pk}/", {"action": "delete"})
    assert _titles(deployment) == ["sweep higher", "tune MoE kernel"]


def test_it_refuses_an_empty_title(client, deployment):
    item = deployment.plan_items.first()
    client.post(f"/plan/{item.pk}/", {"action": "save", "title": "", "status": "completed"})
    item.refresh_from_db()
    assert item.title == "check server" and item.status == "pending"


def test_the_page_renders_each_item_as_a_small_form(client, deployment):
    html = client.get(deployment.get_absolute_url()).content.decode()
    for item in deployment.plan_items.all():
        assert f'action="/plan/{item.pk}/"' in html
    assert 'data-autosubmit="save"' in html
