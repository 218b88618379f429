import pytest

from moeops.insights.models import Finding
from tests import page_base as pb

pytestmark = pytest.mark.django_db


@pytest.fixture
def finding(client):
    pb.sign_in(client)
    return Finding.objects.create(
        deployment=pb.deployment(), kind="queueing", title="Requests queue behind 64"
    )


def test_it_confirms_and_returns_to_the_page(client, finding):
    back = f"{finding.deployment.get_absolute_url()}#finding-{finding.pk}"
    response = client.post(
        f"/findings/{finding.pk}/state/", {"state": "confirmed", "expected": "open", "next": back}
    )
    assert response["Location"] == back
    finding.refresh_from_db()
    assert finding.state == "confirmed"


def test_it_dismisses_then_reopens(client, finding):
    client.post(f"/findings/{finding.pk}/state/", {"state": "dismissed", "expected": "open"})
    finding.refresh_from_db()
    assert finding.state == "dismissed"
    client.post(f"/findings/{finding.pk}/state/", {"state": "open", "expected": "dismissed"})
    finding.refresh_from_db()
    assert finding.state == "open"


def test_a_stale_page_does_not_overwrite_someone_elses_choice(client, finding):
    Finding.objects.filter(pk=finding.pk).update(state="confirmed")
    response = client.post(
        f"/findings/{finding.pk}/state/", {"state": "dismissed", "expected": "open"}, follow=True
    )
    finding.refresh_from_db()
    assert finding.state == "confirmed"
    assert "Someone changed this finding meanwhile" in response.content.decode()


def test_it_refuses_unknown_states(client, finding):
    response = client.post(
        f"/findings/{finding.pk}/state/", {"state": "deleted", "expected": "open"}
    )
    assert response["Location"] == finding.deployment.get_absolute_url()
    finding.refresh_from_db()
    assert finding.state == "open"


@pytest.mark.parametrize("back", ["https://evil.example/", "//evil.example/", "abc", "-1"])
def test_a_next_that_is_no_path_here_is_refused_before_anything_is_saved(client, finding, back):
    response = client.post(
        f"/findings/{finding.pk}/state/", {"state": "confirmed", "expected": "open", "next": back}
    )
    assert response.status_code == 400
    assert "next: must be a path on this site" in response.content.decode()
    finding.refresh_from_db()
    assert finding.state == "open"
