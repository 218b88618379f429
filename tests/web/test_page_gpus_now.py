"""The host page's "GPUs now": the button that asks the host's worker for a reading, and the
latest reading (a table, or why there is none)."""

import pytest

from moeops.fleet import services as fleet_services
from tests import page_base as pb
from tests import queues
from tests.fakes import FakeNVML, h200
from workers.telemetry import read_gpus_now

QUEUE = "host.h200-x8"


@pytest.fixture
def host(client):
    pb.sign_in(client)
    return pb.host()


def _record(host, reading):
    fleet_services.gpu_reading_record(
        host=host,
        status=reading["status"],
        detail=reading["detail"],
        gpus=reading["gpus"],
        taken_at=reading["taken_at"],
    )


@pytest.mark.django_db
def test_the_button_sends_a_reading_to_the_hosts_queue(
    client, host, broker, django_capture_on_commit_callbacks
):
    page = client.get("/hosts/h200-x8/").content.decode()
    assert 'action="/hosts/h200-x8/gpus-now/"' in page
    assert "No reading yet." in page
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/hosts/h200-x8/gpus-now/")
    assert response["Location"] == "/hosts/h200-x8/#gpus-now"
    assert [t.task for t in queues.queued(broker, QUEUE)] == ["workers.gpus_now"]
    assert "GPU reading queued on host.h200-x8." in client.get("/hosts/h200-x8/").content.decode()


def test_a_broker_that_cannot_be_reached_is_said_in_a_message(
    client, transactional_db, monkeypatch, free_port
):
    pb.sign_in(client)
    pb.host()
    queues.send_to(monkeypatch, f"redis://127.0.0.1:{free_port()}/0")
    response = client.post("/hosts/h200-x8/gpus-now/", follow=True)
    assert "Could not reach the broker to ask for a GPU reading" in response.content.decode()


@pytest.mark.django_db
def test_the_button_needs_post_and_login(client, host, broker):
    assert client.get("/hosts/h200-x8/gpus-now/").status_code == 405
    client.logout()
    assert client.post("/hosts/h200-x8/gpus-now/").status_code == 302
    assert queues.queued(broker, QUEUE) == []


@pytest.mark.django_db
def test_a_host_without_nvml_says_why(client, host):
    reading = read_gpus_now(FakeNVML([], init_error="Driver Not Loaded"))
    _record(host, reading)
    page = client.get("/hosts/h200-x8/").content.decode()
    assert "No NVML on this host: NVML did not initialise: Driver Not Loaded" in page


@pytest.mark.django_db
def test_the_latest_reading_is_a_table_of_every_gpu(client, host):
    _record(host, read_gpus_now(FakeNVML([h200(util=5)]), clock=lambda: 1_780_000_000.0))
    nvml = FakeNVML([h200(util=97, power_mw=612_345), h200(util=3)], unsupported={"sm_clock"})
    _record(host, read_gpus_now(nvml, clock=lambda: 1_780_000_060.0))
    page = client.get("/hosts/h200-x8/").content.decode()
    section = page.split('id="gpus-now"')[1].split("</section>")[0]
    rows = section.split("<tbody>")[1].split("<tr>")[1:]
    assert len(rows) == 2
    cells = [cell.split("</td>")[0] for cell in rows[0].split('<td class="num">')[1:]]
    # index, util %, power W, limit W, memory used / total MiB, SM clock MHz, temperature °C
    assert cells == ["0", "97", "612", "700", "96,000", "143,771", "—", "41"]
    assert '<td class="num">3</td>' in rows[1]
    assert "Read 2026-05-28 20:27:40 UTC." in section
