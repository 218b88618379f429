"""The deployment page's health: Check now (sent to the host's queue) and the latest checks."""

import datetime as dt

import pytest
from django.utils import timezone

from moeops.fleet import services as fleet_services
from tests import page_base as pb
from tests import queues

QUEUE = "host.h200-x8"


@pytest.fixture
def deployment(client):
    pb.sign_in(client)
    return pb.deployment()


def _checks(deployment, n):
    start = timezone.now() - dt.timedelta(minutes=n)
    for i in range(n):
        fleet_services.health_check_record(
            deployment=deployment,
            status="healthy",
            trigger="periodic",
            checked_at=(start + dt.timedelta(minutes=i)).timestamp(),
            latency_ms=10.0 + i,
            engine="sglang",
            version="0.5.6",
            served_models=["glm-5"],
            max_running_requests=64,
            detail=f"SGLang 0.5.6 serves glm-5 ({i})",
        )


@pytest.mark.django_db
def test_check_now_sends_a_check_to_the_hosts_queue(
    client, deployment, broker, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/deployments/{deployment.pk}/check/")
    assert response.status_code == 302
    assert response["Location"] == f"/deployments/{deployment.pk}/#health"
    [task] = queues.queued(broker, QUEUE)
    assert task.task == "workers.check_deployment"
    assert task.kwargs == {
        "deployment": deployment.pk,
        "base_url": "http://127.0.0.1:30000",
        "model": "glm-5",
        "engine": "sglang",
        "trigger": "manual",
    }
    page = client.get(response["Location"]).content.decode()
    assert "Health check queued on host.h200-x8." in page


@pytest.mark.django_db
def test_a_deployment_without_an_endpoint_has_nothing_to_check(client, deployment, broker):
    deployment.endpoint_url = ""
    deployment.save()
    page = client.get(deployment.get_absolute_url()).content.decode()
    assert 'disabled title="No endpoint URL to check">Check now</button>' in page
    response = client.post(f"/deployments/{deployment.pk}/check/", follow=True)
    assert "This deployment has no endpoint URL to check; edit it first." in (
        response.content.decode()
    )
    assert queues.queued(broker, QUEUE) == []


def test_a_broker_that_cannot_be_reached_is_said_in_a_message(
    client, transactional_db, monkeypatch, free_port
):
    pb.sign_in(client)
    deployment = pb.deployment()
    queues.send_to(monkeypatch, f"redis://127.0.0.1:{free_port()}/0")
    response = client.post(f"/deployments/{deployment.pk}/check/", follow=True)
    assert response.status_code == 200
    page = response.content.decode()
    assert "Could not reach the broker to enqueue the health check" in page
    assert "Connection refused" in page


@pytest.mark.django_db
def test_check_now_needs_post_and_login(client, deployment, broker):
    assert client.get(f"/deployments/{deployment.pk}/check/").status_code == 405
    client.logout()
    assert client.post(f"/deployments/{deployment.pk}/check/").status_code == 302
    assert queues.queued(broker, QUEUE) == []


@pytest.mark.django_db
def test_the_page_shows_the_latest_checks_newest_first(client, deployment):
    _checks(deployment, 12)
    fleet_services.health_check_record(
        deployment=deployment,
        status="failed",
        up=False,
        trigger="manual",
        detail="the engine did not answer: ConnectError",
    )
    page = client.get(deployment.get_absolute_url()).content.decode()
    assert f'action="/deployments/{deployment.pk}/check/"' in page
    assert ">Check now</button>" in page
    assert "last checked " in page
    table = page.split('id="health-checks"')[1].split("</table>")[0]
    rows = table.split("<tr>")[2:]
    # the newest ten: the failed check, then the periodic ones from the twelfth (11) back
    assert len(rows) == 10
    assert "status-failed" in rows[0] and "the engine did not answer" in rows[0]
    assert "Check now" in rows[0] and "—" in rows[0]
    assert "SGLang 0.5.6" in rows[1] and "21.0" in rows[1] and ">64<" in rows[1]
    assert "Periodic" in rows[1] and "(11)" in rows[1]
    assert "(3)" in rows[-1] and "(2)" not in table


@pytest.mark.django_db
def test_a_page_with_many_checks_costs_no_extra_queries(
    client, deployment, django_assert_max_num_queries
):
    _checks(deployment, 30)
    # as the page's own budget (test_page_deployment_detail): 14, 2 for the sweep estimate, 1
    # for the workload choices, 2 for the capacity searches, 1 for the watches and 1 for the
    # alert channels the watch form offers
    with django_assert_max_num_queries(21):
        response = client.get(deployment.get_absolute_url())
    assert response.status_code == 200


@pytest.mark.django_db
def test_a_deployment_never_checked_says_so(client, deployment):
    page = client.get(deployment.get_absolute_url()).content.decode()
    assert "not checked by a worker yet" in page
    assert "No health checks yet. Check now asks the host's worker for one." in page
