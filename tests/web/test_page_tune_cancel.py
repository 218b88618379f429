import pytest

from tests import page_base as pb

pytestmark = pytest.mark.django_db


@pytest.fixture
def tune(client):
    pb.sign_in(client)
    deployment = pb.deployment()

    def make(status):
        return pb.tune(deployment, device_name="NVIDIA H200", status=status)

    return make


def test_a_queued_tune_is_cancelled_at_once(client, tune):
    tuning = tune("queued")
    response = client.post(f"/tunes/{tuning.uuid}/cancel/", follow=True)
    tuning.refresh_from_db()
    assert tuning.status == "cancelled" and tuning.finished_at is not None
    assert "Cancelled before the worker started it." in response.content.decode()
    assert "Cancel tune</button>" not in response.content.decode()


def test_a_running_tune_is_cancelled_and_its_worker_stops_at_its_next_report(client, tune):
    tuning = tune("running")
    html = client.get(f"/tunes/{tuning.uuid}/").content.decode()
    assert 'class="danger">Cancel tune</button>' in html
    response = client.post(f"/tunes/{tuning.uuid}/cancel/", follow=True)
    tuning.refresh_from_db()
    assert tuning.status == "cancelled"
    assert "the worker stops the tune&#x27;s GPU processes at its next progress report" in (
        response.content.decode()
    )


def test_a_finished_tune_has_nothing_to_cancel(client, tune):
    tuning = tune("succeeded")
    response = client.post(f"/tunes/{tuning.uuid}/cancel/", follow=True)
    tuning.refresh_from_db()
    assert tuning.status == "succeeded"
    assert "Nothing to cancel: the tune is Succeeded." in response.content.decode()


def test_cancel_is_a_post(client, tune):
    tuning = tune("queued")
    assert client.get(f"/tunes/{tuning.uuid}/cancel/").status_code == 405
