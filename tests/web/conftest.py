import pytest

from moeops.kernels import services as kernel_services
from moeops.runs import services as run_services
from moeops.watches import services as watch_services
from tests import page_base
from tests.api_base import make_world_with_worker


@pytest.fixture
def sent(monkeypatch):
    """What the web tier sends to hosts' queues (sweeps and tunes), kept here instead of sent:
    one (task name, host, kwargs) a task."""
    calls = []

    def send_host_task(name, host, kwargs):
        calls.append((name, host, kwargs))

    monkeypatch.setattr(run_services, "send_host_task", send_host_task)
    monkeypatch.setattr(kernel_services, "send_host_task", send_host_task)
    return calls


@pytest.fixture
def worker_world(db):
    """api_base.make_world_with_worker: its deployment on all of its host's GPUs, whose worker
    takes work."""
    return make_world_with_worker()


@pytest.fixture
def staff(client):
    """A staff member, ops, signed in on `client`."""
    return page_base.sign_in(client, "ops", staff=True)


@pytest.fixture
def watch(deployment):
    """The watch "nightly" of the test module's `deployment` fixture: page_base.WATCH_LOAD at
    03:00 every day."""
    return watch_services.watch_create(
        deployment=deployment, name="nightly", parameters=page_base.WATCH_LOAD, cron="0 3 * * *"
    )
